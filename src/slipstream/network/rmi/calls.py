"""One connection's remote objects as the connection machine composes them: the RMI endpoint, the
files of its calls, and the host calls handed to the adapter while they run.

The connection machine routes RMI frames and RMI-marked file streams here and takes frames and events
back after each input, so frames keep the order of the calls that made them and its one
``deadline_ns`` covers the calls' timeouts. A host call comes out as :class:`RmiRequestReceived`; the
adapter takes it with :meth:`RemoteCalls.invocation`, runs it, and answers with
:meth:`RemoteCalls.complete` or :meth:`RemoteCalls.fail`. A call whose caller went away
(:meth:`RemoteCalls.abandon`) has its outcome dropped and a result file removed. A request that
finds the connection's :class:`~..limits.Workload` full (``max_pending_calls`` tasks) is refused unrun,
before its arguments are decoded (BUSY); a call of an ``async def`` method is counted as it arrives (its
task ends it), so the calls of one record cannot run past the limit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..events import RmiCallCompleted, RmiCallFailed, RmiEvent, RmiRequestReceived
from ..frames import RMI_RESPONSE
from ..limits import Workload
from ..streaming import Streams
from .endpoint import RmiEndpoint
from .files import RmiFiles
from .invocation import Invocation
from .wire import FileRef, OutFrame

__all__ = ["RemoteCalls"]


class RemoteCalls:
    """The endpoint, its files and the running host calls (see the module)."""

    def __init__(self, endpoint: RmiEndpoint, streams: Streams | None = None, work: Workload | None = None) -> None:
        self.endpoint = endpoint
        self.work = work if work is not None else Workload()
        """Async calls and listener tasks running (the adapter counts them), against ``max_pending_calls``."""
        self.files = RmiFiles(streams) if streams is not None else None
        """Files of calls (None without streams: ``Path`` arguments and results are refused)."""
        self.objects_travel = bool(endpoint.registry.interfaces)
        """Whether a message may be a remote object (some interface is registered)."""
        self._running: dict[int, Invocation] = {}
        self._last_invocation = 0
        self._abandoned: set[int] = set()
        self._async: dict[Callable[..., Any], bool] = {}
        self._events: list[RmiEvent | RmiRequestReceived] = []

    # -- outputs ----------------------------------------------------------------------------------

    def take_output(self) -> tuple[list[OutFrame], list[RmiEvent | RmiRequestReceived]]:
        """Frames to send, in the order of the calls and answers that made them, and the events since the
        last call (call outcomes, host calls to run, objects received). Called after every input and call,
        so the common case (nothing, or one frame) costs no more than a look: the endpoint's frames are
        taken as they are (all frames are the endpoint's), its events go through :meth:`_collect`."""
        endpoint, files = self.endpoint, self.files
        if endpoint.events or (files is not None and files.has_output):
            self._collect()
        frames, events = endpoint.frames, self._events
        if frames:
            endpoint.frames = []
        if events:
            self._events = []
        return frames, events

    @property
    def deadline_ns(self) -> int | None:
        """The earliest call timeout."""
        return self.endpoint.deadline_ns

    @property
    def running(self) -> int:
        """Host calls handed out and not yet answered."""
        return len(self._running)

    # -- inputs -----------------------------------------------------------------------------------

    def receive(self, kind: int, request_id: int, payload: bytes) -> None:
        """An RMI_REQUEST or RMI_RESPONSE frame (arrived whole or streamed)."""
        if kind == RMI_RESPONSE:
            self.endpoint.receive_response(request_id, payload)
            return
        if (work := self.work).full:
            work.refused += 1
            self.endpoint.refuse_busy(request_id, work.limit)
            return
        invocation = self.endpoint.receive_request(request_id, payload)
        if invocation is not None:
            if not invocation.files and self._is_async(invocation.function):
                if work.full:  # counted as it arrives: a record's calls cannot run past the limit
                    work.refused += 1
                    self.endpoint.refuse_busy(request_id, work.limit)
                    return
                work.started()
                invocation.counted = True
            self._last_invocation += 1
            invocation.invocation_id = self._last_invocation
            if invocation.files and self.files is not None:
                self.files.hold(invocation)
            else:
                self._run(invocation)

    def _is_async(self, function: Callable[..., Any]) -> bool:
        """Whether a host function runs as a task (``async def``), looked up once per function."""
        found = self._async.get(function)
        if found is None:
            found = self._async[function] = inspect.iscoroutinefunction(function)
        return found

    def handle_timer(self, now_ns: int) -> None:
        """Time out calls past their deadline."""
        self.endpoint.handle_timer(now_ns)

    def close(self, reason: str) -> None:
        """The connection closed: calls in flight fail, held and running host calls are forgotten."""
        self.endpoint.close(reason)
        if self.files is not None:
            self.files.close(reason)
        self._running.clear()

    def file_started(self, stream_id: int) -> None:
        """An incoming file stream marked for RMI was announced."""
        if self.files is not None:
            self.files.started(stream_id)

    def file_arrived(self, stream_id: int, path: str, size: int) -> bool:
        """A file stream completed: True when it is RMI's (then it is not a message)."""
        return self.files is not None and self.files.arrived(stream_id, path, size)

    def file_failed(self, stream_id: int, reason: str) -> None:
        """An incoming stream failed."""
        if self.files is not None:
            self.files.failed(stream_id, reason)

    # -- the caller's side ------------------------------------------------------------------------

    def abandon(self, call_id: int) -> None:
        """The caller of ``call_id`` went away: its outcome is dropped, a result file removed."""
        if self.endpoint.is_waiting(call_id):
            self._abandoned.add(call_id)
        elif self.files is not None:
            self.files.abandon(call_id)

    # -- the host's side --------------------------------------------------------------------------

    def invocation(self, invocation_id: int) -> Invocation:
        """The host call a :class:`RmiRequestReceived` names (KeyError once answered or closed)."""
        return self._running[invocation_id]

    def complete(self, invocation_id: int, result: object) -> None:
        """Answer a host call with its result (a no-op once answered or closed)."""
        invocation = self._running.pop(invocation_id, None)
        if invocation is not None:
            self.endpoint.complete(invocation, result)
            if invocation.files:
                self._answered(invocation_id)

    def fail(self, invocation_id: int, error: BaseException) -> None:
        """Answer a host call with the exception it raised."""
        invocation = self._running.pop(invocation_id, None)
        if invocation is not None:
            self.endpoint.fail(invocation, error)
            self._answered(invocation_id)

    def _answered(self, invocation_id: int) -> None:
        if self.files is not None:
            self.files.release(invocation_id)

    def _run(self, invocation: Invocation) -> None:
        self._running[invocation.invocation_id] = invocation
        self._events.append(RmiRequestReceived(invocation.invocation_id, invocation.object_id, invocation.method))

    def _collect(self) -> None:
        """Take in the endpoint's events and what the files have: a ``Path`` result waits for its file first,
        held calls whose files came are run, refused ones answered (their frames join the endpoint's)."""
        endpoint, files, abandoned = self.endpoint, self.files, self._abandoned
        while endpoint.events or (files is not None and files.has_output):
            outcomes: list[RmiEvent] = endpoint.take_events()
            if files is not None and files.has_output:
                for invocation in files.take_ready():
                    self._run(invocation)
                for invocation, error in files.take_refused():
                    endpoint.fail(invocation, error)
                outcomes += files.take_events()
            for event in outcomes:
                if abandoned and isinstance(event, (RmiCallCompleted, RmiCallFailed)) and event.call_id in abandoned:
                    abandoned.discard(event.call_id)
                    if isinstance(event, RmiCallCompleted) and type(event.value) is FileRef and files is not None:
                        files.discard(event.value.stream_id)
                elif files is not None and isinstance(event, RmiCallCompleted) and type(event.value) is FileRef:
                    files.await_result(event.call_id, event.value)
                else:
                    self._events.append(event)
