"""Hostile peers after authentication (issue 29, items 2 and 3): an admitted client attacks a real server in
another process (``hostile_peer.py``) with what once cost it without bound, and every attack meets a stated
budget while a legitimate client still connects and exchanges messages, during the attack and after it.

Budgets held here (growth of the target's measures from before the attack):
- a 38 MiB ``list[int]`` message (16 MiB default ``max_message_size``): refused at its announcement on both
  sides, peak resident memory (VmHWM) grows by less than 40 MiB (it was 390 MB when decoded whole);
- 30,000 calls of an async method in one burst (``max_pending_calls`` 1,024): at most 1,024 run, every other
  caller gets ``RmiRequestRefused(reason="busy")``, asyncio tasks stay within 1,024 + 64 of the idle count,
  resident memory grows by less than 64 MiB;
- files streamed past ``spill_quota`` (8 MiB here): refused to both sides (``SpillQuotaExceeded``), disk
  used under the spill directory never above the quota;
- a remote exception carries its type and message, and a traceback only with ``rmi_tracebacks=True`` (a
  ``RemoteError``'s ``traceback_text`` is checked likewise in memory, in ``test_network_rmi.py``).
"""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from slipstream.network import (
    Client,
    ClientConfig,
    Connection,
    MaxMessageSizeExceeded,
    RmiRequestRefused,
    SpillQuotaExceeded,
)
from slipstream.network.frames import FrameKind
from slipstream.network.serialization import Serialization

from .hostile_peer import CALC_ID, Chat, HostileTarget, ICalc, Numbers, common, growth, legitimate_exchange
from .test_observe import free_port

MiB = 1 << 20


def peak_rss(target: HostileTarget) -> int:
    """The target's peak resident memory so far (VmHWM), in bytes."""
    with open(f"/proc/{target.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@asynccontextmanager
async def attacker(port: int, errors: list[BaseException] | None = None, **config: Any) -> AsyncIterator[Connection]:
    """An admitted client of the target (it passed the handshake: what it does next is the attack)."""
    with tempfile.TemporaryDirectory(prefix="slipstream-attacker-") as scratch:
        client_config = ClientConfig(
            **common(**config), interfaces=[ICalc], settings_store=":memory:", driver_directory=scratch
        )
        async with Client(client_config) as client:
            if errors is not None:
                client.on_error(lambda connection, error: errors.append(error))
            yield await client.connect("127.0.0.1", port, timeout=20)


async def during_and_after(attack: Any, port: int) -> Any:
    """Run ``attack`` with a legitimate exchange alongside, then another once it is over; its result."""
    result, seconds = await asyncio.gather(attack, legitimate_exchange(port))
    assert seconds < 20
    assert await legitimate_exchange(port) < 20
    return result


def numbers_payload(count: int) -> bytes:
    """A registered ``Numbers`` message of ``count`` small ints, built as bytes (one byte per int on the
    wire, 8 bytes of pointers each once decoded), without building the list here."""
    empty = Serialization([Chat, Numbers]).encode(Numbers([]))
    assert empty.endswith(b"\x90")  # msgpack's empty array
    return empty[:-1] + b"\xdd" + struct.pack(">I", count) + b"\x01" * count


def test_a_38_mib_list_message_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    with HostileTarget(tmp_path, free_port()) as target:
        before, peak_before = target.measure(), peak_rss(target)
        errors: list[BaseException] = []

        async def attack() -> None:
            async with attacker(target.port, errors) as connection:
                connection.machine.send_frame(FrameKind.MESSAGE, 0, numbers_payload(38 * MiB))
                connection.flush()
                deadline = time.monotonic() + 30
                while not any(isinstance(e, MaxMessageSizeExceeded) for e in errors):
                    assert time.monotonic() < deadline, errors
                    await asyncio.sleep(0.05)

        asyncio.run(during_and_after(attack(), target.port))
        after = target.measure()
        assert after["errors"].get("MaxMessageSizeExceeded") == 1, after["errors"]
        assert "max_message_size (16777216)" in str(next(e for e in errors if isinstance(e, MaxMessageSizeExceeded)))
        assert peak_rss(target) - peak_before < 40 * MiB, (peak_before, peak_rss(target))
        assert growth(before, after)["spill_bytes"] <= 0


def test_a_burst_of_30000_calls_runs_at_most_max_pending_calls_and_refuses_the_rest_busy(tmp_path: Path) -> None:
    n, limit = 30_000, 1024
    with HostileTarget(tmp_path, free_port()) as target:
        before = target.measure()
        seen: dict[str, Any] = {}

        async def attack() -> list[Any]:
            async with attacker(target.port, rmi_timeout=60.0) as connection:
                calc = connection.rmi.get_global(ICalc, CALC_ID)
                calls = [calc.sleep(12.0) for _ in range(n)]  # each runs 12 s: the burst is over long before
                await asyncio.sleep(1.0)
                seen["during"] = await asyncio.to_thread(target.measure)
                results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 90)
                assert await asyncio.wait_for(calc.add(1, 2), 10) == 3  # served again once they ended
                return results

        results = asyncio.run(during_and_after(attack(), target.port))
        ran = [r for r in results if r is None]
        refused = [r for r in results if isinstance(r, RmiRequestRefused)]
        others = [r for r in results if r is not None and not isinstance(r, RmiRequestRefused)]
        assert not others, others[:3]
        assert len(ran) == limit and len(ran) + len(refused) == n  # (none ended while the burst lasted)
        assert {r.reason for r in refused} == {"busy"}
        during, after = seen["during"], target.measure()
        assert during["tasks"] - before["tasks"] <= limit + 64, (before["tasks"], during["tasks"])
        assert growth(before, during)["rss_bytes"] < 64 * MiB, growth(before, during)
        assert after["tasks"] - before["tasks"] <= 8, (before["tasks"], after["tasks"])


