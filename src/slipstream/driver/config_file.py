"""Media driver settings from a file: TOML (``*.toml``) or Java-style properties (anything else).

Keys are ``DriverConfig`` field names (``-`` or ``_`` alike, ``_ns`` optional on durations), or the
Aeron property that means the same thing, so an existing ``aeron.*`` properties file mostly carries
over. Sizes take k/m/g suffixes and durations ns/us/ms/s (no suffix: nanoseconds), as in channel URIs.
Unknown keys and bad values are refused with the key's name: a typo must not silently leave a default.
The defaults themselves live in ``config.py`` only; ``format_config`` prints the effective values.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ..errors import SlipstreamError
from ..files.directory import CONFIG_FILE
from ..wire.uri import parse_duration_ns, parse_size
from .config import DriverConfig

Kind = Literal[
    "path", "optional_path", "duration", "optional_duration", "size", "optional_size", "int", "str", "bool",
    "optional_bool",
]

KINDS: Final[dict[str, Kind]] = {
    "directory": "path",
    "client_liveness_timeout_ns": "duration",
    "publication_linger_ns": "duration",
    "publication_unblock_timeout_ns": "duration",
    "stall_threshold_ns": "optional_duration",
    "ipc_term_length": "size",
    "ipc_mtu": "size",
    "ipc_publication_window": "optional_size",
    "udp_term_length": "size",
    "udp_mtu": "size",
    "receiver_window": "size",
    "so_rcvbuf": "optional_size",
    "so_sndbuf": "optional_size",
    "udp_gso": "bool",
    "counters_capacity": "int",
    "error_log_length": "size",
    "idle_strategy": "str",
    "threading_mode": "str",
    "reserved_session_id_low": "int",
    "reserved_session_id_high": "int",
    "timer_interval_ns": "duration",
    "idle_heartbeat_max_ns": "optional_duration",
    "idle_status_message_max_ns": "optional_duration",
    "record_directory": "optional_path",
    "record_interval_ns": "duration",
    "dir_delete_on_shutdown": "optional_bool",
    "unique_directory": "bool",
}
"""How each DriverConfig field is written in a file; a test checks it covers every field."""
_DURATIONS: Final = ("duration", "optional_duration")
_OPTIONAL: Final = ("optional_size", "optional_duration", "optional_path")
"""Kinds whose value may be absent: "none" (or 0) in a file, None in DriverConfig."""

AERON_ALIASES: Final[dict[str, str]] = {
    "aeron.dir": "directory",
    "aeron.client.liveness.timeout": "client_liveness_timeout_ns",
    "aeron.publication.linger.timeout": "publication_linger_ns",
    "aeron.publication.unblock.timeout": "publication_unblock_timeout_ns",
    "aeron.ipc.term.buffer.length": "ipc_term_length",
    "aeron.ipc.mtu.length": "ipc_mtu",
    "aeron.ipc.publication.term.window.length": "ipc_publication_window",
    "aeron.term.buffer.length": "udp_term_length",
    "aeron.mtu.length": "udp_mtu",
    "aeron.rcv.initial.window.length": "receiver_window",
    "aeron.socket.so_rcvbuf": "so_rcvbuf",
    "aeron.socket.so_sndbuf": "so_sndbuf",
    "aeron.error.buffer.length": "error_log_length",
    "aeron.publication.reserved.session.id.low": "reserved_session_id_low",
    "aeron.publication.reserved.session.id.high": "reserved_session_id_high",
    "aeron.timer.interval": "timer_interval_ns",
    "aeron.dir.delete.on.shutdown": "dir_delete_on_shutdown",
}
"""Aeron's property names for the settings slipstream shares with it."""

_CLI_NAMES: Final = {"dir": "directory", "idle": "idle_strategy"}
"""The ``slipstream driver`` option names that differ from the fields."""
_NONE_WORDS: Final = frozenset({"none", "default"})
_BOOL_WORDS: Final = {
    **dict.fromkeys(("true", "yes", "on", "1"), True),
    **dict.fromkeys(("false", "no", "off", "0"), False),
}
_INT_RE: Final = re.compile(r"[+-]?[0-9]{1,19}", re.ASCII)


