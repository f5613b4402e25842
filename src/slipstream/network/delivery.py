"""Plain messages delivered exactly once and in order across a lost connection and its successor.

A :class:`Delivery` is a session that outlives its connections: the endpoint keeps one per peer and hands
it to each connection machine it builds for that peer (``ConnectionMachine(delivery=...)``), one machine
at a time. The rules:

- **What is sequenced.** A plain message (``ConnectionMachine.send`` of a message that fits in a record)
  goes as a MESSAGE frame whose ``request_id`` is its number on the wire: numbers are u64 here, the wire
  carries them as 1..2**32-1 (0: unsequenced) and the receiver reads them back by serial-number
  arithmetic against the one it expects next. Streamed messages, files, ``send_sync``, pings and remote
  calls are not sequenced: on a lost connection they fail as they always did (the caller is told).
- **Retained until acknowledged.** Each sealed batch that carried sequenced messages is kept (the batch
  itself, no copy) with its last number until the peer says it delivered that far. Memory is bounded
  (``max_retained_bytes``, ``max_retained_messages``): when full, :attr:`full` says so and the adapter holds
  ``send`` back as it does for a full transport. Nothing is dropped.
- **DELIVERED** (``u64``: the number of the last of the peer's messages delivered here) rides on the next
  batch sealed after a delivery, or goes alone ``ack_delay_ns`` after the first unacknowledged one, so
  one-way traffic is acknowledged without a record per message.
- **RESUME first.** Each side's first record on every connection holds RESUME alone (``my session id |
  your session id as I knew it, 0: none | the number of the last of your messages I delivered | the number
  of the first message I send on this connection``, four u64), then every retained message not yet
  acknowledged is replayed (only its MESSAGE frame, re-framed into new batches, retained anew), then
  what is new. A receiver drops a message whose number it already delivered (``duplicates_dropped``),
  so replaying before hearing the peer is safe; on hearing it, the sender trims what the peer delivered.
  A peer whose session id changed is a new process: what it delivered is counted afresh from its RESUME.
- **A peer that does not take part** (its first record is not a RESUME) turns delivery off for that
  connection: what is retained is dropped (it went out on this connection as any message does without
  delivery), nothing more is sequenced or acknowledged, so an old peer never back-pressures us forever.
  RESUME goes alone so that such a peer refuses that one record (an unknown frame kind) and no other.
- **A gap** (a number ahead of the one expected: a record of this connection went missing) closes the
  connection as lost; its successor replays what is missing.
- **The end.** When the session ends for good, :meth:`end` gives back every message never acknowledged,
  decoded, oldest first (what ``UndeliveredError`` carries). A message acknowledged late (its DELIVERED
  reached a closed machine) is trimmed still, so a graceful close does not report delivered messages.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Final, Protocol

from .frames import FRAME_HEADER, FRAME_OVERHEAD, FrameKind, walk_frames

__all__ = ["ACK_ROOM", "Delivery", "DeliverySessions", "wire_number"]

_WRAP: Final = 0xFFFF_FFFF
"""Wire numbers run 1..2**32-1 (0 marks an unsequenced message), so they repeat every 2**32-1 messages."""
_U64: Final = struct.Struct(">Q")
_RESUME: Final = struct.Struct(">QQQQ")
_DELIVERED_HEADER: Final = FRAME_HEADER.pack(FrameKind.DELIVERED, 0, _U64.size)
ACK_ROOM: Final = FRAME_OVERHEAD + _U64.size
"""Bytes a piggybacked DELIVERED adds to a batch (the machine keeps this much of its batch limit free)."""
_MESSAGE: Final = int(FrameKind.MESSAGE)


def _unpack_resume(payload: object) -> tuple[int, int, int, int]:
    """A RESUME's four fields, or zeros when it is malformed."""
    if isinstance(payload, bytes) and len(payload) == _RESUME.size:
        session, known, delivered, first = _RESUME.unpack(payload)
        return session, known, delivered, first
    return 0, 0, 0, 0


