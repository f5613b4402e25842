"""What a connection is whichever adapter drives it: its machine over a publication and a subscription,
the events it turns into listener calls and waiter results, and the small surface its owner drives.

``aio.Connection`` and ``sync.Connection`` are this class plus how they wait: an asyncio future or a
``concurrent.futures.Future``, an ``asyncio.Event`` or a ``threading.Event`` (both offer what
:class:`Waiter` and :class:`Flag` name), and when what the application sent leaves (``_after_append``).
Plain listeners run inline on the receive path (no task per message). Whatever a listener raises goes to
the endpoint's ``on_error`` listeners and never kills the connection or the endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, Self, TypeVar

from ..client import ExclusivePublication, Header, Subscription
from .buffered import Hold
from .connection import ConnectionMachine
from .endpoint import ConnectionOwner
from .errors import ConnectionClosedError, MessageDecodeError, PingTimeout, SendTimeout, UndeliveredError
from .events import (
    Closed,
    MessageDecodeFailed,
    MessageReceived,
    PingAcknowledged,
    PingTimedOut,
    RmiCallCompleted,
    RmiCallFailed,
    RmiObjectReceived,
    RmiOnewayFailed,
    RmiRequestReceived,
    SyncCompleted,
    SyncFailed,
    SyncTimedOut,
)
from .hooks import ConnectionHooks
from .limits import Workload
from .listeners import Listeners
from .requests import sync_error
from .results import Ping, Transfers, connection_stats
from .streamfiles import WRITE_BACKLOG_PAUSE
from .streaming import StreamFailed, StreamProgressed, StreamSent, StreamStarted
from .transport import BUSY_CADENCE_NS, Link

__all__ = ["BACKLOG_LIMIT", "DRIVER_LOST", "ConnectionBase", "Flag", "RmiEvent", "RmiHandler", "Waiter"]

F = TypeVar("F", bound=Callable[..., Any])
T_contra = TypeVar("T_contra", contravariant=True)

BACKLOG_LIMIT = 256
"""Sealed records waiting for the transport beyond which ``send`` waits and ``send_nowait`` refuses."""
STREAM_BACKLOG = 4
"""Records waiting for the transport below which an outgoing stream reads its next chunks: what a
large message or file costs in memory beyond the transport's own buffer."""
DRIVER_LOST = "driver lost"
"""Why a connection ended when its media driver went away (``Closed.reason``, ``last_refusal``)."""
_RMI_EVENTS = (RmiRequestReceived, RmiCallCompleted, RmiCallFailed, RmiObjectReceived, RmiOnewayFailed)
RmiEvent = RmiCallCompleted | RmiCallFailed | RmiObjectReceived | RmiOnewayFailed | RmiRequestReceived


