"""``Endpoint`` for asyncio, the base of ``Server`` and ``Client``: :class:`~..running.RunningEndpoint`
with coroutine listeners run as tasks, a place in the loop's poller and awaited retries after a fault."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..config import ClientConfig, ServerConfig
from ..errors import NetworkError
from ..running import CLOSE_GRACE_S, RETRYABLE, RunningEndpoint
from ..streamfiles import StreamFiles, ThreadedStreamFiles, shared_stream_files
from .connection import Connection
from .poller import PollGroup
from .transport import release_context_drained

__all__ = ["CANCEL_GRACE_S", "CLOSE_GRACE_S", "Endpoint"]

log = logging.getLogger("slipstream.network")

CANCEL_GRACE_S = 1.0
"""How long ``close`` waits for the listeners it cancelled to unwind (their ``finally`` blocks)."""


class Endpoint(RunningEndpoint[Connection]):
    """Base of Server and Client: the machinery behind the listeners, on the event loop."""

    def __init__(self, config: ServerConfig | ClientConfig) -> None:
        super().__init__(config)
        self._closings: set[asyncio.Task[None]] = set()
        self._group: PollGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        """Listener tasks: ``close`` lets them finish, for a while."""
        self._helpers: set[asyncio.Task[None]] = set()
        """Our own tasks (round-trip probes, acknowledgements that wait for listeners): ``close`` cancels
        them at once."""
        self._files: ThreadedStreamFiles | None = None
        """The loop's stream-file worker, from the first connection until ``close``."""

    # -- running listeners ------------------------------------------------------------------------

    def _spawn(self, awaitable: Awaitable[Any], *, helper: bool = False) -> asyncio.Task[Any]:
        """A task for a listener (``helper``: for our own work around them; see ``close``)."""
        task = asyncio.ensure_future(awaitable)
        tasks = self._helpers if helper else self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    def _awaited(self, connection: Any, awaitable: Any) -> asyncio.Task[Any]:
        task = self._spawn(self._guard(connection, awaitable))
        if connection is not None:
            connection.track(task)
        return task

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

    def _awaited_quietly(self, awaitable: Any) -> None:
        self._spawn(self._quiet(awaitable))

    def _after(self, handles: Sequence[Any], then: Callable[[], None]) -> None:
        async def wait() -> None:
            await asyncio.gather(*handles, return_exceptions=True)
            then()

        self._spawn(wait(), helper=True)

    def _probe_rtt(self, connection: Connection, interval_s: float) -> None:
        """Ping ``connection`` every ``interval_s`` while it is up (``RecordingConfig.rtt_interval_s``): each
        pong is an RTT sample the recording writes; a ping that times out or meets the close is none."""

        async def probe() -> None:
            while not connection.is_closed:
                await asyncio.sleep(interval_s)
                with contextlib.suppress(NetworkError):
                    await connection.ping(timeout=max(1.0, 4 * interval_s))

        self._spawn(probe(), helper=True)

    def _connection_class(self) -> type[Connection]:
        return self.config.connection_class or Connection  # (a subclass: checked by the config)

    def _stream_files(self) -> StreamFiles:
        if self._files is None:  # one worker per loop; it wakes the poller from its thread
            loop = asyncio.get_running_loop()

            def wake() -> None:
                loop.call_soon_threadsafe(PollGroup.for_loop(loop).backoff.kick)

            self._files = shared_stream_files.acquire(loop, wake)
        return self._files

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

    def wake(self) -> None:
        """Make the poller run its next cycle now (new work arrived from the application)."""
        if self._group is not None:
            self._group.backoff.kick()

    async def _retry(self, attempt: Callable[[], Awaitable[object]], max_delay_s: float) -> bool:
        """``attempt`` after a fault, as :meth:`~..running.RunningEndpoint._retries` paces it; whether one worked."""
        retries = self._retries(max_delay_s)
        failure: BaseException | None = None
        try:
            while True:
                wait = retries.send(failure)
                failure = None
                if wait is not None:
                    await asyncio.sleep(wait)
                    continue
                try:
                    await attempt()
                except RETRYABLE as exc:
                    failure = exc
        except StopIteration as stop:
            worked: bool = stop.value
            return worked

    # -- the driver context and the poller --------------------------------------------------------

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
        """After the connections were released: let the listeners still running finish (an async
        ``on_disconnect`` the close itself started is a user's cleanup), for up to ``close_timeout``
        while polling goes on; then :meth:`_stop_poller_now`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.close_timeout
        me = asyncio.current_task()  # (a listener that closes its own endpoint is not waited for)
        while (running := [task for task in self._tasks if task is not me and not task.done()]) and (
            left := deadline - loop.time()
        ) > 0:
            await asyncio.wait(running, timeout=left)
        if cancelled := self._stop_poller_now():
            await asyncio.wait(cancelled, timeout=CANCEL_GRACE_S)  # (their ``finally`` runs before we return)

    def _stop_poller_now(self) -> list[asyncio.Task[Any]]:
        """Stop polling and cancel what still runs: listeners, our helpers, connections still closing (a
        close cancelled midway ends here too); the file worker of streamed messages goes when no other
        endpoint of the loop uses it. Idempotent; the tasks it cancelled."""
        self._closing = True
        if self._files is not None:
            self._files = None
            shared_stream_files.release(asyncio.get_running_loop())
        self._stop_polling()
        me = asyncio.current_task()  # (a listener that closes its endpoint: not cancelled by that close)
        cancelled: list[asyncio.Task[Any]] = []
        for pending in (*self._tasks, *self._helpers, *self._closings):
            if pending is not me and pending.cancel():
                cancelled.append(pending)
        self._tasks.clear()
        self._helpers.clear()
        self._closings.clear()
        return cancelled
