"""Reading frames out of a term: the subscriber's side of the log.

The reader trusts nothing in the buffer: a frame length that is too small, runs past the term or
an unknown frame type stops the read and is reported, instead of raising or reading out of bounds.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

from ..wire.constants import DATA_HEADER_LENGTH, HDR_TYPE_DATA, HDR_TYPE_PAD, TYPE_OFFSET
from .fastpath import FAST
from .header import Header

FragmentHandler = Callable[[memoryview, Header], object]
"""Called with a zero-copy view of the payload (valid only during the call) and the frame's header."""

BlockHandler = Callable[[memoryview, int, int], object]
"""Called by a block poll with a view of a run of whole frames (headers included, each at a 32-byte aligned
offset from the view's start; valid only during the call), the session id and the term id: Aeron's
``BlockHandler``. One call per block, so a consumer that takes many messages at once pays the call once."""


_RUN_MAX = 256
"""Frames checked by one unpack in ``read_term`` (a struct per run length is compiled and cached)."""


@functools.lru_cache(maxsize=256)
def _equal_frames_struct(aligned: int, count: int) -> struct.Struct:
    """frame_length and type of ``count`` frames each occupying ``aligned`` bytes, in one unpack
    (``read_term``, ``scan_term`` and a sender's ``is_equal_run`` share these)."""
    return struct.Struct("<" + f"i2xH{aligned - TYPE_OFFSET - 2}x" * count)


