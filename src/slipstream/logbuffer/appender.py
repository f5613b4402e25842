"""Appending frames to a log: ``offer``, ``try_claim``, fragmentation, padding and term rotation.

One appender has one writer. Within a process, a lock around it makes a publication safe for many
threads; across processes each publisher owns its own log (Python has no atomic fetch-and-add on
shared memory, which Aeron's concurrent publications rely on).

The frame length is stored last, after header and payload: a reader that sees a positive length
sees a complete frame. While a frame is being written its length field holds the negated length,
so a driver can pad over a claim whose writer died. On x86-64, stores become visible to other
processes in program order, so no fence is needed; other architectures are not supported for
cross-process use.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..wire.constants import BEGIN_FLAG, DATA_HEADER_LENGTH, END_FLAG, HDR_TYPE_DATA, HDR_TYPE_PAD, UNFRAGMENTED
from ..wire.positions import (
    compute_position,
    index_by_term_count,
    max_payload_length,
    max_possible_position,
    pack_tail,
    tail_term_id,
    tail_term_offset,
    wrap_i32,
)
from .constants import PARTITION_COUNT
from .fastpath import FAST
from .layout import LogBuffers
from .results import ADMIN_ACTION, BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED, NOT_CONNECTED

_HEADER: Final = struct.Struct("<iBBHiiiiq")
_UNFRAGMENTED_DATA: Final = struct.pack("<BBH", 0, UNFRAGMENTED, HDR_TYPE_DATA)
"""Version, flags and type of a whole message's frame, as they sit in its header."""
_FRAMES: dict[int, struct.Struct] = {}
"""A whole frame with a payload of the key's length, packed in one call: length, version-flags-type,
term offset, the three stream ids, reserved value, payload (``bytes`` payloads only: ``s`` takes
nothing else). One entry per payload length in use, at most ``max_payload_length`` of them."""


_TAIL_INDEX: Final = 0  # tail counters start the metadata section


def _frame_struct(length: int) -> struct.Struct:
    frame = _FRAMES[length] = struct.Struct(f"<i4si12sq{length}s")
    return frame


def zero_buffer(view: memoryview) -> None:
    """Fill a writable buffer with zeros at memset speed (no temporary allocation)."""
    if len(view) == 0:
        return
    holder = (ctypes.c_char * len(view)).from_buffer(view)
    try:
        ctypes.memset(holder, 0, len(view))
    finally:
        del holder


Doorbell = tuple[memoryview, int, Callable[[], None]]
"""A flag in shared memory (view, index) that, when set after an append, calls for the callable: the
parked media driver's flag in cnc.dat (it has data to send), or the parked word of an IPC log's parking
table (subscribers wait on their doorbells, see ``layout``)."""


class BufferClaim:
    """A frame reserved by ``try_claim``: write the payload into ``buffer``, then ``commit`` or ``abort``.

    Until then, subscribers stop at this frame, so claims should be short-lived.
    """

    __slots__ = ("_bell", "_frame_length", "_offset", "_term", "_term_i32", "buffer")

    def __init__(self) -> None:
        self.buffer: memoryview = memoryview(b"")
        self._bell: Doorbell | None = None
        """Set by a publication's ``try_claim``: rung after the commit, as ``offer`` rings after its append."""
        self._term: memoryview | None = None
        self._term_i32: memoryview | None = None
        self._offset = 0
        self._frame_length = 0

    def _wrap(self, term: memoryview, term_i32: memoryview, offset: int, frame_length: int) -> None:
        self._term = term
        self._term_i32 = term_i32
        self._offset = offset
        self._frame_length = frame_length
        self.buffer = term[offset + DATA_HEADER_LENGTH : offset + frame_length]

    @property
    def reserved_value(self) -> int:
        """The claimed frame's 64-bit reserved value (readers see it as ``Header.reserved_value``)."""
        if self._term is None:
            raise RuntimeError("no frame is claimed")
        return int(struct.unpack_from("<q", self._term, self._offset + 24)[0])

    @reserved_value.setter
    def reserved_value(self, value: int) -> None:
        if self._term is None:
            raise RuntimeError("no frame is claimed")
        struct.pack_into("<q", self._term, self._offset + 24, value)

    def commit(self) -> None:
        """Publish the claimed frame to subscribers."""
        self._publish(HDR_TYPE_DATA)

    def abort(self) -> None:
        """Give the claimed space up: it becomes padding that subscribers skip."""
        self._publish(HDR_TYPE_PAD)

    def _publish(self, frame_type: int) -> None:
        term, term_i32 = self._term, self._term_i32
        if term is None or term_i32 is None:
            raise RuntimeError("no frame is claimed (already committed or aborted?)")
        if frame_type != HDR_TYPE_DATA:
            struct.pack_into("<H", term, self._offset + 6, frame_type)
        self.buffer.release()
        self.buffer = memoryview(b"")
        term_i32[self._offset >> 2] = self._frame_length
        self._term = self._term_i32 = None
        bell = self._bell
        if bell is not None:
            self._bell = None
            if bell[0][bell[1]]:
                bell[2]()


