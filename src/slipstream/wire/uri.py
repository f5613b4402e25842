"""Aeron channel URIs: ``aeron:udp?k=v|k=v``, ``aeron:ipc[?k=v]`` and the ``aeron-spy:`` prefix.

Channels are strings that cross the client/driver boundary and appear in configs and CLIs, so they are
parsed and validated once, up front: a typo in a size or a boolean fails here, naming the parameter,
instead of deep inside the driver. Unknown keys are kept verbatim (newer Aeron versions add keys), and
``str()`` rebuilds the text so that ``ChannelUri.parse(str(u)) == u``.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, NamedTuple, TypeVar, cast

from ..errors import SlipstreamError
from .constants import FRAME_ALIGNMENT, IPC_TERM_DEFAULT_LENGTH, TERM_DEFAULT_LENGTH, TERM_MAX_LENGTH
from .positions import check_mtu, check_term_length, wrap_i32

__all__ = [
    "AERON_PREFIX",
    "KNOWN_KEYS",
    "MEDIA_IPC",
    "MEDIA_UDP",
    "SPY_PREFIX",
    "ChannelUri",
    "ChannelUriError",
    "CongestionControl",
    "ControlMode",
    "FlowControl",
    "Media",
    "ParamValue",
    "StartPosition",
    "UnsupportedChannelError",
    "check_supported",
    "parse_bool",
    "parse_duration_ns",
    "parse_endpoint",
    "parse_size",
    "udp_channel",
]

AERON_PREFIX: Final = "aeron:"
SPY_PREFIX: Final = "aeron-spy:"
MEDIA_UDP: Final = "udp"
MEDIA_IPC: Final = "ipc"

Media = Literal["udp", "ipc"]


def udp_channel(endpoint: str) -> str:
    """``aeron:udp?endpoint=<host:port>``: the one spelling of a bare UDP channel, so labels in counters,
    the loss report and observation compare equal wherever they are made."""
    return f"{AERON_PREFIX}{MEDIA_UDP}?endpoint={endpoint}"


ControlMode = Literal["dynamic", "manual", "response"]
CongestionControl = Literal["static", "cubic"]
ParamValue = str | int | bool
"""What callers may pass when building a URI; ints and bools are rendered as Aeron text."""

_I32_MIN: Final = -(2**31)
_I32_MAX: Final = 2**31 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

# Digit counts are capped so int() never meets huge strings (Python limits int/str conversion size).
_INT_RE: Final = re.compile(r"[+-]?[0-9]{1,20}", re.ASCII)
_SIZE_RE: Final = re.compile(r"([0-9]{1,20})([kmg]?)", re.ASCII | re.IGNORECASE)
_DURATION_RE: Final = re.compile(r"([0-9]{1,20})(ns|us|ms|s)?", re.ASCII | re.IGNORECASE)
_PORT_RE: Final = re.compile(r"[0-9]{1,5}", re.ASCII)
_HOST_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", re.ASCII)

_SIZE_MULTIPLIERS: Final = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_DURATION_MULTIPLIERS: Final = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_FC_STRATEGIES: Final = frozenset({"max", "min", "tagged"})


class ChannelUriError(SlipstreamError, ValueError):
    """A channel URI (or one of its parameters) is malformed.

    ``parameter`` names the offending key, or is None for structural errors (prefix, media, separators),
    so callers can point users at the exact ``key=value`` to fix. The message always names it too.
    """

    def __init__(self, message: str, parameter: str | None = None) -> None:
        self.reason = message
        self.parameter = parameter
        super().__init__(message if parameter is None else f"parameter {parameter!r}: {message}")

    def __reduce__(self) -> tuple[type[ChannelUriError], tuple[str, str | None]]:
        # Keep ``parameter`` (and avoid a doubled prefix) when pickled across processes.
        return (type(self), (self.reason, self.parameter))


def _show(value: object) -> str:
    """repr() of a value, shortened so hostile input cannot flood error messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int_in(text: str, key: str | None, low: int, high: int) -> int:
    if not isinstance(text, str) or not _INT_RE.fullmatch(text):
        raise ChannelUriError(f"expected an integer, got {_show(text)}", key)
    value = int(text)
    if not low <= value <= high:
        raise ChannelUriError(f"{value} is out of range [{low}, {high}]", key)
    return value


