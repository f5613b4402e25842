"""Awaitable proxies over the sans-I/O RMI endpoint (:mod:`slipstream.network.rmi`).

The only asyncio in RMI: a call becomes a future resolved by the response event, one ``call_at``
timer follows the endpoint's ``deadline_ns``, and coroutine methods the host runs become tasks. Frames
go out through the ``transmit`` callable the connection supplies and come in through :meth:`receive`.

Files: a ``pathlib.Path`` argument or result is streamed as ``connection.send(Path)`` streams a file
(size and SHA-256 checked; ``files`` is the connection's side of it), and the call carries a
:class:`~slipstream.network.rmi.FileRef` naming the stream. The receiving connection hands such a
stream to :meth:`RmiSession.file_arrived`, never to its message listeners. Who owns the temporary
copy: for an *argument*, the host's method gets a ``Path`` to it and RMI removes it as soon as the
call has completed or failed (a coroutine method: when it finished), so a method that wants to keep
the file copies or moves it; for a *result*, the caller gets the ``Path`` and owns the file from then
on (it is not removed for it, not even when the connection closes); if the call fails or the awaiting
caller went away before the file arrived, RMI removes it. The call's timeout covers the transfer of
its arguments (the response comes after the method ran) but not of a file result, which is bounded by
the stream's idle timeout instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..frames import FrameKind
from ..rmi import (
    DEFAULT_TIMEOUT_NS,
    FILE_STREAM_MARK,
    FileRef,
    Invocation,
    MethodSpec,
    OutFrame,
    ProxyBase,
    RemoteError,
    RemoteRef,
    RmiCallCompleted,
    RmiCallFailed,
    RmiEndpoint,
    RmiObjectReceived,
    RmiOnewayFailed,
    _either,
    exception_from,
)
from ..streaming import StreamingError

if TYPE_CHECKING:
    from ..connection import ConnectionMachine

__all__ = ["MachineFiles", "Proxy", "RmiSession"]

log = logging.getLogger("slipstream.network")

T = TypeVar("T")

_UNCLAIMED_FILES = 64
"""Files that arrived for calls not (yet) seen, kept at most; the oldest beyond are removed."""
_FILE_WAITERS = 1024
"""Calls waiting at once for a file argument's or result's stream; more fail at once."""
_FAILED_REMEMBERED = 256
"""Incoming streams that failed (or were dropped), remembered so a call naming one fails at once."""


class _Done:
    """What a fire-and-forget call returns: awaiting it is optional and yields None at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return None
        yield  # pragma: no cover - makes this a generator


_DONE = _Done()


class _RemoteMethod:
    """``proxy.method``: calling it sends the request; awaiting the result waits for the response."""

    __slots__ = ("_proxy", "_spec")

    def __init__(self, proxy: Proxy, spec: MethodSpec) -> None:
        self._proxy = proxy
        self._spec = spec

    def __call__(self, *args: object, **kwargs: object) -> Awaitable[Any]:
        proxy = self._proxy
        session: RmiSession = object.__getattribute__(proxy, "_rmi_session")
        ref: RemoteRef = object.__getattribute__(proxy, "_rmi_ref")
        if object.__getattribute__(proxy, "_rmi_oneway"):
            session.call_oneway(ref, self._spec, args, kwargs)  # never raises: failures go to on_error
            return _DONE
        values = self._spec.bind(args, kwargs)
        return session.call(ref, self._spec, values, object.__getattribute__(proxy, "_rmi_timeout_ns"))


