"""What servers and clients share: listeners, dispatch, the poller task, the driver context."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar

from ...client import Context, Counter, DriverError, ExclusivePublication
from ...client.aio import Parking
from ...files.counters import NETWORK_RECORDS_DROPPED_TYPE_ID
from ...files.doorbell import Doorbell
from ..config import ClientConfig, ServerConfig
from ..connection import RECORD_OVERHEAD, ConnectionMachine, Records
from ..errors import MessageDispatchError
from ..events import Closed
from ..frames import FRAME_OVERHEAD
from ..registrations import Registrations
from ..rmi import ObjectTable, RmiEndpoint, RmiRegistry
from ..serialization import Serialization
from ..store import SettingsStore
from ..streaming import Streams
from .connection import Connection, Listeners, is_coroutine_result
from .recording import EndpointRecording
from .transport import (
    IdleBackoff,
    acquire_context,
    earliest,
    input_pending,
    release_context,
    release_context_drained,
)

__all__ = ["CLOSE_GRACE_S", "Endpoint", "PollGroup"]

CLOSE_GRACE_S = 0.05
"""After the CLOSE frame was handed to the transport, how long before its publication is closed."""

ONE_FRAME_CHUNKS_FROM = 16 * 1024
"""A frame payload (the MTU less the header) from which a stream's chunks are cut to fit one frame."""

log = logging.getLogger("slipstream.network")

F = TypeVar("F", bound=Callable[..., Any])


