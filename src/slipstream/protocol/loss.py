"""Loss detection for one image: finding gaps below the high-water mark and timing what to do.

Aeron's ``LossDetector``, split out of the image as Aeron does. A reliable image runs a NAK timer
for every gap up to the HWM (at most ``max_gaps_naked``; the reference NAKs only the first, so a
window with several losses costs a round trip per loss); with ``reliable=False`` the first gap waits
``gap_fill_delay_ns`` for reordered data, then is padded so delivery goes on. Each lost byte is one
loss-report observation, however many NAKs or fill attempts its gap takes.
"""

from __future__ import annotations

import random

from ..logbuffer import LogBuffers
from ..wire.constants import DATA_HEADER_LENGTH, FRAME_ALIGNMENT, HDR_TYPE_PAD, UNFRAGMENTED
from ..wire.frames import DATA_HEADER
from ..wire.positions import align, compute_position, compute_term_id, index_by_position
from .config import ReceiverConfig
from .defaults import NAK_UNICAST_RETRY_DELAY_RATIO
from .delay import NakDelayGenerator
from .events import GapFilled, LossDetected, ReceiverEvent

__all__ = ["Gap", "LossDetector"]

Gap = tuple[int, int, int]
"""(term_id, term_offset, length) of a run of empty slots below the high-water mark."""

_PAD_HEADER = DATA_HEADER