class Proxy(ProxyBase):
    """A remote object: ``await proxy.method(args)`` calls it on the side that hosts it.

    Only the interface's methods exist on a proxy (anything else is an AttributeError here and could
    not be called remotely anyway). ``rmi_timeout`` (seconds, default 3, 0 = forever) bounds each call;
    :meth:`rmi_async` gives a fire-and-forget twin whose calls send no reply and never raise.
    """

    __slots__ = ("_rmi_oneway", "_rmi_session", "_rmi_spec", "_rmi_timeout_ns")

    def __init__(
        self, session: RmiSession, ref: RemoteRef, *, oneway: bool = False, timeout_ns: int = DEFAULT_TIMEOUT_NS
    ) -> None:
        super().__init__(session.endpoint, ref)
        object.__setattr__(self, "_rmi_session", session)
        object.__setattr__(self, "_rmi_spec", session.endpoint.registry.interfaces[ref.interface_id])
        object.__setattr__(self, "_rmi_oneway", oneway)
        object.__setattr__(self, "_rmi_timeout_ns", timeout_ns)

    def __getattr__(self, name: str) -> _RemoteMethod:
        spec = object.__getattribute__(self, "_rmi_spec")
        method = spec.by_name.get(name)
        if method is None:
            raise AttributeError(f"{spec.name} has no remote method {name!r}")
        return _RemoteMethod(self, method)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "rmi_timeout":
            Proxy.rmi_timeout.__set__(self, value)  # type: ignore[attr-defined]
            return
        raise AttributeError(f"a proxy has no attribute {name!r} to set")

    @property
    def rmi_ref(self) -> RemoteRef:
        """Which remote object this proxy calls."""
        ref: RemoteRef = object.__getattribute__(self, "_rmi_ref")
        return ref

    @property
    def rmi_timeout(self) -> float:
        """Seconds each call waits for its response (0 = forever)."""
        return float(object.__getattribute__(self, "_rmi_timeout_ns")) / 1e9

    @rmi_timeout.setter
    def rmi_timeout(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"rmi_timeout must not be negative: {seconds}")
        object.__setattr__(self, "_rmi_timeout_ns", int(seconds * 1e9))

    def rmi_async(self) -> Proxy:
        """A fire-and-forget twin of this proxy (same object, calls get no reply)."""
        return Proxy(
            object.__getattribute__(self, "_rmi_session"),
            self.rmi_ref,
            oneway=True,
            timeout_ns=object.__getattribute__(self, "_rmi_timeout_ns"),
        )

    def rmi_sync(self) -> Proxy:
        """A twin whose calls wait for their results (the default mode)."""
        return Proxy(
            object.__getattribute__(self, "_rmi_session"),
            self.rmi_ref,
            oneway=False,
            timeout_ns=object.__getattribute__(self, "_rmi_timeout_ns"),
        )

    def __repr__(self) -> str:
        spec = object.__getattribute__(self, "_rmi_spec")
        ref = self.rmi_ref
        return f"<proxy {spec.name}:{'global:' if ref.is_global else ''}{ref.object_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Proxy) and self.rmi_ref == other.rmi_ref

    def __hash__(self) -> int:
        return hash(self.rmi_ref)


class MachineFiles:
    """The connection's side of ``Path`` arguments and results: files streamed on its machine as
    MESSAGE-kind file streams marked :data:`~slipstream.network.rmi.FILE_STREAM_MARK`."""

    def __init__(self, machine: ConnectionMachine, after_append: Callable[[], None]) -> None:
        self._machine = machine
        self._after_append = after_append

    def send(self, path: os.PathLike[str]) -> FileRef:
        stream_id = self._machine.send_file(path, kind=FrameKind.MESSAGE, request_id=FILE_STREAM_MARK)
        streams = self._machine.streams
        progress = streams.progress(stream_id, incoming=False) if streams is not None else None
        self._after_append()
        return FileRef(stream_id, progress[1] if progress is not None else 0, Path(path).name)

    def abort(self, stream_id: int) -> None:
        streams = self._machine.streams
        if streams is not None:
            streams.abort(stream_id, "the call carrying this file was not sent")
            self._after_append()

    def release(self, stream_id: int, *, keep: bool = False) -> None:
        """Remove the temporary copy of an incoming file stream, or with ``keep`` hand it to the
        application (then nothing removes it)."""
        streams = self._machine.streams
        if keep and streams is not None:
            streams.detach(stream_id)
        else:
            self._machine.release_stream(stream_id)