class ConfigFileError(SlipstreamError, ValueError):
    """A configuration file cannot be read, or names an unknown key or a bad value."""


@dataclass(frozen=True, slots=True)
class _Setting:
    key: str
    """As written in the file."""
    value: object
    where: str
    """``path`` or ``path:line``, for messages."""


def field_for_key(key: str) -> str | None:
    """The DriverConfig field a file key sets, or None if it sets none."""
    lowered = key.strip().lower()
    if lowered in AERON_ALIASES:
        return AERON_ALIASES[lowered]
    name = lowered.replace("-", "_")
    if name in KINDS:
        return name
    if name in _CLI_NAMES:
        return _CLI_NAMES[name]
    if KINDS.get(f"{name}_ns") in _DURATIONS:
        return f"{name}_ns"
    return None


def _unknown(setting: _Setting) -> ConfigFileError:
    known = [*KINDS, *AERON_ALIASES]
    close = difflib.get_close_matches(setting.key.replace("-", "_").lower(), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(KINDS)} and Aeron's aeron.* names"
    return ConfigFileError(f"{setting.where}: unknown key {setting.key!r}{hint}")


def _parse(kind: Kind, value: str | int) -> object:
    """Raises ValueError (ChannelUriError is one) with a message that does not repeat the key."""
    if kind in ("bool", "optional_bool"):
        word = str(value).strip().lower()
        if kind == "optional_bool" and word in _NONE_WORDS:
            return None
        if word not in _BOOL_WORDS:
            raise ValueError(f"expected true or false, got {value!r}")
        return _BOOL_WORDS[word]
    if isinstance(value, int):
        if kind in ("path", "str") or (kind == "optional_path" and value != 0):
            raise ValueError(f"expected a string, got the number {value}")
        if kind in _OPTIONAL and value == 0:
            return None
        return value
    text = value.strip()
    if kind == "optional_path" and (not text or text.lower() in _NONE_WORDS):
        return None
    if kind in ("path", "optional_path"):
        if not text:
            raise ValueError("expected a directory path, got an empty value")
        return Path(text).expanduser()
    if kind == "str":
        return text
    if kind == "int":
        if not _INT_RE.fullmatch(text):
            raise ValueError(f"expected an integer, got {text!r}")
        return int(text)
    if kind in _OPTIONAL and (text.lower() in _NONE_WORDS or text == "0"):
        return None  # Aeron's meaning of 0: the OS default (a size), or no back-off (a duration)
    if kind in _DURATIONS:
        return parse_duration_ns(text)
    return parse_size(text)


def _convert(name: str, setting: _Setting) -> object:
    """The field's value from a file value (str from properties; str, int ... from TOML)."""
    kind = KINDS[name]
    value = setting.value
    if kind in ("bool", "optional_bool") and isinstance(value, bool):
        return value
    if isinstance(value, bool) or not isinstance(value, str | int):
        problem = f"expected a {kind.replace('_', ' ')}, got {type(value).__name__} {value!r}"
    else:
        try:
            return _parse(kind, value)
        except ValueError as exc:
            problem = str(exc)
    raise ConfigFileError(f"{setting.where}: {setting.key}: {problem}")


# -- reading files ------------------------------------------------------------------------------------


def _flatten(table: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    """TOML reads ``aeron.dir = ...`` as nested tables; join them back into dotted keys."""
    for key, value in table.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{full}.")
        else:
            yield full, value


def _read_toml(path: Path, text: str) -> list[_Setting]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
    return [_Setting(key, value, str(path)) for key, value in _flatten(data)]


def _read_properties(path: Path, text: str) -> list[_Setting]:
    """``key=value`` or ``key: value`` lines, ``#``/``!`` comments, ``\\`` continues a line."""
    settings: list[_Setting] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        number = index + 1
        line = lines[index].strip()
        index += 1
        while line.endswith("\\") and not line.endswith("\\\\") and index < len(lines):
            line = line[:-1] + lines[index].strip()
            index += 1
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)", line) or re.match(r"([^=:\s]+)\s+(.*)", line)
        if match is None:
            raise ConfigFileError(f"{path}:{number}: expected key=value, got {line!r}")
        settings.append(_Setting(match[1], match[2].strip(), f"{path}:{number}"))
    return settings


