"""The receiving side of Aeron unicast UDP, as sans-I/O state machines.

:class:`ReceiveEndpoint` is what a subscription's UDP socket feeds: it answers SETUP for subscribed
streams by creating a :class:`PublicationImageReceiver`, asks unknown sessions for SETUP, and routes
DATA to images. Each image rebuilds the publisher's log in its own
:class:`~slipstream.logbuffer.LogBuffers` (frames land at their term offset; a filled slot is left
alone, so duplicates are harmless), tracks the high-water mark, finds gaps and NAKs them (or, with
``reliable=False``, pads them so delivery goes on), sends status messages on Aeron's schedule and
ends with end-of-stream, liveness timeout or unsubscription. Behaviour and bounds follow the C
media driver (reference sections 2.2-2.5).

No sockets, threads or clocks: the driver passes datagrams with ``now_ns`` and the subscribers'
consumption position, and sends what :meth:`ReceiveEndpoint.poll` returns, each datagram to its
address, from the socket bound to the channel endpoint (a C sender's socket is connected and only
accepts datagrams from that address). Every datagram is untrusted: it is validated, counted and
dropped when bad; a peer can make an image allocate a log only within ``ReceiverConfig`` limits.

Where this differs from the C driver, on purpose:

- Every frame of a datagram is validated, not only the first. (As in C, a datagram is copied whole
  when its first slot is empty and dropped as a duplicate otherwise.) Datagrams received back to
  back (a GRO batch, ``on_datagrams``) that continue an image at its high-water mark are validated
  and copied as one run, which leaves the log exactly as inserting them one by one would.
- A reliable image runs a NAK timer for every gap up to the HWM (at most ``max_gaps_naked``), not only
  for the first: with several losses in a window, they are repaired in one round trip, not one each.
  On the wire these are ordinary NAKs; a C sender answers each as it arrives.
- SETUPs are also refused above ``max_term_length`` (64 MiB by default, not 1 GiB) and beyond
  ``max_images``; SETUP requests to unknown sessions are bounded by ``max_pending_setups``.
- The subscribers' consumption position is capped at the high-water mark and never moves back.
- With ``reliable=False`` a gap may wait ``gap_fill_delay_ns`` for reordered data before it is
  padded (default: the NAK delay, as in C).
"""

from __future__ import annotations

import enum
import math
import random
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeAlias

from ..logbuffer import LogBuffers, compute_log_length, zero_buffer
from ..logbuffer.constants import PARTITION_COUNT
from ..wire.constants import (
    DATA_HEADER_LENGTH,
    EOS_FLAG,
    FRAME_ALIGNMENT,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    MTU_MAX,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SM_EOS_FLAG,
    SM_SEND_SETUP_FLAG,
    TERM_MAX_LENGTH,
    TERM_MIN_LENGTH,
    UNFRAGMENTED,
)
from ..wire.frames import (
    DATA_HEADER,
    BytesLike,
    DataScan,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_datagram,
    scan_data_datagram,
    scan_equal_frames,
)
from ..wire.positions import align, compute_position, compute_term_id, index_by_position, is_power_of_two, wrap_i32
from .defaults import (
    IMAGE_LIVENESS_TIMEOUT_NS,
    IMAGE_SM_EOS_MULTIPLE,
    NAK_MULTICAST_GROUP_SIZE,
    NAK_MULTICAST_MAX_BACKOFF_NS,
    NAK_UNICAST_DELAY_NS,
    NAK_UNICAST_RETRY_DELAY_RATIO,
    PENDING_SETUP_TIMEOUT_NS,
    RECEIVE_DESTINATION_TIMEOUT_NS,
    RECEIVER_WINDOW_DEFAULT,
    SO_RCVBUF_DEFAULT,
    STATUS_MESSAGE_TIMEOUT_NS,
)

__all__ = [
    "Address",
    "GapFilled",
    "ImageCreated",
    "ImageEndOfStream",
    "ImageParams",
    "ImageReleased",
    "ImageRemoved",
    "ImageState",
    "LogFactory",
    "LossDetected",
    "Outgoing",
    "PublicationImageReceiver",
    "ReceiveEndpoint",
    "ReceiverConfig",
    "ReceiverEvent",
    "default_log_factory",
]

