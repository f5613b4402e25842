"""``python -m bench``: slipstream vs pyzmq on this machine, side by side, in one invocation.

Two suites, both by default (``--suite ipc|udp|aeron-c|all``). IPC: slipstream ``aeron:ipc`` vs pyzmq
``ipc://``. UDP: slipstream ``aeron:udp`` on 127.0.0.1 vs pyzmq ``tcp://127.0.0.1``. Each measures
throughput (one publisher process -> one subscriber process, interleaved rounds, median reported)
and round-trip latency (ping-pong between two processes, percentiles); UDP adds a bulk transfer of
large fragmented messages. slipstream runs against a standalone driver process in a fresh directory
under /dev/shm, so no driver thread shares the GIL with a measured loop; one extra IPC row puts the
driver on a thread of the publisher, as the embedded default does. Every run is bounded in count
and in time. The table goes to stdout, progress to stderr, everything measured to one JSON file.
A third, optional suite (``aeron-c``, in the default run only when ``--aeron-dir`` or
``$SLIPSTREAM_AERON_C_DIR`` names a build) runs the reference Aeron C driver and samples through the
same figures and prints them beside slipstream's as a yardstick (``bench.aeron_c``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from . import scratch_dir
from .report import Plan


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--suite",
        choices=("ipc", "udp", "aeron-c", "all"),
        default="all",
        help="which suite (default all: ipc and udp, and aeron-c when an Aeron C build is given)",
    )
    parser.add_argument(
        "--aeron-dir",
        default=os.environ.get("SLIPSTREAM_AERON_C_DIR") or None,
        help="Aeron C build for the aeron-c yardstick suite (default $SLIPSTREAM_AERON_C_DIR)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks the suite works, measures little")
    parser.add_argument(
        "--messages", type=int, help="messages per throughput run (default 1000000)"
    )
    parser.add_argument(
        "--samples", type=int, help="kept round trips per latency run (default 20000 over IPC, 5000 over UDP)"
    )
    parser.add_argument("--rounds", type=int, help="interleaved throughput rounds, median reported (default 3)")
    parser.add_argument("--only", choices=("throughput", "latency"), help="run one half of each suite")
    parser.add_argument("--time-limit", type=float, help="seconds a single run may take before it stops (default 20)")
    parser.add_argument(
        "--bulk-bytes", type=int, help="bytes of the UDP bulk transfer (default 1 GiB; 4 MiB with --quick)"
    )
    parser.add_argument(
        "--bulk-time-limit", type=float, help="seconds the bulk transfer may take before it stops (default 60)"
    )
    parser.add_argument(
        "--udp-wait",
        choices=("spin", "yield"),
        help="how UDP throughput clients wait on a refused offer or an empty poll (default yield: busy clients "
        "take the CPU the driver, which moves every datagram, needs)",
    )
    parser.add_argument(
        "--profile-driver", type=Path, metavar="DIR", help="run the UDP suite's drivers under cProfile, stats to DIR"
    )
    parser.add_argument("--out", type=Path, help="JSON output (default bench/results/<suite or bench>-<date>.json)")
    args = parser.parse_args(argv)
    for name in ("messages", "samples"):
        value = getattr(args, name)
        if value is not None and value < 2:
            parser.error(f"--{name} must be at least 2")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for name in ("time_limit", "bulk_time_limit"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.bulk_bytes is not None and args.bulk_bytes < 1:
        parser.error("--bulk-bytes must be positive")
    return args


FULL_PLAN = Plan(
    messages=1_000_000, samples=20_000, warmup=2000, parked_samples=500, parked_gap_s=0.002, time_limit_s=20.0, rounds=3
)
QUICK_PLAN = dataclasses.replace(
    FULL_PLAN,
    messages=3000,
    samples=300,
    warmup=50,
    parked_samples=20,
    time_limit_s=10.0,
    rounds=1,
    udp_messages=3000,
    udp_samples=300,
    bulk_bytes=4 << 20,
    bulk_time_limit_s=10.0,
)


def make_plan(args: argparse.Namespace) -> Plan:
    base = QUICK_PLAN if args.quick else FULL_PLAN
    samples = args.samples or base.samples
    return Plan(
        messages=args.messages or base.messages,
        samples=samples,
        warmup=min(base.warmup, max(1, samples // 10)),
        parked_samples=min(base.parked_samples, samples),
        parked_gap_s=base.parked_gap_s,
        time_limit_s=args.time_limit or base.time_limit_s,
        rounds=args.rounds or base.rounds,
        udp_messages=args.messages or base.udp_messages,
        udp_samples=args.samples or base.udp_samples,
        bulk_bytes=args.bulk_bytes or base.bulk_bytes,
        bulk_time_limit_s=args.bulk_time_limit or base.bulk_time_limit_s,
        udp_wait=args.udp_wait or base.udp_wait,
    )


def run_suite(args: argparse.Namespace) -> int:
    from . import aeron_c, ipc, loss, measure_parallelism, report, udp

    plan = make_plan(args)
    if args.suite == "all":
        suites: tuple[str, ...] = report.SUITES + ((aeron_c.SUITE,) if args.aeron_dir else ())
    else:
        suites = (args.suite,)
    started = datetime.now()
    out: Path = args.out or report.default_output(started, suites)
    rows: list[report.Row] = []
    notes: list[str] = []
    raw: dict[str, Any] = {}
    not_measured: list[dict[str, str]] = []
    yardstick: list[aeron_c.YardstickRow] | None = None
    t_suite = time.perf_counter()
    report.progress(f"suites: {', '.join(suites)}; plan: {plan}")
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
        for suite in suites:
            t_part = time.perf_counter()
            if suite == aeron_c.SUITE:
                aeron_plan = aeron_c.make_plan(args.quick, args.rounds, args.time_limit)
                yard = aeron_c.run_suite(aeron_plan, args.aeron_dir, shm, only=args.only)
                yardstick = yard.rows
                result = report.SuiteResult(notes=yard.notes, raw=yard.raw, not_measured=yard.not_measured)
            elif suite == "ipc":
                result = ipc.run_suite(plan, shm, zdir, quick=args.quick, only=args.only)
            else:
                result = udp.run_suite(plan, shm, quick=args.quick, only=args.only, profile_dir=args.profile_driver)
                if args.only in (None, "throughput"):
                    lossy = loss.run_suite(plan, quick=args.quick)
                    result.rows.extend(lossy.rows)
                    result.notes.extend(lossy.notes)
                    result.raw.update(lossy.raw)
                    result.not_measured.extend(lossy.not_measured)
            rows.extend(result.rows)
            notes.extend(result.notes)
            notes.append(f"{suite} suite took {time.perf_counter() - t_part:.1f} s")
            raw.update(result.raw)
            not_measured.extend(result.not_measured)

    if yardstick is not None:
        aeron_c.compare(yardstick, rows)
    notes.append(f"suite took {time.perf_counter() - t_suite:.1f} s")
    notes.extend(f"not measured: {item['benchmark']} ({item['reason']})" for item in not_measured)
    options = {
        "quick": args.quick,
        "suite": args.suite,
        "only": args.only,
        "plan": {k: getattr(plan, k) for k in plan.__slots__},
        "throughput_fragment_limit": ipc.THROUGHPUT_FRAGMENT_LIMIT,
        "latency_fragment_limit": ipc.LATENCY_FRAGMENT_LIMIT,
        "async_wait": ipc.ASYNC_WAIT,
        "aeron_dir": args.aeron_dir,
    }
    report.write_json(
        out,
        started=started,
        options=options,
        rows=rows,
        notes=notes,
        raw=raw,
        suites=suites,
        not_measured=not_measured,
        aeron_c=yardstick,
    )
    print(report.format_table(rows))
    print()
    if yardstick is not None:
        print(aeron_c.format_table(yardstick))
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
