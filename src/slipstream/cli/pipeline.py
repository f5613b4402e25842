"""``slipstream pipeline report | demo``: the Spark pipeline's commands (need the ``pipeline`` extra).

Spark is imported only when a subcommand runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(commands: Any) -> None:
    """Add ``pipeline report`` and ``pipeline demo`` to the command line."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "pipeline", help="Spark jobs over recordings: tables and an HTML report", description=__doc__
    )
    sub = parser.add_subparsers(dest="pipeline_command", required=True, metavar="COMMAND")
    report = sub.add_parser("report", help="run the report jobs over a recording directory")
    demo = sub.add_parser("demo", help="record a real run, report on it, then run the live abuse-list loop")
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
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(run=unavailable)
        return
    run_module.add_arguments(report)
    report.set_defaults(run=run_module.run)
    demo_module.add_arguments(demo)
    demo.set_defaults(run=demo_module.run)
