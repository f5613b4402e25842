"""The hostile-peer suite's target and its measures work, so an attack test's bound means something."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .hostile_peer import HostileTarget, bounded_count, growth, legitimate_exchange, tree_bytes
from .test_observe import free_port


def test_the_target_serves_a_legitimate_client_and_measures_itself(tmp_path: Path) -> None:
    with HostileTarget(tmp_path, free_port()) as target:
        before = target.measure()
        assert before["rss_bytes"] > 10 << 20 and before["fds"] > 3 and before["tasks"] >= 1, before
        assert before["shm_bytes"] > 0, "an embedded driver's files are counted"
        seconds = asyncio.run(legitimate_exchange(target.port))
        assert 0 < seconds < 20
        after = target.measure()
        assert set(growth(before, after)) == {"rss_bytes", "shm_bytes", "fds", "spill_bytes", "tasks"}
        assert after["errors"] == {}, after["errors"]


def test_tree_bytes_counts_what_is_allocated(tmp_path: Path) -> None:
    (tmp_path / "sparse").open("wb").truncate(64 << 20)  # apparent 64 MiB, nothing allocated
    (tmp_path / "dense").write_bytes(b"x" * (1 << 20))
    assert (1 << 20) <= tree_bytes(tmp_path) < (2 << 20)


def test_attack_loops_stop_by_count_and_by_time() -> None:
    assert list(bounded_count(5, 10)) == [0, 1, 2, 3, 4]
    assert len(list(bounded_count(10**9, 0.05))) < 10**9


IDLE_CONNECTION_RSS = 1 << 20
IDLE_CONNECTION_SHM = 2 << 20
"""What an idle, authenticated connection may cost its server, as stated in the security model: RSS
(measured 380 KiB by ``python -m bench.network``'s idle-connection-memory) and allocated /dev/shm (its
two logs' touched pages: 26 KiB measured; 3 x 256 KiB terms each at most)."""


def test_an_idle_authenticated_connection_costs_the_server_a_stated_amount(tmp_path: Path) -> None:
    clients = 16

    async def connect_all(port: int, hold: Any) -> None:
        from slipstream.network import Client, ClientConfig

        from .hostile_peer import ICalc, common

        config = ClientConfig(
            **common(), interfaces=[ICalc], settings_store=":memory:", driver_directory=tmp_path / "c"
        )
        endpoints = [Client(config) for _ in range(clients)]
        try:
            await asyncio.gather(*(c.connect("127.0.0.1", port, timeout=30) for c in endpoints))
            await asyncio.sleep(2.0)  # idle: handshake images reclaimed, heartbeats only
            await asyncio.to_thread(hold)
        finally:
            for client in endpoints:
                await client.close()

    with HostileTarget(tmp_path / "s", free_port()) as target:
        asyncio.run(legitimate_exchange(target.port))  # what the first connection allocates once
        before = target.measure()
        measured: dict[str, Any] = {}
        asyncio.run(connect_all(target.port, lambda: measured.update(target.measure())))
    grown = growth(before, measured)
    assert grown["rss_bytes"] / clients <= IDLE_CONNECTION_RSS, grown
    assert grown["shm_bytes"] / clients <= IDLE_CONNECTION_SHM, grown
