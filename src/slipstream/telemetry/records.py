"""Typed, versioned record types: what slipstream records, one table ("kind") per family.

Every record is a frozen dataclass whose fields *are* its table's columns, in order, so a record's
schema is written once. Each kind carries a version; a segment stores its kind and version in the
Parquet metadata, and a reader upgrades older versions (new columns read as null) and refuses newer
ones with :class:`~slipstream.telemetry.errors.SchemaVersionError` rather than guessing.

Nothing here imports pyarrow: schemas are plain ``(name, type, nullable)`` triples that the recorder
and the reader turn into Arrow schemas lazily, so ``import slipstream.telemetry`` stays light.

The four connection events share one table (``connection_events``, an ``event`` column tells them
apart), because every question about connections (who was refused, how long a session lasted) reads
them together. Statistics are cumulative counters sampled periodically: a report takes the last (or
max) sample, so a lost sample costs resolution, never correctness.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from .errors import RecordError

ColumnType = Literal["int64", "int32", "float64", "string", "binary", "bool"]
Column = tuple[str, ColumnType, bool]
"""One column: name, type, nullable."""

_PY_TYPES: Final[dict[object, ColumnType]] = {
    int: "int64",
    float: "float64",
    str: "string",
    bytes: "binary",
    bool: "bool",
}

# Kind names are directory names too: keep them to a safe alphabet.
_KIND_RE: Final = re.compile(r"[a-z][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")


@dataclass(frozen=True, slots=True)
class KindSchema:
    """A record kind's name, schema version and columns: all a writer and a reader must agree on."""

    kind: str
    version: int
    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        if not _KIND_RE.fullmatch(self.kind):
            raise RecordError(f"kind {self.kind!r}: must match {_KIND_RE.pattern}")
        if self.version < 1:
            raise RecordError(f"kind {self.kind!r}: version must be >= 1, not {self.version}")
        names = [name for name, _, _ in self.columns]
        if len(set(names)) != len(names):
            raise RecordError(f"kind {self.kind!r}: duplicate column names in {names}")

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in order."""
        return tuple(name for name, _, _ in self.columns)


def _column_type(owner: str, name: str, hint: object) -> tuple[ColumnType, bool]:
    nullable = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(args) != len(typing.get_args(hint))
        if len(args) != 1:
            raise RecordError(f"{owner}.{name}: a column holds one type (optionally | None), not {hint!r}")
        hint = args[0]
    if typing.get_origin(hint) is Literal:
        literal_types = {type(v) for v in typing.get_args(hint)}
        if len(literal_types) != 1:
            raise RecordError(f"{owner}.{name}: mixed literal types in {hint!r}")
        hint = literal_types.pop()
    column_type = _PY_TYPES.get(hint)
    if column_type is None:
        raise RecordError(f"{owner}.{name}: no column type for {hint!r} (int, float, str, bytes, bool)")
    return column_type, nullable


def columns_of(cls: type[Any]) -> tuple[Column, ...]:
    """A dataclass's (or msgspec Struct's) fields as columns, from its type hints."""
    hints = typing.get_type_hints(cls)
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    else:
        names = list(getattr(cls, "__struct_fields__", ()))
        if not names:
            raise RecordError(f"{cls.__name__}: neither a dataclass nor a msgspec Struct with fields")
    return tuple((name, *_column_type(cls.__name__, name, hints[name])) for name in names)


class Record:
    """Base of every record type: subclasses are frozen slotted dataclasses with ``KIND`` and ``VERSION``."""

    __slots__ = ()
    KIND: ClassVar[str]
    VERSION: ClassVar[int]
    SCHEMA: ClassVar[KindSchema]

    _GETTER: ClassVar[Callable[[Any], tuple[object, ...]]]

    def row(self) -> tuple[object, ...]:
        """The record's values in column order (one C-level attrgetter call: this is the hot path)."""
        return type(self)._GETTER(self)


def _finish(cls: type[Record]) -> None:
    cls.SCHEMA = KindSchema(cls.KIND, cls.VERSION, columns_of(cls))
    names = cls.SCHEMA.names
    if len(names) > 1:
        cls._GETTER = operator.attrgetter(*names)
    else:  # attrgetter of one name returns the value itself, not a 1-tuple
        single = operator.attrgetter(names[0])

        def one(record: Any) -> tuple[object, ...]:
            return (single(record),)

        cls._GETTER = one


