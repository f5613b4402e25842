"""The log buffer: three term partitions followed by a metadata section, over any writable buffer.

Same layout as Aeron's ``.logbuffer`` files, so a log written by one process can be mapped and read
by another. Integer fields are little-endian; 8-byte fields are 8-byte aligned so that a single
store is atomic on x86-64, which is what cross-process readers rely on.
"""

from __future__ import annotations

import struct
from typing import Final

from ..wire.constants import DATA_HEADER_LENGTH, HDR_TYPE_DATA, UNFRAGMENTED
from ..wire.positions import (
    align,
    check_mtu,
    check_term_length,
    index_by_term_count,
    max_message_length,
    pack_tail,
    position_bits_to_shift,
    raw_tail_position,
    wrap_i32,
)
from .constants import LOG_META_DATA_LENGTH, PAGE_SIZE_DEFAULT, PARTITION_COUNT

# Metadata field offsets (relative to the metadata section).
TAIL_COUNTERS_OFFSET: Final = 0
ACTIVE_TERM_COUNT_OFFSET: Final = 24
END_OF_STREAM_POSITION_OFFSET: Final = 128
IS_CONNECTED_OFFSET: Final = 136
ACTIVE_TRANSPORT_COUNT_OFFSET: Final = 140
PARKED_WORD_OFFSET: Final = 144
"""Eight parked bytes, one per parking slot, in one 8-byte word: a writer asks "is anyone parked?" with
one aligned 8-byte read after each append. Byte ``i`` is written only by the subscriber that owns slot ``i``."""
DOORBELL_NUMBERS_OFFSET: Final = 152
"""Eight int64 doorbell numbers, one per parking slot (0: none): whom a writer rings when byte ``i`` is set."""
PARKING_SLOTS: Final = 8
"""Subscribers of one log that may park on a doorbell; others fall back to a timed back-off."""
PARKED_WORD_INDEX: Final = PARKED_WORD_OFFSET >> 3
"""Index of the parked word in ``LogBuffers.meta_i64``."""
DOORBELL_NUMBERS_INDEX: Final = DOORBELL_NUMBERS_OFFSET >> 3
"""Index of slot 0's doorbell number in ``LogBuffers.meta_i64``."""
CORRELATION_ID_OFFSET: Final = 256
INITIAL_TERM_ID_OFFSET: Final = 264
DEFAULT_FRAME_HEADER_LENGTH_OFFSET: Final = 268
MTU_LENGTH_OFFSET: Final = 272
TERM_LENGTH_OFFSET: Final = 276
PAGE_SIZE_OFFSET: Final = 280
PUBLICATION_WINDOW_OFFSET: Final = 284
RECEIVER_WINDOW_OFFSET: Final = 288
DEFAULT_FRAME_HEADER_OFFSET: Final = 320
DEFAULT_FRAME_HEADER_MAX_LENGTH: Final = 128
LINGER_NS_OFFSET: Final = 464
RELIABLE_OFFSET: Final = 491
SIGNAL_EOS_OFFSET: Final = 493

MAX_POSITION: Final = (1 << 63) - 1
"""End-of-stream position while the stream is open."""

_I32 = struct.Struct("<i")
_DEFAULT_HEADER = struct.Struct("<iBBHiiiiq")


class LogBufferError(ValueError):
    """A buffer too small or a metadata section that does not describe a valid log."""


def compute_log_length(term_length: int, page_size: int = PAGE_SIZE_DEFAULT) -> int:
    """Total bytes of a log: three terms plus metadata, rounded up to the page size."""
    return align(PARTITION_COUNT * term_length + LOG_META_DATA_LENGTH, page_size)