def py_read_term(
    term: memoryview,
    term_i32: memoryview,
    offset: int,
    handler: FragmentHandler,
    fragment_limit: int,
    header: Header,
) -> tuple[int, int, bool]:
    """Deliver up to ``fragment_limit`` DATA frames from ``offset``; skip padding.

    Returns ``(fragments_delivered, next_offset, intact)``. ``intact`` is False when the frame at
    ``next_offset`` cannot be valid; the caller decides what to do with the image. If the handler
    raises, ``header.offset`` still points at the frame it was given.

    When the frames ahead are all complete DATA frames of one length (a busy stream of same-sized
    messages), one unpack checks them and the loop only hands them out.
    """
    capacity = len(term)
    fragments = 0
    header.buffer = term
    while fragment_limit - fragments > 1 and offset < capacity:
        first = term_i32[offset >> 2]
        aligned = (first + 31) & -32
        if first < DATA_HEADER_LENGTH or offset + aligned >= capacity or term_i32[(offset + aligned) >> 2] != first:
            break  # not a run (a lone frame, the latency case, costs no unpack)
        count = min(fragment_limit - fragments, (capacity - offset) // aligned, _RUN_MAX)
        fields = _equal_frames_struct(aligned, count).unpack_from(term, offset)
        if fields[0::2].count(first) != count or fields[1::2].count(HDR_TYPE_DATA) != count:
            break
        end = offset + count * aligned
        for frame_offset in range(offset, end, aligned):
            header.offset = frame_offset
            handler(term[frame_offset + DATA_HEADER_LENGTH : frame_offset + first], header)
        fragments += count
        offset = end
    while fragments < fragment_limit and offset < capacity:
        frame_length = term_i32[offset >> 2]
        if frame_length <= 0:
            break
        frame_offset = offset
        if frame_length < DATA_HEADER_LENGTH or frame_length > capacity - frame_offset:
            return fragments, frame_offset, False
        offset += (frame_length + 31) & -32
        frame_type = term[frame_offset + TYPE_OFFSET]
        if frame_type != HDR_TYPE_DATA:
            if frame_type == HDR_TYPE_PAD and term[frame_offset + TYPE_OFFSET + 1] == 0:
                continue
            return fragments, frame_offset, False
        fragments += 1
        header.offset = frame_offset
        handler(term[frame_offset + DATA_HEADER_LENGTH : frame_offset + frame_length], header)
    return fragments, offset, True


def py_is_equal_run(term: memoryview, offset: int, frame_length: int, count: int) -> bool:
    """Whether the ``count`` frames from ``offset`` are all complete DATA frames of ``frame_length``
    bytes (so a sender may cut them into datagrams by arithmetic). One unpack; the caller keeps
    ``count`` to a few values per frame size, as each compiles a struct that is cached."""
    aligned = (frame_length + 31) & -32
    if count < 1 or frame_length < DATA_HEADER_LENGTH or offset + count * aligned > len(term):
        return False
    fields = _equal_frames_struct(aligned, count).unpack_from(term, offset)
    return fields[0::2].count(frame_length) == count and fields[1::2].count(HDR_TYPE_DATA) == count


def py_scan_term(term: memoryview, term_i32: memoryview, offset: int, max_length: int) -> tuple[int, int]:
    """Find the block a sender may transmit in one datagram.

    Returns ``(available, padding)``: ``available`` bytes of whole frames from ``offset`` fitting in
    ``max_length``; if a PAD frame ends the block, only its header is counted in ``available`` and the
    rest of it in ``padding`` (consumed but never sent).

    A run of equal DATA frames (a stream of same-sized messages) is checked in one unpack rather
    than frame by frame; the walk then goes on from its end.
    """
    capacity = len(term)
    available = 0
    padding = 0
    first = term_i32[offset >> 2] if offset < capacity else 0
    if first >= DATA_HEADER_LENGTH:
        aligned = (first + 31) & -32
        count = min(min(max_length, capacity - offset) // aligned, _RUN_MAX)
        if count > 1 and term_i32[(offset + aligned) >> 2] == first:
            fields = _equal_frames_struct(aligned, count).unpack_from(term, offset)
            if fields[0::2].count(first) == count and fields[1::2].count(HDR_TYPE_DATA) == count:
                available = count * aligned
    while offset + available < capacity:
        frame_offset = offset + available
        frame_length = term_i32[frame_offset >> 2]
        if frame_length <= 0 or frame_length > capacity - frame_offset:
            break
        aligned = (frame_length + 31) & -32
        if term[frame_offset + TYPE_OFFSET] == HDR_TYPE_PAD:
            padding = aligned - DATA_HEADER_LENGTH
            aligned = DATA_HEADER_LENGTH
        if available + aligned > max_length:
            padding = 0
            break
        available += aligned
        if padding:
            break
    return available, padding


def py_scan_block(term: memoryview, term_i32: memoryview, offset: int, max_length: int) -> tuple[int, int, bool]:
    """Find the run of whole DATA frames from ``offset`` (at most ``max_length`` bytes) a block poll hands out.

    Returns ``(data_end, next_offset, intact)``: the block is ``term[offset:data_end]``; ``next_offset``
    is where the reader goes on (past a PAD frame that starts the block, which is skipped without a
    handler call); ``intact`` is False when the frame at ``data_end`` cannot be valid. A first frame
    longer than ``max_length`` is still taken whole, so a block poll always makes progress.
    """
    if offset < 0 or max_length < 0:
        raise ValueError("offset and max_length must not be negative")
    capacity = len(term)
    limit = min(capacity, offset + max_length)
    end = offset
    while end < limit:
        frame_length = term_i32[end >> 2]
        if frame_length <= 0:
            break
        if frame_length < DATA_HEADER_LENGTH or frame_length > capacity - end:
            return end, end, False
        aligned = (frame_length + 31) & -32
        frame_type = term[end + TYPE_OFFSET]
        if frame_type != HDR_TYPE_DATA:
            if frame_type == HDR_TYPE_PAD and term[end + TYPE_OFFSET + 1] == 0:
                return end, (end + aligned if end == offset else end), True
            return end, end, False
        if end + aligned > limit and end > offset:
            break
        end += aligned
    return end, end, True


def block_frames(block: memoryview) -> list[tuple[int, int]]:
    """``(payload_offset, payload_length)`` of each frame in a block a ``BlockHandler`` was given.

    A helper for consumers that want the messages after all; the block poll guarantees whole DATA frames."""
    frames = []
    offset = 0
    end = len(block)
    while offset + DATA_HEADER_LENGTH <= end:
        frame_length = int.from_bytes(block[offset : offset + 4], "little", signed=True)
        if frame_length < DATA_HEADER_LENGTH or frame_length > end - offset:
            break
        frames.append((offset + DATA_HEADER_LENGTH, frame_length - DATA_HEADER_LENGTH))
        offset += (frame_length + 31) & -32
    return frames


ReadTerm = Callable[[memoryview, memoryview, int, FragmentHandler, int, Header], tuple[int, int, bool]]
ScanBlock = Callable[[memoryview, memoryview, int, int], tuple[int, int, bool]]

read_term: ReadTerm = FAST.read_term if FAST is not None else py_read_term
"""The term reader in use: C when the fast path is active, else ``py_read_term`` (the reference)."""
scan_block: ScanBlock = FAST.scan_block if FAST is not None else py_scan_block
"""The block scanner in use: C when the fast path is active, else ``py_scan_block`` (the reference)."""
scan_term: Callable[[memoryview, memoryview, int, int], tuple[int, int]] = (
    FAST.scan_term if FAST is not None else py_scan_term
)
"""The sender's log scan in use: C when the fast path is active, else ``py_scan_term`` (the reference)."""
is_equal_run: Callable[[memoryview, int, int, int], bool] = FAST.is_equal_run if FAST is not None else py_is_equal_run
"""The equal-run check in use: C when the fast path is active, else ``py_is_equal_run`` (the reference)."""
