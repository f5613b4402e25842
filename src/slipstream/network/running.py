"""What a server or client does with its connections whichever adapter runs it: listeners called and
errors reported, received messages dispatched and acknowledged, connections made, ended and lost with
their driver, the duty cycle and its timers, the driver context and the recording.

``aio.Endpoint`` and ``sync.Endpoint`` add how they run what cannot finish at once: a listener that
returns an awaitable (asyncio runs it as a task; the blocking API refuses it), the work that follows
listeners still running, the RTT probe, the stream-file worker and the poller.

The methods under "for connections and the poller" are what a connection and the poller call (the
:class:`~.endpoint.ConnectionOwner` and :class:`~.endpoint.Polled` protocols); applications do not need them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..client import Context, DriverError, DriverLostError, ExclusivePublication, Subscription
from .buffered import Hold
from .config import ClientConfig, ServerConfig
from .connected import DRIVER_LOST, ConnectionBase
from .delivery import Delivery
from .endpoint import EndpointCore
from .errors import MessageDispatchError, NetworkError
from .events import Closed
from .recovery import FIRST_RETRY_S, PERMANENT, RetryDelays, driver_available
from .rmi import ObjectTable
from .session import Records
from .streamfiles import StreamFiles
from .transport import earliest, shared_contexts

if TYPE_CHECKING:
    from .recording import EndpointRecording

__all__ = ["CLOSE_GRACE_S", "RETRYABLE", "RunningEndpoint"]

CLOSE_GRACE_S = 0.05
"""After the CLOSE frame was handed to the transport, how long before its publication is closed."""
RETRYABLE = (NetworkError, DriverError, OSError)
"""What an attempt after a fault may fail with and be tried again (unless ``recovery.PERMANENT``)."""

log = logging.getLogger("slipstream.network")

C = TypeVar("C", bound=ConnectionBase[Any])


class RunningEndpoint(EndpointCore, Generic[C]):
    """Base of every adapter's ``Endpoint``: the machinery behind the listeners, without a way to wait."""

    def __init__(self, config: ServerConfig | ClientConfig) -> None:
        super().__init__(config)
        self._polling = False
        self._closing = False
        """Set once ``close`` began (a server then answers no more handshakes)."""
        self._recording: EndpointRecording | None = None
        """Set while recording (``config.recording``): from the first bind or connect until ``close``."""

    # -- what an adapter gives ----------------------------------------------------------------------

    def _awaited(self, connection: C | None, awaitable: Any) -> Any:
        """A listener returned ``awaitable``: run it (its failure reported against ``connection``); returns a
        handle :meth:`_after` can wait for."""
        raise NotImplementedError

    def _awaited_quietly(self, awaitable: Any) -> None:
        """An ``on_error`` listener returned ``awaitable``: run it, logging its failure."""
        raise NotImplementedError

    def _after(self, handles: Sequence[Any], then: Callable[[], None]) -> None:
        """Run ``then`` once the listeners behind ``handles`` (from :meth:`_awaited`) finished."""
        raise NotImplementedError

    def _probe_rtt(self, connection: C, interval_s: float) -> None:
        """Ping ``connection`` every ``interval_s`` while it is up (``RecordingConfig.rtt_interval_s``)."""
        raise NotImplementedError

    def _stream_files(self) -> StreamFiles:
        """The stream-file worker of this endpoint's connections."""
        raise NotImplementedError

    def _stop_polling(self) -> None:
        raise NotImplementedError

    def _start_poller(self) -> None:
        raise NotImplementedError

    def _close_streams_later(self, connection: C, then: Callable[[], None] | None = None) -> None:
        """Close a finished connection's streams once its last records (the CLOSE frame) were handed to
        the transport, plus a moment for the driver to send them; ``then`` runs after."""
        raise NotImplementedError

    def wake(self) -> None:
        """Make the poller run its next cycle now (new work arrived from the application)."""
        raise NotImplementedError

    def _recover(self) -> None:
        """After a lost driver: a client reconnects, a server binds again (when their configs say so)."""

    def _release_connection(self, connection: C) -> None:
        raise NotImplementedError

    def _live_connections(self) -> Iterable[C]:
        """The connections that are up (read by the recording's sampler thread: a copied list)."""
        raise NotImplementedError

    def _cycle(self, now_ns: int) -> int:
        raise NotImplementedError

    def _connection_class(self) -> type[C]:
        """The adapter's ``Connection``, or the config's subclass of it."""
        raise NotImplementedError

    # -- running listeners ------------------------------------------------------------------------

    def _call(self, connection: C | None, listener: Callable[..., Any], *args: Any) -> Any:
        """Run ``listener``; a handle of what it left running (an awaitable), or None once it is done."""
        try:
            result = listener(*args)
        except Exception as exc:
            self.report_error(connection, exc)
            return None
        if result is not None and inspect.isawaitable(result):  # (a plain listener's None: no ABC check)
            return self._awaited(connection, result)
        return None

    def _fire(self, listeners: list[Any], connection: C) -> list[Any]:
        handles = []
        for listener in list(listeners):
            handle = self._call(connection, listener, connection)
            if handle is not None:
                handles.append(handle)
        return handles

    def _fire_disconnect(self, connection: C) -> None:
        """Run ``on_disconnect`` (the connection's, then the endpoint's): once per connection."""
        self._fire(connection.listeners.disconnect, connection)
        self._fire(self.listeners.disconnect, connection)

    def _connection_up(self, connection: C) -> None:
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

        def connect() -> None:
            if not connection.is_closed:
                self._fire(self.listeners.connect, connection)
            connection.release_messages()

        self._after(initializing, connect)

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
    ) -> C:
        """A connection over its two streams (its machine: ``_new_machine``)."""
        machine = self._new_machine(records, expiry_ns, publication, self._stream_files(), global_objects, delivery)
        return self._connection_class()(
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

    def _session_waits(self, connection: C, event: Closed) -> bool:
        """Whether a buffered session keeps ``connection``'s peer waiting (``on_disconnect`` later)."""
        return False

    def _stop_recording(self) -> None:
        """Final statistics, then the recorder goes back (``close`` calls this before the driver goes)."""
        if self._recording is not None:
            recording, self._recording = self._recording, None
            recording.close()

    # -- for connections and the poller -----------------------------------------------------------

    def report_error(self, connection: C | None, error: BaseException) -> None:
        """Tell the ``on_error`` listeners (logged when there is none), once per kind of error from one
        connection in a while (``reporting.ErrorLimiter``: repeats are counted, then reported as one)."""
        if self.admit_error(None if connection is None else connection.id, error, time.monotonic_ns()):
            self._tell(connection, error)

    def _report_suppressed(self, now_ns: int, source: int | None = None) -> None:
        """The counts of errors suppressed in windows that ended (or all of ``source``'s)."""
        for error in self._limiter.suppressed_errors(now_ns, source):
            self._tell(None, error)

    def _tell(self, connection: C | None, error: BaseException) -> None:
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
                self._awaited_quietly(result)

    def dispatch(self, connection: C, message: object, sync_id: int = 0, stream_id: int = 0) -> None:
        """Run the message listeners for a received ``message``; once they are done (awaited if async),
        acknowledge ``sync_id`` and release ``stream_id``'s temporary copy."""
        recording = self._recording
        if recording is not None and recording.capture:
            recording.message(connection, message)
        kind = type(message)
        handlers = connection.listeners.for_type_with(kind, self.listeners)
        if not handlers and not self._unclaimed(connection, message):
            where = f"{kind.__module__}.{kind.__qualname__}"
            self.report_error(connection, MessageDispatchError(f"no on_message listener for {where}"))
        running = [handle for handler in handlers if (handle := self._call(connection, handler, connection, message))]
        if not sync_id and not stream_id:
            return

        def acknowledge() -> None:
            if stream_id:
                connection.release_stream(stream_id)  # the listeners are done with the temporary copy
            if sync_id:
                connection.acknowledge_sync(sync_id)

        if running:
            self._after(running, acknowledge)
        else:
            acknowledge()

    def _unclaimed(self, connection: C, message: object) -> bool:
        """A message no listener takes: True if the adapter keeps it (the blocking API's ``receive``)."""
        return False

    def connection_ended(self, connection: C, event: Closed) -> None:
        """A connection's machine closed (called once per connection): release it, then ``on_disconnect``
        unless a buffered session keeps its peer waiting."""
        if self._recording is not None:
            self._recording.disconnected(connection, event)
        self._report_suppressed(time.monotonic_ns(), connection.id)
        self._release_connection(connection)
        if not self._session_waits(connection, event):
            self._fire_disconnect(connection)

    def hold(self, connection: C, message: object) -> Hold:
        """A message for a closed connection: queued for its peer's return (a server's buffered
        session), refused because that queue is full, or closed (nothing waits for the peer)."""
        return Hold.CLOSED

    def round_trip(self, connection: C, round_trip_ns: int) -> None:
        """A ping of ``connection`` completed (recorded as an RTT sample when recording)."""
        if self._recording is not None:
            self._recording.round_trip(connection, round_trip_ns)

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

    def poll_connections(self, now_ns: int) -> int:
        """The connections' own cycle only (receive, flush), for a poller that saw a frame arrive or spins
        between whole cycles: the answer goes out before the endpoint's chores (handshakes, tables, error
        summaries, a driver's idle work) and the connections' timers, which the next full
        :meth:`duty_cycle` runs, a moment later. A lost driver is left to that duty cycle."""
        context = self._context
        if context is None or context.driver_error is not None:
            return self.duty_cycle(now_ns)
        work = 0
        try:
            for connection in self._live_connections():
                work += connection.poll(now_ns, timers=False)
        except DriverLostError:
            return work + self.duty_cycle(now_ns)
        return work

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

    def _retries(self, max_delay_s: float) -> Generator[float | None, BaseException | None, bool]:
        """The attempts after a fault (``recovery.RetryDelays``), whichever adapter waits: yields the seconds
        to wait, or None for "attempt now", which is answered with the attempt's failure (None: it worked).
        Returns True once one worked; False when the endpoint closes or a refusal no attempt can change
        comes. Each failure goes to ``on_error``."""
        delays = RetryDelays(max_delay_s)
        wait = delays.next()
        while not self._closing:
            yield wait
            if self._closing:
                break
            if not driver_available(self.config.driver_directory, self.config.driver):
                wait = FIRST_RETRY_S  # an external driver not back yet (attaching would block): look again soon
                continue
            error = yield None
            if error is None:
                return True
            self.report_error(None, error)
            if isinstance(error, PERMANENT):
                return False
            wait = delays.next()
        return False

    # -- the driver context ---------------------------------------------------------------------------

    def _acquire_context(self) -> Context:
        if self._context is None:
            self._context = shared_contexts.acquire_for(self.config)
            self._add_counters(self._context)
        recording = self.config.recording
        if self._recording is None and recording is not None and recording.enabled:
            from .recording import EndpointRecording  # telemetry loads only where a config records

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