Address: TypeAlias = Hashable
"""Where a datagram came from or goes to; the driver uses socket addresses, tests any hashable."""
Outgoing: TypeAlias = tuple[bytes, Address]
"""A datagram to send and its destination."""


class ImageState(enum.Enum):
    ACTIVE = "active"
    DRAINING = "draining"
    """No more data will come (EOS, liveness timeout or unsubscribed); SMs carry EOS while subscribers drain."""
    LINGER = "linger"
    """Removed from the endpoint; the log stays readable until the linger ends."""
    DONE = "done"


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    """Timing and limits of a receive endpoint; defaults are the C driver's (durations in ns)."""

    receiver_window: int = RECEIVER_WINDOW_DEFAULT
    """``rcv-wnd``; an image uses min(this, term_length / 2)."""
    so_rcvbuf: int = SO_RCVBUF_DEFAULT
    """A SETUP whose MTU exceeds the socket receive buffer is refused."""
    sm_timeout_ns: int = STATUS_MESSAGE_TIMEOUT_NS
    nak_delay_ns: int = NAK_UNICAST_DELAY_NS
    nak_retry_delay_ns: int | None = None
    """Delay between NAKs for a gap that persists; None means nak_delay_ns x 100."""
    nak_group_max_backoff_ns: int = NAK_MULTICAST_MAX_BACKOFF_NS
    nak_group_size: int = NAK_MULTICAST_GROUP_SIZE
    gap_fill_delay_ns: int | None = None
    """``reliable=False``: how long a gap may wait for late (reordered) data before it is padded;
    None means nak_delay_ns, as in Aeron (a reordered datagram then counts as lost)."""
    image_liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_NS
    pending_setup_timeout_ns: int = PENDING_SETUP_TIMEOUT_NS
    connection_timeout_ns: int = RECEIVE_DESTINATION_TIMEOUT_NS
    """SMs and NAKs go to a sender only while its packets arrived within this period."""
    eos_linger_multiple: int = IMAGE_SM_EOS_MULTIPLE
    max_images: int = 256
    """Images (including lingering ones) an endpoint holds at once; further SETUPs are refused."""
    max_term_length: int = 64 * 1024 * 1024
    """Largest term length accepted from a SETUP: an image log is three terms, allocated on the
    peer's word, so this caps what one SETUP can cost. Raise it to accept up to 1 GiB terms."""
    max_pending_setups: int = 1024
    max_outbound: int = 1024
    """Datagrams queued between ``on_datagram`` and ``poll``; beyond this they are dropped and counted."""
    scan_passes_per_poll: int = 4
    max_gaps_naked: int = 16
    """Gaps between the rebuild position and the HWM that each get a NAK timer at once (the
    reference NAKs only the first, so a window with several losses costs a round trip per loss)."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        for name in (
            "receiver_window",
            "so_rcvbuf",
            "sm_timeout_ns",
            "nak_group_max_backoff_ns",
            "image_liveness_timeout_ns",
            "pending_setup_timeout_ns",
            "connection_timeout_ns",
            "max_images",
            "max_pending_setups",
            "max_outbound",
            "scan_passes_per_poll",
            "max_gaps_naked",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive: {getattr(self, name)}")
        for name in ("nak_delay_ns", "nak_retry_delay_ns", "gap_fill_delay_ns", "eos_linger_multiple"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative: {value}")
        if self.nak_group_size < 1:
            raise ValueError(f"nak_group_size must be at least 1: {self.nak_group_size}")
        if not TERM_MIN_LENGTH <= self.max_term_length <= TERM_MAX_LENGTH:
            raise ValueError(
                f"max_term_length must be in [{TERM_MIN_LENGTH}, {TERM_MAX_LENGTH}]: {self.max_term_length}"
            )


# -- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageCreated:
    """A SETUP created an image; its log is ``image.log`` and subscribers start at ``join_position``."""

    session_id: int
    stream_id: int
    source: Address
    join_position: int
    image: PublicationImageReceiver


@dataclass(frozen=True, slots=True)
class ImageEndOfStream:
    """The sender signalled end-of-stream at ``position`` (also written to the log metadata)."""

    session_id: int
    stream_id: int
    position: int


@dataclass(frozen=True, slots=True)
class ImageRemoved:
    """The image left the endpoint (``reason``: end_of_stream, liveness_timeout or unsubscribed);
    subscribers should see it become unavailable. Its log lingers until :class:`ImageReleased`."""

    session_id: int
    stream_id: int
    reason: str
    image: PublicationImageReceiver


@dataclass(frozen=True, slots=True)
class ImageReleased:
    """The image's linger ended: its log may be unmapped and deleted."""

    session_id: int
    stream_id: int
    image: PublicationImageReceiver


