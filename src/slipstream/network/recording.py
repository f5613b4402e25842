"""What a recording server or client writes: its handshakes, connections and their statistics.

A server or client with ``config.recording`` set holds one :class:`EndpointRecording`. It turns the
endpoint's events into telemetry records (``handshake_accepted`` / ``handshake_rejected`` with the
reason, ``connected``, ``disconnected`` with the cause) and samples each live connection's counters
every ``stats_interval_s`` on the telemetry floor's sampler thread, plus a final row when a
connection ends and one per completed ping (each an RTT sample for the report's percentiles). With
``capture_messages``, every message a listener receives is captured too: a ``captured`` row (its
bytes as they travel: type id and msgpack body) and a ``typed.<Type>`` row with its fields as typed
columns, on the connection's channel and stream, at the position of the record that carried it. The
recorder itself is shared by every endpoint of the process recording into the same directory.
Recording is off the receive path: a record is a tuple appended under a lock; files are written by
the recorder's own thread. It touches no event loop: any adapter's connections (:class:`Recorded`) can be
recorded.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from ..client import ExclusivePublication, Subscription
from ..files.counters import (
    RECEIVER_BYTES_LOST_TYPE_ID,
    RECEIVER_NAKS_SENT_TYPE_ID,
    SENDER_NAKS_RECEIVED_TYPE_ID,
    SENDER_RETRANSMITS_TYPE_ID,
    CountersReader,
)
from ..telemetry import (
    CapturedMessage,
    ConnectionStats,
    KindSchema,
    Record,
    RecordError,
    StatsSampler,
    StreamStats,
    connected,
    disconnected,
    handshake_accepted,
    handshake_rejected,
    typed_schema,
)
from ..telemetry.config import RecordingConfig, release
from ..telemetry.records import CAPTURE_COLUMNS
from .admission import RejectReason
from .connection import ConnectionMachine
from .errors import SerializationError
from .events import Closed
from .transport import host_port


class Recorded(Protocol):
    """What recording reads of a connection (an adapter's ``Connection``)."""

    id: int
    tag: str
    remote_address: str | None
    remote_port: int | None
    back_pressure_events: int

    @property
    def is_ipc(self) -> bool: ...

    @property
    def is_closed(self) -> bool: ...

    @property
    def machine(self) -> ConnectionMachine: ...

    @property
    def publication(self) -> ExclusivePublication: ...

    @property
    def subscription(self) -> Subscription: ...

    @property
    def received_position(self) -> tuple[int, int]: ...


__all__ = ["EndpointRecording", "address_of", "cause_of", "reason_name"]


def address_of(address: str | None, port: int | None) -> str:
    """A peer as the recording names it: ``host:port`` (``[v6]:port``), the bare host, or ``ipc``."""
    if address is None:
        return "ipc"
    return address if port is None else host_port(address, port)


def reason_name(reason: int) -> str:
    """A wire reject code as a report label (``not_permitted``, ``server_full`` ...)."""
    try:
        return RejectReason(reason).name.lower()
    except ValueError:
        return f"code_{reason}"


def cause_of(event: Closed) -> str:
    """Why a connection ended, as the ``disconnected`` record's cause."""
    if event.expired:
        return "timeout"
    return "peer_closed" if event.by_peer else "closed"


_SENDER_TYPES = (SENDER_NAKS_RECEIVED_TYPE_ID, SENDER_RETRANSMITS_TYPE_ID)
_RECEIVER_TYPES = (RECEIVER_NAKS_SENT_TYPE_ID, RECEIVER_BYTES_LOST_TYPE_ID)


class _RepairCounters:
    """The driver's per-stream loss and repair counters of each connection's two UDP streams (NAKs
    and retransmissions of what it sends, NAKs and bytes lost of what it receives), read at each sample.

    The counters file is scanned on the sampler thread only, at most once per sample and only while a
    live connection's counters are not all known yet (its image may come up after a first sample);
    reading them is a lookup. A connection that ends before its first sample reads as zero, and so do
    IPC streams, which have no such counters."""

    def __init__(self, counters: CountersReader) -> None:
        self._counters = counters
        self._index: dict[tuple[int, int], int] = {}
        """(registration id, type id) -> counter id, of every repair counter at the last scan."""

    @staticmethod
    def _keys(connection: Recorded) -> list[tuple[int, int]]:
        if connection.is_ipc:
            return []
        keys = [(connection.publication.registration_id, t) for t in _SENDER_TYPES]
        keys += [(image.correlation_id, t) for image in connection.subscription.images for t in _RECEIVER_TYPES]
        return keys

    def refresh(self, connections: Iterable[Recorded]) -> None:
        """Scan the counters file if some connection's counters are missing (sampler thread)."""
        index = self._index
        if all(key in index for connection in connections for key in self._keys(connection)):
            return
        wanted = _SENDER_TYPES + _RECEIVER_TYPES
        self._index = {(info.registration_id, info.type_id): info.counter_id for info in self._counters
                       if info.type_id in wanted}  # fmt: skip

    def read(self, connection: Recorded) -> dict[int, int]:
        """type id -> value of the connection's counters known so far."""
        counters, index = self._counters, self._index
        values: dict[int, int] = {}
        for registration_id, type_id in self._keys(connection):
            counter_id = index.get((registration_id, type_id))
            if counter_id is not None and counters.registration_id(counter_id) == registration_id:
                values[type_id] = counters.get(counter_id)  # (not freed, nor reused, since the scan)
        return values


class EndpointRecording:
    """One endpoint's side of recording: ``side`` is ``server`` or ``client``."""

    def __init__(
        self,
        config: RecordingConfig,
        side: str,
        driver_directory: str | Path | None,
        connections: Callable[[], Iterable[Recorded]],
        encode: Callable[[object], bytes],
        counters: CountersReader,
    ) -> None:
        recorder = config.acquire(driver_directory)
        assert recorder is not None, "EndpointRecording needs an enabled RecordingConfig"
        self.recorder = recorder
        self.side = side
        self.local = socket.gethostname()
        """This endpoint's host, in every row (the report's per-server and per-link key)."""
        self.rtt_interval_s = config.rtt_interval_s
        """Ping every connection this often for RTT samples (None: the application's pings only)."""
        self._connections = connections
        self.capture = config.capture_messages
        """Capture every received message (``captured`` and ``typed.<Type>`` rows)."""
        self._encode = encode
        self._typed: dict[type, tuple[KindSchema | None, tuple[str, ...]]] = {}
        self._repair = _RepairCounters(counters)
        self._sampler = StatsSampler(recorder, self._collect, interval_s=config.stats_interval_s).start()

    def _record(self, record: Record) -> None:
        self.recorder.record(record)

    def accepted(self, connection_id: int, address: str | None, port: int | None, tag: str) -> None:
        """The server accepted a handshake (the connection's streams are being set up)."""
        self._record(
            handshake_accepted(
                time.time_ns(), connection_id=connection_id, address=address_of(address, port), tag=tag,
                side=self.side, transport="ipc" if address is None else "udp", local=self.local,
            )
        )  # fmt: skip

    def rejected(self, address: str | None, reason: int, tag: str = "") -> None:
        """A handshake refused, by this server or (on a client) by the server it asked."""
        self._record(
            handshake_rejected(
                time.time_ns(), address=address_of(address, None), reason=reason_name(reason), tag=tag,
                side=self.side, transport="ipc" if address is None else "udp", local=self.local,
            )
        )  # fmt: skip

    def connected(self, connection: Recorded) -> None:
        """The connection is up on this side."""
        self._record(
            connected(
                time.time_ns(), connection_id=connection.id, tag=connection.tag, side=self.side,
                address=address_of(connection.remote_address, connection.remote_port),
                transport="ipc" if connection.is_ipc else "udp", local=self.local,
            )
        )  # fmt: skip

    def disconnected(self, connection: Recorded, event: Closed) -> None:
        """The connection ended: its final counters, then the event."""
        now = time.time_ns()
        self._record(self._stats(connection, now))
        self._record(
            disconnected(
                now, connection_id=connection.id, cause=cause_of(event), tag=connection.tag, side=self.side,
                address=address_of(connection.remote_address, connection.remote_port),
                transport="ipc" if connection.is_ipc else "udp", local=self.local,
            )
        )  # fmt: skip

    def round_trip(self, connection: Recorded, round_trip_ns: int) -> None:
        """A ping completed: one RTT sample (with the counters as they are now)."""
        self._record(self._stats(connection, time.time_ns(), round_trip_ns))

    def message(self, connection: Recorded, message: object) -> None:
        """Capture a received message (called only when :attr:`capture` is set)."""
        kind = type(message)
        typed = self._typed.get(kind)
        if typed is None:
            try:
                schema: KindSchema | None = typed_schema(kind)
            except RecordError:  # fields that are not plain columns: captured, but not as a typed table
                schema = None
            typed = self._typed[kind] = (schema, schema.names[len(CAPTURE_COLUMNS) :] if schema else ())
        try:
            payload = self._encode(message)
        except SerializationError:  # a file (its Path) or a remote object: no bytes of a message type
            payload = b""
        subscription = connection.subscription
        session_id, position = connection.received_position
        base = (time.time_ns(), subscription.channel, subscription.stream_id, session_id, position, len(payload))
        self.recorder.append(CapturedMessage.SCHEMA, (*base, payload, kind.__name__))
        if typed[0] is not None:
            self.recorder.append(typed[0], (*base, *(getattr(message, name) for name in typed[1])))

    def _stats(
        self, connection: Recorded, now_ns: int, rtt_ns: int | None = None, repair: dict[int, int] | None = None
    ) -> ConnectionStats:
        stats = connection.machine.stats
        if repair is None:
            repair = self._repair.read(connection)
        return ConnectionStats(
            now_ns,
            connection.id,
            address_of(connection.remote_address, connection.remote_port),
            connection.tag,
            stats.messages_sent,
            stats.messages_received,
            stats.bytes_sent,
            stats.bytes_received,
            rtt_ns=rtt_ns,
            naks_sent=repair.get(RECEIVER_NAKS_SENT_TYPE_ID, 0),
            naks_received=repair.get(SENDER_NAKS_RECEIVED_TYPE_ID, 0),
            retransmits=repair.get(SENDER_RETRANSMITS_TYPE_ID, 0),
            bytes_lost=repair.get(RECEIVER_BYTES_LOST_TYPE_ID, 0),
            back_pressure_events=connection.back_pressure_events,
            side=self.side,
            local=self.local,
        )

    def _streams(self, connection: Recorded, now_ns: int, repair: dict[int, int]) -> list[StreamStats]:
        """The connection's two streams as this side sees them: what it sends, what it receives."""
        stats = connection.machine.stats
        publication, subscription = connection.publication, connection.subscription
        images = subscription.images
        return [
            StreamStats(
                now_ns, publication.channel, publication.stream_id, publication.session_id, "pub",
                publication.position, stats.messages_sent, stats.bytes_sent,
                naks=repair.get(SENDER_NAKS_RECEIVED_TYPE_ID, 0),
                retransmits=repair.get(SENDER_RETRANSMITS_TYPE_ID, 0),
                back_pressure_events=connection.back_pressure_events,
            ),
            StreamStats(
                now_ns, subscription.channel, subscription.stream_id, images[0].session_id if images else 0, "sub",
                images[0].position if images else 0, stats.messages_received, stats.bytes_received,
                naks=repair.get(RECEIVER_NAKS_SENT_TYPE_ID, 0),
                bytes_lost=repair.get(RECEIVER_BYTES_LOST_TYPE_ID, 0),
            ),
        ]  # fmt: skip

    def _collect(self, now_ns: int) -> list[Record]:
        records: list[Record] = []
        live = [connection for connection in list(self._connections()) if not connection.is_closed]
        self._repair.refresh(live)
        for connection in live:
            repair = self._repair.read(connection)
            records.append(self._stats(connection, now_ns, repair=repair))
            records.extend(self._streams(connection, now_ns, repair))
        return records

    def close(self) -> None:
        """A last sample, then give the recorder back (the last user closes it)."""
        self._sampler.stop()
        release(self.recorder)
