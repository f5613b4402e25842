"""asyncio test helpers: a bounded ``asyncio.run``, and a connection pair on the running loop.

:class:`AsyncConnectionPair` runs two connection machines with remote objects (as
:func:`~.connection.machine_pair` makes them) under the asyncio RMI sessions, without a transport:
records travel by ``loop.call_soon`` (one hop per flush) and the machines' deadlines fire by
``loop.call_at``, on the real monotonic clock, so awaitable proxies, timeouts and host coroutines
behave as over a connection.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ..network.aio.rmi import RmiSession
from ..network.connection import ConnectionMachine
from ..network.events import (
    Closed,
    RmiCallCompleted,
    RmiCallFailed,
    RmiObjectReceived,
    RmiOnewayFailed,
    RmiRequestReceived,
)
from ..network.rmi import ObjectTable, RmiRegistry
from ..network.serialization import Serialization
from .connection import machine_pair

__all__ = ["AsyncConnectionPair", "async_test", "run_async"]

T = TypeVar("T")

_RMI_EVENTS = (RmiRequestReceived, RmiCallCompleted, RmiCallFailed, RmiObjectReceived, RmiOnewayFailed)


def run_async(coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """``asyncio.run`` of ``coroutine`` in a fresh loop, bounded by ``timeout`` seconds (TimeoutError)."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def async_test(
    timeout: float = 60.0,
) -> Callable[[Callable[[], Coroutine[Any, Any, None]]], Callable[[], None]]:
    """Decorator: run an ``async def`` test (no arguments) with :func:`run_async`."""

    def wrap(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
        @functools.wraps(test)
        def run() -> None:
            run_async(test(), timeout)

        return run

    return wrap


class AsyncConnectionPair:
    """A client and a server connection machine with remote objects on the running loop (see the module):
    ``client`` and ``server`` are their :class:`RmiSession` (``a`` and ``b`` the machines)."""

    def __init__(
        self,
        client_registry: RmiRegistry,
        server_registry: RmiRegistry,
        *,
        global_objects: ObjectTable | None = None,
        types: Sequence[type] = (),
        timeout: float = 3.0,
        callers: tuple[object, object] = (None, None),
        expiry_ns: int = 60_000_000_000,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.a, self.b = machine_pair(
            Serialization(types),
            time.monotonic_ns(),
            expiry_ns=expiry_ns,
            rmi=(client_registry, server_registry),
            global_objects=global_objects,
        )
        self.client = RmiSession(self.a, self._schedule, caller=callers[0], default_timeout=timeout)
        self.server = RmiSession(self.b, self._schedule, caller=callers[1], default_timeout=timeout)
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None

    def close(self, reason: str) -> None:
        """Both sides lose the connection (as when the transport reports the peer gone)."""
        for machine, session in ((self.a, self.client), (self.b, self.server)):
            machine.lost(reason)
            self._events(machine, session)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        now = time.monotonic_ns()
        for source, target, session in ((self.a, self.b, self.server), (self.b, self.a, self.client)):
            records = source.messages_to_send(now)
            if records:
                self._loop.call_soon(self._deliver, target, session, records)
        self._arm()

    def _deliver(self, machine: ConnectionMachine, session: RmiSession, records: list[bytes | bytearray]) -> None:
        now = time.monotonic_ns()
        for record in records:
            machine.receive(bytes(record), now)
        self._events(machine, session)
        self._schedule()

    def _events(self, machine: ConnectionMachine, session: RmiSession) -> None:
        events = machine.take_events()
        while events:  # answering a host call may add some
            for event in events:
                if isinstance(event, _RMI_EVENTS):
                    session.handle(event)
                elif isinstance(event, Closed):
                    session.close()
            events = machine.take_events()

    def _arm(self) -> None:
        """One timer for the earlier of the two machines' deadlines."""
        deadlines = [d for d in (self.a.deadline_ns, self.b.deadline_ns) if d is not None]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadlines:
            delay = max(0, min(deadlines) - time.monotonic_ns()) / 1e9
            self._timer = self._loop.call_at(self._loop.time() + delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = time.monotonic_ns()
        for machine, session in ((self.a, self.client), (self.b, self.server)):
            deadline = machine.deadline_ns
            if deadline is not None and now >= deadline:
                machine.handle_timer(now)
                self._events(machine, session)
        self._schedule()
