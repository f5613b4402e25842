"""``python -m bench.corun``: this machine's state for Python round trips: warm, cold, and beside a busy CPU.

    python -m bench.corun [--rounds N] [--json PATH]

Figures that tell this shared VM's phases apart, where one run's round trips move 1.5-5x with the host while the
code stays the same. The workload is one round trip of ``bench.instructions``' ``message`` (two connection
machines, no I/O: the Python a network round trip runs), timed three ways, pinned to one CPU:

- ``warm_us``: back to back, the best of ``rounds`` runs of ``ROUND_TRIPS``;
- ``cold_us``: each after ``COLD_GAP_US`` of a Python busy-wait (the median of ``COLD_SAMPLES``). A round trip
  between two processes runs every step this way, after waiting for the other side. On 2026-11-30, after 1 ms of
  anything else (a Python busy-wait, a C loop spinning with or without ``pause``, a sleep) the round trip took
  1.4-4.7x its warm time, and after 100 us up to 2.3x; after 1 ms of the same round trips on another pair of machines
  it took its warm time. What it needs (caches, branch predictors) decays while other code runs, at a pace
  set outside the process: the host, and whatever else runs on the physical core;
- ``beside_us``: warm again, with a child process spinning in a Python loop on the other CPU. The two vCPUs are at
  times hyperthreads of one physical core (the guest's topology says "2 cores, 1 thread each" either way): then a
  spinning process, such as a busy-polling peer, slows the Python beside it 1.6-1.9x. At other times it changes
  nothing, and at others it speeds it up (0.84x: perhaps by keeping another tenant off that core). The same day
  gave 12.6 -> 22.8 us, then 12.6 -> 12.5 us within the hour.

``cold_factor`` and ``corun_factor`` are each over ``warm_us``. ``bench.network`` and ``bench.rmi`` record them
before and after their runs (``machine-before``, ``machine-after``). The child stops by itself after
``SPINNER_MAX_S`` and is killed as soon as its timing ends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .instructions import WARMUP, round_trip

ROUND_TRIPS = 5000
"""Round trips per warm timing (about 0.1 s on this machine)."""
COLD_GAP_US = 1000
"""The busy-wait before each cold round trip."""
COLD_SAMPLES = 100
"""Cold round trips timed (their median counts)."""
QUICK: dict[str, int] = {"rounds": 1, "count": 500, "samples": 20}
"""``measure``'s arguments for a benchmark's ``--quick`` run (a check that it works, in well under a second)."""
SPINNER_MAX_S = 30.0
"""The spinning child stops by itself after this long, whatever happens to its parent."""
_SPINNER = """\
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
print("spinning", flush=True)
while time.monotonic() < end:
    pass
"""


def _warm_us(step: Callable[[], int], rounds: int, count: int) -> float:
    """The fastest of ``rounds`` timings of ``count`` round trips back to back, in microseconds per round trip."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            step()
        best = min(best, time.perf_counter() - start)
    return best / count * 1e6


def _cold_us(step: Callable[[], int], samples: int, gap_us: int) -> float:
    """The median of ``samples`` round trips, each after ``gap_us`` of a Python busy-wait."""
    times = []
    for _ in range(samples):
        until = time.perf_counter_ns() + gap_us * 1000
        while time.perf_counter_ns() < until:
            pass
        start = time.perf_counter_ns()
        step()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def measure(
    rounds: int = 3, count: int = ROUND_TRIPS, samples: int = COLD_SAMPLES, gap_us: int = COLD_GAP_US
) -> dict[str, Any]:
    """The three timings and their factors (see the module's docstring); without a second CPU to spin on,
    ``beside_us`` and ``corun_factor`` are left out and ``corun_skipped`` says why."""
    step = round_trip("message")
    for _ in range(WARMUP):
        step()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = len(allowed) >= 2
    if pinned:
        os.sched_setaffinity(0, {allowed[0]})
    spinner: subprocess.Popen[str] | None = None
    try:
        warm = _warm_us(step, rounds, count)
        figures: dict[str, Any] = {
            "warm_us": round(warm, 2),
            "cold_us": round(_cold_us(step, samples, gap_us), 2),
            "cold_gap_us": gap_us,
        }
        figures["cold_factor"] = round(figures["cold_us"] / warm, 3)
        if not pinned:
            figures["corun_skipped"] = f"this process may run on {len(allowed) or 'an unknown number of'} CPU"
            return figures
        spinner = subprocess.Popen(
            [sys.executable, "-c", _SPINNER, str(allowed[1]), str(SPINNER_MAX_S)], stdout=subprocess.PIPE, text=True
        )
        assert spinner.stdout is not None
        if spinner.stdout.readline().strip() != "spinning":
            raise RuntimeError("the spinning child did not start")
        beside = _warm_us(step, rounds, count)
        figures.update(cpus=allowed[:2], beside_us=round(beside, 2), corun_factor=round(beside / warm, 3))
        return figures
    finally:
        if spinner is not None:
            _stop(spinner)
        if pinned:
            os.sched_setaffinity(0, allowed)


def _stop(spinner: subprocess.Popen[str]) -> None:
    spinner.kill()
    spinner.wait(timeout=10)
    if spinner.stdout is not None:
        spinner.stdout.close()


def describe(figures: dict[str, Any]) -> str:
    """One line for a benchmark's printout."""
    line = (
        f"machine: a round trip of two connection machines {figures['warm_us']:.1f} us warm, "
        f"{figures['cold_us']:.1f} us cold ({figures['cold_factor']:.2f}x)"
    )
    if "corun_skipped" in figures:
        return f"{line}; beside a spinning process not measured: {figures['corun_skipped']}"
    beside = f"{figures['beside_us']:.1f} us beside a process spinning on the other CPU"
    return f"{line}, {beside} ({figures['corun_factor']:.2f}x)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="warm timings of each kind (the best counts)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    figures = measure(args.rounds)
    print(describe(figures))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
