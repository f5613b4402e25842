"""The asyncio side of the transport: waiting without spinning (the steps of the back-off ladder of
:mod:`..pacing`, parked on doorbells), and stream registrations awaited while the event loop goes on.

What does not touch the event loop (shared driver contexts, channel URIs, :class:`~..transport.Link`)
is in :mod:`slipstream.network.transport`, shared with any other adapter.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from ... import Context
from ...client import Registration, registered
from ...files.doorbell import Doorbell, wait_any
from ..pacing import Backoff, Nap, Sleep, Step, Wake
from ..transport import DRAIN_STEP_S, shared_contexts

__all__ = ["IdleBackoff", "registered_pair", "release_context_drained"]


async def release_context_drained(context: Context) -> None:
    """Release a shared context, but when this is the last reference to an embedded driver, the closed
    publications finish first while the event loop goes on (an await between steps): the synchronous
    drain in ``Context.close`` would stop every other endpoint of the loop for up to a second, a server
    in this process among them, which then could not even acknowledge our end of stream."""
    try:
        if shared_contexts.is_last(context):
            for _ in context.drain_steps():
                context.invoke()
                await asyncio.sleep(DRAIN_STEP_S)
    finally:  # (cancelled while draining: released all the same, or the driver would outlive us)
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


class IdleBackoff(Backoff):
    """The back-off ladder (:class:`~..pacing.Backoff`) and its asyncio waits: a pause spent parked on the
    doorbells of the logs the poller reads (:meth:`park`: a writer rings, so a message is handled within
    microseconds, not after asyncio's millisecond-rounded sleep) or asleep (:meth:`sleep`). :meth:`kick`
    ends either at once: the application just sent something, and its answer should be polled for
    promptly."""

    _waiter: asyncio.Future[bool | None] | None = None
    parked = False
    """True while waiting in ``park`` (on the doorbells)."""

    def kick(self) -> None:
        """Reset the back-off and end a pause in progress."""
        self.reset()
        if self._waiter is not None:
            _wake(self._waiter)

    def next_pause(self, now_s: float) -> float | None:
        """The pause the next wait takes (and the back-off moves on), or None while it only yields;
        ``now_s`` is the caller's monotonic time."""
        return self.pause(round(now_s * 1e9))

    async def idle(self, now_s: float, *, nap: bool = True) -> None:
        """Wait one step of the back-off without doorbells (see :meth:`~..pacing.Backoff.step`)."""
        await self.take(self.step(round(now_s * 1e9), nap=nap))

    def take(self, step: Step) -> Awaitable[None]:
        """Carry out ``step``: a pause (a kick ends it), or a yield of the event loop, after a nap or
        after giving the CPU away if the step says so (not a coroutine: a busy poller takes one a turn)."""
        if isinstance(step, Sleep):
            return self.sleep(step.seconds)
        if isinstance(step, Nap):
            time.sleep(step.seconds)
        elif step.give_cpu:
            os.sched_yield()
        return asyncio.sleep(0)

    async def park(self, doorbells: Sequence[Doorbell], pause_s: float, inputs: Sequence[int] = ()) -> Wake:
        """A pause of up to ``pause_s`` on ``doorbells`` and on the readable descriptors ``inputs`` (an
        invoker-mode driver's input: only our invoke takes it in, so nobody rings for it); what ended it.

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
            return Wake.INPUT if woke else Wake.KICK
        return Wake.RUNG if result else Wake.TIMEOUT

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


def _wake(waiter: asyncio.Future[bool | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
