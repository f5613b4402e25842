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

from ..rmi import DEFAULT_TIMEOUT_NS, Invocation, MethodSpec, RemoteRef
from ..rmi.objects import ProxyBase
from ..rmi.session import RmiSessionBase
from .poller import Outcome

__all__ = ["Proxy", "RmiSession"]

log = logging.getLogger("slipstream.network")

T = TypeVar("T")

Wait = Callable[[Outcome[Any]], Any]
"""Runs the connection's cycles until an outcome is in; returns its result (or raises)."""


class _RemoteMethod:
    """``proxy.method``: calling it sends the request and waits for the response."""

    __slots__ = ("_oneway", "_ref", "_session", "_spec", "_timeout_ns")

    def __init__(self, session: RmiSession, ref: RemoteRef, spec: MethodSpec, oneway: bool, timeout_ns: int) -> None:
        self._session = session
        self._ref = ref
        self._spec = spec
        self._oneway = oneway
        self._timeout_ns = timeout_ns

    def __call__(self, *args: object, **kwargs: object) -> Any:
        if self._oneway:
            self._session.call_oneway(self._ref, self._spec, args, kwargs)  # never raises: failures go to on_error
            return None
        return self._session.call(self._ref, self._spec, self._spec.bind(args, kwargs), self._timeout_ns)


class Proxy(ProxyBase):
    """A remote object: ``proxy.method(args)`` calls it on the side that hosts it and returns its result
    (see :class:`~slipstream.network.rmi.ProxyBase`: timeouts, fire-and-forget twins)."""

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
    """One connection's remote objects for blocking code: blocking proxies and remote construction.
    ``wait`` runs the connection's cycles until an outcome is in; ``lock`` is held while the machine is
    driven (the poller's)."""

    def __init__(self, *args: Any, wait: Wait, lock: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wait = wait
        self._lock = lock

    def proxy(self, ref: RemoteRef, *, oneway: bool = False, timeout_ns: int | None = None) -> Proxy:
        """The proxy of the peer's object ``ref``."""
        return Proxy(self, ref, oneway=oneway, timeout_ns=self.default_timeout_ns if timeout_ns is None else timeout_ns)

    def create(self, interface: type[T], *args: object, timeout: float | None = None) -> T:
        """Have the peer construct its implementation of ``interface``; returns a proxy of it."""
        outcome: Outcome[Any] = Outcome()
        with self._lock:
            self._start_create(interface, args, timeout, outcome)
        return cast(T, self._wait(outcome))

    def call(self, ref: RemoteRef, spec: MethodSpec, args: tuple[object, ...], timeout_ns: int) -> Any:
        """Send the request and wait for the response (the connection's timer bounds the wait)."""
        outcome: Outcome[Any] = Outcome()
        with self._lock:
            call_id = self._start_call(ref, spec, args, timeout_ns, outcome)
        try:
            return self._wait(outcome)
        except BaseException:
            if not outcome.done():  # (interrupted: a file result must not stay behind)
                with self._lock:
                    self._forget(call_id)
            raise

    def call_oneway(
        self,
        ref: RemoteRef,
        spec: MethodSpec,
        args: tuple[object, ...] | list[object],
        kwargs: dict[str, object] | None = None,
    ) -> None:
        with self._lock:
            super().call_oneway(ref, spec, args, kwargs)

    def send_object(self, value: object) -> None:
        with self._lock:
            super().send_object(value)

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
