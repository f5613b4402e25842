"""``Client``: connects to a server over UDP (NAT-friendly) or IPC, with automatic IPC for a server
on this host when both sides enable it, and UDP as the fallback."""

from __future__ import annotations

import asyncio
import logging
import time

from ...client import Header
from ..buffered import Hold
from ..config import ClientConfig
from ..connecting import connect_window, is_local_host, ns_until
from ..delivery import Delivery
from ..errors import ClientClosedError, ClientError, ConnectTimeout
from ..events import Closed, HandshakeCompleted, HandshakeTimedOut, Rejected
from ..handshake import ClientHandshake, rejection_error
from ..recovery import quiet_deadline_ns
from ..session import PlainRecords, RecordLayer, Records
from ..transport import (
    HANDSHAKE_IPC_REPLY_STREAM,
    HANDSHAKE_IPC_STREAM,
    HANDSHAKE_POLL_LIMIT,
    HANDSHAKE_STREAM,
    Link,
    addresses_of,
    client_streams,
    close_quietly,
    earliest,
    handshake_channels,
    handshake_cycle,
    host_port,
    ipc_channel,
    resolve_host,
    shared_contexts,
)
from .connection import Connection
from .endpoint import Endpoint
from .transport import IdleBackoff, registered_pair

__all__ = ["Client"]

log = logging.getLogger("slipstream.network.client")

IPC_PROBE_S = 0.5
"""How long automatic IPC waits for a server on this host before falling back to UDP."""


