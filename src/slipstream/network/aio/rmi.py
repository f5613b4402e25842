"""Awaitable proxies over a connection machine's remote calls (:mod:`slipstream.network.rmi`).

The only asyncio in RMI: a call becomes a future resolved by the machine's outcome event, and coroutine
methods the host runs become tasks (a file argument's temporary copy is removed when the task finished).
The machine keeps everything else (response ids, deadlines, the files of ``Path`` arguments and results),
so the call's timeout is the connection's timer; :class:`~..rmi.session.RmiSessionBase` the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar, cast

from ..rmi import DEFAULT_TIMEOUT_NS, Invocation, MethodSpec, RemoteRef
from ..rmi.objects import ProxyBase
from ..rmi.session import RmiSessionBase

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

    __slots__ = ("_oneway", "_ref", "_session", "_spec", "_timeout_ns")

    def __init__(self, session: RmiSession, ref: RemoteRef, spec: MethodSpec, oneway: bool, timeout_ns: int) -> None:
        self._session = session
        self._ref = ref
        self._spec = spec
        self._oneway = oneway
        self._timeout_ns = timeout_ns

    def __call__(self, *args: object, **kwargs: object) -> Awaitable[Any]:
        if self._oneway:
            self._session.call_oneway(self._ref, self._spec, args, kwargs)  # never raises: failures go to on_error
            return _DONE
        return self._session.call(self._ref, self._spec, self._spec.bind(args, kwargs), self._timeout_ns)


class Proxy(ProxyBase):
    """A remote object: ``await proxy.method(args)`` calls it on the side that hosts it (see
    :class:`~slipstream.network.rmi.ProxyBase`: timeouts, fire-and-forget twins)."""

    __slots__ = ("_rmi_session",)

    def __init__(
        self, session: RmiSession, ref: RemoteRef, *, oneway: bool = False, timeout_ns: int = DEFAULT_TIMEOUT_NS
    ) -> None:
        super().__init__(session.endpoint, ref, oneway=oneway, timeout_ns=timeout_ns)
        object.__setattr__(self, "_rmi_session", session)

    def _remote_method(self, method: MethodSpec, oneway: bool, timeout_ns: int) -> _RemoteMethod:
        return _RemoteMethod(object.__getattribute__(self, "_rmi_session"), self.rmi_ref, method, oneway, timeout_ns)

    def _twin(self, oneway: bool) -> Proxy:
        timeout_ns = object.__getattribute__(self, "_rmi_timeout_ns")
        return Proxy(object.__getattribute__(self, "_rmi_session"), self.rmi_ref, oneway=oneway, timeout_ns=timeout_ns)


class RmiSession(RmiSessionBase):
    """One connection's remote objects for asyncio users: awaitable proxies, remote construction, the
    host's task runner."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tasks: set[asyncio.Task[None]] = set()

    def proxy(self, ref: RemoteRef, *, oneway: bool = False, timeout_ns: int | None = None) -> Proxy:
        """The proxy of the peer's object ``ref``."""
        return Proxy(self, ref, oneway=oneway, timeout_ns=self.default_timeout_ns if timeout_ns is None else timeout_ns)

    async def create(self, interface: type[T], *args: object, timeout: float | None = None) -> T:
        """Have the peer construct its implementation of ``interface``; returns a proxy of it."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._start_create(interface, args, timeout, future)
        return cast(T, await future)

    def call(self, ref: RemoteRef, spec: MethodSpec, args: tuple[object, ...], timeout_ns: int) -> Awaitable[Any]:
        """Send the request now; the returned awaitable resolves with the response."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        call_id = self._start_call(ref, spec, args, timeout_ns, future)
        if spec.file_result:  # a caller that goes away leaves no file behind
            future.add_done_callback(lambda done: self._abandon(done, call_id))
        return future

    def _abandon(self, done: asyncio.Future[Any], call_id: int) -> None:
        if done.cancelled():
            self._forget(call_id)

    def _run_awaitable(self, invocation_id: int, invocation: Invocation, awaitable: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._finish(invocation_id, awaitable))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if not invocation.counted:  # (max_pending_calls: the machine counts async methods' calls)
            self.work.started()
        task.add_done_callback(self.work.finished)

    async def _finish(self, invocation_id: int, awaitable: Awaitable[Any]) -> None:
        try:
            result = await awaitable
        except Exception as exc:
            self.machine.fail_invocation(invocation_id, exc)
        else:
            self.machine.complete_invocation(invocation_id, result)
        self._flush()

    def close(self) -> None:
        """The connection closed (its machine failed the calls in flight): host tasks are cancelled."""
        for task in list(self._tasks):
            task.cancel()