def parse_size(text: str, parameter: str | None = None) -> int:
    """Parse a byte size such as ``65536``, ``64k``, ``16M`` or ``1g`` (1024-based, any case)."""
    match = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ChannelUriError(f"expected a size like 64k, 16m or 1g, got {_show(text)}", parameter)
    value = int(match[1]) * _SIZE_MULTIPLIERS[match[2].lower()]
    if value > _I64_MAX:
        raise ChannelUriError(f"size {_show(text)} does not fit in 64 bits", parameter)
    return value


def parse_duration_ns(text: str, parameter: str | None = None) -> int:
    """Parse a duration (``500``, ``10us``, ``5ms``, ``2s``) to integer nanoseconds; no suffix means ns."""
    match = _DURATION_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ChannelUriError(f"expected a duration like 5ms, 10us, 2s or 100, got {_show(text)}", parameter)
    value = int(match[1]) * _DURATION_MULTIPLIERS[(match[2] or "ns").lower()]
    if value > _I64_MAX:
        raise ChannelUriError(f"duration {_show(text)} does not fit in 64 bits of nanoseconds", parameter)
    return value


def parse_bool(text: str, parameter: str | None = None) -> bool:
    """Parse ``true`` / ``false`` (any case); anything else is an error rather than silently false."""
    lowered = text.lower() if isinstance(text, str) else None
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ChannelUriError(f"expected true or false, got {_show(text)}", parameter)


def parse_endpoint(text: str, parameter: str | None = None) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[addr]:port``) into ``(host, port)``; brackets are removed.

    The port is mandatory (0 asks the OS for an ephemeral port). Unbracketed IPv6 is rejected because
    the port separator would be ambiguous. Names are only checked syntactically, never resolved.
    """
    if not isinstance(text, str):
        raise ChannelUriError(f"expected 'host:port', got {_show(text)}", parameter)
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ChannelUriError(f"unterminated '[' in {_show(text)}", parameter)
        host = text[1:close]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ChannelUriError(f"invalid IPv6 address {_show(host)}", parameter) from None
        rest = text[close + 1 :]
        if not rest.startswith(":"):
            raise ChannelUriError(f"missing ':port' after IPv6 address in {_show(text)}", parameter)
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ChannelUriError(f"missing ':port' in {_show(text)}", parameter)
        if ":" in host:
            raise ChannelUriError(f"IPv6 addresses must be bracketed ([addr]:port): {_show(text)}", parameter)
        if not _HOST_RE.fullmatch(host):
            raise ChannelUriError(f"invalid host {_show(host)}", parameter)
    if not _PORT_RE.fullmatch(port_text) or int(port_text) > 0xFFFF:
        raise ChannelUriError(f"port must be an integer in [0, 65535], got {_show(port_text)}", parameter)
    return host, int(port_text)


class StartPosition(NamedTuple):
    """Explicit start of a publication's stream (``init-term-id``, ``term-id``, ``term-offset``)."""

    initial_term_id: int
    term_id: int
    term_offset: int


@dataclass(frozen=True, slots=True)
class FlowControl:
    """Parsed ``fc`` value: ``max``, ``min[,g:TAG/N][,t:DURATION]`` or ``tagged,g:TAG[/N][,t:DURATION]``."""

    strategy: str
    group_tag: int | None = None
    group_min_size: int | None = None
    timeout_ns: int | None = None


def _parse_flow_control(text: str, key: str) -> FlowControl:
    strategy, *options = text.split(",")
    if strategy not in _FC_STRATEGIES:
        raise ChannelUriError(f"unknown flow control strategy {_show(strategy)} (max, min or tagged)", key)
    group_tag: int | None = None
    group_min_size: int | None = None
    timeout_ns: int | None = None
    seen: set[str] = set()
    for option in options:
        name, colon, body = option.partition(":")
        if not colon or name not in ("g", "t"):
            raise ChannelUriError(f"unknown flow control option {_show(option)} (g:TAG/N or t:DURATION)", key)
        if name in seen:
            raise ChannelUriError(f"flow control option {name}: given twice", key)
        seen.add(name)
        if name == "t":
            timeout_ns = parse_duration_ns(body, key)
            continue
        tag_text, slash, size_text = body.partition("/")
        if not tag_text and not slash:
            raise ChannelUriError("flow control option g: needs a tag and/or /N", key)
        if tag_text:
            group_tag = _int_in(tag_text, key, _I64_MIN, _I64_MAX)
        if slash:
            group_min_size = _int_in(size_text, key, 0, _I32_MAX)
    return FlowControl(strategy, group_tag, group_min_size, timeout_ns)