# -- connection events ------------------------------------------------------------------------------

ConnectionEventName = Literal["handshake_accepted", "handshake_rejected", "connected", "disconnected"]
CONNECTION_EVENT_NAMES: Final[tuple[str, ...]] = typing.get_args(ConnectionEventName)


@dataclass(frozen=True, slots=True)
class ConnectionEvent(Record):
    """One row of ``connection_events``. Build it with the constructors below, which fill the columns
    each event uses: ``reason`` only for a rejected handshake, ``cause`` only for a disconnection.

    ``side`` is who recorded it (``server`` or ``client``); ``address`` is the peer's ``host:port``
    (or ``ipc``); ``tag`` is the application's label of the connection (the client's name, say);
    ``transport`` is ``udp`` or ``ipc``. ``connection_id`` is null for a refused handshake (no
    connection was made). ``local`` is the recording endpoint's host (what the report groups servers
    and links by; version 1 had no such column: it reads as null).
    """

    KIND: ClassVar[str] = "connection_events"
    VERSION: ClassVar[int] = 2

    timestamp_ns: int
    event: ConnectionEventName
    side: str
    address: str
    tag: str
    transport: str
    connection_id: int | None = None
    reason: str | None = None
    cause: str | None = None
    local: str | None = None

    def __post_init__(self) -> None:
        if self.event not in CONNECTION_EVENT_NAMES:
            raise RecordError(f"ConnectionEvent.event: {self.event!r} is not one of {CONNECTION_EVENT_NAMES}")


def handshake_accepted(
    timestamp_ns: int,
    *,
    connection_id: int,
    address: str,
    tag: str = "",
    side: str = "server",
    transport: str = "udp",
    local: str | None = None,
) -> ConnectionEvent:
    """A handshake the server accepted: a connection id now exists."""
    return ConnectionEvent(
        timestamp_ns, "handshake_accepted", side, address, tag, transport, connection_id, local=local
    )


def handshake_rejected(
    timestamp_ns: int,
    *,
    address: str,
    reason: str,
    tag: str = "",
    side: str = "server",
    transport: str = "udp",
    local: str | None = None,
) -> ConnectionEvent:
    """A handshake refused, and why (``ip_filter``, ``too_many_connections``, ``bad_key`` ...)."""
    return ConnectionEvent(timestamp_ns, "handshake_rejected", side, address, tag, transport, None, reason, local=local)


def connected(
    timestamp_ns: int,
    *,
    connection_id: int,
    address: str,
    tag: str = "",
    side: str = "server",
    transport: str = "udp",
    local: str | None = None,
) -> ConnectionEvent:
    """The connection is usable (after the handshake, once both directions are up)."""
    return ConnectionEvent(timestamp_ns, "connected", side, address, tag, transport, connection_id, local=local)


def disconnected(
    timestamp_ns: int,
    *,
    connection_id: int,
    address: str,
    cause: str,
    tag: str = "",
    side: str = "server",
    transport: str = "udp",
    local: str | None = None,
) -> ConnectionEvent:
    """The connection ended, and why (``closed``, ``timeout``, ``peer_closed``, ``error: ...``)."""
    return ConnectionEvent(
        timestamp_ns, "disconnected", side, address, tag, transport, connection_id, cause=cause, local=local
    )


# -- statistics -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionStats(Record):
    """Periodic per-connection statistics; counters are cumulative since the connection began.

    ``rtt_ns`` is the round-trip time of the ping that completed at ``timestamp_ns`` (null in the
    periodic rows): one row per completed ping, so the report computes percentiles over those rows
    and counts them (``RecordingConfig.rtt_interval_s`` pings every connection that often). ``side``
    is who recorded it (``server`` or ``client``): both ends of one connection share its id, so a
    reader picks one side (version 1 had no such column; it reads as null, meaning ``server``).
    ``local`` is the recording endpoint's host (version 2 had none: null).
    """

    KIND: ClassVar[str] = "connection_stats"
    VERSION: ClassVar[int] = 3

    timestamp_ns: int
    connection_id: int
    address: str
    tag: str
    messages_sent: int
    messages_received: int
    bytes_sent: int
    bytes_received: int
    rtt_ns: int | None = None
    naks_sent: int = 0
    naks_received: int = 0
    retransmits: int = 0
    bytes_lost: int = 0
    back_pressure_events: int = 0
    side: str = "server"
    local: str | None = None


