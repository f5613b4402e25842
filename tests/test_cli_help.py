"""``slipstream ... --help`` reads as plain text and leaves nothing out (issue 30, item 10).

Every command and subcommand is found by walking the real parser, and its ``--help`` is run in-process:
a new command or option is checked without anyone adding it here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from slipstream.cli import build_parser, main

MARKUP = re.compile(r"`|:[a-z]+:`|\*\*")
"""reST/Markdown in help: ``literal``, `interpreted`, :class:`role`, **strong**."""


Command = tuple[tuple[str, ...], argparse.ArgumentParser]


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Command]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_commands(sub, (*path, name)))
    return found


COMMANDS = _commands(build_parser())


def _shown(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An action's help exactly as ``--help`` prints it (defaults expanded)."""
    return parser._get_formatter()._expand_help(action)  # type: ignore[attr-defined, no-any-return]


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "demo", "driver", "echo server", "echo client", "stat", "pipeline report", "pipeline demo",
            "publish", "subscribe", "record"} <= names  # fmt: skip


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) or "slipstream" for p, _ in COMMANDS])
def test_help_is_plain_text_and_complete(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    text = out.getvalue()
    assert text.startswith("usage: slipstream")
    assert not MARKUP.search(text), f"markup in the help of {path}: {MARKUP.findall(text)}"
    assert parser.description, f"slipstream {' '.join(path)}: no description"
    problems = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        name = "/".join(action.option_strings) or action.dest
        if isinstance(action, argparse._SubParsersAction):
            problems += [f"{choice.dest}: no summary" for choice in action._choices_actions if not choice.help]
        if not action.help:
            problems.append(f"{name}: no help")
            continue
        takes_value = action.nargs != 0
        if action.option_strings and takes_value and not action.required and "default" not in _shown(parser, action):
            problems.append(f"{name}: no default shown (default is {action.default!r})")
    assert not problems, f"slipstream {' '.join(path)}: {problems}"


@pytest.mark.parametrize(
    ("path", "option", "shown"),
    [
        (("publish",), "--channel", "aeron:udp?endpoint=localhost:20121"),
        (("publish",), "--timeout", "30"),
        (("subscribe",), "--timeout", "30"),
        (("demo",), "--large", "100"),
        (("pipeline", "demo"), "--abuse-threshold", "5"),
    ],
)
def test_the_defaults_the_issue_names_are_shown(path: tuple[str, ...], option: str, shown: str) -> None:
    parser = dict(COMMANDS)[path]
    action = parser._option_string_actions[option]
    assert re.search(rf"\(default: {re.escape(shown)}(\.0)?\)", _shown(parser, action)), _shown(parser, action)