class Client(Endpoint):
    """An application client: ``async with Client(config) as client: c = await client.connect(host, port)``."""

    _role = "client"

    def __init__(self, config: ClientConfig) -> None:
        if not isinstance(config, ClientConfig):
            raise TypeError(f"Client needs a ClientConfig, not {type(config).__name__}")
        super().__init__(config)
        self.config: ClientConfig = config
        self.connection: Connection | None = None
        """The current connection (None before connecting, while reconnecting, and after it ended)."""
        self._last_target: tuple[str | None, int, int | None, float | None] | None = None
        self._started = 0.0
        """When the current connect began (an IPC probe may have gone first)."""
        self._closed = False
        self._lost: Connection | None = None
        """The lost connection whose sends wait for the next one (``ClientConfig.reconnect``)."""
        self._reconnecting: asyncio.Task[None] | None = None
        self._delivery: Delivery | None = None
        """The delivery session with its server, kept across connections (a lost one's messages go again)."""

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- connecting -------------------------------------------------------------------------------

    async def connect(
        self, host: str, port: int, control_port: int | None = None, timeout: float | None = None
    ) -> Connection:
        """Connect to the server at ``host:port`` (handshake port; its control port defaults to
        ``port + 1``), waiting at most ``timeout`` seconds in all (default: the config's
        ``connect_timeout``, 30 s; 0 waits forever). Raises a ClientRejected subclass, ConnectTimeout,
        or ClientClosedError after ``close``."""
        self._check_open()
        if not isinstance(port, int) or not 1 <= port <= 65534:
            raise ValueError(f"port must be in 1..65534: {port!r}")
        control_port = port + 1 if control_port is None else control_port
        timeout_s = connect_window(self.config.connect_timeout if timeout is None else timeout)  # (inf: forever)
        self._last_target = (host, port, control_port, timeout_s)
        self._started = time.monotonic()
        replacing = self._reconnecting is not None and asyncio.current_task() is self._reconnecting
        if self.connection is not None and not self.connection.is_closed and not replacing:
            raise ClientError(f"already connected (connection {self.connection.id}); close it first")
        config = self.config
        deadline = time.monotonic() + timeout_s
        udp = config.enable_ipv4 or config.enable_ipv6
        if config.enable_ipc and (is_local_host(host) or not udp):
            connection = await self._attempt(None, port, None, deadline, probe=udp)
            if connection is not None:
                return connection
        if not udp:
            raise ConnectTimeout(f"no IPC server for port {port} answered within {timeout_s:g} s")
        address = resolve_host(host, ipv4=self.config.enable_ipv4, ipv6=self.config.enable_ipv6)
        connection = await self._attempt(address, port, control_port, deadline, probe=False)
        assert connection is not None
        return connection

    async def connect_ipc(self, timeout: float | None = None) -> Connection:
        """Connect over IPC to a server that called ``bind_ipc`` (``timeout``: as for ``connect``)."""
        self._check_open()
        if not self.config.enable_ipc:
            raise ClientError("enable_ipc is False in this client's config")
        timeout_s = connect_window(self.config.connect_timeout if timeout is None else timeout)
        self._last_target = (None, 0, None, timeout_s)
        self._started = time.monotonic()
        connection = await self._attempt(None, 0, None, time.monotonic() + timeout_s, probe=False)
        assert connection is not None
        return connection

    async def reconnect(self) -> Connection:
        """Connect again to the last target (closing the current connection first, if any)."""
        self._check_open()
        if self._last_target is None:
            raise ClientError("reconnect() before any connect()")
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()
        return await self._connect_again()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this client was closed: make a new Client to connect again")

    async def _connect_again(self) -> Connection:
        assert self._last_target is not None
        host, port, control_port, timeout_s = self._last_target
        if host is None:
            return await self.connect_ipc(timeout_s)
        return await self.connect(host, port, control_port, timeout_s)

    async def _attempt(
        self, host: str | None, port: int, control_port: int | None, deadline: float, *, probe: bool
    ) -> Connection | None:
        """One connection attempt. ``probe``: an automatic-IPC try that gives up quietly (None) when
        no server answers within IPC_PROBE_S."""
        config = self.config
        context = self._acquire_context()
        where = f"IPC (port {port})" if host is None else f"{host_port(host, port)}"
        started = self._started
        try:
            if host is None:
                hs_sub, hs_pub = await registered_pair(
                    context,
                    context.async_add_subscription(ipc_channel(), HANDSHAKE_IPC_REPLY_STREAM + port),
                    context.async_add_exclusive_publication(ipc_channel(), HANDSHAKE_IPC_STREAM + port),
                )
            else:
                assert control_port is not None
                answers, hellos = handshake_channels(host, port, control_port)
                hs_sub, hs_pub = await registered_pair(
                    context,
                    context.async_add_subscription(answers, HANDSHAKE_STREAM),
                    context.async_add_exclusive_publication(hellos, HANDSHAKE_STREAM),
                )
        except BaseException:
            self._release_if_idle()
            raise
        backoff = IdleBackoff(max_sleep_s=0.005, deep_after_s=3600.0)
        failed = True
        link: Link | None = None
        try:
            wait_until = min(deadline, started + IPC_PROBE_S) if probe else deadline
            while not (hs_pub.is_connected and hs_sub.image_count > 0):
                shared_contexts.invoke(context)
                if time.monotonic() >= wait_until:
                    if probe:
                        failed = False  # the UDP attempt that follows uses the same driver
                        return None
                    raise ConnectTimeout(f"no server answered at {where} within {time.monotonic() - started:.1f} s")
                await backoff.idle(time.monotonic())
            now_ns = time.monotonic_ns()
            pinned = self.store.pinned_key(host or "ipc") if host is not None else None
            machine = ClientHandshake(
                app_id=config.app_id,
                tag=config.tag,
                static_private=self.private_key,
                description=self.registrations.description(),
                describe_difference=self.registrations.first_difference,
                pinned_key=pinned,
                allow_key_change=config.allow_key_change,
                now_ns=now_ns,
                timeout_ns=ns_until(deadline, time.monotonic()),
                plaintext_ipc=host is None and not config.encrypt_ipc,
                resume=self._session().session_id,
            )
            machine.start(now_ns)

            def on_packet(payload: memoryview, header: Header) -> None:
                machine.receive(bytes(payload), time.monotonic_ns())

            link = Link(hs_pub, hs_sub, on_packet, poll_limit=HANDSHAKE_POLL_LIMIT)
            backoff.reset()
            result: HandshakeCompleted | None = None
            while result is None:
                work = handshake_cycle(link, machine, time.monotonic_ns())
                work += shared_contexts.invoke(context)  # an invoker-mode driver sends and receives now
                for event in machine.take_events():
                    if isinstance(event, HandshakeCompleted):
                        result = event
                    elif isinstance(event, Rejected):
                        if self._recording is not None:
                            self._recording.rejected(host, event.reason, config.tag)
                        raise rejection_error(event, f"server at {where}")
                    elif isinstance(event, HandshakeTimedOut):
                        raise ConnectTimeout(f"no handshake with the server at {where} within {event.waited_s:.1f} s")
                if result is None:
                    if work:
                        backoff.reset()
                    await backoff.idle(time.monotonic())
            failed = False
        finally:
            close_quietly(hs_pub, hs_sub)
            if failed:  # rejected or timed out: a client that never connects holds no driver
                self._release_if_idle()
        if host is not None and machine.remote_public_key is not None:
            self.store.pin(host, machine.remote_public_key)
        try:
            return await self._open(result, host, control_port, port, deadline, where, machine.plaintext)
        except BaseException:
            self._release_if_idle()
            raise

    async def _open(
        self,
        done: HandshakeCompleted,
        host: str | None,
        control_port: int | None,
        port: int,
        deadline: float,
        where: str,
        plaintext: bool,
    ) -> Connection:
        config = self.config
        started = self._started
        context = self._acquire_context()
        (sub_channel, sub_stream), (pub_channel, pub_stream) = client_streams(config, done, host, port)
        subscription, publication = await registered_pair(
            context,
            context.async_add_subscription(sub_channel, sub_stream),
            context.async_add_exclusive_publication(pub_channel, pub_stream),
        )
        backoff = IdleBackoff(max_sleep_s=0.005, deep_after_s=3600.0)
        while not (subscription.image_count > 0 and publication.is_connected):
            shared_contexts.invoke(context)
            if time.monotonic() >= deadline:
                publication.close()
                subscription.close()
                raise ConnectTimeout(
                    f"the server at {where} accepted, but its connection streams did not come up within "
                    f"{time.monotonic() - started:.1f} s"
                )
            await backoff.idle(time.monotonic())
        if (quiet := self.connection) is not None and not quiet.is_closed:  # replaced (a quiet server): it ends
            quiet.lose("the server went quiet: a new connection replaces this one")  # first, with its delivery
        records: Records = PlainRecords() if plaintext else RecordLayer(done.send_key, done.receive_key)
        expiry_ns = done.connection_expiry_ns or int(config.connection_expiry * 1e9)
        connection = self._new_connection(
            records,
            min(expiry_ns, int(config.connection_expiry * 1e9)),
            publication,
            subscription,
            connection_id=done.connection_id,
            remote_address=host,
            remote_port=None if host is None else port,
            tag=config.tag,
            remote_public_key=done.remote_public_key,
            global_objects=None,
            delivery=self._session(),
        )
        self.connection, connection.remote_key_changed = connection, done.key_changed
        self._start_poller()
        if self._lost is not None:  # what waited for a new connection goes on this one
            self._lost.hand_over(connection)
            self._lost = None
        self._connection_up(connection)
        return connection

    # -- running ----------------------------------------------------------------------------------

    def _cycle(self, now_ns: int) -> int:
        connection = self.connection
        if connection is None:
            return 0
        work = connection.poll(now_ns)
        if (quiet := self._quiet_ns(connection)) is not None and now_ns >= quiet:
            log.info("connection %d: the server went quiet, connecting again alongside", connection.id)
            self._reconnecting = asyncio.ensure_future(self._reconnect())
        return work

    def _quiet_ns(self, connection: Connection) -> int | None:
        """When the connection counts as quiet (``recovery.QUIET_PART``); None when that starts nothing."""
        if not self.config.reconnect or self._reconnecting is not None or self._closing or connection.is_closed:
            return None
        machine = connection.machine
        return None if self._last_target is None else quiet_deadline_ns(machine.last_received_ns, machine.expiry_ns)

    def next_deadline_ns(self, now_ns: int) -> int | None:
        quiet = None if self.connection is None else self._quiet_ns(self.connection)
        return earliest((quiet,), super().next_deadline_ns(now_ns))

    def _live_connections(self) -> list[Connection]:
        connection = self.connection
        return [] if connection is None else [connection]

    def _release_connection(self, connection: Connection) -> None:
        if self.connection is connection:
            self.connection = None
        self._close_streams_later(connection)

    # -- after a fault ------------------------------------------------------------------------------

    def _session(self) -> Delivery:
        if self._delivery is None:
            self._delivery = Delivery()
        return self._delivery

    def connection_ended(self, connection: Connection, event: Closed) -> None:
        super().connection_ended(connection, event)
        if event.expired and self.config.reconnect and not self._closing and self._last_target is not None:
            self._lost = connection  # lost, not closed: connect again (``recovery``)
            if self._reconnecting is None:
                self._reconnecting = asyncio.ensure_future(self._reconnect())
        elif event.expired:
            self._end_session(connection)
        else:
            self._delivery = None  # closed: what went before the CLOSE was delivered

    def _end_session(self, connection: Connection | None) -> None:
        """No connection will carry the session on: what it never delivered goes to ``on_error``."""
        delivery, self._delivery = self._delivery, None
        error = self._undelivered("the connection to the server was lost", delivery)
        if error is not None:
            self.report_error(connection, error)

    def hold(self, connection: Connection, message: object) -> Hold:
        return Hold.RECONNECTING if connection is self._lost else Hold.CLOSED

    async def _reconnect(self) -> None:
        """Connect again until it works, ``close`` is called, or the server refuses us for good."""
        try:
            await self._retry(self._connect_again, self.config.reconnect_max_delay)
        finally:
            self._reconnecting = None
            if self._lost is not None and (self._closing or self.connection is None):
                self._lost.hand_over(None)  # no new connection will come: its waiting sends fail
                self._end_session(self._lost)
                self._lost = None

    def _release_if_idle(self) -> None:
        if self.connection is None and not self._polling:
            self._release_context()

    def remove_server_key(self, host: str) -> bool:
        """Forget the pinned key of the server at ``host`` (after a legitimate key change), given as to
        ``connect``: pins are kept by address, so a name is resolved (a localhost alias covers both
        loopback addresses). False if no key was pinned for it."""
        addresses = addresses_of(host, ipv4=self.config.enable_ipv4, ipv6=self.config.enable_ipv6)
        return any([self.store.remove_pin(address) for address in addresses])  # (every one: no short cut)

    async def close(self) -> None:
        """Close the connection (the server hears CLOSE at once) and release the driver."""
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        connection = self.connection
        if connection is not None:
            connection.close_now("client closing")
        await self._wait_closings()
        await self._stop_poller()
        self._stop_recording()
        await self._release_context_drained()
        self.store.close()
        self._closed = True

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
