"""The connection machine, sans-I/O: typed messages in and out of sealed records.

Sending: a message is serialized and appended as a frame to the current batch; the batch becomes
one sealed record (one transport message) when the adapter asks for :meth:`messages_to_send`
(when its loop yields) or when the next frame would not fit ``batch_limit`` (an MTU's payload), so
small messages share one AEAD operation and one transport message. Receiving: a record is opened
(tampered, replayed and malformed records are counted by the record layer and dropped), its frames
decoded, and each becomes an event.

Liveness: anything received proves the peer alive; a quiet side sends a KEEPALIVE every quarter of
the expiry; a peer silent longer than ``expiry_ns`` is closed (``Closed(expired=True)``), so a blip
shorter than that never disconnects. ``Closed`` is emitted exactly once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from .errors import ConnectionClosedError, FrameError, MessageTooLarge, RecordRejected, SerializationError
from .events import (
    Closed,
    Event,
    KeepaliveSent,
    MessageDecodeFailed,
    MessageReceived,
    PingAcknowledged,
    PingTimedOut,
    SyncCompleted,
    SyncTimedOut,
)
from .frames import FrameKind, encode_frame_into

__all__ = ["RECORD_OVERHEAD", "ConnectionMachine", "ConnectionStats", "PlainRecords", "Records"]

RECORD_OVERHEAD = 8 + 16
"""A sealed record's counter and AEAD tag."""
_MESSAGE = FrameKind.MESSAGE
_PING = struct.Struct(">q")
_PONG = struct.Struct(">qq")


class Records(Protocol):
    """The record layer as this machine uses it (``session.RecordLayer``, or plain for IPC)."""

    def seal(self, plaintext: bytes | bytearray | memoryview) -> bytes:
        """One record carrying ``plaintext``."""
        ...

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        """The plaintext of ``record``; raises a RecordRejected subclass."""
        ...


class PlainRecords:
    """No encryption: for IPC connections configured with ``encrypt_ipc=False`` on both sides."""

    records_sealed = 0
    records_opened = 0
    rejected_malformed = 0
    rejected_tampered = 0
    rejected_replayed = 0

    def seal(self, plaintext: bytes | bytearray | memoryview) -> bytes:
        """The plaintext itself."""
        return bytes(plaintext)

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        """The record itself."""
        return bytes(record)


class _Encoder(Protocol):
    def encode_frame_into(self, buf: bytearray, kind: int, request_id: int, obj: object) -> int:
        """Append a whole frame carrying ``obj``; the bytes appended."""
        ...

    def decode_record(
        self, data: bytes | bytearray | memoryview, *, max_frames: int = 65536
    ) -> list[tuple[FrameKind, int, object]]:
        """A record's frames as (kind, request id, message or payload or MessageDecodeError)."""
        ...


@dataclass(slots=True)
class ConnectionStats:
    """Counters of one connection (records rejected are in the record layer's counters)."""

    messages_sent: int = 0
    messages_received: int = 0
    records_sent: int = 0
    records_received: int = 0
    bytes_sent: int = 0
    """Bytes of the records handed out to send (sealed: what the transport carries)."""
    bytes_received: int = 0
    """Bytes of the records received and accepted."""
    records_dropped: int = 0
    decode_errors: int = 0
    frame_errors: int = 0


def _frame_overhead() -> int:
    buf = bytearray()
    encode_frame_into(buf, FrameKind.KEEPALIVE, 0, b"")
    return len(buf)


