"""The hostile-peer suite's target and its measures work, so an attack test's bound means something."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
