"""The ``slipstream`` command: ``demo``, ``driver``, ``stat`` ... (one module per command or family)."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence

from ..logbuffer import fast_path_description
from . import demo, driver, echo, observe, samples


def _installed_version() -> str:
    """The installed distribution's version (the package root is a floor above the CLI, so not its ``__version__``)."""
    try:
        return importlib.metadata.version("slipstream")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slipstream", description="Fast, secure messaging between processes.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--version", action="version", version=f"slipstream {_installed_version()} ({fast_path_description()})"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.register(commands)
    driver.register(commands)
    echo.register(commands)
    observe.register(commands)
    samples.register(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
