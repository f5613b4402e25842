"""A server's handshake channels, as any adapter runs them: per bound UDP port (and for IPC) a
subscription that hears every client's handshake packets, a broadcast publication that answers them,
and a :class:`~.handshake.ServerHandshake` machine between, driven by one :class:`~.transport.Link`.

No event loop here: the channels are opened on a driver context, polled with
:func:`~.transport.handshake_cycle`, and their machines' allocations (one session-id allocator for all
channels) are offered to the connection table as one collaborator. Admission is decided per HELLO and
DONE against the table's counts (lingering connections do not count), the config's limits, filters and
allowed keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..client import Context, DriverError, ExclusivePublication, Header, Registration, Subscription
from ..client.allocation import IdAllocator, PortAllocator
from .admission import AdmissionPolicy, IpFilterRule, RejectReason
from .config import ServerConfig
from .events import ClientAccepted
from .handshake import AdmissionCheck, ServerHandshake
from .registrations import Registrations
from .table import ConnectionTable
from .transport import (
    HANDSHAKE_POLL_LIMIT,
    Link,
    close_quietly,
    connection_ipc_channel,
    earliest,
    handshake_cycle,
    host_port,
    ipc_channel,
    parse_source,
    udp_channel,
)

__all__ = [
    "CONNECTION_LINGER",
    "OUTBOX_LIMIT",
    "AcceptedStreams",
    "HandshakeChannel",
    "HandshakeChannels",
    "HandshakeImages",
    "Pending",
    "admission_check",
]

CONNECTION_LINGER = "500ms"
"""How long a closed connection's publication lingers for the client to take its last records."""
OUTBOX_LIMIT = 4096
"""Handshake answers held while the handshake publication is back-pressured (the oldest go first;
a client whose answer is lost retries)."""


def admission_check(
    config: ServerConfig, admitted: Callable[[], int], admitted_from: Callable[[str], int]
) -> AdmissionCheck:
    """The server's admission rule for its handshake machines: the IP family, the per-address and total
    limits (``admitted``, ``admitted_from``: connections opening, starting or up), filters, the tag, and
    ``allowed_keys`` once the client's key is known."""
    policy = AdmissionPolicy(
        max_clients=config.max_clients,
        max_connections_per_address=config.per_address_limit,
        rules=[IpFilterRule(rule) for rule in config.ip_filters],
        filter_callback=config.filter,
        allowed_keys=None,
        max_tag_length=config.max_tag_length,
    )

    def check(
        address: str | None, tag: str, public_key: bytes | None, current_total: int, current_for_address: int
    ) -> tuple[int, str] | None:
        if address is not None and not config.enable_ipv4 and "." in address:
            return int(RejectReason.NOT_PERMITTED), "IPv4 connections are not permitted"
        per_address = 0 if address is None else admitted_from(address)
        reason = policy.check(address, tag, public_key or bytes(32), admitted(), per_address)
        allowed = config.allowed_keys
        if reason is None and public_key is not None and allowed is not None and public_key not in allowed:
            reason = RejectReason.KEY_NOT_ALLOWED
        return None if reason is None else (int(reason), reason.message)

    return check