def read_settings(path: Path | str) -> list[tuple[str, str, object]]:
    """(key as written, field it sets, converted value) for each setting of the file, checked."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot read configuration file {path}: {exc}") from None
    raw = _read_toml(path, text) if path.suffix.lower() == ".toml" else _read_properties(path, text)
    result: list[tuple[str, str, object]] = []
    seen: dict[str, _Setting] = {}
    for setting in raw:
        name = field_for_key(setting.key)
        if name is None:
            raise _unknown(setting)
        if name in seen:
            first = seen[name]
            raise ConfigFileError(f"{setting.where}: {setting.key!r} sets {name} again (already set at {first.where})")
        seen[name] = setting
        result.append((setting.key, name, _convert(name, setting)))
    return result


def apply_config_file(config: DriverConfig, path: Path | str) -> DriverConfig:
    """A copy of ``config`` with the file's settings applied, validated; the input is left alone."""
    settings = read_settings(path)
    updated = dataclasses.replace(config)
    origin: dict[str, str] = {}
    for key, name, value in settings:
        setattr(updated, name, value)
        origin[name] = key
    try:
        updated.validate()
    except ValueError as exc:
        message = str(exc)
        culprit = max((n for n in origin if message.startswith(n)), key=len, default=None)
        where = f" (set by {origin[culprit]!r})" if culprit is not None and origin[culprit] != culprit else ""
        raise ConfigFileError(f"{path}: {message}{where}") from None
    return updated


def load_config(path: Path | str) -> DriverConfig:
    """The defaults of ``config.py`` with the file's settings applied."""
    return apply_config_file(DriverConfig(), path)


# -- printing -----------------------------------------------------------------------------------------


def running_config(directory: Path | str) -> DriverConfig:
    """The settings the driver in ``directory`` runs (or last ran) with, from the ``driver.toml`` it wrote
    when it started: its effective values, what None stood for resolved (ConfigFileError if none is there)."""
    return load_config(Path(directory) / CONFIG_FILE)


def effective_config(config: DriverConfig, *, embedded: bool) -> DriverConfig:
    """``config`` as a driver runs it: the defaults None stands for written out."""
    return dataclasses.replace(
        config, stall_threshold_ns=config.effective_stall_threshold_ns(),
        dir_delete_on_shutdown=config.deletes_directory(embedded=embedded),
    )  # fmt: skip


def _duration_text(ns: int) -> str:
    for unit, scale in (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)):
        if ns and ns % scale == 0:
            return f"{ns // scale}{unit}"
    return f"{ns}ns"


def _size_text(size: int) -> str:
    for unit, scale in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def _toml_value(kind: Kind | None, value: object) -> str:
    if value is None:
        return json.dumps("none")
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind in _DURATIONS and isinstance(value, int):
        return json.dumps(_duration_text(value))
    if kind in ("size", "optional_size") and isinstance(value, int):
        text = _size_text(value)
        return text if text.isdigit() else json.dumps(text)
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value), ensure_ascii=False)


def format_config(config: DriverConfig) -> str:
    """Every setting and its value as TOML: what a driver would run with, and a valid ``--config`` file."""
    lines = ["# slipstream media driver configuration (TOML; load it back with --config FILE.toml)"]
    width = max(len(name) for name in KINDS)
    for f in dataclasses.fields(config):
        lines.append(f"{f.name:<{width}} = {_toml_value(KINDS.get(f.name), getattr(config, f.name))}")
    return "\n".join(lines)
