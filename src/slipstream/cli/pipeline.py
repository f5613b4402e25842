"""``slipstream pipeline report | demo``: the Spark pipeline's commands (need the ``pipeline`` extra).

Spark is imported only when a subcommand runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from .._extras import require_extra


def register(commands: Any) -> None:
    """Add ``pipeline report`` and ``pipeline demo`` to the command line."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "pipeline",
        help="Spark jobs over recordings: tables and an HTML report",
        description="The Spark pipeline over what slipstream records. Needs the pipeline extra "
        "(pip install 'slipstream[pipeline]') and Java 17; the rest of the command line works without them.",
    )
    sub = parser.add_subparsers(dest="pipeline_command", required=True, metavar="COMMAND", help="report or demo")
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
