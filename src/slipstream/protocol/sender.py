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

Where this differs from the C driver, on purpose:

- A NAK is answered as it arrives, as in C, but with at most ``max_retransmit_datagrams_per_poll``
  datagrams (they leave with the next ``poll``); the rest of a long retransmission (up to 16
  receiver windows) follows over successive polls instead of in one loop.
- A retransmission never goes beyond the sender position (C may resend log data the sender has not
  sent yet, past the flow-control limit), and a NAK outside the resend window is counted and dropped
  before it takes the retransmit action.
- Receiver liveness is tracked for at most ``max_tracked_receivers`` receiver ids.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ..logbuffer import LogBuffers, is_equal_run, scan_term
from ..wire.constants import (
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SM_EOS_FLAG,
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
from ..wire.positions import compute_position, compute_term_id, index_by_position, max_message_length
from .defaults import (
    MAX_RESEND_DEFAULT,
    MAX_RESEND_MAX,
    PUBLICATION_CONNECTION_TIMEOUT_NS,
    PUBLICATION_HEARTBEAT_TIMEOUT_NS,
    PUBLICATION_LINGER_TIMEOUT_NS,
    PUBLICATION_SETUP_TIMEOUT_NS,
    RECEIVER_WINDOW_DEFAULT,
    RETRANSMIT_MULTICAST_RECEIVER_WINDOW_MULTIPLE,
    RETRANSMIT_UNICAST_DELAY_NS,
    RETRANSMIT_UNICAST_LINGER_NS,
    RETRANSMIT_UNICAST_MAX_ACTIONS,
    RETRANSMIT_UNICAST_RECEIVER_WINDOW_MULTIPLE,
    SENDER_MAX_MESSAGES_PER_SEND,
)

__all__ = ["NetworkPublicationSender", "SenderConfig", "SenderState"]


class SenderState(enum.Enum):
    """Lifecycle of a network publication, as in the C driver."""

    ACTIVE = "active"
    DRAINING = "draining"
    """Closed by the application; still sending what it appended."""
    LINGER = "linger"
    """Everything sent (or nobody left to send to); answering NAKs until an EOS SM or the linger timeout."""
    DONE = "done"


@dataclass(frozen=True, slots=True)
class SenderConfig:
    """Timing and limits of a sender. Defaults are the C driver's unicast defaults (durations in ns)."""

    setup_timeout_ns: int = PUBLICATION_SETUP_TIMEOUT_NS
    heartbeat_timeout_ns: int = PUBLICATION_HEARTBEAT_TIMEOUT_NS
    blocked_heartbeat_ns: int = 1_000_000
    """Heartbeat period while data waits behind an exhausted window. If the datagrams just before the
    window's end were lost, only a heartbeat (which raises the receiver's high-water mark) reveals the
    gap; waiting the idle period (100 ms) for it would stall a lossy stream. Heartbeats are legal at
    any time on the wire, so peers see nothing new."""
    connection_timeout_ns: int = PUBLICATION_CONNECTION_TIMEOUT_NS
    linger_timeout_ns: int = PUBLICATION_LINGER_TIMEOUT_NS
    retransmit_delay_ns: int = RETRANSMIT_UNICAST_DELAY_NS
    retransmit_linger_ns: int = RETRANSMIT_UNICAST_LINGER_NS
    group: bool = False
    """Group (multicast/MDC) semantics: SETUP carries the GROUP flag, up to ``max_resend`` retransmit
    actions run at once and the retransmit clamp uses the smaller group window multiple."""
    max_resend: int = MAX_RESEND_DEFAULT
    receiver_window: int = RECEIVER_WINDOW_DEFAULT
    """Expected receiver window (``rcv-wnd``); with the window multiple it caps one retransmission."""
    max_messages_per_send: int = SENDER_MAX_MESSAGES_PER_SEND
    max_retransmit_datagrams_per_poll: int = 16
    max_pending_replies: int = 16
    """RTTM replies waiting for the next poll; beyond this, probes are dropped (a flood costs nothing)."""
    max_tracked_receivers: int = 64
    """Receiver ids kept for liveness; bounds memory whatever receiver ids peers invent."""
    signal_eos: bool = True
    ttl: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        for name in (
            "setup_timeout_ns",
            "heartbeat_timeout_ns",
            "blocked_heartbeat_ns",
            "connection_timeout_ns",
            "retransmit_linger_ns",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive: {getattr(self, name)}")
        for name in ("linger_timeout_ns", "retransmit_delay_ns", "ttl"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative: {getattr(self, name)}")
        if not 1 <= self.max_resend <= MAX_RESEND_MAX:
            raise ValueError(f"max_resend must be in [1, {MAX_RESEND_MAX}]: {self.max_resend}")
        for name in (
            "receiver_window",
            "max_messages_per_send",
            "max_retransmit_datagrams_per_poll",
            "max_pending_replies",
            "max_tracked_receivers",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive: {getattr(self, name)}")


_INACTIVE, _DELAYED, _LINGERING = 0, 1, 2


class _RetransmitAction:
    """One NAK being served: delayed, then resent (possibly over several polls), then lingering."""

    __slots__ = ("end", "expiry_ns", "length", "next_position", "started", "state", "term_id", "term_offset")

    def __init__(self) -> None:
        self.state = _INACTIVE
        self.term_id = 0
        self.term_offset = 0
        self.length = 0
        self.expiry_ns = 0
        self.next_position = 0
        self.end = 0
        """Resend still owed: stream positions [next_position, end)."""
        self.started = False

    def overlaps(self, term_id: int, term_offset: int) -> bool:
        return (
            self.state != _INACTIVE
            and self.term_id == term_id
            and self.term_offset <= term_offset < self.term_offset + self.length
        )


class NetworkPublicationSender:
    """Sender state machine of one publication session (one ``session_id``/``stream_id`` on one channel).

    The driver's duty cycle is::

        for data, source in datagrams_received_on_the_publication_socket:
            sender.on_datagram(data, now_ns, source)
        if sender.poll_due(now_ns):            # else poll would send nothing and change nothing
            for datagram in sender.poll(now_ns):
                sock.send(datagram)
            pub_lmt = sender.publisher_limit()  # the appender may append below this position

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
        self._max_message_length = max_message_length(log.term_length)
        if config.group:
            multiple = RETRANSMIT_MULTICAST_RECEIVER_WINDOW_MULTIPLE
        else:
            multiple = RETRANSMIT_UNICAST_RECEIVER_WINDOW_MULTIPLE
        self._max_retransmit_length = min(config.receiver_window, log.term_length // 2) * multiple
        actions = config.max_resend if config.group else RETRANSMIT_UNICAST_MAX_ACTIONS
        self._actions = tuple(_RetransmitAction() for _ in range(actions))
        self._retransmitting = False
        """Some retransmit action is not inactive (so ``poll`` runs them)."""

        start = log.producer_position()
        self._snd_pos = start
        self._snd_lmt = start
        self.state = SenderState.ACTIVE
        self._has_initial_connection = False
        self._setup_elicited = False
        self._is_end_of_stream = False
        self._received_eos = False
        self._track_sender_limits = True
        self._is_connected = False
        self._last_setup_ns: int | None = None
        self._last_data_or_heartbeat_ns: int | None = None
        self._blocked = False
        """Data is waiting but the receiver window is exhausted (see ``blocked_heartbeat_ns``)."""
        self._linger_start_ns = 0
        self._receivers: dict[int, int] = {}
        """receiver_id -> time of its last status message."""
        self._receivers_expiry_ns = 1 << 62
        """No tracked receiver can time out before this (checked every poll, so kept cheap)."""
        self._replies: list[bytes] = []
        self._resends: list[bytes] = []
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
        self.retransmits_sent = 0
        self.retransmitted_bytes = 0
        self.naks_received = 0
        self.naks_ignored = 0
        """NAKs overlapping a retransmission in progress or lingering (reference: 10 ms linger)."""
        self.naks_outside_window = 0
        """Valid NAKs for data no longer (or not yet) in the resend window: nothing to resend."""
        self.retransmit_overflows = 0
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

    # -- state for the driver -------------------------------------------------------------------

    @property
    def sender_position(self) -> int:
        """``snd-pos``: the position up to which data has been sent (it does not wait for acknowledgement)."""
        return self._snd_pos

    @property
    def sender_limit(self) -> int:
        """``snd-lmt``: the flow-control limit, max(sm_position + receiver_window) over status messages."""
        return self._snd_lmt

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
        """True once lingering ended: the driver may free the publication and its log."""
        return self.state is SenderState.DONE

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
        if self.state is SenderState.ACTIVE and self._is_connected:
            return self._snd_pos + self.term_window
        return self._snd_pos

    def close(self) -> None:
        """Start draining: send what was appended, then signal end-of-stream and linger."""
        if self.state is SenderState.ACTIVE:
            self.state = SenderState.DRAINING
            self._wake_ns = 0

    def poll_due(self, now_ns: int) -> bool:
        """False when ``poll(now_ns)`` would return nothing and change nothing, so an idle duty cycle
        can skip it: no timer is due, no datagram arrived since the last poll, and the application has
        not appended since (or the window is shut anyway). A comparison and one tail-counter read."""
        if now_ns >= self._wake_ns:
            return True
        return not self._blocked and self._tails[self._tail_index] != self._tail_seen

    # -- input ----------------------------------------------------------------------------------

    def on_datagram(self, data: BytesLike, now_ns: int, source: object = None) -> None:
        """Handle one datagram received on the publication's socket (SM, NAK, RTTM or ERR)."""
        if self.state is SenderState.DONE:
            return
        self._wake_ns = 0
        try:
            frame = decode_datagram(data)[0]
        except (ValueError, struct.error):
            self.invalid_packets += 1
            return
        if isinstance(frame, StatusMessage):
            self._on_status_message(frame, now_ns)
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

    def _on_status_message(self, sm: StatusMessage, now_ns: int) -> None:
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
            return
        position = compute_position(sm.consumption_term_id, offset, self._bits, self.initial_term_id)
        if abs(position - self._snd_pos) > term_length // 2:
            self.status_messages_rejected += 1
            return
        if sm.flags & SM_EOS_FLAG:
            self._receivers.pop(sm.receiver_id, None)
            # One receiver leaving ends the linger only on unicast; a group has others.
            self._received_eos = self._received_eos or not self.config.group
        else:
            self._track_receiver(sm.receiver_id, now_ns)
        self._has_initial_connection = True
        edge = position + window
        if edge > self._snd_lmt:
            self._snd_lmt = edge
        self._update_connected(now_ns)

    def _track_receiver(self, receiver_id: int, now_ns: int) -> None:
        receivers = self._receivers
        if receiver_id not in receivers and len(receivers) >= self.config.max_tracked_receivers:
            self._expire_receivers(now_ns)
            if len(receivers) >= self.config.max_tracked_receivers:
                del receivers[min(receivers, key=receivers.__getitem__)]
        receivers[receiver_id] = now_ns
        expiry = now_ns + self.config.connection_timeout_ns
        if expiry < self._receivers_expiry_ns:
            self._receivers_expiry_ns = expiry

    def _expire_receivers(self, now_ns: int) -> None:
        if now_ns < self._receivers_expiry_ns:
            return
        timeout = self.config.connection_timeout_ns
        deadline = now_ns - timeout
        for receiver_id in [r for r, t in self._receivers.items() if t <= deadline]:
            del self._receivers[receiver_id]
        self._receivers_expiry_ns = min(self._receivers.values(), default=(1 << 62) - timeout) + timeout

    def _update_connected(self, now_ns: int) -> None:
        self._expire_receivers(now_ns)
        connected = bool(self._receivers)
        if connected != self._is_connected:
            self._is_connected = connected
            self.log.is_connected = connected

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
        position = compute_position(nak.term_id, offset, self._bits, self.initial_term_id)
        if not self._in_resend_window(position):
            self.naks_outside_window += 1
            return
        action = self._assign_action(nak.term_id, offset)
        if action is None:
            return
        action.term_id = nak.term_id
        action.term_offset = offset
        action.length = min(length, self._max_retransmit_length)
        self._retransmitting = True
        if self.config.retransmit_delay_ns == 0:
            # Answered now, as the C driver does: NAKs for several gaps in one batch are all served,
            # and a NAK taking over the action cannot cancel the previous one's retransmission.
            self._start_resend(action, now_ns)
            room = self.config.max_retransmit_datagrams_per_poll * 4 - len(self._resends)
            if action.next_position < action.end and room > 0:
                self._resend(action, self._resends, min(room, self.config.max_retransmit_datagrams_per_poll))
        else:
            action.state = _DELAYED
            action.expiry_ns = now_ns + self.config.retransmit_delay_ns
            action.next_position = action.end = 0

    def _assign_action(self, term_id: int, term_offset: int) -> _RetransmitAction | None:
        """A free action for this NAK, or None when one overlapping it is active (or none is free).

        Unicast keeps one action and a NAK that does not overlap it simply takes it over; group
        channels keep several and count an overflow when all are busy.
        """
        available: _RetransmitAction | None = None
        for action in self._actions:
            if action.overlaps(term_id, term_offset):
                self.naks_ignored += 1
                return None
            if action.state == _INACTIVE and available is None:
                available = action
        if available is None:
            if self.config.group:
                self.retransmit_overflows += 1
                return None
            available = self._actions[0]
        return available

    def _in_resend_window(self, position: int) -> bool:
        bottom = self._snd_pos - self.term_length // 2 - self._max_message_length
        return bottom <= position < self._snd_pos

    def _start_resend(self, action: _RetransmitAction, now_ns: int) -> None:
        position = compute_position(action.term_id, action.term_offset, self._bits, self.initial_term_id)
        action.state = _LINGERING
        action.expiry_ns = now_ns + self.config.retransmit_linger_ns
        action.started = False
        if self._in_resend_window(position):
            action.next_position = position
            # Never resend beyond what was sent: that data is still subject to flow control.
            action.end = min(position + action.length, self._snd_pos)
        else:
            action.next_position = action.end = 0

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
        self._receivers.pop(error.receiver_id, None)
        self._update_connected(now_ns)

    # -- output ---------------------------------------------------------------------------------

    def poll(self, now_ns: int) -> list[bytes]:
        """Datagrams to send now, in order (at most :attr:`max_datagrams_per_poll`)."""
        out: list[bytes] = []
        if self.state is SenderState.DONE:
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
        if self._retransmitting:
            self._process_retransmits(now_ns, out)
        if self.state is not SenderState.ACTIVE:
            self._on_time_event(now_ns)
        self.datagrams_sent += len(out)
        self._wake_ns = self._next_wake_ns(now_ns)
        return out

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
        if state is SenderState.DONE:
            return 1 << 63
        if (self._unsent() and not self._blocked) or state is SenderState.DRAINING:
            return now_ns  # data left to send (or a claim not yet committed), or draining
        config = self.config
        wake = 1 << 63
        if state is SenderState.LINGER:
            wake = self._linger_start_ns + config.linger_timeout_ns + 1
        if not self._has_initial_connection or self._setup_elicited:
            last = self._last_setup_ns
            wake = min(wake, now_ns if last is None else last + config.setup_timeout_ns + 1)
        if self._has_initial_connection:
            last = self._last_data_or_heartbeat_ns
            timeout = config.blocked_heartbeat_ns if self._blocked else config.heartbeat_timeout_ns
            wake = min(wake, now_ns if last is None else last + timeout + 1)
        if self._receivers and self._receivers_expiry_ns < wake:
            wake = self._receivers_expiry_ns
        if self._retransmitting:
            for action in self._actions:
                if action.next_position < action.end:
                    return now_ns
                if action.state != _INACTIVE:
                    wake = min(wake, action.expiry_ns + 1)
        return wake

    def _position_fields(self) -> tuple[int, int]:
        position = self._snd_pos
        return compute_term_id(position, self._bits, self.initial_term_id), position & self._mask

    def _setup_check(self, now_ns: int, out: list[bytes]) -> None:
        last = self._last_setup_ns
        if last is not None and now_ns <= last + self.config.setup_timeout_ns:
            return
        term_id, term_offset = self._position_fields()
        setup = SetupFrame(
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
        out.append(setup.encode())
        self.setups_sent += 1
        self._last_setup_ns = now_ns
        if self._is_connected:
            self._setup_elicited = False

    def _heartbeat_check(self, now_ns: int, out: list[bytes]) -> None:
        if not self._has_initial_connection:
            return
        last = self._last_data_or_heartbeat_ns
        timeout = self.config.blocked_heartbeat_ns if self._blocked else self.config.heartbeat_timeout_ns
        if last is not None and now_ns <= last + timeout:
            return
        term_id, term_offset = self._position_fields()
        eos = self.config.signal_eos and self._is_end_of_stream
        out.append(DataFrame.heartbeat(term_offset, self.session_id, self.stream_id, term_id, eos=eos).encode())
        self.heartbeats_sent += 1
        self._last_data_or_heartbeat_ns = now_ns

    def _send_data(self, now_ns: int, out: list[bytes]) -> int:
        """Send up to ``max_messages_per_send`` datagrams of new data within the window; return bytes consumed."""
        snd_pos = self._snd_pos
        window = self._snd_lmt - snd_pos
        index = index_by_position(snd_pos, self._bits)
        term, term_i32 = self.log.terms[index], self.log.terms_i32[index]
        term_length = self.term_length
        term_offset = snd_pos & self._mask
        consumed = 0
        limited = window <= 0
        budget = self.config.max_messages_per_send
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
            out.append(bytes(term[term_offset : term_offset + available]))
            self.bytes_sent += available
            step = available + padding
            window -= step
            term_offset += step
            consumed += step
            if term_offset >= term_length:
                break
        if consumed:
            self._snd_pos = snd_pos + consumed
            self._last_data_or_heartbeat_ns = now_ns
            self._track_sender_limits = True
            self._blocked = False
        else:
            self._blocked = limited and self.log.producer_position() > snd_pos
            if self._blocked and self._track_sender_limits:
                self.flow_control_limits += 1
                self._track_sender_limits = False
        return consumed

    def _written(self, index: int, position: int) -> int:
        """How far the term holding ``position`` has been appended to (claims included), from its tail.
        A partition still holding an older term has nothing of this one: the producer, which rewrites
        the tail when it rotates into a partition, has not reached it."""
        raw = self._tails[index]
        if raw >> 32 != compute_term_id(position, self._bits, self.initial_term_id):
            return 0
        return min(raw & 0xFFFF_FFFF, self.term_length)

    def _send_equal_run(
        self, term: memoryview, term_i32: memoryview, offset: int, first: int, window: int, index: int, out: list[bytes]
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
        out.extend([bytes(term[o : o + size]) for o in range(offset, end, size)])
        self.bytes_sent += end - offset
        return end - offset

    def _process_retransmits(self, now_ns: int, out: list[bytes]) -> None:
        budget = self.config.max_retransmit_datagrams_per_poll
        busy = False
        for action in self._actions:
            if action.state == _DELAYED and now_ns > action.expiry_ns:
                self._start_resend(action, now_ns)
            if action.next_position < action.end and budget > 0:
                budget = self._resend(action, out, budget)
            if action.state == _LINGERING and now_ns > action.expiry_ns and action.next_position >= action.end:
                action.state = _INACTIVE
            busy = busy or action.state != _INACTIVE
        self._retransmitting = busy

    def _resend(self, action: _RetransmitAction, out: list[bytes], budget: int) -> int:
        """Send the next datagrams of a retransmission from the log; return the budget left.

        A retransmission longer than the budget continues at the next poll; it is abandoned when the
        log has nothing to send there or the range fell out of the resend window meanwhile.
        """
        position = action.next_position
        bottom = self._snd_pos - self.term_length // 2 - self._max_message_length
        while position < action.end:
            if budget == 0:
                action.next_position = position
                return 0
            if position < bottom:
                break
            index = index_by_position(position, self._bits)
            offset = position & self._mask
            term = self.log.terms[index]
            max_length = min(self.mtu, action.end - position)
            available, padding = scan_term(term, self.log.terms_i32[index], offset, max_length)
            if available <= 0:
                break
            out.append(bytes(term[offset : offset + available]))
            if not action.started:
                action.started = True
                self.retransmits_sent += 1
            self.retransmitted_bytes += available
            position += available + padding
            budget -= 1
        action.next_position = action.end = position
        return budget

    def _on_time_event(self, now_ns: int) -> None:
        state = self.state
        if state is SenderState.DRAINING:
            if self.log.producer_position() > self._snd_pos:
                if self._is_connected:
                    return
            else:
                self._is_end_of_stream = True
            self.state = SenderState.LINGER
            self._linger_start_ns = now_ns
        elif state is SenderState.LINGER and (
            self._received_eos or now_ns > self._linger_start_ns + self.config.linger_timeout_ns
        ):
            self.state = SenderState.DONE
            self._is_connected = False
            self.log.is_connected = False