def unblock(log: LogBuffers, position: int) -> bool:
    """Pad the frame a publisher claimed at ``position`` but never committed, so readers get past it.

    A frame being written carries its length negated; a publisher that died (or closed) inside
    ``try_claim`` leaves it so, and subscribers stop there for good. Turning it into padding of the
    claimed length (type first, length last, as every frame is committed) lets them reach what follows
    and end of stream. False if there is no such claim at ``position``."""
    index = (position >> log.bits) % PARTITION_COUNT
    offset = position & (log.term_length - 1)
    term_i32 = log.terms_i32[index]
    frame_length = term_i32[offset >> 2]
    if frame_length >= 0 or -frame_length < DATA_HEADER_LENGTH or -frame_length > log.term_length - offset:
        return False
    log.terms[index][offset + 6] = HDR_TYPE_PAD
    log.terms[index][offset + 7] = 0
    term_i32[offset >> 2] = -frame_length
    return True


def _limit_cell() -> memoryview:
    """A private limit counter, zero until set."""
    return memoryview(bytearray(8)).cast("q")


def _nothing() -> None:
    return None


class _AppenderLogic:
    """The appender's behaviour, shared by the pure-Python class and the one over the C core.

    It holds no state of its own (empty ``__slots__``): the pure class keeps every field in slots, the
    fast class keeps the hot ones in ``_fastpath.AppenderCore`` whose ``offer``/``claim`` run the common
    case in C and call ``_py_offer``/``_py_claim`` here for everything else.
    """

    if not TYPE_CHECKING:  # mypy would refuse the assignments the subclasses' slots allow
        __slots__ = ()

    _active_index: int
    _bits: int
    _check_offset: int
    _clean_done: int
    _clean_index: int
    _closed: bool
    _ids: bytes
    _initial_term_id: int
    _limit_index: int
    _limit_values: memoryview
    _max_message_length: int
    _max_payload: int
    _max_position: int
    _owns_limit: bool
    _parked: memoryview | None
    _parked_index: int
    _session_id: int
    _start_term_count: int
    _stream_id: int
    _tail_i64: memoryview
    _term: memoryview
    _term_begin_position: int
    _term_i32: memoryview
    _term_id: int
    _term_id_shifted: int
    _term_length: int
    _term_offset: int
    _wake: Callable[[], None]
    log: LogBuffers

    def __init__(
        self, log: LogBuffers, limit: tuple[memoryview, int] | None = None, doorbell: Doorbell | None = None
    ) -> None:
        self.log = log
        self._owns_limit = limit is None
        self._limit_values, self._limit_index = limit if limit is not None else (_limit_cell(), 0)
        self._parked: memoryview | None = None
        self._parked_index = 0
        self._wake: Callable[[], None] = _nothing
        if doorbell is not None:
            self._parked, self._parked_index, self._wake = doorbell
        self._closed = False
        self._term_length = log.term_length
        self._bits = log.bits
        self._initial_term_id = log.initial_term_id
        self._session_id = log.session_id
        self._stream_id = log.stream_id
        self._max_payload = max_payload_length(log.mtu)
        self._max_message_length = log.max_message_length()
        self._max_position = max_possible_position(log.term_length)
        self._tail_i64 = log.meta_i64  # the three tail counters are its first three entries
        term_count = log.active_term_count
        self._start_term_count = term_count
        index = index_by_term_count(term_count)
        raw = log.raw_tail(index)
        self._set_term(index, tail_term_id(raw), tail_term_offset(raw, self._term_length))
        self._clean_index = (index + 1) % PARTITION_COUNT
        self._clean_done = self._term_length  # the next partition has never been written: it is zero
        self._check_offset = self._term_length

    def _set_term(self, index: int, term_id: int, term_offset: int) -> None:
        self._active_index = index
        self._term_id = term_id
        self._term_id_shifted = pack_tail(term_id, 0)
        self._ids = struct.pack("<iii", self._session_id, self._stream_id, term_id)
        self._term_offset = term_offset
        self._term = self.log.terms[index]
        self._term_i32 = self.log.terms_i32[index]
        self._term_begin_position = compute_position(term_id, 0, self._bits, self._initial_term_id)

    @property
    def position(self) -> int:
        """Position of the next byte to be appended."""
        return self._term_begin_position + self._term_offset

    @property
    def max_payload_length(self) -> int:
        return self._max_payload

    @property
    def max_message_length(self) -> int:
        return self._max_message_length

    def append(self, payload: bytes | bytearray | memoryview, limit: int, reserved_value: int = 0) -> int:
        """``offer`` below an explicit ``limit``: for an appender that owns its limit (no ``limit`` given
        at construction), as simulations and tests use it."""
        if not self._owns_limit:
            raise RuntimeError("this appender's limit is the driver's counter: use offer()")
        self._limit_values[0] = limit
        return self.offer(payload, reserved_value)

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one message (see ``_py_offer``); the concrete classes bind it to C or Python."""
        raise NotImplementedError

    def claim(self, length: int, limit: int, claim: BufferClaim) -> int:
        """Reserve one unfragmented frame (see ``_py_claim``); the concrete classes bind it to C or Python."""
        raise NotImplementedError

    def _py_offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one message if ``position < limit``; return the new position or a negative result code
        (NOT_CONNECTED, BACK_PRESSURED, ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED). Raises ValueError
        for a message above ``max_message_length``.

        The hot path of every publisher, so it reads the limit and rings the doorbell itself: one call."""
        length = len(payload)
        term_offset = self._term_offset
        position = self._term_begin_position + term_offset
        if position >= self._limit_values[self._limit_index]:
            return self._back_pressure_status(position, length)
        if length > self._max_payload:
            result = self._append_fragmented(payload, length, position, reserved_value)
            if result > 0 and self._parked is not None and self._parked[self._parked_index]:
                self._wake()
            return result
        frame_length = length + DATA_HEADER_LENGTH
        resulting = term_offset + ((frame_length + 31) & -32)
        if resulting > self._check_offset:
            if resulting > self._term_length:
                return self._end_of_term(term_offset, position)
            self._clean_ahead(resulting)
        term = self._term
        if type(payload) is bytes:  # header and payload in one call: the small-message hot path
            (_FRAMES.get(length) or _frame_struct(length)).pack_into(
                term, term_offset, -frame_length, _UNFRAGMENTED_DATA, term_offset, self._ids, reserved_value, payload
            )
        else:
            _HEADER.pack_into(
                term,
                term_offset,
                -frame_length,
                0,
                UNFRAGMENTED,
                HDR_TYPE_DATA,
                term_offset,
                self._session_id,
                self._stream_id,
                self._term_id,
                reserved_value,
            )
            term[term_offset + DATA_HEADER_LENGTH : term_offset + frame_length] = payload
        self._term_i32[term_offset >> 2] = frame_length
        self._term_offset = resulting
        self._tail_i64[self._active_index] = self._term_id_shifted | resulting
        if self._parked is not None and self._parked[self._parked_index]:
            self._wake()
        return position + resulting - term_offset

    def close(self) -> None:
        """Refuse every later offer and claim with CLOSED (they find the limit at 0 and ask why)."""
        self._closed = True
        self._limit_values, self._limit_index = _limit_cell(), 0
        self._owns_limit = False

    def _py_claim(self, length: int, limit: int, claim: BufferClaim) -> int:
        """Reserve one unfragmented frame of ``length`` payload bytes for zero-copy writing."""
        if length > self._max_payload or length < 0:
            raise ValueError(f"claim length {length} outside [0, {self._max_payload}] (max payload of one frame)")
        term_offset = self._term_offset
        position = self._term_begin_position + term_offset
        if position >= limit:
            return self._back_pressure_status(position, length)
        frame_length = length + DATA_HEADER_LENGTH
        resulting = term_offset + ((frame_length + 31) & -32)
        if resulting > self._check_offset:
            if resulting > self._term_length:
                return self._end_of_term(term_offset, position)
            self._clean_ahead(resulting)
        _HEADER.pack_into(
            self._term,
            term_offset,
            -frame_length,
            0,
            UNFRAGMENTED,
            HDR_TYPE_DATA,
            term_offset,
            self._session_id,
            self._stream_id,
            self._term_id,
            0,
        )
        claim._wrap(self._term, self._term_i32, term_offset, frame_length)
        self._term_offset = resulting
        self._tail_i64[self._active_index] = self._term_id_shifted | resulting
        return position + resulting - term_offset

    def _append_fragmented(
        self, payload: bytes | bytearray | memoryview, length: int, position: int, reserved_value: int
    ) -> int:
        if length > self._max_message_length:
            raise ValueError(f"message of {length} bytes exceeds the maximum message length {self._max_message_length}")
        max_payload = self._max_payload
        full_frames, last = divmod(length, max_payload)
        frame_step = (max_payload + DATA_HEADER_LENGTH + 31) & -32
        required = full_frames * frame_step + ((last + DATA_HEADER_LENGTH + 31) & -32 if last else 0)
        term_offset = self._term_offset
        if term_offset + required > self._check_offset:
            if term_offset + required > self._term_length:
                return self._end_of_term(term_offset, position)
            self._clean_ahead(term_offset + required)
        src = memoryview(payload).cast("B")
        term, term_i32 = self._term, self._term_i32
        offset = term_offset
        consumed = 0
        flags = BEGIN_FLAG
        while consumed < length:
            chunk = min(max_payload, length - consumed)
            if consumed + chunk == length:
                flags |= END_FLAG
            frame_length = chunk + DATA_HEADER_LENGTH
            _HEADER.pack_into(
                term,
                offset,
                -frame_length,
                0,
                flags,
                HDR_TYPE_DATA,
                offset,
                self._session_id,
                self._stream_id,
                self._term_id,
                reserved_value,
            )
            term[offset + DATA_HEADER_LENGTH : offset + frame_length] = src[consumed : consumed + chunk]
            term_i32[offset >> 2] = frame_length
            consumed += chunk
            offset += (frame_length + 31) & -32
            flags = 0
        self._term_offset = offset
        self._tail_i64[self._active_index] = self._term_id_shifted | offset
        return position + offset - term_offset

    def _end_of_term(self, term_offset: int, position: int) -> int:
        """Pad the rest of the term and rotate to the next one; the caller retries (ADMIN_ACTION)."""
        term_length = self._term_length
        if position - term_offset + term_length >= self._max_position:
            return MAX_POSITION_EXCEEDED
        self._clean_ahead(term_length)
        if term_offset < term_length:
            pad_length = term_length - term_offset
            _HEADER.pack_into(
                self._term,
                term_offset,
                -pad_length,
                0,
                UNFRAGMENTED,
                HDR_TYPE_PAD,
                term_offset,
                self._session_id,
                self._stream_id,
                self._term_id,
                0,
            )
            self._term_i32[term_offset >> 2] = pad_length
            self._tail_i64[self._active_index] = self._term_id_shifted | term_length
        next_index = (self._active_index + 1) % PARTITION_COUNT
        next_term_id = wrap_i32(self._term_id + 1)
        term_count = self.log.active_term_count + 1
        self._tail_i64[next_index] = pack_tail(next_term_id, 0)
        self.log.active_term_count = term_count
        self._set_term(next_index, next_term_id, 0)
        self._prepare_next_partition(term_count)
        return ADMIN_ACTION

    def _prepare_next_partition(self, term_count: int) -> None:
        """Plan the cleaning of the partition the term after ``term_count`` will use.

        Readers in other processes move into the next term the moment the current one is complete
        (a pad, or a frame ending exactly at the term's end), possibly before the publisher appends
        again; so the next partition must be clean by then. It last held the term three back, which
        every reader has left once the publisher is in ``term_count`` (readers lag by at most half a
        term). It is zeroed in chunks as the current term fills (``_clean_ahead``), finishing by its
        middle, so no single offer pays for a whole term. A partition not written since the log
        was created is still zero and is left alone (no pages faulted in).
        """
        self._clean_index = (term_count + 1) % PARTITION_COUNT
        if term_count + 1 - self._start_term_count >= PARTITION_COUNT:
            self._clean_done = 0
            self._check_offset = 0
        else:
            self._clean_done = self._check_offset = self._term_length

    def _clean_ahead(self, resulting: int) -> None:
        """Zero more of the next partition: at least twice ``resulting``, in chunks of 1/64 term."""
        term_length = self._term_length
        start = self._clean_done
        target = min(term_length, max(2 * resulting, start + max(65536, term_length >> 6)))
        if target > start:
            zero_buffer(self.log.terms[self._clean_index][start:target])
            self._clean_done = target
        self._check_offset = term_length if target >= term_length else target >> 1

    def _back_pressure_status(self, position: int, length: int) -> int:
        if self._closed:
            return CLOSED
        if length > self._max_message_length:
            raise ValueError(f"message of {length} bytes exceeds the maximum message length {self._max_message_length}")
        if position + ((length + DATA_HEADER_LENGTH + 31) & -32) >= self._max_position:
            return MAX_POSITION_EXCEEDED
        return BACK_PRESSURED if self.log.is_connected else NOT_CONNECTED


