"""Awaitable proxies over the sans-I/O RMI endpoint (:mod:`slipstream.network.rmi`).

The only asyncio in RMI: a call becomes a future resolved by the response event, one ``call_at``
timer follows the endpoint's ``deadline_ns``, and coroutine methods the host runs become tasks. Frames
go out through the ``transmit`` callable the connection supplies and come in through :meth:`receive`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

from ..frames import FrameKind
from ..rmi import (
    DEFAULT_TIMEOUT_NS,
    InterfaceError,
    Invocation,
    MethodSpec,
    OutFrame,
    ProxyBase,
    RemoteError,
    RemoteRef,
    RmiCallCompleted,
    RmiCallFailed,
    RmiEndpoint,
    RmiError,
    RmiObjectReceived,
    RmiOnewayFailed,
    exception_from,
)

__all__ = ["Proxy", "RmiSession"]

T = TypeVar("T")


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
        values = self._spec.bind(args, kwargs)
        if object.__getattribute__(proxy, "_rmi_oneway"):
            session.call_oneway(ref, self._spec, values)
            return _DONE
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


class RmiSession:
    """One connection's RMI for asyncio users: proxies, remote construction, the host's task runner.

    ``transmit(frames)`` hands ``(kind, request id, payload)`` frames to the connection; the connection
    feeds RMI frames back with :meth:`receive` and calls :meth:`close` when it closes. ``caller`` is
    what implementation methods that declare the calling connection receive. Exceptions of
    fire-and-forget calls this side hosts go to ``on_error``; remote objects the peer sends as messages
    go to ``on_object`` (the connection dispatches them to its message listeners).
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

    # -- the user's API -----------------------------------------------------------------------------

    def _proxy(self, ref: RemoteRef) -> Proxy:
        return Proxy(self, ref, timeout_ns=self.default_timeout_ns)

    def get(self, interface: type[T], object_id: int) -> T:
        """A proxy of the peer's connection-scoped object ``object_id`` (existence is not checked)."""
        spec = self.endpoint.registry.interface(interface)
        return cast(T, self._proxy(RemoteRef(spec.interface_id, object_id, False)))

    def get_global(self, interface: type[T], object_id: int) -> T:
        """A proxy of the peer's global object ``object_id`` (existence is not checked)."""
        spec = self.endpoint.registry.interface(interface)
        return cast(T, self._proxy(RemoteRef(spec.interface_id, object_id, True)))

    async def create(self, interface: type[T], *args: object, timeout: float | None = None) -> T:
        """Have the peer construct its implementation of ``interface``; returns a proxy of it."""
        timeout_ns = self.default_timeout_ns if timeout is None else _seconds(timeout)
        call_id = self.endpoint.create(interface, args, self._clock(), timeout_ns=timeout_ns)
        return cast(T, await self._wait(call_id))

    def save(self, obj: object, object_id: int | None = None) -> int:
        """Host ``obj`` for this connection's peer; returns its id."""
        return self.endpoint.objects.save(obj, object_id)

    def delete(self, obj_or_id: object) -> bool:
        """Stop hosting an object (by id or itself) for this connection."""
        return self.endpoint.objects.delete(obj_or_id)

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

    def call_oneway(self, ref: RemoteRef, spec: MethodSpec, args: tuple[object, ...]) -> None:
        """Send a fire-and-forget request; a closed connection or an unencodable argument is dropped."""
        try:
            self.endpoint.call(ref, spec, args, 0, oneway=True)
        except InterfaceError:
            raise
        except RmiError:
            return
        self._pump()

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
                awaitable = self.endpoint.execute(invocation)
                if awaitable is not None:
                    task = asyncio.get_running_loop().create_task(self._run(invocation, awaitable))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        self._pump()

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

    def close(self, reason: str = "connection closed") -> None:
        """The connection closed: calls in flight fail now, host tasks are cancelled."""
        self.endpoint.close(reason)
        for task in list(self._tasks):
            task.cancel()
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
                    future.set_result(event.value)
            elif isinstance(event, RmiCallFailed):
                future = self._futures.pop(event.call_id, None)
                if future is not None and not future.done():
                    future.set_exception(exception_from(event, endpoint.registry))
            elif isinstance(event, RmiObjectReceived):
                if self.on_object is not None:
                    self.on_object(event.value)
            elif isinstance(event, RmiOnewayFailed) and self.on_error is not None:
                self.on_error(RemoteError(event.type_name, f"{event.method}: {event.message}", event.traceback_text))
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
