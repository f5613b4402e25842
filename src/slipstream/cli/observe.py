"""``slipstream stat | loss | errors | backlog | settings``: read a running (or stopped) driver's files from outside.

The output follows Aeron's tools (AeronStat, LossStat, ErrorStat, BacklogStat) so that people who know
them read it at a glance; ``--json`` gives the same data to scripts. Exit code 2 means there is no
driver to read in the directory, which is nearly always a wrong ``--dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from ..files.cnc import CncError, version_text
from ..files.counters import CounterInfo
from ..files.directory import default_directory
from ..files.error_log import ErrorRecord
from ..files.loss_report import LossEntry
from ..files.observe import TYPE_NAMES, DriverStatus, StreamBacklog, backlog, driver_status, errors, loss, settings

LOSS_HEADER = (
    "#OBSERVATION_COUNT,TOTAL_BYTES_LOST,FIRST_OBSERVATION,LAST_OBSERVATION,SESSION_ID,STREAM_ID,CHANNEL,SOURCE"
)
"""LossStat's header; the two times are milliseconds since the epoch."""

_CLEAR = "\x1b[H\x1b[2J"


def register(commands: Any) -> None:
    """Add ``stat``, ``loss``, ``errors`` and ``backlog`` to the command parsers."""
    stat: argparse.ArgumentParser = commands.add_parser(
        "stat", help="print the driver's counters (like AeronStat)", description="Counters of a media driver."
    )
    _common(stat)
    stat.add_argument("--once", action="store_true", help="print one snapshot and exit")
    stat.add_argument("--interval", type=_positive, default=1.0, metavar="S", help="seconds between refreshes")
    stat.add_argument(
        "--duration",
        type=_positive,
        default=None,
        metavar="S",
        help="stop refreshing after this many seconds (default: run until interrupted)",
    )
    stat.add_argument(
        "--filter", type=_regex, default=None, metavar="REGEX", help="only counters whose label matches (default: all)"
    )
    stat.set_defaults(run=run_stat)
    for name, run, text in (
        ("loss", run_loss, "print the loss report as CSV (like LossStat)"),
        ("errors", run_errors, "print the distinct error log (like ErrorStat)"),
        ("backlog", run_backlog, "print per-stream positions and how far each consumer is behind"),
        ("settings", run_settings, "print the settings the driver runs with (its driver.toml: embedded or not)"),
    ):
        parser: argparse.ArgumentParser = commands.add_parser(name, help=text, description=text)
        _common(parser)
        parser.set_defaults(run=run)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None, help=f"driver directory (default: {default_directory()})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"invalid regular expression {text!r}: {exc}") from None


def _directory(args: argparse.Namespace) -> Path:
    return Path(args.dir) if args.dir is not None else default_directory()


def _fail(command: str, exc: Exception) -> int:
    print(f"slipstream {command}: {exc}", file=sys.stderr)
    return 2


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as a local ISO date with its offset, which sorts and parses everywhere."""
    return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.rstrip(b"\0").hex()
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(_jsonable(value)), flush=True)


# -- stat ---------------------------------------------------------------------------------------------


def counter_json(info: CounterInfo) -> dict[str, Any]:
    """A counter for scripts: the raw fields plus its type's short name."""
    data: dict[str, Any] = _jsonable(info)
    data["type_name"] = TYPE_NAMES.get(info.type_id, str(info.type_id))
    return data


def _selected(status: DriverStatus, pattern: re.Pattern[str] | None) -> list[CounterInfo]:
    return [c for c in status.counters if pattern is None or pattern.search(c.label)]


def format_stat(status: DriverStatus, pattern: re.Pattern[str] | None = None) -> str:
    """AeronStat's layout: a header, then ``id: value - label`` with thousands separators."""
    now = datetime.now().astimezone().isoformat(timespec="seconds")
    driver = "Aeron driver" if status.flavour == "aeron" else "slipstream driver"
    header = (
        f"{now} - slipstream stat, pid {status.pid}, heartbeat age {status.heartbeat_age_ms}ms, "
        f"CnC v{version_text(status.cnc_version)} ({driver})"
    )
    if not status.alive:
        if not status.process_exists:
            why = f"process {status.pid} is gone"
        elif status.state != "running":
            why = status.state
        else:
            why = "heartbeat older than the client liveness timeout"
        header += f" (driver not alive: {why})"
    lines = [header, "=" * 80]
    lines += [f"{c.counter_id:3}: {c.value:20,} - {c.label}" for c in _selected(status, pattern)]
    return "\n".join(lines)


def stat_json(status: DriverStatus, pattern: re.Pattern[str] | None = None) -> dict[str, Any]:
    """A status snapshot as JSON: identity, liveness and the selected counters."""
    return {
        "time_ms": time.time_ns() // 1_000_000,
        "directory": str(status.directory),
        "pid": status.pid,
        "cnc_version": version_text(status.cnc_version),
        "flavour": status.flavour,
        "start_timestamp_ms": status.start_timestamp_ms,
        "heartbeat_age_ms": status.heartbeat_age_ms,
        "client_liveness_timeout_ns": status.client_liveness_timeout_ns,
        "state": status.state,
        "alive": status.alive,
        "process_exists": status.process_exists,
        "counters": [counter_json(c) for c in _selected(status, pattern)],
    }


