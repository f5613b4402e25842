"""``Server``: accepts clients over UDP (through NAT) and IPC, runs their connections.

Per bound port, clients publish handshake packets to the server's port, and hear the answers by
dynamic MDC from its control port (a client behind NAT registers there from its own socket). An
accepted client gets, for its connection, a stream to the server's port (its own stream and session
ids) and a dynamic-MDC publication from a control port of its own; over IPC, streams with their own
ids. Ids and ports go back to the allocators when the connection's publication has lingered out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...client import DriverError, ExclusivePublication, Header, Registration, Subscription
from ...client.allocation import IdAllocator, PortAllocator
from ..admission import AdmissionPolicy, IpFilterRule, RejectReason
from ..buffered import BufferedSessions, BufferOverflowed, Hold, SessionExpired, SessionResumed
from ..config import ServerConfig
from ..errors import ServerError, UndeliveredError
from ..events import ClientAccepted, Closed, Rejected
from ..handshake import ServerHandshake
from ..rmi import ObjectTable
from ..session import PlainRecords, RecordLayer, Records
from ..transport import (
    BUSY_CADENCE_NS,
    HANDSHAKE_IPC_REPLY_STREAM,
    HANDSHAKE_IPC_STREAM,
    HANDSHAKE_POLL_LIMIT,
    HANDSHAKE_STREAM,
    IPC_MTU,
    Link,
    close_quietly,
    earliest,
    handshake_cycle,
    host_port,
    ipc_channel,
    listen_host,
    parse_source,
    udp_channel,
)
from .connection import Connection
from .endpoint import Endpoint

__all__ = ["Server"]

log = logging.getLogger("slipstream.network.server")

CONNECTION_LINGER = "500ms"
HANDSHAKE_TERM_LENGTH = 1024 * 1024
"""The all-clients handshake channel is broadcast (MDC, max flow control): a generous term keeps a
client that is slow to poll from being lapped while many others handshake."""
STARTING_FACTOR = 3
"""An accepted client's streams may take this many handshake timeouts to come up (setting up a
publication and a subscription per client is the slow part when hundreds connect at once)."""
OUTBOX_LIMIT = 4096
"""Handshake answers held while the handshake publication is back-pressured (the oldest go first;
a client whose answer is lost retries)."""
PORT_ATTEMPTS = 5
"""Control ports tried for one connection when the driver cannot bind one (another socket holds it)."""
RELEASE_DELAY_S = 1.0
"""Ids and ports of a closed connection return to the pools after its publication lingered out."""
SETTLE_STEP_S = 0.005
"""How often ``close`` looks again at connections still coming up."""


class _Link:
    """One handshake channel (UDP port or IPC): its machine and its transport (answers the handshake
    publication refuses for now wait in the link's outbox, the oldest dropped past OUTBOX_LIMIT)."""

    def __init__(
        self,
        machine: ServerHandshake,
        host: str | None,
        port: int,
        publication: ExclusivePublication,
        subscription: Subscription,
        on_packet: Callable[[_Link, memoryview, Header], None],
    ) -> None:
        self.machine = machine
        self.host = host
        self.port = port
        self.link = Link(
            publication,
            subscription,
            lambda payload, header: on_packet(self, payload, header),
            poll_limit=HANDSHAKE_POLL_LIMIT,
            outbox_limit=OUTBOX_LIMIT,
        )


@dataclass(slots=True)
class _Opening:
    """An accepted handshake whose streams the driver is adding (awaited by polling, not blocking:
    a burst of handshakes would otherwise stop the event loop for a driver round trip each)."""

    link: _Link
    event: ClientAccepted
    publication: Registration[ExclusivePublication]
    subscription: Registration[Subscription]
    control_port: int | None
    """The UDP control port the publication was asked for (None over IPC)."""
    attempts: int = 1


@dataclass(slots=True)
class _Starting:
    link: _Link
    event: ClientAccepted
    publication: ExclusivePublication
    subscription: Subscription
    deadline_ns: int
    remote_port: int | None


class Server(Endpoint):
    """An application server: ``async with Server(config) as server: await server.bind(port)``."""

    _role = "server"

    def __init__(self, config: ServerConfig) -> None:
        if not isinstance(config, ServerConfig):
            raise TypeError(f"Server needs a ServerConfig, not {type(config).__name__}")
        super().__init__(config)
        self.config: ServerConfig = config
        self._policy = AdmissionPolicy(
            max_clients=config.max_clients,
            max_connections_per_address=config.per_address_limit,
            rules=[IpFilterRule(rule) for rule in config.ip_filters],
            filter_callback=config.filter,
            allowed_keys=None,
            max_tag_length=config.max_tag_length,
        )
        self.sessions = IdAllocator(1, 65534)
        """Session ids of connections (both directions), the seed's range."""
        self.streams = IdAllocator(1, 65533)
        self._links: list[_Link] = []
        self._opening: list[_Opening] = []
        self._starting: list[_Starting] = []
        self._connections: dict[int, Connection] = {}
        self._owner: dict[int, _Link] = {}
        self.rejected: list[Rejected] = []
        """Recent rejections (bounded), for operators and tests."""
        self._buffered: BufferedSessions[object] | None = None
        if config.buffered_sessions:
            self._buffered = BufferedSessions(
                timeout_ns=int(config.buffered_timeout * 1e9),
                capacity=config.buffered_capacity,
                rules=() if config.buffered_rule is None else (config.buffered_rule,),
            )
        self._waiting: dict[bytes, Connection] = {}
        """Lost connections whose buffered session waits for the peer (their on_disconnect is pending)."""
        self.rmi = ObjectTable(self.rmi_registry, is_global=True)
        """Global remote objects every client reaches: ``server.rmi.save(obj) -> id``, ``save(obj, id)``,
        ``delete(obj_or_id)``; a client calls them through ``connection.rmi.get_global(Interface, id)``."""

    # -- public -----------------------------------------------------------------------------------

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connections(self) -> list[Connection]:
        """The connections that are up."""
        return list(self._connections.values())

    @property
    def allocated(self) -> int:
        """Ids held by live or lingering connections (0 once every connection is released)."""
        return sum(len(link.machine.connections) for link in self._links)

    @property
    def pending_handshakes(self) -> int:
        """Half-open handshakes held now."""
        return sum(link.machine.pending_count for link in self._links)

    @property
    def handshake_stats(self) -> list[Any]:
        """Each handshake channel's counters (HELLOs, rate-limited, evicted, rejected...)."""
        return [link.machine.stats for link in self._links]

    async def bind(self, port: int, control_port: int | None = None) -> None:
        """Listen on UDP ``port`` (handshakes) and ``control_port`` (default ``port + 1``), for the
        enabled IP families; with IPC enabled, also on IPC (clients on this host use it)."""
        config = self.config
        if not isinstance(port, int) or not 1 <= port <= 65534:
            raise ValueError(f"port must be in 1..65534: {port!r}")
        control_port = port + 1 if control_port is None else control_port
        if not isinstance(control_port, int) or not 1 <= control_port <= 65535 or control_port == port:
            raise ValueError(f"control_port must be in 1..65535 and differ from port: {control_port!r}")
        if any(link.port == port for link in self._links):
            raise ServerError(f"the server is already bound to port {port}")
        context = self._acquire_context()
        if config.enable_ipv4 or config.enable_ipv6:
            host = listen_host(config.listen_address, ipv4=config.enable_ipv4, ipv6=config.enable_ipv6)
            first, count = config.connection_ports or (port + 2, config.max_clients)
            ports = PortAllocator(first, min(count, 65536 - first))
            subscription = context.add_subscription(udp_channel(endpoint=host_port(host, port)), HANDSHAKE_STREAM)
            try:
                publication = context.add_exclusive_publication(
                    udp_channel(
                        control=host_port(host, control_port),
                        control_mode="dynamic",
                        term_length=HANDSHAKE_TERM_LENGTH,
                    ),
                    HANDSHAKE_STREAM,
                )
            except BaseException:
                subscription.close()
                raise
            self._add_link(subscription, publication, host, port, ports)
        if config.enable_ipc:
            await self._bind_ipc(port)
        self._start_poller()

    async def bind_ipc(self) -> None:
        """Listen over IPC only (clients use ``connect_ipc``)."""
        if not self.config.enable_ipc:
            raise ServerError("enable_ipc is False in this server's config")
        self._acquire_context()
        await self._bind_ipc(0)
        self._start_poller()

    async def _bind_ipc(self, port: int) -> None:
        context = self._acquire_context()
        subscription = context.add_subscription(ipc_channel(), HANDSHAKE_IPC_STREAM + port)
        try:
            publication = context.add_exclusive_publication(ipc_channel(), HANDSHAKE_IPC_REPLY_STREAM + port)
        except BaseException:
            subscription.close()
            raise
        self._add_link(subscription, publication, None, port, None)

    def _add_link(
        self,
        subscription: Subscription,
        publication: ExclusivePublication,
        host: str | None,
        port: int,
        ports: PortAllocator | None,
    ) -> None:
        config = self.config
        ipv4_allowed = config.enable_ipv4

        def admission(
            address: str | None, tag: str, public_key: bytes | None, current_total: int, current_for_address: int
        ) -> tuple[int, str] | None:
            if address is not None and not ipv4_allowed and "." in address:
                return int(RejectReason.NOT_PERMITTED), "IPv4 connections are not permitted"
            counted = len(self._connections) + len(self._opening) + len(self._starting)
            per_address = 0
            if address is not None:
                per_address = sum(1 for c in self._connections.values() if c.remote_address == address)
                per_address += sum(1 for s in self._opening if s.event.address == address)
                per_address += sum(1 for s in self._starting if s.event.address == address)
            reason = self._policy.check(address, tag, public_key or bytes(32), counted, per_address)
            if (
                reason is None
                and public_key is not None
                and config.allowed_keys is not None
                and public_key not in config.allowed_keys
            ):
                reason = RejectReason.KEY_NOT_ALLOWED
            if reason is None:
                return None
            return int(reason), reason.message

        machine = ServerHandshake(
            app_id=config.app_id,
            static_private=self.private_key,
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
        self._links.append(_Link(machine, host, port, publication, subscription, self._on_handshake))

    # -- handshakes -------------------------------------------------------------------------------

    def _on_handshake(self, link: _Link, payload: memoryview, header: Header) -> None:
        address: str | None = None
        port: int | None = None
        if link.host is not None:
            image = link.link.subscription.image_by_session_id(header.session_id)
            if image is None:
                return
            address, port = parse_source(image.source_identity)
            if address is None:
                return
        link.machine.receive(
            bytes(payload), source=header.session_id, address=address, port=port, now_ns=time.monotonic_ns()
        )

    def _handshake_cycle(self, link: _Link, now_ns: int) -> int:
        machine = link.machine
        work = handshake_cycle(link.link, machine, now_ns)
        for event in machine.take_events():
            if isinstance(event, ClientAccepted):
                if self._recording is not None:
                    self._recording.accepted(event.connection_id, event.address, event.port, event.tag)
                self._accept(link, event)
            elif isinstance(event, Rejected):
                self.rejected.append(event)
                del self.rejected[:-100]
                if self._recording is not None:
                    self._recording.rejected(event.address, event.reason, event.tag)
                log.info("rejected %s: %s", event.address or "IPC", event.message)
        return work

    def _add_publication(
        self, link: _Link, event: ClientAccepted, control_port: int | None
    ) -> Registration[ExclusivePublication]:
        """The connection's publication: dynamic MDC to the client's control port over UDP."""
        config = self.config
        context = self._acquire_context()
        if link.host is None:
            return context.async_add_exclusive_publication(
                ipc_channel(session_id=event.server_session_id, term_length=config.ipc_term_length, mtu=IPC_MTU),
                event.server_stream_id,
            )
        assert control_port is not None
        return context.async_add_exclusive_publication(
            udp_channel(
                control=host_port(link.host, control_port),
                control_mode="dynamic",
                session_id=event.server_session_id,
                term_length=config.term_length,
                mtu=config.network_mtu,
                linger=CONNECTION_LINGER,
            ),
            event.server_stream_id,
        )

    def _accept(self, link: _Link, event: ClientAccepted) -> None:
        """Ask the driver for the connection's two streams; ``_check_opening`` takes the answers."""
        config = self.config
        context = self._acquire_context()
        control_port = None if link.host is None else event.control_port
        try:
            publication = self._add_publication(link, event, control_port)
            try:
                if link.host is not None:
                    subscription = context.async_add_subscription(
                        udp_channel(
                            endpoint=host_port(link.host, link.port),
                            session_id=event.client_session_id,
                            reliable=None if config.reliable else False,
                        ),
                        event.client_stream_id,
                    )
                else:
                    subscription = context.async_add_subscription(
                        ipc_channel(session_id=event.client_session_id), event.client_stream_id
                    )
            except BaseException:
                publication.cancel()
                raise
        except DriverError as exc:
            log.warning("cannot open connection %d's streams: %s", event.connection_id, exc)
            link.machine.release(event.connection_id)
            return
        self._opening.append(_Opening(link, event, publication, subscription, control_port))

    def _check_opening(self, now_ns: int) -> int:
        work = 0
        for opening in list(self._opening):
            event = opening.event
            try:
                publication = opening.publication.poll()
            except DriverError as exc:
                port = None
                if opening.control_port is not None and opening.attempts < PORT_ATTEMPTS:
                    port = opening.link.machine.reallocate_port(event.connection_id)
                if port is not None:  # the port is most likely held by another program on this host
                    log.info("control port %d unavailable (%s): trying %d", opening.control_port, exc, port)
                    opening.control_port = port
                    opening.attempts += 1
                    try:
                        opening.publication = self._add_publication(opening.link, event, port)
                        continue
                    except DriverError as again:
                        exc = again
                self._fail_opening(opening, exc)
                work += 1
                continue
            try:
                subscription = opening.subscription.poll()
            except DriverError as exc:
                self._fail_opening(opening, exc)
                work += 1
                continue
            if publication is None or subscription is None:
                continue
            self._opening.remove(opening)
            work += 1
            link = opening.link
            self._owner[event.connection_id] = link
            link.machine.accept(event.connection_id, now_ns)
            self._starting.append(
                _Starting(
                    link,
                    event,
                    publication,
                    subscription,
                    now_ns + int(STARTING_FACTOR * self.config.handshake_timeout * 1e9),
                    event.port,
                )
            )
        return work

    def _fail_opening(self, opening: _Opening, error: DriverError | None) -> None:
        """Give up on an accepted handshake's streams (``error``: why; None when the server closes)."""
        self._opening.remove(opening)
        opening.publication.cancel()
        opening.subscription.cancel()
        if error is not None:
            log.warning("cannot open connection %d's streams: %s", opening.event.connection_id, error)
        opening.link.machine.release(opening.event.connection_id)

    def _check_starting(self, now_ns: int) -> int:
        work = 0
        for starting in list(self._starting):
            if starting.subscription.image_count > 0 and starting.publication.is_connected:
                self._starting.remove(starting)
                self._activate(starting, now_ns)
                work += 1
            elif now_ns >= starting.deadline_ns:
                self._starting.remove(starting)
                log.info("connection %d: the client never came up", starting.event.connection_id)
                close_quietly(starting.publication, starting.subscription)
                self._release_later(starting.link, starting.event.connection_id)
                work += 1
        return work

    def _activate(self, starting: _Starting, now_ns: int) -> None:
        connection = self._make_connection(starting)
        self._connections[connection.id] = connection
        queued: list[object] = []
        sessions = self._buffered
        if sessions is not None:
            key = connection.remote_public_key
            wanted = sessions.wants_buffering(connection.remote_address, connection.tag)
            queued = sessions.connected(key, now_ns, buffered=wanted)
            self._session_events()
            previous = self._waiting.pop(key, None)
            if previous is not None:  # the session resumes here: the lost connection's end is reported now
                previous.hand_over(connection)
                self._fire_disconnect(previous)
        connection.deliver(queued)  # what waited for this peer goes first, in order
        self._connection_up(connection)

    async def _settle_starting(self) -> None:
        """Before closing, wait for each starting connection that is half up (the client's stream reached
        us, or our publication sees the client) until it is up, for at most the close timeout: that
        client may count itself connected already. Its image of our publication comes up before
        our publication hears its status message, and our subscription learns of its stream a moment
        after its publication connected. Once up, the connection is closed like any other: the client
        hears CLOSE (else it would wait out its expiry) and ``on_connect`` / ``on_disconnect`` run here
        as they did there."""

        def half_up() -> bool:
            return any((s.subscription.image_count > 0) != s.publication.is_connected for s in self._starting)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.close_timeout
        while half_up() and loop.time() < deadline:
            self.wake()
            await asyncio.sleep(SETTLE_STEP_S)

    # -- buffered sessions --------------------------------------------------------------------------

    def _session_waits(self, connection: Connection, event: Closed) -> bool:
        sessions = self._buffered
        if sessions is None:
            return False
        key = connection.remote_public_key
        if not event.expired:
            sessions.ended(key)  # only a lost peer is waited for; a deliberate close ends the session
            return False
        if not sessions.disconnected(key, time.monotonic_ns()):
            return False
        self._waiting[key] = connection
        return True

    def hold(self, connection: Connection, message: object) -> Hold:
        sessions = self._buffered
        key = connection.remote_public_key
        if sessions is None or self._waiting.get(key) is not connection:
            return Hold.CLOSED
        if sessions.enqueue(key, message):
            return Hold.QUEUED
        self._session_events()
        return Hold.FULL

    def _session_events(self) -> None:
        assert self._buffered is not None
        for event in self._buffered.take_events():
            if isinstance(event, SessionExpired):
                connection = self._waiting.pop(event.key, None)
                if connection is None:
                    continue
                if event.undelivered:
                    self.report_error(connection, UndeliveredError(
                        f"connection {connection.id}: the peer did not come back within "
                        f"{self.config.buffered_timeout:g} s; {len(event.undelivered)} messages were not delivered",
                        event.undelivered,
                    ))  # fmt: skip
                self._fire_disconnect(connection)
            elif isinstance(event, BufferOverflowed):
                pass  # the sender is told at once: ``send`` raises UndeliveredError, ``send_nowait`` says why
            elif isinstance(event, SessionResumed):
                log.info("buffered session resumed: %d queued messages delivered", event.delivered)

    def _make_connection(self, starting: _Starting) -> Connection:
        event = starting.event
        starting.link.machine.forget(event.pending_key)
        records: Records = PlainRecords() if event.plaintext else RecordLayer(event.send_key, event.receive_key)
        return self._new_connection(
            records,
            int(self.config.connection_expiry * 1e9),
            starting.publication,
            starting.subscription,
            connection_id=event.connection_id,
            remote_address=event.address,
            remote_port=starting.remote_port,
            tag=event.tag,
            remote_public_key=event.remote_public_key,
            global_objects=self.rmi,
        )

    def _live_connections(self) -> list[Connection]:
        return list(self._connections.values())

    def next_deadline_ns(self, now_ns: int) -> int | None:
        """The connections' timers, the handshakes' (answers waiting for room: soon), streams coming
        up (soon: checked at the busy cadence, never by spinning, which would starve an embedded driver
        thread of the GIL it needs to set them up) and the buffered sessions' expiry."""
        due = super().next_deadline_ns(now_ns)
        if self._starting or self._opening:
            due = earliest((now_ns + BUSY_CADENCE_NS,), due)
        for link in self._links:
            due = earliest((now_ns + BUSY_CADENCE_NS if len(link.link) else link.machine.deadline_ns,), due)
        if self._buffered is not None:
            due = earliest((self._buffered.deadline_ns,), due)
        return due

    def _release_connection(self, connection: Connection) -> None:
        self._connections.pop(connection.id, None)
        link = self._owner.get(connection.id)
        self._close_streams_later(
            connection, None if link is None else (lambda: self._release_later(link, connection.id))
        )

    def _release_later(self, link: _Link, connection_id: int) -> None:
        def release() -> None:
            self._owner.pop(connection_id, None)
            link.machine.release(connection_id)

        try:
            asyncio.get_running_loop().call_later(RELEASE_DELAY_S, release)
        except RuntimeError:
            release()

    # -- the poller -------------------------------------------------------------------------------

    def duty_cycle(self, now_ns: int) -> int:
        work = 0
        sessions = self._buffered
        if sessions is not None and (deadline := sessions.deadline_ns) is not None and now_ns >= deadline:
            sessions.handle_timer(now_ns)
            self._session_events()
        if not self._closing:  # a client accepted while closing would miss the CLOSE
            for link in self._links:
                work += self._handshake_cycle(link, now_ns)
        if self._opening:
            work += self._check_opening(now_ns)
        if self._starting:
            work += self._check_starting(now_ns)
        for connection in list(self._connections.values()):
            work += connection.poll(now_ns)
        return work

    async def close(self) -> None:
        """Close every connection (each peer hears CLOSE), stop listening, release the driver."""
        self._closing = True  # no handshakes from now on
        for opening in list(self._opening):  # not accepted yet: the client hears nothing, and retries or gives up
            self._fail_opening(opening, None)
        await self._settle_starting()
        if self._starting:
            self._check_starting(time.monotonic_ns())  # a client that is up must hear CLOSE too
        for starting in list(self._starting):
            if starting.publication.is_connected:
                # The client may be up though our side has not seen its image yet: tell it too.
                self._starting.remove(starting)
                connection = self._make_connection(starting)
                connection.close_now("server closing", notify=False)
                link = starting.link
                self._close_streams_later(connection, functools.partial(self._release_later, link, connection.id))
        for connection in list(self._connections.values()):
            connection.close_now("server closing")
        await self._wait_closings()
        if self._buffered is not None:
            self._buffered.close()  # sessions still waiting end now: what they held is reported
            self._session_events()
        await self._stop_poller()
        for starting in self._starting:
            close_quietly(starting.publication, starting.subscription)
            starting.link.machine.release(starting.event.connection_id)
        self._starting.clear()
        for link in self._links:
            link.link.close()
            for connection_id in list(link.machine.connections):
                link.machine.release(connection_id)
        self._owner.clear()
        self._stop_recording()
        await self._release_context_drained()
        self.store.close()
