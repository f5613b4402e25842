"""Issue 28's targets: how long from a fault's end until messages flow again (p50, p90 and max over the
trials), and messages lost or duplicated in every trial.

    python -m bench.faults [--quick] [--trials N] [--json PATH]

Each trial is a fresh server process and client process (``tests/fault_peer.py``) exchanging 200 notes
a second each way, one fault, and the whole account settled afterwards (``bench/fault_harness.py``,
which the fault suite runs too). "Flowing again" is, in each direction, the first note made after the
fault's end arriving; a trial's figure is the later of the two directions. The faults and targets (p50):

- ``driver-restart-server`` / ``-client``: the standalone driver SIGKILLed and restarted at once; from
  the moment the new driver runs: at most 2 s.
- ``pause``: the server process (embedded driver) stopped 10 s (``--quick``: 6 s); from SIGCONT: 1 s.
- ``partition``: every packet between two namespaces dropped for 10 s (``--quick``: 5 s); from the
  heal: 1 s (needs root and nftables: not measured otherwise, and the run says why).

Damage (any trial): notes lost in silence, duplicated, reordered, received though refused, or reported
undeliverable though received: target 0. Trials run one after another (2 cores are enough); a trial
that fails outright is kept with its error.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from .fault_harness import Outcome, Settings, driver_restart, partition, pause
from .report import machine_info

TARGETS_S = {"driver-restart-server": 2.0, "driver-restart-client": 2.0, "pause": 1.0, "partition": 1.0}


def faults(quick: bool) -> dict[str, Callable[[Settings], Outcome]]:
    pause_s, partition_s = (6.0, 5.0) if quick else (10.0, 10.0)
    return {
        "driver-restart-server": lambda s: driver_restart(s, "server"),
        "driver-restart-client": lambda s: driver_restart(s, "client"),
        "pause": lambda s: pause(s, pause_s),
        "partition": lambda s: partition(s, partition_s),
    }


def trial_record(outcome: Outcome) -> dict[str, Any]:
    streams = outcome.ledger.streams.values()
    return {
        "recovered_s": outcome.recovered_s,
        "recovery_s": outcome.recovery_s,
        "damaged": outcome.damaged,
        "lost": sum(len(s.lost) for s in streams),
        "duplicated": sum(len(s.duplicates) for s in streams),
        "sent": sum(len(s.sent) for s in streams),
        "received": sum(len(s.received) for s in streams),
        "undeliverable": sum(len(s.undelivered) for s in streams),
        "refused": sum(len(s.refused) for s in streams),
        "on_error_calls": outcome.on_error_calls,
        "fault": outcome.notes,
        "duration_s": outcome.duration_s,
    }


def nearest_rank(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def summarize(name: str, trials: list[dict[str, Any]]) -> dict[str, Any]:
    times = [t["recovered_s"] for t in trials if t.get("recovered_s") is not None]
    never = sum(1 for t in trials if t.get("recovered_s") is None)
    damaged = [t.get("damaged", 0) for t in trials if "error" not in t]
    target = TARGETS_S[name]
    summary: dict[str, Any] = {
        "target_p50_s": target,
        "trials": len(trials),
        "never_recovered": never,
        "failed": sum(1 for t in trials if "error" in t),
        "damaged_in_trials": damaged,
        "p50_s": statistics.median(times) if times else None,
        "p90_s": nearest_rank(times, 90) if times else None,
        "max_s": max(times) if times else None,
    }
    summary["met"] = bool(
        times and not never and summary["p50_s"] <= target and not any(damaged) and not summary["failed"]
    )
    return summary


def netns_reason() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    from slipstream.testing import NetnsUnavailableError, require_netns

    try:
        require_netns()
    except NetnsUnavailableError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 trial per fault, shorter faults")
    parser.add_argument("--trials", type=int, default=None, help="trials per fault (default 10; --quick: 1)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--only", action="append", choices=sorted(TARGETS_S), help="only this fault (repeatable)")
    args = parser.parse_args(argv)
    trials = args.trials or (1 if args.quick else 10)
    settings = Settings(before_s=1.0, after_s=1.0) if args.quick else Settings()
    started = time.monotonic()
    results: dict[str, Any] = {
        "benchmark": "faults",
        "started": datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.faults", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine_info(),
        "settings": {**asdict(settings), "trials": trials, "quick": args.quick},
        "faults": {},
        "not_measured": {},
    }
    reason = netns_reason()
    for name, run in faults(args.quick).items():
        if args.only and name not in args.only:
            continue
        if name == "partition" and reason is not None:
            results["not_measured"][name] = reason
            print(f"{name}: not measured: {reason}", flush=True)
            continue
        records = []
        for index in range(trials):
            try:
                outcome = run(settings)
            except Exception as exc:
                records.append({"error": f"{type(exc).__name__}: {exc}"[:2000]})
                print(f"{name} trial {index + 1}: failed\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                continue
            records.append(trial_record(outcome))
            print(f"{name} trial {index + 1}: {outcome.summary()}", file=sys.stderr, flush=True)
        summary = summarize(name, records)
        results["faults"][name] = {**summary, "trial_records": records}
        print(_line(name, summary), flush=True)
    results["elapsed_s"] = time.monotonic() - started
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _line(name: str, s: dict[str, Any]) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    verdict = "met" if s["met"] else "NOT met"
    return (
        f"{name:24} p50 {seconds(s['p50_s'])} (target <= {s['target_p50_s']:g} s: {verdict}), "
        f"p90 {seconds(s['p90_s'])}, max {seconds(s['max_s'])}, {s['trials']} trials, "
        f"never recovered {s['never_recovered']}, failed {s['failed']}, "
        f"damaged notes per trial {s['damaged_in_trials']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
