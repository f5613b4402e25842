"""The sending side of one network publication, as a sans-I/O state machine.

:class:`NetworkPublicationSender` reads the frames an application appended to a publication's
:class:`~slipstream.logbuffer.LogBuffers` and turns them into Aeron wire traffic: SETUP until a
receiver answers, DATA within the flow-control window, heartbeats, retransmissions for NAKs, replies
to RTT probes and, once closed, end-of-stream. It never touches a socket or a clock: the driver feeds
it received control datagrams (``on_datagram``) and the time, and sends what ``poll`` returns on the
publication's connected UDP socket. Every timing and bound follows the C media driver (reference
sections 2.2-2.5), so a reference Aeron subscription sees the same behaviour.

Datagrams from the network are untrusted: they are decoded with the shared codec, checked against
the reference bounds, counted and dropped when bad; nothing they say sizes an allocation.

NAKs are served by its :class:`~slipstream.protocol.retransmit.RetransmitHandler` and status
messages set its limit through :class:`~slipstream.protocol.flow_control.FlowControl`, as Aeron splits
them out of its publication; both modules say where they differ from the C driver on purpose. What
happens to the publication (connected, disconnected, an ERR frame, end-of-stream sent, finished)
comes out of ``take_events()`` as pure data. On multi-destination-cast it keeps the destinations:
learned from status messages and expired when dynamic, added and removed by the application when
manual; ``poll_batches`` says where each batch of datagrams goes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ..logbuffer import LogBuffers, is_equal_run, scan_term
from ..logbuffer.fastpath import FAST
from ..wire.address import Address
from ..wire.constants import (
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    HDR_TYPE_SM,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SM_EOS_FLAG,
    SM_LENGTH,
    SM_SEND_SETUP_FLAG,
)
from ..wire.frames import (
    BytesLike,
    DataFrame,
    ErrorFrame,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_datagram,
)
from ..wire.positions import compute_position, compute_term_id, index_by_position
from .config import SenderConfig
from .events import (
    DestinationAdded,
    DestinationRemoved,
    PublicationConnected,
    PublicationDisconnected,
    PublicationEndOfStreamSent,
    PublicationErrorReceived,
    PublicationFinished,
    SenderEvent,
)
from .flow_control import FlowControl
from .lifecycle import ACTIVE, DONE, DRAINING, LINGER, SenderState
from .retransmit import RetransmitHandler

__all__ = ["NetworkPublicationSender", "SenderConfig", "SenderState"]

_c_cut_datagrams: Callable[[memoryview, int, int, int, int, list[BytesLike]], tuple[int, int, bool]] | None = (
    FAST.cut_datagrams if FAST is not None else None
)
"""The C cut of new data into datagrams (the loop of ``_send_data``), or None for the Python one."""


SETUP_AT_ONCE_LIMIT = 1024
"""New dynamic-MDC destinations answered with their own SETUP per poll (more wait for the periodic one)."""


class NetworkPublicationSender:
    """Sender state machine of one publication session (one ``session_id``/``stream_id`` on one channel).

    The driver's duty cycle is::

        for data, source in datagrams_received_on_the_publication_socket:
            sender.on_datagram(data, now_ns, source)
        if sender.poll_due(now_ns):            # else poll would send nothing and change nothing
            for datagrams, destination in sender.poll_batches(now_ns):
                sock.send(datagrams, destination)  # None: the connected peer (unicast); else each MDC destination
            pub_lmt = sender.publisher_limit()  # the appender may append below this position
        if sender.has_events:
            for event in sender.take_events():
                ...  # connected, disconnected, ERR received, end of stream sent, finished (retire it)

    Counters are plain ints that only grow, for the driver to mirror into its counters file.
    """

    def __init__(self, log: LogBuffers, config: SenderConfig | None = None) -> None:
        config = config if config is not None else SenderConfig()
        config.validate()
        self.config = config
        self.log = log
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self.mtu = log.mtu
        self._bits = log.bits
        self._mask = log.term_length - 1
        self.term_window = log.publication_window or log.term_length // 2
        """How far ahead of the sender position the application may append (``pub-wnd``)."""
        self._retransmit = RetransmitHandler(log, config)

        start = log.producer_position()
        self._snd_pos = start
        self._flow = FlowControl(config, start)
        self.state = ACTIVE
        self._has_initial_connection = False
        self._setup_elicited = False
        self._is_end_of_stream = False
        self._received_eos = False
        self._track_sender_limits = True
        self._is_connected = False
        self._last_setup_ns: int | None = None
        self._last_data_or_heartbeat_ns: int | None = None
        self._heartbeat_period_ns = config.heartbeat_timeout_ns
        """The idle period before the next heartbeat (idle_heartbeat_max_ns after the first with nothing new)."""
        self._blocked = False
        """Data is waiting but the receiver window is exhausted (see ``blocked_heartbeat_ns``)."""
        self._linger_start_ns = 0
        self._receivers = self._flow.receivers
        """receiver_id -> time of its last status message (the flow control's)."""
        self._eos_sent = False
        self._events: list[SenderEvent] = []
        self._dynamic = config.control_mode == "dynamic"
        self._destinations: dict[Address, int] = {}
        """MDC destinations -> time of their last status message (manual ones never expire)."""
        self._setup_for: list[Address] = []
        """Dynamic MDC: destinations new since the last poll that asked for SETUP; each gets its own at
        once (``poll_batches``), instead of waiting up to the setup timeout for the next one to all."""
        self._replies: list[BytesLike] = []
        self._resends: list[BytesLike] = []
        """Retransmissions made as NAKs arrived, for the next poll: at most four polls' retransmit budget."""
        self._wake_ns = 0
        """``poll`` has nothing to do before this time unless input arrives (see ``poll_due``)."""
        self._tails = log.meta_i64
        """The log's raw tail counters (its first three i64s): an append changes the one at ``_tail_index``."""
        self._tail_index = 0
        self._tail_seen = 0
        log.is_connected = False

        # Counters.
        self.bytes_sent = 0
        """Bytes of new data sent (retransmissions and heartbeats excluded)."""
        self.datagrams_sent = 0
        self.naks_received = 0
        self.status_messages_received = 0
        self.status_messages_rejected = 0
        """SMs whose position is more than half a term from the sender position."""
        self.heartbeats_sent = 0
        self.setups_sent = 0
        self.rttm_replies_sent = 0
        self.errors_received = 0
        self.invalid_packets = 0
        self.ignored_packets = 0
        """Well-formed packets for another session or of a type a sender does not handle."""
        self.flow_control_limits = 0
        """Times the sender had data but the receiver window was exhausted."""
        self.last_error: str | None = None
        """Text of the last ERR frame received (e.g. a receiver rejected the image)."""

    # -- retransmit counters (kept by the retransmit handler) ------------------------------------

    @property
    def retransmits_sent(self) -> int:
        """Retransmissions started (one per NAK served, however many datagrams it took)."""
        return self._retransmit.retransmits_sent

    @property
    def retransmitted_bytes(self) -> int:
        """Bytes resent for NAKs."""
        return self._retransmit.retransmitted_bytes

    @property
    def naks_ignored(self) -> int:
        """NAKs overlapping a retransmission in progress or lingering (reference: 10 ms linger)."""
        return self._retransmit.naks_ignored

    @property
    def naks_outside_window(self) -> int:
        """Valid NAKs for data no longer (or not yet) in the resend window: nothing to resend."""
        return self._retransmit.naks_outside_window

    @property
    def retransmit_overflows(self) -> int:
        """Group channels: NAKs dropped because every retransmit action was busy."""
        return self._retransmit.retransmit_overflows

    # -- state for the driver -------------------------------------------------------------------

    @property
    def sender_position(self) -> int:
        """``snd-pos``: the position up to which data has been sent (it does not wait for acknowledgement)."""
        return self._snd_pos

    @property
    def sender_limit(self) -> int:
        """``snd-lmt``: the flow-control limit, max(sm_position + receiver_window) over status messages."""
        return self._flow.sender_limit

    @property
    def is_connected(self) -> bool:
        """True while some receiver sent a status message within the connection timeout."""
        return self._is_connected

    @property
    def has_initial_connection(self) -> bool:
        return self._has_initial_connection

    @property
    def is_end_of_stream(self) -> bool:
        return self._is_end_of_stream

    @property
    def is_done(self) -> bool:
        """True once lingering ended (also reported once as ``PublicationFinished``)."""
        return self.state is DONE

    @property
    def max_datagrams_per_poll(self) -> int:
        """Upper bound of ``len(poll(...))``."""
        c = self.config
        return c.max_pending_replies + 1 + c.max_messages_per_send + 1 + 5 * c.max_retransmit_datagrams_per_poll

    def producer_position(self) -> int:
        return self.log.producer_position()

    def publisher_limit(self) -> int:
        """``pub-lmt`` for the appender: sender position + term window while connected, else the sender
        position, so ``offer`` returns NOT_CONNECTED (or BACK_PRESSURED) instead of filling the log."""
        if self.state is ACTIVE and self._is_connected:
            return self._snd_pos + self.term_window
        return self._snd_pos

    def close(self) -> None:
        """Start draining: send what was appended, then signal end-of-stream and linger."""
        if self.state is ACTIVE:
            self.state = DRAINING
            self._wake_ns = 0

    @property
    def deadline_ns(self) -> int:
        """When ``poll`` is next due without input (0: now). An append to the log also makes it due
        while the window is open; ``poll_due`` checks that too."""
        return self._wake_ns

    def take_events(self) -> list[SenderEvent]:
        """What happened since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    @property
    def has_events(self) -> bool:
        """Whether ``take_events`` would return any: lets a duty cycle skip it cheaply."""
        return bool(self._events)

    def poll_due(self, now_ns: int) -> bool:
        """False when ``poll(now_ns)`` would return nothing and change nothing, so an idle duty cycle
        can skip it: no timer is due, no datagram arrived since the last poll, and the application has
        not appended since (or the window is shut anyway). A comparison and one tail-counter read."""
        if now_ns >= self._wake_ns:
            return True
        return not self._blocked and self._tails[self._tail_index] != self._tail_seen

    # -- multi-destination-cast -----------------------------------------------------------------

    @property
    def destinations(self) -> dict[Address, int]:
        """MDC destinations -> time of their last status message (manual ones: never expire). Read-only."""
        return self._destinations

    def add_destination(self, address: Address) -> None:
        """Manual MDC: a destination that stays until removed."""
        self._destinations[address] = 1 << 62

    def remove_destination(self, address: Address) -> bool:
        """Manual MDC: stop sending to ``address``; False if it was not a destination."""
        return self._destinations.pop(address, None) is not None

    def _expire_destinations(self, now_ns: int) -> None:
        timeout = self.config.destination_timeout_ns
        expired = [d for d, seen in self._destinations.items() if now_ns - seen > timeout]
        for destination in expired:
            del self._destinations[destination]
            self._events.append(DestinationRemoved(self.session_id, self.stream_id, destination))

    # -- input ----------------------------------------------------------------------------------

    def on_datagram(self, data: BytesLike, now_ns: int, source: Address = None) -> None:
        """Handle one datagram received on the publication's socket (SM, NAK, RTTM or ERR) from ``source``."""
        fresh: Address = None
        if self._dynamic and len(data) >= SM_LENGTH and data[6] == HDR_TYPE_SM and not data[7]:
            # Dynamic MDC: any status message at the control port adds or refreshes its source as a
            # destination: the reply traffic a NAT lets through (reference 3.2, 3.5).
            if source not in self._destinations:
                self._events.append(DestinationAdded(self.session_id, self.stream_id, source))
                fresh = source
            self._destinations[source] = now_ns
        if self.state is DONE:
            return
        self._wake_ns = 0
        try:
            frame = decode_datagram(data)[0]
        except (ValueError, struct.error):
            self.invalid_packets += 1
            return
        if isinstance(frame, StatusMessage):
            self._on_status_message(frame, now_ns, fresh)
        elif isinstance(frame, Nak):
            self._on_nak(frame, now_ns)
        elif isinstance(frame, RttMeasurement):
            self._on_rttm(frame)
        elif isinstance(frame, ErrorFrame):
            self._on_error(frame, now_ns)
        else:
            self.ignored_packets += 1

    def _is_mine(self, session_id: int, stream_id: int) -> bool:
        if session_id == self.session_id and stream_id == self.stream_id:
            return True
        self.ignored_packets += 1
        return False

    def _on_status_message(self, sm: StatusMessage, now_ns: int, fresh: Address = None) -> None:
        if fresh is not None and sm.flags & SM_SEND_SETUP_FLAG and sm.session_id == 0 and sm.stream_id == 0:
            # A receiver new to this dynamic-MDC endpoint asks every publication on it for SETUP (the
            # session-less form Aeron's receivers send when they add the control destination).
            self._setup_at_once(fresh)
            return
        if not self._is_mine(sm.session_id, sm.stream_id):
            return
        term_length = self.term_length
        offset = sm.consumption_term_offset
        window = sm.receiver_window
        if not (0 <= offset < term_length and offset % FRAME_ALIGNMENT == 0 and 0 <= window <= term_length // 2):
            self.invalid_packets += 1
            return
        self.status_messages_received += 1
        if sm.flags & SM_SEND_SETUP_FLAG:
            # A receiver without an image asks for SETUP; its position fields carry nothing.
            if not self._is_end_of_stream:
                self._setup_elicited = True
                if fresh is not None:
                    self._setup_at_once(fresh)
            return
        position = compute_position(sm.consumption_term_id, offset, self._bits, self.initial_term_id)
        if abs(position - self._snd_pos) > term_length // 2:
            self.status_messages_rejected += 1
            return
        eos = bool(sm.flags & SM_EOS_FLAG)
        if eos:
            # One receiver leaving ends the linger only on unicast; a group has others.
            self._received_eos = self._received_eos or not self.config.group
        self._flow.on_status_message(sm.receiver_id, position + window, eos, now_ns)
        self._has_initial_connection = True
        self._update_connected(now_ns)

    def _update_connected(self, now_ns: int) -> None:
        self._flow.expire(now_ns)
        connected = bool(self._receivers)
        if connected != self._is_connected:
            self._set_connected(connected)

    def _set_connected(self, connected: bool) -> None:
        self._is_connected = connected
        self.log.is_connected = connected
        event = PublicationConnected if connected else PublicationDisconnected
        self._events.append(event(self.session_id, self.stream_id))

    def _on_nak(self, nak: Nak, now_ns: int) -> None:
        if not self._is_mine(nak.session_id, nak.stream_id):
            return
        term_length = self.term_length
        offset, length = nak.term_offset, nak.length
        if not (0 <= offset < term_length and offset % FRAME_ALIGNMENT == 0 and 0 <= length <= term_length - offset):
            self.invalid_packets += 1
            return
        self.naks_received += 1
        if length == 0:
            return
        self._retransmit.on_nak(nak.term_id, offset, length, self._snd_pos, now_ns, self._resends)

    def _on_rttm(self, rttm: RttMeasurement) -> None:
        if not self._is_mine(rttm.session_id, rttm.stream_id) or not rttm.flags & RTTM_REPLY_FLAG:
            return
        if len(self._replies) >= self.config.max_pending_replies:
            self.ignored_packets += 1
            return
        reply = RttMeasurement(self.session_id, self.stream_id, rttm.echo_timestamp, 0, rttm.receiver_id, 0)
        self._replies.append(reply.encode())

    def _on_error(self, error: ErrorFrame, now_ns: int) -> None:
        if not self._is_mine(error.session_id, error.stream_id):
            return
        self.errors_received += 1
        self.last_error = f"code {error.error_code}: {error.error_text}"
        self._events.append(
            PublicationErrorReceived(
                self.session_id, self.stream_id, error.receiver_id, error.error_code, error.error_text
            )
        )
        self._flow.remove(error.receiver_id)
        self._update_connected(now_ns)

    # -- output ---------------------------------------------------------------------------------

    def poll(self, now_ns: int) -> list[BytesLike]:
        """Datagrams to send now, in order (at most :attr:`max_datagrams_per_poll`).

        New data comes as slices of the log's terms, as Aeron sends it (no copy): hand them to the socket
        in this duty cycle, and copy any kept longer (the log's partitions are reused as it rotates)."""
        out: list[BytesLike] = []
        if self.state is DONE:
            return out
        if self._replies:
            out.extend(self._replies)
            self.rttm_replies_sent += len(self._replies)
            self._replies.clear()
        if self._resends:
            out.extend(self._resends)
            self._resends.clear()
        if not self._has_initial_connection or self._setup_elicited:
            self._setup_check(now_ns, out)
        if self._send_data(now_ns, out) == 0:
            self._heartbeat_check(now_ns, out)
            self._update_connected(now_ns)
        if self._retransmit.active:
            self._retransmit.process(now_ns, self._snd_pos, out)
        if self.state is not ACTIVE:
            self._on_time_event(now_ns)
        self.datagrams_sent += len(out)
        self._wake_ns = self._next_wake_ns(now_ns)
        return out

    def poll_fresh(self, now_ns: int) -> list[BytesLike] | None:
        """New data only, for an application that just appended and wants it on the wire now (an
        invoker-mode driver's ``send_now``): ``poll``'s data datagrams, without its other checks. None
        when anything else may be owed first or instead (replies, resends, a SETUP, retransmissions, a
        stream that is not simply active): then call ``poll``. On multi-destination-cast the datagrams go
        to every destination (:meth:`poll_fresh_batches` says where).

        When data went, the wake-up time is set as ``poll`` sets it; otherwise the next ``poll`` is due
        at once and decides (a blocked heartbeat)."""
        if (
            self.state is not ACTIVE
            or self._replies
            or self._resends
            or self._setup_elicited
            or not self._has_initial_connection
            or self._retransmit.active
            or self._setup_for
        ):
            return None
        out: list[BytesLike] = []
        consumed = self._send_data(now_ns, out)
        self.datagrams_sent += len(out)
        # Nothing sent: the window may be shut, and only ``poll`` beats a blocked heartbeat.
        self._wake_ns = self._next_wake_ns(now_ns) if consumed else 0
        return out

    def poll_batches(self, now_ns: int) -> list[tuple[list[BytesLike], Address | None]]:
        """``poll``'s datagrams with where they go: one batch for the connected peer (destination None)
        on unicast, the same batch for every destination on MDC (expired dynamic ones dropped first)."""
        early = self._early_setups() if self._setup_for else []
        return early + self._batches(self.poll(now_ns), now_ns)

    def poll_fresh_batches(self, now_ns: int) -> list[tuple[list[BytesLike], Address | None]] | None:
        """:meth:`poll_fresh`'s datagrams with where they go, as :meth:`poll_batches` gives them (a server's
        stream to a client is dynamic MDC, for NAT traversal: its replies leave at once too); None as
        ``poll_fresh`` declines."""
        datagrams = self.poll_fresh(now_ns)
        return None if datagrams is None else self._batches(datagrams, now_ns)

    def _batches(self, datagrams: list[BytesLike], now_ns: int) -> list[tuple[list[BytesLike], Address | None]]:
        """``datagrams`` for the connected peer (destination None) on unicast, for every destination on MDC
        (expired dynamic ones dropped first)."""
        if not datagrams:
            return []
        if self.config.control_mode is None:
            return [(datagrams, None)]
        if self._dynamic:
            self._expire_destinations(now_ns)
        return [(datagrams, destination) for destination in self._destinations]

    def _setup_at_once(self, destination: Address) -> None:
        """Queue a SETUP to ``destination`` alone for the next ``poll_batches`` (bounded per poll)."""
        if not self._is_end_of_stream and len(self._setup_for) < SETUP_AT_ONCE_LIMIT:
            self._setup_for.append(destination)

    def _early_setups(self) -> list[tuple[list[BytesLike], Address | None]]:
        """A SETUP for each destination new since the last poll that asked for one, to it alone: a
        client joining a dynamic-MDC stream gets its image within a round trip, not up to the setup
        timeout (100 ms) later. One datagram per new destination, so nothing is amplified; the periodic
        SETUP to every destination goes on as before."""
        if self.state is not ACTIVE or self._is_end_of_stream:
            self._setup_for.clear()
            return []
        setup = self._setup_frame().encode()
        early: list[tuple[list[BytesLike], Address | None]] = [
            ([setup], destination) for destination in self._setup_for if destination in self._destinations
        ]
        self._setup_for.clear()
        self.setups_sent += len(early)
        self.datagrams_sent += len(early)
        return early

    def _unsent(self) -> bool:
        """Whether the log holds data beyond the sender position (committed or still being written).

        Also notes the tail ``poll_due`` watches: any append moves the tail of the partition holding the
        sender position (or, at a term's end, rotates into it)."""
        snd_pos = self._snd_pos
        index = (snd_pos >> self._bits) % 3
        self._tail_index = index
        self._tail_seen = self._tails[index]
        return self._written(index, snd_pos) != snd_pos & self._mask

    def _next_wake_ns(self, now_ns: int) -> int:
        """The earliest time a timer in ``poll`` fires, given no input meanwhile (``now_ns`` if work remains).

        Each bound mirrors a check in ``poll``; the protocol simulation checks, at every step, that a
        poll ``poll_due`` called unnecessary sends and changes nothing."""
        state = self.state
        if state is DONE:
            return 1 << 63
        if self._setup_for:
            return now_ns  # new destinations wait for their SETUP (``poll_batches``)
        if (self._unsent() and not self._blocked) or state is DRAINING:
            return now_ns  # data left to send (or a claim not yet committed), or draining
        config = self.config
        wake = 1 << 63
        if state is LINGER:
            wake = self._linger_start_ns + config.linger_timeout_ns + 1
        if not self._has_initial_connection or self._setup_elicited:
            last = self._last_setup_ns
            wake = min(wake, now_ns if last is None else last + config.setup_timeout_ns + 1)
        if self._has_initial_connection:
            last = self._last_data_or_heartbeat_ns
            timeout = self._heartbeat_timeout_ns()
            wake = min(wake, now_ns if last is None else last + timeout + 1)
        if self._receivers and self._flow.expiry_ns < wake:
            wake = self._flow.expiry_ns
        if self._retransmit.active:
            owed, retransmit_wake = self._retransmit.deadline(now_ns)
            if owed:
                return now_ns
            wake = min(wake, retransmit_wake)
        return wake

    def _position_fields(self) -> tuple[int, int]:
        position = self._snd_pos
        return compute_term_id(position, self._bits, self.initial_term_id), position & self._mask

    def _setup_frame(self) -> SetupFrame:
        term_id, term_offset = self._position_fields()
        return SetupFrame(
            term_offset,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            term_id,
            self.term_length,
            self.mtu,
            self.config.ttl,
            SETUP_GROUP_FLAG if self.config.group else 0,
        )

    def _setup_check(self, now_ns: int, out: list[BytesLike]) -> None:
        last = self._last_setup_ns
        if last is not None and now_ns <= last + self.config.setup_timeout_ns:
            return
        out.append(self._setup_frame().encode())
        self.setups_sent += 1
        self._last_setup_ns = now_ns
        if self._is_connected:
            self._setup_elicited = False

    def _heartbeat_timeout_ns(self) -> int:
        """How long after the last data or heartbeat the next heartbeat is due."""
        config = self.config
        if self._blocked:
            return config.blocked_heartbeat_ns
        if self._is_end_of_stream:
            return config.heartbeat_timeout_ns  # the receiver learns of the end promptly
        return self._heartbeat_period_ns

    def _heartbeat_check(self, now_ns: int, out: list[BytesLike]) -> None:
        if not self._has_initial_connection:
            return
        last = self._last_data_or_heartbeat_ns
        if last is not None and now_ns <= last + self._heartbeat_timeout_ns():
            return
        term_id, term_offset = self._position_fields()
        eos = self.config.signal_eos and self._is_end_of_stream
        out.append(DataFrame.heartbeat(term_offset, self.session_id, self.stream_id, term_id, eos=eos).encode())
        self.heartbeats_sent += 1
        self._last_data_or_heartbeat_ns = now_ns
        longest = self.config.idle_heartbeat_max_ns
        if longest is not None and not self._blocked:
            self._heartbeat_period_ns = longest
        if eos and not self._eos_sent:
            self._eos_sent = True
            self._events.append(PublicationEndOfStreamSent(self.session_id, self.stream_id, self._snd_pos))

    def _send_data(self, now_ns: int, out: list[BytesLike]) -> int:
        """Send up to ``max_messages_per_send`` datagrams of new data within the window; return bytes consumed."""
        snd_pos = self._snd_pos
        window = self._flow.sender_limit - snd_pos
        index = index_by_position(snd_pos, self._bits)
        budget = self.config.max_messages_per_send
        if _c_cut_datagrams is not None:
            term = self.log.terms[index]
            consumed, sent, limited = _c_cut_datagrams(term, snd_pos & self._mask, window, self.mtu, budget, out)
            self.bytes_sent += sent
        else:
            consumed, limited = self._cut_datagrams(index, snd_pos, window, budget, out)
        if consumed:
            self._snd_pos = snd_pos + consumed
            self._last_data_or_heartbeat_ns = now_ns
            self._heartbeat_period_ns = self.config.heartbeat_timeout_ns
            self._track_sender_limits = True
            self._blocked = False
        else:
            self._blocked = limited and self.log.producer_position() > snd_pos
            if self._blocked and self._track_sender_limits:
                self.flow_control_limits += 1
                self._track_sender_limits = False
        return consumed

    def _cut_datagrams(
        self, index: int, snd_pos: int, window: int, budget: int, out: list[BytesLike]
    ) -> tuple[int, bool]:
        """The reference cut of new data into datagrams (``cut_datagrams`` in C): up to ``budget`` datagrams
        within ``window``, each a slice of the term (no copy). Returns (bytes consumed, padding included;
        whether the window shut or a committed frame did not fit in what was left of it)."""
        term, term_i32 = self.log.terms[index], self.log.terms_i32[index]
        term_length = self.term_length
        term_offset = snd_pos & self._mask
        consumed = 0
        limited = window <= 0
        first = term_i32[term_offset >> 2]
        aligned = (first + 31) & -32
        after_two = term_offset + 2 * (self.mtu // aligned) * aligned if first >= DATA_HEADER_LENGTH else term_length
        if window > 0 and after_two < term_length and term_i32[after_two >> 2] == first:
            # Two full datagrams and a frame of one size: worth the one-unpack check of a run.
            sent = len(out)
            run = self._send_equal_run(term, term_i32, term_offset, first, window, index, out)
            if run:
                window -= run
                consumed += run
                term_offset += run
                budget -= len(out) - sent
        for _ in range(budget):
            if window <= 0 or term_offset >= term_length or term_i32[term_offset >> 2] <= 0:
                break  # window shut, term done, or nothing (more) committed here
            available, padding = scan_term(term, term_i32, term_offset, min(window, self.mtu))
            if available <= 0:
                limited = True  # a committed frame that does not fit in what is left of the window
                break
            out.append(term[term_offset : term_offset + available])
            self.bytes_sent += available
            step = available + padding
            window -= step
            term_offset += step
            consumed += step
            if term_offset >= term_length:
                break
        return consumed, limited

    def _written(self, index: int, position: int) -> int:
        """How far the term holding ``position`` has been appended to (claims included), from its tail.
        A partition still holding an older term has nothing of this one: the producer, which rewrites
        the tail when it rotates into a partition, has not reached it."""
        raw = self._tails[index]
        if raw >> 32 != compute_term_id(position, self._bits, self.initial_term_id):
            return 0
        return min(raw & 0xFFFF_FFFF, self.term_length)

    def _send_equal_run(
        self,
        term: memoryview,
        term_i32: memoryview,
        offset: int,
        first: int,
        window: int,
        index: int,
        out: list[BytesLike],
    ) -> int:
        """A backlog of same-sized messages: full datagrams within ``window``, checked in one unpack and
        cut by arithmetic exactly as the frame-by-frame scan would cut them. A datagram holds as many
        whole frames as the MTU allows, and one more frame of the run must follow the last datagram
        taken (a smaller frame there would join it). Returns the bytes taken, 0 if none."""
        aligned = (first + 31) & -32
        per = self.mtu // aligned
        size = per * aligned
        if not size:
            return 0
        written = self._written(index, self._snd_pos)
        datagrams = min(self.config.max_messages_per_send, window // size, (written - offset - aligned) // size)
        if datagrams < 2 or not is_equal_run(term, offset, first, datagrams * per + 1):
            return 0
        end = offset + datagrams * size
        out.extend([term[o : o + size] for o in range(offset, end, size)])
        self.bytes_sent += end - offset
        return end - offset

    def _on_time_event(self, now_ns: int) -> None:
        state = self.state
        if state is DRAINING:
            if self.log.producer_position() > self._snd_pos:
                if self._is_connected:
                    return
            else:
                self._is_end_of_stream = True
                # The end-of-stream heartbeat goes with the next poll, not a heartbeat period later: the
                # receivers acknowledge it, which ends the linger (and an embedded driver's drain).
                self._last_data_or_heartbeat_ns = None
            self.state = LINGER
            self._linger_start_ns = now_ns
        elif state is LINGER and (self._received_eos or now_ns > self._linger_start_ns + self.config.linger_timeout_ns):
            self.state = DONE
            if self._is_connected:
                self._set_connected(False)
            else:
                self.log.is_connected = False
            self._events.append(PublicationFinished(self.session_id, self.stream_id))
