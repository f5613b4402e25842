"""``Connection`` and the listener machinery shared by servers and clients (the asyncio adapter).

Plain listeners run inline on the receive path (the fastest way: no task per message); coroutine
listeners are scheduled as tasks so they never block it. Whatever a listener raises goes to the
endpoint's ``on_error`` listeners and never kills the connection or the endpoint. A message nobody
listens for is reported to ``on_error`` (MessageDispatchError), never dropped silently.

Each connection also carries ``rmi`` (remote objects: :class:`~.rmi.RmiSession`), and streams
large messages and files (``await connection.send(Path(...))``): progress is in ``transfers``, a
stream that fails is reported to ``on_error`` on both sides as a StreamingError.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ...client import (
    ADMIN_ACTION,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    ExclusivePublication,
    FragmentAssembler,
    Header,
    Subscription,
)
from ..connection import ConnectionMachine
from ..errors import (
    ConnectionClosedError,
    MessageDecodeError,
    PingTimeout,
    SendSyncTimeout,
    SendTimeout,
    UndeliveredError,
)
from ..events import (
    Closed,
    MessageDecodeFailed,
    MessageReceived,
    PingAcknowledged,
    PingTimedOut,
    RmiFrameReceived,
    SyncCompleted,
    SyncTimedOut,
)
from ..frames import FrameKind
from ..rmi import FILE_STREAM_MARK, RmiEndpoint
from ..streaming import (
    StreamFailed,
    StreamingError,
    StreamProgressed,
    StreamSent,
    StreamStarted,
)
from .rmi import MachineFiles, RmiSession
from .transport import BUSY_CADENCE_NS

__all__ = ["Connection", "ConnectionListener", "ErrorListener", "Listeners", "MessageListener", "Ping", "Transfer"]

log = logging.getLogger("slipstream.network")

F = TypeVar("F", bound=Callable[..., Any])
ConnectionListener = Callable[["Connection"], "Awaitable[None] | None"]
MessageListener = Callable[["Connection", Any], "Awaitable[None] | None"]
ErrorListener = Callable[["Connection | None", BaseException], "Awaitable[None] | None"]

BACKLOG_LIMIT = 256
"""Sealed records waiting for the transport beyond which ``send`` waits and ``send_nowait`` refuses."""


class EndpointHooks(Protocol):
    """What a connection asks of the server or client that owns it (``Endpoint``), named here so the
    connection module does not import the endpoint module that imports it."""

    def _kick(self) -> None: ...

    def _dispatch_message(
        self, connection: Connection, message: object, sync_id: int, stream_id: int = 0
    ) -> None: ...

    def _report_error(self, connection: Connection | None, error: BaseException) -> None: ...

    def _send_now(self, publication: ExclusivePublication) -> None: ...

    def _connection_closed(self, connection: Connection, event: Closed) -> None: ...

    def _record_dropped(self, connection: Connection) -> None: ...

    def _round_trip(self, connection: Connection, round_trip_ns: int) -> None: ...

    def _buffer(self, connection: Connection, message: object) -> str | None: ...


STREAM_BACKLOG = 4
"""Records waiting for the transport below which an outgoing stream reads its next chunks: what a
large message or file costs in memory beyond the transport's own buffer."""
_SEAL_FLUSH = 8
"""Records sealed within one loop step after which ``send`` offers them at once."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """A large message or file on its way: bytes so far of ``total`` (``name``: a file's name)."""

    stream_id: int
    incoming: bool
    done: int
    total: int
    name: str = ""


@dataclass(frozen=True, slots=True)
class Ping:
    """A ping's result, as the seed's ``Ping``: seconds. ``outbound``/``inbound`` use each side's
    wall clock, so they include the difference between the two clocks."""

    round_trip: float
    outbound: float
    inbound: float


class Listeners:
    """Listener lists with decorators; message listeners by type, looked up along the MRO (most
    specific type first) and cached."""

    def __init__(self) -> None:
        self.init: list[ConnectionListener] = []
        self.connect: list[ConnectionListener] = []
        self.disconnect: list[ConnectionListener] = []
        self.error: list[ErrorListener] = []
        self._messages: dict[type, list[MessageListener]] = {}
        self._cache: dict[type, tuple[MessageListener, ...]] = {}

    def add_message(self, kind: type, listener: MessageListener) -> None:
        """Call ``listener`` for messages of ``kind`` and its subclasses."""
        if not isinstance(kind, type):
            raise TypeError(f"on_message needs a type: {kind!r}")
        self._messages.setdefault(kind, []).append(listener)
        self._cache.clear()

    def for_type(self, kind: type) -> tuple[MessageListener, ...]:
        """The listeners for a message of type ``kind``, most specific type first."""
        found = self._cache.get(kind)
        if found is None:
            found = tuple(listener for base in kind.__mro__ for listener in self._messages.get(base, ()))
            self._cache[kind] = found
        return found

    def for_type_with(self, kind: type, outer: Listeners) -> tuple[MessageListener, ...]:
        """``for_type`` over this set (a connection's) and ``outer`` (its server's or client's) together:
        most specific type first across both; for one type, this set's listeners before ``outer``'s."""
        if not self._messages:
            return outer.for_type(kind)
        own, theirs = self._messages, outer._messages
        return tuple(listener for base in kind.__mro__ for listener in (*own.get(base, ()), *theirs.get(base, ())))

    def clear(self) -> None:
        """Forget every listener."""
        for items in (self.init, self.connect, self.disconnect, self.error):
            items.clear()
        self._messages.clear()
        self._cache.clear()


class Connection:
    """One connection between a server and a client; the same ``id`` on both sides.

    Made by servers and clients, never directly."""

    def __init__(
        self,
        *,
        endpoint: EndpointHooks,
        connection_id: int,
        machine: ConnectionMachine,
        publication: ExclusivePublication,
        subscription: Subscription,
        remote_address: str | None,
        remote_port: int | None,
        tag: str,
        remote_public_key: bytes,
        send_timeout: float,
        rmi: RmiEndpoint,
        rmi_timeout: float = 3.0,
    ) -> None:
        self.id = connection_id
        """The server's session id for this connection (the same on both sides)."""
        self.remote_address = remote_address
        """The peer's IP address (None for IPC)."""
        self.remote_port = remote_port
        """The peer's source port as the server sees it (None for IPC and on clients' side)."""
        self.tag = tag
        self.remote_public_key = remote_public_key
        """The peer's long-term Noise public key (32 bytes)."""
        self.send_timeout = send_timeout
        self.last_refusal: str | None = None
        """Why the last ``send_nowait`` returned False."""
        self.back_pressure_events = 0
        """Times the transport refused a record for now (it waited in the backlog)."""
        self._endpoint = endpoint
        self._machine = machine
        self._publication = publication
        self._subscription = subscription
        self._assembler = FragmentAssembler(self._on_fragment)
        self._listeners = Listeners()
        self._backlog: deque[bytes | bytearray] = deque()
        self._room = asyncio.Event()
        self._room.set()
        self._flush_scheduled = False
        self._udp = remote_address is not None
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._pings: dict[int, asyncio.Future[Ping]] = {}
        self._closed_event = asyncio.Event()
        self._disconnected = False
        self._loop = asyncio.get_running_loop()
        self._now_ns = time.monotonic_ns()
        self.transfers: dict[tuple[bool, int], Transfer] = {}
        """Large messages and files in flight, by (incoming, stream id): bytes so far and total."""
        self.rmi = RmiSession(
            rmi,
            self._rmi_transmit,
            caller=self,
            on_error=lambda error: endpoint._report_error(self, error),
            on_object=lambda value: endpoint._dispatch_message(self, value, 0),
            default_timeout=rmi_timeout,
            files=MachineFiles(machine, self._after_append),  # Path arguments and results
        )
        """Remote objects over this connection: ``get(Interface, id)``, ``get_global(Interface, id)``,
        ``await create(Interface, *args)``, ``save(obj[, id])``, ``delete(id)``."""
        self._objects_travel = bool(rmi.registry.interfaces)
        self._successor: Connection | None = None
        """The connection that took over this one's buffered session (sends go there)."""
        self._track_position = False
        """Set by the endpoint when it captures messages: then ``_session_id`` and ``_position`` follow
        each record received (reading them from the header costs, so only then)."""
        self._session_id = 0
        self._position = 0

    # -- public -----------------------------------------------------------------------------------

    @property
    def is_ipc(self) -> bool:
        """True for a shared-memory connection."""
        return self.remote_address is None

    @property
    def is_closed(self) -> bool:
        """True once the connection ended (closed here, by the peer, or expired)."""
        return self._machine.closed

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages and records both ways, and records dropped (tampered, replayed...)."""
        records = self._machine.records
        machine = self._machine.stats
        return {
            "messages_sent": machine.messages_sent,
            "messages_received": machine.messages_received,
            "records_sent": machine.records_sent,
            "records_received": machine.records_received,
            "bytes_sent": machine.bytes_sent,
            "bytes_received": machine.bytes_received,
            "back_pressure_events": self.back_pressure_events,
            "records_dropped": machine.records_dropped,
            "decode_errors": machine.decode_errors,
            "rejected_malformed": int(getattr(records, "rejected_malformed", 0)),
            "rejected_tampered": int(getattr(records, "rejected_tampered", 0)),
            "rejected_replayed": int(getattr(records, "rejected_replayed", 0)),
        }

    def on_message(self, kind: type) -> Callable[[F], F]:
        """Decorator: ``listener(connection, message)`` for messages of ``kind`` on this connection."""

        def register(listener: F) -> F:
            self._listeners.add_message(kind, listener)
            return listener

        return register

    def on_disconnect(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` when this connection ends."""
        self._listeners.disconnect.append(listener)
        return listener

    def send_nowait(self, message: object) -> bool:
        """Hand ``message`` to the connection without waiting; False (and ``last_refusal``) when it
        is closed or back-pressured, or queued for a buffered session's return. An unregistered type
        raises UnregisteredTypeError."""
        target = self._current()
        if target._machine.closed:
            verdict = target._endpoint._buffer(target, message)
            self.last_refusal = {
                "queued": "queued until the peer reconnects (buffered session)",
                "full": "the buffered session's queue is full",
            }.get(verdict or "", "closed")
            return False
        if len(target._backlog) >= BACKLOG_LIMIT:
            self.last_refusal = "back-pressured"
            return False
        target._send(message)
        return True

    async def send(self, message: object) -> None:
        """Send ``message``, waiting out back-pressure up to ``send_timeout``; raises
        ConnectionClosedError, SendTimeout, UnregisteredTypeError. With a buffered session waiting for
        the peer, the message is queued for its return instead (UndeliveredError if the queue is full)."""
        target = self._current()
        if target._machine.closed:
            verdict = target._endpoint._buffer(target, message)
            if verdict == "queued":
                return
            if verdict == "full":
                raise UndeliveredError(f"connection {target.id}: the buffered session's queue is full", (message,))
        if len(target._backlog) >= BACKLOG_LIMIT:
            await target._wait_room()
        target._send(message)

    def _current(self) -> Connection:
        """This connection, or the one that took over its buffered session."""
        connection = self
        while connection._successor is not None:
            connection = connection._successor
        return connection

    def _send(self, message: object) -> None:
        if self._objects_travel and self.rmi.endpoint.is_remote_object(message):
            self.rmi.send_object(message)  # a proxy goes home as its object; an implementation as a proxy
            return
        self._machine.send(message)
        self._after_append()

    async def send_sync(self, message: object, timeout: float | None = None) -> None:
        """Send ``message`` and wait until the remote's listeners have handled it (a buffered
        session's successor carries it; a closed connection raises ConnectionClosedError)."""
        if self._successor is not None:
            return await self._current().send_sync(message, timeout)
        if len(self._backlog) >= BACKLOG_LIMIT:
            await self._wait_room()
        timeout_s = self.send_timeout if timeout is None else timeout
        sync_id = self._machine.send_sync(message, time.monotonic_ns(), int(timeout_s * 1e9))
        future: asyncio.Future[None] = self._loop.create_future()
        self._syncs[sync_id] = future
        self._after_append()
        await future

    async def ping(self, timeout: float | None = None) -> Ping:
        """Round trip to the peer and back (raises PingTimeout, ConnectionClosedError)."""
        if self._successor is not None:
            return await self._current().ping(timeout)
        timeout_s = self.send_timeout if timeout is None else timeout
        ping_id = self._machine.ping(time.monotonic_ns(), int(timeout_s * 1e9))
        future: asyncio.Future[Ping] = self._loop.create_future()
        self._pings[ping_id] = future
        self._after_append()
        return await future

    async def close(self) -> None:
        """Close gracefully: the peer hears CLOSE at once; ``on_disconnect`` runs on both sides."""
        if not self._machine.closed:
            self._machine.close("closed by the application")
            self._flush()
            self._process_events()
        await self._closed_event.wait()

    async def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until the connection has ended (True) or ``timeout`` seconds passed (False)."""
        try:
            await asyncio.wait_for(self._closed_event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def __repr__(self) -> str:
        where = "IPC" if self.is_ipc else f"{self.remote_address}:{self.remote_port}"
        return f"<Connection {self.id} {where}{' closed' if self.is_closed else ''}>"

    # -- sending internals ------------------------------------------------------------------------

    def _rmi_transmit(self, frames: list[tuple[int, int, bytes]]) -> None:
        machine = self._machine
        if machine.closed:
            return  # the RMI session fails its calls itself when the connection closes
        for kind, request_id, payload in frames:
            machine.send_frame(kind, request_id, payload)
        self._after_append()

    async def _wait_room(self) -> None:
        deadline = self._loop.time() + self.send_timeout
        while len(self._backlog) >= BACKLOG_LIMIT:
            if self._machine.closed:
                raise ConnectionClosedError("the connection is closed")
            self._room.clear()
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise SendTimeout(f"connection {self.id}: the transport took nothing for {self.send_timeout:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), remaining)

    def _after_append(self) -> None:
        self._endpoint._kick()
        if not self._flush_scheduled:
            # The first message of a loop turn leaves at once (a lone request or reply does not wait a
            # turn of the loop); the ones that follow in the same turn share records and go with the
            # scheduled flush.
            self._flush_scheduled = True
            self._flush_out()
            self._loop.call_soon(self._scheduled_flush)
        elif self._machine.sealed_count >= _SEAL_FLUSH:
            self._flush()  # the driver sends these with the next flush_out or cycle, in larger batches

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self._flush_out()

    def _flush_out(self) -> None:
        """Flush what the application sent, and over UDP have an invoker-mode driver send it at once:
        its next duty cycle comes a turn of the event loop later (about 30 us per message here)."""
        if self._flush() and self._udp:
            self._endpoint._send_now(self._publication)

    def _flush(self) -> int:
        """Offer sealed records in order; what the transport refuses waits in the backlog."""
        machine = self._machine
        backlog = self._backlog
        if machine.has_pending:
            # Streams are read as the transport drains: at most a few chunks wait beyond its buffer.
            room = max(0, STREAM_BACKLOG - len(backlog)) * machine.max_payload
            backlog.extend(machine.messages_to_send(time.monotonic_ns(), room))
        offered = 0
        publication = self._publication
        while backlog:
            result = publication.offer(backlog[0])
            if result >= 0:
                backlog.popleft()
                offered += 1
                continue
            if result == ADMIN_ACTION:
                continue
            if result in (CLOSED, MAX_POSITION_EXCEEDED):
                backlog.clear()
            else:
                self.back_pressure_events += 1
            break
        if len(backlog) < BACKLOG_LIMIT and not self._room.is_set():
            self._room.set()
        return offered

    # -- receiving internals ----------------------------------------------------------------------

    def _on_fragment(self, payload: memoryview, header: Header) -> None:
        if self._track_position:
            self._session_id = header.session_id
            self._position = header.position
        if not self._machine.receive(payload, self._now_ns):
            self._endpoint._record_dropped(self)
        self._process_events()

    def _deadline_ns(self, now_ns: int) -> int | None:
        """When ``_poll`` is next due if nothing arrives: the machine's timers, or soon while output
        waits (back-pressure clears without waking anyone)."""
        if self._backlog or self._machine.has_pending:
            return now_ns + BUSY_CADENCE_NS
        return self._machine.deadline_ns

    def _poll(self, now_ns: int) -> int:
        """One duty cycle: receive, run timers, flush. Returns the work done; records that only kept the
        connection alive do not count (an idle pair's poller would otherwise spin up for each)."""
        self._now_ns = now_ns
        machine = self._machine
        liveness = machine.liveness_records
        work = 0
        if not machine.closed:
            work = self._subscription.poll(self._assembler, 64)
            if not work and not self._subscription.is_connected:
                # The peer's publication is gone (closed, or silent past the image liveness): no CLOSE
                # is coming (a server closed while our streams came up never sent one).
                machine.lost("the peer's stream ended")
                self._process_events()
                return 1
        deadline = machine.deadline_ns
        if deadline is not None and now_ns >= deadline:
            machine.handle_timer(now_ns)
            self._process_events()
        if self._backlog or machine.has_pending:
            work += self._flush()
        if machine.liveness_records != liveness:
            return max(0, work - (machine.liveness_records - liveness))
        return work

    def _process_events(self) -> None:
        endpoint = self._endpoint
        for event in self._machine.take_events():
            if isinstance(event, MessageReceived):
                if not (event.stream_id and self.rmi.file_arrived(event.stream_id, event.message)):
                    endpoint._dispatch_message(self, event.message, event.sync_id, event.stream_id)
            elif isinstance(event, RmiFrameReceived):
                self.rmi.receive(event.kind, event.request_id, event.payload)
            elif isinstance(event, (StreamStarted, StreamProgressed, StreamSent, StreamFailed)):
                self._on_stream_event(event)
            elif isinstance(event, SyncCompleted):
                future = self._syncs.pop(event.sync_id, None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif isinstance(event, PingAcknowledged):
                ping = self._pings.pop(event.ping_id, None)
                if ping is not None and not ping.done():
                    ping.set_result(Ping(event.round_trip_ns / 1e9, event.outbound_ns / 1e9, event.inbound_ns / 1e9))
                endpoint._round_trip(self, event.round_trip_ns)
            elif isinstance(event, SyncTimedOut):
                future = self._syncs.pop(event.sync_id, None)
                if future is not None and not future.done():
                    future.set_exception(SendSyncTimeout(f"connection {self.id}: no acknowledgement in time"))
            elif isinstance(event, PingTimedOut):
                ping = self._pings.pop(event.ping_id, None)
                if ping is not None and not ping.done():
                    ping.set_exception(PingTimeout(f"connection {self.id}: no pong in time"))
            elif isinstance(event, MessageDecodeFailed):
                endpoint._report_error(self, MessageDecodeError(f"connection {self.id}: {event.reason}"))
            elif isinstance(event, Closed):
                self._flush()
                self.rmi.close(event.reason or "the connection closed")
                endpoint._connection_closed(self, event)

    def _on_stream_event(self, event: StreamStarted | StreamProgressed | StreamSent | StreamFailed) -> None:
        transfers = self.transfers
        if isinstance(event, StreamStarted):
            transfers[(True, event.stream_id)] = Transfer(event.stream_id, True, 0, event.total, event.name)
            if event.is_file and event.kind == FrameKind.MESSAGE and event.request_id == FILE_STREAM_MARK:
                self.rmi.file_started(event.stream_id)  # a Path argument or result: RMI's, not a message
        elif isinstance(event, StreamProgressed):
            key = (event.incoming, event.stream_id)
            name = transfers[key].name if key in transfers else ""
            if event.done < event.total:
                transfers[key] = Transfer(event.stream_id, event.incoming, event.done, event.total, name)
            else:
                transfers.pop(key, None)  # all bytes in (incoming: delivered with the message)
        elif isinstance(event, StreamSent):
            transfers.pop((False, event.stream_id), None)
        else:
            transfers.pop((event.incoming, event.stream_id), None)
            side = "incoming" if event.incoming else "outgoing"
            why = f"({event.failure.name.lower()}): {event.detail}"
            if event.incoming:
                self.rmi.file_failed(event.stream_id, why)
            error = StreamingError(f"connection {self.id}: {side} stream {event.stream_id} failed {why}")
            self._endpoint._report_error(self, error)

    def _fail_waiters(self) -> None:
        error = ConnectionClosedError(f"connection {self.id} is closed")
        for futures in (self._syncs, self._pings):
            for future in futures.values():
                if not future.done():
                    future.set_exception(error)
            futures.clear()
        self._room.set()


def is_coroutine_result(result: object) -> bool:
    """Did a listener return something to await (an ``async def`` listener)?"""
    return inspect.isawaitable(result)
