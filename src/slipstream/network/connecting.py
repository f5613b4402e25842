"""What a client is whichever adapter runs it: how long a ``connect`` may wait (the seed's 0 waits
forever), whether the host named is this one (automatic IPC), the attempts of a connect as a generator of
waits (:class:`ClientCore`), its connection, and what happens when that is lost.

The attempts yield what to wait for: a :class:`~.pacing.Step` of a back-off, or :class:`Registering` (two
stream registrations, answered with the pair); ``aio.Client`` awaits each wait, ``sync.Client`` blocks on
it, and both throw what failed back in, so that the attempt cleans up as one piece of code."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import socket
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from ..client import ExclusivePublication, Header, Registration, Subscription
from .buffered import Hold
from .config import LOCALHOST_ALIASES, ClientConfig
from .connected import ConnectionBase
from .delivery import Delivery
from .errors import ClientClosedError, ClientError, ConnectTimeout
from .events import Closed, HandshakeCompleted, HandshakeTimedOut, Rejected
from .handshake import ClientHandshake, rejection_error
from .pacing import Backoff, Step
from .recovery import quiet_deadline_ns
from .running import RunningEndpoint
from .session import PlainRecords, RecordLayer, Records
from .transport import (
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

__all__ = [
    "FOREVER_NS",
    "IPC_PROBE_S",
    "ClientCore",
    "ConnectSteps",
    "Registering",
    "advance",
    "connect_window",
    "is_local_host",
    "ns_until",
]

log = logging.getLogger("slipstream.network.client")

C = TypeVar("C", bound=ConnectionBase[Any])
T = TypeVar("T")

IPC_PROBE_S = 0.5
"""How long automatic IPC waits for a server on this host before falling back to UDP."""

FOREVER_NS = 2**62
"""A handshake timeout that never comes (a connect that waits forever)."""


def connect_window(timeout: float | None) -> float:
    """A connect's timeout in seconds, ``math.inf`` for forever (0 or None, as the seed's 0); ValueError
    when negative or not a number."""
    if timeout is None or timeout == 0:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be positive, or 0 or None to wait forever: {timeout!r}")
    return float(timeout)


def ns_until(deadline: float, now: float) -> int:
    """Nanoseconds from ``now`` to ``deadline`` (monotonic seconds; inf: FOREVER_NS), at least 1."""
    if math.isinf(deadline):
        return FOREVER_NS
    return max(1, int((deadline - now) * 1e9))


def is_local_host(host: str) -> bool:
    """Loopback names and literals, and this host's own addresses (a name is resolved): candidates for
    automatic IPC, as the seed's are."""
    if host in LOCALHOST_ALIASES or host.startswith("127."):
        return True
    try:
        addresses = {ipaddress.ip_address(host.split("%", 1)[0])}
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
        except OSError:
            return False
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}
    return any(_is_own(address) for address in addresses)


