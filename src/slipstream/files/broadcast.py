"""Aeron's one-to-many broadcast buffer (the CnC's to-clients buffer): layout facts.

A buffer of ``capacity`` bytes (a power of two) followed by a 128-byte trailer: tail intent counter,
tail counter and latest counter (i64 each). Records are 8-byte aligned: length (i32), message type id
(i32), then the message; a receiver that falls a whole capacity behind has been lapped.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from ..errors import SlipstreamError
from ..logbuffer.fastpath import load_acquire_i32, load_acquire_i64, require_atomics
from .ringbuffer import check_message, ring_capacity

TAIL_INTENT_COUNTER_OFFSET: Final = 0
TAIL_COUNTER_OFFSET: Final = 8
LATEST_COUNTER_OFFSET: Final = 16
TRAILER_LENGTH: Final = 128
"""Offsets above are relative to the trailer, which starts at ``capacity``."""
RECORD_HEADER_LENGTH: Final = 8
RECORD_ALIGNMENT: Final = 8
PADDING_MSG_TYPE_ID: Final = -1
_I32: Final = struct.Struct("<i")
_HEADER: Final = struct.Struct("<ii")
"""A record's length and message type id."""


class BroadcastLappedError(SlipstreamError, RuntimeError):
    """The transmitter overwrote messages this receiver had not read: they are lost. The receiver has
    already moved on to the latest message, so receiving again continues from there (as Aeron's does)."""


def _align(value: int) -> int:
    return (value + RECORD_ALIGNMENT - 1) & ~(RECORD_ALIGNMENT - 1)


def _capacity(buffer: memoryview, what: str) -> tuple[memoryview, int]:
    view = memoryview(buffer).cast("B")
    return view, ring_capacity(view.nbytes, what, TRAILER_LENGTH, RECORD_HEADER_LENGTH)


class BroadcastTransmitter:
    """Aeron's one-to-many broadcast over ``buffer`` (capacity + trailer): the single writer (the driver).

    It never waits for receivers: one that falls a capacity behind is lapped and told so. Transmitting
    needs the C extension's release stores (``AtomicsUnavailableError`` without it).
    """

    def __init__(self, buffer: memoryview) -> None:
        view, self.capacity = _capacity(buffer, "BroadcastTransmitter")
        self.max_message_length = self.capacity // 8
        """Aeron's rule: an eighth of the capacity."""
        self.buffer = view
        self._mask = self.capacity - 1
        self._tail_intent = self.capacity + TAIL_INTENT_COUNTER_OFFSET
        self._tail = self.capacity + TAIL_COUNTER_OFFSET
        self._latest = self.capacity + LATEST_COUNTER_OFFSET

    def transmit(self, msg_type_id: int, payload: bytes | bytearray | memoryview) -> None:
        """Broadcast one message. ``InvalidArgumentError`` for a type id below 1 or a payload over
        ``max_message_length``, before anything is written."""
        data = check_message("BroadcastTransmitter.transmit", msg_type_id, payload, self.max_message_length)
        atomics = require_atomics("BroadcastTransmitter.transmit")
        buffer = self.buffer
        current_tail = atomics.load_acquire_i64(buffer, self._tail)
        record_offset = current_tail & self._mask
        record_length = data.nbytes + RECORD_HEADER_LENGTH
        aligned = _align(record_length)
        new_tail = current_tail + aligned
        to_end = self.capacity - record_offset
        # The intent first (a receiver that copied a record checks it was not passed since), then the
        # record, then latest and tail: Aeron's order, which receivers in other processes rely on.
        if to_end < aligned:
            atomics.store_release_i64(buffer, self._tail_intent, new_tail + to_end)
            _HEADER.pack_into(buffer, record_offset, to_end, PADDING_MSG_TYPE_ID)
            current_tail += to_end
            record_offset = 0
        else:
            atomics.store_release_i64(buffer, self._tail_intent, new_tail)
        _HEADER.pack_into(buffer, record_offset, record_length, msg_type_id)
        buffer[record_offset + RECORD_HEADER_LENGTH : record_offset + record_length] = data
        atomics.store_release_i64(buffer, self._latest, current_tail)
        atomics.store_release_i64(buffer, self._tail, current_tail + aligned)


