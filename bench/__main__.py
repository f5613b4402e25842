"""``python -m bench``: slipstream vs pyzmq over IPC on this machine, side by side, in one invocation.

Throughput (one publisher process -> one subscriber process) and round-trip latency (ping-pong
between two processes). slipstream runs against a standalone driver process in a fresh directory
under /dev/shm, so no driver thread shares the GIL with a measured loop; one extra row puts the
driver on a thread of the publisher, as the embedded default does.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
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
    messages: int
    samples: int
    warmup: int
    parked_samples: int
    parked_gap_s: float
    time_limit_s: float
    sizes: tuple[int, ...] = (32, 1024)
    latency_size: int = 32


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks the suite works, measures little")
    parser.add_argument("--messages", type=int, help="messages per throughput run (default 1000000)")
    parser.add_argument("--samples", type=int, help="kept round trips per latency run (default 20000)")
    parser.add_argument("--only", choices=("throughput", "latency"), help="run one half of the suite")
    parser.add_argument("--time-limit", type=float, help="seconds a single run may take before it stops (default 20)")
    parser.add_argument("--out", type=Path, help="JSON output (default bench/results/ipc-<date>.json)")
    args = parser.parse_args(argv)
    for name in ("messages", "samples"):
        value = getattr(args, name)
        if value is not None and value < 2:
            parser.error(f"--{name} must be at least 2")
    if args.time_limit is not None and args.time_limit <= 0:
        parser.error("--time-limit must be positive")
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        base = Plan(messages=3000, samples=300, warmup=50, parked_samples=20, parked_gap_s=0.002, time_limit_s=10.0)
    else:
        base = Plan(
            messages=1_000_000, samples=20_000, warmup=2000, parked_samples=500, parked_gap_s=0.002, time_limit_s=20.0
        )
    samples = args.samples or base.samples
    return Plan(
        messages=args.messages or base.messages,
        samples=samples,
        warmup=min(base.warmup, max(1, samples // 10)),
        parked_samples=min(base.parked_samples, samples),
        parked_gap_s=base.parked_gap_s,
        time_limit_s=args.time_limit or base.time_limit_s,
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


def _bp_note(label: str, result: dict[str, Any]) -> str:
    pub = result["publisher"]
    return (
        f"{label}: publisher back-pressured {pub['back_pressured']} times on {pub['back_pressured_messages']} "
        f"of {pub['sent']} messages, ADMIN_ACTION {pub['admin_actions']}, NOT_CONNECTED {pub['not_connected']}"
        + (
            f"; driver process used {result['driver_cpu_s']:.2f} s CPU"
            if not math.isnan(result["driver_cpu_s"])
            else ""
        )
        + f"; subscriber measured {result['subscriber']['measured']} msgs in {result['subscriber']['elapsed_s']:.3f} s"
        + (" (stopped at the time limit)" if result["subscriber"]["timed_out"] or pub["timed_out"] else "")
    )


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

    with scratch_dir("slipstream-bench-", "/dev/shm") as shm, scratch_dir("slipstream-bench-zmq-", None) as zdir:
        # slipstream against a standalone driver process
        with ipc.standalone_driver(shm / "driver") as driver_pid:
            idle_cpu = ipc.process_cpu_s(driver_pid)
            time.sleep(1.0)
            idle_cpu = ipc.process_cpu_s(driver_pid) - idle_cpu
            raw["driver_idle_cpu_fraction"] = idle_cpu
            notes.append(f"standalone driver, idle with no clients: {idle_cpu * 100:.0f}% of a core over 1 s")
            stream = 1000
            if do_throughput:
                for size in plan.sizes:
                    _progress(f"slipstream throughput {size} B, standalone driver")
                    raw[f"slipstream.throughput.{size}B.standalone"] = ipc.run_throughput(
                        shm / "driver", stream, size, plan.messages, plan.time_limit_s, driver_pid=driver_pid
                    )
                    stream += 10
            if do_latency:
                modes = (
                    ("spin", "spin", "spin", 0.0, plan.samples),
                    ("yield", "yield", "yield", 0.0, plan.samples),
                    ("asyncio", "asyncio", "spin", 0.0, plan.samples),
                    ("asyncio-parked", "asyncio", "spin", plan.parked_gap_s, plan.parked_samples),
                )
                for key, wait, ping_wait, gap, samples in modes:
                    _progress(f"slipstream latency, pong {key}")
                    raw[f"slipstream.latency.{key}"] = ipc.run_latency(
                        shm / "driver",
                        stream,
                        plan.latency_size,
                        plan.warmup if not gap else min(plan.warmup, 20),
                        samples,
                        plan.time_limit_s,
                        pong_wait=wait,
                        ping_wait=ping_wait,
                        gap_s=gap,
                        driver_pid=driver_pid,
                    )
                    stream += 10
        # the driver on a thread of the publisher process
        if do_throughput:
            size = plan.sizes[0]
            _progress(f"slipstream throughput {size} B, driver embedded in the publisher")
            raw[f"slipstream.throughput.{size}B.embedded"] = ipc.run_throughput(
                shm / "embedded", 5000, size, plan.messages, plan.time_limit_s, driver_pid=None
            )
        # pyzmq, with no slipstream driver running
        if do_throughput:
            for size in plan.sizes:
                _progress(f"pyzmq PUSH/PULL throughput {size} B")
                raw[f"pyzmq.throughput.{size}B"] = zmq_peer.run_throughput(
                    f"ipc://{zdir}/tp-{size}.sock", size, plan.messages, plan.time_limit_s
                )
        if do_latency:
            zmodes = (
                ("spin", "blocking", 0.0, plan.samples),
                ("asyncio", "asyncio", 0.0, plan.samples),
                ("asyncio-parked", "asyncio", plan.parked_gap_s, plan.parked_samples),
            )
            for key, wait, gap, samples in zmodes:
                _progress(f"pyzmq REQ/REP latency, REP {wait}{' parked' if gap else ''}")
                raw[f"pyzmq.latency.{key}"] = zmq_peer.run_latency(
                    f"ipc://{zdir}/rr-{key}.sock",
                    plan.latency_size,
                    plan.warmup if not gap else min(plan.warmup, 20),
                    samples,
                    plan.time_limit_s,
                    rep_wait=wait,
                    gap_s=gap,
                )

    if do_throughput:
        for size in plan.sizes:
            for driver in ("standalone", "embedded"):
                slip = raw.get(f"slipstream.throughput.{size}B.{driver}")
                if slip is None:
                    continue
                zmq = raw[f"pyzmq.throughput.{size}B"]
                where = "standalone driver" if driver == "standalone" else "driver embedded in publisher"
                rows[f"throughput.{size}B.{driver}"] = report.Row(
                    id=f"throughput.{size}B.{driver}",
                    benchmark=f"throughput {_size_label(size)} ({where}) vs PUSH/PULL",
                    kind="throughput",
                    unit="msg/s",
                    slipstream=slip["msgs_per_s"],
                    pyzmq=zmq["msgs_per_s"],
                    slipstream_extra=f"{slip['mb_per_s']:.1f} MB/s",
                    pyzmq_extra=f"{zmq['mb_per_s']:.1f} MB/s",
                    details={
                        "slipstream_mb_per_s": slip["mb_per_s"],
                        "pyzmq_mb_per_s": zmq["mb_per_s"],
                        "back_pressured": slip["publisher"]["back_pressured"],
                        "back_pressured_messages": slip["publisher"]["back_pressured_messages"],
                        "admin_actions": slip["publisher"]["admin_actions"],
                        "driver_cpu_s": slip["driver_cpu_s"],
                    },
                )
                notes.append(_bp_note(f"throughput {_size_label(size)} {driver}", slip))
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
