"""``bench.corun``: the machine's warm, cold and co-run timings are measured, the CPU affinity is given back and
the spinning child is gone when it returns; where only one CPU may be used, the co-run part says why it is missing.

What the figures are on a given day is the benchmark's to report, not the suite's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import corun


def _spawned(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[str]]:
    """Every process ``bench.corun`` starts, kept to check it ended."""
    started: list[subprocess.Popen[str]] = []
    real = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[str]:
        process: subprocess.Popen[str] = real(*args, **kwargs)
        started.append(process)
        return process

    monkeypatch.setattr(corun.subprocess, "Popen", popen)
    return started


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to spin on one")
def test_three_timings_with_the_spinner_gone_and_the_affinity_back(monkeypatch: pytest.MonkeyPatch) -> None:
    started = _spawned(monkeypatch)
    allowed = os.sched_getaffinity(0)
    figures = corun.measure(**corun.QUICK)
    assert os.sched_getaffinity(0) == allowed
    assert len(started) == 1 and started[0].poll() is not None, "the spinning child was stopped"
    assert figures["warm_us"] > 0 and figures["cold_us"] > 0 and figures["beside_us"] > 0
    assert figures["cold_factor"] == pytest.approx(figures["cold_us"] / figures["warm_us"], rel=1e-2)
    assert figures["corun_factor"] == pytest.approx(figures["beside_us"] / figures["warm_us"], rel=1e-2)
    assert figures["cpus"] == sorted(allowed)[:2] and figures["cold_gap_us"] == corun.COLD_GAP_US
    line = corun.describe(figures)
    assert "warm" in line and "cold" in line and "beside a process spinning" in line


def test_on_one_cpu_the_corun_part_is_missing_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    started = _spawned(monkeypatch)
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        figures = corun.measure(**corun.QUICK)
        assert os.sched_getaffinity(0) == {min(allowed)}
    finally:
        os.sched_setaffinity(0, allowed)
    assert started == []
    assert figures["corun_skipped"] == "this process may run on 1 CPU"
    assert "beside_us" not in figures and figures["warm_us"] > 0 and figures["cold_us"] > 0
    assert "not measured: this process may run on 1 CPU" in corun.describe(figures)


def test_the_command_writes_its_figures_and_refuses_zero_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "machine.json"
    assert corun.main(["--rounds", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["warm_us"] > 0 and capsys.readouterr().out.startswith("machine: a round trip")
    with pytest.raises(SystemExit):
        corun.main(["--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
