"""``Endpoint`` for blocking code, the base of ``Server`` and ``Client``: :class:`~..running.RunningEndpoint`
polled by the process's poll thread (:mod:`.poller`), its finished connections' streams released step by
step in its duty cycle, and retries after a fault in a thread of their own."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import ClientConfig, ServerConfig
from ..running import CLOSE_GRACE_S, RETRYABLE, RunningEndpoint
from ..streamfiles import StreamFiles, ThreadedStreamFiles, shared_stream_files
from ..transport import BUSY_CADENCE_NS, DRAIN_STEP_S, earliest, shared_contexts
from .connection import Connection
from .poller import PollThread

__all__ = ["CLOSE_GRACE_S", "Endpoint"]


log = logging.getLogger("slipstream.network")

_CLOSER_MARGIN_S = 10.0
"""Beyond twice the close timeout (settling, then the closings), how long ``close`` waits for a close another
thread runs (its driver's drain included) before it returns."""


@dataclass(slots=True)
class _Closing:
    """A finished connection whose streams are released once its last records left (``release_step``)."""

    connection: Connection
    deadline_ns: int
    then: Callable[[], None] | None
    grace_until_ns: int | None = None


class Endpoint(RunningEndpoint[Connection]):
    """Base of Server and Client: the machinery behind the listeners, run by the process's poll thread.
    ``busy_poll``: spin instead of parking when idle, and have a caller waiting for an answer run the
    cycles until it is in (the lowest latency, a core each for the poll thread and the caller)."""

    def __init__(self, config: ServerConfig | ClientConfig, *, busy_poll: bool = False) -> None:
        if config.connection_class is not None and not issubclass(config.connection_class, Connection):
            raise TypeError(
                f"connection_class must subclass slipstream.network.sync.Connection here: {config.connection_class!r}"
            )
        super().__init__(config)
        self.busy_poll = busy_poll
        self.poller = PollThread.shared()
        self.lock = self.poller.lock
        """Held while this endpoint's machines are driven (shared by every blocking endpoint of the process)."""
        self._files: ThreadedStreamFiles | None = None
        self._closings: list[_Closing] = []
        self._probes: dict[int, tuple[Connection, int, int]] = {}
        """RTT probes by connection id: (connection, interval, when the next ping goes)."""
        self._retry_threads: list[threading.Thread] = []
        self._closing_thread: threading.Thread | None = None
        """The thread that runs ``close`` (the caller's, or one of its own for a listener: see
        :meth:`_close_elsewhere`)."""
        self._close_claim = threading.Lock()
        self._close_running = False
        """Whether the closing thread began ``close`` (a call of its own after that is a listener's, inside it)."""
        self._close_done = threading.Event()
        """Set when ``close`` has finished (however it ended)."""

    # -- waiting --------------------------------------------------------------------------------------

    def drive(self, done: Callable[[], bool], block: Callable[[float], object], deadline_ns: int | None) -> bool:
        """Run the cycles in the calling thread until ``done()`` (True) or ``deadline_ns`` (False); see
        :meth:`~.poller.PollThread.drive`."""
        return self.poller.drive(done, block, deadline_ns, busy=self.busy_poll)

    # -- running listeners ------------------------------------------------------------------------

    def _awaited(self, connection: Connection | None, awaitable: Any) -> None:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # (never awaited: no "coroutine was never awaited" warning)
        self.report_error(connection, TypeError("a listener of the blocking API must be a plain function, not async"))

    def _awaited_quietly(self, awaitable: Any) -> None:
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        log.error("an on_error listener of the blocking API must be a plain function, not async")

    def _after(self, handles: Sequence[Any], then: Callable[[], None]) -> None:
        then()  # (nothing runs on: listeners here are plain functions)

    def _unclaimed(self, connection: Connection, message: object) -> bool:
        return connection.keep(message)

    def _probe_rtt(self, connection: Connection, interval_s: float) -> None:
        interval_ns = int(interval_s * 1e9)
        self._probes[connection.id] = (connection, interval_ns, time.monotonic_ns() + interval_ns)

    def _run_probes(self, now_ns: int) -> None:
        """Ping each probed connection whose interval passed (the pong is an RTT sample the recording writes)."""
        for connection_id, (connection, interval_ns, due_ns) in list(self._probes.items()):
            if connection.is_closed:
                del self._probes[connection_id]
            elif now_ns >= due_ns:
                self._probes[connection_id] = (connection, interval_ns, now_ns + interval_ns)
                timeout = max(1.0, 4 * interval_ns / 1e9)
                connection.machine.ping(now_ns, int(timeout * 1e9))
                connection.flush()

    def _connection_class(self) -> type[Connection]:
        return self.config.connection_class or Connection

    def _stream_files(self) -> StreamFiles:
        if self._files is None:  # one worker per poll thread; it wakes the poller from its thread
            self._files = shared_stream_files.acquire(self.poller, self.poller.kick)
        return self._files

    # -- finished connections ---------------------------------------------------------------------------

    def _close_streams_later(self, connection: Connection, then: Callable[[], None] | None = None) -> None:
        deadline_ns = time.monotonic_ns() + int(self.config.close_timeout * 1e9)
        self._closings.append(_Closing(connection, deadline_ns, then))
        self.wake()

    def _release_closings(self, now_ns: int) -> int:
        """One step of each finished connection's release; the work done."""
        work = 0
        for closing in list(self._closings):
            if closing.grace_until_ns is None:
                if closing.connection.release_step(closing.deadline_ns, now_ns):
                    closing.grace_until_ns = now_ns + int(CLOSE_GRACE_S * 1e9)
            elif now_ns >= closing.grace_until_ns:
                self._closings.remove(closing)
                closing.connection.release_now()
                if closing.then is not None:
                    closing.then()
                work += 1
        return work

    def _close_elsewhere(self, close: Callable[[], None]) -> bool:
        """For ``close`` (the endpoint's): False when the calling thread is to run it, True when this call has
        nothing more to do. One thread runs a close: the first caller's, or, for a listener (on the thread that
        cycles, which cannot wait for the cycles a close waits for), a thread of its own that goes on once the
        listener returns. A listener called during a close returns at once; another thread waits for the close
        to finish (bounded: twice the close timeout and a margin)."""
        current = threading.current_thread()
        cycling = self.poller.cycling
        with self._close_claim:
            closing = self._closing_thread
            if closing is None:
                if not cycling:
                    self._closing_thread, self._close_running = current, True
                    return False
                closing = self._closing_thread = threading.Thread(
                    target=close, name="slipstream-network-close", daemon=False
                )  # (not a daemon: an interpreter that exits right after waits for the peers to hear CLOSE)
                closing.start()
                return True
            if closing is current:  # the thread started for a listener begins; a listener inside a close returns
                began, self._close_running = self._close_running, True
                return began
        if not cycling:
            self._close_done.wait(2 * self.config.close_timeout + _CLOSER_MARGIN_S)
        return True

    def _wait_closings(self) -> None:
        """Let every connection that is closing finish (bounded by the close timeout)."""
        deadline_ns = time.monotonic_ns() + int((self.config.close_timeout + 1.0) * 1e9)
        self.drive(lambda: not self._closings, lambda seconds: time.sleep(min(seconds, 0.005)), deadline_ns)

    # -- for connections and the poller -----------------------------------------------------------

    def duty_cycle(self, now_ns: int) -> int:
        work = super().duty_cycle(now_ns)
        if self._closings:
            work += self._release_closings(now_ns)
        if self._probes:
            self._run_probes(now_ns)
        return work

    def next_deadline_ns(self, now_ns: int) -> int | None:
        due = super().next_deadline_ns(now_ns)
        if self._closings:
            due = earliest((now_ns + BUSY_CADENCE_NS,), due)
        return earliest((due_ns for _, _, due_ns in self._probes.values()), due)

    def wake(self) -> None:
        """Make the poll thread run its next cycle now (new work, or a new timer)."""
        self.poller.kick()

    # -- after a fault --------------------------------------------------------------------------------

    def _retry_thread(
        self, attempt: Callable[[], object], max_delay_s: float, then: Callable[[bool], None]
    ) -> threading.Thread:
        """A thread (not started) that runs ``attempt`` after a fault, again and again
        (``recovery.RetryDelays``), until it works, the endpoint closes, or a refusal no attempt can change;
        ``then(worked)`` after, under the lock. Each failure goes to ``on_error``."""

        def retry() -> None:
            retries = self._retries(max_delay_s)
            failure: BaseException | None = None
            worked = False
            try:
                while True:
                    wait = retries.send(failure)
                    failure = None
                    if wait is not None:
                        time.sleep(wait)
                        continue
                    try:
                        attempt()
                    except RETRYABLE as exc:
                        failure = exc
            except StopIteration as stop:
                worked = stop.value
            finally:
                with self.lock:
                    then(worked)

        thread = threading.Thread(target=retry, name="slipstream-network-retry", daemon=True)
        self._retry_threads = [t for t in self._retry_threads if t.is_alive()] + [thread]
        return thread  # (started by the caller, once it has noted it: ``then`` may run at once)

    def _join_retries(self) -> None:
        """Wait (bounded) for retry threads to see ``_closing`` and stop."""
        for thread in self._retry_threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self.config.close_timeout + 1.0)
        self._retry_threads.clear()

    def _close_last(self) -> None:
        """The last steps of every close, however it ended (an exception in one of its waits included): the
        retry threads joined, the driver released (drained), the settings store closed."""
        self._join_retries()
        try:
            self._release_context_drained()
        finally:
            self.store.close()

    # -- the driver context and the poller --------------------------------------------------------

    def _release_context_drained(self) -> None:
        """``_release_context`` for ``close``: a driver that goes with us lets its closed publications
        finish first, the lock let go between steps."""
        if self._context is not None:
            context, self._context = self._context, None
            with self.lock:
                self._close_counters()
            try:
                if shared_contexts.is_last(context):
                    for _ in context.drain_steps():
                        with self.lock:
                            context.invoke()
                        time.sleep(DRAIN_STEP_S)
            finally:  # (interrupted while draining: released all the same, or the driver would outlive us)
                with self.lock:
                    shared_contexts.release(context)

    def _stop_polling(self) -> None:
        if self._polling:
            self._polling = False
            self.poller.remove(self)

    def _start_poller(self) -> None:
        if not self._polling:
            self._polling = True
            self._closing = False
            self.poller.add(self, busy=self.busy_poll)

    def _stop_poller(self) -> None:
        """Stop polling (after the connections were released); the file worker goes too when no other
        endpoint uses it."""
        self._closing = True
        if self._files is not None:
            self._files = None
            shared_stream_files.release(self.poller)
        self._stop_polling()
