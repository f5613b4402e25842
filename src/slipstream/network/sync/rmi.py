"""Blocking proxies over a connection machine's remote calls (:mod:`slipstream.network.rmi`).

``proxy.method(args)`` sends the request and returns the result (or raises what the call raised): the
calling thread runs the connection's cycles until the response is in (see :mod:`.poller`). The host runs
implementation methods inline, on the thread that cycles; an ``async def`` method cannot run here and
fails the call with a TypeError. :class:`~..rmi.session.RmiSessionBase` has the rest (files, tables).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ..rmi import Invocation, MethodSpec, RemoteRef
from ..rmi.session import Proxy, RmiSessionBase
from .poller import Outcome

__all__ = ["Proxy", "RmiSession"]

log = logging.getLogger("slipstream.network")

T = TypeVar("T")

Wait = Callable[[Outcome[Any]], Any]
"""Runs the connection's cycles until an outcome is in; returns its result (or raises)."""


class RmiSession(RmiSessionBase):
    """One connection's remote objects for blocking code: blocking proxies and remote construction.
    ``wait`` runs the connection's cycles until an outcome is in; ``lock`` is held while the machine is
    driven (the poller's)."""

    def __init__(self, *args: Any, wait: Wait, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wait = wait

    def create(self, interface: type[T], *args: object, timeout: float | None = None) -> T:
        """Have the peer construct its implementation of ``interface``; returns a proxy of it."""
        outcome: Outcome[Any] = Outcome()
        self._start_create(interface, args, timeout, outcome)
        return cast(T, self._wait(outcome))

    def call(self, ref: RemoteRef, spec: MethodSpec, args: tuple[object, ...], timeout_ns: int) -> Any:
        """Send the request and wait for the response (the connection's timer bounds the wait)."""
        outcome: Outcome[Any] = Outcome()
        call_id = self._start_call(ref, spec, args, timeout_ns, outcome)
        try:
            return self._wait(outcome)
        except BaseException:
            if not outcome.done():  # (interrupted: a file result must not stay behind)
                self._forget(call_id)
            raise

    def _run_awaitable(self, invocation_id: int, invocation: Invocation, awaitable: Any) -> None:
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()  # (never awaited: no "coroutine was never awaited" warning)
        if invocation.counted:
            self.work.finished()
        error = TypeError(f"{invocation.method} is async: the blocking API runs plain methods only")
        self.machine.fail_invocation(invocation_id, error)
        if not invocation.oneway:
            self._flush()
