"""``python -m bench``: slipstream vs pyzmq over IPC on this machine, side by side, in one invocation.

Throughput (one publisher process -> one subscriber process, interleaved rounds, median reported)
and round-trip latency (ping-pong between two processes, percentiles). slipstream runs against a
standalone driver process in a fresh directory under /dev/shm, so no driver thread shares the GIL
with a measured loop; one extra row puts the driver on a thread of the publisher, as the embedded
default does. The table goes to stdout, progress to stderr, everything measured to a JSON file.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Plan:
    """Counts and limits of one invocation; ``--quick`` shrinks them so the smoke test stays fast."""

    messages: int
    samples: int
    warmup: int
    parked_samples: int
    parked_gap_s: float
    time_limit_s: float
    rounds: int = 1
    sizes: tuple[int, ...] = (32, 1024)
    latency_size: int = 32


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks the suite works, measures little")
    parser.add_argument("--messages", type=int, help="messages per throughput run (default 1000000)")
    parser.add_argument("--samples", type=int, help="kept round trips per latency run (default 20000)")
    parser.add_argument("--rounds", type=int, help="interleaved throughput rounds, median reported (default 3)")
    parser.add_argument("--only", choices=("throughput", "latency"), help="run one half of the suite")
    parser.add_argument("--time-limit", type=float, help="seconds a single run may take before it stops (default 20)")
    parser.add_argument("--out", type=Path, help="JSON output (default bench/results/ipc-<date>.json)")
    args = parser.parse_args(argv)
    for name in ("messages", "samples"):
        value = getattr(args, name)
        if value is not None and value < 2:
            parser.error(f"--{name} must be at least 2")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.time_limit is not None and args.time_limit <= 0:
        parser.error("--time-limit must be positive")
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        base = Plan(messages=3000, samples=300, warmup=50, parked_samples=20, parked_gap_s=0.002, time_limit_s=10.0)
    else:
        base = Plan(
            messages=1_000_000,
            samples=20_000,
            warmup=2000,
            parked_samples=500,
            parked_gap_s=0.002,
            time_limit_s=20.0,
            rounds=3,
        )
    samples = args.samples or base.samples
    return Plan(
        messages=args.messages or base.messages,
        samples=samples,
        warmup=min(base.warmup, max(1, samples // 10)),
        parked_samples=min(base.parked_samples, samples),
        parked_gap_s=base.parked_gap_s,
        time_limit_s=args.time_limit or base.time_limit_s,
        rounds=args.rounds or base.rounds,
    )


@contextlib.contextmanager
def scratch_dir(prefix: str, base: str | None) -> Iterator[Path]:
    """A fresh directory removed afterwards; under /dev/shm for slipstream (its logs live in memory)."""
    if base is not None and not os.path.isdir(base):
        base = None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _percent(worker: dict[str, Any]) -> str:
    return f"{worker['cpu_s'] / worker['wall_s'] * 100:.0f}%" if worker["wall_s"] > 0 else "n/a"


def _refusals_note(label: str, runs: list[dict[str, Any]]) -> str:
    """Back-pressure and other refusals over every round, and anything that went missing."""
    pubs = [run["publisher"] for run in runs]
    subs = [run["subscriber"] for run in runs]
    rates = sorted(run["msgs_per_s"] for run in runs)
    driver_cpu = [run["driver_cpu_s"] for run in runs if not math.isnan(run["driver_cpu_s"])]
    note = (
        f"{label}: {len(runs)} rounds, {rates[0] / 1e3:.0f}..{rates[-1] / 1e3:.0f} k msg/s; publisher "
        f"back-pressured {sum(p['back_pressured'] for p in pubs)} times on "
        f"{sum(p['back_pressured_messages'] for p in pubs)} of {sum(p['sent'] for p in pubs)} messages, "
        f"ADMIN_ACTION {sum(p['admin_actions'] for p in pubs)}, NOT_CONNECTED {sum(p['not_connected'] for p in pubs)}"
    )
    if driver_cpu:
        note += f"; driver process CPU {sum(driver_cpu):.2f} s in all"
    if any(p["timed_out"] for p in pubs):
        note += "; a publisher stopped at the time limit"
    for pub, sub in zip(pubs, subs, strict=True):
        if sub["received"] < pub["sent"]:
            note += (
                f"; MISSING {pub['sent'] - sub['received']} of {pub['sent']} messages at the subscriber "
                f"(image state {sub['images']}, publisher position {pub['position']})"
            )
    return note


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def run_suite(args: argparse.Namespace) -> int:
    from . import ipc, measure_parallelism, report, zmq_peer

    plan = make_plan(args)
    started = datetime.now()
    out: Path = args.out or report.default_output(started)
    do_throughput = args.only in (None, "throughput")
    do_latency = args.only in (None, "latency")
    rows: dict[str, report.Row] = {}
    notes: list[str] = []
    raw: dict[str, Any] = {}
    t_suite = time.perf_counter()
    _progress(f"plan: {plan}")
    parallelism = measure_parallelism(2, 0.3 if args.quick else 1.0)
    raw["parallelism_2_busy_processes"] = parallelism
    notes.append(
        f"two busy processes got {parallelism:.2f} cores together (os.cpu_count() = {os.cpu_count()})"
        + (
            ": fewer than 2, so busy-spinning peers (and the driver) take turns on the CPU, and busy-spin "
            "latency shows scheduler time slices (ms), not the transport"
            if parallelism < 1.8
            else ""
        )
    )
    latency_modes = (
        # key, slipstream pong wait, slipstream ping wait, pyzmq REP wait, gap between pings, samples
        ("spin", "spin", "spin", "blocking", 0.0, plan.samples),
        ("yield", "yield", "yield", None, 0.0, plan.samples),  # pyzmq: the blocking run stands in
        ("asyncio", "asyncio", "spin", "asyncio", 0.0, plan.samples),
        ("asyncio-parked", "asyncio", "spin", "asyncio", plan.parked_gap_s, plan.parked_samples),
    )
    tp: dict[str, list[dict[str, Any]]] = {}

    with scratch_dir("slipstream-bench-", "/dev/shm") as shm, scratch_dir("slipstream-bench-zmq-", None) as zdir:
        stream = 1000
        driver_dir = shm / "driver"
        with ipc.standalone_driver(driver_dir) as driver_pid:
            idle_cpu = ipc.process_cpu_s(driver_pid)
            time.sleep(0.3 if args.quick else 1.0)
            idle_cpu = (ipc.process_cpu_s(driver_pid) - idle_cpu) / (0.3 if args.quick else 1.0)
            raw["driver_idle_cpu_fraction"] = idle_cpu
            notes.append(f"standalone driver, idle with no clients: {idle_cpu * 100:.0f}% of a core")
            if do_latency:
                for key, pong_wait, ping_wait, _, gap, samples in latency_modes:
                    _progress(f"slipstream latency, pong {key}")
                    raw[f"slipstream.latency.{key}"] = ipc.run_latency(
                        driver_dir,
                        stream,
                        plan.latency_size,
                        plan.warmup if not gap else min(plan.warmup, 20),
                        samples,
                        plan.time_limit_s,
                        pong_wait=pong_wait,
                        ping_wait=ping_wait,
                        gap_s=gap,
                        driver_pid=driver_pid,
                    )
                    stream += 10
        if do_latency:
            for key, _, _, rep_wait, gap, samples in latency_modes:
                if rep_wait is None:
                    continue
                _progress(f"pyzmq REQ/REP latency, REP {rep_wait}{' parked' if gap else ''}")
                raw[f"pyzmq.latency.{key}"] = zmq_peer.run_latency(
                    f"ipc://{zdir}/rr-{key}.sock",
                    plan.latency_size,
                    plan.warmup if not gap else min(plan.warmup, 20),
                    samples,
                    plan.time_limit_s,
                    rep_wait=rep_wait,
                    gap_s=gap,
                )
        # Throughput in rounds that interleave the contenders, so a noisy neighbour or a frequency
        # change hits both alike; each cell reports the median round.
        for round_no in range(plan.rounds if do_throughput else 0):
            tag = f"round {round_no + 1}/{plan.rounds}"
            with ipc.standalone_driver(driver_dir) as driver_pid:
                for size in plan.sizes:
                    _progress(f"{tag}: slipstream throughput {size} B, standalone driver")
                    tp.setdefault(f"slipstream.throughput.{size}B.standalone", []).append(
                        ipc.run_throughput(
                            driver_dir, stream, size, plan.messages, plan.time_limit_s, driver_pid=driver_pid
                        )
                    )
                    stream += 10
            size = plan.sizes[0]
            _progress(f"{tag}: slipstream throughput {size} B, driver embedded in the publisher")
            tp.setdefault(f"slipstream.throughput.{size}B.embedded", []).append(
                ipc.run_throughput(
                    shm / f"embedded-{round_no}", stream, size, plan.messages, plan.time_limit_s, driver_pid=None
                )
            )
            stream += 10
            for size in plan.sizes:  # no slipstream driver runs during these
                _progress(f"{tag}: pyzmq PUSH/PULL throughput {size} B")
                tp.setdefault(f"pyzmq.throughput.{size}B", []).append(
                    zmq_peer.run_throughput(
                        f"ipc://{zdir}/tp-{size}-{round_no}.sock", size, plan.messages, plan.time_limit_s
                    )
                )
    raw.update(tp)

    if do_throughput:
        for size in plan.sizes:
            zmq_runs = tp[f"pyzmq.throughput.{size}B"]
            for driver in ("standalone", "embedded"):
                runs = tp.get(f"slipstream.throughput.{size}B.{driver}")
                if not runs:
                    continue
                where = "standalone driver" if driver == "standalone" else "driver embedded in publisher"
                slip_mb = _median([r["mb_per_s"] for r in runs])
                zmq_mb = _median([r["mb_per_s"] for r in zmq_runs])
                rows[f"throughput.{size}B.{driver}"] = report.Row(
                    id=f"throughput.{size}B.{driver}",
                    benchmark=f"throughput {_size_label(size)} ({where}) vs PUSH/PULL",
                    kind="throughput",
                    unit="msg/s",
                    slipstream=_median([r["msgs_per_s"] for r in runs]),
                    pyzmq=_median([r["msgs_per_s"] for r in zmq_runs]),
                    slipstream_extra=f"{slip_mb:.1f} MB/s",
                    pyzmq_extra=f"{zmq_mb:.1f} MB/s",
                    details={
                        "statistic": f"median of {len(runs)} rounds",
                        "slipstream_mb_per_s": slip_mb,
                        "pyzmq_mb_per_s": zmq_mb,
                        "slipstream_msgs_per_s_rounds": [r["msgs_per_s"] for r in runs],
                        "pyzmq_msgs_per_s_rounds": [r["msgs_per_s"] for r in zmq_runs],
                        "back_pressured": sum(r["publisher"]["back_pressured"] for r in runs),
                        "back_pressured_messages": sum(r["publisher"]["back_pressured_messages"] for r in runs),
                        "admin_actions": sum(r["publisher"]["admin_actions"] for r in runs),
                        "missing_messages": sum(r["publisher"]["sent"] - r["subscriber"]["received"] for r in runs),
                    },
                )
                notes.append(_refusals_note(f"throughput {_size_label(size)} {driver}", runs))
            zrates = sorted(r["msgs_per_s"] for r in zmq_runs)
            notes.append(
                f"pyzmq throughput {_size_label(size)}: {len(zmq_runs)} rounds, "
                f"{zrates[0] / 1e3:.0f}..{zrates[-1] / 1e3:.0f} k msg/s"
            )
    if do_latency:
        titles = {
            "spin": "busy-spin poll vs REQ/REP",
            "yield": "poll + sched_yield (YieldingIdleStrategy) vs REQ/REP",
            "asyncio": f"asyncio pong [{ipc.ASYNC_WAIT}] vs zmq.asyncio REP",
            "asyncio-parked": (
                f"asyncio pong parked, ping every {plan.parked_gap_s * 1e3:g} ms [{ipc.ASYNC_WAIT}] vs zmq.asyncio REP"
            ),
        }
        for key, title in titles.items():
            # a yielding pyzmq REQ/REP is the blocking one: it sleeps in the kernel either way
            slip, zmq = raw[f"slipstream.latency.{key}"], raw[f"pyzmq.latency.{'spin' if key == 'yield' else key}"]
            for result in (slip, zmq):
                if "rtt_ns" in result:
                    result["summary"] = report.latency_summary(result.pop("rtt_ns"))
            slip_summary, zmq_summary = slip["summary"], zmq["summary"]
            for pct in report.PERCENTILES:
                row_id = f"latency.{plan.latency_size}B.{key}.p{pct:g}"
                rows[row_id] = report.Row(
                    id=row_id,
                    benchmark=f"RTT {plan.latency_size} B p{pct:g}, {title}",
                    kind="latency",
                    unit="us",
                    slipstream=slip_summary[f"p{pct:g}_us"],
                    pyzmq=zmq_summary[f"p{pct:g}_us"],
                    details={
                        "slipstream_samples": slip_summary["count"],
                        "pyzmq_samples": zmq_summary["count"],
                        "stopped_at_time_limit": slip["timed_out"] or zmq["timed_out"],
                    },
                )
            pong, rep = slip["ponger"], zmq["rep"]
            notes.append(
                f"latency {key}: {slip_summary['count']} vs {zmq_summary['count']} samples; pong side CPU "
                f"slipstream {_percent(pong)} vs pyzmq {_percent(rep)} of a core"
                + (
                    f"; driver process used {slip['driver_cpu_s']:.2f} s CPU"
                    if not math.isnan(slip["driver_cpu_s"])
                    else ""
                )
                + (f" (stopped at the {plan.time_limit_s:g} s limit)" if slip["timed_out"] or zmq["timed_out"] else "")
            )

    elapsed = time.perf_counter() - t_suite
    notes.append(f"suite took {elapsed:.1f} s")
    options = {
        "quick": args.quick,
        "only": args.only,
        "plan": {k: getattr(plan, k) for k in plan.__slots__},
        "throughput_fragment_limit": ipc.THROUGHPUT_FRAGMENT_LIMIT,
        "latency_fragment_limit": ipc.LATENCY_FRAGMENT_LIMIT,
        "async_wait": ipc.ASYNC_WAIT,
    }
    ordered = list(rows.values())
    report.write_json(out, started=started, options=options, rows=ordered, notes=notes, raw=raw)
    print(report.format_table(ordered))
    print()
    for note in notes:
        print(f"- {note}")
    print(f"\nresults: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from . import BenchError

    try:
        return run_suite(args)
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
