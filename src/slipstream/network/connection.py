"""The connection machine, sans-I/O: typed messages in and out of sealed records.

Sending: a message is serialized and appended as a frame to the current batch; the batch becomes one sealed record
(one transport message) when the adapter asks for :meth:`messages_to_send` (when its loop yields) or when the next
frame would not fit ``batch_limit`` (an MTU's payload), so small messages share one AEAD operation and one transport
message. Receiving: a record is opened (tampered, replayed and malformed records are counted by the record layer and
dropped), its frames decoded, and each becomes an event.

Large messages and files: with a :class:`~.streaming.Streams` (every connection the adapters make has one), a frame
too large for one record, and a ``pathlib.Path`` sent as a message, travel as a stream of chunk frames (bounded memory
on both sides, SHA-256 checked) and arrive as the frame they carry; without one, a frame too large raises
MessageTooLarge. A streamed message is delivered when its last chunk arrives, so smaller messages sent after it may
overtake it.

Remote objects: with an :class:`~.rmi.RmiEndpoint` (``rmi=``), RMI frames go to it and its frames join the batch in
the order of the calls that made them; its deadline is this machine's; ``Path`` arguments and results are matched with
their file streams here (:class:`~.rmi.files.RmiFiles`), never dispatched as messages. A host call comes out as
:class:`RmiRequestReceived`: the adapter takes it with :meth:`ConnectionMachine.invocation`, runs it, and answers with
:meth:`~ConnectionMachine.complete_invocation` or :meth:`~ConnectionMachine.fail_invocation`. Objects the peer hosts
arrive as ``RemoteRef`` values; the adapter makes proxies of them.

Liveness: anything received proves the peer alive; a quiet side sends a KEEPALIVE every quarter of the expiry; a peer
silent longer than ``expiry_ns`` is closed (``Closed(expired=True)``), so a blip shorter than that never disconnects;
an adapter whose transport reports the peer's stream gone calls :meth:`lost` (the same close, at once). ``Closed`` is
emitted exactly once. ``liveness_records`` counts the records that carried nothing but a KEEPALIVE, sent or received:
an adapter does not count them as work, so an idle connection's poller keeps its long pauses instead of spinning up
twice a keepalive.

Delivery: with a :class:`~.delivery.Delivery` (``delivery=``: a session kept per peer across connections), plain
messages are numbered, retained until acknowledged and replayed on the next connection (rules in :mod:`.delivery`);
:attr:`retained_full` is back-pressure. Without one, nothing is numbered and the wire is as it always was.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from .delivery import ACK_ROOM, Delivery
from .errors import ConnectionClosedError, FrameError, MessageTooLarge, RecordRejected, SerializationError
from .events import Closed, Event, KeepaliveSent, MessageDecodeFailed, MessageReceived, PingAcknowledged
from .frames import FRAME_OVERHEAD, RMI_REQUEST, RMI_RESPONSE, FrameKind, encode_frame_into
from .requests import Requests
from .results import ConnectionStats
from .rmi import FILE_STREAM_MARK, RemoteCalls
from .rmi.machine import RemoteObjectsPart
from .serialization import Serialization
from .session import RECORD_OVERHEAD, PlainRecords, Records
from .streaming import SpillFile, StreamCompleted, StreamFailed, Streams, StreamSent, StreamStarted

__all__ = ["RECORD_OVERHEAD", "ConnectionMachine", "ConnectionStats", "PlainRecords", "Records"]

_MESSAGE, _SYNC_REQUEST, _DELIVERED, _KEEPALIVE = (
    FrameKind.MESSAGE, FrameKind.SYNC_REQUEST, FrameKind.DELIVERED, FrameKind.KEEPALIVE,
)  # fmt: skip
"""(Module names for what every record reads, as ``frames.RMI_REQUEST``.)"""
_PING = struct.Struct(">q")
_PONG = struct.Struct(">qq")


_RMI_KINDS = frozenset((FrameKind.RMI_REQUEST, FrameKind.RMI_RESPONSE))
_STREAM_KINDS = frozenset((FrameKind.STREAM_START, FrameKind.STREAM_CHUNK, FrameKind.STREAM_END))


class ConnectionMachine(RemoteObjectsPart):
    """One side of a connection after the handshake."""

    def __init__(
        self,
        *,
        records: Records,
        serialization: Serialization,
        now_ns: int,
        expiry_ns: int,
        batch_limit: int = 1376 - RECORD_OVERHEAD,
        max_record: int = 65504,
        wall_offset_ns: int = 0,
        keepalive_ns: int | None = None,
        streams: Streams | None = None,
        rmi: RemoteCalls | None = None,
        delivery: Delivery | None = None,
    ) -> None:
        self.records = records
        self.serialization = serialization
        self.expiry_ns = expiry_ns
        self.keepalive_ns = keepalive_ns if keepalive_ns is not None else max(1, expiry_ns // 4)
        room = ACK_ROOM if delivery is not None else 0  # a batch keeps room for a piggybacked DELIVERED
        self.batch_limit = batch_limit - room
        self.max_payload = max_record - RECORD_OVERHEAD - room
        self.frame_overhead = FRAME_OVERHEAD
        self.wall_offset_ns = wall_offset_ns
        self.stats = ConnectionStats()
        self.closed = False
        self._batch = bytearray()
        self._sealed: list[bytes | bytearray] = []
        self._events: list[Event] = []
        self.streams = streams
        """Large messages and files (None: a frame larger than one record raises MessageTooLarge)."""
        self.rmi = rmi
        """Remote objects (None: RMI frames are counted as frame errors and dropped)."""
        self.delivery = delivery
        """Plain messages numbered, retained and replayed across connections (None: not)."""
        if delivery is not None:  # RESUME alone, then the replay of what the peer has not acknowledged
            self._sealed += map(records.seal, delivery.begin(self.batch_limit))
        self.last_received_ns = now_ns  # when the peer was last heard from (anything received)
        self._last_sent_ns = now_ns
        self.liveness_records = 0
        """Records sent or received that carried only a KEEPALIVE (see the module's docstring)."""
        self.requests = Requests()
        """Outstanding send_syncs and pings (ids, timeouts; a streamed sync's progress)."""
        self._now_ns = now_ns

    # -- deadlines --------------------------------------------------------------------------------

    @property
    def deadline_ns(self) -> int | None:
        """When :meth:`handle_timer` must run: expiry, keepalive, or a ping/sync timeout."""
        if self.closed:
            return None
        # Asked on every duty cycle: comparisons, not min() calls.
        deadline = self.last_received_ns + self.expiry_ns
        if (keepalive := self._last_sent_ns + self.keepalive_ns) < deadline:
            deadline = keepalive
        if (request_deadline := self.requests.deadline_ns) is not None and request_deadline < deadline:
            deadline = request_deadline
        if self.streams is not None and (stream_deadline := self.streams.deadline_ns) is not None:
            deadline = min(deadline, stream_deadline)
        if self.rmi is not None and (rmi_deadline := self.rmi.deadline_ns) is not None and rmi_deadline < deadline:
            deadline = rmi_deadline
        if self.delivery is not None and (ack_due := self.delivery.ack_due_ns) is not None and ack_due < deadline:
            deadline = ack_due
        return deadline

    def handle_timer(self, now_ns: int) -> None:
        """Expire a silent peer, send a keepalive when quiet, time out pings and syncs."""
        if self.closed:
            return
        self._now_ns = now_ns
        expired, cancel = self.requests.expire(now_ns)
        self._events += expired
        for stream_id in cancel:  # a stalled send_sync: the receiver never delivers what it carried
            assert self.streams is not None
            self.streams.abort(stream_id, "send_sync timed out: no progress")
            self._take_stream_events()
        if now_ns - self.last_received_ns >= self.expiry_ns:
            self._close(by_peer=False, expired=True, reason=f"no word from the peer for {self.expiry_ns / 1e9:g} s")
            return
        if self.streams is not None:
            self.streams.handle_timer(now_ns)
            self._take_stream_events()
        if self.rmi is not None:
            self.rmi.handle_timer(now_ns)
            self.take_rmi()
        if self.delivery is not None and (ack_due := self.delivery.ack_due_ns) is not None and now_ns >= ack_due:
            self._batch += self.delivery.take_ack()  # fits: the batch limit keeps room for it
            self._seal_batch()
        if now_ns - self._last_sent_ns >= self.keepalive_ns and not self._batch:
            self._append(FrameKind.KEEPALIVE, 0, b"")
            self.liveness_records += 1
            self._events.append(KeepaliveSent())

    # -- sending ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionClosedError("the connection is closed")

    def _append(self, kind: int, request_id: int, payload: bytes | bytearray | memoryview) -> None:
        size = self.frame_overhead + len(payload)
        if size > self.max_payload:
            if self.streams is not None and kind not in _STREAM_KINDS:  # (a stream's own frames always fit)
                self.streams.send(kind, request_id, payload)
                return
            raise MessageTooLarge(
                f"a message of {len(payload)} bytes exceeds the largest record ({self.max_payload} bytes of frames)"
            )
        batch = self._batch
        if batch and len(batch) + size > self.batch_limit:
            self._seal_batch()
            batch = self._batch
        encode_frame_into(batch, kind, request_id, payload)

    def _append_message(self, kind: int, request_id: int, message: object) -> int:
        """Encode ``message`` as a frame straight into the batch (the serializer's fast path); a
        frame that overflows the batch starts the next one. 0, or the stream's id when it went as a
        stream instead (a plain message's sequence number stays off the stream: streamed messages are
        not sequenced)."""
        batch = self._batch
        start = len(batch)
        size = self.serialization.encode_frame_into(batch, kind, request_id, message)
        if size > self.max_payload:
            if self.streams is not None:
                payload = bytes(batch[start + FRAME_OVERHEAD :])
                del batch[start:]
                return self.streams.send(kind, 0 if kind == _MESSAGE else request_id, payload)
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
        return 0

    def _seal_batch(self) -> None:
        if self._batch:
            if self.delivery is not None:
                self.delivery.sealing(self._batch)
            self._sealed.append(self.records.seal(self._batch))
            self._batch = bytearray()

    def send(self, message: object) -> None:
        """Serialize ``message`` into the batch (raises UnregisteredTypeError, ConnectionClosedError,
        MessageTooLarge); a ``pathlib.Path`` streams the file (the peer gets a temporary copy); a proxy
        or a registered implementation travels as a remote object."""
        self._check_open()
        rmi = self.rmi
        if rmi is not None and rmi.objects_travel and rmi.endpoint.is_remote_object(message):
            self.send_object(message)  # a proxy goes home as its object; an implementation as a proxy
            return
        if type(message) not in self.serialization.plain_types and isinstance(message, os.PathLike):
            self.send_file(message)
        elif (delivery := self.delivery) is None or not delivery.sequencing:
            self._append_message(_MESSAGE, 0, message)
        elif not self._append_message(_MESSAGE, delivery.next_wire, message):  # not when it went as a stream
            delivery.commit()
        self.stats.messages_sent += 1

    def seal_lone(self, message: object, now_ns: int) -> bytes | bytearray | None:
        """:meth:`send` then :meth:`messages_to_send` for a lone message: its sealed record. None (nothing done: use
        :meth:`send`) if anything else waits, the connection is closed, or it is a file, a remote object or a stream."""
        rmi, streams, delivery = self.rmi, self.streams, self.delivery
        if self._batch or self._sealed or self.closed or type(message) not in self.serialization.plain_types:
            return None
        if (streams is not None and streams.sending) or (
            rmi is not None and rmi.objects_travel and rmi.endpoint.is_remote_object(message)
        ):
            return None
        number = delivery.next_wire if delivery is not None and delivery.sequencing else 0  # (never 0 if sequenced)
        batch = self._batch
        if self.serialization.encode_frame_into(batch, _MESSAGE, number, message) > self.max_payload:
            del batch[:]
            return None  # it goes as a stream: send does that
        # What messages_to_send does for a batch of one, in this frame: a lone round trip's every step counts.
        if delivery is not None:
            if number:
                delivery.commit()
            delivery.sealing(batch)
        record = self.records.seal(batch)
        self._batch = bytearray()
        self._last_sent_ns = now_ns
        stats = self.stats
        stats.messages_sent += 1
        stats.records_sent += 1
        stats.bytes_sent += len(record)
        return record

    def send_file(self, path: os.PathLike[str] | str, *, kind: int = FrameKind.MESSAGE, request_id: int = 0) -> int:
        """Stream a file's contents; returns the stream id (StreamingError when it cannot be read)."""
        self._check_open()
        if self.streams is None:
            raise MessageTooLarge("this connection streams nothing: a file cannot be sent")
        return self.streams.send_file(path, kind=kind, request_id=request_id)

    def send_frame(self, kind: int, request_id: int, payload: bytes) -> None:
        """A raw frame, streamed when it is too large (tests play a hostile peer with it)."""
        self._check_open()
        self._append(kind, request_id, payload)

    def send_sync(self, message: object, now_ns: int, timeout_ns: int) -> int:
        """Send ``message`` and expect a SYNC_ACK once the remote's listeners handled it; returns the
        request id that :class:`SyncCompleted`, :class:`SyncTimedOut` or :class:`SyncFailed` will name.
        A streamed message or file is timed from its last progress (see :mod:`.requests`)."""
        self._check_open()
        sync_id = self._next_id()
        if isinstance(message, os.PathLike):
            stream_id = self.send_file(message, kind=FrameKind.SYNC_REQUEST, request_id=sync_id)
        else:
            stream_id = self._append_message(FrameKind.SYNC_REQUEST, sync_id, message)
        self.requests.sync(sync_id, now_ns, timeout_ns, stream_id)
        self.stats.messages_sent += 1
        return sync_id

    def _next_id(self) -> int:
        """A request id (1-65535) not outstanding: the pool is bounded, ids are reused."""
        try:
            return self.requests.next_id()
        except OverflowError as exc:
            raise ConnectionClosedError(str(exc)) from None

    def acknowledge_sync(self, sync_id: int) -> None:
        """The listeners handled the message of request ``sync_id``: tell the sender."""
        if not self.closed:
            self._append(FrameKind.SYNC_ACK, sync_id, b"")

    def ping(self, now_ns: int, timeout_ns: int) -> int:
        """Send a ping; returns the id that PingAcknowledged or PingTimedOut will name."""
        self._check_open()
        ping_id = self._next_id()
        self.requests.ping(ping_id, now_ns, timeout_ns)
        self._append(FrameKind.PING, ping_id, _PING.pack(now_ns + self.wall_offset_ns))
        return ping_id

    def close(self, reason: str = "") -> None:
        """Send CLOSE (it goes with the next :meth:`messages_to_send`) and emit ``Closed``."""
        if self.closed:
            return
        if self.delivery is not None:  # our count goes before CLOSE (the peer reads no frame after it)
            self._batch += self.delivery.detach()
        self._append(FrameKind.CLOSE, 0, reason.encode("utf-8", "replace")[:200])
        self._close(by_peer=False, expired=False, reason=reason)

    def lost(self, reason: str) -> None:
        """The transport reports the peer gone (its stream ended or timed out): closed as a peer gone
        silent is (``Closed(expired=True)``, sending nothing), without waiting out the expiry."""
        if not self.closed:
            self._close(by_peer=False, expired=True, reason=reason)

    def _close(self, *, by_peer: bool, expired: bool, reason: str) -> None:
        self.closed = True
        if self.delivery is not None:  # the batch's messages are retained; the peer may still hear our count
            self._batch += self.delivery.detach()
            self._seal_batch()
        if self.streams is not None:
            self.streams.connection_lost(reason or "the connection closed")
            self._take_stream_events()
        self._events.append(Closed(by_peer, expired, reason))
        self.requests.clear()
        if self.rmi is not None:  # calls in flight fail now, after Closed
            self.rmi.close(reason or "the connection closed")
            self.take_rmi()

    def release_stream(self, stream_id: int) -> None:
        """A streamed message was handled: remove its temporary file (if it had one)."""
        if self.streams is not None:
            self.streams.release(stream_id)

    def shutdown(self) -> None:
        """The adapter is done with this connection: remove every temporary file still held."""
        if self.streams is not None and not self.streams.closed:
            self.streams.close()
            self._take_stream_events()

    @property
    def retained_full(self) -> bool:
        """Delivery retains all it may until the peer acknowledges: hold ``send`` back as for a full transport."""
        return self.delivery is not None and self.delivery.full

    @property
    def sealed_count(self) -> int:
        """Records sealed and not yet taken."""
        return len(self._sealed)

    @property
    def has_pending(self) -> bool:
        """Frames wait to be sealed, records to be taken, or streams to be sent."""
        return bool(self._batch or self._sealed or (self.streams is not None and self.streams.sending))

    def messages_to_send(self, now_ns: int, stream_budget: int = 1 << 20) -> list[bytes | bytearray]:
        """Seal the batch; return every record to offer, oldest first (one transport message each).
        Outgoing streams add up to about ``stream_budget`` bytes of chunks (the adapter sizes it to
        the room its transport has, so a large file is read as the transport drains it)."""
        streams = self.streams
        if streams is not None and stream_budget > 0 and streams.sending and not self.closed:
            self._now_ns = now_ns
            for kind, request_id, payload in streams.take_frames(stream_budget):
                self._append(kind, request_id, payload)
            self._take_stream_events()
        self._seal_batch()
        sealed, self._sealed = self._sealed, []
        if sealed:
            self._last_sent_ns = now_ns
            stats = self.stats
            stats.records_sent += len(sealed)
            stats.bytes_sent += sum(map(len, sealed))
        return sealed

    # -- receiving --------------------------------------------------------------------------------

    def receive(self, record: bytes | memoryview, now_ns: int) -> bool:
        """One transport message from the peer: opened, decoded, turned into events. False when the
        record layer dropped it (tampered, replayed, forged, malformed: ``stats.records_dropped``)."""
        delivery = self.delivery
        if self.closed and delivery is None:
            return True
        try:
            plaintext = self.records.open(record)
        except RecordRejected:
            self.stats.records_dropped += 1
            return False
        try:
            frames = self.serialization.decode_record(plaintext)
        except FrameError:
            self.stats.frame_errors += 1
            return True
        if delivery is not None and self.closed:  # the peer's last acknowledgements still trim what is retained
            delivery.late(frames)
            return True
        if delivery is not None and not delivery.peer_heard:  # the connection's first record, or delivery is off
            delivery = delivery.first_record(frames)
        stats = self.stats
        stats.records_received += 1
        stats.bytes_received += len(record)
        self.last_received_ns = now_ns
        if len(frames) == 1 and frames[0][0] is _KEEPALIVE:
            self.liveness_records += 1  # a keepalive is sent alone
            return True
        events = self._events
        for kind, request_id, value in frames:  # (kinds are FrameKind members: compared by identity)
            if kind is _MESSAGE or kind is _SYNC_REQUEST:
                sync = kind is _SYNC_REQUEST  # (a plain message's request id is its sequence number)
                if not sync and request_id and delivery is not None and not delivery.accept(request_id, now_ns):
                    continue  # delivered before (a replay), or past a gap (see below)
                if isinstance(value, SerializationError):
                    stats.decode_errors += 1
                    events.append(MessageDecodeFailed(str(value)))
                    if sync:
                        self.acknowledge_sync(request_id)  # nothing to handle: do not keep the sender waiting
                    continue
                stats.messages_received += 1
                events.append(MessageReceived(value, request_id if sync else 0))
            elif kind is _DELIVERED:
                if delivery is not None:
                    delivery.acknowledged(value)
            elif kind is RMI_REQUEST or kind is RMI_RESPONSE:  # (a remote call is a record of its own)
                self._rmi_frame(kind, request_id, bytes(value))  # type: ignore[call-overload]
            elif self._control_frame(kind, request_id, value, now_ns):
                return True  # CLOSE: the peer reads no frame after it
        if delivery is not None and delivery.gap:  # a record of this connection went missing: its successor replays
            self.lost("a sequenced message is missing")
        return True

    def _control_frame(self, kind: FrameKind, request_id: int, value: object, now_ns: int) -> bool:
        """A frame other than a message, an acknowledgement or a remote call's; True when it was CLOSE."""
        if kind == FrameKind.SYNC_ACK:
            if (completed := self.requests.acknowledged(request_id)) is not None:
                self._events.append(completed)
        elif kind == FrameKind.PING:
            if isinstance(value, bytes) and len(value) == _PING.size:
                (ping_wall,) = _PING.unpack(value)
                self._append(FrameKind.PONG, request_id, _PONG.pack(ping_wall, now_ns + self.wall_offset_ns))
        elif kind == FrameKind.PONG:
            sent = self.requests.ponged(request_id)
            if sent is not None and isinstance(value, bytes) and len(value) == _PONG.size:
                ping_wall, pong_wall = _PONG.unpack(value)
                finished_wall = now_ns + self.wall_offset_ns
                self._events.append(
                    PingAcknowledged(request_id, now_ns - sent, pong_wall - ping_wall, finished_wall - pong_wall)
                )
        elif kind in _STREAM_KINDS:
            if self.streams is not None:
                self._now_ns = now_ns
                self.streams.receive(kind, request_id, bytes(value), now_ns)  # type: ignore[call-overload]
                self._take_stream_events()
        elif kind == FrameKind.CLOSE:
            reason = bytes(value).decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else ""
            self._close(by_peer=True, expired=False, reason=reason)
            return True
        # KEEPALIVE only proves liveness; a RESUME counts only as a connection's first frame.
        return False

    def _take_stream_events(self) -> None:
        """Move the streams' events into ours; a completed stream becomes the frame it carried; a stream
        carrying a ``send_sync`` message reports to its request."""
        assert self.streams is not None
        rmi = self.rmi
        requests = self.requests
        for event in self.streams.take_events():
            if isinstance(event, StreamCompleted):
                self._completed(event)
                continue
            ours = isinstance(event, StreamSent) or not event.incoming
            if ours and not isinstance(event, StreamStarted) and requests.carries(event.stream_id):
                self._events += requests.stream_event(event, self._now_ns)
                continue
            if rmi is not None:
                if isinstance(event, StreamStarted):
                    marked = event.kind == FrameKind.MESSAGE and event.request_id == FILE_STREAM_MARK
                    if marked and event.incoming and event.is_file:
                        rmi.file_started(event.stream_id)  # a Path argument or result: RMI's, not a message
                elif isinstance(event, StreamFailed) and event.incoming:
                    rmi.file_failed(event.stream_id, f"({event.failure.name.lower()}): {event.detail}")
            self._events.append(event)
        if rmi is not None:
            self.take_rmi()

    def _completed(self, done: StreamCompleted) -> None:
        kind, request_id = done.kind, done.request_id
        stats, events = self.stats, self._events
        if kind in (FrameKind.MESSAGE, FrameKind.SYNC_REQUEST):
            sync_id = request_id if kind == FrameKind.SYNC_REQUEST else 0
            if done.is_file:
                assert done.path is not None
                if self.rmi is not None and self.rmi.file_arrived(done.stream_id, done.path, done.size):
                    return  # a Path argument or result: RMI owns the copy
                stats.messages_received += 1
                events.append(MessageReceived(Path(done.path), sync_id, done.stream_id))
                return
            try:
                if done.payload is not None:
                    message = self.serialization.decode(done.payload)
                else:
                    assert done.path is not None
                    with SpillFile.mapped(done.path) as view:
                        message = self.serialization.decode(view)
            except SerializationError as exc:
                stats.decode_errors += 1
                events.append(MessageDecodeFailed(str(exc)))
                self.release_stream(done.stream_id)
                if sync_id:
                    self.acknowledge_sync(sync_id)
                return
            stats.messages_received += 1
            events.append(MessageReceived(message, sync_id, done.stream_id))
        elif kind in _RMI_KINDS:
            payload = done.payload
            if payload is None:
                assert done.path is not None
                with SpillFile.mapped(done.path) as view:
                    payload = bytes(view)
            self.release_stream(done.stream_id)
            self._rmi_frame(kind, request_id, payload)
        else:  # a stream may carry only messages and RMI frames
            stats.frame_errors += 1
            self.release_stream(done.stream_id)

    def take_events(self) -> list[Event]:
        """Events since the last call, in order."""
        events, self._events = self._events, []
        return events