class BroadcastReceiver:
    """A receiver's cursor over a broadcast buffer (Aeron's ``BroadcastReceiver``): it starts at the latest
    message and only loads, so it works without the C extension on x86-64. A record it points at may be
    overwritten while it reads it; ``validate`` after reading tells. ``CopyBroadcastReceiver`` does that."""

    def __init__(self, buffer: memoryview) -> None:
        view, self.capacity = _capacity(buffer, "BroadcastReceiver")
        self.buffer = view
        self._mask = self.capacity - 1
        self._tail_intent = self.capacity + TAIL_INTENT_COUNTER_OFFSET
        self._tail = self.capacity + TAIL_COUNTER_OFFSET
        self._latest = self.capacity + LATEST_COUNTER_OFFSET
        latest = load_acquire_i64(view, self._latest)
        self._cursor = latest
        self._next_record = latest
        self.record_offset = latest & self._mask
        """Where the current record starts in the buffer (after ``receive_next``)."""
        self.lapped_count = 0
        """How many times the transmitter overwrote records before this receiver read them."""

    def receive_next(self) -> bool:
        """Move to the next record if there is one (to the latest, counting a lap, when it was passed)."""
        tail = load_acquire_i64(self.buffer, self._tail)
        cursor = self._next_record
        if tail <= cursor:
            return False
        if not self.validate_at(cursor):
            self.lapped_count += 1
            cursor = load_acquire_i64(self.buffer, self._latest)
        record_offset = cursor & self._mask
        self._cursor = cursor
        self._next_record = cursor + self._record_span(record_offset)
        if _I32.unpack_from(self.buffer, record_offset + 4)[0] == PADDING_MSG_TYPE_ID:
            record_offset = 0
            self._cursor = self._next_record
            self._next_record += self._record_span(0)
        self.record_offset = record_offset
        return True

    def _record_span(self, offset: int) -> int:
        # The aligned length of the record at ``offset``, kept within the buffer: a length read while the
        # record is being overwritten may be garbage, and validate() then reports the lap; Aeron follows it
        # as it is, which could set the cursor anywhere.
        length = load_acquire_i32(self.buffer, offset)
        span = _align(length)
        if length < RECORD_HEADER_LENGTH or span > self.capacity - offset:
            return self.capacity - offset
        return span

    @property
    def msg_type_id(self) -> int:
        """The current record's message type id."""
        return int(_I32.unpack_from(self.buffer, self.record_offset + 4)[0])

    @property
    def length(self) -> int:
        """The current record's message length (0 for a record too short or too long to be one)."""
        length = int(_I32.unpack_from(self.buffer, self.record_offset)[0]) - RECORD_HEADER_LENGTH
        return length if 0 <= length <= self.capacity - self.record_offset - RECORD_HEADER_LENGTH else 0

    @property
    def message_offset(self) -> int:
        """Where the current record's message starts in the buffer."""
        return self.record_offset + RECORD_HEADER_LENGTH

    def validate(self) -> bool:
        """Whether the current record is still intact (the transmitter has not come round to it)."""
        return self.validate_at(self._cursor)

    def validate_at(self, cursor: int) -> bool:
        """Whether the record at position ``cursor`` can still be intact."""
        return cursor + self.capacity > load_acquire_i64(self.buffer, self._tail_intent)


class CopyBroadcastReceiver:
    """Delivers broadcast messages copied out of the buffer and checked intact after the copy (Aeron's
    ``CopyBroadcastReceiver``), so a handler never sees a half-overwritten message."""

    def __init__(self, receiver: BroadcastReceiver) -> None:
        self.receiver = receiver

    @property
    def lapped_count(self) -> int:
        """The receiver's laps (messages lost to the transmitter coming round)."""
        return self.receiver.lapped_count

    def receive(self, handler: Callable[[int, bytes], object]) -> int:
        """Deliver the next message, if any, as ``handler(msg_type_id, message)``: 1 if one was, else 0.
        ``BroadcastLappedError`` when messages were lost (the next call goes on from the latest one)."""
        receiver = self.receiver
        laps = receiver.lapped_count
        if not receiver.receive_next():
            return 0
        if receiver.lapped_count != laps:
            raise BroadcastLappedError("unable to keep up with broadcast: messages were overwritten before read")
        msg_type_id = receiver.msg_type_id
        start = receiver.message_offset
        message = bytes(receiver.buffer[start : start + receiver.length])
        if not receiver.validate():
            raise BroadcastLappedError("unable to keep up with broadcast: a message was overwritten while read")
        handler(msg_type_id, message)
        return 1
