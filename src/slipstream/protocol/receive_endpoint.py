"""The receiving side of Aeron UDP: one subscription channel endpoint, as a sans-I/O state machine.

:class:`ReceiveEndpoint` is what a subscription's UDP socket feeds: it answers SETUP for subscribed
streams by creating a :class:`~slipstream.protocol.image.PublicationImageReceiver` (whose log comes
from the ``log_factory`` given to the constructor), asks unknown sessions for SETUP, and routes DATA
to images. Behaviour and bounds follow the C media driver (reference sections 2.2-2.5).

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
- A subscribed stream may carry its own budget (:class:`~slipstream.protocol.config.ImageLimits`: term
  length, images in total and per source address): a port anyone can reach then costs a stranger only
  that much. A stream whose every subscription names a session (``session-id``) makes images only for
  those sessions, as Aeron's session-specific subscriptions do, and asks no other session for SETUP.
- A subscriber may reject an image (:meth:`ReceiveEndpoint.reject_image`): an ERR frame (code 13,
  IMAGE_REJECTED) goes to its sender and the image is removed at once.
- The subscribers' consumption position is capped at the high-water mark and never moves back.
- With ``reliable=False`` a gap may wait ``gap_fill_delay_ns`` for reordered data before it is
  padded (default: the NAK delay, as in C).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Collection

from ..logbuffer.fastpath import FAST
from ..wire.address import Address, host_of
from ..wire.constants import (
    DATA_HEADER_LENGTH,
    EOS_FLAG,
    ERROR_CODE_IMAGE_REJECTED,
    FRAME_ALIGNMENT,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    MTU_MAX,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SM_SEND_SETUP_FLAG,
    TERM_MAX_LENGTH,
    TERM_MIN_LENGTH,
)
from ..wire.frames import (
    BytesLike,
    DataScan,
    ErrorFrame,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_datagram,
    scan_data_datagram,
    scan_equal_frames,
)
from ..wire.positions import is_power_of_two, wrap_i32
from .config import ImageLimits, ReceiverConfig
from .events import ImageCreated, ReceiverEvent
from .image import (
    ImageParams,
    ImageState,
    LogFactory,
    Outgoing,
    PublicationImageReceiver,
    default_log_factory,
)

__all__ = ["MAX_REJECT_TEXT", "ReceiveEndpoint"]

MAX_REJECT_TEXT = 256
"""Bytes of a rejection's reason an ERR frame carries."""

_c_scan_equal_frames = FAST.scan_equal_frames if FAST is not None else None
"""``scan_equal_frames`` in C when the fast path is active (same result; tests/test_fastpath.py)."""


