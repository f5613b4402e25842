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

from ..rmi import Invocation, MethodSpec, RemoteRef
from ..rmi.session import Proxy, RmiSessionBase

__all__ = ["Proxy", "RmiSession"]

T = TypeVar("T")


class _Done:
    """What a fire-and-forget call returns: awaiting it is optional and yields None at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return None
        yield  # pragma: no cover - makes this a generator


class RmiSession(RmiSessionBase):
    """One connection's remote objects for asyncio users: awaitable proxies, remote construction, the
    host's task runner."""

    oneway_result = _Done()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tasks: set[asyncio.Task[None]] = set()

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