@dataclass(frozen=True, slots=True)
class StreamStats(Record):
    """Periodic per-stream statistics (one publication or one image), cumulative since it began."""

    KIND: ClassVar[str] = "stream_stats"
    VERSION: ClassVar[int] = 1

    timestamp_ns: int
    channel: str
    stream_id: int
    session_id: int
    direction: str
    """``pub`` (what this process sends) or ``sub`` (what it receives)."""
    position: int
    messages: int
    bytes: int
    naks: int = 0
    retransmits: int = 0
    bytes_lost: int = 0
    back_pressure_events: int = 0


# -- the driver's files ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CounterSample(Record):
    """One driver counter's value at a sampling instant (every counter is sampled at the same instant)."""

    KIND: ClassVar[str] = "driver_counters"
    VERSION: ClassVar[int] = 1

    timestamp_ns: int
    driver: str
    """The driver directory sampled: one recording may hold several drivers."""
    counter_id: int
    type_id: int
    type_name: str
    label: str
    value: int
    registration_id: int
    session_id: int | None = None
    stream_id: int | None = None
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class LossSample(Record):
    """A loss-report entry, recorded each time its observation count changes."""

    KIND: ClassVar[str] = "loss_report"
    VERSION: ClassVar[int] = 1

    timestamp_ns: int
    driver: str
    """The driver directory sampled: one recording may hold several drivers."""
    observation_count: int
    total_bytes_lost: int
    first_observation_ms: int
    last_observation_ms: int
    session_id: int
    stream_id: int
    channel: str
    source: str


@dataclass(frozen=True, slots=True)
class ErrorSample(Record):
    """A distinct-error-log entry, recorded each time its observation count changes."""

    KIND: ClassVar[str] = "error_log"
    VERSION: ClassVar[int] = 1

    timestamp_ns: int
    driver: str
    """The driver directory sampled: one recording may hold several drivers."""
    observation_count: int
    first_observation_ms: int
    last_observation_ms: int
    text: str


# -- captured streams ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CapturedMessage(Record):
    """One whole message of a captured stream (fragments reassembled).

    ``timestamp_ns`` is the wall-clock time of the poll that delivered it; ``position`` the stream
    position just after it, which with ``session_id`` identifies it uniquely in the stream.
    ``message_type`` is the registered type's name when a decoder recognised the payload.
    """

    KIND: ClassVar[str] = "captured"
    VERSION: ClassVar[int] = 1

    timestamp_ns: int
    channel: str
    stream_id: int
    session_id: int
    position: int
    size: int
    payload: bytes
    message_type: str | None = None


CAPTURE_COLUMNS: Final[tuple[Column, ...]] = tuple(
    column for column in columns_of(CapturedMessage) if column[0] not in ("payload", "message_type")
)
"""The columns a typed-message table starts with, before the message's own fields."""

TYPED_PREFIX: Final = "typed."


def typed_schema(message_type: type[Any], *, name: str | None = None, version: int = 1) -> KindSchema:
    """The table of one registered message type (a msgspec Struct or a dataclass): the capture columns
    then the type's fields as typed columns, in kind ``typed.<Name>``."""
    fields = columns_of(message_type)
    clash = {n for n, _, _ in fields} & {n for n, _, _ in CAPTURE_COLUMNS}
    if clash:
        raise RecordError(f"{message_type.__name__}: field names {sorted(clash)} clash with the capture columns")
    return KindSchema(f"{TYPED_PREFIX}{name or message_type.__name__}", version, CAPTURE_COLUMNS + fields)


RECORD_TYPES: Final[tuple[type[Record], ...]] = (
    ConnectionEvent,
    ConnectionStats,
    StreamStats,
    CounterSample,
    LossSample,
    ErrorSample,
    CapturedMessage,
)
for _cls in RECORD_TYPES:
    _finish(_cls)

BUILTIN_SCHEMAS: Final[dict[str, KindSchema]] = {cls.KIND: cls.SCHEMA for cls in RECORD_TYPES}
"""Every built-in kind's current schema, by kind name."""

RECORD_TYPE_BY_KIND: Final[dict[str, type[Record]]] = {cls.KIND: cls for cls in RECORD_TYPES}