def _is_own(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is one of this host's: only then can a socket bind it."""
    if address.is_loopback:
        return True
    if address.is_multicast or address.is_unspecified or address.is_link_local:
        return False  # (a link-local address names no host without its zone)
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.bind((str(address), 0))
        return True
    return False


@dataclass(frozen=True, slots=True)
class Registering:
    """Wait until both registrations are answered; send back ``(first's stream, second's stream)``. If
    either fails or the wait is given up, neither stays (the adapter cancels both)."""

    first: Registration[Subscription]
    second: Registration[ExclusivePublication]


ConnectSteps = Generator[Step | Registering, Any, T]
"""A connect's steps: yields waits, returns what it made."""


def advance(steps: ConnectSteps[T], reply: Any, error: BaseException | None) -> tuple[Any, bool]:
    """Resume ``steps`` with the last wait's ``reply`` (or throw its ``error`` in): ``(next wait, False)``,
    or ``(what it made, True)`` once it returned."""
    try:
        return (steps.send(reply) if error is None else steps.throw(error)), False
    except StopIteration as stop:
        return stop.value, True


def _backoff() -> Backoff:
    """The back-off between the polls of a connect: short pauses (at most 5 ms), never deep."""
    return Backoff(max_sleep_s=0.005, deep_after_s=3600.0)


class ClientCore(RunningEndpoint[C]):
    """A client without a way to wait: ``aio.Client`` and ``sync.Client`` run :meth:`_connecting` and
    reconnect after a loss, awaited or blocking."""

    _role = "client"

    def __init__(self, config: ClientConfig) -> None:
        if not isinstance(config, ClientConfig):
            raise TypeError(f"Client needs a ClientConfig, not {type(config).__name__}")
        super().__init__(config)
        self.config: ClientConfig = config
        self.connection: C | None = None
        """The current connection (None before connecting, while reconnecting, and after it ended)."""
        self._last_target: tuple[str | None, int, int | None, float | None] | None = None
        self._started = 0.0
        """When the current connect began (an IPC probe may have gone first)."""
        self._closed = False
        self._lost: C | None = None
        """The lost connection whose sends wait for the next one (``ClientConfig.reconnect``)."""
        self._delivery: Delivery | None = None
        """The delivery session with its server, kept across connections (a lost one's messages go again)."""

    # -- what an adapter gives ----------------------------------------------------------------------

    def _reconnecting(self) -> bool:
        """Whether a reconnect is under way."""
        raise NotImplementedError

    def _in_reconnect(self) -> bool:
        """Whether the caller is the reconnect itself (it may replace the current connection)."""
        raise NotImplementedError

    def _start_reconnect(self) -> None:
        """Connect again (``_connect_again``) until it works, ``close`` is called, or the server refuses
        us for good; then ``_reconnect_ended``."""
        raise NotImplementedError

    # -- connecting -------------------------------------------------------------------------------

    def _connecting(self, host: str, port: int, control_port: int | None, timeout: float | None) -> ConnectSteps[C]:
        """``connect``'s steps (see the adapters' ``connect``)."""
        self._check_open()
        if not isinstance(port, int) or not 1 <= port <= 65534:
            raise ValueError(f"port must be in 1..65534: {port!r}")
        control_port = port + 1 if control_port is None else control_port
        timeout_s = connect_window(self.config.connect_timeout if timeout is None else timeout)  # (inf: forever)
        self._last_target = (host, port, control_port, timeout_s)
        self._started = time.monotonic()
        if self.connection is not None and not self.connection.is_closed and not self._in_reconnect():
            raise ClientError(f"already connected (connection {self.connection.id}); close it first")
        config = self.config
        deadline = time.monotonic() + timeout_s
        udp = config.enable_ipv4 or config.enable_ipv6
        if config.enable_ipc and (is_local_host(host) or not udp):
            connection = yield from self._attempt(None, port, None, deadline, probe=udp)
            if connection is not None:
                return connection
        if not udp:
            raise ConnectTimeout(f"no IPC server for port {port} answered within {timeout_s:g} s")
        address = resolve_host(host, ipv4=self.config.enable_ipv4, ipv6=self.config.enable_ipv6)
        connection = yield from self._attempt(address, port, control_port, deadline, probe=False)
        assert connection is not None
        return connection

    def _connecting_ipc(self, timeout: float | None) -> ConnectSteps[C]:
        """``connect_ipc``'s steps."""
        self._check_open()
        if not self.config.enable_ipc:
            raise ClientError("enable_ipc is False in this client's config")
        timeout_s = connect_window(self.config.connect_timeout if timeout is None else timeout)
        self._last_target = (None, 0, None, timeout_s)
        self._started = time.monotonic()
        connection = yield from self._attempt(None, 0, None, time.monotonic() + timeout_s, probe=False)
        assert connection is not None
        return connection

    def _connecting_again(self) -> ConnectSteps[C]:
        """The steps of a connect to the last target."""
        assert self._last_target is not None
        host, port, control_port, timeout_s = self._last_target
        if host is None:
            return (yield from self._connecting_ipc(timeout_s))
        return (yield from self._connecting(host, port, control_port, timeout_s))

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this client was closed: make a new Client to connect again")

    def _check_reconnect(self) -> None:
        """``reconnect``'s precondition."""
        self._check_open()
        if self._last_target is None:
            raise ClientError("reconnect() before any connect()")

    def _attempt(
        self, host: str | None, port: int, control_port: int | None, deadline: float, *, probe: bool
    ) -> ConnectSteps[C | None]:
        """One connection attempt. ``probe``: an automatic-IPC try that gives up quietly (None) when
        no server answers within IPC_PROBE_S."""
        config = self.config
        context = self._acquire_context()
        where = f"IPC (port {port})" if host is None else f"{host_port(host, port)}"
        started = self._started
        try:
            if host is None:
                hs_sub, hs_pub = yield Registering(
                    context.async_add_subscription(ipc_channel(), HANDSHAKE_IPC_REPLY_STREAM + port),
                    context.async_add_exclusive_publication(ipc_channel(), HANDSHAKE_IPC_STREAM + port),
                )
            else:
                assert control_port is not None
                answers, hellos = handshake_channels(host, port, control_port)
                hs_sub, hs_pub = yield Registering(
                    context.async_add_subscription(answers, HANDSHAKE_STREAM),
                    context.async_add_exclusive_publication(hellos, HANDSHAKE_STREAM),
                )
        except BaseException:
            self._release_if_idle()
            raise
        backoff = _backoff()
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
                yield backoff.step(time.monotonic_ns(), nap=True)
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
                    yield backoff.step(time.monotonic_ns(), nap=True)
            failed = False
        finally:
            close_quietly(hs_pub, hs_sub)
            if failed:  # rejected or timed out: a client that never connects holds no driver
                self._release_if_idle()
        if host is not None and machine.remote_public_key is not None:
            self.store.pin(host, machine.remote_public_key)
        try:
            return (yield from self._open(result, host, control_port, port, deadline, where, machine.plaintext))
        except BaseException:
            self._release_if_idle()
            raise

    def _open(
        self,
        done: HandshakeCompleted,
        host: str | None,
        control_port: int | None,
        port: int,
        deadline: float,
        where: str,
        plaintext: bool,
    ) -> ConnectSteps[C]:
        config = self.config
        started = self._started
        context = self._acquire_context()
        (sub_channel, sub_stream), (pub_channel, pub_stream) = client_streams(config, done, host, port)
        subscription, publication = yield Registering(
            context.async_add_subscription(sub_channel, sub_stream),
            context.async_add_exclusive_publication(pub_channel, pub_stream),
        )
        backoff = _backoff()
        while not (subscription.image_count > 0 and publication.is_connected):
            shared_contexts.invoke(context)
            if time.monotonic() >= deadline:
                publication.close()
                subscription.close()
                raise ConnectTimeout(
                    f"the server at {where} accepted, but its connection streams did not come up within "
                    f"{time.monotonic() - started:.1f} s"
                )
            yield backoff.step(time.monotonic_ns(), nap=True)
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
            self._start_reconnect()
        return work

    def _quiet_ns(self, connection: C) -> int | None:
        """When the connection counts as quiet (``recovery.QUIET_PART``); None when that starts nothing."""
        if not self.config.reconnect or self._reconnecting() or self._closing or connection.is_closed:
            return None
        machine = connection.machine
        return None if self._last_target is None else quiet_deadline_ns(machine.last_received_ns, machine.expiry_ns)

    def next_deadline_ns(self, now_ns: int) -> int | None:
        quiet = None if self.connection is None else self._quiet_ns(self.connection)
        return earliest((quiet,), super().next_deadline_ns(now_ns))

    def _live_connections(self) -> list[C]:
        connection = self.connection
        return [] if connection is None else [connection]

    def _release_connection(self, connection: C) -> None:
        if self.connection is connection:
            self.connection = None
        self._close_streams_later(connection)

    # -- after a fault ------------------------------------------------------------------------------

    def _session(self) -> Delivery:
        if self._delivery is None:
            self._delivery = Delivery()
        return self._delivery

    def connection_ended(self, connection: C, event: Closed) -> None:
        super().connection_ended(connection, event)
        if event.expired and self.config.reconnect and not self._closing and self._last_target is not None:
            self._lost = connection  # lost, not closed: connect again (``recovery``)
            if not self._reconnecting():
                self._start_reconnect()
        elif event.expired or event.by_peer:
            # (The server's CLOSE came after its acknowledgement of all it took: what crossed it was dropped.)
            self._end_session(connection, "the server closed the connection" if event.by_peer else None)
        else:
            self._delivery = None  # closed here: what went before our CLOSE was delivered

    def _end_session(self, connection: C | None, why: str | None = None) -> None:
        """No connection will carry the session on: what it never delivered goes to ``on_error``."""
        delivery, self._delivery = self._delivery, None
        error = self._undelivered(why or "the connection to the server was lost", delivery)
        if error is not None:
            self.report_error(connection, error)

    def hold(self, connection: C, message: object) -> Hold:
        return Hold.RECONNECTING if connection is self._lost else Hold.CLOSED

    def _reconnect_ended(self) -> None:
        """The reconnect stopped: when no new connection came, what waited for one fails."""
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

    def _close_started(self) -> None:
        """The first step of ``close``: the connection closes (the server hears CLOSE at once)."""
        self._closing = True
        if self.connection is not None:
            self.connection.close_now("client closing")
