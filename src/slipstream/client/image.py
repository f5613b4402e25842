"""Images: one publisher's stream as one subscription sees it, read straight from shared memory."""

from __future__ import annotations

import mmap
from collections.abc import Callable

from ..files.directory import close_mapping
from ..logbuffer import FragmentHandler, Header, LogBuffers, read_term, scan_term
from ..wire.constants import DATA_HEADER_LENGTH, HDR_TYPE_DATA
from ..wire.positions import compute_term_id

_BLOCK_RUN_MAX = 4096


def _equal_run(term_i32: memoryview, base: int, step: int, first: int, limit: int) -> int:
    """How many DATA frames of length ``first``, with equal flags, start at word ``base`` (at most
    ``limit``): two strided slices of the term, no call per frame. Stops at the first frame not yet
    written (length 0) or different."""
    count = min(limit, _BLOCK_RUN_MAX)
    if count < 2 or first < DATA_HEADER_LENGTH:
        return 0
    lengths = term_i32[base : base + count * step : step].tolist()
    if lengths.count(first) != count:
        count = next((i for i, value in enumerate(lengths) if value != first), len(lengths))
        if count < 2:
            return 0
    words = term_i32[base + 1 : base + 1 + count * step : step].tolist()  # version, flags, type (u16)
    if words.count(words[0]) != count or (words[0] >> 16) & 0xFFFF != HDR_TYPE_DATA:
        return 0
    return count


BlockHandler = Callable[[memoryview, int, int, int, int], object]
"""Aeron's block handler: ``(term_buffer, term_offset, length, session_id, term_id)``; the frames of
``term_buffer[term_offset : term_offset + length]`` are whole (headers included), valid during the call."""


class Image:
    """Replicated stream of one publisher session. ``poll`` delivers fragments from the log and
    publishes this subscriber's position, which is what lets the publisher move on."""

    def __init__(
        self,
        *,
        subscription_registration_id: int,
        correlation_id: int,
        session_id: int,
        stream_id: int,
        source_identity: str,
        mapping: mmap.mmap,
        position_values: memoryview,
        position_index: int,
        join_position: int,
    ) -> None:
        self.subscription_registration_id = subscription_registration_id
        self.correlation_id = correlation_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.source_identity = source_identity
        self.join_position = join_position
        self._mapping = mapping
        self._log = LogBuffers(memoryview(mapping))
        self._terms = self._log.terms
        self._terms_i32 = self._log.terms_i32
        self._bits = self._log.bits
        self._mask = self._log.term_length - 1
        self._initial_term_id = self._log.initial_term_id
        self._header = Header(self._log.initial_term_id, self._bits)
        self._values = position_values
        self._index = position_index
        self._position = join_position
        self._closed = False
        self.is_corrupt = False
        """Set when the log held a frame that cannot be valid; the image then delivers nothing more."""

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Deliver up to ``fragment_limit`` fragments to ``handler``; returns how many.

        If the handler raises, the fragments before it and the failing one count as consumed (they
        are not delivered again) and the exception propagates.
        """
        if self._closed:
            return 0
        position = self._position
        offset = position & self._mask
        index = (position >> self._bits) % 3
        header = self._header
        try:
            fragments, next_offset, intact = read_term(
                self._terms[index], self._terms_i32[index], offset, handler, fragment_limit, header
            )
        except BaseException:
            failed_end = header.offset + ((header.frame_length + 31) & -32)
            self._advance(position + failed_end - offset)
            raise
        if next_offset != offset:
            self._advance(position + next_offset - offset)
        if not intact:
            self.is_corrupt = True
            self._closed = True
        return fragments

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        """Deliver the whole frames available from this image's position, up to ``block_length_limit``
        bytes (or the first frame, if longer) and the end of the term, to ``handler`` in one call
        (Aeron's ``blockPoll``); returns the bytes delivered. For recorders and bridges that copy
        frames, not messages: no call per message."""
        if self._closed:
            return 0
        position = self._position
        offset = position & self._mask
        index = (position >> self._bits) % 3
        term = self._terms[index]
        term_i32 = self._terms_i32[index]
        # A frame longer than the limit still goes alone (else the image could never move past it).
        first_length = term_i32[offset >> 2]
        limit = min(max(block_length_limit, (first_length + 31) & -32), len(term) - offset)
        length = padding = 0
        while length < limit:
            frame_offset = offset + length
            first = term_i32[frame_offset >> 2]
            if first <= 0:
                break
            aligned = (first + 31) & -32
            run = _equal_run(term_i32, frame_offset >> 2, aligned >> 2, first, (limit - length) // aligned)
            if run > 1:
                length += run * aligned
                continue
            available, padding = scan_term(term, term_i32, frame_offset, min(aligned, limit - length))
            length += available
            if padding or not available:
                break
        if length + padding == 0:
            return 0
        if length:
            handler(term, offset, length, self.session_id, compute_term_id(position, self._bits, self._initial_term_id))
        self._advance(position + length + padding)
        return length

    def _advance(self, position: int) -> None:
        self._position = position
        self._values[self._index] = position

    @property
    def position(self) -> int:
        """This subscriber's position in the stream: bytes consumed so far."""
        return self._position

    @property
    def term_length(self) -> int:
        """Length of each of the log's three terms."""
        return self._log.term_length

    @property
    def initial_term_id(self) -> int:
        """Term id the stream started with."""
        return self._log.initial_term_id

    @property
    def end_of_stream_position(self) -> int:
        """Where the stream ends once the publisher closed (the maximum position before)."""
        return self._log.end_of_stream_position

    @property
    def is_end_of_stream(self) -> bool:
        """True once every byte the publisher wrote before closing has been consumed here."""
        return self._position >= self._log.end_of_stream_position

    @property
    def is_closed(self) -> bool:
        """True once the image is gone (publisher left, subscription closed, driver lost) or corrupt."""
        return self._closed

    def _release(self) -> None:
        """Stop delivering and drop the mapping. Called by the client thread; a poll running in another
        thread keeps its own references, so the memory stays valid until that poll returns."""
        self._closed = True
        close_mapping(self._mapping)

    def __repr__(self) -> str:
        return (
            f"Image(session_id={self.session_id}, stream_id={self.stream_id}, position={self._position}, "
            f"source={self.source_identity!r}, end_of_stream={self.is_end_of_stream})"
        )
