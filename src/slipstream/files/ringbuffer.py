"""Aeron's many-to-one ring buffer (the CnC's to-driver command buffer): layout facts.

A buffer of ``capacity`` bytes (a power of two) followed by a trailer of counters, each on its own pair
of cache lines so that writers in different processes do not share lines. Records are 8-byte aligned:
length (i32, written last and with release semantics), message type id (i32), then the message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from ..errors import InvalidArgumentError, SlipstreamError
from ..logbuffer.fastpath import Atomics, load_acquire_i64, require_atomics

CACHE_LINE_LENGTH: Final = 64
TAIL_POSITION_OFFSET: Final = 2 * CACHE_LINE_LENGTH
HEAD_CACHE_POSITION_OFFSET: Final = 4 * CACHE_LINE_LENGTH
HEAD_POSITION_OFFSET: Final = 6 * CACHE_LINE_LENGTH
CORRELATION_COUNTER_OFFSET: Final = 8 * CACHE_LINE_LENGTH
CONSUMER_HEARTBEAT_OFFSET: Final = 10 * CACHE_LINE_LENGTH
TRAILER_LENGTH: Final = 12 * CACHE_LINE_LENGTH
"""Offsets above are relative to the trailer, which starts at ``capacity``."""
RECORD_HEADER_LENGTH: Final = 8
RECORD_ALIGNMENT: Final = 8
PADDING_MSG_TYPE_ID: Final = -1
_I32: Final = struct.Struct("<i")
MIN_CAPACITY: Final = RECORD_HEADER_LENGTH
"""Aeron's smallest ring (one record header); its max message length is 0."""


class RingBufferCorruptError(SlipstreamError, RuntimeError):
    """A record's length in the shared buffer runs past its end: a writer broke the layout. Aeron trusts
    its writers; here the reader stops rather than zero the trailer's counters."""


def _align(value: int) -> int:
    return (value + RECORD_ALIGNMENT - 1) & ~(RECORD_ALIGNMENT - 1)


def ring_capacity(buffer_length: int, what: str, trailer_length: int, min_capacity: int) -> int:
    """The capacity of a buffer of ``buffer_length`` bytes ending in a trailer: a power of two, Aeron's rule."""
    capacity = buffer_length - trailer_length
    if capacity < min_capacity or capacity & (capacity - 1) or capacity >= 1 << 31:
        raise InvalidArgumentError(
            f"{what}: capacity {capacity} (buffer of {buffer_length} bytes less a {trailer_length}-byte trailer) "
            f"must be a power of two, at least {min_capacity} and below 2**31"
        )
    return capacity


def check_message(what: str, msg_type_id: int, payload: bytes | bytearray | memoryview, max_length: int) -> memoryview:
    """The payload as bytes, once the type id (>= 1) and the length (<= ``max_length``) are checked."""
    if msg_type_id < 1 or msg_type_id > 0x7FFF_FFFF:
        raise InvalidArgumentError(f"{what}: message type id {msg_type_id} must be in 1 .. 2**31-1")
    view = memoryview(payload).cast("B")
    if view.nbytes > max_length:
        raise InvalidArgumentError(f"{what}: message of {view.nbytes} bytes exceeds the maximum of {max_length}")
    return view


