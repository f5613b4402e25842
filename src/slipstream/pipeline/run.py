"""``slipstream pipeline report`` as a function, and as a script for ``spark-submit``.

``spark-submit [--master URL] $(python -c 'import slipstream.pipeline.run as m; print(m.__file__)')
--input DIR --output DIR`` runs the same jobs as the command: under spark-submit the session takes
the master spark-submit was given.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from .options import DEFAULT_ABUSE_THRESHOLD, DEFAULT_TOP, DEFAULT_WINDOW_S, ReportOptions

if TYPE_CHECKING:
    from .jobs import TablesResult


@dataclass(frozen=True)
class ReportOutcome:
    """What a report run produced: the page, the tables (paths and rows), and how long it took."""

    html: Path
    tables: TablesResult
    master: str
    startup_s: float
    jobs_s: float


def generate_report(
    input_dir: str | Path,
    output_dir: str | Path,
    *,
    master: str | None = None,
    options: ReportOptions | None = None,
    progress_out: TextIO | None = None,
    show_progress: bool = True,
) -> ReportOutcome:
    """Start (or reuse) a Spark session, run every job, write tables and the HTML report."""
    from .jobs import TABLES, Progress, build_tables
    from .report import write_report
    from .session import spark_session

    options = options or ReportOptions()
    if not Path(input_dir).is_dir():
        raise FileNotFoundError(f"--input {input_dir}: no such recording directory")
    started = time.monotonic()
    spark = spark_session(master)
    startup_s = time.monotonic() - started
    progress = Progress(spark, len(TABLES), progress_out) if show_progress else None
    started = time.monotonic()
    tables = build_tables(spark, input_dir, output_dir, options, progress=progress)
    jobs_s = time.monotonic() - started
    actual_master = spark.sparkContext.master
    html = write_report(
        tables,
        output_dir,
        input_dir=input_dir,
        options=options,
        master=actual_master,
        spark_version=spark.version,
        elapsed_s=jobs_s,
    )
    return ReportOutcome(html, tables, actual_master, startup_s, jobs_s)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``pipeline report`` options (also the spark-submit script's)."""
    parser.add_argument("--input", type=Path, required=True, metavar="DIR", help="recording directory")
    parser.add_argument("--output", type=Path, required=True, metavar="DIR", help="where tables and report go")
    parser.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="Spark master, spark://HOST:PORT for a cluster (default: spark-submit's, else local[*])",
    )
    add_abuse_threshold(parser)
    add_window(parser, DEFAULT_WINDOW_S)
    parser.add_argument(
        "--top", type=int, default=DEFAULT_TOP, metavar="N", help="top talkers per window (default: %(default)s)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress display")


def add_abuse_threshold(parser: argparse.ArgumentParser) -> None:
    """``--abuse-threshold``, an option of ``pipeline report`` and ``pipeline demo`` alike."""
    parser.add_argument(
        "--abuse-threshold",
        type=int,
        default=DEFAULT_ABUSE_THRESHOLD,
        metavar="N",
        help="rejected handshakes that put an address on the abuse list (default: %(default)s)",
    )


def add_window(parser: argparse.ArgumentParser, default: int) -> None:
    """``--window``, an option of ``pipeline report`` and ``pipeline demo`` alike."""
    parser.add_argument(
        "--window",
        type=int,
        default=default,
        metavar="S",
        help="tumbling window of the tables over time, in seconds (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the report from parsed options; exit code 2 on bad input."""
    try:
        options = ReportOptions(abuse_threshold=args.abuse_threshold, window_s=args.window, top=args.top)
        outcome = generate_report(
            args.input, args.output, master=args.master, options=options, show_progress=not args.quiet
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"slipstream pipeline report: {exc}", file=sys.stderr)
        return 2
    print(f"tables: {Path(args.output) / 'tables'}")
    print(f"report: {outcome.html}")
    print(f"spark: {outcome.master}, start-up {outcome.startup_s:.1f} s, jobs {outcome.jobs_s:.1f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The spark-submit entry point: the same options as ``slipstream pipeline report``."""
    parser = argparse.ArgumentParser(prog="slipstream-pipeline-report", description="slipstream's Spark report")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