class Waiter(Protocol[T_contra]):
    """A result one caller waits for: ``asyncio.Future`` and ``concurrent.futures.Future`` both are one."""

    def done(self) -> bool: ...
    def set_result(self, result: T_contra, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


class Flag(Protocol):
    """A condition waiters wait for: ``asyncio.Event`` and ``threading.Event`` both are one."""

    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...


class RmiHandler(Protocol):
    """An adapter's remote-object session, as the connection uses it."""

    @property
    def work(self) -> Workload: ...
    def handle(self, event: RmiEvent) -> None: ...
    def close(self) -> None: ...


T = TypeVar("T", bound=RmiHandler)


class ConnectionBase(ConnectionHooks, Generic[T]):
    """One connection between a server and a client (the same ``id`` on both sides), without the
    adapter's way of waiting. ``T``: the adapter's remote-object session type (``rmi``)."""

    rmi: T
    """Remote objects over this connection: ``get(Interface, id)``, ``get_global(Interface, id)``,
    ``create(Interface, *args)``, ``save(obj[, id])``, ``delete(id)``."""

    def __init__(
        self,
        *,
        owner: ConnectionOwner[Any],
        connection_id: int,
        machine: ConnectionMachine,
        publication: ExclusivePublication,
        subscription: Subscription,
        remote_address: str | None,
        remote_port: int | None,
        tag: str,
        remote_public_key: bytes,
        send_timeout: float,
        rmi_timeout: float = 3.0,
        track_position: bool = False,
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
        self.listeners = Listeners()
        """This connection's own listeners (``on_message``, ``on_disconnect``)."""
        self.transfers = Transfers()
        """Large messages and files in flight, by (incoming, stream id): bytes so far and total."""
        self._owner = owner
        self._hooked = type(self).dispatch is not ConnectionHooks.dispatch  # (else: straight to the listeners)
        self._machine = machine
        self._link = Link(publication, subscription, self._on_fragment, poll_limit=64)
        self._room = self._flag()
        self._room.set()
        self._udp = remote_address is not None
        self._syncs: dict[int, Waiter[None]] = {}
        self._pings: dict[int, Waiter[Ping]] = {}
        self._closed_event = self._flag()
        self._ended = False
        self._now_ns = time.monotonic_ns()
        self._successor: Self | None = None
        """The connection that took over this one's buffered session (sends go there)."""
        self._end_reason = ""
        self._handed_over = self._flag()
        """Set when a successor takes over (or no successor will come): sends that wait for one go on."""
        self._track_position = track_position
        """Follow the session id and position of each record received (for captured messages)."""
        self._session_id = 0
        self._position = 0
        self.rmi = self._rmi_session(rmi_timeout)
        self._work = self.rmi.work  # async calls and listener tasks against max_pending_calls (..limits)

    # -- what an adapter gives ----------------------------------------------------------------------

    def _flag(self) -> Flag:
        raise NotImplementedError

    def _rmi_kind(self) -> Callable[..., T]:
        """The adapter's remote-object session class."""
        raise NotImplementedError

    def _rmi_options(self) -> dict[str, Any]:
        """What the adapter's session takes beyond the common arguments."""
        return {}

    def _rmi_session(self, rmi_timeout: float) -> T:
        return self._rmi_kind()(
            self._machine,
            self._after_append,
            caller=self,
            on_error=lambda error: self._owner.report_error(self, error),
            on_object=self.received,
            default_timeout=rmi_timeout,
            **self._rmi_options(),
        )

    def _after_append(self) -> None:
        """The application appended records: have them leave (now, or with the adapter's next step)."""
        raise NotImplementedError

    # -- public -----------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """True once the connection ended (closed here, by the peer, or expired)."""
        return self._machine.closed

    @property
    def machine(self) -> ConnectionMachine:
        """The sans-I/O connection machine this connection drives."""
        return self._machine

    @property
    def publication(self) -> ExclusivePublication:
        """The transport stream this side sends on."""
        return self._link.publication

    @property
    def subscription(self) -> Subscription:
        """The transport stream this side receives from."""
        return self._link.subscription

    @property
    def received_position(self) -> tuple[int, int]:
        """(session id, position) of the last record received (followed only while messages are captured)."""
        return self._session_id, self._position

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages and records both ways, and records dropped (tampered, replayed...)."""
        return connection_stats(self._machine.stats, self._machine.records, self.back_pressure_events)

    def on_message(self, kind: type) -> Callable[[F], F]:
        """Decorator: ``listener(connection, message)`` for messages of ``kind`` on this connection."""

        def register(listener: F) -> F:
            self.listeners.add_message(kind, listener)
            return listener

        return register

    def on_disconnect(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` when this connection ends."""
        self.listeners.disconnect.append(listener)
        return listener

    def send_nowait(self, message: object) -> bool:
        """Hand ``message`` to the connection without waiting; False (and ``last_refusal``) when it
        is closed or back-pressured, or queued for a buffered session's return. An unregistered type
        raises UnregisteredTypeError."""
        if self._successor is not None:  # a buffered session resumed on another connection
            sent = self._successor.send_nowait(message)
            self.last_refusal = self._successor.last_refusal
            return sent
        if self._machine.closed:
            verdict = self._owner.hold(self, message)
            lost = self._end_reason == DRIVER_LOST and verdict is not Hold.QUEUED
            self.last_refusal = DRIVER_LOST if lost else verdict.value
            return False
        if self._full():
            self.last_refusal = "back-pressured"
            return False
        self._send(message)
        return True

    def __repr__(self) -> str:
        where = "IPC" if self.is_ipc else f"{self.remote_address}:{self.remote_port}"
        return f"<Connection {self.id} {where}{' closed' if self.is_closed else ''}>"

    # -- for the owner ----------------------------------------------------------------------------

    def poll(self, now_ns: int, *, timers: bool = True) -> int:
        """One duty cycle: receive, run timers, flush. Returns the work done; records that only kept the
        connection alive do not count (an idle pair's poller would otherwise spin up for each). Without
        ``timers`` (a poller spinning between whole cycles, or one that saw a frame arrive) the timers and
        the check for the peer's stream gone wait for the next whole cycle, microseconds to a millisecond
        later: what is left is what a reply waits for."""
        self._now_ns = now_ns
        machine = self._machine
        liveness = machine.liveness_records
        work = 0
        behind = (streams := machine.streams) is not None and streams.write_backlog > WRITE_BACKLOG_PAUSE
        if self._work.holding:
            self._dispatch_held()  # (what finished made room for held messages and calls)
        paused = behind or self._work.holding or self._reading_paused()
        if not machine.closed:
            # Paused: the disk behind, or the application; the peer waits, held back by the transport's flow
            # control, and is not silent for that: only its stream going away ends the connection then.
            work = 0 if paused else self._link.poll()
            if timers and not work and not self._link.subscription.is_connected:
                # The peer's publication is gone (closed, or silent past the image liveness): no CLOSE
                # is coming (a server closed while our streams came up never sent one).
                machine.lost("the peer's stream ended")
                self._process_events()
                return 1
            if paused:
                machine.last_received_ns = now_ns
        if timers and (deadline := machine.deadline_ns) is not None and now_ns >= deadline:
            machine.handle_timer(now_ns)
            self._process_events()
        if self._link.outbox or machine.has_pending or not self._room.is_set():
            work += self.flush()  # (acknowledgements received may have made room too)
        if machine.liveness_records != liveness:
            return max(0, work - (machine.liveness_records - liveness))
        return work

    def _reading_paused(self) -> bool:
        """Whether the application holds reading back (an adapter's own inbox is full)."""
        return False

    def next_deadline_ns(self, now_ns: int) -> int | None:
        """When :meth:`poll` is next due if nothing arrives: the machine's timers, or soon while output
        waits (back-pressure clears without waking anyone)."""
        if self._link.outbox or self._machine.has_pending:
            return now_ns + BUSY_CADENCE_NS
        return self._machine.deadline_ns

    def flush(self) -> int:
        """Offer sealed records in order; what the transport refuses waits in the outbox."""
        machine = self._machine
        link = self._link
        packets: list[bytes | bytearray] = []
        if machine.has_pending:
            # Streams are read as the transport drains: at most a few chunks wait beyond its buffer.
            room = max(0, STREAM_BACKLOG - len(link.outbox)) * machine.max_payload
            packets = machine.messages_to_send(time.monotonic_ns(), room)
        offered = link.send(packets)
        if link.back_pressured:
            self.back_pressure_events += 1
        if not self._room.is_set() and not self._full():
            self._room.set()
        return offered

    def close_now(self, reason: str, *, notify: bool = True) -> None:
        """Close at once: CLOSE is handed to the transport now. Without ``notify`` (a connection the
        application never saw), nothing is reported to the owner or the listeners."""
        if self._machine.closed:
            return
        self._machine.close(reason)
        self.flush()
        if notify:
            self._process_events()
        else:
            self._ended = True
            self._machine.take_events()

    def hand_over(self, successor: Self | None) -> None:
        """A buffered session resumed on ``successor`` (or a client connected again): sends through this
        connection go there. None: no successor will come (sends that waited for one fail)."""
        self._successor = successor
        self._handed_over.set()

    def _no_successor(self, seconds: float) -> Exception:
        """Why no connection took over within ``seconds`` (after waiting for ``_handed_over``)."""
        if self._handed_over.is_set():
            return ConnectionClosedError(f"connection {self.id} is closed and no new connection will come")
        return SendTimeout(f"connection {self.id}: no new connection within {seconds:g} s")

    def lose(self, reason: str) -> None:
        """The transport under this connection is gone (its media driver was lost): it ends now, as a
        lost peer does (``Closed(expired=True)``), sending nothing."""
        self._machine.lost(reason)
        self._process_events()

    def _dispatch_held(self) -> None:
        """Dispatch held messages and calls, in order, while there is room (reading resumes once none wait)."""
        while (event := self._work.release()) is not None:
            self._on_event(event)

    def hold_messages(self) -> None:
        """Keep what arrives (messages, remote calls) undispatched until :meth:`release_messages`."""
        self._work.pause()

    def release_messages(self) -> None:
        """Dispatch what was held, in order, then go on as usual."""
        self._work.resume()
        self._dispatch_held()

    def deliver(self, messages: Iterable[object]) -> None:
        """Send what waited for this connection's peer (a buffered session's queue), in order, before
        anything else and without waiting for room."""
        for message in messages:
            self._send(message)

    def acknowledge_sync(self, sync_id: int) -> None:
        """The listeners handled the message of ``sync_id``: tell the sender."""
        if not self._machine.closed:
            self._machine.acknowledge_sync(sync_id)
            self._after_append()

    def release_stream(self, stream_id: int) -> None:
        """The listeners are done with a streamed message's temporary copy."""
        self._machine.release_stream(stream_id)

    # -- sending internals ------------------------------------------------------------------------

    def _full(self) -> bool:
        """Back-pressure: the transport holds too much for us, or the peer has not acknowledged enough."""
        return len(self._link.outbox) >= BACKLOG_LIMIT or self._machine.retained_full

    def _hold_closed(self, message: object) -> Hold | None:
        """For ``send`` on a closed connection: what its owner does with ``message`` (QUEUED: done;
        RECONNECTING: the caller waits for the successor; CLOSED: the send fails); None while open."""
        if not self._machine.closed:
            return None
        verdict: Hold = self._owner.hold(self, message)
        if verdict is Hold.FULL:
            raise UndeliveredError(f"connection {self.id}: the buffered session's queue is full", (message,))
        return verdict

    def _send(self, message: object) -> None:
        self._machine.send(self.outgoing(message))
        self._after_append()

    def _offer_alone(self, message: object) -> bool:
        """Seal ``message`` in a record of its own and offer it at once, when nothing waits before it (the
        outbox is empty; see ``ConnectionMachine.seal_lone``): True. False when that does not apply (nothing
        done: append it as usual). A lone request or reply skips the flush's general path."""
        link = self._link
        if link.outbox:
            return False
        record = self._machine.seal_lone(message, time.monotonic_ns())
        if record is None:
            return False
        link.send_one(record)
        if link.back_pressured:
            self.back_pressure_events += 1
        return True

    def _start_sync(self, message: object, timeout: float | None, waiter: Waiter[None]) -> None:
        """Append ``message`` as a send-and-wait; ``waiter`` gets its outcome."""
        timeout_s = self.send_timeout if timeout is None else timeout
        sync_id = self._machine.send_sync(self.outgoing(message), time.monotonic_ns(), int(timeout_s * 1e9))
        self._syncs[sync_id] = waiter
        self._after_append()

    def _start_ping(self, timeout: float | None, waiter: Waiter[Ping]) -> None:
        """Append a ping; ``waiter`` gets its outcome."""
        timeout_s = self.send_timeout if timeout is None else timeout
        ping_id = self._machine.ping(time.monotonic_ns(), int(timeout_s * 1e9))
        self._pings[ping_id] = waiter
        self._after_append()

    # -- receiving internals ----------------------------------------------------------------------

    def _on_fragment(self, payload: memoryview, header: Header) -> None:
        if self._track_position:
            self._session_id = header.session_id
            self._position = header.position
        if not self._machine.receive(payload, self._now_ns):
            self._owner.record_dropped(self)
        self._process_events()

    def _process_events(self) -> None:
        """Run what the machine's events call for, until it has no more (answering a host call may add
        some: a fire-and-forget call's failure)."""
        events = self._machine.take_events()
        while events:
            for event in events:
                if self._work.admit(event, isinstance(event, _RMI_EVENTS)):  # (else held: see ..limits)
                    self._on_event(event)
            events = self._machine.take_events()

    def _on_event(self, event: object) -> None:
        owner = self._owner
        if isinstance(event, MessageReceived):
            if self._hooked:
                self.received(event.message, event.sync_id, event.stream_id)
            else:
                owner.dispatch(self, event.message, event.sync_id, event.stream_id)
        elif isinstance(event, _RMI_EVENTS):
            self.rmi.handle(event)
        elif isinstance(event, (StreamStarted, StreamProgressed, StreamSent, StreamFailed)):
            if (error := self.transfers.record(event, f"connection {self.id}")) is not None:
                owner.report_error(self, error)
        elif isinstance(event, (SyncCompleted, SyncTimedOut, SyncFailed)):
            self._sync_ended(event)
        elif isinstance(event, PingAcknowledged):
            ping = self._pings.pop(event.ping_id, None)
            if ping is not None and not ping.done():
                ping.set_result(Ping(event.round_trip_ns / 1e9, event.outbound_ns / 1e9, event.inbound_ns / 1e9))
            owner.round_trip(self, event.round_trip_ns)
        elif isinstance(event, PingTimedOut):
            ping = self._pings.pop(event.ping_id, None)
            if ping is not None and not ping.done():
                ping.set_exception(PingTimeout(f"connection {self.id}: no pong in time"))
        elif isinstance(event, MessageDecodeFailed):
            owner.report_error(self, MessageDecodeError(f"connection {self.id}: {event.reason}"))
        elif isinstance(event, Closed):
            self._ended_by(event)
        # KeepaliveSent: nothing to run (it counts for tests and statistics).

    def _ended_by(self, event: Closed) -> None:
        """The machine closed: what waits fails, then the owner hears of it (once)."""
        self.flush()
        self.rmi.close()
        if self._ended:
            return
        self._ended = True
        self._end_reason = event.reason
        error = ConnectionClosedError(f"connection {self.id} is closed")
        waiters: list[Waiter[Any]] = [*self._syncs.values(), *self._pings.values()]
        self._syncs.clear()
        self._pings.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._room.set()
        self._closed_event.set()
        self._owner.connection_ended(self, event)

    def _sync_ended(self, event: SyncCompleted | SyncTimedOut | SyncFailed) -> None:
        """A ``send_sync`` outcome: its waiter resumes or raises (said once: not to ``on_error`` as well)."""
        if not isinstance(event, SyncCompleted) and event.stream_id:
            self.transfers.pop((False, event.stream_id), None)
        error = sync_error(event, f"connection {self.id}")
        if (waiter := self._syncs.pop(event.sync_id, None)) is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)