# Per-key parsers. Each takes (raw value, key) and returns the typed value or raises ChannelUriError.
def _endpoint(text: str, key: str) -> tuple[str, int]:
    return parse_endpoint(text, key)


def _control_mode(text: str, key: str) -> ControlMode:
    if text not in ("dynamic", "manual", "response"):
        raise ChannelUriError(f"expected dynamic, manual or response, got {_show(text)}", key)
    return cast(ControlMode, text)


def _congestion_control(text: str, key: str) -> CongestionControl:
    if text not in ("static", "cubic"):
        raise ChannelUriError(f"expected static or cubic, got {_show(text)}", key)
    return cast(CongestionControl, text)


def _non_empty(text: str, key: str) -> str:
    if not text:
        raise ChannelUriError("must not be empty", key)
    return text


def _any_text(text: str, key: str) -> str:
    return text


def _ttl(text: str, key: str) -> int:
    return _int_in(text, key, 0, 255)


def _i32(text: str, key: str) -> int:
    return _int_in(text, key, _I32_MIN, _I32_MAX)


def _i64(text: str, key: str) -> int:
    return _int_in(text, key, _I64_MIN, _I64_MAX)


def _max_resend(text: str, key: str) -> int:
    return _int_in(text, key, 1, 256)


def _count(text: str, key: str) -> int:
    return _int_in(text, key, 1, _I32_MAX)


def _mtu(text: str, key: str) -> int:
    value = parse_size(text, key)
    try:
        check_mtu(value)
    except ValueError as exc:
        raise ChannelUriError(str(exc), key) from None
    return value


def _term_length(text: str, key: str) -> int:
    value = parse_size(text, key)
    try:
        check_term_length(value)
    except ValueError as exc:
        raise ChannelUriError(str(exc), key) from None
    return value


def _term_offset(text: str, key: str) -> int:
    value = _int_in(text, key, 0, TERM_MAX_LENGTH - FRAME_ALIGNMENT)
    if value % FRAME_ALIGNMENT:
        raise ChannelUriError(f"{value} is not a multiple of {FRAME_ALIGNMENT}", key)
    return value


def _window(text: str, key: str) -> int:
    value = parse_size(text, key)
    if not 0 < value <= _I32_MAX:
        raise ChannelUriError(f"{value} is out of range [1, {_I32_MAX}]", key)
    return value


def _socket_buffer(text: str, key: str) -> int:
    value = parse_size(text, key)
    if value > _I32_MAX:
        raise ChannelUriError(f"{value} is out of range [0, {_I32_MAX}] (0 keeps the OS default)", key)
    return value


def _duration(text: str, key: str) -> int:
    return parse_duration_ns(text, key)


def _bool(text: str, key: str) -> bool:
    return parse_bool(text, key)


def _tags(text: str, key: str) -> tuple[int, ...]:
    return tuple(_int_in(part, key, _I64_MIN, _I64_MAX) for part in text.split(","))


_PARSERS: Final[Mapping[str, Callable[[str, str], object]]] = MappingProxyType(
    {
        "endpoint": _endpoint,
        "control": _endpoint,
        "control-mode": _control_mode,
        "interface": _non_empty,
        "ttl": _ttl,
        "reliable": _bool,
        "session-id": _i32,
        "mtu": _mtu,
        "term-length": _term_length,
        "init-term-id": _i32,
        "term-id": _i32,
        "term-offset": _term_offset,
        "linger": _duration,
        "eos": _bool,
        "fc": _parse_flow_control,
        "gtag": _i64,
        "cc": _congestion_control,
        "rcv-wnd": _window,
        "pub-wnd": _window,
        "so-rcvbuf": _socket_buffer,
        "so-sndbuf": _socket_buffer,
        "nak-delay": _duration,
        "max-resend": _max_resend,
        "sparse": _bool,
        "tether": _bool,
        "rejoin": _bool,
        "group": _bool,
        "alias": _any_text,
        "tags": _tags,
        "max-term-length": _term_length,
        "max-images": _count,
        "max-images-per-source": _count,
    }
)
KNOWN_KEYS: Final = frozenset(_PARSERS)
"""Keys whose values are validated; any other key is kept verbatim."""

