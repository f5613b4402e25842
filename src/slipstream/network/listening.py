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
from collections.abc import Callable

from ..client import Context, ExclusivePublication, Header, Subscription
from ..client.allocation import IdAllocator, PortAllocator
from .admission import AdmissionPolicy, IpFilterRule, RejectReason
from .config import ServerConfig
from .handshake import AdmissionCheck, ServerHandshake
from .registrations import Registrations
from .transport import HANDSHAKE_POLL_LIMIT, Link, parse_source

__all__ = ["OUTBOX_LIMIT", "HandshakeChannel", "HandshakeChannels", "admission_check"]

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


class HandshakeChannel:
    """One handshake channel (UDP port or IPC): its machine and its transport (answers the handshake
    publication refuses for now wait in the link's outbox, the oldest dropped past OUTBOX_LIMIT)."""

    def __init__(
        self,
        machine: ServerHandshake,
        host: str | None,
        port: int,
        publication: ExclusivePublication,
        subscription: Subscription,
    ) -> None:
        self.machine = machine
        self.host = host
        """The listening host (None over IPC)."""
        self.port = port
        self.link = Link(
            publication, subscription, self._on_packet, poll_limit=HANDSHAKE_POLL_LIMIT, outbox_limit=OUTBOX_LIMIT
        )

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
        channel = HandshakeChannel(machine, host, port, answering, listening)
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