def wire_number(number: int) -> int:
    """The ``request_id`` that carries message ``number`` (1..2**32-1, repeating)."""
    return (number - 1) % _WRAP + 1


class _Decoder(Protocol):
    def decode(self, data: bytes | bytearray | memoryview) -> object:
        """One message's bytes (type id + body) decoded."""
        ...


class Delivery:
    """One side's delivery session with one peer (sans-I/O; the machine that carries it calls it)."""

    __slots__ = (
        "_expected",
        "_off",
        "_retained",
        "_unretained",
        "ack_delay_ns",
        "ack_due_ns",
        "acked",
        "attached",
        "delivered",
        "duplicates_dropped",
        "ended",
        "frames_refused",
        "gap",
        "max_retained_bytes",
        "max_retained_messages",
        "messages_replayed",
        "messages_skipped",
        "next_wire",
        "peer_heard",
        "peer_session_id",
        "retained_bytes",
        "sent",
        "sequencing",
        "session_id",
    )

    def __init__(
        self,
        *,
        max_retained_bytes: int = 8 << 20,
        max_retained_messages: int = 1 << 20,
        ack_delay_ns: int = 10_000_000,
        first_number: int = 1,
        session_id: int | None = None,
    ) -> None:
        if max_retained_bytes <= 0 or not 0 < max_retained_messages <= _WRAP // 4:
            raise ValueError(f"max_retained_bytes must be positive and max_retained_messages 1..{_WRAP // 4}")
        if ack_delay_ns < 0 or not 1 <= first_number < 1 << 63:
            raise ValueError("ack_delay_ns must be >= 0 and first_number 1..2**63-1")
        self.session_id = session_id if session_id is not None else int.from_bytes(os.urandom(8)) or 1
        """This side's session (random, 64 bits): a peer that sees it change knows this is a new process."""
        self.max_retained_bytes = max_retained_bytes
        self.max_retained_messages = max_retained_messages
        """Held well below 2**31 so that wire numbers compare unambiguously."""
        self.ack_delay_ns = ack_delay_ns
        self.sent = first_number - 1
        """Number of the last message sequenced."""
        self.acked = first_number - 1
        """The peer delivered every message up to this number."""
        self.next_wire = wire_number(first_number)
        """The ``request_id`` of the next message sequenced."""
        self._unretained = 0
        """Last number in the batch being filled (0: none), retained when the machine seals it."""
        self._retained: deque[tuple[int, bytearray]] = deque()
        """(last number, batch plaintext), oldest first."""
        self.retained_bytes = 0
        self.peer_session_id = 0
        """The peer's session as last heard (0: none yet)."""
        self.delivered = 0
        """Number of the last of the peer's messages delivered here."""
        self._expected = 1
        self.ack_due_ns: int | None = None
        """When a DELIVERED must go (None: the peer knows our count)."""
        self.attached = False
        """A connection machine carries this session now."""
        self.sequencing = False
        """This connection numbers our plain messages (off when the peer does not take part)."""
        self.peer_heard = False
        """The peer's RESUME arrived on this connection."""
        self._off = False
        self.gap = False
        """A number arrived ahead of the one expected on this connection (the machine closes it as lost)."""
        self.ended = False
        self.duplicates_dropped = 0
        self.messages_replayed = 0
        self.messages_skipped = 0
        """Numbers the peer's RESUME said it would never send (it turned delivery off on a connection)."""
        self.frames_refused = 0
        """RESUME or DELIVERED frames malformed or claiming more than was sent."""

    @property
    def unacknowledged(self) -> int:
        """Messages sequenced that the peer has not acknowledged yet."""
        return self.sent - self.acked

    @property
    def full(self) -> bool:
        """As much is retained as may be: the adapter holds ``send`` back until acknowledgements free room."""
        return self.retained_bytes >= self.max_retained_bytes or self.sent - self.acked >= self.max_retained_messages

    # -- what a connection machine calls --------------------------------------------------------------

    def begin(self, batch_limit: int) -> list[bytearray]:
        """A new connection carries the session: the plaintexts to seal first, in order (RESUME alone, then
        the replay in batches of up to ``batch_limit`` bytes, retained anew)."""
        if self.attached or self.ended:
            raise RuntimeError("a Delivery serves one open connection at a time, and none once it ended")
        self.attached = self.sequencing = True
        self.peer_heard = self._off = self.gap = False
        self.ack_due_ns = None
        resume = bytearray(FRAME_HEADER.pack(FrameKind.RESUME, 0, _RESUME.size))
        resume += _RESUME.pack(self.session_id, self.peer_session_id, self.delivered, self.acked + 1)
        pending, self._retained = self._retained, deque()
        self.retained_bytes = 0
        plaintexts = [resume]
        batch = bytearray()
        for number, frame in self._unacknowledged(pending):
            if batch and len(batch) + len(frame) > batch_limit:
                self._retain(batch)
                plaintexts.append(batch)
                batch = bytearray()
            batch += frame
            self._unretained = number
            self.messages_replayed += 1
        if batch:
            self._retain(batch)
            plaintexts.append(batch)
        return plaintexts

    def commit(self) -> None:
        """The message numbered ``next_wire`` went into the batch being filled."""
        self.sent = number = self.sent + 1
        self._unretained = number
        self.next_wire = number % _WRAP + 1

    def sealing(self, batch: bytearray) -> None:
        """The machine seals ``batch``: a DELIVERED due rides on it; its sequenced messages are retained."""
        if self.ack_due_ns is not None:
            batch += self.take_ack()
        if self._unretained:
            self._retain(batch)

    def take_ack(self) -> bytes:
        """The DELIVERED frame to send now (the timer fired, or a batch is sealed)."""
        self.ack_due_ns = None
        return _DELIVERED_HEADER + _U64.pack(self.delivered)

    def detach(self) -> bytes:
        """The machine closed: a DELIVERED due, to seal with its last batch (else empty)."""
        self.attached = False
        return self.take_ack() if self.ack_due_ns is not None else b""

    def first_record(self, frames: Sequence[tuple[int, int, object]]) -> Delivery | None:
        """The peer's first record on this connection: self when it opens with a RESUME, else delivery turns
        off for this connection (then None for every later record too)."""
        if self._off:
            return None
        kind, _, payload = frames[0] if frames else (0, 0, b"")
        if kind != FrameKind.RESUME:
            self._turn_off()
            return None
        session, known, delivered, first = _unpack_resume(payload)
        if not session or not first:
            self.frames_refused += 1
            self._turn_off()
            return None
        if session != self.peer_session_id:  # a new process: count its messages afresh
            self.peer_session_id = session
            self.delivered = first - 1
        elif first - 1 > self.delivered:
            self.messages_skipped += first - 1 - self.delivered
            self.delivered = first - 1
        self._expected = wire_number(self.delivered + 1)
        if known == self.session_id:
            self._trim(delivered)
        self.peer_heard = True
        return self

    def accept(self, wire: int, now_ns: int) -> bool:
        """A sequenced message arrived: True to deliver it, False for a duplicate (or a gap: :attr:`gap`)."""
        if wire == self._expected:
            self.delivered = number = self.delivered + 1
            self._expected = number % _WRAP + 1
            if self.ack_due_ns is None:
                self.ack_due_ns = now_ns + self.ack_delay_ns
            return True
        if 0 < (self._expected - wire) % _WRAP <= _WRAP // 2:
            self.duplicates_dropped += 1
        else:
            self.gap = True
        return False

    def acknowledged(self, payload: object) -> None:
        """A DELIVERED frame's payload: trim what the peer delivered."""
        if isinstance(payload, bytes) and len(payload) == _U64.size:
            self._trim(_U64.unpack(payload)[0])
        else:
            self.frames_refused += 1

    def late(self, frames: Sequence[tuple[int, int, object]]) -> None:
        """A record that reached the closed machine: its acknowledgements still count."""
        for kind, _, payload in frames:
            if kind == FrameKind.DELIVERED:
                self.acknowledged(payload)

    # -- what the endpoint calls --------------------------------------------------------------------

    def end(self, serialization: _Decoder) -> tuple[object, ...]:
        """The session is over for good (the peer did not come back, the application closed): every
        message never acknowledged, decoded, oldest first; the Delivery serves no connection after this."""
        if self.attached:
            raise RuntimeError("close the connection that carries this Delivery before ending it")
        pending, self._retained = self._retained, deque()
        self.retained_bytes = 0
        self.ended = True
        return tuple(serialization.decode(frame[FRAME_OVERHEAD:]) for _, frame in self._unacknowledged(pending))

    # -- internals ------------------------------------------------------------------------------------

    def _retain(self, batch: bytearray) -> None:
        self._retained.append((self._unretained, batch))
        self.retained_bytes += len(batch)
        self._unretained = 0

    def _unacknowledged(self, batches: deque[tuple[int, bytearray]]) -> Iterator[tuple[int, bytes]]:
        """(number, whole MESSAGE frame) of every retained message the peer has not acknowledged, in order:
        a batch's sequenced frames are consecutive numbers ending at its last."""
        acked = self.acked
        for last, plaintext in batches:
            data = bytes(plaintext)
            frames = []
            stop = 0
            for kind, request_id, length in walk_frames(data):
                start, stop = stop, stop + FRAME_OVERHEAD + length
                if kind == _MESSAGE and request_id:
                    frames.append(data[start:stop])
            for number, frame in enumerate(frames, last - len(frames) + 1):
                if number > acked:
                    yield number, frame

    def _trim(self, number: int) -> None:
        if number > self.sent:
            self.frames_refused += 1
            return
        if number <= self.acked:
            return
        self.acked = number
        retained = self._retained
        while retained and retained[0][0] <= number:
            self.retained_bytes -= len(retained.popleft()[1])

    def _turn_off(self) -> None:
        self._off = True
        self.sequencing = False
        self._retained.clear()
        self.retained_bytes = 0
        self._unretained = 0
        self.acked = self.sent