def run_stat(args: argparse.Namespace) -> int:
    """One snapshot with --once; otherwise refresh until Ctrl-C or --duration. Once a driver has been
    seen, a vanished one (restarting, say) is reported and waited for rather than ending the watch."""
    directory = _directory(args)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    in_place = sys.stdout.isatty() and not args.json
    first = True
    try:
        while True:
            try:
                status = driver_status(directory)
            except CncError as exc:
                if first or args.once:
                    return _fail("stat", exc)
                text = f"{datetime.now().astimezone().isoformat(timespec='seconds')} - waiting for a driver: {exc}"
                print(json.dumps({"error": str(exc)}) if args.json else text, flush=True)
            else:
                if args.json:
                    print(json.dumps(stat_json(status, args.filter)), flush=True)
                else:
                    frame = format_stat(status, args.filter)
                    if in_place:
                        sys.stdout.write(_CLEAR)
                    elif not first:
                        frame = "\n" + frame
                    print(frame, flush=True)
            first = False
            if args.once:
                return 0
            pause = args.interval
            if deadline is not None:
                pause = min(pause, deadline - time.monotonic())
                if pause <= 0:
                    return 0
            time.sleep(pause)
    except KeyboardInterrupt:
        return 0


# -- loss, errors, backlog ----------------------------------------------------------------------------


def run_loss(args: argparse.Namespace) -> int:
    """Print the driver's loss report as CSV (or JSON)."""
    try:
        entries: list[LossEntry] = loss(_directory(args))
    except CncError as exc:
        return _fail("loss", exc)
    if args.json:
        _print_json(entries)
        return 0
    print(LOSS_HEADER)
    for entry in entries:
        print(entry.csv())
    return 0


def format_error(record: ErrorRecord) -> str:
    """ErrorStat's layout, with ISO dates instead of raw milliseconds."""
    return (
        f"{record.observation_count} observation{'' if record.observation_count == 1 else 's'} "
        f"from {iso_ms(record.first_observation_ms)} "
        f"to {iso_ms(record.last_observation_ms)} for:\n {record.text}"
    )


def error_json(record: ErrorRecord) -> dict[str, Any]:
    """One error record as JSON, with ISO dates next to the raw milliseconds."""
    data: dict[str, Any] = _jsonable(record)
    data["first_observation"] = iso_ms(record.first_observation_ms)
    data["last_observation"] = iso_ms(record.last_observation_ms)
    return data


def run_errors(args: argparse.Namespace) -> int:
    """Print the driver's distinct-error log, as ``ErrorStat`` does."""
    try:
        records = errors(_directory(args))
    except CncError as exc:
        return _fail("errors", exc)
    if args.json:
        _print_json([error_json(r) for r in records])
        return 0
    for record in records:
        print(format_error(record))
        print()
    print(f"{len(records)} distinct error{'' if len(records) == 1 else 's'} observed.")
    return 0


def run_settings(args: argparse.Namespace) -> int:
    """Print the settings the driver in the directory runs with (TOML, or JSON with ``--json``)."""
    try:
        values = settings(_directory(args))
    except CncError as exc:
        return _fail("settings", exc)
    if args.json:
        _print_json(values)
        return 0
    width = max((len(name) for name in values), default=0)
    for name, value in values.items():
        print(f"{name:<{width}} = {json.dumps(value)}")
    return 0


def _value(value: int | None) -> str:
    return "?" if value is None else str(value)


def format_backlog(streams: list[StreamBacklog]) -> str:
    """BacklogStat's layout: one block per stream, one line per producer or consumer."""
    if not streams:
        return "no streams"
    lines: list[str] = []
    for s in streams:
        lines.append(f"stream {s.stream_id} session {s.session_id} {s.channel}")
        if (p := s.publisher) is not None:
            lines.append(
                f"  pub {p.registration_id} position {_value(p.position)} limit {_value(p.limit)}"
                f" window {_value(p.window)}"
            )
        if (snd := s.sender) is not None:
            lines.append(
                f"  snd {snd.registration_id} position {snd.position} limit {_value(snd.limit)}"
                f" behind {_value(snd.behind)}"
            )
        for r in s.receivers:
            lines.append(
                f"  rcv {r.correlation_id} hwm {_value(r.high_water_mark)} position {_value(r.position)}"
                f" behind {_value(r.behind)}"
            )
        for sub in s.subscribers:
            joined = "" if sub.join_position is None else f" joined {sub.join_position}"
            lines.append(f"  sub {sub.registration_id} position {sub.position}{joined} behind {_value(sub.behind)}")
    return "\n".join(lines)


def run_backlog(args: argparse.Namespace) -> int:
    """Print how far each stream's consumers trail its producers."""
    try:
        streams = backlog(_directory(args))
    except CncError as exc:
        return _fail("backlog", exc)
    if args.json:
        _print_json(streams)
    else:
        print(format_backlog(streams))
    return 0