def test_streams_beyond_the_spill_quota_are_refused_to_both_sides(tmp_path: Path) -> None:
    quota = 8 * MiB
    files = []
    for i in range(6):
        path = tmp_path / f"upload-{i}.bin"
        path.write_bytes(os.urandom(3 * MiB))
        files.append(path)
    with HostileTarget(tmp_path / "target", free_port(), {"spill_quota": quota}) as target:
        before = target.measure()
        samples: list[int] = []

        async def sample() -> None:
            while True:
                samples.append((await asyncio.to_thread(target.measure))["spill_bytes"])
                await asyncio.sleep(0.02)

        async def attack() -> list[Any]:
            async with attacker(target.port) as connection:
                sampler = asyncio.ensure_future(sample())
                try:
                    sends = [connection.send_sync(path, timeout=60) for path in files]
                    return await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 90)
                finally:
                    sampler.cancel()

        results = asyncio.run(during_and_after(attack(), target.port))
        refused = [r for r in results if isinstance(r, SpillQuotaExceeded)]
        assert len(refused) == 4 and all("of 8388608 in use" in str(r) for r in refused), results
        assert results.count(None) == 2, results  # two 3 MiB files fit 8 MiB, a third does not
        after = target.measure()
        assert after["errors"].get("SpillQuotaExceeded") == 4, after["errors"]
        assert samples and max(samples) - before["spill_bytes"] <= quota, max(samples)
        assert after["spill_bytes"] - before["spill_bytes"] <= 0


@pytest.mark.parametrize("tracebacks", [False, True])
def test_remote_exceptions_carry_a_traceback_only_when_the_server_opts_in(tmp_path: Path, tracebacks: bool) -> None:
    with HostileTarget(tmp_path, free_port(), {"rmi_tracebacks": tracebacks}) as target:

        async def attack() -> BaseException:
            async with attacker(target.port) as connection:
                with pytest.raises(ValueError, match="no such thing") as info:  # a builtin: raised as itself
                    await asyncio.wait_for(connection.rmi.get_global(ICalc, CALC_ID).fail("no such thing"), 10)
                return info.value

        error = asyncio.run(during_and_after(attack(), target.port))
        remote_traceback = error.remote_traceback  # type: ignore[attr-defined]
        if tracebacks:
            assert "raise ValueError(text)" in remote_traceback and "hostile_peer.py" in remote_traceback
        else:
            assert remote_traceback == ""