class RmiSession:
    """One connection's RMI for asyncio users: proxies, remote construction, the host's task runner.

    ``transmit(frames)`` hands ``(kind, request id, payload)`` frames to the connection; the connection
    feeds RMI frames back with :meth:`receive` and calls :meth:`close` when it closes. ``caller`` is
    what implementation methods that declare the calling connection receive. Exceptions of
    fire-and-forget calls this side hosts, and fire-and-forget calls that could not be sent (wrong
    arguments, unencodable values, a closed connection, an unreadable file), go to ``on_error``:
    a fire-and-forget call never raises. Remote objects the peer sends as messages go to
    ``on_object`` (the connection dispatches them to its message listeners). ``files`` streams
    ``Path`` arguments and results (:class:`MachineFiles`); without it they are refused.
    """

    def __init__(
        self,
        endpoint: RmiEndpoint,
        transmit: Callable[[list[OutFrame]], None],
        *,
        caller: object = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_object: Callable[[object], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        default_timeout: float = DEFAULT_TIMEOUT_NS / 1e9,
        files: MachineFiles | None = None,
    ) -> None:
        if default_timeout < 0:
            raise ValueError(f"default_timeout must not be negative: {default_timeout}")
        self.endpoint = endpoint
        endpoint.proxy_factory = self._proxy
        self._transmit = transmit
        self.caller = caller
        self.on_error = on_error
        self.on_object = on_object
        self._clock = clock
        self.default_timeout_ns = int(default_timeout * 1e9)
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self.files = files
        endpoint.files = files
        self._file_streams: set[int] = set()
        """Incoming streams marked as RMI files, not yet complete."""
        self._files_arrived: OrderedDict[int, str] = OrderedDict()
        """Files that arrived before the call or response naming them (stream id -> temporary copy)."""
        self._files_failed: OrderedDict[int, str] = OrderedDict()
        self._file_waiters: dict[int, tuple[asyncio.Future[str], FileRef]] = {}
        self._files_unwanted: set[int] = set()
        """Streams whose call gave up on them: removed when they arrive."""

    # -- the user's API -----------------------------------------------------------------------------

    def _proxy(self, ref: RemoteRef) -> Proxy:
        return Proxy(self, ref, timeout_ns=self.default_timeout_ns)

    def get(self, interface: type[T], id: int | None = None, *, object_id: int | None = None) -> T:
        """A proxy of the peer's connection-scoped object ``id`` (existence is not checked;
        ``object_id=`` is the older name of ``id``)."""
        spec = self.endpoint.registry.interface(interface)
        return cast(T, self._proxy(RemoteRef(spec.interface_id, _either(id, object_id, "get"), False)))

    def get_global(self, interface: type[T], id: int | None = None, *, object_id: int | None = None) -> T:
        """A proxy of the peer's global object ``id`` (existence is not checked; ``object_id=`` is
        the older name of ``id``)."""
        spec = self.endpoint.registry.interface(interface)
        return cast(T, self._proxy(RemoteRef(spec.interface_id, _either(id, object_id, "get_global"), True)))

    async def create(self, interface: type[T], *args: object, timeout: float | None = None) -> T:
        """Have the peer construct its implementation of ``interface``; returns a proxy of it."""
        timeout_ns = self.default_timeout_ns if timeout is None else _seconds(timeout)
        call_id = self.endpoint.create(interface, args, self._clock(), timeout_ns=timeout_ns)
        return cast(T, await self._wait(call_id))

    def save(self, obj: object, id: int | None = None, *, object_id: int | None = None) -> int:
        """Host ``obj`` for this connection's peer under ``id`` (default: the next free one); returns
        its id (``object_id=`` is the older name of ``id``)."""
        return self.endpoint.objects.save(obj, id, object_id=object_id)

    def delete(self, id: object = None, *, obj_or_id: object = None) -> bool:
        """Stop hosting an object (by ``id`` or the object itself) for this connection; the peer's
        calls on it then fail with RemoteObjectMissing (``obj_or_id=`` is the older name of ``id``)."""
        return self.endpoint.objects.delete(id, obj_or_id=obj_or_id)

    def send_object(self, value: object) -> None:
        """Send a proxy or a registered implementation as a message (the peer's ``on_object`` gets its
        own object back, or a proxy)."""
        self.endpoint.send_object(value)
        self._pump()

    # -- calls ----------------------------------------------------------------------------------------

    def call(self, ref: RemoteRef, spec: MethodSpec, args: tuple[object, ...], timeout_ns: int) -> Awaitable[Any]:
        """Send the request now; the returned awaitable resolves with the response."""
        call_id = self.endpoint.call(ref, spec, args, self._clock(), timeout_ns=timeout_ns)
        return self._wait(call_id)

    def call_oneway(
        self,
        ref: RemoteRef,
        spec: MethodSpec,
        args: tuple[object, ...] | list[object],
        kwargs: dict[str, object] | None = None,
    ) -> None:
        """Send a fire-and-forget request. It never raises: arguments that do not fit the method or
        cannot be encoded, a closed connection or an unreadable file are reported to ``on_error``."""
        try:
            values = spec.bind(args, kwargs)
            self.endpoint.call(ref, spec, values, 0, oneway=True)
        except Exception as exc:
            self._report(exc)
            return
        self._pump()

    def _report(self, error: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(error)
        else:
            log.warning("RMI (no on_error): %s", error)

    def _wait(self, call_id: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[call_id] = future
        self._pump()
        return future

    # -- plumbing -------------------------------------------------------------------------------------

    def receive(self, kind: int, request_id: int, payload: bytes) -> None:
        """An RMI frame from the connection."""
        if kind == FrameKind.RMI_RESPONSE:
            self.endpoint.receive_response(request_id, payload)
        elif kind == FrameKind.RMI_REQUEST:
            invocation = self.endpoint.receive_request(request_id, payload, self.caller)
            if invocation is not None:
                if invocation.files:
                    self._spawn(self._run_with_files(invocation))
                else:
                    awaitable = self.endpoint.execute(invocation)
                    if awaitable is not None:
                        self._spawn(self._run(invocation, awaitable))
        self._pump()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def receive_frames(self, frames: list[OutFrame]) -> None:
        """Several RMI frames (the in-memory pair's path)."""
        for kind, request_id, payload in frames:
            self.receive(kind, request_id, payload)

    async def _run(self, invocation: Invocation, awaitable: Awaitable[Any]) -> None:
        try:
            result = await awaitable
        except Exception as exc:
            self.endpoint.fail(invocation, exc)
        else:
            self.endpoint.complete(invocation, result)
        self._pump()

    async def _run_with_files(self, invocation: Invocation) -> None:
        """Wait for the call's file arguments, run it with their temporary copies, then remove them."""
        waiting = [ref.stream_id for _, ref in invocation.files]
        claimed: list[int] = []
        try:
            args = list(invocation.args)
            for position, ref in invocation.files:
                path = await self._file(ref)
                waiting.remove(ref.stream_id)
                claimed.append(ref.stream_id)
                args[position] = Path(path)
            invocation.args = tuple(args)
            awaitable = self.endpoint.execute(invocation)
            if awaitable is not None:
                await self._run(invocation, awaitable)
        except StreamingError as exc:
            self.endpoint.fail(invocation, exc)
        finally:
            for stream_id in claimed:
                self._release(stream_id)
            for stream_id in waiting:  # the call gave up on these: remove each when it arrives
                self._abandon(stream_id)
        self._pump()

    # -- files ----------------------------------------------------------------------------------------

    def _release(self, stream_id: int, *, keep: bool = False) -> None:
        if self.files is not None:
            self.files.release(stream_id, keep=keep)

    def _abandon(self, stream_id: int) -> None:
        waiter = self._file_waiters.pop(stream_id, None)
        if waiter is not None and not waiter[0].done():
            waiter[0].cancel()
        path = self._files_arrived.pop(stream_id, None)
        if path is not None:
            self._release(stream_id)
        elif stream_id not in self._files_failed:
            self._files_unwanted.add(stream_id)

    def _remember_failure(self, stream_id: int, reason: str) -> None:
        self._files_failed[stream_id] = reason
        while len(self._files_failed) > _FAILED_REMEMBERED:
            self._files_failed.popitem(last=False)

    def _file(self, ref: FileRef) -> asyncio.Future[str]:
        """The temporary copy of the file ``ref`` names, once its stream has arrived whole."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stream_id = ref.stream_id
        path = self._files_arrived.pop(stream_id, None)
        if path is not None:
            self._resolve(future, ref, path)
        elif stream_id in self._files_failed:
            future.set_exception(StreamingError(f"file {ref.name!r} did not arrive: {self._files_failed[stream_id]}"))
        elif self.endpoint.closed:
            future.set_exception(StreamingError(f"file {ref.name!r} did not arrive: {self.endpoint.close_reason}"))
        elif stream_id in self._file_waiters or len(self._file_waiters) >= _FILE_WAITERS:
            future.set_exception(StreamingError(f"file {ref.name!r}: too many calls wait for files"))
        else:
            self._file_waiters[stream_id] = (future, ref)
        return future

    def _resolve(self, future: asyncio.Future[str], ref: FileRef, path: str) -> None:
        """The stream checked size and SHA-256 against what the sender streamed; this checks the size
        against what the call announced, then hands the copy over."""
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            size = -1
            reason = str(exc)
        else:
            reason = f"{size} bytes arrived, the call announced {ref.size}"
        if size != ref.size:
            self._release(ref.stream_id)
            future.set_exception(StreamingError(f"file {ref.name!r}: {reason}"))
        else:
            future.set_result(path)

    def file_started(self, stream_id: int) -> None:
        """The connection saw an incoming file stream marked for RMI start."""
        self._file_streams.add(stream_id)

    def file_arrived(self, stream_id: int, path: object) -> bool:
        """A file stream completed: True when it carries an RMI file (then RMI owns the temporary copy
        and the connection must not dispatch it as a message)."""
        if stream_id not in self._file_streams:
            return False
        self._file_streams.discard(stream_id)
        if stream_id in self._files_unwanted:
            self._files_unwanted.discard(stream_id)
            self._release(stream_id)
            return True
        waiter = self._file_waiters.pop(stream_id, None)
        if waiter is not None and not waiter[0].done():
            self._resolve(waiter[0], waiter[1], os.fspath(cast(Path, path)))
            return True
        self._files_arrived[stream_id] = os.fspath(cast(Path, path))
        while len(self._files_arrived) > _UNCLAIMED_FILES:
            oldest, _ = self._files_arrived.popitem(last=False)
            self._release(oldest)
            self._remember_failure(oldest, "removed unclaimed (too many files arrived for no call)")
        return True

    def file_failed(self, stream_id: int, reason: str) -> None:
        """An incoming stream failed (any: one refused at its start was never marked)."""
        self._file_streams.discard(stream_id)
        self._files_unwanted.discard(stream_id)
        waiter = self._file_waiters.pop(stream_id, None)
        if waiter is not None and not waiter[0].done():
            waiter[0].set_exception(StreamingError(f"a file did not arrive: {reason}"))
        else:
            self._remember_failure(stream_id, reason)

    def _deliver_file(self, call: asyncio.Future[Any], ref: FileRef) -> None:
        """A ``Path`` result: the call completes with the file once its stream arrived (the caller owns it)."""
        arriving = self._file(ref)

        def done(_: asyncio.Future[str]) -> None:
            if arriving.cancelled():
                if not call.done():
                    call.set_exception(StreamingError(f"file {ref.name!r} did not arrive"))
                return
            error = arriving.exception()
            if error is not None:
                if not call.done():
                    call.set_exception(error)
                return
            if call.done():  # the caller went away: nobody owns the file
                self._release(ref.stream_id)
                return
            self._release(ref.stream_id, keep=True)
            call.set_result(Path(arriving.result()))

        arriving.add_done_callback(done)

    def close(self, reason: str = "connection closed") -> None:
        """The connection closed: calls in flight fail now, host tasks are cancelled (temporary copies
        of files are removed with the connection's streams)."""
        self.endpoint.close(reason)
        for task in list(self._tasks):
            task.cancel()
        waiters, self._file_waiters = self._file_waiters, {}
        for waiter, _ in waiters.values():
            if not waiter.done():
                waiter.set_exception(StreamingError(f"a file did not arrive: {reason}"))
        for stream_id in list(self._files_arrived):
            self._release(stream_id)
        self._files_arrived.clear()
        self._file_streams.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pump()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.endpoint.handle_timer(self._clock())
        self._pump()

    def _pump(self) -> None:
        endpoint = self.endpoint
        if not endpoint.has_output and (self._timer is not None or not endpoint.in_flight):
            return
        frames = endpoint.take_frames()
        if frames:
            self._transmit(frames)
        for event in endpoint.take_events():
            if isinstance(event, RmiCallCompleted):
                future = self._futures.pop(event.call_id, None)
                if future is not None and not future.done():
                    if type(event.value) is FileRef:
                        self._deliver_file(future, event.value)
                    else:
                        future.set_result(event.value)
                elif type(event.value) is FileRef:
                    self._abandon(event.value.stream_id)
            elif isinstance(event, RmiCallFailed):
                future = self._futures.pop(event.call_id, None)
                if future is not None and not future.done():
                    future.set_exception(exception_from(event, endpoint.registry))
            elif isinstance(event, RmiObjectReceived):
                if self.on_object is not None:
                    self.on_object(event.value)
            elif isinstance(event, RmiOnewayFailed):
                self._report(RemoteError(event.type_name, f"{event.method}: {event.message}", event.traceback_text))
        # One timer, moved only when a deadline comes earlier than the one it waits for: each call's
        # deadline is later than those before it, so a stream of calls leaves it alone, and a timer
        # that fires with nothing due just re-arms for the next deadline (or none).
        deadline = endpoint.deadline_ns
        if deadline is not None and (self._timer is None or self._timer_at is None or deadline < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + max(0, deadline - self._clock()) / 1e9, self._on_timer)


def _seconds(timeout: float) -> int:
    if timeout < 0:
        raise ValueError(f"timeout must not be negative: {timeout}")
    return int(timeout * 1e9)