class HandshakeImages:
    """Which images of a UDP handshake channel to reject: those that held no handshake (half-open or
    answered) for most of ``timeout_ns``. A stranger's SETUP costs an image log; one that never brings a
    HELLO worth answering gives it back within the handshake timeout, not at the driver's liveness timeout
    (which more SETUPs would keep postponing). Sans-I/O: session ids and ``now_ns`` in, sessions out; it
    looks every quarter of the timeout, so an image is refused at most ``timeout_ns`` after it came."""

    def __init__(self, timeout_ns: int) -> None:
        self.cadence_ns = max(1, timeout_ns // 4)
        self.grace_ns = timeout_ns - self.cadence_ns
        self.deadline_ns = 0
        """When :meth:`check` is next due."""
        self._unheld_since: dict[int, int] = {}
        self._rejected: set[int] = set()
        """Sessions told to go whose images are still listed (not rejected twice)."""
        self.rejected = 0

    def check(self, sessions: Collection[int], held: Collection[int], now_ns: int) -> list[int]:
        """The sessions (of the images now on the channel) to reject: unheld for ``grace_ns``."""
        self.deadline_ns = now_ns + self.cadence_ns
        self._rejected &= set(sessions)
        since = {s: self._unheld_since.get(s, now_ns) for s in sessions if s not in held and s not in self._rejected}
        stale = [s for s, first in since.items() if now_ns - first >= self.grace_ns]
        for session in stale:
            del since[session]
        self._unheld_since = since
        self._rejected.update(stale)
        self.rejected += len(stale)
        return stale


class HandshakeChannel:
    """One handshake channel (UDP port or IPC): its machine and its transport (answers the handshake
    publication refuses for now wait in the link's outbox, the oldest dropped past OUTBOX_LIMIT). Over
    UDP, images that hold no handshake are rejected within the handshake timeout (``HandshakeImages``)."""

    def __init__(
        self,
        machine: ServerHandshake,
        host: str | None,
        port: int,
        publication: ExclusivePublication,
        subscription: Subscription,
        *,
        context: Context | None = None,
        timeout_ns: int = 0,
    ) -> None:
        self.machine = machine
        self.host = host
        """The listening host (None over IPC)."""
        self.port = port
        self.link = Link(
            publication, subscription, self._on_packet, poll_limit=HANDSHAKE_POLL_LIMIT, outbox_limit=OUTBOX_LIMIT
        )
        self._context = context
        self.images = HandshakeImages(timeout_ns) if host is not None and context is not None else None
        """None: this channel rejects no image (IPC, or no context to ask the driver with)."""

    @property
    def deadline_ns(self) -> int | None:
        """The machine's next timer, or the next look at the channel's images."""
        return earliest((self.machine.deadline_ns,), None if self.images is None else self.images.deadline_ns)

    def cycle(self, now_ns: int) -> int:
        """One duty cycle: the machine's (packets, timers, answers), then, when due, images rejected."""
        work = handshake_cycle(self.link, self.machine, now_ns)
        watch, context = self.images, self._context
        if watch is not None and context is not None and now_ns >= watch.deadline_ns:
            images = self.link.subscription.images
            stale = set(watch.check([image.session_id for image in images], self.machine.held_sources(), now_ns))
            for image in images:
                if image.session_id in stale:
                    context.reject_image(image, "no handshake")
                    work += 1
        return work

    def _on_packet(self, payload: memoryview, header: Header) -> None:
        address: str | None = None
        port: int | None = None
        if self.host is not None:  # the packet's source, as the driver saw it (through NAT: the router's)
            image = self.link.subscription.image_by_session_id(header.session_id)
            if image is None:
                return
            address, port = parse_source(image.source_identity)
            if address is None:
                return
        now_ns = time.monotonic_ns()
        self.machine.receive(bytes(payload), source=header.session_id, address=address, port=port, now_ns=now_ns)


class HandshakeChannels(list[HandshakeChannel]):
    """A server's handshake channels; to the connection table, their allocators as one (a connection id
    names one channel's allocation: the channels share the session-id allocator)."""

    def __init__(self, config: ServerConfig, registrations: Registrations, static_private: bytes) -> None:
        super().__init__()
        self.config = config
        self.registrations = registrations
        self.static_private = static_private
        self.sessions = IdAllocator(1, 65534)
        """Session ids of connections (both directions), the seed's range."""
        self.streams = IdAllocator(1, 65533)

    def open(
        self,
        context: Context,
        admission: AdmissionCheck,
        *,
        host: str | None,
        port: int,
        ports: PortAllocator | None,
        subscription: tuple[str, int],
        publication: tuple[str, int],
    ) -> HandshakeChannel:
        """Add a channel: its subscription and publication (channel URI, stream id) and its machine."""
        config = self.config
        listening = context.add_subscription(*subscription)
        try:
            answering = context.add_exclusive_publication(*publication)
        except BaseException:
            listening.close()
            raise
        machine = ServerHandshake(
            app_id=config.app_id,
            static_private=self.static_private,
            description=self.registrations.description(),
            describe_difference=self.registrations.first_difference,
            admission=admission,
            sessions=self.sessions,
            streams=self.streams,
            ports=ports,
            timeout_ns=int(config.handshake_timeout * 1e9),
            connection_expiry_ns=int(config.connection_expiry * 1e9),
            max_pending=config.max_pending_handshakes,
            handshakes_per_second=config.handshakes_per_second,
            now_ns=time.monotonic_ns(),
            allow_plaintext=host is None and not config.encrypt_ipc,
            confirm_accept=True,
        )
        channel = HandshakeChannel(
            machine, host, port, answering, listening, context=context, timeout_ns=int(config.handshake_timeout * 1e9)
        )
        self.append(channel)
        return channel

    def owner(self, connection_id: int) -> ServerHandshake | None:
        """The machine that allocated ``connection_id``."""
        return next((channel.machine for channel in self if connection_id in channel.machine.connections), None)

    def reallocate_port(self, connection_id: int) -> int | None:
        """Another control port for a connection whose port the driver refused (None: none left)."""
        machine = self.owner(connection_id)
        return None if machine is None else machine.reallocate_port(connection_id)

    def release(self, connection_id: int) -> bool:
        """Give a connection's ids (and port) back."""
        machine = self.owner(connection_id)
        return machine is not None and machine.release(connection_id)

    def close(self) -> None:
        """Close every channel's streams and give back every id they hold."""
        for channel in self:
            channel.link.close()
            for connection_id in list(channel.machine.connections):
                channel.machine.release(connection_id)


@dataclass(slots=True)
class Pending:
    """An accepted client's streams while the driver adds them (polled, not awaited: a burst of
    handshakes would otherwise stop the event loop for a driver round trip each) and come up."""

    link: HandshakeChannel
    accepted: ClientAccepted
    subscription: Registration[Subscription]
    publication: Registration[ExclusivePublication] | None = None
    """None while the table decides what follows a refusal (another port, or giving up)."""
    streams: tuple[ExclusivePublication, Subscription] | None = None
    """Once both exist (the connection is STARTING)."""

    def discard(self) -> None:
        """Give up on the streams: what was asked is withdrawn, what exists is closed."""
        if self.streams is not None:
            close_quietly(*self.streams)
            return
        if self.publication is not None:
            self.publication.cancel()
        self.subscription.cancel()


class AcceptedStreams(dict[int, Pending]):
    """The streams of accepted clients while the driver adds them (polled, not awaited: a burst of
    handshakes would otherwise stop the adapter for a driver round trip each) and until they are up, by
    connection id; what becomes of each is the connection table's (fed here: ``open_failed``,
    ``opened``, ``started``)."""

    def __init__(self, config: ServerConfig, table: ConnectionTable) -> None:
        super().__init__()
        self.config = config
        self.table = table

    def open(self, context: Context, link: HandshakeChannel, accepted: ClientAccepted, now_ns: int) -> None:
        """Ask the driver for an accepted client's two streams (the table opened its connection); the
        answers come with :meth:`poll`."""
        if link.host is None:
            channel = ipc_channel(session_id=accepted.client_session_id)
        else:
            reliable = None if self.config.reliable else False
            endpoint = host_port(link.host, link.port)
            channel = udp_channel(endpoint=endpoint, session_id=accepted.client_session_id, reliable=reliable)
        try:
            subscription = context.async_add_subscription(channel, accepted.client_stream_id)
        except DriverError as exc:
            self.table.open_failed(accepted.connection_id, str(exc), now_ns, publication=False)
            return
        self[accepted.connection_id] = Pending(link, accepted, subscription)
        self.reopen(context, accepted.connection_id, accepted.control_port, now_ns)

    def reopen(self, context: Context, connection_id: int, control_port: int, now_ns: int) -> None:
        """The connection's publication (again, on another control port, after a refusal): dynamic MDC to
        the client from ``control_port`` over UDP."""
        pending = self.get(connection_id)
        if pending is None:
            return
        config = self.config
        host, accepted = pending.link.host, pending.accepted
        session_id = accepted.server_session_id
        if host is None:
            channel = connection_ipc_channel(session_id, config.ipc_term_length)
        else:
            control = host_port(host, control_port)
            channel = udp_channel(
                control=control, control_mode="dynamic", session_id=session_id,
                term_length=config.term_length, mtu=config.network_mtu, linger=CONNECTION_LINGER,
            )  # fmt: skip
        try:
            pending.publication = context.async_add_exclusive_publication(channel, accepted.server_stream_id)
        except DriverError as exc:
            pending.publication = None
            self.table.open_failed(accepted.connection_id, str(exc), now_ns, publication=True)

    def poll(self, now_ns: int) -> int:
        """Streams the driver added (then the client is told: WELCOME), and streams that came up (a
        refusal or a start is work the table's events count)."""
        work = 0
        table = self.table
        for connection_id, pending in list(self.items()):
            if pending.streams is None and pending.publication is not None:
                try:
                    publication = pending.publication.poll()
                except DriverError as exc:  # its port is most likely held by another program on this host
                    pending.publication = None
                    table.open_failed(connection_id, str(exc), now_ns, publication=True)
                    continue
                try:
                    subscription = pending.subscription.poll()
                except DriverError as exc:
                    table.open_failed(connection_id, str(exc), now_ns, publication=False)
                    continue
                if publication is None or subscription is None:
                    continue
                pending.streams = (publication, subscription)
                pending.link.machine.accept(connection_id, now_ns)
                table.opened(connection_id, now_ns)
                work += 1
            if pending.streams is not None:
                publication, subscription = pending.streams
                if subscription.image_count > 0 and publication.is_connected:
                    table.started(connection_id, now_ns)  # its event counts as work
        return work

    def half_up(self) -> bool:
        """Whether a connection's client may count itself connected while we do not see it up yet (its
        image of our publication comes up before our publication hears its status message)."""
        streams = [pending.streams for pending in self.values() if pending.streams is not None]
        return any((sub.image_count > 0) != publication.is_connected for publication, sub in streams)
