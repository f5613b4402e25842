"""One publication image: the receiving side of one (session, stream) from one sender.

:class:`PublicationImageReceiver` rebuilds the publisher's log in its own
:class:`~slipstream.logbuffer.LogBuffers` (frames land at their term offset; a filled slot is left
alone, so duplicates are harmless), tracks the high-water mark, lets its
:class:`~slipstream.protocol.loss.LossDetector` find gaps and NAK them (or, with ``reliable=False``,
pad them so delivery goes on), sends status messages on Aeron's schedule and ends with end-of-stream,
liveness timeout or unsubscription. Behaviour and bounds follow the C media driver (reference
sections 2.2-2.5); where it differs on purpose, ``receive_endpoint`` says so.

The log comes from a log factory (a constructor argument of the endpoint) as an :class:`ImageLog`:
the log, and an opaque handle the adapter gets back from ``image.log_handle``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from ..logbuffer import LogBuffers, compute_log_length, zero_buffer
from ..logbuffer.constants import PARTITION_COUNT
from ..logbuffer.fastpath import FAST
from ..wire.address import Address
from ..wire.constants import EOS_FLAG, FRAME_ALIGNMENT, SM_EOS_FLAG
from ..wire.frames import BytesLike, DataScan, Nak, StatusMessage
from ..wire.positions import compute_position, compute_term_id, index_by_position
from .config import ReceiverConfig
from .events import ImageEndOfStream, ImageReleased, ImageRemoved, ReceiverEvent
from .lifecycle import ACTIVE, DONE, DRAINING, LINGER, ImageState
from .loss import Gap, LossDetector

__all__ = [
    "ImageLog",
    "ImageParams",
    "ImageState",
    "LogFactory",
    "Outgoing",
    "PublicationImageReceiver",
    "default_log_factory",
]

Outgoing: TypeAlias = tuple[bytes, Address]
"""A datagram to send and its destination."""


_c_insert_datagram = FAST.insert_datagram if FAST is not None else None
"""The datagram copy in C when the fast path is active (same bytes, same store order)."""


@dataclass(frozen=True, slots=True)
class ImageParams:
    """What a validated SETUP says about a new image, for the log factory."""

    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_offset: int
    term_length: int
    mtu: int
    source: Address
    image_id: int = 0
    """The endpoint's id for the image, as its events carry it."""


class ImageLog(NamedTuple):
    """What a log factory returns: the log the image rebuilds, and the adapter's own handle for it (its
    file and mapping, say). The machine keeps the handle for the adapter and never looks into it."""

    log: LogBuffers
    handle: object = None


LogFactory: TypeAlias = Callable[[ImageParams], ImageLog]
"""Allocates (maps) the zero-filled log of a new image; the endpoint initializes its metadata."""


def default_log_factory(params: ImageParams) -> ImageLog:
    """An in-memory log; the driver passes a factory that maps a file under its directory instead."""
    return ImageLog(LogBuffers(bytearray(compute_log_length(params.term_length)), params.term_length))


