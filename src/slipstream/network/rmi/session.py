"""One connection's remote objects as every adapter offers them: proxies, the object tables, calls sent
and their outcomes, and the host's calls run (see :mod:`..aio.rmi` and :mod:`..sync.rmi` for how each
waits: an asyncio future and tasks, or a blocking wait on the connection's poll).

Files: a ``pathlib.Path`` argument or result is streamed as ``connection.send(Path)`` streams a file
(size and SHA-256 checked). For an *argument*, the host's method gets a ``Path`` to a temporary copy,
removed as soon as the call has completed or failed, so a method that wants to keep the file copies or
moves it; for a *result*, the caller gets the ``Path`` and owns the file from then on (it is not removed
for it, not even when the connection closes); if the call fails or the caller went away before the file
arrived, it is removed. The call's timeout covers the transfer of its arguments (the response comes
after the method ran) but not of a file result, which is bounded by the stream's idle timeout instead.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

from ..connection import ConnectionMachine
from ..errors import RemoteError
from ..events import RmiCallCompleted, RmiCallFailed, RmiObjectReceived, RmiOnewayFailed, RmiRequestReceived
from .endpoint import RmiEndpoint, exception_from
from .invocation import Invocation
from .objects import ProxyBase, RemoteRef
from .registry import MethodSpec
from .wire import DEFAULT_TIMEOUT_NS

__all__ = ["Proxy", "RmiSessionBase"]

log = logging.getLogger("slipstream.network")

T = TypeVar("T")


class _RemoteMethod:
    """``proxy.method``: calling it sends the request; the adapter's session says what the caller gets
    (an awaitable, or the result itself)."""

    __slots__ = ("_oneway", "_ref", "_session", "_spec", "_timeout_ns")

    def __init__(
        self, session: RmiSessionBase, ref: RemoteRef, spec: MethodSpec, oneway: bool, timeout_ns: int
    ) -> None:
        self._session = session
        self._ref = ref
        self._spec = spec
        self._oneway = oneway
        self._timeout_ns = timeout_ns

    def __call__(self, *args: object, **kwargs: object) -> Any:
        session = self._session
        if self._oneway:
            session.call_oneway(self._ref, self._spec, args, kwargs)  # never raises: failures go to on_error
            return session.oneway_result
        return session.call(self._ref, self._spec, self._spec.bind(args, kwargs), self._timeout_ns)


class Proxy(ProxyBase):
    """A remote object: ``proxy.method(args)`` calls it on the side that hosts it, as the connection's
    adapter calls (asyncio: ``await proxy.method(args)``; blocking: the result); see
    :class:`~slipstream.network.rmi.ProxyBase` for timeouts and fire-and-forget twins."""

    __slots__ = ("_rmi_session",)

    def __init__(
        self, session: RmiSessionBase, ref: RemoteRef, *, oneway: bool = False, timeout_ns: int = DEFAULT_TIMEOUT_NS
    ) -> None:
        super().__init__(session.endpoint, ref, oneway=oneway, timeout_ns=timeout_ns)
        object.__setattr__(self, "_rmi_session", session)

    def _remote_method(self, method: MethodSpec, oneway: bool, timeout_ns: int) -> _RemoteMethod:
        return _RemoteMethod(object.__getattribute__(self, "_rmi_session"), self.rmi_ref, method, oneway, timeout_ns)

    def _twin(self, oneway: bool) -> Proxy:
        timeout_ns = object.__getattribute__(self, "_rmi_timeout_ns")
        return Proxy(object.__getattribute__(self, "_rmi_session"), self.rmi_ref, oneway=oneway, timeout_ns=timeout_ns)


class RmiSessionBase:
    """One connection's remote objects over its machine, without the adapter's way of waiting.

    ``flush`` hands what a call or an answer appended to the machine to the transport. The connection
    passes the machine's RMI events to :meth:`handle`. ``caller`` is what implementation methods that
    declare the calling connection receive. Exceptions of fire-and-forget calls this side hosts, and
    fire-and-forget calls that could not be sent (wrong arguments, unencodable values, a closed
    connection, an unreadable file), go to ``on_error``: a fire-and-forget call never raises. Remote
    objects the peer sends as messages go to ``on_object``. ``lock`` is held while the machine is driven
    from the caller's thread (the blocking adapter's; asyncio needs none).
    """

    oneway_result: ClassVar[object] = None
    """What calling a fire-and-forget proxy's method returns."""

    def __init__(
        self,
        machine: ConnectionMachine,
        flush: Callable[[], None],
        *,
        caller: object = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_object: Callable[[object], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        default_timeout: float = DEFAULT_TIMEOUT_NS / 1e9,
        lock: contextlib.AbstractContextManager[Any] | None = None,
    ) -> None:
        if default_timeout < 0:
            raise ValueError(f"default_timeout must not be negative: {default_timeout}")
        if machine.rmi is None:
            raise ValueError("the connection machine carries no remote objects (rmi=None)")
        self.machine = machine
        self.endpoint: RmiEndpoint = machine.rmi.endpoint
        self.work = machine.rmi.work
        self._flush = flush
        self.caller = caller
        self.on_error = on_error
        self.on_object = on_object
        self._clock = clock
        self.default_timeout_ns = int(default_timeout * 1e9)
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._waiters: dict[int, Any] = {}
        """Calls in flight by call id: what their outcome is given to (``set_result`` / ``set_exception``)."""

    # -- what an adapter gives ----------------------------------------------------------------------

    def call(self, ref: RemoteRef, spec: MethodSpec, args: tuple[object, ...], timeout_ns: int) -> Any:
        """Send a call's request; what the caller gets: an awaitable of the response, or the response."""
        raise NotImplementedError

    def _run_awaitable(self, invocation_id: int, invocation: Invocation, awaitable: Any) -> None:
        """A host method returned an awaitable: run it, answering the call when it finishes."""
        raise NotImplementedError

    def close(self) -> None:
        """The connection closed (its machine failed the calls in flight)."""

    # -- the user's API -----------------------------------------------------------------------------

    def proxy(self, ref: RemoteRef) -> Proxy:
        """The proxy of the peer's object ``ref``."""
        return Proxy(self, ref, timeout_ns=self.default_timeout_ns)

    def _resolve(self, value: object) -> object:
        return self.proxy(value) if isinstance(value, RemoteRef) else value

    def get(self, interface: type[T], id: int) -> T:
        """A proxy of the peer's connection-scoped object ``id`` (existence is not checked)."""
        spec = self.endpoint.registry.interface(interface)
        return cast(T, self.proxy(RemoteRef(spec.interface_id, id, False)))

    def get_global(self, interface: type[T], id: int) -> T:
        """A proxy of the peer's global object ``id`` (existence is not checked)."""
        spec = self.endpoint.registry.interface(interface)
        return cast(T, self.proxy(RemoteRef(spec.interface_id, id, True)))

    def save(self, obj: object, id: int | None = None) -> int:
        """Host ``obj`` for this connection's peer under ``id`` (default: the next free one); returns its id."""
        return self.endpoint.objects.save(obj, id)

    def delete(self, id: object) -> bool:
        """Stop hosting an object (by ``id`` or the object itself) for this connection; the peer's
        calls on it then fail with RemoteObjectMissing."""
        return self.endpoint.objects.delete(id)

    def send_object(self, value: object) -> None:
        """Send a proxy or a registered implementation as a message (the peer's ``on_object`` gets its
        own object back, or a proxy)."""
        with self._lock:
            self.machine.send_object(value)
            self._flush()

    # -- calls ----------------------------------------------------------------------------------------

    def _start_create(self, interface: type, args: tuple[object, ...], timeout: float | None, waiter: Any) -> int:
        """Send a remote construction; ``waiter`` gets the proxy (or the failure). Returns the call id."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must not be negative: {timeout}")
        timeout_ns = self.default_timeout_ns if timeout is None else int(timeout * 1e9)
        with self._lock:
            call_id = self.machine.create(interface, args, self._clock(), timeout_ns=timeout_ns)
            self._waiters[call_id] = waiter
            self._flush()
        return call_id

    def _start_call(
        self, ref: RemoteRef, spec: MethodSpec, args: tuple[object, ...], timeout_ns: int, waiter: Any
    ) -> int:
        """Send a call's request now; ``waiter`` gets the response. Returns the call id."""
        with self._lock:
            call_id = self.machine.call(ref, spec, args, self._clock(), timeout_ns=timeout_ns)
            self._waiters[call_id] = waiter
            self._flush()
        return call_id

    def call_oneway(
        self,
        ref: RemoteRef,
        spec: MethodSpec,
        args: tuple[object, ...] | list[object],
        kwargs: dict[str, object] | None = None,
    ) -> None:
        """Send a fire-and-forget request. It never raises: arguments that do not fit the method or
        cannot be encoded, a closed connection or an unreadable file are reported to ``on_error``."""
        with self._lock:
            try:
                self.machine.call(ref, spec, spec.bind(args, kwargs), 0, oneway=True)
            except Exception as exc:
                self._report(exc)
                return
            self._flush()

    def _report(self, error: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(error)
        else:
            log.warning("RMI (no on_error): %s", error)

    def _forget(self, call_id: int) -> None:
        """The caller went away from call ``call_id``: its outcome is dropped (a result file removed)."""
        with self._lock:
            if self._waiters.pop(call_id, None) is not None:
                self.machine.abandon_call(call_id)

    # -- events from the machine ------------------------------------------------------------------

    def handle(
        self, event: RmiCallCompleted | RmiCallFailed | RmiObjectReceived | RmiOnewayFailed | RmiRequestReceived
    ) -> None:
        """One of the machine's RMI events (the connection passes them in order)."""
        if isinstance(event, RmiRequestReceived):
            self._run(event.invocation_id)
        elif isinstance(event, RmiCallCompleted):
            waiter = self._waiters.pop(event.call_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(self._resolve(event.value))
            elif isinstance(event.value, Path):  # nobody owns this result file any more
                with contextlib.suppress(OSError):
                    os.unlink(event.value)
        elif isinstance(event, RmiCallFailed):
            waiter = self._waiters.pop(event.call_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(exception_from(event, self.endpoint.registry))
        elif isinstance(event, RmiObjectReceived):
            if self.on_object is not None:
                self.on_object(self._resolve(event.value))
        else:
            self._report(RemoteError(event.type_name, f"{event.method}: {event.message}", event.traceback_text))

    def _run(self, invocation_id: int) -> None:
        """Run a host call; an awaitable result is the adapter's (:meth:`_run_awaitable`)."""
        machine = self.machine
        try:
            invocation = machine.invocation(invocation_id)
        except KeyError:  # the connection closed since (an earlier listener closed it): nothing to answer
            return
        try:
            result = invocation.call(self.caller, self._resolve)
        except Exception as exc:
            if invocation.counted:  # (an async method called with what it does not take)
                self.work.finished()
            machine.fail_invocation(invocation_id, exc)
        else:
            if inspect.isawaitable(result):
                self._run_awaitable(invocation_id, invocation, result)
                return
            machine.complete_invocation(invocation_id, result)
        if not invocation.oneway:  # a fire-and-forget call is answered by nothing (a failure: on_error)
            self._flush()
