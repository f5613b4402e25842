"""The asyncio side of the transport: waiting without spinning (the poller's back-off, parked on
doorbells), and stream registrations awaited while the event loop goes on.

What does not touch the event loop (shared driver contexts, channel URIs, :class:`~..transport.Link`)
is in :mod:`slipstream.network.transport`, shared with any other adapter.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Sequence
from typing import TypeVar

from ... import Context
from ...client import Registration, registered
from ...files.doorbell import Doorbell, wait_any
from ..transport import shared_contexts

__all__ = ["IdleBackoff", "input_pending", "registered_pair", "release_context_drained"]

DRAIN_STEP_S = 5e-4
"""The pause between an asyncio drain's steps."""


async def release_context_drained(context: Context) -> None:
    """Release a shared context, but when this is the last reference to an embedded driver, the closed
    publications finish first while the event loop goes on (an await between steps): the synchronous
    drain in ``Context.close`` would stop every other endpoint of the loop for up to a second, a server
    in this process among them, which then could not even acknowledge our end of stream."""
    if shared_contexts.is_last(context):
        for _ in context.drain_steps():
            context.invoke()
            await asyncio.sleep(DRAIN_STEP_S)
    shared_contexts.release(context)


A = TypeVar("A")
B = TypeVar("B")


async def registered_pair(context: Context, first: Registration[A], second: Registration[B]) -> tuple[A, B]:
    """A connection's two streams, both commands sent before either is awaited (the driver answers
    them in one cycle), awaited while the event loop goes on: blocking ``add_*`` calls of many
    clients connecting at once would add up to seconds in one turn of the loop, long enough for the
    first connections to expire. If either fails or the caller is cancelled, neither stays."""

    def step() -> int:
        return shared_contexts.invoke(context)

    try:
        return await registered(first, invoke=step), await registered(second, invoke=step)
    except BaseException:
        first.cancel()
        second.cancel()
        raise


class IdleBackoff:
    """How an endpoint's poller waits when idle: yield for ``spin_s`` (at least ``spins`` times; every
    fourth yield also gives up the CPU, see :meth:`idle`), then pause from 50 us doubling to 1 ms, and
    after 20 ms without work pause up to 1 s, cut short by the poller to the next timer of its
    connections and of an invoker-mode driver's streams (heartbeats, status messages), or to 1 ms while
    such a driver has data in flight (each wake-up of an idle endpoint is a cold start that costs far
    more on a loaded machine than on an idle one). A pause is spent parked on the doorbells of the logs
    the poller reads (``park``: a writer rings, so a message is handled within microseconds, not after
    asyncio's millisecond-rounded sleep) or, when some image has no parking slot, asleep (``idle``, at
    most 100 ms). :meth:`kick` ends a pause at once: the application just sent something, and its
    answer should be polled for promptly."""

    def __init__(
        self,
        spins: int = 10,
        spin_s: float = 1e-3,
        nap_s: float = 2e-5,
        min_sleep_s: float = 5e-5,
        max_sleep_s: float = 1e-3,
        deep_sleep_s: float = 1.0,
        deep_after_s: float = 0.02,
    ) -> None:
        self.spins = spins
        self.spin_s = spin_s
        self.nap_s = nap_s
        self.min_sleep_s = min_sleep_s
        self.max_sleep_s = max_sleep_s
        self.deep_sleep_s = deep_sleep_s
        self.deep_after_s = deep_after_s
        self._count = 0
        self._sleep_s = min_sleep_s
        self._idle_since: float | None = None
        self._spin_until = 0.0
        self._waiter: asyncio.Future[bool | None] | None = None
        self.parked = False
        """True while waiting in ``park`` (on the doorbells)."""

    def reset(self) -> None:
        """Work was done: start over with the short waits."""
        self._count = 0
        self._sleep_s = self.min_sleep_s
        self._idle_since = None
        self._spin_until = 0.0

    def kick(self) -> None:
        """Reset the back-off and end a pause in progress."""
        self.reset()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def next_pause(self, now_s: float) -> float | None:
        """The pause the next wait takes (and the back-off moves on), or None while it only yields
        (``idle`` does that); ``now_s`` is the caller's monotonic time."""
        if self._count < self.spins or now_s < self._spin_until:
            return None
        if self._idle_since is None:
            self._idle_since = now_s
        if now_s - self._idle_since >= self.deep_after_s:
            return self.deep_sleep_s
        pause = self._sleep_s
        self._sleep_s = min(pause * 2, self.max_sleep_s)
        return pause

    async def park(self, doorbells: Sequence[Doorbell], pause_s: float, inputs: Sequence[int] = ()) -> str:
        """A pause of up to ``pause_s`` on ``doorbells`` and on the readable descriptors ``inputs`` (an
        invoker-mode driver's input: only our invoke takes it in, so nobody rings for it). Returns what
        ended it: ``"timeout"``, ``"rung"``, ``"input"`` or ``"kick"``.

        The caller has set its parked bytes and checked its images once more after that (the parking
        protocol)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool | None] = loop.create_future()
        self._waiter = waiter
        self.parked = True
        woke: list[int] = []

        def on_input(fd: int) -> None:
            woke.append(fd)
            _wake(waiter)

        for fd in inputs:
            loop.add_reader(fd, on_input, fd)
        try:
            result = await wait_any(doorbells, pause_s, waiter)
        finally:
            for fd in inputs:
                loop.remove_reader(fd)
            self.parked = False
            self._waiter = None
        if result is None:
            return "input" if woke else "kick"
        return "rung" if result else "timeout"

    async def idle(self, now_s: float, *, nap: bool = True) -> None:
        """Wait one step of the back-off without doorbells: yield, or sleep the next pause. ``nap``:
        an embedded driver thread shares our GIL, so spinning yields it some time; without one (an
        invoker-mode or standalone driver) a nap only delays the answer (Linux sleeps 50 us or more)."""
        pause = self.next_pause(now_s)
        if pause is not None:
            await self.sleep(pause)
            return
        # asyncio cannot sleep less than about a millisecond (its selector waits in milliseconds),
        # so right after work (or a kick) the poller only yields, for ``spin_s``: an answer that
        # follows closely is polled within microseconds, not a millisecond later.
        if self._count == 0:
            self._spin_until = now_s + self.spin_s
        self._count += 1
        if nap and self._count > self.spins:
            # A short blocking nap lets the driver's thread (an embedded driver shares our GIL)
            # move the data we are waiting for; a bare yield would keep the GIL from it.
            time.sleep(self.nap_s)
        elif not nap and not self._count & 3:
            # Every fourth spin, give the CPU to a process waiting for it: the peer we just sent to is
            # woken on our CPU (the kernel puts a wakee near its waker) and would otherwise wait out our
            # millisecond of spinning. A parked receiver's one-way latency: 2.1 -> 1.1 ms over IPC, 2.1
            # -> 1.3 ms over UDP (/tmp probe, 30 ms apart); yielding on every spin cost a busy UDP round
            # trip 8 %, every fourth spin nothing measurable.
            os.sched_yield()
        await asyncio.sleep(0)

    async def sleep(self, pause_s: float) -> None:
        """Sleep ``pause_s`` (a kick ends it): the pause of a poller that cannot park on doorbells."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool | None] = loop.create_future()
        self._waiter = waiter
        handle = loop.call_later(pause_s, _wake, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            self._waiter = None


def input_pending(fds: Sequence[int]) -> bool:
    """Whether any of ``fds`` is readable right now (a zero-timeout poll): input a duty cycle left unread."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _wake(waiter: asyncio.Future[bool | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