_START_KEYS: Final = ("init-term-id", "term-id", "term-offset")


def _closest_key(key: str) -> str | None:
    """The known key ``key`` is most likely a misspelling of, if any."""
    close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown_key(key: str) -> str:
    """What is said of an unknown key, wherever it is found: a did-you-mean, else the known keys."""
    close = _closest_key(key)
    if close is not None:
        return f"unknown parameter; did you mean {close!r}?"
    return f"unknown parameter (known keys: {', '.join(sorted(KNOWN_KEYS))})"


_T = TypeVar("_T")


def _render(key: str, value: object) -> str:
    """Turn a caller-supplied value into URI text (bools as true/false), rejecting unrepresentable ones."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))  # int() so IntEnum and friends render as plain digits
    if not isinstance(value, str):
        raise ChannelUriError(f"value must be str, int or bool, got {type(value).__name__}", key)
    if "|" in value:
        raise ChannelUriError("value must not contain '|' (the parameter separator)", key)
    return value


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise ChannelUriError(f"parameter key must be a str, got {type(key).__name__}")
    if not key:
        raise ChannelUriError("empty parameter key")
    if "=" in key or "|" in key:
        raise ChannelUriError(f"parameter key {_show(key)} must not contain '=' or '|'", key)
    return key


class ChannelUri:
    """An immutable, validated Aeron channel URI.

    Build one with :meth:`parse` or the constructor; derive variants with :meth:`with_params` and
    :meth:`replace`. ``params`` keeps the given order so ``str()`` reproduces the user's layout.
    Equality ignores parameter order, since order does not change the channel's meaning.
    """

    __slots__ = ("_is_spy", "_media", "_params")

    _is_spy: bool
    _media: Media
    _params: dict[str, str]

    def __init__(
        self,
        media: str,
        params: Mapping[str, ParamValue] | Iterable[tuple[str, ParamValue]] | None = None,
        *,
        is_spy: bool = False,
    ) -> None:
        if media not in (MEDIA_UDP, MEDIA_IPC):
            raise ChannelUriError(f"unknown media {_show(media)} (expected udp or ipc)")
        if not isinstance(is_spy, bool):
            raise ChannelUriError(f"is_spy must be a bool, got {type(is_spy).__name__}")
        items: Iterable[object]
        if params is None:
            items = ()
        elif isinstance(params, Mapping):
            items = params.items()
        elif isinstance(params, str | bytes):
            raise ChannelUriError("params must be a mapping or (key, value) pairs, not a string")
        else:
            try:
                items = list(params)
            except TypeError:
                raise ChannelUriError(
                    f"params must be a mapping or (key, value) pairs, got {type(params).__name__}"
                ) from None
        checked: dict[str, str] = {}
        for item in items:
            if not isinstance(item, tuple) or len(item) != 2:
                raise ChannelUriError(f"params must be (key, value) pairs, got {_show(item)}")
            key = _check_key(item[0])
            if key in checked:
                raise ChannelUriError("duplicate parameter", key)
            checked[key] = _render(key, item[1])
        object.__setattr__(self, "_is_spy", is_spy)
        object.__setattr__(self, "_media", cast(Media, media))
        object.__setattr__(self, "_params", checked)
        self._validate()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use with_params() or replace()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use with_params() or replace()")

    # -- parsing and building -------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> ChannelUri:
        """Parse ``[aeron-spy:]aeron:<media>[?k=v|k=v...]``; raises ChannelUriError on any defect."""
        if not isinstance(text, str):
            raise ChannelUriError(f"channel URI must be a str, got {type(text).__name__}")
        rest = text
        is_spy = rest.startswith(SPY_PREFIX)
        if is_spy:
            rest = rest[len(SPY_PREFIX) :]
        if not rest.startswith(AERON_PREFIX):
            raise ChannelUriError(f"channel URI must start with 'aeron:' or 'aeron-spy:': {_show(text)}")
        media, has_query, query = rest[len(AERON_PREFIX) :].partition("?")
        if media not in (MEDIA_UDP, MEDIA_IPC):
            raise ChannelUriError(f"unknown media {_show(media)} (expected udp or ipc)")
        pairs: list[tuple[str, str]] = []
        seen: set[str] = set()
        if has_query:
            for index, segment in enumerate(query.split("|")):
                key, has_equals, value = segment.partition("=")
                if not key:
                    raise ChannelUriError(f"empty parameter key in segment {index} of {_show(text)}")
                if not has_equals:
                    raise ChannelUriError(f"missing '=' after key {_show(key)}", key)
                if key in seen:
                    raise ChannelUriError("duplicate parameter", key)
                seen.add(key)
                pairs.append((key, value))
        return cls(media, pairs, is_spy=is_spy)

    def __str__(self) -> str:
        head = f"{SPY_PREFIX if self._is_spy else ''}{AERON_PREFIX}{self._media}"
        if not self._params:
            return head
        return head + "?" + "|".join(f"{key}={value}" for key, value in self._params.items())

    def __repr__(self) -> str:
        return f"ChannelUri.parse({str(self)!r})"

    def __reduce__(self) -> tuple[Callable[[str], ChannelUri], tuple[str]]:
        # Pickle/copy as text: the default slot restore would trip the immutability guard.
        return (ChannelUri.parse, (str(self),))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChannelUri):
            return NotImplemented
        return (self._is_spy, self._media, self._params) == (other._is_spy, other._media, other._params)

    def __hash__(self) -> int:
        return hash((self._is_spy, self._media, frozenset(self._params.items())))

    def with_params(
        self, updates: Mapping[str, ParamValue | None] | None = None, /, **kwargs: ParamValue | None
    ) -> ChannelUri:
        """Return a copy with parameters set (None removes one); keyword ``term_length`` is ``term-length``.

        Existing keys keep their position; new keys are appended, so edits stay readable in logs.
        """
        merged: dict[str, ParamValue] = dict(self._params)
        changes: list[tuple[object, ParamValue | None]] = []
        if updates is not None:
            if not isinstance(updates, Mapping):
                raise ChannelUriError(f"updates must be a mapping, got {type(updates).__name__}")
            changes.extend(updates.items())
        changes.extend((name.replace("_", "-"), value) for name, value in kwargs.items())
        for raw_key, value in changes:
            key = _check_key(raw_key)
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return ChannelUri(self._media, merged, is_spy=self._is_spy)

    def replace(
        self,
        *,
        media: str | None = None,
        is_spy: bool | None = None,
        params: Mapping[str, ParamValue] | Iterable[tuple[str, ParamValue]] | None = None,
    ) -> ChannelUri:
        """Return a copy with media, spy flag and/or the whole parameter set replaced (then revalidated)."""
        return ChannelUri(
            self._media if media is None else media,
            self._params if params is None else params,
            is_spy=self._is_spy if is_spy is None else is_spy,
        )

    # -- validation -----------------------------------------------------------------------------------

    def _validate(self) -> None:
        """Check every known key, then the rules that span several keys. A broken rule with a misspelt key
        present (``endpont``) is blamed on that key, with the suggestion ``check_supported`` gives."""
        params = self._params
        for key, value in params.items():
            parser = _PARSERS.get(key)
            if parser is not None:
                parser(value, key)
        try:
            self._check_rules()
        except ChannelUriError as exc:
            typo = next((key for key in params if key not in KNOWN_KEYS and _closest_key(key)), None)
            if typo is None:
                raise
            raise ChannelUriError(f"{_unknown_key(typo)} ({exc.reason})", typo) from None

    def _check_rules(self) -> None:
        params = self._params
        present = [key for key in _START_KEYS if key in params]
        if present and len(present) != len(_START_KEYS):
            missing = next(key for key in _START_KEYS if key not in params)
            raise ChannelUriError(f"{', '.join(_START_KEYS)} must be given together", missing)
        if present:
            start = self.start_position
            assert start is not None
            term_length = self.term_length or (
                IPC_TERM_DEFAULT_LENGTH if self._media == MEDIA_IPC else TERM_DEFAULT_LENGTH
            )
            if start.term_offset >= term_length:
                message = f"{start.term_offset} must be < term length {term_length}"
                raise ChannelUriError(message, "term-offset")
            if wrap_i32(start.term_id - start.initial_term_id) < 0:
                raise ChannelUriError("term-id is more than 2^31 - 1 terms after init-term-id", "term-id")
        if self._media == MEDIA_UDP and not (
            "endpoint" in params
            or "control" in params
            or "tags" in params
            or params.get("control-mode") in ("manual", "response")
        ):
            raise ChannelUriError(
                "a udp channel needs endpoint, control, tags or control-mode=manual|response", "endpoint"
            )

    # -- generic access -------------------------------------------------------------------------------

    @property
    def media(self) -> Media:
        """``udp`` or ``ipc``."""
        return self._media

    @property
    def is_spy(self) -> bool:
        """True for ``aeron-spy:`` URIs, which read a local publication instead of the network."""
        return self._is_spy

    @property
    def is_udp(self) -> bool:
        """True for ``aeron:udp``."""
        return self._media == MEDIA_UDP

    @property
    def is_ipc(self) -> bool:
        """True for ``aeron:ipc`` (shared memory)."""
        return self._media == MEDIA_IPC

    @property
    def params(self) -> Mapping[str, str]:
        """Read-only view of the raw parameters, in the order given."""
        return MappingProxyType(self._params)

    def get(self, key: str, default: str | None = None) -> str | None:
        """Raw text of a parameter (known or unknown), or ``default``."""
        return self._params.get(key, default)

    def _typed(self, key: str, parser: Callable[[str, str], _T]) -> _T | None:
        raw = self._params.get(key)
        return None if raw is None else parser(raw, key)

    # -- typed accessors (None when absent; no driver defaults applied) -------------------------------

    @property
    def endpoint(self) -> str | None:
        """``endpoint`` as written (``host:port``); None when absent."""
        return self._params.get("endpoint")

    @property
    def endpoint_address(self) -> tuple[str, int] | None:
        """``endpoint`` split into (host, port)."""
        return self._typed("endpoint", _endpoint)

    @property
    def control(self) -> str | None:
        """``control`` as written (``host:port``); None when absent."""
        return self._params.get("control")

    @property
    def control_address(self) -> tuple[str, int] | None:
        """``control`` split into (host, port)."""
        return self._typed("control", _endpoint)

    @property
    def control_mode(self) -> ControlMode | None:
        """``control-mode``, parsed and checked; None when absent."""
        return self._typed("control-mode", _control_mode)

    @property
    def interface(self) -> str | None:
        """``interface`` as written; None when absent."""
        return self._params.get("interface")

    @property
    def ttl(self) -> int | None:
        """``ttl``, parsed and checked; None when absent."""
        return self._typed("ttl", _ttl)

    @property
    def reliable(self) -> bool | None:
        """``reliable``, parsed and checked; None when absent."""
        return self._typed("reliable", _bool)

    @property
    def session_id(self) -> int | None:
        """``session-id``, parsed and checked; None when absent."""
        return self._typed("session-id", _i32)

    @property
    def mtu(self) -> int | None:
        """``mtu``, parsed and checked; None when absent."""
        return self._typed("mtu", _mtu)

    @property
    def term_length(self) -> int | None:
        """``term-length``, parsed and checked; None when absent."""
        return self._typed("term-length", _term_length)

    @property
    def init_term_id(self) -> int | None:
        """``init-term-id``, parsed and checked; None when absent."""
        return self._typed("init-term-id", _i32)

    @property
    def term_id(self) -> int | None:
        """``term-id``, parsed and checked; None when absent."""
        return self._typed("term-id", _i32)

    @property
    def term_offset(self) -> int | None:
        """``term-offset``, parsed and checked; None when absent."""
        return self._typed("term-offset", _term_offset)

    @property
    def start_position(self) -> StartPosition | None:
        """The explicit start (all three keys), or None when the driver should choose."""
        initial, term_id, offset = self.init_term_id, self.term_id, self.term_offset
        if initial is None or term_id is None or offset is None:
            return None
        return StartPosition(initial, term_id, offset)

    @property
    def linger_ns(self) -> int | None:
        """``linger``, parsed and checked; None when absent."""
        return self._typed("linger", _duration)

    @property
    def eos(self) -> bool | None:
        """``eos``, parsed and checked; None when absent."""
        return self._typed("eos", _bool)

    @property
    def fc(self) -> FlowControl | None:
        """``fc``, parsed and checked; None when absent."""
        return self._typed("fc", _parse_flow_control)

    @property
    def gtag(self) -> int | None:
        """``gtag``, parsed and checked; None when absent."""
        return self._typed("gtag", _i64)

    @property
    def cc(self) -> CongestionControl | None:
        """``cc``, parsed and checked; None when absent."""
        return self._typed("cc", _congestion_control)

    @property
    def rcv_wnd(self) -> int | None:
        """``rcv-wnd``, parsed and checked; None when absent."""
        return self._typed("rcv-wnd", _window)

    @property
    def max_term_length(self) -> int | None:
        """``max-term-length`` (slipstream's, on a subscription): the largest term a SETUP may ask for."""
        return self._typed("max-term-length", _term_length)

    @property
    def max_images(self) -> int | None:
        """``max-images`` (slipstream's, on a subscription): images its stream holds at once."""
        return self._typed("max-images", _count)

    @property
    def max_images_per_source(self) -> int | None:
        """``max-images-per-source`` (slipstream's, on a subscription): images from one source address."""
        return self._typed("max-images-per-source", _count)

    @property
    def pub_wnd(self) -> int | None:
        """``pub-wnd``, parsed and checked; None when absent."""
        return self._typed("pub-wnd", _window)

    @property
    def so_rcvbuf(self) -> int | None:
        """``so-rcvbuf``, parsed and checked; None when absent."""
        return self._typed("so-rcvbuf", _socket_buffer)

    @property
    def so_sndbuf(self) -> int | None:
        """``so-sndbuf``, parsed and checked; None when absent."""
        return self._typed("so-sndbuf", _socket_buffer)

    @property
    def nak_delay_ns(self) -> int | None:
        """``nak-delay``, parsed and checked; None when absent."""
        return self._typed("nak-delay", _duration)

    @property
    def max_resend(self) -> int | None:
        """``max-resend``, parsed and checked; None when absent."""
        return self._typed("max-resend", _max_resend)

    @property
    def sparse(self) -> bool | None:
        """``sparse``, parsed and checked; None when absent."""
        return self._typed("sparse", _bool)

    @property
    def tether(self) -> bool | None:
        """``tether``, parsed and checked; None when absent."""
        return self._typed("tether", _bool)

    @property
    def rejoin(self) -> bool | None:
        """``rejoin``, parsed and checked; None when absent."""
        return self._typed("rejoin", _bool)

    @property
    def group(self) -> bool | None:
        """``group``, parsed and checked; None when absent."""
        return self._typed("group", _bool)

    @property
    def alias(self) -> str | None:
        """``alias``: a label for humans, ignored by the driver; None when absent."""
        return self._params.get("alias")

    @property
    def tags(self) -> tuple[int, ...] | None:
        """``tags``, parsed and checked; None when absent."""
        return self._typed("tags", _tags)


class UnsupportedChannelError(ChannelUriError):
    """A well-formed channel asks for something slipstream's media driver does not do (multicast,
    ``cc=cubic``, ``fc=min``/``tagged``, or a key it does not know); ``parameter`` names it."""


_SUPPORTED_FC: Final = frozenset({"max"})


def _is_multicast(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_multicast
    except ValueError:
        return False  # a host name: resolved (to unicast) by the driver


def check_supported(uri: ChannelUri) -> None:
    """Refuse what parses but would silently do nothing in slipstream's driver, naming the parameter.

    ``ChannelUri`` itself stays a faithful model of Aeron's URIs (it keeps unknown keys and accepts every
    Aeron value); this check is what the client API applies before it asks the driver for a channel, so
    a typo (``term-lenght``), a multicast group, or a strategy the driver does not implement fails at the
    call instead of leaving a channel that never connects or ignores the setting.
    """
    for key in uri.params:
        if key not in KNOWN_KEYS:
            raise UnsupportedChannelError(_unknown_key(key), key)
    for key in ("endpoint", "control"):
        address = uri.endpoint_address if key == "endpoint" else uri.control_address
        if address is not None and _is_multicast(address[0].strip("[]")):
            raise UnsupportedChannelError(
                f"multicast address {address[0]} is not supported (use a unicast address, or MDC with "
                "control-mode=manual|dynamic)",
                key,
            )
    if uri.cc not in (None, "static"):
        raise UnsupportedChannelError(f"congestion control {uri.cc!r} is not supported (only static)", "cc")
    fc = uri.fc
    if fc is not None and fc.strategy not in _SUPPORTED_FC:
        raise UnsupportedChannelError(
            f"flow control strategy {fc.strategy!r} is not supported (only max, the default)", "fc"
        )