class LossDetector:
    """Finds an image's gaps, runs their NAK (or gap-fill) timers and reports loss once per byte."""

    def __init__(
        self,
        log: LogBuffers,
        session_id: int,
        stream_id: int,
        *,
        reliable: bool,
        group: bool,
        config: ReceiverConfig,
        rng: random.Random,
        join_position: int,
    ) -> None:
        self.log = log
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self._bits = log.bits
        self._mask = log.term_length - 1
        self._max_gaps_naked = config.max_gaps_naked
        retry = config.nak_retry_delay_ns
        if retry is None:
            retry = config.nak_delay_ns * NAK_UNICAST_RETRY_DELAY_RATIO
        size, backoff = config.nak_group_size, config.nak_group_max_backoff_ns
        if reliable:
            self._delay = NakDelayGenerator(config.nak_delay_ns, retry, group, size, backoff, rng)
        else:
            fill = config.gap_fill_delay_ns if config.gap_fill_delay_ns is not None else config.nak_delay_ns
            self._delay = NakDelayGenerator(fill, fill, False, size, backoff, rng)
        self._active_gap: Gap | None = None
        self._gap_expiry_ns = 0
        self._nak_timers: dict[tuple[int, int], int] = {}
        """Reliable images: (term_id, term_offset) of each gap being NAKed -> when its next NAK is due."""
        self._lost_until = join_position
        """Stream bytes below this were reported lost already (or were never missing): each lost byte is
        one observation, however many NAKs or fill attempts its gap takes."""

        # Counters.
        self.loss_gap_fills = 0
        self.loss_observations = 0
        self.bytes_lost = 0
        self.first_loss_ns: int | None = None
        self.last_loss_ns: int | None = None

    @property
    def deadline_ns(self) -> int:
        """When the earliest gap timer fires (``1 << 63`` when none runs)."""
        wake = self._gap_expiry_ns if self._active_gap is not None else 1 << 63
        if self._nak_timers:
            wake = min(wake, min(self._nak_timers.values()))
        return wake

    def next_gap(self, rebuild: int, hwm: int) -> tuple[int, Gap | None]:
        """From ``rebuild``: how far frames run contiguously, and the gap (term_id, offset, length)
        there, if the HWM is further.

        A gap starts at the first empty slot and ends at the next filled one (stepped 32 bytes at a
        time), within the term of the rebuild position.
        """
        term_length = self.term_length
        while rebuild < hwm:
            term_i32 = self.log.terms_i32[index_by_position(rebuild, self._bits)]
            term_start = rebuild - (rebuild & self._mask)
            limit = hwm - term_start if hwm - term_start < term_length else term_length
            offset = rebuild - term_start
            while offset < limit:
                frame_length = term_i32[offset >> 2]
                if frame_length <= 0:
                    break
                if frame_length > term_length - offset:
                    limit = offset  # corrupt length in a shared log: stop here rather than skip ahead
                    break
                offset += align(frame_length)
            rebuild = term_start + offset
            if offset < limit:
                end = offset + DATA_HEADER_LENGTH
                while end < limit and term_i32[end >> 2] == 0:
                    end += FRAME_ALIGNMENT
                term_id = compute_term_id(rebuild, self._bits, self.initial_term_id)
                return rebuild, (term_id, offset, end - offset)
            if offset < term_length:
                break
        return rebuild, None

    def clear_nak_timers(self) -> None:
        """No gap is left: every NAK timer stops."""
        self._nak_timers.clear()

    def naks_due(self, gap: Gap, hwm: int, now_ns: int, events: list[ReceiverEvent]) -> list[Gap]:
        """Reliable images: run a NAK timer for ``gap`` and each further gap up to ``hwm`` (at most
        ``max_gaps_naked``); return the gaps whose NAK is due now (their loss reported). A new gap's NAK
        goes after the NAK delay, then again every retry delay while it stays; gaps that were filled
        drop their timers."""
        timers = self._nak_timers
        due: list[Gap] = []
        current: list[tuple[int, int]] = []
        next_gap: Gap | None = gap
        while next_gap is not None and len(current) < self._max_gaps_naked:
            term_id, offset, length = next_gap
            key = (term_id, offset)
            current.append(key)
            start = compute_position(term_id, offset, self._bits, self.initial_term_id)
            expiry = timers.get(key)
            if expiry is None:
                expiry = timers[key] = now_ns + self._delay.next(False)
            if now_ns >= expiry:
                timers[key] = now_ns + self._delay.next(True)
                self._report_loss(term_id, offset, length, now_ns, events)
                due.append(next_gap)
            _, next_gap = self.next_gap(start + length, hwm)
        if len(timers) > len(current):
            for key in [k for k in timers if k not in current]:
                del timers[key]
        return due

    def forget_gap(self) -> None:
        """``reliable=False``: no gap is left below the HWM; the fill timer stops."""
        self._active_gap = None

    def fill_due(self, gap: Gap, now_ns: int, events: list[ReceiverEvent]) -> bool:
        """``reliable=False``: run the first gap's timer; True if it fired and the gap was padded."""
        if gap != self._active_gap:
            self._active_gap = gap
            self._gap_expiry_ns = now_ns + self._delay.next(False)
        if now_ns < self._gap_expiry_ns:
            return False
        self._gap_expiry_ns = now_ns + self._delay.next(True)
        term_id, term_offset, length = gap
        self._report_loss(term_id, term_offset, length, now_ns, events)
        return self._fill_gap(term_id, term_offset, length, events)

    def _report_loss(self, term_id: int, offset: int, length: int, now_ns: int, events: list[ReceiverEvent]) -> None:
        """One loss-report observation of the gap's bytes not reported before (none: no observation)."""
        start = compute_position(term_id, offset, self._bits, self.initial_term_id)
        if start + length <= self._lost_until:
            return
        new = start + length - max(start, self._lost_until)
        self._lost_until = start + length
        self.loss_observations += 1
        self.bytes_lost += new
        if self.first_loss_ns is None:
            self.first_loss_ns = now_ns
        self.last_loss_ns = now_ns
        events.append(LossDetected(self.session_id, self.stream_id, term_id, offset, length, new, now_ns))

    def _fill_gap(self, term_id: int, offset: int, length: int, events: list[ReceiverEvent]) -> bool:
        """Pad a gap that is still wholly empty so subscribers move past it."""
        position = compute_position(term_id, offset, self._bits, self.initial_term_id)
        index = index_by_position(position, self._bits)
        term, term_i32 = self.log.terms[index], self.log.terms_i32[index]
        slot = offset + length - FRAME_ALIGNMENT
        while slot >= offset:
            if term_i32[slot >> 2] != 0:
                return False
            slot -= FRAME_ALIGNMENT
        _PAD_HEADER.pack_into(
            term, offset, 0, 0, UNFRAGMENTED, HDR_TYPE_PAD, offset, self.session_id, self.stream_id, term_id, 0
        )
        term_i32[offset >> 2] = length
        self.loss_gap_fills += 1
        self._active_gap = None
        events.append(GapFilled(self.session_id, self.stream_id, position, length))
        return True
