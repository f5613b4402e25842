"""What servers and clients share: listeners and how they run, the connections' owner (dispatch,
errors, their end), the driver context, and a place in the poller.

The methods under "for connections and the poller" are what a connection and the poller call (the
:class:`~.connection.ConnectionOwner` and :class:`~.poller.Polled` protocols); applications do not need
them."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...client import Context, DriverError, DriverLostError, ExclusivePublication, Subscription
from ..buffered import Hold
from ..config import ClientConfig, ServerConfig
from ..delivery import Delivery
from ..endpoint import EndpointCore
from ..errors import MessageDispatchError, NetworkError
from ..events import Closed
from ..recovery import FIRST_RETRY_S, PERMANENT, RetryDelays, driver_available
from ..rmi import ObjectTable
from ..session import Records
from ..streamfiles import ThreadedStreamFiles, shared_stream_files
from ..transport import earliest, shared_contexts
from .connection import DRIVER_LOST, Connection
from .poller import PollGroup
from .transport import release_context_drained

if TYPE_CHECKING:
    from ..recording import EndpointRecording

__all__ = ["CLOSE_GRACE_S", "Endpoint"]

CLOSE_GRACE_S = 0.05
"""After the CLOSE frame was handed to the transport, how long before its publication is closed."""

log = logging.getLogger("slipstream.network")


class Endpoint(EndpointCore):
    """Base of Server and Client: the machinery behind the listeners, on the event loop."""

    def __init__(self, config: ServerConfig | ClientConfig) -> None:
        super().__init__(config)
        self._polling = False
        self._closings: set[asyncio.Task[None]] = set()
        self._group: PollGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        """Set once ``close`` began (a server then answers no more handshakes)."""
        self._recording: EndpointRecording | None = None
        """Set while recording (``config.recording``): from the first bind or connect until ``close``."""
        self._files: ThreadedStreamFiles | None = None
        """The loop's stream-file worker, from the first connection until ``close``."""

    # -- running listeners ------------------------------------------------------------------------

    def _call(
        self, connection: Connection | None, listener: Callable[..., Any], *args: Any
    ) -> asyncio.Task[Any] | None:
        try:
            result = listener(*args)
        except Exception as exc:
            self.report_error(connection, exc)
            return None
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._guard(connection, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if connection is not None:
                connection.track(task)
            return task
        return None

    async def _guard(self, connection: Connection | None, awaitable: Any) -> None:
        try:
            await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.report_error(connection, exc)

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

    def _fire_disconnect(self, connection: Connection) -> None:
        """Run ``on_disconnect`` (the connection's, then the endpoint's): once per connection."""
        self._fire(connection.listeners.disconnect, connection)
        self._fire(self.listeners.disconnect, connection)

    def _connection_up(self, connection: Connection) -> None:
        """Run ``on_init``, and once it finished (awaited when async) ``on_connect``; the connection's
        messages wait meanwhile, so per-connection set-up never races them."""
        if self._recording is not None:
            self._recording.connected(connection)
            if self._recording.rtt_interval_s is not None:
                self._probe_rtt(connection, self._recording.rtt_interval_s)
        initializing = self._fire(self.listeners.init, connection)
        if not initializing:
            if not connection.is_closed:
                self._fire(self.listeners.connect, connection)
            return
        connection.hold_messages()

        async def connect() -> None:
            await asyncio.gather(*initializing, return_exceptions=True)
            if not connection.is_closed:
                self._fire(self.listeners.connect, connection)
            connection.release_messages()

        task = asyncio.ensure_future(connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _probe_rtt(self, connection: Connection, interval_s: float) -> None:
        """Ping ``connection`` every ``interval_s`` while it is up (``RecordingConfig.rtt_interval_s``): each
        pong is an RTT sample the recording writes; a ping that times out or meets the close is none."""

        async def probe() -> None:
            while not connection.is_closed:
                await asyncio.sleep(interval_s)
                with contextlib.suppress(NetworkError):
                    await connection.ping(timeout=max(1.0, 4 * interval_s))

        task = asyncio.ensure_future(probe())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_connection(
        self,
        records: Records,
        expiry_ns: int,
        publication: ExclusivePublication,
        subscription: Subscription,
        *,
        connection_id: int,
        remote_address: str | None,
        remote_port: int | None,
        tag: str,
        remote_public_key: bytes,
        global_objects: ObjectTable | None,
        delivery: Delivery | None = None,
    ) -> Connection:
        """A connection over its two streams (its machine: ``_new_machine``)."""
        if self._files is None:  # one worker per loop; it wakes the poller from its thread
            loop = asyncio.get_running_loop()

            def wake() -> None:
                loop.call_soon_threadsafe(PollGroup.for_loop(loop).backoff.kick)

            self._files = shared_stream_files.acquire(loop, wake)
        machine = self._new_machine(records, expiry_ns, publication, self._files, global_objects, delivery)
        factory: type[Connection] = self.config.connection_class or Connection  # (checked by the config)
        return factory(
            owner=self,
            connection_id=connection_id,
            machine=machine,
            publication=publication,
            subscription=subscription,
            remote_address=remote_address,
            remote_port=remote_port,
            tag=tag,
            remote_public_key=remote_public_key,
            send_timeout=self.config.send_timeout,
            rmi_timeout=self.config.rmi_timeout,
            track_position=self._recording is not None and self._recording.capture,
        )

    def _session_waits(self, connection: Connection, event: Closed) -> bool:
        """Whether a buffered session keeps ``connection``'s peer waiting (``on_disconnect`` later)."""
        return False

    def _release_connection(self, connection: Connection) -> None:
        raise NotImplementedError

    def _live_connections(self) -> Iterable[Connection]:
        """The connections that are up (read by the recording's sampler thread: a copied list)."""
        raise NotImplementedError

    def _stop_recording(self) -> None:
        """Final statistics, then the recorder goes back (``close`` calls this before the driver goes)."""
        if self._recording is not None:
            recording, self._recording = self._recording, None
            recording.close()

    def _close_streams_later(self, connection: Connection, then: Callable[[], None] | None = None) -> None:
        """Close a finished connection's streams once its last records (the CLOSE frame) were
        handed to the transport, plus a moment for the driver to send them; ``then`` runs after."""

        async def close() -> None:
            await connection.release_transport(self.config.close_timeout, CLOSE_GRACE_S)
            if then is not None:
                then()

        task = asyncio.ensure_future(close())
        self._closings.add(task)
        task.add_done_callback(self._closings.discard)

    async def _wait_closings(self) -> None:
        """Let every connection that is closing finish (bounded by the close timeout)."""
        if self._closings:
            await asyncio.wait(list(self._closings), timeout=self.config.close_timeout + 1.0)

    # -- for connections and the poller -----------------------------------------------------------

    def report_error(self, connection: Connection | None, error: BaseException) -> None:
        """Tell the ``on_error`` listeners (logged when there is none), once per kind of error from one
        connection in a while (``reporting.ErrorLimiter``: repeats are counted, then reported as one)."""
        if self.admit_error(None if connection is None else connection.id, error, time.monotonic_ns()):
            self._tell(connection, error)

    def _report_suppressed(self, now_ns: int, source: int | None = None) -> None:
        """The counts of errors suppressed in windows that ended (or all of ``source``'s)."""
        for error in self._limiter.suppressed_errors(now_ns, source):
            self._tell(None, error)

    def _tell(self, connection: Connection | None, error: BaseException) -> None:
        if not self.listeners.error:
            log.error("%s: %s (no on_error listener)", connection, error, exc_info=error)
            return
        for listener in list(self.listeners.error):
            try:
                result = listener(connection, error)
            except Exception:
                log.exception("on_error listener failed")
                continue
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(self._quiet(result))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def dispatch(self, connection: Connection, message: object, sync_id: int = 0, stream_id: int = 0) -> None:
        """Run the message listeners for a received ``message``; once they are done (awaited if async),
        acknowledge ``sync_id`` and release ``stream_id``'s temporary copy."""
        recording = self._recording
        if recording is not None and recording.capture:
            recording.message(connection, message)
        kind = type(message)
        handlers = connection.listeners.for_type_with(kind, self.listeners)
        if not handlers:
            self.report_error(
                connection, MessageDispatchError(f"no on_message listener for {kind.__module__}.{kind.__qualname__}")
            )
        tasks = [task for handler in handlers if (task := self._call(connection, handler, connection, message))]
        if not sync_id and not stream_id:
            return
        if not tasks:
            if stream_id:
                connection.release_stream(stream_id)  # the listeners are done with the temporary copy
            if sync_id:
                connection.acknowledge_sync(sync_id)
            return

        async def acknowledge() -> None:
            await asyncio.gather(*tasks, return_exceptions=True)
            if stream_id:
                connection.release_stream(stream_id)
            if sync_id:
                connection.acknowledge_sync(sync_id)

        task = asyncio.ensure_future(acknowledge())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def connection_ended(self, connection: Connection, event: Closed) -> None:
        """A connection's machine closed (called once per connection): release it, then ``on_disconnect``
        unless a buffered session keeps its peer waiting."""
        if self._recording is not None:
            self._recording.disconnected(connection, event)
        self._report_suppressed(time.monotonic_ns(), connection.id)
        self._release_connection(connection)
        if not self._session_waits(connection, event):
            self._fire_disconnect(connection)

    def hold(self, connection: Connection, message: object) -> Hold:
        """A message for a closed connection: queued for its peer's return (a server's buffered
        session), refused because that queue is full, or closed (nothing waits for the peer)."""
        return Hold.CLOSED

    def round_trip(self, connection: Connection, round_trip_ns: int) -> None:
        """A ping of ``connection`` completed (recorded as an RTT sample when recording)."""
        if self._recording is not None:
            self._recording.round_trip(connection, round_trip_ns)

    def wake(self) -> None:
        """Make the poller run its next cycle now (new work arrived from the application)."""
        if self._group is not None:
            self._group.backoff.kick()

    def send_now(self, publication: ExclusivePublication) -> None:
        """An invoker-mode driver sends what ``publication`` was just given now (see Connection)."""
        context = self._context
        if context is not None:
            context.send_now(publication)

    def duty_cycle(self, now_ns: int) -> int:
        """One duty cycle of this endpoint's handshakes and connections; the work done. A lost driver
        ends it all at once (``_driver_lost``), whatever the endpoint was doing."""
        context = self._context
        if context is not None and context.driver_error is not None:
            self._driver_lost(context)
            return 1
        due = self._limiter.deadline_ns
        if due is not None and now_ns >= due:
            self._report_suppressed(now_ns)
        try:
            return self._cycle(now_ns)
        except DriverLostError:  # lost while this cycle ran (the client's thread noticed first)
            if context is not None and self._context is context:
                self._driver_lost(context)
            return 1

    def _cycle(self, now_ns: int) -> int:
        raise NotImplementedError

    def next_deadline_ns(self, now_ns: int) -> int | None:
        """When the duty cycle is next due if nothing arrives (how long an idle poller may park): the
        earliest timer of the connections and of error summaries; None when none runs."""
        due = earliest((connection.next_deadline_ns(now_ns) for connection in self._live_connections()), None)
        return earliest((self._limiter.deadline_ns,), due)

    def _driver_lost(self, context: Context) -> None:
        """The media driver is gone: everything it carried ends now, each connection once (``on_disconnect``,
        cause ``driver lost``), ``on_error`` hears it once, and the poller stops spinning on a dead driver;
        then a subclass recovers (``_recover``)."""
        self._stop_polling()
        self._context = None
        with contextlib.suppress(Exception):  # the counter lived in the dead driver's files
            self._close_counters()
        self._stop_recording()
        error = DriverLostError(f"the media driver in {context.directory} was lost: {context.driver_error}")
        self.report_error(None, error)
        for connection in list(self._live_connections()):
            connection.lose(DRIVER_LOST)
        shared_contexts.release(context)
        self._recover()

    def _recover(self) -> None:
        """After a lost driver: a client reconnects, a server binds again (when their configs say so)."""

    async def _retry(self, attempt: Callable[[], Awaitable[object]], max_delay_s: float) -> bool:
        """``attempt`` after a fault, again and again (``recovery.RetryDelays``), until it works (True), the
        endpoint closes, or a refusal no attempt can change (False); each failure goes to ``on_error``."""
        delays = RetryDelays(max_delay_s)
        wait = delays.next()
        while not self._closing:
            await asyncio.sleep(wait)
            if not driver_available(self.config.driver_directory, self.config.driver):
                wait = FIRST_RETRY_S  # an external driver not back yet (attaching would block): look again soon
                continue
            try:
                await attempt()
            except PERMANENT as exc:
                self.report_error(None, exc)
                return False
            except (NetworkError, DriverError, OSError) as exc:
                self.report_error(None, exc)
                wait = delays.next()
            else:
                return True
        return False

    # -- the driver context and the poller --------------------------------------------------------

    def _acquire_context(self) -> Context:
        if self._context is None:
            self._context = shared_contexts.acquire_for(self.config)
            self._add_counters(self._context)
        recording = self.config.recording
        if self._recording is None and recording is not None and recording.enabled:
            from ..recording import EndpointRecording  # telemetry loads only where a config records

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
            self._close_counters()
            shared_contexts.release(context)

    async def _release_context_drained(self) -> None:
        """``_release_context`` for ``close``: a driver that goes with us lets its closed publications
        finish without stopping the event loop (see ``release_context_drained``)."""
        if self._context is not None:
            context, self._context = self._context, None
            self._close_counters()
            await release_context_drained(context)

    def _stop_polling(self) -> None:
        if self._polling:
            self._polling = False
            if self._group is not None:
                self._group.remove(self)

    def _start_poller(self) -> None:
        if not self._polling:
            self._polling = True
            self._closing = False
            self._group = PollGroup.for_loop(asyncio.get_running_loop())
            self._group.add(self)

    async def _stop_poller(self) -> None:
        """Stop polling and cancel listener tasks (after the connections were released): the file
        worker of streamed messages goes too when no other endpoint of the loop uses it."""
        self._closing = True
        if self._files is not None:
            self._files = None
            shared_stream_files.release(asyncio.get_running_loop())
        self._stop_polling()
        for pending in list(self._tasks):
            pending.cancel()
        self._tasks.clear()
