"""The poller: one task per event loop runs the duty cycle of every server and client on it, and waits
without spinning when they are idle (parked on the doorbells of the logs they read). What to cycle and
how long to wait is :class:`~..polling.PollCore`'s; this module awaits its waits."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import ClassVar

from ..endpoint import Polled
from ..pacing import Pacer, Wake, Yield
from ..polling import ParkOn, PollCore
from .transport import IdleBackoff

__all__ = ["IDLE_TURN_NS", "PollGroup"]

IDLE_TURN_NS = 20_000
"""A poller spinning idle runs its duty cycles back to back for up to this long before it gives the event
loop a turn (a turn costs about as much as an idle cycle): what arrives meanwhile is taken in sooner. After
a cycle that did work it yields at once (a listener may have woken a task); with an embedded driver thread
on the process's GIL it never cycles back to back (that thread gets the GIL at the loop's turns)."""


class PollGroup(PollCore):
    """One poller task per event loop for every server and client on it."""

    _groups: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PollGroup]] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.backoff: IdleBackoff = IdleBackoff()
        super().__init__(Pacer(self.backoff))
        self.loop = loop
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> PollGroup:
        """The group of ``loop`` (made on first use)."""
        group = cls._groups.get(loop)
        if group is None:
            group = cls._groups[loop] = PollGroup(loop)
        return group

    def add(self, endpoint: Polled) -> None:
        """Poll ``endpoint`` from now on (starting the task if needed)."""
        self.endpoints.append(endpoint)
        self.backoff.kick()
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run(), name="slipstream-network-poller")

    def remove(self, endpoint: Polled) -> None:
        """Stop polling ``endpoint`` (the task ends with the last one)."""
        if endpoint in self.endpoints:
            self.endpoints.remove(endpoint)

    async def _run(self) -> None:
        """Await each wait of :meth:`~..polling.PollCore.waits` (its cycles run in between)."""
        backoff = self.backoff
        waits = self.waits()
        turn_ns = time.monotonic_ns()
        try:
            wait = next(waits)
            while True:
                wake: Wake | None = None
                if isinstance(wait, ParkOn):
                    wake = await backoff.park(wait.doorbells, wait.seconds, wait.inputs)
                    turn_ns = time.monotonic_ns()
                elif (
                    self.idle
                    and type(wait) is Yield
                    and not wait.give_cpu
                    and not self._threaded()  # (a driver thread on our GIL gets it at the loop's turns)
                    and time.monotonic_ns() < turn_ns + IDLE_TURN_NS
                ):
                    pass  # spinning idle: the cycle woke none of the loop's other tasks, so cycle again at once
                else:
                    await backoff.take(wait)
                    turn_ns = time.monotonic_ns()
                wait = waits.send(wake)
        except StopIteration:
            pass
        finally:
            waits.close()
            self.task = None
