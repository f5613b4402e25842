"""``slipstream pipeline report | demo | compact``: the Spark pipeline's commands (report and demo need the
``pipeline`` extra; compact, which keeps a recording, only the ``telemetry`` one).

Spark is imported only when a subcommand runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._extras import require_extra


def register(commands: Any) -> None:
    """Add ``pipeline report``, ``pipeline demo`` and ``pipeline compact`` to the command line."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "pipeline",
        help="Spark jobs over recordings: tables and an HTML report",
        description="The Spark pipeline over what slipstream records. Needs the pipeline extra "
        "(pip install 'slipstream[pipeline]') and Java 17; the rest of the command line works without them.",
    )
    sub = parser.add_subparsers(
        dest="pipeline_command", required=True, metavar="COMMAND", help="report, demo or compact"
    )
    report = sub.add_parser(
        "report",
        help="run the report jobs over a recording directory",
        description="Run the Spark jobs over a recording directory (slipstream record, slipstream driver "
        "--record, or a server's RecordingConfig): Parquet tables of sessions, refused handshakes, the abuse "
        "list, stream throughput, message types, driver counters, loss and errors, and an HTML report with plots.",
    )
    demo = sub.add_parser(
        "demo",
        help="record a real run, report on it, then run the live abuse-list loop",
        description="Record a real run (typed streams over IPC and UDP, then a server and its clients, some "
        "refused on purpose), report on it with Spark, then run the live loop: Spark's abuse list goes back "
        "onto a slipstream stream, and a running server refuses the host it names. Exit status 0 when it "
        "did (or with --no-loop).",
    )
    _add_compact(sub)
    try:
        import slipstream.pipeline.demo as demo_module
        import slipstream.pipeline.run as run_module
    except ImportError as exc:  # the extra is not installed: say so when the command runs
        missing = str(exc)

        def unavailable(args: argparse.Namespace) -> int:
            print(
                f"slipstream pipeline: the pipeline extra is missing ({missing}); "
                "install it with: pip install 'slipstream[pipeline]'",
                file=sys.stderr,
            )
            return 2

        for p in (report, demo):
            p.add_argument("rest", nargs=argparse.REMAINDER, help="the options of the command (needs the extra)")
            p.set_defaults(run=unavailable)
        return
    run_module.add_arguments(report)
    report.set_defaults(run=_needs_extra(run_module.run))
    demo_module.add_arguments(demo)
    demo.set_defaults(run=_needs_extra(demo_module.run))


def _needs_extra(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` after a check that the extra is there (its modules import Spark only inside the jobs)."""

    def checked(args: argparse.Namespace) -> int:
        require_extra("pipeline", args.pipeline_command)  # a MissingExtraError: main prints it, exits 2
        return run(args)

    return checked


def _add_compact(sub: Any) -> None:
    compact = sub.add_parser(
        "compact",
        help="merge small segments, drop old partitions, recover dead writers",
        description="Keep a recording: finalize what dead writers left, delete date/hour partitions older than "
        "--retain, merge each writer's runs of small segments in a partition into files of up to --target-size "
        "(running streaming queries keep their offsets), and delete what earlier compactions replaced once "
        "older than --grace. Needs write access to the recording; nothing else does.",
    )
    compact.add_argument("root", type=Path, metavar="ROOT", help="the recording directory")
    compact.add_argument(
        "--target-size", default="128MiB", metavar="SIZE", help="largest file a merge makes (default: 128MiB)"
    )
    compact.add_argument(
        "--retain", default=None, metavar="PERIOD", help="delete partitions older than this, e.g. 7d (default: keep)"
    )
    compact.add_argument(
        "--grace",
        default="1h",
        metavar="PERIOD",
        help="keep replaced segments this long for queries that listed them (default: 1h; 0s for none)",
    )
    compact.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    compact.set_defaults(run=_run_compact)


def _run_compact(args: argparse.Namespace) -> int:
    """Exit 0 when done, 2 on bad options or a missing recording, 1 when it could not run (busy, I/O)."""
    require_extra("telemetry", "pipeline compact")
    from ..telemetry.maintenance import MaintenanceError, compact, parse_bytes, parse_period

    try:
        target = parse_bytes(args.target_size)
        retain = parse_period(args.retain) if args.retain is not None else None
        grace = 0.0 if args.grace.strip() in ("0", "0s") else parse_period(args.grace, "--grace")
        if not args.root.is_dir():
            raise MaintenanceError(f"{args.root}: no such recording directory")
    except MaintenanceError as exc:
        print(f"slipstream pipeline compact: {exc}", file=sys.stderr)
        return 2
    try:
        result = compact(args.root, target_bytes=target, retain_s=retain, grace_s=grace, dry_run=args.dry_run)
    except (MaintenanceError, OSError) as exc:
        print(f"slipstream pipeline compact: {exc}", file=sys.stderr)
        return 1
    would = "would " if args.dry_run else ""
    root = str(args.root)
    if result.recovered:
        print(f"recovered {result.recovered} segments from dead writers")
    for partition in result.dropped_partitions:
        print(f"{would}drop {partition} (older than {args.retain})")
    for path, segments, size_in, size in result.merged:
        made = f" ({size} bytes)" if size else ""
        print(f"{would}merge {segments} segments ({size_in} bytes) into {path.removeprefix(root).lstrip('/')}{made}")
    for path in result.deleted:
        print(f"{would}delete {path.removeprefix(root).lstrip('/')} (replaced more than {args.grace} ago)")
    for path in result.removed:
        print(f"{would}remove {path.removeprefix(root).lstrip('/')}")
    merged = sum(entry[1] for entry in result.merged)
    print(
        f"{root}: {would}merge {merged} segments ({result.merged_bytes_in} bytes) into {len(result.merged)} files; "
        f"{would}delete {len(result.deleted)} replaced files ({result.waiting} kept for the grace period); "
        f"{would}drop {len(result.dropped_partitions)} partitions",
        flush=True,
    )
    return 0