_SLOTS: Final = (
    "_active_index",
    "_bits",
    "_check_offset",
    "_clean_done",
    "_clean_index",
    "_closed",
    "_ids",
    "_initial_term_id",
    "_limit_index",
    "_limit_values",
    "_max_message_length",
    "_max_payload",
    "_max_position",
    "_owns_limit",
    "_parked",
    "_parked_index",
    "_session_id",
    "_start_term_count",
    "_stream_id",
    "_tail_i64",
    "_term",
    "_term_begin_position",
    "_term_i32",
    "_term_id",
    "_term_id_shifted",
    "_term_length",
    "_term_offset",
    "_wake",
    "log",
)


class PyExclusiveAppender(_AppenderLogic):
    """Single-writer appender over a ``LogBuffers``, all in Python: the reference the C path is tested against.

    ``offer`` appends below a limit it reads from ``limit`` (a view and an index: the publication
    limit counter the driver keeps), or from a cell of its own that ``append(payload, limit)`` sets,
    for simulations and tests. Once ``close``d, every call returns CLOSED.
    """

    __slots__ = _SLOTS
    offer = _AppenderLogic._py_offer
    claim = _AppenderLogic._py_claim


if FAST is not None:
    _Core: Any = FAST.AppenderCore

    class FastExclusiveAppender(_Core, _AppenderLogic):  # type: ignore[misc]
        """The same appender with its hot state in C: ``offer`` and ``claim`` run the common case there."""

        __slots__ = tuple(name for name in _SLOTS if not hasattr(_Core, name))

    ExclusiveAppender: type[PyExclusiveAppender] = FastExclusiveAppender
else:
    ExclusiveAppender = PyExclusiveAppender
"""The appender in use: over the C core when the fast path is active, else the pure-Python one."""