class PublicationImageReceiver:
    """One (session, stream) from one sender: rebuilds its log, NAKs gaps and sends status messages.

    Created by a receive endpoint from a validated SETUP. The driver tells it how far the subscribers
    consumed with :meth:`on_consumption`; subscribers read ``log`` directly.
    """

    def __init__(
        self,
        image_log: ImageLog,
        params: ImageParams,
        *,
        reliable: bool,
        group: bool,
        receiver_id: int,
        config: ReceiverConfig,
        rng: random.Random,
        now_ns: int,
    ) -> None:
        log = image_log.log
        self.log = log
        self.log_handle = image_log.handle
        """The log factory's handle for ``log``, kept for the adapter."""
        self.image_id = params.image_id
        self.session_id = params.session_id
        self.stream_id = params.stream_id
        self.initial_term_id = params.initial_term_id
        self.term_length = params.term_length
        self.mtu = params.mtu
        self.reliable = reliable
        self.receiver_id = receiver_id
        self.config = config
        self.control_address = params.source
        self.source = params.source
        """Where its SETUP came from (a budget per source counts images by its address)."""
        self._bits = log.bits
        self._mask = params.term_length - 1
        self.receiver_window = min(config.receiver_window, params.term_length // 2)
        join = compute_position(params.active_term_id, params.term_offset, self._bits, params.initial_term_id)
        self.join_position = join
        self._rcv_pos = join
        self._hwm = join
        self._consumption = join
        self._clean_position = join
        self._last_sm_position = join
        self._overrun_threshold = join + params.term_length // 2
        self._next_sm_position = join
        self._sm_scheduled = True  # the first SM goes out at once (reference 2.2.2)
        self._next_sm_deadline_ns = now_ns + config.sm_timeout_ns
        self._sm_period_ns = config.sm_timeout_ns
        """The period of timed status messages (idle_sm_max_ns while the position stays put)."""
        self._sending_eos_sm = False
        self._eos_position: int | None = None
        self._last_packet_ns = now_ns
        self._last_activity_ns = now_ns
        self._unsubscribed = False
        self._rejected = False
        self.state = ACTIVE
        self.removal_reason: str | None = None
        self._state_change_ns = now_ns
        self._loss = LossDetector(
            log,
            params.session_id,
            params.stream_id,
            reliable=reliable,
            group=group,
            config=config,
            rng=rng,
            join_position=join,
        )
        self.deadline_ns = 0
        """``poll`` has nothing to do before this time unless input arrives (0: due now). A plain attribute:
        the endpoint's idle check reads it for every image, every duty cycle."""

        # Counters.
        self.bytes_received = 0
        self.datagrams_received = 0
        self.heartbeats_received = 0
        self.flow_control_under_runs = 0
        self.flow_control_over_runs = 0
        self.status_messages_sent = 0
        self.naks_sent = 0

    # -- loss counters (kept by the loss detector) ----------------------------------------------

    @property
    def loss_gap_fills(self) -> int:
        """``reliable=False``: gaps padded so delivery went on."""
        return self._loss.loss_gap_fills

    @property
    def loss_observations(self) -> int:
        """Loss-report observations: one per gap found or grown (each lost byte counted once)."""
        return self._loss.loss_observations

    @property
    def bytes_lost(self) -> int:
        """Bytes found missing (NAKed or padded), each counted once."""
        return self._loss.bytes_lost

    @property
    def first_loss_ns(self) -> int | None:
        """When loss was first observed, None if never."""
        return self._loss.first_loss_ns

    @property
    def last_loss_ns(self) -> int | None:
        """When loss was last observed, None if never."""
        return self._loss.last_loss_ns

    # -- positions ------------------------------------------------------------------------------

    @property
    def rebuild_position(self) -> int:
        """``rcv-pos``: everything below it has been received (or padded)."""
        return self._rcv_pos

    @property
    def high_water_mark(self) -> int:
        """``rcv-hwm``: the highest position any accepted DATA or heartbeat reached."""
        return self._hwm

    @property
    def consumption_position(self) -> int:
        return self._consumption

    @property
    def last_sm_position(self) -> int:
        return self._last_sm_position

    @property
    def end_of_stream_position(self) -> int | None:
        return self._eos_position

    @property
    def is_end_of_stream(self) -> bool:
        return self._eos_position is not None

    def on_consumption(self, position: int) -> None:
        """The slowest subscriber's position (driver input, each duty cycle). It never moves back and is
        capped at the high-water mark, so a confused subscriber cannot make SMs claim unreceived data."""
        if position > self._consumption:
            consumption = min(position, self._hwm)
            if consumption != self._consumption:
                self._consumption = consumption
                # A poll is due only if the move matters to it: an SM to schedule (as _track_rebuild
                # decides) or an image draining. (Subscribers cannot read past the rebuild position
                # unless data arrived since the last scan, and then a poll is due already.)
                if consumption > self._next_sm_position + self.receiver_window // 4 or self.state is not ACTIVE:
                    self.deadline_ns = 0

    def unsubscribe(self) -> None:
        """No subscriber is left: drain and go."""
        self._unsubscribed = True
        self.deadline_ns = 0

    def reject(self) -> None:
        """A subscriber refused the image (Aeron's ``Image.reject``): it goes at once, as if unsubscribed,
        with removal reason ``rejected``."""
        self._rejected = True
        self.unsubscribe()

    def is_connection_alive(self, now_ns: int) -> bool:
        return now_ns < self._last_activity_ns + self.config.connection_timeout_ns

    # -- input ----------------------------------------------------------------------------------

    def on_setup(self, now_ns: int) -> None:
        self._last_activity_ns = now_ns

    def takes_run(self, term_id: int, term_offset: int, length: int) -> bool:
        """Whether ``length`` bytes of data at (``term_id``, ``term_offset``) would land exactly at the
        high-water mark, inside one term and the window: where nothing has been written, so a run of
        datagrams can be inserted in one copy with the result of inserting them one by one."""
        term_count = (term_id - self.initial_term_id) & 0xFFFF_FFFF
        if term_count & 0x8000_0000 or not 0 <= term_offset <= self.term_length - length:
            return False
        position = (term_count << self._bits) + term_offset
        return position == self._hwm and position + length <= self._overrun_threshold

    def on_data(
        self, scan: DataScan, data: BytesLike, now_ns: int, events: list[ReceiverEvent], datagrams: int = 1
    ) -> bool:
        """Insert a validated DATA/PAD datagram (or a run of ``datagrams`` that ``takes_run`` accepted);
        False if it breaks a rule that makes it invalid.

        The hot path of a receiving driver (once per datagram), so written flat, with locals."""
        _, _, term_id, term_offset, flags, is_heartbeat, first_frame_length, term_length_used = scan
        term_count = (term_id - self.initial_term_id) & 0xFFFF_FFFF
        if term_count & 0x8000_0000:  # a term before the initial one (wrap_i32 < 0)
            self.flow_control_under_runs += 1
            return True
        term_length = self.term_length
        if not 0 <= term_offset < term_length or term_offset & (FRAME_ALIGNMENT - 1):
            return False
        length = 0 if is_heartbeat else term_length_used
        if term_offset + length > term_length:
            return False
        position = (term_count << self._bits) + term_offset
        proposed = position + length
        if proposed > self._overrun_threshold:
            self.flow_control_over_runs += 1
            return True
        if is_heartbeat:
            if position >= max(0, self._last_sm_position - term_length):
                self._last_activity_ns = self._last_packet_ns = now_ns
                self.heartbeats_received += 1
                if flags & EOS_FLAG and self._eos_position is None:
                    self._eos_position = position
                    self.log.end_of_stream_position = position
                    events.append(ImageEndOfStream(self.session_id, self.stream_id, position))
                if proposed > self._hwm:
                    self._hwm = proposed
                self.deadline_ns = 0  # a higher HWM may reveal a gap; EOS may end the image
            else:
                self.flow_control_under_runs += 1
            return True
        if position < self._last_sm_position:
            self.flow_control_under_runs += 1
            if proposed >= self._last_sm_position - self.receiver_window:
                self._last_activity_ns = now_ns
            return True
        self._last_activity_ns = self._last_packet_ns = now_ns
        # Copy the datagram to its term offset in one go, unless its first slot is already filled (a
        # duplicate); the first frame's length is stored last, so a reader never sees a partial datagram.
        # Later frames' lengths land with the copy, before that store, as Aeron's term rebuilder does.
        index = term_count % PARTITION_COUNT
        if _c_insert_datagram is not None:
            inserted = _c_insert_datagram(self.log.terms[index], term_offset, data, first_frame_length)
        else:
            term_i32 = self.log.terms_i32[index]
            slot = term_offset >> 2
            inserted = term_i32[slot] == 0
            if inserted:
                source = memoryview(data).cast("B") if isinstance(data, memoryview) else data
                self.log.terms[index][term_offset + 4 : term_offset + len(source)] = source[4:]
                term_i32[slot] = first_frame_length
        self.datagrams_received += datagrams
        self.bytes_received += len(data)
        if proposed > self._hwm:
            if inserted and position == self._hwm == self._rcv_pos:
                # In order, nothing missing: the rebuild position moves as the next scan would move
                # it, and no poll is needed for this datagram (the low-latency path).
                self._rcv_pos = proposed
            else:
                self.deadline_ns = 0  # a new gap, or data beyond one: scan
            self._hwm = proposed
        elif inserted:
            self.deadline_ns = 0  # a retransmission (or reordered datagram) filled part of a gap
        return True

    # -- duty cycle -----------------------------------------------------------------------------

    def poll(self, now_ns: int, out: list[Outgoing], events: list[ReceiverEvent]) -> None:
        """Rebuild, detect loss, send the status message if due and move through the lifecycle."""
        rescan = False
        if self.state in (ACTIVE, DRAINING):
            rescan = self._track_rebuild(now_ns, out, events)
            self._send_pending_status_message(now_ns, out)
        self._on_time_event(now_ns, events)
        self.deadline_ns = now_ns if rescan else self._next_wake_ns()

    def _next_wake_ns(self) -> int:
        """The earliest time a timer in ``poll`` fires, given no input meanwhile (data, consumption,
        unsubscription). Each bound mirrors a check in ``poll``; the protocol simulation checks, at
        every step, that a poll ``poll_due`` called unnecessary sends and changes nothing."""
        state = self.state
        config = self.config
        if state is DONE:
            return 1 << 63
        if state is LINGER:
            return self._state_change_ns + config.image_liveness_timeout_ns + 1
        wake = min(self._next_sm_deadline_ns + 1, self._loss.deadline_ns)
        if state is ACTIVE:
            return min(wake, self._last_packet_ns + config.image_liveness_timeout_ns + 1)
        if self._unsubscribed or self._consumption >= self._rcv_pos:  # drained: the linger runs
            return min(wake, self._state_change_ns + config.eos_linger_multiple * config.sm_timeout_ns + 1)
        return wake

    def _track_rebuild(self, now_ns: int, out: list[Outgoing], events: list[ReceiverEvent]) -> bool:
        """Advance the rebuild position, run the loss timer, schedule an SM; True if gaps were padded
        in every scan pass allowed, so more may be waiting for the next poll."""
        gap: Gap | None = None
        rescan = False
        if self.reliable:
            self._nak_gaps(now_ns, out, events)
        else:
            for _ in range(self.config.scan_passes_per_poll):
                gap = self._scan()
                if gap is None or not self._loss.fill_due(gap, now_ns, events):
                    break
            else:
                rescan = True
            if gap is None:
                self._loss.forget_gap()
        consumption = self._consumption
        if consumption > self._next_sm_position + self.receiver_window // 4:
            self._clean_buffer_to(consumption - self.term_length)
            self._next_sm_position = consumption
            self._sm_scheduled = True
        return rescan

    def _scan(self) -> Gap | None:
        """Advance ``rcv-pos`` over contiguous frames towards the HWM; return the first gap found."""
        rebuild, gap = self._loss.next_gap(max(self._rcv_pos, self._consumption), self._hwm)
        self._rcv_pos = max(self._rcv_pos, rebuild)
        return gap

    def _nak_gaps(self, now_ns: int, out: list[Outgoing], events: list[ReceiverEvent]) -> None:
        """Reliable images: advance ``rcv-pos``, run the NAK timers of the gaps up to the HWM and NAK
        those due (to a sender still alive)."""
        gap = self._scan()
        if gap is None:
            self._loss.clear_nak_timers()
            return
        for term_id, offset, length in self._loss.naks_due(gap, self._hwm, now_ns, events):
            if self.is_connection_alive(now_ns):
                nak = Nak(self.session_id, self.stream_id, term_id, offset, length)
                out.append((nak.encode(), self.control_address))
                self.naks_sent += 1

    def _clean_buffer_to(self, position: int) -> None:
        """Zero what subscribers left a term behind, so a partition is clean when the log wraps onto it."""
        clean = self._clean_position
        while clean < position:
            offset = clean & self._mask
            length = min(position - clean, self.term_length - offset)
            with self.log.terms[index_by_position(clean, self._bits)][offset : offset + length] as region:
                zero_buffer(region)
            clean += length
        self._clean_position = clean

    def _send_pending_status_message(self, now_ns: int, out: list[Outgoing]) -> None:
        if not self._sm_scheduled and now_ns <= self._next_sm_deadline_ns:
            return
        position = self._next_sm_position
        idle = not self._sm_scheduled and position == self._last_sm_position and not self._sending_eos_sm
        if self.is_connection_alive(now_ns):
            sm = StatusMessage(
                self.session_id,
                self.stream_id,
                compute_term_id(position, self._bits, self.initial_term_id),
                position & self._mask,
                self.receiver_window,
                self.receiver_id,
                None,
                SM_EOS_FLAG if self._sending_eos_sm else 0,
            )
            out.append((sm.encode(), self.control_address))
            self.status_messages_sent += 1
        self._last_sm_position = position
        self._overrun_threshold = position + self.term_length // 2
        self._sm_scheduled = False
        longest = self.config.idle_sm_max_ns
        if longest is not None and idle:
            self._sm_period_ns = longest
        else:
            self._sm_period_ns = self.config.sm_timeout_ns
        self._next_sm_deadline_ns = now_ns + self._sm_period_ns

    def _on_time_event(self, now_ns: int, events: list[ReceiverEvent]) -> None:
        state = self.state
        config = self.config
        if state is ACTIVE:
            if self._unsubscribed:
                reason = "rejected" if self._rejected else "unsubscribed"
            elif self._eos_position is not None and self._rcv_pos >= self._hwm:
                reason = "end_of_stream"
            elif now_ns > self._last_packet_ns + config.image_liveness_timeout_ns:
                reason = "liveness_timeout"
            else:
                return
            self.state = DRAINING
            self.removal_reason = reason
            self._state_change_ns = now_ns
            self._sending_eos_sm = True
            # That status message goes with the next poll (Aeron's does for an end of stream), not an SM
            # period later: it ends the sender's linger, and an embedded driver's drain on close.
            self._next_sm_deadline_ns = now_ns - 1
        elif state is DRAINING:
            drained = self._unsubscribed or self._consumption >= self._rcv_pos
            if drained and now_ns > self._state_change_ns + config.eos_linger_multiple * config.sm_timeout_ns:
                self.state = LINGER
                self._state_change_ns = now_ns
                events.append(ImageRemoved(self.session_id, self.stream_id, self.removal_reason or "", self.image_id))
        elif state is LINGER and (
            self._unsubscribed or now_ns > self._state_change_ns + config.image_liveness_timeout_ns
        ):
            self.state = DONE
            events.append(ImageReleased(self.session_id, self.stream_id, self.image_id))
