"""The ``slipstream`` command: ``demo``, ``driver``, ``stat`` ... (one module per command or family)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from . import demo, driver, echo, observe, pipeline, record, samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slipstream", description="Fast, secure messaging between processes.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.register(commands)
    driver.register(commands)
    echo.register(commands)
    observe.register(commands)
    pipeline.register(commands)
    record.register(commands)
    samples.register(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
