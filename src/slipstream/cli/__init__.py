"""The ``slipstream`` command: ``demo``, ``driver``, ``stat`` ... (one module per command or family).

Every command ends with a message and an exit status, never a traceback, for ordinary events:
0 done, 1 the work failed, 2 bad arguments or an unusable driver/directory, 130 interrupted (Ctrl-C),
141 output closed early (``slipstream stat | head``). The top floor: may import every package, and
none imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import SlipstreamError
from ..logbuffer import fast_path_description
from . import demo, driver, echo, observe, pipeline, record, samples

EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter without the noise: a flag's False and an unset None are not shown
    (an option whose default is None says in its help what happens without it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; ``-v`` is accepted before or after the command, and every command's
    help shows its options' defaults."""
    parser = argparse.ArgumentParser(
        prog="slipstream", description="Fast, secure messaging between processes.", formatter_class=HelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--version", action="version", version=f"slipstream {__version__} ({fast_path_description()})"
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of these ('slipstream COMMAND --help' for more)"
    )
    demo.register(commands)
    driver.register(commands)
    echo.register(commands)
    observe.register(commands)
    pipeline.register(commands)
    record.register(commands)
    samples.register(commands)
    _finish_commands(commands.choices.values())
    return parser


def _finish_commands(parsers: object) -> None:
    """What every command's parser has, whoever registered it: ``-v`` and the help formatter."""
    for sub in parsers:  # type: ignore[attr-defined]
        assert isinstance(sub, argparse.ArgumentParser)
        sub.formatter_class = HelpFormatter
        if "-v" not in sub._option_string_actions:
            sub.add_argument(
                "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level"
            )
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _finish_commands(action.choices.values())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=LOG_FORMAT)
    name = " ".join(part for part in (args.command, getattr(args, "role", None)) if isinstance(part, str))
    try:
        result: int = args.run(args)
    except KeyboardInterrupt:
        print(f"slipstream {name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly; point stdout at /dev/null so the final flush is silent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except MemoryError:
        print(f"slipstream {name}: out of memory (try smaller sizes or counts)", file=sys.stderr)
        return 1
    except (SlipstreamError, ValueError, OverflowError) as exc:
        print(f"slipstream {name}: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
