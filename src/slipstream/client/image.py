"""Images: one publisher's stream as one subscription sees it, read straight from shared memory."""

from __future__ import annotations

import contextlib
import mmap
from pathlib import Path
from typing import TYPE_CHECKING

from ..files.directory import close_mapping
from ..files.doorbell import ParkingSlot, map_parking_slot
from ..logbuffer import BlockHandler, FragmentHandler, Header, LogBuffers, read_term, scan_block
from ..logbuffer.fastpath import FAST
from ..wire.positions import compute_term_id


class PyImage:
    """Replicated stream of one publisher session. ``poll`` delivers fragments from the log and
    publishes this subscriber's position, which is what lets the publisher move on.

    All in Python: the reference; ``Image`` is this with ``poll`` in C when the fast path is active.
    """

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
        log_path: Path | None = None,
        parking_slot: int = -1,
    ) -> None:
        self.subscription_registration_id = subscription_registration_id
        self.correlation_id = correlation_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.source_identity = source_identity
        self.join_position = join_position
        self._mapping = mapping
        self._log = LogBuffers(memoryview(mapping))
        self._terms = tuple(self._log.terms)
        self._terms_i32 = self._log.terms_i32
        self._bits = self._log.bits
        self._mask = self._log.term_length - 1
        self._initial_term_id = self._log.initial_term_id
        self._header = Header(self._log.initial_term_id, self._bits)
        self._values = position_values
        self._index = position_index
        self._position = join_position
        self._closed = False
        self._parking: ParkingSlot | None = (
            map_parking_slot(log_path, self._log.term_length, parking_slot)
            if log_path is not None and parking_slot >= 0
            else None
        )
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
        if self._terms_i32[index][offset >> 2] <= 0:
            return 0  # nothing new (the common case of a busy poll): no call, no result tuple
        header = self._header
        try:
            fragments, next_offset, intact = read_term(
                self._terms[index], self._terms_i32[index], offset, handler, fragment_limit, header
            )
        except BaseException:
            failed_end = header.offset + ((header.frame_length + 31) & -32)
            self._advance(position + failed_end - offset)
            raise
        if next_offset != offset:  # _advance, inlined: this is the hot path of every busy poll
            self._position = position = position + next_offset - offset
            self._values[self._index] = position
        if not intact:
            self.is_corrupt = True
            self._closed = True
        return fragments

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        """Hand a run of whole DATA frames (at most ``block_length_limit`` bytes, but at least one frame) to
        ``handler(block, session_id, term_id)`` in one call; returns the bytes consumed (0 if none).

        Aeron's ``blockPoll``: for consumers that take many messages at once (``block_frames`` splits a
        block), so the Python call is paid once per block instead of once per message. The block never
        crosses a term's end. A raising handler still consumes the block.
        """
        if self._closed:
            return 0
        position = self._position
        offset = position & self._mask
        index = (position >> self._bits) % 3
        term = self._terms[index]
        data_end, next_offset, intact = scan_block(term, self._terms_i32[index], offset, block_length_limit)
        try:
            if data_end > offset:
                term_id = compute_term_id(position, self._bits, self._log.initial_term_id)
                handler(term[offset:data_end], self.session_id, term_id)
        finally:
            if next_offset != offset:
                self._advance(position + next_offset - offset)
            if not intact:
                self.is_corrupt = True
                self._closed = True
        return next_offset - offset

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

    def term_view(self, position: int) -> memoryview:
        """The whole term that holds stream ``position`` (shared memory, read only by convention): for a
        consumer that writes aligned ranges of it straight to disk (the stream capture's O_DIRECT)."""
        return self._terms[(position >> self._bits) % 3]

    @property
    def publication_window(self) -> int:
        """How far the publisher may run ahead of the slowest subscriber: how long a reader may wait."""
        return self._log.publication_window or self._log.term_length // 2

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

    @property
    def can_park(self) -> bool:
        """True when this image has a slot in its log's parking table: a writer rings a parked reader's
        doorbell. Without one (more subscribers than slots, or a log this process may not write) a
        waiting reader falls back to a timed back-off."""
        return self._parking is not None and not self._closed

    def has_frame(self) -> bool:
        """True when a complete frame waits at this subscriber's position: what a spinning poller checks
        between its duty cycles (a few loads, no handler run)."""
        return self._has_frame()

    def _has_frame(self) -> bool:
        """True when a complete frame waits at this subscriber's position: a cheap re-check after parking
        (the frame's length is positive once written; a frame being written is not counted, its writer
        rings after the commit)."""
        if self._closed:
            return False
        position = self._position
        return self._terms_i32[(position >> self._bits) % 3][(position & self._mask) >> 2] > 0

    def _park(self, number: int) -> bool:
        """Ask writers to ring doorbell ``number`` after their next append (False: no slot, not parked).
        Balance each True with one ``_unpark``."""
        parking = self._parking
        if parking is None or self._closed:
            return False
        try:
            parking.park(number)
        except ValueError:  # released by the client thread meanwhile
            return False
        return True

    def _unpark(self) -> None:
        parking = self._parking
        if parking is not None:
            with contextlib.suppress(ValueError):
                parking.unpark()

    def _release(self) -> None:
        """Stop delivering and drop the mapping. Called by the client thread; a poll running in another
        thread keeps its own references, so the memory stays valid until that poll returns."""
        self._closed = True
        parking, self._parking = self._parking, None
        if parking is not None:
            parking.close()
        close_mapping(self._mapping)

    def __repr__(self) -> str:
        return (
            f"Image(session_id={self.session_id}, stream_id={self.stream_id}, position={self._position}, "
            f"source={self.source_identity!r}, end_of_stream={self.is_end_of_stream})"
        )


if TYPE_CHECKING or FAST is None:
    Image = PyImage
else:

    class Image(FAST.ImageCore, PyImage):  # type: ignore[misc,name-defined]
        """Replicated stream of one publisher session (see ``PyImage``, the reference), with its
        position, terms and ``poll`` in C: a poll that finds nothing costs one length-word read, and
        one that delivers makes no Python call but the handler's."""