class DeliverySessions:
    """A server's delivery sessions, one per client session (the ``resume`` id its handshake carried),
    each used by one connection at a time: a client that connects again with the same id resumes its
    session; one that connects again before its old connection was seen lost has that connection
    named (:meth:`holder`) so the adapter ends it first."""

    def __init__(self) -> None:
        self._by_client: dict[int, Delivery] = {}
        self._carried: dict[int, int] = {}
        """Connection id -> the client session it carries now."""
        self._waiting: dict[int, int] = {}
        """Lost connection id -> the client session that waits for its return."""

    def holder(self, resume: int) -> int | None:
        """The connection that carries the client session ``resume`` now, if any."""
        return next((cid for cid, client in self._carried.items() if client == resume), None) if resume else None

    def attach(self, connection_id: int, resume: int) -> Delivery | None:
        """The session for a new connection of client session ``resume`` (resumed, or new); None when the
        client keeps none (``resume`` 0)."""
        if not resume:
            return None
        for lost, client in list(self._waiting.items()):
            if client == resume:
                del self._waiting[lost]
        self._carried[connection_id] = resume
        return self._by_client.setdefault(resume, Delivery())

    def detach(self, connection_id: int, *, keep: bool) -> Delivery | None:
        """The connection ended: its session waits for the client's return (``keep``: a buffered session
        waits) or ends now; the ended session, if any (its unacknowledged messages: ``Delivery.end``)."""
        resume = self._carried.pop(connection_id, None)
        if resume is None:
            return None
        if keep:
            self._waiting[connection_id] = resume
            return None
        return self._by_client.pop(resume, None)

    def end(self, connection_id: int) -> Delivery | None:
        """The session waiting for lost connection ``connection_id`` ended (it expired, the server closes)."""
        resume = self._waiting.pop(connection_id, None)
        return None if resume is None else self._by_client.pop(resume, None)