class LogBuffers:
    """Views over the partitions and metadata of a log held in ``buffer``.

    The caller owns the buffer (usually an ``mmap``); ``close`` releases the views so the
    mapping can be closed. A read-only buffer is fine for readers; writing methods then raise.
    """

    __slots__ = (
        "_buffer",
        "_meta",
        "_meta_i32",
        "bits",
        "initial_term_id",
        "meta_i64",
        "mtu",
        "term_length",
        "terms",
        "terms_i32",
    )

    def __init__(self, buffer: memoryview | bytearray, term_length: int | None = None) -> None:
        view = memoryview(buffer)
        if len(view) < 3 * 65536 + LOG_META_DATA_LENGTH:
            raise LogBufferError(f"buffer of {len(view)} bytes is too small for a log")
        self._buffer = view
        if term_length is None:
            term_length = _find_term_length(view)
        check_term_length(term_length)
        meta_offset = PARTITION_COUNT * term_length
        if meta_offset + LOG_META_DATA_LENGTH > len(view):
            raise LogBufferError("buffer is shorter than three terms plus metadata")
        self.term_length = term_length
        self.bits = position_bits_to_shift(term_length)
        self.terms = tuple(view[i * term_length : (i + 1) * term_length] for i in range(PARTITION_COUNT))
        self.terms_i32 = tuple(t.cast("i") for t in self.terms)
        self._meta = view[meta_offset : meta_offset + LOG_META_DATA_LENGTH]
        self._meta_i32 = self._meta.cast("i")
        self.meta_i64 = self._meta.cast("q")
        self.initial_term_id = self._meta_i32[INITIAL_TERM_ID_OFFSET >> 2]
        self.mtu = self._meta_i32[MTU_LENGTH_OFFSET >> 2]

    # -- set-up ---------------------------------------------------------------------------------

    def initialize(
        self,
        *,
        initial_term_id: int,
        session_id: int,
        stream_id: int,
        mtu: int,
        correlation_id: int = 0,
        page_size: int = PAGE_SIZE_DEFAULT,
        term_id: int | None = None,
        term_offset: int = 0,
        publication_window: int | None = None,
        receiver_window: int = 0,
        linger_ns: int = 0,
        reliable: bool = True,
        signal_eos: bool = True,
    ) -> None:
        """Write fresh metadata: tails, default header and configuration, starting at (term_id, term_offset)."""
        check_mtu(mtu)
        term_length = self.term_length
        if term_offset < 0 or term_offset >= term_length or term_offset % 32:
            raise LogBufferError(f"term offset must be 32-aligned in [0, {term_length}): {term_offset}")
        if term_id is None:
            term_id = initial_term_id
        meta = self._meta
        meta[:] = bytes(LOG_META_DATA_LENGTH)
        term_count = wrap_i32(term_id - initial_term_id)
        if term_count < 0:
            raise LogBufferError("term id must not precede the initial term id")
        active_index = index_by_term_count(term_count)
        for i in range(PARTITION_COUNT):
            # Partition i holds term_id + k where k is how far ahead or behind the active index it is.
            delta = (i - active_index) % PARTITION_COUNT
            tid = term_id + delta - PARTITION_COUNT if delta else term_id
            offset = term_offset if i == active_index else 0
            self.meta_i64[(TAIL_COUNTERS_OFFSET >> 3) + i] = pack_tail(wrap_i32(tid), offset)
        self._meta_i32[ACTIVE_TERM_COUNT_OFFSET >> 2] = term_count
        self.meta_i64[END_OF_STREAM_POSITION_OFFSET >> 3] = MAX_POSITION
        self.meta_i64[CORRELATION_ID_OFFSET >> 3] = correlation_id
        self._meta_i32[INITIAL_TERM_ID_OFFSET >> 2] = initial_term_id
        self._meta_i32[DEFAULT_FRAME_HEADER_LENGTH_OFFSET >> 2] = DATA_HEADER_LENGTH
        self._meta_i32[MTU_LENGTH_OFFSET >> 2] = mtu
        self._meta_i32[TERM_LENGTH_OFFSET >> 2] = term_length
        self._meta_i32[PAGE_SIZE_OFFSET >> 2] = page_size
        window = term_length // 2 if publication_window is None else min(publication_window, term_length // 2)
        self._meta_i32[PUBLICATION_WINDOW_OFFSET >> 2] = window
        self._meta_i32[RECEIVER_WINDOW_OFFSET >> 2] = receiver_window
        self.meta_i64[LINGER_NS_OFFSET >> 3] = linger_ns
        meta[RELIABLE_OFFSET] = 1 if reliable else 0
        meta[SIGNAL_EOS_OFFSET] = 1 if signal_eos else 0
        _DEFAULT_HEADER.pack_into(
            meta,
            DEFAULT_FRAME_HEADER_OFFSET,
            0,
            0,
            UNFRAGMENTED,
            HDR_TYPE_DATA,
            0,
            session_id,
            stream_id,
            initial_term_id,
            0,
        )
        self.initial_term_id = initial_term_id
        self.mtu = mtu

    def validate(self) -> None:
        """Check that the metadata describes this buffer; raise LogBufferError if not (untrusted files)."""
        if self._meta_i32[TERM_LENGTH_OFFSET >> 2] != self.term_length:
            raise LogBufferError("metadata term length does not match the buffer")
        if self._meta_i32[DEFAULT_FRAME_HEADER_LENGTH_OFFSET >> 2] != DATA_HEADER_LENGTH:
            raise LogBufferError("metadata frame header length is not 32")
        try:
            check_mtu(self._meta_i32[MTU_LENGTH_OFFSET >> 2])
        except ValueError as exc:
            raise LogBufferError(str(exc)) from None

    # -- metadata accessors ---------------------------------------------------------------------

    @property
    def session_id(self) -> int:
        return int(self._meta_i32[(DEFAULT_FRAME_HEADER_OFFSET + 12) >> 2])

    @property
    def stream_id(self) -> int:
        return int(self._meta_i32[(DEFAULT_FRAME_HEADER_OFFSET + 16) >> 2])

    @property
    def correlation_id(self) -> int:
        return int(self.meta_i64[CORRELATION_ID_OFFSET >> 3])

    @property
    def publication_window(self) -> int:
        return int(self._meta_i32[PUBLICATION_WINDOW_OFFSET >> 2])

    def raw_tail(self, index: int) -> int:
        return int(self.meta_i64[(TAIL_COUNTERS_OFFSET >> 3) + index])

    def set_raw_tail(self, index: int, value: int) -> None:
        self.meta_i64[(TAIL_COUNTERS_OFFSET >> 3) + index] = value

    @property
    def active_term_count(self) -> int:
        return int(self._meta_i32[ACTIVE_TERM_COUNT_OFFSET >> 2])

    @active_term_count.setter
    def active_term_count(self, value: int) -> None:
        self._meta_i32[ACTIVE_TERM_COUNT_OFFSET >> 2] = value

    @property
    def end_of_stream_position(self) -> int:
        return int(self.meta_i64[END_OF_STREAM_POSITION_OFFSET >> 3])

    @end_of_stream_position.setter
    def end_of_stream_position(self, value: int) -> None:
        self.meta_i64[END_OF_STREAM_POSITION_OFFSET >> 3] = value

    @property
    def is_connected(self) -> bool:
        return bool(self._meta_i32[IS_CONNECTED_OFFSET >> 2])

    @is_connected.setter
    def is_connected(self, value: bool) -> None:
        self._meta_i32[IS_CONNECTED_OFFSET >> 2] = 1 if value else 0

    @property
    def active_transport_count(self) -> int:
        return int(self._meta_i32[ACTIVE_TRANSPORT_COUNT_OFFSET >> 2])

    @active_transport_count.setter
    def active_transport_count(self, value: int) -> None:
        self._meta_i32[ACTIVE_TRANSPORT_COUNT_OFFSET >> 2] = value

    # -- parking slots (a doorbell per parked subscriber) -------------------------------------------

    def parked_word(self) -> int:
        """The eight parked bytes as one word: nonzero when some subscriber waits for a ring."""
        return int(self.meta_i64[PARKED_WORD_INDEX])

    def is_parked(self, slot: int) -> bool:
        return bool(self._meta[PARKED_WORD_OFFSET + slot])

    def set_parked(self, slot: int, parked: bool) -> None:
        """One byte store: each slot's byte has a single writer, so no read-modify-write of the word."""
        _check_slot(slot)
        self._meta[PARKED_WORD_OFFSET + slot] = 1 if parked else 0

    def doorbell_number(self, slot: int) -> int:
        return int(self.meta_i64[DOORBELL_NUMBERS_INDEX + slot])

    def set_doorbell_number(self, slot: int, number: int) -> None:
        _check_slot(slot)
        self.meta_i64[DOORBELL_NUMBERS_INDEX + slot] = number

    def producer_position(self) -> int:
        """Position just after the last frame appended, read from the active tail counter (the counter's index
        read in place: :attr:`active_term_count` and :meth:`raw_tail` are a frame each, and the driver asks this
        on every cycle that moved a publisher's limit)."""
        term_count = int(self._meta_i32[ACTIVE_TERM_COUNT_OFFSET >> 2])
        raw = int(self.meta_i64[(TAIL_COUNTERS_OFFSET >> 3) + term_count % PARTITION_COUNT])  # (index_by_term_count)
        return raw_tail_position(raw, self.term_length, self.bits, self.initial_term_id)

    def default_header(self) -> bytes:
        return bytes(self._meta[DEFAULT_FRAME_HEADER_OFFSET : DEFAULT_FRAME_HEADER_OFFSET + DATA_HEADER_LENGTH])

    def max_message_length(self) -> int:
        return max_message_length(self.term_length)

    def close(self) -> None:
        """Release every view so the underlying mapping can be closed."""
        for v in (*self.terms_i32, *self.terms, self.meta_i64, self._meta_i32, self._meta, self._buffer):
            v.release()


def _check_slot(slot: int) -> None:
    if not 0 <= slot < PARKING_SLOTS:
        raise IndexError(f"parking slot {slot} outside [0, {PARKING_SLOTS})")


def _find_term_length(view: memoryview) -> int:
    """Term length of a log whose size is all we know: the terms fill it up to the metadata."""
    term_length = (len(view) - LOG_META_DATA_LENGTH) // PARTITION_COUNT
    stored = _I32.unpack_from(view, PARTITION_COUNT * term_length + TERM_LENGTH_OFFSET)[0]
    if stored != term_length:
        raise LogBufferError(f"log of {len(view)} bytes does not hold its term length in its metadata")
    return term_length