def _py_scan_equal_frames(data: BytesLike, result_type: type[DataScan]) -> DataScan | None:
    """``scan_equal_frames`` called as its C twin is."""
    return scan_equal_frames(data)


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
            ...  # image_by_id(event.image_id): tell clients about images, record loss, release logs

    ``add_subscription(stream_id)`` declares interest; SETUP and DATA for other streams are ignored.
    """

    def __init__(
        self,
        config: ReceiverConfig | None = None,
        *,
        receiver_id: int | None = None,
        rng: random.Random | None = None,
        log_factory: LogFactory = default_log_factory,
        control: Address | None = None,
    ) -> None:
        config = config if config is not None else ReceiverConfig()
        config.validate()
        self.config = config
        self.rng = rng if rng is not None else random.Random()
        self.receiver_id = receiver_id if receiver_id is not None else self.rng.getrandbits(63)
        """Random per endpoint (reference 1.4): lets a sender tell its receivers apart."""
        self._log_factory = log_factory
        self.control = control
        """Dynamic MDC: the publication's control address. The endpoint registers there every
        ``mdc_registration_interval_ns`` (an SM asking for SETUP, from the data socket, so a NAT on the
        way learns the mapping the data comes back on), and its images send SMs and NAKs there."""
        self._next_registration_ns = 0
        self._subscriptions: dict[int, bool] = {}
        """stream_id -> reliable."""
        self._sessions: dict[int, frozenset[int]] = {}
        """stream_id -> the only sessions it makes images for (streams every subscription of which names one)."""
        self._limits: dict[int, ImageLimits] = {}
        """stream_id -> its budget, for streams that have one."""
        self._images: dict[tuple[int, int], PublicationImageReceiver] = {}
        self._lingering: list[PublicationImageReceiver] = []
        self._by_id: dict[int, PublicationImageReceiver] = {}
        """Every image not yet released (active, draining or lingering), by the id its events carry."""
        self._next_image_id = 0
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
        """Valid SETUPs refused by local limits (max_images, max_term_length, a stream's budget) or a failing
        log factory."""
        self.setups_over_budget = 0
        """Of those, SETUPs beyond their stream's :class:`ImageLimits`."""
        self.images_rejected = 0
        """Images a subscriber rejected (``reject_image``)."""
        self.setup_requests_sent = 0
        """SMs with SEND_SETUP sent to unknown sessions."""
        self.setup_requests_suppressed = 0
        self.images_created = 0
        self.outbound_overflows = 0
        self.last_error: str | None = None

    # -- subscriptions --------------------------------------------------------------------------

    def add_subscription(
        self,
        stream_id: int,
        *,
        reliable: bool = True,
        sessions: Collection[int] | None = None,
        limits: ImageLimits | None = None,
    ) -> None:
        """Receive ``stream_id``: its SETUPs make images (``reliable=False``: gaps are padded, not NAKed),
        only for ``sessions`` when given and only within ``limits``. Called again for the same stream, it
        replaces what was said (the driver passes what all the stream's subscriptions want together)."""
        self._subscriptions[stream_id] = reliable
        if sessions is None:
            self._sessions.pop(stream_id, None)
        else:
            self._sessions[stream_id] = frozenset(sessions)
        if limits is None or limits.is_unlimited:
            self._limits.pop(stream_id, None)
        else:
            limits.validate()
            self._limits[stream_id] = limits

    def remove_subscription(self, stream_id: int) -> None:
        """Stop receiving ``stream_id``: its images drain and are removed."""
        self._subscriptions.pop(stream_id, None)
        self._sessions.pop(stream_id, None)
        self._limits.pop(stream_id, None)
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
            if now_ns >= image.deadline_ns:
                return True
        return False

    @property
    def deadline_ns(self) -> int:
        """When ``poll`` is next due without input (0: now): the time an adapter arms its timer for."""
        if self._outbound:
            return 0
        return min(self._wake_ns, min((image.deadline_ns for image in self._images.values()), default=1 << 63))

    @property
    def images(self) -> list[PublicationImageReceiver]:
        """Images in the endpoint (active or draining), not those lingering after removal."""
        return list(self._images.values())

    def image(self, session_id: int, stream_id: int) -> PublicationImageReceiver | None:
        """The active or draining image of a session, if any."""
        return self._images.get((session_id, stream_id))

    def image_by_id(self, image_id: int) -> PublicationImageReceiver | None:
        """The image an event names, until its :class:`~slipstream.protocol.events.ImageReleased`."""
        return self._by_id.get(image_id)

    def take_events(self) -> list[ReceiverEvent]:
        """What happened since the last call, oldest first."""
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
                scan = _c_scan_equal_frames(data, DataScan) if _c_scan_equal_frames is not None else None
                self._on_data(scan or scan_data_datagram(data), data, now_ns, source)
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
        mark in equal frames (one validation, one copy; a shorter last datagram after it), else one by one."""
        total = len(data)
        if segment >= total:
            self.on_datagram(data, now_ns, source)
            return
        scan_run = _c_scan_equal_frames or _py_scan_equal_frames
        scan = scan_run(data, DataScan)
        run, head = total, data
        if scan is None and total % segment:
            # A batch ending with a shorter datagram, where the sender's run of equal ones ended (the last
            # fragment of a message): the equal ones are the run, the short one follows on its own.
            run -= total % segment
            head = data[:run]
            scan = scan_run(head, DataScan)
        # Each datagram must hold whole frames: a (corrupt) first length spanning several is no run.
        if (
            scan is not None
            and scan.stream_id in self._subscriptions
            and not segment % ((scan.first_frame_length + 31) & -32)
        ):
            image = self._images.get((scan.session_id, scan.stream_id))
            if image is not None and image.takes_run(scan.term_id, scan.term_offset, run):
                image.on_data(scan, head, now_ns, self._events, -(-run // segment))
                if run < total:
                    self.on_datagram(data[run:], now_ns, source)
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
        sessions = self._sessions.get(stream_id)
        if sessions is not None and scan.session_id not in sessions:
            self.no_interest_packets += 1
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
        sessions = self._sessions.get(stream_id)
        if sessions is not None and setup.session_id not in sessions:
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
        limits = self._limits.get(stream_id)
        over = None if limits is None else self._over_budget(limits, setup, source)
        if over is not None:
            self.setups_over_budget += 1
            self._reject(f"SETUP refused: stream {stream_id} {over}")
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
            self._next_image_id + 1,
        )
        try:
            image_log = self._log_factory(params)
            image_log.log.initialize(
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
        self._next_image_id += 1
        image = PublicationImageReceiver(
            image_log,
            params,
            reliable=reliable,
            group=bool(setup.flags & SETUP_GROUP_FLAG),
            receiver_id=self.receiver_id,
            config=self.config,
            rng=self.rng,
            now_ns=now_ns,
        )
        if self.control is not None:
            image.control_address = self.control  # data comes from the control port's socket too
        self._images[key] = image
        self._by_id[image.image_id] = image
        self._pending_setups.pop(key, None)
        self.images_created += 1
        self._events.append(ImageCreated(setup.session_id, stream_id, source, image.join_position, image.image_id))

    def _over_budget(self, limits: ImageLimits, setup: SetupFrame, source: Address) -> str | None:
        """Why a new image of ``setup``'s stream would exceed the stream's budget, or None."""
        if limits.max_term_length is not None and setup.term_length > limits.max_term_length:
            return f"term length {setup.term_length} above its max-term-length {limits.max_term_length}"
        stream_id, host = setup.stream_id, host_of(source)
        total = from_source = 0
        for image in (*self._images.values(), *self._lingering):
            if image.stream_id == stream_id:
                total += 1
                from_source += host_of(image.source) == host
        if limits.max_images is not None and total >= limits.max_images:
            return f"has its max-images {limits.max_images}"
        if limits.max_images_per_source is not None and from_source >= limits.max_images_per_source:
            return f"has its max-images-per-source {limits.max_images_per_source}"
        return None

    def reject_image(self, image_id: int, reason: str) -> bool:
        """A subscriber refuses an image (Aeron's ``Image.reject``): its sender is sent an ERR frame with
        ``reason`` (truncated, ASCII) and the image is removed at once (its session then waits out the
        linger, as after a timeout). False if no such image is active."""
        image = self._by_id.get(image_id)
        if image is None or image.state is not ImageState.ACTIVE:
            return False
        text = reason.encode("ascii", "replace")[:MAX_REJECT_TEXT].decode("ascii")
        frame = ErrorFrame(image.session_id, image.stream_id, self.receiver_id, ERROR_CODE_IMAGE_REJECTED, text)
        self._queue(frame.encode(), image.control_address)
        image.reject()
        self.images_rejected += 1
        self._wake_ns = 0
        return True

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
        """Datagrams to send now, each with its destination: a due MDC registration, queued replies,
        then every image's SM/NAK."""
        out, self._outbound = self._outbound, []
        control = self.control
        if control is not None and now_ns >= self._next_registration_ns:
            self._next_registration_ns = now_ns + self.config.mdc_registration_interval_ns
            registration = StatusMessage(0, 0, 0, 0, 0, self.receiver_id, flags=SM_SEND_SETUP_FLAG)
            out.insert(0, (registration.encode(), control))
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
            elif key[1] in self._limits:
                image.unsubscribe()  # a budgeted stream's finished image gives its log back now, not after the linger
            self._lingering.append(image)
        wake = 1 << 63
        if self._lingering:
            still: list[PublicationImageReceiver] = []
            for image in self._lingering:
                image.poll(now_ns, out, events)
                if image.state is ImageState.DONE:
                    self._cool_down.discard((image.session_id, image.stream_id))
                    del self._by_id[image.image_id]
                else:
                    still.append(image)
                    wake = min(wake, image.deadline_ns)
            self._lingering = still
        if control is not None and self._next_registration_ns < wake:
            wake = self._next_registration_ns
        self._wake_ns = wake
        return out
