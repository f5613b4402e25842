"""Timing and limits of the transport machines, validated once, with the C driver's defaults.

``ReceiverConfig`` configures a receive endpoint and its images, ``SenderConfig`` a network
publication's sender. Durations are in nanoseconds; every default comes from ``defaults``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire.constants import TERM_MAX_LENGTH, TERM_MIN_LENGTH
from .defaults import (
    IMAGE_LIVENESS_TIMEOUT_NS,
    IMAGE_SM_EOS_MULTIPLE,
    MAX_RESEND_DEFAULT,
    MAX_RESEND_MAX,
    MDC_DESTINATION_TIMEOUT_NS,
    MDC_REGISTRATION_INTERVAL_NS,
    NAK_MULTICAST_GROUP_SIZE,
    NAK_MULTICAST_MAX_BACKOFF_NS,
    NAK_UNICAST_DELAY_NS,
    PENDING_SETUP_TIMEOUT_NS,
    PUBLICATION_CONNECTION_TIMEOUT_NS,
    PUBLICATION_HEARTBEAT_TIMEOUT_NS,
    PUBLICATION_LINGER_TIMEOUT_NS,
    PUBLICATION_SETUP_TIMEOUT_NS,
    RECEIVE_DESTINATION_TIMEOUT_NS,
    RECEIVER_WINDOW_DEFAULT,
    RETRANSMIT_UNICAST_DELAY_NS,
    RETRANSMIT_UNICAST_LINGER_NS,
    SENDER_MAX_MESSAGES_PER_SEND,
    SO_RCVBUF_DEFAULT,
    STATUS_MESSAGE_TIMEOUT_NS,
)

__all__ = ["ImageLimits", "ReceiverConfig", "SenderConfig", "require_non_negative", "require_positive"]


def require_positive(config: object, *names: str) -> None:
    """Raise ValueError naming the first of ``names`` whose value in ``config`` is not above zero."""
    for name in names:
        value = getattr(config, name)
        if value <= 0:
            raise ValueError(f"{name} must be positive: {value}")


def require_non_negative(config: object, *names: str) -> None:
    """Raise ValueError naming the first of ``names`` whose value in ``config`` is below zero (None passes)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < 0:
            raise ValueError(f"{name} must not be negative: {value}")


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What SETUPs for one subscribed stream may cost: a budget a subscriber asks for (channel URI keys
    ``max-term-length``, ``max-images``, ``max-images-per-source``), so that a port anyone can reach (a
    server's handshake stream) makes images only within a small, fixed amount of shared memory.

    A SETUP beyond it is refused like one beyond ``ReceiverConfig``'s limits: no image, no answer, counted
    (``setups_rejected``). None: no limit beyond the endpoint's. Images count while they linger (their
    logs are still mapped); the source is the sender's address, its port ignored."""

    max_term_length: int | None = None
    max_images: int | None = None
    max_images_per_source: int | None = None

    def validate(self) -> None:
        require_positive(self, *(name for name in self.__slots__ if getattr(self, name) is not None))
        if self.max_term_length is not None and not TERM_MIN_LENGTH <= self.max_term_length <= TERM_MAX_LENGTH:
            raise ValueError(
                f"max_term_length must be in [{TERM_MIN_LENGTH}, {TERM_MAX_LENGTH}]: {self.max_term_length}"
            )

    def widest(self, other: ImageLimits | None) -> ImageLimits | None:
        """The budget of a stream two subscriptions share: each limit the larger (None, none, wins)."""
        if other is None:
            return None

        def wider(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else max(a, b)

        return ImageLimits(
            wider(self.max_term_length, other.max_term_length),
            wider(self.max_images, other.max_images),
            wider(self.max_images_per_source, other.max_images_per_source),
        )

    @property
    def is_unlimited(self) -> bool:
        return self.max_term_length is None and self.max_images is None and self.max_images_per_source is None


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    """Timing and limits of a receive endpoint; defaults are the C driver's (durations in ns)."""

    receiver_window: int = RECEIVER_WINDOW_DEFAULT
    """``rcv-wnd``; an image uses min(this, term_length / 2)."""
    so_rcvbuf: int = SO_RCVBUF_DEFAULT
    """A SETUP whose MTU exceeds the socket receive buffer is refused."""
    sm_timeout_ns: int = STATUS_MESSAGE_TIMEOUT_NS
    idle_sm_max_ns: int | None = None
    """While the image's position stays where the last status message put it, the timed status
    messages come this far apart (None: every ``sm_timeout_ns``, as Aeron); the first after the position
    moved still comes ``sm_timeout_ns`` later. Keep it well under the sender's connection timeout and a
    dynamic MDC destination's timeout (5 s each)."""
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
    max_images: int = 1024
    """Images (including lingering ones) an endpoint holds at once; further SETUPs are refused. A
    network server's port carries every client's handshake stream (which lingers for the image liveness
    timeout after the client closes it) and its connection stream, so this is well above twice the
    256 clients a server takes by default (at 256, the 97th of 160 clients connecting at once waited
    the 10 s linger out). Image logs are sparse files: memory is spent as data arrives."""
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
    mdc_registration_interval_ns: int = MDC_REGISTRATION_INTERVAL_NS
    """Dynamic MDC (an endpoint given a control address): how often it registers there."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        require_positive(
            self,
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
            "mdc_registration_interval_ns",
        )
        require_non_negative(self, "nak_delay_ns", "nak_retry_delay_ns", "gap_fill_delay_ns", "eos_linger_multiple")
        if self.idle_sm_max_ns is not None and self.idle_sm_max_ns < self.sm_timeout_ns:
            raise ValueError(
                f"idle_sm_max_ns must be at least sm_timeout_ns ({self.sm_timeout_ns}): {self.idle_sm_max_ns}"
            )
        if self.nak_group_size < 1:
            raise ValueError(f"nak_group_size must be at least 1: {self.nak_group_size}")
        if not TERM_MIN_LENGTH <= self.max_term_length <= TERM_MAX_LENGTH:
            raise ValueError(
                f"max_term_length must be in [{TERM_MIN_LENGTH}, {TERM_MAX_LENGTH}]: {self.max_term_length}"
            )


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
    idle_heartbeat_max_ns: int | None = None
    """While nothing new is sent, the heartbeats after the first come this far apart (None: every
    ``heartbeat_timeout_ns``, as Aeron). The first heartbeat after data, which reveals a lost tail, is
    not delayed; later ones only keep the image alive (the receiver's liveness timeout is 10 s), and each
    costs both hosts a system call and an idle peer a wake-up. They go straight to this period rather
    than doubling towards it: a connection's keepalive every second restarts the sequence, and doubling
    from 100 ms put three heartbeats a second on each idle stream instead of one."""
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
    control_mode: str | None = None
    """Multi-destination-cast: None (unicast: the adapter's socket is connected to the receiver),
    "dynamic" (destinations are learned from status messages and expire) or "manual" (the application
    adds and removes them)."""
    destination_timeout_ns: int = MDC_DESTINATION_TIMEOUT_NS
    """Dynamic MDC: a destination that sent no status message for this long is dropped."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        require_positive(
            self,
            "setup_timeout_ns",
            "heartbeat_timeout_ns",
            "blocked_heartbeat_ns",
            "connection_timeout_ns",
            "retransmit_linger_ns",
        )
        require_non_negative(self, "linger_timeout_ns", "retransmit_delay_ns", "ttl")
        if self.idle_heartbeat_max_ns is not None and self.idle_heartbeat_max_ns < self.heartbeat_timeout_ns:
            raise ValueError(
                f"idle_heartbeat_max_ns must be at least heartbeat_timeout_ns ({self.heartbeat_timeout_ns}): "
                f"{self.idle_heartbeat_max_ns}"
            )
        if not 1 <= self.max_resend <= MAX_RESEND_MAX:
            raise ValueError(f"max_resend must be in [1, {MAX_RESEND_MAX}]: {self.max_resend}")
        require_positive(
            self,
            "receiver_window",
            "max_messages_per_send",
            "max_retransmit_datagrams_per_poll",
            "max_pending_replies",
            "max_tracked_receivers",
            "destination_timeout_ns",
        )
        if self.control_mode not in (None, "dynamic", "manual"):
            raise ValueError(f"control_mode must be None, 'dynamic' or 'manual': {self.control_mode!r}")