class ConnectionMachine:
    """One side of a connection after the handshake."""

    def __init__(
        self,
        *,
        records: Records,
        serialization: _Encoder,
        now_ns: int,
        expiry_ns: int,
        batch_limit: int = 1376 - RECORD_OVERHEAD,
        max_record: int = 65504,
        wall_offset_ns: int = 0,
        keepalive_ns: int | None = None,
    ) -> None:
        self.records = records
        self.serialization = serialization
        self.expiry_ns = expiry_ns
        self.keepalive_ns = keepalive_ns if keepalive_ns is not None else max(1, expiry_ns // 4)
        self.batch_limit = batch_limit
        self.max_payload = max_record - RECORD_OVERHEAD
        self.frame_overhead = _frame_overhead()
        self.wall_offset_ns = wall_offset_ns
        self.stats = ConnectionStats()
        self.closed = False
        self._batch = bytearray()
        self._sealed: list[bytes] = []
        self._events: list[Event] = []
        self._last_received_ns = now_ns
        self._last_sent_ns = now_ns
        self._last_id = 0
        self._syncs: dict[int, int] = {}
        """Outstanding send_sync id -> timeout deadline."""
        self._pings: dict[int, tuple[int, int]] = {}
        """Outstanding ping id -> (sent at, timeout deadline)."""

    # -- deadlines --------------------------------------------------------------------------------

    @property
    def deadline_ns(self) -> int | None:
        """When :meth:`handle_timer` must run: expiry, keepalive, or a ping/sync timeout."""
        if self.closed:
            return None
        deadline = min(self._last_received_ns + self.expiry_ns, self._last_sent_ns + self.keepalive_ns)
        for when in self._syncs.values():
            deadline = min(deadline, when)
        for _, when in self._pings.values():
            deadline = min(deadline, when)
        return deadline

    def handle_timer(self, now_ns: int) -> None:
        """Expire a silent peer, send a keepalive when quiet, time out pings and syncs."""
        if self.closed:
            return
        for sync_id, when in list(self._syncs.items()):
            if now_ns >= when:
                del self._syncs[sync_id]
                self._events.append(SyncTimedOut(sync_id))
        for ping_id, (_, when) in list(self._pings.items()):
            if now_ns >= when:
                del self._pings[ping_id]
                self._events.append(PingTimedOut(ping_id))
        if now_ns - self._last_received_ns >= self.expiry_ns:
            self._close(by_peer=False, expired=True, reason=f"no word from the peer for {self.expiry_ns / 1e9:g} s")
            return
        if now_ns - self._last_sent_ns >= self.keepalive_ns and not self._batch:
            self._append(FrameKind.KEEPALIVE, 0, b"")
            self._events.append(KeepaliveSent())

    # -- sending ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionClosedError("the connection is closed")

    def _append(self, kind: int, request_id: int, payload: bytes | memoryview) -> None:
        size = self.frame_overhead + len(payload)
        if size > self.max_payload:
            raise MessageTooLarge(
                f"a message of {len(payload)} bytes exceeds the largest record ({self.max_payload} bytes of frames)"
            )
        batch = self._batch
        if batch and len(batch) + size > self.batch_limit:
            self._seal_batch()
            batch = self._batch
        encode_frame_into(batch, kind, request_id, payload)

    def _append_message(self, kind: int, request_id: int, message: object) -> None:
        """Encode ``message`` as a frame straight into the batch (the serializer's fast path); a
        frame that overflows the batch starts the next one."""
        batch = self._batch
        start = len(batch)
        size = self.serialization.encode_frame_into(batch, kind, request_id, message)
        if size > self.max_payload:
            del batch[start:]
            raise MessageTooLarge(
                f"a message of {size - self.frame_overhead} bytes exceeds the largest record "
                f"({self.max_payload} bytes of frames)"
            )
        if start and start + size > self.batch_limit:
            frame = bytes(batch[start:])
            del batch[start:]
            self._seal_batch()
            self._batch += frame

    def _seal_batch(self) -> None:
        if self._batch:
            self._sealed.append(self.records.seal(self._batch))
            self._batch = bytearray()

    def send(self, message: object) -> None:
        """Serialize ``message`` into the batch (raises UnregisteredTypeError, ConnectionClosedError,
        MessageTooLarge)."""
        self._check_open()
        self._append_message(FrameKind.MESSAGE, 0, message)
        self.stats.messages_sent += 1

    def send_sync(self, message: object, now_ns: int, timeout_ns: int) -> int:
        """Send ``message`` and expect a SYNC_ACK once the remote's listeners handled it; returns the
        request id that :class:`SyncCompleted` or :class:`SyncTimedOut` will name."""
        self._check_open()
        sync_id = self._next_id()
        self._append_message(FrameKind.SYNC_REQUEST, sync_id, message)
        self._syncs[sync_id] = now_ns + timeout_ns
        self.stats.messages_sent += 1
        return sync_id

    def _next_id(self) -> int:
        """A request id (1-65535) not outstanding: the pool is bounded, ids are reused."""
        if len(self._syncs) + len(self._pings) >= 65535:
            raise ConnectionClosedError("too many outstanding requests (65535)")
        while True:
            self._last_id = self._last_id % 65535 + 1
            if self._last_id not in self._syncs and self._last_id not in self._pings:
                return self._last_id

    def acknowledge_sync(self, sync_id: int) -> None:
        """The listeners handled the message of request ``sync_id``: tell the sender."""
        if not self.closed:
            self._append(FrameKind.SYNC_ACK, sync_id, b"")

    def ping(self, now_ns: int, timeout_ns: int) -> int:
        """Send a ping; returns the id that PingAcknowledged or PingTimedOut will name."""
        self._check_open()
        ping_id = self._next_id()
        self._pings[ping_id] = (now_ns, now_ns + timeout_ns)
        self._append(FrameKind.PING, ping_id, _PING.pack(now_ns + self.wall_offset_ns))
        return ping_id

    def close(self, reason: str = "") -> None:
        """Send CLOSE (it goes with the next :meth:`messages_to_send`) and emit ``Closed``."""
        if self.closed:
            return
        self._append(FrameKind.CLOSE, 0, reason.encode("utf-8", "replace")[:200])
        self._close(by_peer=False, expired=False, reason=reason)

    def _close(self, *, by_peer: bool, expired: bool, reason: str) -> None:
        self.closed = True
        self._events.append(Closed(by_peer, expired, reason))
        self._syncs.clear()
        self._pings.clear()

    @property
    def sealed_count(self) -> int:
        """Records sealed and not yet taken."""
        return len(self._sealed)

    @property
    def has_pending(self) -> bool:
        """Frames wait to be sealed, or records to be taken."""
        return bool(self._batch or self._sealed)

    def messages_to_send(self, now_ns: int) -> list[bytes]:
        """Seal the batch; return every record to offer, oldest first (one transport message each)."""
        self._seal_batch()
        sealed, self._sealed = self._sealed, []
        if sealed:
            self._last_sent_ns = now_ns
            stats = self.stats
            stats.records_sent += len(sealed)
            stats.bytes_sent += sum(map(len, sealed))
        return sealed

    # -- receiving --------------------------------------------------------------------------------

    def receive(self, record: bytes | memoryview, now_ns: int) -> None:
        """One transport message from the peer: opened, decoded, turned into events."""
        if self.closed:
            return
        try:
            plaintext = self.records.open(record)
        except RecordRejected:
            self.stats.records_dropped += 1
            return
        try:
            frames = self.serialization.decode_record(plaintext)
        except FrameError:
            self.stats.frame_errors += 1
            return
        self.stats.records_received += 1
        self.stats.bytes_received += len(record)
        self._last_received_ns = now_ns
        events = self._events
        stats = self.stats
        for kind, request_id, value in frames:
            if kind == _MESSAGE:
                if isinstance(value, SerializationError):
                    stats.decode_errors += 1
                    events.append(MessageDecodeFailed(str(value)))
                    continue
                stats.messages_received += 1
                events.append(MessageReceived(value, 0))
            elif kind == FrameKind.SYNC_REQUEST:
                if isinstance(value, SerializationError):
                    stats.decode_errors += 1
                    events.append(MessageDecodeFailed(str(value)))
                    self.acknowledge_sync(request_id)  # nothing to handle: do not keep the sender waiting
                    continue
                stats.messages_received += 1
                events.append(MessageReceived(value, request_id))
            elif kind == FrameKind.SYNC_ACK:
                if self._syncs.pop(request_id, None) is not None:
                    events.append(SyncCompleted(request_id))
            elif kind == FrameKind.PING:
                if isinstance(value, bytes) and len(value) == _PING.size:
                    (ping_wall,) = _PING.unpack(value)
                    self._append(FrameKind.PONG, request_id, _PONG.pack(ping_wall, now_ns + self.wall_offset_ns))
            elif kind == FrameKind.PONG:
                sent = self._pings.pop(request_id, None)
                if sent is not None and isinstance(value, bytes) and len(value) == _PONG.size:
                    ping_wall, pong_wall = _PONG.unpack(value)
                    finished_wall = now_ns + self.wall_offset_ns
                    events.append(
                        PingAcknowledged(request_id, now_ns - sent[0], pong_wall - ping_wall, finished_wall - pong_wall)
                    )
            elif kind == FrameKind.CLOSE:
                reason = bytes(value).decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else ""
                self._close(by_peer=True, expired=False, reason=reason)
                return
            # KEEPALIVE and the kinds reserved for RMI/streaming only prove liveness here.

    def take_events(self) -> list[Event]:
        """Events since the last call, in order."""
        events, self._events = self._events, []
        return events