@dataclass(frozen=True, slots=True)
class LossDetected:
    """A gap was found (first time, or grown): one loss-report observation of ``bytes_lost`` new bytes."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    bytes_lost: int
    timestamp_ns: int


@dataclass(frozen=True, slots=True)
class GapFilled:
    """``reliable=False``: a gap was padded so delivery continues; those bytes are gone for good."""

    session_id: int
    stream_id: int
    position: int
    length: int


ReceiverEvent: TypeAlias = ImageCreated | ImageEndOfStream | ImageRemoved | ImageReleased | LossDetected | GapFilled


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


LogFactory: TypeAlias = Callable[[ImageParams], LogBuffers]
"""Allocates (maps) the zero-filled log of a new image; the endpoint initializes its metadata."""


def default_log_factory(params: ImageParams) -> LogBuffers:
    """An in-memory log; the driver passes a factory that maps a file under its directory instead."""
    return LogBuffers(bytearray(compute_log_length(params.term_length)), params.term_length)


_PAD_HEADER = DATA_HEADER


class _Delay:
    """NAK timing: a fixed delay then retries (unicast), or a random backoff each time (group)."""

    __slots__ = ("_base", "_constant", "_factor", "_rng", "_span", "delay_ns", "group", "retry_ns")

    def __init__(self, delay_ns: int, retry_ns: int, group: bool, config: ReceiverConfig, rng: random.Random) -> None:
        self.delay_ns = delay_ns
        self.retry_ns = retry_ns
        self.group = group
        self._rng = rng
        # Exponential feedback suppression: delays in [0, max_backoff] skewed late, so that in a group
        # one receiver usually NAKs first and the others hear the retransmission instead.
        lam = math.log(config.nak_group_size) + 1.0
        backoff = float(config.nak_group_max_backoff_ns)
        self._span = lam / backoff
        self._base = lam / (backoff * (math.exp(lam) - 1.0))
        self._constant = backoff / lam
        self._factor = (math.exp(lam) - 1.0) * (backoff / lam)

    def next(self, retry: bool) -> int:
        if self.group:
            x = self._rng.random() * self._span + self._base
            return max(0, int(self._constant * math.log(x * self._factor)))
        return self.retry_ns if retry else self.delay_ns


class PublicationImageReceiver:
    """One (session, stream) from one sender: rebuilds its log, NAKs gaps and sends status messages.

    Created by :class:`ReceiveEndpoint` from a validated SETUP. The driver tells it how far the
    subscribers consumed with :meth:`on_consumption`; subscribers read ``log`` directly.
    """

    def __init__(
        self,
        log: LogBuffers,
        params: ImageParams,
        *,
        reliable: bool,
        group: bool,
        receiver_id: int,
        config: ReceiverConfig,
        rng: random.Random,
        now_ns: int,
    ) -> None:
        self.log = log
        self.session_id = params.session_id
        self.stream_id = params.stream_id
        self.initial_term_id = params.initial_term_id
        self.term_length = params.term_length
        self.mtu = params.mtu
        self.reliable = reliable
        self.receiver_id = receiver_id
        self.config = config
        self.control_address = params.source
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
        self._sending_eos_sm = False
        self._eos_position: int | None = None
        self._last_packet_ns = now_ns
        self._last_activity_ns = now_ns
        self._unsubscribed = False
        self.state = ImageState.ACTIVE
        self.removal_reason: str | None = None
        self._state_change_ns = now_ns
        retry = config.nak_retry_delay_ns
        if retry is None:
            retry = config.nak_delay_ns * NAK_UNICAST_RETRY_DELAY_RATIO
        if reliable:
            self._delay = _Delay(config.nak_delay_ns, retry, group, config, rng)
        else:
            fill = config.gap_fill_delay_ns if config.gap_fill_delay_ns is not None else config.nak_delay_ns
            self._delay = _Delay(fill, fill, False, config, rng)
        self._active_gap: tuple[int, int, int] | None = None
        self._gap_expiry_ns = 0
        self._nak_timers: dict[tuple[int, int], int] = {}
        """Reliable images: (term_id, term_offset) of each gap being NAKed -> when its next NAK is due."""
        self._lost_until = join
        """Stream bytes below this were reported lost already (or were never missing): each lost byte is
        one observation, however many NAKs or fill attempts its gap takes."""
        self._wake_ns = 0
        """``poll`` has nothing to do before this time unless input arrives (see ``ReceiveEndpoint.poll_due``)."""

        # Counters.
        self.bytes_received = 0
        self.datagrams_received = 0
        self.heartbeats_received = 0
        self.flow_control_under_runs = 0
        self.flow_control_over_runs = 0
        self.status_messages_sent = 0
        self.naks_sent = 0
        self.loss_gap_fills = 0
        self.loss_observations = 0
        self.bytes_lost = 0
        self.first_loss_ns: int | None = None
        self.last_loss_ns: int | None = None

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
                if (
                    consumption > self._next_sm_position + self.receiver_window // 4
                    or self.state is not ImageState.ACTIVE
                ):
                    self._wake_ns = 0

    def unsubscribe(self) -> None:
        """No subscriber is left: drain and go."""
        self._unsubscribed = True
        self._wake_ns = 0

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
                self._wake_ns = 0  # a higher HWM may reveal a gap; EOS may end the image
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
                self._wake_ns = 0  # a new gap, or data beyond one: scan
            self._hwm = proposed
        elif inserted:
            self._wake_ns = 0  # a retransmission (or reordered datagram) filled part of a gap
        return True

    # -- duty cycle -----------------------------------------------------------------------------

    def poll(self, now_ns: int, out: list[Outgoing], events: list[ReceiverEvent]) -> None:
        """Rebuild, detect loss, send the status message if due and move through the lifecycle."""
        rescan = False
        if self.state in (ImageState.ACTIVE, ImageState.DRAINING):
            rescan = self._track_rebuild(now_ns, out, events)
            self._send_pending_status_message(now_ns, out)
        self._on_time_event(now_ns, events)
        self._wake_ns = now_ns if rescan else self._next_wake_ns()

    def _next_wake_ns(self) -> int:
        """The earliest time a timer in ``poll`` fires, given no input meanwhile (data, consumption,
        unsubscription). Each bound mirrors a check in ``poll``; the protocol simulation checks, at
        every step, that a poll ``poll_due`` called unnecessary sends and changes nothing."""
        state = self.state
        config = self.config
        if state is ImageState.DONE:
            return 1 << 63
        if state is ImageState.LINGER:
            return self._state_change_ns + config.image_liveness_timeout_ns + 1
        wake = self._next_sm_deadline_ns + 1
        if self._active_gap is not None and self._gap_expiry_ns < wake:
            wake = self._gap_expiry_ns
        if self._nak_timers:
            wake = min(wake, min(self._nak_timers.values()))
        if state is ImageState.ACTIVE:
            return min(wake, self._last_packet_ns + config.image_liveness_timeout_ns + 1)
        if self._unsubscribed or self._consumption >= self._rcv_pos:  # drained: the linger runs
            return min(wake, self._state_change_ns + config.eos_linger_multiple * config.sm_timeout_ns + 1)
        return wake

    def _track_rebuild(self, now_ns: int, out: list[Outgoing], events: list[ReceiverEvent]) -> bool:
        """Advance the rebuild position, run the loss timer, schedule an SM; True if gaps were padded
        in every scan pass allowed, so more may be waiting for the next poll."""
        gap: tuple[int, int, int] | None = None
        rescan = False
        if self.reliable:
            self._nak_gaps(now_ns, out, events)
        else:
            for _ in range(self.config.scan_passes_per_poll):
                gap = self._scan()
                if gap is None or not self._loss_timer(gap, now_ns, events):
                    break
            else:
                rescan = True
            if gap is None:
                self._active_gap = None
        consumption = self._consumption
        if consumption > self._next_sm_position + self.receiver_window // 4:
            self._clean_buffer_to(consumption - self.term_length)
            self._next_sm_position = consumption
            self._sm_scheduled = True
        return rescan

    def _scan(self) -> tuple[int, int, int] | None:
        """Advance ``rcv-pos`` over contiguous frames towards the HWM; return the first gap found."""
        rebuild, gap = self._next_gap(max(self._rcv_pos, self._consumption))
        self._rcv_pos = max(self._rcv_pos, rebuild)
        return gap

    def _nak_gaps(self, now_ns: int, out: list[Outgoing], events: list[ReceiverEvent]) -> None:
        """Reliable images: advance ``rcv-pos`` and run a NAK timer for each gap up to the HWM (at most
        ``max_gaps_naked``). A new gap's NAK goes after the NAK delay, then again every retry delay
        while it stays; gaps that were filled drop their timers."""
        gap = self._scan()
        timers = self._nak_timers
        if gap is None:
            timers.clear()
            return
        current: list[tuple[int, int]] = []
        while gap is not None and len(current) < self.config.max_gaps_naked:
            term_id, offset, length = gap
            key = (term_id, offset)
            current.append(key)
            start = compute_position(term_id, offset, self._bits, self.initial_term_id)
            expiry = timers.get(key)
            if expiry is None:
                expiry = timers[key] = now_ns + self._delay.next(False)
            if now_ns >= expiry:
                timers[key] = now_ns + self._delay.next(True)
                self._report_loss(term_id, offset, length, now_ns, events)
                if self.is_connection_alive(now_ns):
                    nak = Nak(self.session_id, self.stream_id, term_id, offset, length)
                    out.append((nak.encode(), self.control_address))
                    self.naks_sent += 1
            _, gap = self._next_gap(start + length)
        if len(timers) > len(current):
            for key in [k for k in timers if k not in current]:
                del timers[key]

    def _next_gap(self, rebuild: int) -> tuple[int, tuple[int, int, int] | None]:
        """From ``rebuild``: how far frames run contiguously, and the gap (term_id, offset, length)
        there, if the HWM is further.

        A gap starts at the first empty slot and ends at the next filled one (stepped 32 bytes at a
        time), within the term of the rebuild position.
        """
        term_length = self.term_length
        while rebuild < self._hwm:
            hwm = self._hwm
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

    def _loss_timer(self, gap: tuple[int, int, int], now_ns: int, events: list[ReceiverEvent]) -> bool:
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
        self._next_sm_deadline_ns = now_ns + self.config.sm_timeout_ns

    def _on_time_event(self, now_ns: int, events: list[ReceiverEvent]) -> None:
        state = self.state
        config = self.config
        if state is ImageState.ACTIVE:
            if self._unsubscribed:
                reason = "unsubscribed"
            elif self._eos_position is not None and self._rcv_pos >= self._hwm:
                reason = "end_of_stream"
            elif now_ns > self._last_packet_ns + config.image_liveness_timeout_ns:
                reason = "liveness_timeout"
            else:
                return
            self.state = ImageState.DRAINING
            self.removal_reason = reason
            self._state_change_ns = now_ns
            self._sending_eos_sm = True
        elif state is ImageState.DRAINING:
            drained = self._unsubscribed or self._consumption >= self._rcv_pos
            if drained and now_ns > self._state_change_ns + config.eos_linger_multiple * config.sm_timeout_ns:
                self.state = ImageState.LINGER
                self._state_change_ns = now_ns
                events.append(ImageRemoved(self.session_id, self.stream_id, self.removal_reason or "", self))
        elif state is ImageState.LINGER and (
            self._unsubscribed or now_ns > self._state_change_ns + config.image_liveness_timeout_ns
        ):
            self.state = ImageState.DONE
            events.append(ImageReleased(self.session_id, self.stream_id, self))


class ReceiveEndpoint:
    """The protocol side of one subscription channel endpoint (one bound UDP socket).

    The driver's duty cycle is::

        for data, source in datagrams_received_on_the_endpoint_socket:
            endpoint.on_datagram(data, now_ns, source)
        for image in endpoint.images:
            image.on_consumption(min_subscriber_position(image))
        for data, destination in endpoint.poll(now_ns):
            sock.sendto(data, destination)
        for event in endpoint.take_events():
            ...  # map logs, tell clients about images, record loss

    ``add_subscription(stream_id)`` declares interest; SETUP and DATA for other streams are ignored.
    """

    def __init__(
        self,
        config: ReceiverConfig | None = None,
        *,
        receiver_id: int | None = None,
        rng: random.Random | None = None,
        log_factory: LogFactory = default_log_factory,
    ) -> None:
        config = config if config is not None else ReceiverConfig()
        config.validate()
        self.config = config
        self.rng = rng if rng is not None else random.Random()
        self.receiver_id = receiver_id if receiver_id is not None else self.rng.getrandbits(63)
        """Random per endpoint (reference 1.4): lets a sender tell its receivers apart."""
        self.log_factory = log_factory
        self._subscriptions: dict[int, bool] = {}
        """stream_id -> reliable."""
        self._images: dict[tuple[int, int], PublicationImageReceiver] = {}
        self._lingering: list[PublicationImageReceiver] = []
        self._cool_down: set[tuple[int, int]] = set()
        """Sessions whose image ended without EOS: ignored until that image's linger ends."""
        self._pending_setups: dict[tuple[int, int], int] = {}
        """(session, stream) -> time until which no further SETUP request is sent."""
        self._outbound: list[Outgoing] = []
        self._events: list[ReceiverEvent] = []
        self._wake_ns = 0
        """Earliest timer of the lingering images; 0 once a control datagram arrived (see ``poll_due``)."""

        # Counters (per-image ones live on the images).
        self.invalid_packets = 0
        self.ignored_packets = 0
        """Well-formed packets this endpoint has no use for (SM/NAK/ERR, RTTM of unknown sessions)."""
        self.no_interest_packets = 0
        """DATA/SETUP for streams nobody subscribed to here."""
        self.setups_received = 0
        self.setups_rejected = 0
        """Valid SETUPs refused by local limits (max_images, max_term_length) or a failing log factory."""
        self.setup_requests_sent = 0
        """SMs with SEND_SETUP sent to unknown sessions."""
        self.setup_requests_suppressed = 0
        self.images_created = 0
        self.outbound_overflows = 0
        self.last_error: str | None = None

    # -- subscriptions --------------------------------------------------------------------------

    def add_subscription(self, stream_id: int, *, reliable: bool = True) -> None:
        self._subscriptions[stream_id] = reliable

    def remove_subscription(self, stream_id: int) -> None:
        """Stop receiving ``stream_id``: its images drain and are removed."""
        self._subscriptions.pop(stream_id, None)
        for (_, stream), image in self._images.items():
            if stream == stream_id:
                image.unsubscribe()

    def poll_due(self, now_ns: int) -> bool:
        """False when ``poll(now_ns)`` would return nothing and change nothing, so an idle duty cycle
        can skip it: no datagram arrived since the last poll, no image's consumption moved and no
        timer (status message, NAK, liveness, linger) is due."""
        if now_ns >= self._wake_ns or self._outbound:
            return True
        for image in self._images.values():  # noqa: SIM110 - a generator for any() costs more, every idle cycle
            if now_ns >= image._wake_ns:
                return True
        return False

    @property
    def images(self) -> list[PublicationImageReceiver]:
        """Images in the endpoint (active or draining), not those lingering after removal."""
        return list(self._images.values())

    def image(self, session_id: int, stream_id: int) -> PublicationImageReceiver | None:
        return self._images.get((session_id, stream_id))

    def take_events(self) -> list[ReceiverEvent]:
        events, self._events = self._events, []
        return events

    @property
    def has_events(self) -> bool:
        """Whether ``take_events`` would return any: lets a duty cycle skip it cheaply."""
        return bool(self._events)

    # -- input ----------------------------------------------------------------------------------

    def on_datagram(self, data: BytesLike, now_ns: int, source: Address) -> None:
        """Handle one datagram received on the endpoint socket from ``source``."""
        try:
            if len(data) >= 8 and data[6] in (HDR_TYPE_DATA, HDR_TYPE_PAD) and not data[7]:
                # The hot path: validated without a Python object per frame. The image says whether
                # it needs a poll; a SETUP request lands in the outbound queue, which poll_due sees.
                self._on_data(scan_data_datagram(data), data, now_ns, source)
                return
            frames = decode_datagram(data)
        except (ValueError, struct.error):
            self.invalid_packets += 1
            return
        self._wake_ns = 0
        first = frames[0]
        if isinstance(first, SetupFrame):
            self._on_setup(first, now_ns, source)
        elif isinstance(first, RttMeasurement):
            self._on_rttm(first, source)
        else:
            self.ignored_packets += 1

    def on_datagrams(self, data: BytesLike, segment: int, now_ns: int, source: Address) -> None:
        """Handle datagrams from ``source`` received back to back in ``data``, each ``segment`` bytes
        but the last (a GRO batch): as one run when they continue an image's stream at its high-water
        mark in equal frames (one validation, one copy), else one by one."""
        total = len(data)
        if segment >= total:
            self.on_datagram(data, now_ns, source)
            return
        scan = scan_equal_frames(data)
        if scan is not None and scan.stream_id in self._subscriptions:
            image = self._images.get((scan.session_id, scan.stream_id))
            if image is not None and image.takes_run(scan.term_id, scan.term_offset, total):
                image.on_data(scan, data, now_ns, self._events, -(-total // segment))
                return
        for start in range(0, total, segment):
            self.on_datagram(data[start : start + segment], now_ns, source)

    def _queue(self, data: bytes, destination: Address) -> None:
        if len(self._outbound) >= self.config.max_outbound:
            self.outbound_overflows += 1
            return
        self._outbound.append((data, destination))

    def _on_data(self, scan: DataScan, data: BytesLike, now_ns: int, source: Address) -> None:
        stream_id = scan.stream_id
        if stream_id not in self._subscriptions:
            self.no_interest_packets += 1
            return
        key = (scan.session_id, stream_id)
        image = self._images.get(key)
        if image is not None:
            if not image.on_data(scan, data, now_ns, self._events):
                self.invalid_packets += 1
            return
        if scan.flags & EOS_FLAG or key in self._cool_down:
            return
        self._request_setup(key, now_ns, source)

    def _request_setup(self, key: tuple[int, int], now_ns: int, source: Address) -> None:
        """Ask an unknown session for SETUP (a late joiner gets none otherwise), at most once per period."""
        pending = self._pending_setups
        until = pending.get(key)
        if until is not None and now_ns < until:
            return
        if until is None and len(pending) >= self.config.max_pending_setups:
            for stale in [k for k, t in pending.items() if t <= now_ns]:
                del pending[stale]
            if len(pending) >= self.config.max_pending_setups:
                self.setup_requests_suppressed += 1
                return
        pending[key] = now_ns + self.config.pending_setup_timeout_ns
        session_id, stream_id = key
        request = StatusMessage(session_id, stream_id, 0, 0, 0, self.receiver_id, None, SM_SEND_SETUP_FLAG)
        self._queue(request.encode(), source)
        self.setup_requests_sent += 1

    def _on_setup(self, setup: SetupFrame, now_ns: int, source: Address) -> None:
        stream_id = setup.stream_id
        reliable = self._subscriptions.get(stream_id)
        if reliable is None:
            self.no_interest_packets += 1
            return
        self.setups_received += 1
        key = (setup.session_id, stream_id)
        image = self._images.get(key)
        if image is not None:
            image.on_setup(now_ns)
            return
        if key in self._cool_down:
            return
        problem = self._setup_problem(setup)
        if problem is not None:
            self.invalid_packets += 1
            self.last_error = f"invalid SETUP from {source!r}: {problem}"
            return
        if setup.term_length > self.config.max_term_length:
            self._reject(f"SETUP term length {setup.term_length} above max_term_length {self.config.max_term_length}")
            return
        if len(self._images) + len(self._lingering) >= self.config.max_images:
            self._reject(f"SETUP refused: {self.config.max_images} images already")
            return
        params = ImageParams(
            setup.session_id,
            stream_id,
            setup.initial_term_id,
            setup.active_term_id,
            setup.term_offset,
            setup.term_length,
            setup.mtu,
            source,
        )
        try:
            log = self.log_factory(params)
            log.initialize(
                initial_term_id=setup.initial_term_id,
                session_id=setup.session_id,
                stream_id=stream_id,
                mtu=setup.mtu,
                term_id=setup.active_term_id,
                term_offset=setup.term_offset,
                receiver_window=min(self.config.receiver_window, setup.term_length // 2),
                reliable=reliable,
            )
        except (OSError, ValueError) as exc:
            self._reject(f"could not create the image log: {exc}")
            return
        image = PublicationImageReceiver(
            log,
            params,
            reliable=reliable,
            group=bool(setup.flags & SETUP_GROUP_FLAG),
            receiver_id=self.receiver_id,
            config=self.config,
            rng=self.rng,
            now_ns=now_ns,
        )
        self._images[key] = image
        self._pending_setups.pop(key, None)
        self.images_created += 1
        self._events.append(ImageCreated(setup.session_id, stream_id, source, image.join_position, image))

    def _setup_problem(self, setup: SetupFrame) -> str | None:
        """Why a SETUP breaks the receiver's rules (reference 1.3), or None if it is acceptable."""
        term_length = setup.term_length
        if not TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH or not is_power_of_two(term_length):
            return f"term length {term_length} is not a power of 2 in [{TERM_MIN_LENGTH}, {TERM_MAX_LENGTH}]"
        if not 0 <= setup.term_offset < term_length or setup.term_offset % FRAME_ALIGNMENT:
            return f"term offset {setup.term_offset} is not 32-aligned in [0, {term_length})"
        mtu = setup.mtu
        if not DATA_HEADER_LENGTH < mtu <= MTU_MAX or mtu % FRAME_ALIGNMENT:
            return f"mtu {mtu} is not a multiple of 32 in (32, {MTU_MAX}]"
        window = min(self.config.receiver_window, term_length // 2)
        if mtu > window or mtu > self.config.so_rcvbuf:
            return f"mtu {mtu} exceeds the receiver window {window} or SO_RCVBUF {self.config.so_rcvbuf}"
        if wrap_i32(setup.active_term_id - setup.initial_term_id) < 0:
            return f"active term {setup.active_term_id} precedes initial term {setup.initial_term_id}"
        return None

    def _reject(self, reason: str) -> None:
        self.setups_rejected += 1
        self.last_error = reason

    def _on_rttm(self, rttm: RttMeasurement, source: Address) -> None:
        if (rttm.session_id, rttm.stream_id) not in self._images or not rttm.flags & RTTM_REPLY_FLAG:
            self.ignored_packets += 1
            return
        reply = RttMeasurement(rttm.session_id, rttm.stream_id, rttm.echo_timestamp, 0, self.receiver_id, 0)
        self._queue(reply.encode(), source)

    # -- output ---------------------------------------------------------------------------------

    def poll(self, now_ns: int) -> list[Outgoing]:
        """Datagrams to send now, each with its destination: queued replies, then every image's SM/NAK."""
        out, self._outbound = self._outbound, []
        events = self._events
        removed: list[tuple[int, int]] = []
        for key, image in self._images.items():
            image.poll(now_ns, out, events)
            if image.state is not ImageState.ACTIVE and image.state is not ImageState.DRAINING:
                removed.append(key)
        for key in removed:
            image = self._images.pop(key)
            if not image.is_end_of_stream:
                self._cool_down.add(key)
            self._lingering.append(image)
        wake = 1 << 63
        if self._lingering:
            still: list[PublicationImageReceiver] = []
            for image in self._lingering:
                image.poll(now_ns, out, events)
                if image.state is ImageState.DONE:
                    self._cool_down.discard((image.session_id, image.stream_id))
                else:
                    still.append(image)
                    wake = min(wake, image._wake_ns)
            self._lingering = still
        self._wake_ns = wake
        return out
