"""A client's channel URI turned into driver resources: endpoints resolved, sockets opened, logs mapped.

Each step either returns what it made or raises :class:`CommandRefused` with the error code and
message the client gets (``INVALID_CHANNEL``, ``UNSUPPORTED_MEDIA``, ``RESOURCE`` ...), so the
conductor's command handlers read as the sequence of steps they are. Nothing here keeps state: the
conductor owns what is made.
"""

from __future__ import annotations

import mmap
import random
import socket
from pathlib import Path

from ..files.directory import map_file
from ..logbuffer import LogBuffers, compute_log_length
from ..protocol.config import ImageLimits, ReceiverConfig, SenderConfig
from ..wire.positions import max_message_length, wrap_i32
from ..wire.uri import ChannelUri, ChannelUriError, UnsupportedChannelError, check_supported
from .config import DriverConfig
from .udp_channel import GSO_MAX_SEGMENTS, UdpEndpoint, open_socket, resolve

SEND_BATCHES_PER_CYCLE = 4
"""Full GSO batches (64 datagrams) a publication may send per duty cycle. One batch per cycle left a
bulk stream's driver spending half its time on the cycle itself: four took 1 GiB in 64 KiB messages
at MTU 1408 over loopback from 526-644 MB/s to 827-874 (driver CPU 1.6 s to 1.15 s); eight or sixteen
did no better. A cycle then sends at most 350 KB per publication, below a socket's 2 MiB buffer; six or
more publications bursting at once towards one receiving socket can overflow it (as 24 could before),
which a reliable stream repairs by NAK and an unreliable one reports as loss."""

__all__ = [
    "CommandRefused",
    "channel_key",
    "image_limits",
    "map_publication_log",
    "open_publication_socket",
    "open_receive_socket",
    "parse_channel",
    "publication_endpoint",
    "receiver_config",
    "sender_config",
    "subscription_endpoints",
]


class CommandRefused(Exception):
    """A client command the driver refuses: ``code`` and ``message`` go back in an ErrorResponse."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_channel(channel: str, stream_id: int) -> ChannelUri:
    """The channel of an AddPublication/AddSubscription, checked for what the driver supports."""
    try:
        uri = ChannelUri.parse(channel)
    except ChannelUriError as exc:
        raise CommandRefused("INVALID_CHANNEL", str(exc)) from None
    try:
        check_supported(uri)  # the client API checks too; a client that bypasses it is refused the same way
    except UnsupportedChannelError as exc:
        raise CommandRefused("UNSUPPORTED_CHANNEL", f"{channel}: {exc}") from None
    if not -(1 << 31) <= stream_id < (1 << 31):
        raise CommandRefused("INVALID_CHANNEL", f"stream id {stream_id} is not a 32-bit integer")
    if uri.is_spy:
        raise CommandRefused("UNSUPPORTED_MEDIA", f"{channel}: spy subscriptions are not supported")
    return uri


def channel_key(uri: ChannelUri) -> tuple[str, str | None, str | None]:
    """What makes two channels the same for session-id clashes (as in Aeron: one session per channel)."""
    return (uri.media, uri.endpoint, uri.control) if uri.is_udp else (uri.media, None, None)


def publication_endpoint(channel: str, uri: ChannelUri) -> tuple[UdpEndpoint | None, str | None]:
    """Where a publication sends, and its MDC control mode: (None, None) for IPC.

    Unicast connects to the endpoint. MDC binds the control address (or an ephemeral port for manual
    mode without one) and sends to each destination."""
    if not uri.is_udp:
        return None, None
    control_mode = uri.control_mode
    if control_mode == "response":
        raise CommandRefused("UNSUPPORTED_CHANNEL", f"{channel}: response channels are not supported")
    target = uri.control if control_mode is not None else uri.endpoint
    if target is None and control_mode != "manual":
        raise CommandRefused(
            "INVALID_CHANNEL",
            f"{channel}: a UDP publication needs endpoint=host:port, or control=host:port with "
            "control-mode=dynamic|manual",
        )
    try:
        endpoint = resolve(target, "control" if control_mode else "endpoint") if target else resolve("0.0.0.0:0")
    except ValueError as exc:
        raise CommandRefused("INVALID_CHANNEL", str(exc)) from None
    return endpoint, control_mode


def open_publication_socket(
    channel: str, uri: ChannelUri, endpoint: UdpEndpoint, control_mode: str | None, config: DriverConfig
) -> socket.socket:
    """Unicast: a socket connected to the endpoint; MDC: one bound to the control address."""
    rcvbuf, sndbuf = uri.so_rcvbuf or config.so_rcvbuf, uri.so_sndbuf or config.so_sndbuf
    try:
        if control_mode is None:
            return open_socket(endpoint.family, connect=endpoint.address, so_rcvbuf=rcvbuf, so_sndbuf=sndbuf)
        return open_socket(endpoint.family, bind=endpoint.address, so_rcvbuf=rcvbuf, so_sndbuf=sndbuf)
    except OSError as exc:
        raise CommandRefused("RESOURCE", f"{channel}: cannot open socket: {exc}") from None


def map_publication_log(
    path: Path,
    uri: ChannelUri,
    config: DriverConfig,
    rng: random.Random,
    *,
    ipc: bool,
    session_id: int,
    stream_id: int,
    correlation_id: int,
) -> tuple[mmap.mmap, LogBuffers, int]:
    """The publication's log file at ``path``, mapped and initialized, and its publication window."""
    term_length = uri.term_length or (config.ipc_term_length if ipc else config.udp_term_length)
    mtu = uri.mtu or (config.ipc_mtu if ipc else config.udp_mtu)
    if mtu > (largest := max_message_length(term_length)):  # (a frame the log could not take as a message)
        raise CommandRefused(
            "INVALID_CHANNEL",
            f"MTU greater than max message length for term length: mtu={mtu} maxMessageLength={largest} "
            f"termLength={term_length}",
        )
    start = uri.start_position
    if start is not None:
        initial_term_id, term_id, term_offset = start.initial_term_id, start.term_id, start.term_offset
    else:
        initial_term_id = wrap_i32(rng.getrandbits(32))
        term_id, term_offset = initial_term_id, 0
    window = term_length // 2
    if uri.pub_wnd is not None:
        window = min(window, uri.pub_wnd)
    elif ipc and config.ipc_publication_window is not None:
        window = min(window, config.ipc_publication_window)
    try:
        mapping = map_file(path, compute_log_length(term_length), create=True)
    except OSError as exc:
        raise CommandRefused("RESOURCE", f"cannot create {path}: {exc}") from None
    log = LogBuffers(memoryview(mapping), term_length)
    log.initialize(
        initial_term_id=initial_term_id,
        term_id=term_id,
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        mtu=mtu,
        correlation_id=correlation_id,
        publication_window=window,
        linger_ns=uri.linger_ns or 0,
        signal_eos=uri.eos if uri.eos is not None else True,
    )
    return mapping, log, window


