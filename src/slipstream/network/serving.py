"""What a server is whichever adapter runs it: binding its handshake channels, answering handshakes,
opening the streams of accepted clients, its connections and their buffered sessions, and the steps of
closing.

Per bound port, clients publish handshake packets to the server's port, and hear the answers by
dynamic MDC from its control port (a client behind NAT registers there from its own socket). An
accepted client gets, for its connection, a stream to the server's port (its own stream and session
ids) and a dynamic-MDC publication from a control port of its own; over IPC, streams with their own
ids. Each connection's lifecycle (streams opening, starting, up, lingering, its ids released, a lost
peer's buffered session) is the sans-I/O :class:`~.table.ConnectionTable`; this class keeps the
live objects by connection id and does the I/O the table's events ask for.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, TypeVar

from ..client.allocation import PortAllocator
from .buffered import BufferedSessions, Hold
from .config import ServerConfig
from .connected import ConnectionBase
from .delivery import DeliverySessions
from .errors import ServerError
from .events import (
    ClientAccepted,
    Closed,
    ConnectionReleased,
    ConnectionStarted,
    OpeningFailed,
    PortReassigned,
    Rejected,
    SessionEnded,
    StartTimedOut,
)
from .listening import AcceptedStreams, HandshakeChannel, HandshakeChannels, Pending, admission_check
from .rmi import ObjectTable
from .running import RunningEndpoint
from .session import PlainRecords, RecordLayer, Records
from .table import ConnectionState, ConnectionTable
from .transport import (
    BUSY_CADENCE_NS,
    HANDSHAKE_IPC_REPLY_STREAM,
    HANDSHAKE_IPC_STREAM,
    HANDSHAKE_STREAM,
    earliest,
    handshake_listen_channel,
    host_port,
    ipc_channel,
    listen_host,
    udp_channel,
)

__all__ = ["REBIND_MAX_DELAY_S", "SETTLE_STEP_S", "ServerCore"]

log = logging.getLogger("slipstream.network.server")

C = TypeVar("C", bound=ConnectionBase[Any])

HANDSHAKE_TERM_LENGTH = 1024 * 1024
"""The all-clients handshake channel is broadcast (MDC, max flow control): a generous term keeps a
client that is slow to poll from being lapped while many others handshake."""
STARTING_FACTOR = 3
"""An accepted client's streams may take this many handshake timeouts to come up (setting up a
publication and a subscription per client is the slow part when hundreds connect at once)."""
REBIND_MAX_DELAY_S = 5.0
"""The longest wait between two attempts to bind again after a lost driver."""
SETTLE_STEP_S = 0.005
"""How often ``close`` looks again at connections still coming up."""


class ServerCore(RunningEndpoint[C]):
    """A server without a way to wait: ``aio.Server`` and ``sync.Server`` add ``bind``, ``close`` and the
    retries after a lost driver, awaited or blocking."""

    _role = "server"

    def __init__(self, config: ServerConfig) -> None:
        if not isinstance(config, ServerConfig):
            raise TypeError(f"Server needs a ServerConfig, not {type(config).__name__}")
        super().__init__(config)
        self.config: ServerConfig = config
        self._links = HandshakeChannels(config, self.registrations, self.private_key)
        self._bindings: list[tuple[Any, ...]] = []
        self.sessions = self._links.sessions
        """Session ids of connections (both directions), the seed's range."""
        self.streams = self._links.streams
        sessions: BufferedSessions[object] | None = None
        if config.buffered_sessions:
            rules = () if config.buffered_rule is None else (config.buffered_rule,)
            timeout_ns = int(config.buffered_timeout * 1e9)
            sessions = BufferedSessions(timeout_ns=timeout_ns, capacity=config.buffered_capacity, rules=rules)
        starting_ns = int(STARTING_FACTOR * config.handshake_timeout * 1e9)
        self._table = ConnectionTable(allocations=self._links, starting_timeout_ns=starting_ns, sessions=sessions)
        """Each connection's lifecycle; what follows keeps only the live objects, by connection id."""
        self._pending = AcceptedStreams(config, self._table)
        self._connections: dict[int, C] = {}
        self._lost: dict[int, C] = {}
        self._deliveries = DeliverySessions()
        """Each client session's delivery (what it has not acknowledged yet), resumed when it returns."""
        """Lost connections whose buffered session waits for the peer (their on_disconnect is pending)."""
        self.rejected: list[Rejected] = []
        """Recent rejections (bounded), for operators and tests."""
        self.rmi = ObjectTable(self.rmi_registry, is_global=True)
        """Global remote objects every client reaches: ``server.rmi.save(obj) -> id``, ``save(obj, id)``,
        ``delete(obj_or_id)``; a client calls them through ``connection.rmi.get_global(Interface, id)``."""

    # -- public -----------------------------------------------------------------------------------

    @property
    def connections(self) -> list[C]:
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

    def _bind(self, port: int, control_port: int | None = None) -> None:
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
        self._acquire_context()
        if config.enable_ipv4 or config.enable_ipv6:
            host = listen_host(config.listen_address, ipv4=config.enable_ipv4, ipv6=config.enable_ipv6)
            first, count = config.connection_ports or (port + 2, config.max_clients)
            control = host_port(host, control_port)
            answers = udp_channel(control=control, control_mode="dynamic", term_length=HANDSHAKE_TERM_LENGTH)
            listen = handshake_listen_channel(host, port)
            ports = (first, min(count, 65536 - first))
            self._add_link(host, port, ports, (listen, HANDSHAKE_STREAM), (answers, HANDSHAKE_STREAM))
        if config.enable_ipc:
            self._bind_ipc(port)
        self._start_poller()

    def _bind_ipc_only(self) -> None:
        """Listen over IPC only (clients use ``connect_ipc``)."""
        if not self.config.enable_ipc:
            raise ServerError("enable_ipc is False in this server's config")
        self._bind_ipc(0)
        self._start_poller()

    def _bind_ipc(self, port: int) -> None:
        streams = (ipc_channel(), HANDSHAKE_IPC_STREAM + port), (ipc_channel(), HANDSHAKE_IPC_REPLY_STREAM + port)
        self._add_link(None, port, None, *streams)

    def _add_link(self, *binding: Any) -> None:
        """A handshake channel: ``(host, port, (first, count) of connection ports or None, subscription,
        publication)``, each stream a (channel, stream id); remembered, to bind again after a lost driver."""
        host, port, ports, subscription, publication = binding
        table = self._table  # its counts, not the machines': lingering connections do not count
        admission = admission_check(self.config, lambda: table.admitted, table.admitted_from)
        allocator = None if ports is None else PortAllocator(*ports)
        self._links.open(
            self._acquire_context(), admission, host=host, port=port, ports=allocator,
            subscription=subscription, publication=publication,
        )  # fmt: skip
        if binding not in self._bindings:
            self._bindings.append(binding)

    @property
    def is_bound(self) -> bool:
        """Listening now: bound, and not waiting for a lost media driver to come back."""
        return bool(self._links) and self._context is not None

    def _recover(self) -> None:
        """The driver was lost: streams coming up are given up, the channels are gone; bind them again
        on the next driver (``ServerConfig.rebind``), lost clients' sessions waiting meanwhile."""
        now_ns = time.monotonic_ns()
        for state in (ConnectionState.OPENING, ConnectionState.STARTING):
            for connection_id in self._table.ids(state):
                self._table.cancel(connection_id, now_ns)
        self._run_table()
        self._links.close()
        self._links.clear()
        if self.config.rebind and not self._closing:
            self._start_rebind()

    def _start_rebind(self) -> None:
        """Bind again on the next driver, trying until it works or the server closes (``_bind_again``)."""
        raise NotImplementedError

    def _bind_again(self) -> None:
        """One attempt to bind every channel again after a lost driver."""
        try:
            for binding in list(self._bindings):
                self._add_link(*binding)
        except BaseException:
            self._links.close()
            self._links.clear()
            self._release_context()
            raise

    # -- handshakes and the streams of accepted clients ---------------------------------------------

    def _handshake_cycle(self, link: HandshakeChannel, now_ns: int) -> int:
        machine = link.machine
        work = link.cycle(now_ns)
        for event in machine.take_events():
            if isinstance(event, ClientAccepted):
                if self._recording is not None:
                    self._recording.accepted(event.connection_id, event.address, event.port, event.tag)
                self._accept(link, event, now_ns)
            elif isinstance(event, Rejected):
                self.rejected.append(event)
                del self.rejected[:-100]
                if self._recording is not None:
                    self._recording.rejected(event.address, event.reason, event.tag)
                log.info("rejected %s: %s", event.address or "IPC", event.message)
        return work

    def _accept(self, link: HandshakeChannel, accepted: ClientAccepted, now_ns: int) -> None:
        """Ask the driver for the connection's two streams; ``_pending.poll`` takes the answers."""
        holder = self._deliveries.holder(accepted.resume)
        if holder is not None and (old := self._connections.get(holder)) is not None:
            old.lose("the client connected again")  # the same client session: its old connection is dead
        self._table.open(accepted, now_ns)
        self._pending.open(self._acquire_context(), link, accepted, now_ns)

    def _run_table(self) -> int:
        """Do what the connection table's events ask; the work done."""
        work = 0
        while events := self._table.take_events():
            work += len(events)
            for event in events:
                match event:
                    case PortReassigned(connection_id=connection_id, port=port):
                        log.info("control port %d unavailable (%s): trying %d", event.refused_port, event.reason, port)
                        if (context := self._context) is not None:
                            self._pending.reopen(context, connection_id, port, time.monotonic_ns())
                    case OpeningFailed(connection_id=connection_id, reason=reason):
                        log.warning("cannot open connection %d's streams: %s", connection_id, reason)
                    case StartTimedOut(connection_id=connection_id) | ConnectionReleased(connection_id=connection_id):
                        if isinstance(event, StartTimedOut):
                            log.info("connection %d: the client never came up", connection_id)
                        if (pending := self._pending.pop(connection_id, None)) is not None:
                            pending.discard()  # its streams, still asked for or coming up, are given up
                    case ConnectionStarted():
                        self._activate(event)
                    case SessionEnded():
                        self._session_ended(event)
        return work

    def _activate(self, event: ConnectionStarted) -> None:
        pending = self._pending.pop(event.connection_id, None)
        if pending is None:
            return
        connection = self._make_connection(pending)
        self._connections[connection.id] = connection
        previous = None if event.resumes is None else self._lost.pop(event.resumes, None)
        if previous is not None:  # the session resumes here: the lost connection's end is reported now
            log.info("buffered session resumed: %d queued messages delivered", len(event.queued))
            previous.hand_over(connection)
            ended = self._deliveries.end(previous.id)  # the key came back as a new process: not resumed
            if (error := self._undelivered(f"connection {previous.id}'s client restarted", ended)) is not None:
                self.report_error(previous, error)
            self._fire_disconnect(previous)
        connection.deliver(event.queued)  # what waited for this peer goes first, in order
        self._connection_up(connection)

    def _make_connection(self, pending: Pending) -> C:
        accepted = pending.accepted
        assert pending.streams is not None
        pending.link.machine.forget(accepted.pending_key)
        records: Records = PlainRecords()
        if not accepted.plaintext:
            records = RecordLayer(accepted.send_key, accepted.receive_key)
        return self._new_connection(
            records,
            int(self.config.connection_expiry * 1e9),
            *pending.streams,
            connection_id=accepted.connection_id,
            remote_address=accepted.address,
            remote_port=accepted.port,
            tag=accepted.tag,
            remote_public_key=accepted.remote_public_key,
            global_objects=self.rmi,
            delivery=self._deliveries.attach(accepted.connection_id, accepted.resume),
        )

    # -- buffered sessions --------------------------------------------------------------------------

    def _session_waits(self, connection: C, event: Closed) -> bool:
        waits = self._table.ended(connection.id, time.monotonic_ns(), lost=event.expired)
        if waits:
            self._lost[connection.id] = connection
        elif (later := self._connections.get(self._table.successor(connection.id) or 0)) is not None:
            connection.hand_over(later)  # its peer restarted and is up again there: what is sent goes there
        ended = self._deliveries.detach(connection.id, keep=waits)
        # A close from here delivers what went before it: nothing to report then. The client's CLOSE comes after
        # its acknowledgement of all it took: what crossed it on the way was dropped, and is reported.
        error = None
        if event.expired or event.by_peer:
            what = "was lost" if event.expired else "was closed by the client"
            error = self._undelivered(f"connection {connection.id} {what}", ended)
        if error is not None:
            self.report_error(connection, error)
        return waits

    def hold(self, connection: C, message: object) -> Hold:
        if self._lost.get(connection.id) is not connection:
            return Hold.CLOSED  # no session waits for it (or its id went to another connection)
        return self._table.hold(connection.id, message)

    def _session_ended(self, event: SessionEnded) -> None:
        connection = self._lost.pop(event.connection_id, None)
        delivery = self._deliveries.end(event.connection_id)
        if connection is None:
            return
        where = f"connection {connection.id}: the peer did not come back within {self.config.buffered_timeout:g} s"
        error = self._undelivered(where, delivery, event.undelivered)
        if error is not None:
            self.report_error(connection, error)
        self._fire_disconnect(connection)

    # -- the poller -------------------------------------------------------------------------------

    def _live_connections(self) -> list[C]:
        return list(self._connections.values())

    def next_deadline_ns(self, now_ns: int) -> int | None:
        """The connections' timers, the handshakes' (answers waiting for room: soon), streams coming
        up (soon: checked at the busy cadence, never by spinning, which would starve an embedded driver
        thread of the GIL it needs to set them up) and the table's (starts, releases, sessions)."""
        due = super().next_deadline_ns(now_ns)
        if self._pending:
            due = earliest((now_ns + BUSY_CADENCE_NS,), due)
        for link in self._links:
            due = earliest((now_ns + BUSY_CADENCE_NS if len(link.link) else link.deadline_ns,), due)
        return earliest((self._table.deadline_ns,), due)

    def _release_connection(self, connection: C) -> None:
        self._connections.pop(connection.id, None)
        self._close_streams_later(connection, functools.partial(self._streams_closed, connection.id))

    def _streams_closed(self, connection_id: int) -> None:
        self._table.streams_closed(connection_id, time.monotonic_ns())
        self.wake()  # the release delay runs from now: the poller must see the new deadline

    def _cycle(self, now_ns: int) -> int:
        # The connections first: what they received is answered before the handshakes' chores (a client
        # that came up in this cycle is polled from the next one).
        work = 0
        for connection in list(self._connections.values()):
            work += connection.poll(now_ns)
        if not self._closing:  # a client accepted while closing would miss the CLOSE
            for link in self._links:
                work += self._handshake_cycle(link, now_ns)
        if self._pending:
            work += self._pending.poll(now_ns)  # before the table: a client up at its starting deadline is up
        if (deadline := self._table.deadline_ns) is not None and now_ns >= deadline:
            self._table.handle_timer(now_ns)
        return work + self._run_table()

    # -- closing ------------------------------------------------------------------------------------

    def _close_started(self) -> None:
        """The first step of ``close``: no handshakes from now on; clients still opening hear nothing."""
        self._closing = True
        table = self._table
        for connection_id in table.ids(ConnectionState.OPENING):  # the client hears nothing: retries or gives up
            table.cancel(connection_id, time.monotonic_ns())
        self._run_table()

    def _close_connections(self) -> None:
        """After the starting connections settled: every connection hears CLOSE, those that came up
        meanwhile too."""
        table = self._table
        self._pending.poll(time.monotonic_ns())  # a client that is up must hear CLOSE too
        self._run_table()
        for connection_id, pending in list(self._pending.items()):
            if pending.streams is not None and pending.streams[0].is_connected:
                # The client may be up though our side has not seen its image yet: tell it too.
                del self._pending[connection_id]
                connection = self._make_connection(pending)
                connection.close_now("server closing", notify=False)
                table.ended(connection_id, time.monotonic_ns(), lost=False)
                self._close_streams_later(connection, functools.partial(self._streams_closed, connection_id))
        for connection in list(self._connections.values()):
            connection.close_now("server closing")

    def _close_table(self) -> None:
        """Once the connections closed: waiting sessions end (what they held is reported), every id goes back."""
        self._table.close(time.monotonic_ns())
        self._run_table()

    def _half_up(self) -> bool:
        """Whether a starting connection is half up (``close`` waits for it: see the adapters' ``close``)."""
        return self._pending.half_up()