class ManyToOneRingBuffer:
    """Aeron's many-to-one ring buffer over ``buffer`` (capacity + trailer), shared by processes.

    Many writers, in any processes, claim space by compare-and-set on the tail; one reader consumes,
    zeroes what it consumed and moves the head. Writing and reading need the C extension's atomics
    (``AtomicsUnavailableError`` without it); the positions and the heartbeat can be read without it.
    """

    def __init__(self, buffer: memoryview) -> None:
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise InvalidArgumentError("ManyToOneRingBuffer: the buffer must be writable")
        self.capacity = ring_capacity(view.nbytes, "ManyToOneRingBuffer", TRAILER_LENGTH, MIN_CAPACITY)
        self.max_message_length = 0 if self.capacity == MIN_CAPACITY else self.capacity // 8
        """Aeron's rule: an eighth of the capacity."""
        self.buffer = view
        self._mask = self.capacity - 1
        self._tail = self.capacity + TAIL_POSITION_OFFSET
        self._head_cache = self.capacity + HEAD_CACHE_POSITION_OFFSET
        self._head = self.capacity + HEAD_POSITION_OFFSET
        self._correlation = self.capacity + CORRELATION_COUNTER_OFFSET
        self._heartbeat = self.capacity + CONSUMER_HEARTBEAT_OFFSET

    def write(self, msg_type_id: int, payload: bytes | bytearray | memoryview) -> bool:
        """Append one message; False when there is no room now (never blocks). ``InvalidArgumentError`` for a
        type id below 1 or a payload over ``max_message_length``, before anything is written."""
        data = check_message("ManyToOneRingBuffer.write", msg_type_id, payload, self.max_message_length)
        atomics = require_atomics("ManyToOneRingBuffer.write")
        record_length = data.nbytes + RECORD_HEADER_LENGTH
        index = self._claim(atomics, _align(record_length))
        if index < 0:
            return False
        buffer = self.buffer
        # Aeron's order: a negative length marks the record as in progress, the length goes positive last.
        atomics.store_release_i32(buffer, index, -record_length)
        buffer[index + RECORD_HEADER_LENGTH : index + record_length] = data
        _I32.pack_into(buffer, index + 4, msg_type_id)
        atomics.store_release_i32(buffer, index, record_length)
        return True

    def _claim(self, atomics: Atomics, required: int) -> int:
        """The index of ``required`` bytes claimed by CAS on the tail (after a padding record up to the end of
        the buffer when they do not fit before it), or -1 when the consumer has not freed enough."""
        buffer = self.buffer
        capacity = self.capacity
        head = atomics.load_acquire_i64(buffer, self._head_cache)
        while True:
            tail = atomics.load_acquire_i64(buffer, self._tail)
            if required > capacity - (tail - head):
                head = atomics.load_acquire_i64(buffer, self._head)
                if required > capacity - (tail - head):
                    return -1
                atomics.store_release_i64(buffer, self._head_cache, head)
            padding = 0
            tail_index = tail & self._mask
            to_end = capacity - tail_index
            if required > to_end:
                if required > head & self._mask:
                    head = atomics.load_acquire_i64(buffer, self._head)
                    if required > head & self._mask:
                        return -1
                    atomics.store_release_i64(buffer, self._head_cache, head)
                padding = to_end
            if atomics.compare_and_set_i64(buffer, self._tail, tail, tail + required + padding):
                break
        if padding:
            atomics.store_release_i32(buffer, tail_index, -padding)
            _I32.pack_into(buffer, tail_index + 4, PADDING_MSG_TYPE_ID)
            atomics.store_release_i32(buffer, tail_index, padding)
            tail_index = 0
        return tail_index

    def read(self, handler: Callable[[int, memoryview], object], limit: int = 0x7FFF_FFFF) -> int:
        """Deliver up to ``limit`` messages as ``handler(msg_type_id, message)`` (a view valid during the call
        only: the space is zeroed after it) up to the end of the buffer; the number delivered. One reader
        only. If the handler raises, the messages before it (and it) are consumed, as in Aeron's Java."""
        atomics = require_atomics("ManyToOneRingBuffer.read")
        buffer = self.buffer
        head = atomics.load_acquire_i64(buffer, self._head)
        head_index = head & self._mask
        contiguous = self.capacity - head_index
        messages = 0
        consumed = 0
        try:
            while consumed < contiguous and messages < limit:
                index = head_index + consumed
                length = atomics.load_acquire_i32(buffer, index)
                if length <= 0:
                    break
                if length < RECORD_HEADER_LENGTH or _align(length) > contiguous - consumed:
                    raise RingBufferCorruptError(
                        f"ring buffer record at index {index} has length {length}, past the end of the buffer"
                    )
                consumed += _align(length)
                msg_type_id = _I32.unpack_from(buffer, index + 4)[0]
                if msg_type_id == PADDING_MSG_TYPE_ID:
                    continue
                messages += 1
                handler(msg_type_id, buffer[index + RECORD_HEADER_LENGTH : index + length])
        finally:
            if consumed:
                buffer[head_index : head_index + consumed] = bytes(consumed)
                atomics.store_release_i64(buffer, self._head, head + consumed)
        return messages

    def next_correlation_id(self) -> int:
        """A correlation id unique among every process sharing the buffer (get-and-add on its counter)."""
        return require_atomics("ManyToOneRingBuffer.next_correlation_id").get_and_add_i64(
            self.buffer, self._correlation, 1
        )

    @property
    def consumer_heartbeat_time(self) -> int:
        """The consumer's (the driver's) last heartbeat, epoch ms as Aeron keeps it."""
        return load_acquire_i64(self.buffer, self._heartbeat)

    @consumer_heartbeat_time.setter
    def consumer_heartbeat_time(self, now_ms: int) -> None:
        require_atomics("ManyToOneRingBuffer.consumer_heartbeat_time").store_release_i64(
            self.buffer, self._heartbeat, now_ms
        )

    @property
    def producer_position(self) -> int:
        """The tail: bytes claimed by writers since the buffer was made (padding included)."""
        return load_acquire_i64(self.buffer, self._tail)

    @property
    def consumer_position(self) -> int:
        """The head: bytes consumed by the reader."""
        return load_acquire_i64(self.buffer, self._head)

    def size(self) -> int:
        """Bytes claimed and not yet consumed (Aeron's size: head read either side of the tail)."""
        head_after = load_acquire_i64(self.buffer, self._head)
        while True:
            head_before = head_after
            tail = load_acquire_i64(self.buffer, self._tail)
            head_after = load_acquire_i64(self.buffer, self._head)
            if head_after == head_before:
                return tail - head_after