def sender_config(uri: ChannelUri, control_mode: str | None, config: DriverConfig) -> SenderConfig:
    """The sender machine's settings: the channel's parameters over the driver's."""
    return SenderConfig(
        linger_timeout_ns=uri.linger_ns if uri.linger_ns is not None else config.publication_linger_ns,
        receiver_window=uri.rcv_wnd or config.receiver_window,
        signal_eos=uri.eos if uri.eos is not None else True,
        group=control_mode is not None,
        control_mode=control_mode,
        # A Python duty cycle costs more than Aeron's: send more per cycle to amortise it (with GSO,
        # SEND_BATCHES_PER_CYCLE system calls of a full batch each, made in one C call).
        max_messages_per_send=SEND_BATCHES_PER_CYCLE * GSO_MAX_SEGMENTS if config.udp_gso else 16,
        max_resend=uri.max_resend or SenderConfig().max_resend,
        idle_heartbeat_max_ns=config.idle_heartbeat_max_ns,
    )


def subscription_endpoints(channel: str, uri: ChannelUri) -> tuple[UdpEndpoint, UdpEndpoint | None]:
    """The endpoint a UDP subscription binds (port 0: ephemeral) and, for dynamic MDC, the control address."""
    control: UdpEndpoint | None = None
    try:
        if uri.control is not None and uri.control_mode == "dynamic":
            control = resolve(uri.control, "control")
        elif uri.endpoint is None:
            raise ValueError(
                f"{channel}: a UDP subscription needs endpoint=host:port, or control=host:port with "
                "control-mode=dynamic"
            )
        if uri.endpoint is not None:
            endpoint = resolve(uri.endpoint)
        else:
            assert control is not None
            endpoint = UdpEndpoint(control.family, ("::", 0) if control.family == socket.AF_INET6 else ("0.0.0.0", 0))
    except ValueError as exc:
        raise CommandRefused("INVALID_CHANNEL", str(exc)) from None
    return endpoint, control


def open_receive_socket(channel: str, uri: ChannelUri, endpoint: UdpEndpoint, config: DriverConfig) -> socket.socket:
    """A socket bound to a subscription's endpoint."""
    rcvbuf = uri.so_rcvbuf or config.so_rcvbuf
    try:
        return open_socket(endpoint.family, bind=endpoint.address, so_rcvbuf=rcvbuf, so_sndbuf=uri.so_sndbuf)
    except OSError as exc:
        raise CommandRefused("RESOURCE", f"{channel}: cannot bind {endpoint.host_port}: {exc}") from None


def image_limits(uri: ChannelUri) -> ImageLimits | None:
    """The budget a subscription's URI asks for its stream's images, if any."""
    limits = ImageLimits(uri.max_term_length, uri.max_images, uri.max_images_per_source)
    return None if limits.is_unlimited else limits


def receiver_config(uri: ChannelUri, actual_rcvbuf: int, config: DriverConfig) -> ReceiverConfig:
    """The receive endpoint's settings: never advertise more than the socket can hold (a sender filling
    the window would overflow the buffer and turn into retransmissions; the C driver refuses this)."""
    return ReceiverConfig(
        receiver_window=min(uri.rcv_wnd or config.receiver_window, actual_rcvbuf),
        so_rcvbuf=actual_rcvbuf,
        nak_delay_ns=uri.nak_delay_ns if uri.nak_delay_ns is not None else ReceiverConfig().nak_delay_ns,
        idle_sm_max_ns=config.idle_status_message_max_ns,
    )