class Endpoint:
    """Base of Server and Client: listener decorators and the machinery behind them."""

    _role = "endpoint"

    def __init__(self, config: ServerConfig | ClientConfig) -> None:
        self.config = config
        self.listeners = Listeners()
        self.serialization = Serialization(config.messages)
        self.rmi_registry = RmiRegistry(config.interfaces, messages=self.serialization, exceptions=config.exceptions)
        """The RMI interfaces (and this side's implementations) and exception types of the config."""
        self.registrations = Registrations(self.serialization, self.rmi_registry)
        """What the handshake compares with the peer's: message types and RMI interfaces."""
        path = config.store_path(self._role)
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.store = SettingsStore(path)
        self.private_key, self.public_key = self.store.identity()
        self._context: Context | None = None
        self._polling = False
        self._closings: set[asyncio.Task[None]] = set()
        self._group: PollGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        """Set once ``close`` began (a server then answers no more handshakes)."""
        self._recording: EndpointRecording | None = None
        """Set while recording (``config.recording``): from the first bind or connect until ``close``."""
        self.records_dropped = 0
        """Records this endpoint's connections dropped, unopened: tampered, replayed, forged or malformed
        (each connection's ``stats`` splits its own by reason). Also a counter in the driver's counters
        file while the endpoint holds a driver, which ``slipstream stat`` shows as ``net records dropped``."""
        self._dropped_counter: Counter | None = None

    # -- listener decorators ----------------------------------------------------------------------

    def on_init(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` before ``on_connect``, for per-connection set-up."""
        self.listeners.init.append(listener)
        return listener

    def on_connect(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` when a connection is up."""
        self.listeners.connect.append(listener)
        return listener

    def on_disconnect(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` once per connection when it ends."""
        self.listeners.disconnect.append(listener)
        return listener

    def on_error(self, listener: F) -> F:
        """Decorator: ``listener(connection_or_None, exception)`` for listener failures, messages
        nobody listens for, and messages that failed to decode."""
        self.listeners.error.append(listener)
        return listener

    def on_message(self, kind: type) -> Callable[[F], F]:
        """Decorator: ``listener(connection, message)`` for messages of ``kind`` (and subclasses)."""

        def register(listener: F) -> F:
            self.listeners.add_message(kind, listener)
            return listener

        return register

    # -- running listeners ------------------------------------------------------------------------

    def _call(
        self, connection: Connection | None, listener: Callable[..., Any], *args: Any
    ) -> asyncio.Task[Any] | None:
        try:
            result = listener(*args)
        except Exception as exc:
            self._report_error(connection, exc)
            return None
        if is_coroutine_result(result):
            task = asyncio.ensure_future(self._guard(connection, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return task
        return None

    async def _guard(self, connection: Connection | None, awaitable: Any) -> None:
        try:
            await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._report_error(connection, exc)

    def _report_error(self, connection: Connection | None, error: BaseException) -> None:
        if not self.listeners.error:
            log.error("%s: %s (no on_error listener)", connection, error, exc_info=error)
            return
        for listener in list(self.listeners.error):
            try:
                result = listener(connection, error)
            except Exception:
                log.exception("on_error listener failed")
                continue
            if is_coroutine_result(result):
                task = asyncio.ensure_future(self._quiet(result))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _quiet(awaitable: Any) -> None:
        try:
            await awaitable
        except Exception:
            log.exception("on_error listener failed")

    def _fire(self, listeners: list[Any], connection: Connection) -> list[asyncio.Task[Any]]:
        tasks = []
        for listener in list(listeners):
            task = self._call(connection, listener, connection)
            if task is not None:
                tasks.append(task)
        return tasks

    def _new_machine(self, records: Records, now_ns: int, expiry_ns: int, publication: Any) -> ConnectionMachine:
        """A connection's machine sized to its publication, with streaming for large messages and files."""
        config = self.config
        max_record = publication.max_message_length
        machine = ConnectionMachine(
            records=records,
            serialization=self.serialization,
            now_ns=now_ns,
            expiry_ns=expiry_ns,
            batch_limit=publication.max_payload_length - 24,
            max_record=max_record,
            wall_offset_ns=time.time_ns() - time.monotonic_ns(),
        )
        chunk_record = machine.max_payload
        if publication.max_payload_length >= ONE_FRAME_CHUNKS_FROM:
            # A chunk's record fits one frame of the log (IPC: 64 KiB): read in place on the other side,
            # where a fragmented record would first be copied together by the assembler.
            chunk_record = min(chunk_record, publication.max_payload_length - RECORD_OVERHEAD)
        machine.streams = Streams(
            chunk_payload=chunk_record - FRAME_OVERHEAD,
            spill_threshold=config.spill_threshold,
            max_stream_size=config.max_stream_size,
            temp_dir=None if config.temp_directory is None else os.fspath(config.temp_directory),
        )
        return machine

    def _new_rmi(self, global_objects: ObjectTable | None) -> RmiEndpoint:
        """A connection's RMI endpoint (the server passes its global objects)."""
        return RmiEndpoint(self.rmi_registry, global_objects=global_objects)

    def _dispatch_message(self, connection: Connection, message: object, sync_id: int, stream_id: int = 0) -> None:
        recording = self._recording
        if recording is not None and recording.capture:
            recording.message(connection, message)
        kind = type(message)
        handlers = connection._listeners.for_type_with(kind, self.listeners)
        if not handlers:
            self._report_error(
                connection, MessageDispatchError(f"no on_message listener for {kind.__module__}.{kind.__qualname__}")
            )
        tasks = [task for handler in handlers if (task := self._call(connection, handler, connection, message))]
        if not sync_id and not stream_id:
            return
        machine = connection._machine
        if not tasks:
            if stream_id:
                machine.release_stream(stream_id)  # the listeners are done with the temporary copy
            if sync_id and not machine.closed:
                machine.acknowledge_sync(sync_id)
                connection._after_append()
            return

        async def acknowledge() -> None:
            await asyncio.gather(*tasks, return_exceptions=True)
            if stream_id:
                machine.release_stream(stream_id)
            if sync_id and not machine.closed:
                machine.acknowledge_sync(sync_id)
                connection._after_append()

        task = asyncio.ensure_future(acknowledge())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _connection_up(self, connection: Connection) -> None:
        """Run ``on_init`` then ``on_connect``."""
        if self._recording is not None:
            connection._track_position = self._recording.capture
            self._recording.connected(connection)
        self._fire(self.listeners.init, connection)
        if not connection.is_closed:
            self._fire(self.listeners.connect, connection)

    def _connection_closed(self, connection: Connection, event: Closed) -> None:
        """Called once per connection when its machine closed: subclasses release the transport."""
        if connection._disconnected:
            return
        connection._disconnected = True
        if self._recording is not None:
            self._recording.disconnected(connection, event)
        connection._fail_waiters()
        self._release_connection(connection)
        connection._closed_event.set()
        if not self._session_waits(connection, event):
            self._fire_disconnect(connection)

    def _fire_disconnect(self, connection: Connection) -> None:
        """Run ``on_disconnect`` (the connection's, then the endpoint's): once per connection."""
        self._fire(connection._listeners.disconnect, connection)
        self._fire(self.listeners.disconnect, connection)

    def _session_waits(self, connection: Connection, event: Closed) -> bool:
        """Whether a buffered session keeps ``connection``'s peer waiting (``on_disconnect`` later)."""
        return False

    def _buffer(self, connection: Connection, message: object) -> str | None:
        """A message for a closed connection: ``"queued"`` for its peer's return, ``"full"`` (the
        queue is; UndeliveredError reported), or None (no session waits: the connection is closed)."""
        return None

    def _release_connection(self, connection: Connection) -> None:
        raise NotImplementedError

    def _round_trip(self, connection: Connection, round_trip_ns: int) -> None:
        """A ping of ``connection`` completed (recorded as an RTT sample when recording)."""
        if self._recording is not None:
            self._recording.round_trip(connection, round_trip_ns)

    def _live_connections(self) -> Iterable[Connection]:
        """The connections that are up (read by the recording's sampler thread: a copied list)."""
        raise NotImplementedError

    def _deadline_ns(self, now_ns: int) -> int | None:
        """When the duty cycle is next due if nothing arrives (how long an idle poller may park): the
        earliest timer of the connections; None when none runs."""
        return earliest((connection._deadline_ns(now_ns) for connection in self._live_connections()), None)

    def _stop_recording(self) -> None:
        """Final statistics, then the recorder goes back (``close`` calls this before the driver goes)."""
        if self._recording is not None:
            recording, self._recording = self._recording, None
            recording.close()

    def _close_streams_later(self, connection: Connection, then: Callable[[], None] | None = None) -> None:
        """Close a finished connection's streams once its last records (the CLOSE frame) were
        handed to the transport, plus a moment for the driver to send them; ``then`` runs after."""

        async def close() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.close_timeout
            while connection._backlog and loop.time() < deadline:
                connection._flush()
                await asyncio.sleep(0.005)
            await asyncio.sleep(CLOSE_GRACE_S)
            for item in (connection._publication, connection._subscription):
                try:
                    item.close()
                except DriverError as exc:
                    log.warning("closing %r: %s", item, exc)
            connection._machine.shutdown()  # temporary files of streamed messages not yet released
            if then is not None:
                then()

        task = asyncio.ensure_future(close())
        self._closings.add(task)
        task.add_done_callback(self._closings.discard)

    async def _wait_closings(self) -> None:
        """Let every connection that is closing finish (bounded by the close timeout)."""
        if self._closings:
            await asyncio.wait(list(self._closings), timeout=self.config.close_timeout + 1.0)

    # -- the poller -------------------------------------------------------------------------------

    def _acquire_context(self) -> Context:
        if self._context is None:
            self._context = acquire_context(self.config.driver_directory, self.config.driver)
            self._add_dropped_counter(self._context)
        recording = self.config.recording
        if self._recording is None and recording is not None and recording.enabled:
            self._recording = EndpointRecording(
                recording,
                self._role,
                self._context.directory,
                self._live_connections,
                self.serialization.encode,
                self._context.counters(),
            )
        return self._context

    def _release_context(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            self._close_dropped_counter()
            release_context(context)

    async def _release_context_drained(self) -> None:
        """``_release_context`` for ``close``: a driver that goes with us lets its closed publications
        finish without stopping the event loop (see ``release_context_drained``)."""
        if self._context is not None:
            context, self._context = self._context, None
            self._close_dropped_counter()
            await release_context_drained(context)

    def _add_dropped_counter(self, context: Context) -> None:
        """The ``records_dropped`` counter in the driver's counters file (a context may be shared: each
        endpoint has its own, keyed by its public key). Not having one never stops the endpoint."""
        label = f"net records dropped: {self._role} {self.config.app_id} pid {os.getpid()} {self.public_key[:4].hex()}"
        try:
            counter = context.add_counter(NETWORK_RECORDS_DROPPED_TYPE_ID, label, self.public_key)
        except DriverError as exc:
            log.warning("no records-dropped counter in %s: %s", context.directory, exc)
            return
        counter.set(self.records_dropped)
        self._dropped_counter = counter

    def _close_dropped_counter(self) -> None:
        counter, self._dropped_counter = self._dropped_counter, None
        if counter is not None:
            counter.close()

    def _record_dropped(self, connection: Connection) -> None:
        """A connection dropped a record it could not open (counted in its stats too)."""
        self.records_dropped += 1
        if self._dropped_counter is not None:
            self._dropped_counter.set(self.records_dropped)

    def _start_poller(self) -> None:
        if not self._polling:
            self._polling = True
            self._closing = False
            self._group = PollGroup.for_loop(asyncio.get_running_loop())
            self._group.add(self)

    def _kick(self) -> None:
        """Make the poller run its next cycle now (new work arrived from the application)."""
        if self._group is not None:
            self._group.backoff.kick()

    def _send_now(self, publication: ExclusivePublication) -> None:
        """An invoker-mode driver sends what ``publication`` was just given now (see Connection)."""
        context = self._context
        if context is not None:
            context.send_now(publication)

    def _duty_cycle(self, now_ns: int) -> int:
        raise NotImplementedError

    async def _stop_poller(self) -> None:
        self._closing = True
        if self._polling:
            self._polling = False
            if self._group is not None:
                self._group.remove(self)
        for pending in list(self._tasks):
            pending.cancel()
        self._tasks.clear()


UNPARKED_PAUSE_MAX_S = 0.1
"""The longest pause of a poller that nothing would wake for some input: an image without a parking
slot (no doorbell), or an invoker-mode driver's input left out of the wait (a cycle left it unread).
Only the pause's end lets it see a message there."""

BUSY_NAP_EVERY_NS = 1_000_000
"""A poller busy this long without a pause naps once, when an embedded driver thread shares its GIL."""


class PollGroup:
    """One poller task per event loop for every server and client on it: a hundred clients in one
    process wake once per back-off step, not a hundred times."""

    _groups: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PollGroup]] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.endpoints: list[Endpoint] = []
        self.backoff = IdleBackoff()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> PollGroup:
        """The group of ``loop`` (made on first use)."""
        group = cls._groups.get(loop)
        if group is None:
            group = cls._groups[loop] = PollGroup(loop)
        return group

    def add(self, endpoint: Endpoint) -> None:
        """Poll ``endpoint`` from now on (starting the task if needed)."""
        self.endpoints.append(endpoint)
        self.backoff.kick()
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run(), name="slipstream-network-poller")

    def remove(self, endpoint: Endpoint) -> None:
        """Stop polling ``endpoint`` (the task ends with the last one)."""
        if endpoint in self.endpoints:
            self.endpoints.remove(endpoint)

    def _contexts(self) -> list[Context]:
        """The transport contexts the endpoints use, each once (endpoints of one directory share one).
        Asked twice per duty cycle: a lone endpoint, the common case, costs no dictionary."""
        if len(self.endpoints) == 1:
            context = self.endpoints[0]._context
            return [] if context is None else [context]
        contexts: dict[int, Context] = {}
        for endpoint in self.endpoints:
            context = endpoint._context
            if context is not None:
                contexts.setdefault(id(context), context)
        return list(contexts.values())

    def _invoke_drivers(self) -> None:
        """One duty cycle of each invoker-mode driver the endpoints use (a no-op for the others). Its
        own chores (heartbeats, status messages) do not count as work, or an idle endpoint would never
        park."""
        for context in self._contexts():
            context.invoke()

    async def _run(self) -> None:
        backoff = self.backoff
        parked: tuple[Parking, list[Doorbell], list[int]] | None = None
        woken_by: Sequence[int] = ()
        mute_inputs = False
        rechecked = False
        busy_since_ns: int | None = None
        try:
            while self.endpoints:
                now_ns = time.monotonic_ns()
                work = self._cycle(now_ns)
                # Input a cycle leaves unread must not wake us in a loop: the next wait leaves it out.
                # But a datagram may also have come in just after the driver read its socket: one more
                # cycle tells the two apart (muted, that message would wait out the pause).
                mute_inputs = bool(woken_by) and not work and input_pending(woken_by)
                if mute_inputs and not rechecked:
                    rechecked = True
                    continue
                rechecked = False
                woken_by = ()
                if work:
                    if parked is not None:
                        parked[0].unpark()
                        parked = None
                    backoff.reset()
                    if busy_since_ns is None:
                        busy_since_ns = now_ns
                    elif now_ns - busy_since_ns >= BUSY_NAP_EVERY_NS:
                        busy_since_ns = now_ns
                        if self._threaded():
                            # Each loop turn lets go of the GIL for a moment (the selector's poll) and
                            # takes it straight back, before a waiting thread can wake: an embedded
                            # driver thread would starve (for seconds on a loaded machine), and with it
                            # the data this loop is busy with. A nap now and then lets it in.
                            time.sleep(backoff.nap_s)
                    await asyncio.sleep(0)
                    continue
                busy_since_ns = None
                pause = backoff.next_pause(now_ns / 1e9)
                if pause is not None and pause > backoff.max_sleep_s:
                    pause = self._until_due(pause, now_ns)  # a long pause ends by the next timer
                if pause is None:
                    await backoff.idle(now_ns / 1e9, nap=self._threaded())  # still yielding: no pause yet
                    continue
                if parked is None:
                    parked = self._park()
                    if parked is None:
                        # some image has no parking slot: a timed pause, and a short one (no ring ends it)
                        await backoff.sleep(min(pause, UNPARKED_PAUSE_MAX_S))
                        continue
                    if parked[0].ready():
                        continue  # appended before our bytes were visible: the next cycle takes it
                inputs: Sequence[int] = parked[2]
                if mute_inputs:  # nothing wakes us for the driver's input: keep the pause short
                    inputs, pause = (), min(pause, UNPARKED_PAUSE_MAX_S)
                outcome = await backoff.park(parked[1], pause, inputs)
                if outcome != "timeout":
                    # Rung, kicked or input: images or endpoints may have changed, so park afresh next
                    # time. A pause that timed out stays parked: no re-parking on every pause.
                    parked[0].unpark()
                    parked = None
                if outcome == "input":
                    woken_by = inputs
        finally:
            if parked is not None:
                parked[0].unpark()
            self.task = None

    def _cycle(self, now_ns: int) -> int:
        """One duty cycle of every endpoint (and of invoker-mode drivers); returns the work done.

        The drivers run first (what arrived reaches the images the endpoints poll) and not again after
        the endpoints: what the application sends leaves at once (``Connection._flush_out``), and the
        rest (handshake packets, status messages) with the next cycle, one loop turn later, after the
        tasks this cycle woke have run."""
        work = 0
        self._invoke_drivers()
        for endpoint in list(self.endpoints):
            try:
                work += endpoint._duty_cycle(now_ns)
            except Exception as exc:  # a bug must not silently stop every connection
                log.exception("network poller failed")
                endpoint._report_error(None, exc)
        return work

    def _until_due(self, pause_s: float, now_ns: int) -> float:
        """``pause_s``, cut short to end when the earliest timer of the endpoints' connections or of an
        invoker-mode driver's streams (heartbeats, status messages, NAKs) is due, or to the back-off's
        short pause while such a driver has data in flight; never below that short pause (a timer
        already due gets a cycle soon, not a spin). The driver's periodic chores (client liveness,
        counters) run at the pause's end: they may be late, nothing is lost."""
        short = self.backoff.max_sleep_s
        invokers = [context for context in self._contexts() if context.is_invoker]
        if any(context.invoker_busy() for context in invokers):
            return short
        due = earliest((endpoint._deadline_ns(now_ns) for endpoint in self.endpoints), None)
        due = earliest((context.invoker_deadline_ns() for context in invokers), due)
        if due is None:
            return pause_s
        return min(pause_s, max(short, (due - now_ns) / 1e9))

    def _threaded(self) -> bool:
        """Whether an embedded driver thread shares our GIL (then a spinning poller naps for it)."""
        return any(
            (context := endpoint._context) is not None and context.is_embedded and not context.is_invoker
            for endpoint in self.endpoints
        )

    def _park(self) -> tuple[Parking, list[Doorbell], list[int]] | None:
        """Park every subscription of the endpoints' contexts on the contexts' doorbells, for the idle
        pauses; None (nothing left parked) when some image has no parking slot: the caller then sleeps.

        Parking protocol: set the parked bytes, re-check the images (``Parking.ready``), then wait; the
        bytes are cleared once work is found."""
        parking = Parking()
        bells: list[Doorbell] = []
        inputs: list[int] = []
        for context in self._contexts():
            fd = context.invoker_fileno()  # an invoker-mode driver's datagrams wake us too
            if fd is not None:
                inputs.append(fd)
            try:
                bell = context.doorbell
            except RuntimeError:  # closing
                parking.unpark()
                return None
            bells.append(bell)
            if not parking.park(context.subscriptions, bell.number):
                parking.unpark()
                return None
        return (parking, bells, inputs) if bells else None
