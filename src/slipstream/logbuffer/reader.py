"""Reading frames out of a term: the subscriber's side of the log.

The reader trusts nothing in the buffer: a frame length that is too small, runs past the term or
an unknown frame type stops the read and is reported, instead of raising or reading out of bounds.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

from ..wire.constants import DATA_HEADER_LENGTH, HDR_TYPE_DATA, HDR_TYPE_PAD, TYPE_OFFSET
from .header import Header

FragmentHandler = Callable[[memoryview, Header], object]
"""Called with a zero-copy view of the payload (valid only during the call) and the frame's header."""


_RUN_MAX = 256
"""Frames checked by one unpack in ``read_term`` (a struct per run length is compiled and cached)."""


@functools.lru_cache(maxsize=256)
def _equal_frames_struct(aligned: int, count: int) -> struct.Struct:
    """frame_length and type of ``count`` frames each occupying ``aligned`` bytes, in one unpack
    (``read_term``, ``scan_term`` and a sender's ``is_equal_run`` share these)."""
    return struct.Struct("<" + f"i2xH{aligned - TYPE_OFFSET - 2}x" * count)


def read_term(
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


def is_equal_run(term: memoryview, offset: int, frame_length: int, count: int) -> bool:
    """Whether the ``count`` frames from ``offset`` are all complete DATA frames of ``frame_length``
    bytes (so a sender may cut them into datagrams by arithmetic). One unpack; the caller keeps
    ``count`` to a few values per frame size, as each compiles a struct that is cached."""
    aligned = (frame_length + 31) & -32
    if count < 1 or frame_length < DATA_HEADER_LENGTH or offset + count * aligned > len(term):
        return False
    fields = _equal_frames_struct(aligned, count).unpack_from(term, offset)
    return fields[0::2].count(frame_length) == count and fields[1::2].count(HDR_TYPE_DATA) == count


def scan_term(term: memoryview, term_i32: memoryview, offset: int, max_length: int) -> tuple[int, int]:
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
