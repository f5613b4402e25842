"""``bench.instructions``' workloads run and every reply comes back; without valgrind it says so and exits 2.

The counting itself (two runs under callgrind, a couple of minutes) is the benchmark's, not the suite's.
"""

from __future__ import annotations

import pytest

from bench import instructions


@pytest.mark.parametrize("workload", instructions.WORKLOADS)
def test_each_workload_brings_every_reply_back(workload: str) -> None:
    assert instructions.round_trips(workload, 0) == instructions.WARMUP
    # Long enough for the sequenced one's acknowledgements to come due and ride with the messages.
    assert instructions.round_trips(workload, 300) == instructions.WARMUP + 300


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(ValueError, match="workload must be one of"):
        instructions.round_trips("nonsense", 1)


def test_without_valgrind_it_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert instructions.main(["--rounds", "10"]) == 2
    assert "valgrind is not installed" in capsys.readouterr().err
