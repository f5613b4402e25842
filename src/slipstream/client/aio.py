"""Waiting for data and for room from asyncio code, without burning a core.

Shared memory has no file descriptor to wake an event loop, so a waiting coroutine polls with a
back-off: it yields to the loop a few times (fast when data follows closely), then sleeps, doubling
the pause up to ``max_sleep_s``. A parked subscriber therefore costs a few wake-ups per millisecond
at most, and a message reaches it within about ``max_sleep_s``.
"""

from __future__ import annotations

import asyncio
import time

from ..logbuffer import ADMIN_ACTION, BACK_PRESSURED, CLOSED, NOT_CONNECTED, FragmentHandler
from .errors import renewed
from .publication import ExclusivePublication
from .subscription import Subscription

_RETRY = frozenset((BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION))


class AsyncBackoff:
    """Yield ``spins`` times, then sleep from ``min_sleep_s`` doubling to ``max_sleep_s``."""

    def __init__(self, spins: int = 20, min_sleep_s: float = 5e-5, max_sleep_s: float = 1e-3) -> None:
        if spins < 0 or not 0 < min_sleep_s <= max_sleep_s:
            raise ValueError("need spins >= 0 and 0 < min_sleep_s <= max_sleep_s")
        self.spins = spins
        self.min_sleep_s = min_sleep_s
        self.max_sleep_s = max_sleep_s
        self._count = 0
        self._sleep_s = min_sleep_s

    async def idle(self) -> None:
        """Pause once: yield while spins remain, else sleep and double the next sleep (up to the cap)."""
        if self._count < self.spins:
            self._count += 1
            await asyncio.sleep(0)
            return
        await asyncio.sleep(self._sleep_s)
        self._sleep_s = min(self._sleep_s * 2, self.max_sleep_s)

    def reset(self) -> None:
        """Start over with spins (call after work was found)."""
        self._count = 0
        self._sleep_s = self.min_sleep_s


async def poll_async(
    subscription: Subscription,
    handler: FragmentHandler,
    fragment_limit: int = 10,
    *,
    timeout_s: float | None = None,
    backoff: AsyncBackoff | None = None,
) -> int:
    """Wait until at least one fragment was delivered (returns the count) or ``timeout_s`` passed (0).

    Returns 0 at once for a closed subscription; raises ``DriverLostError`` (within a back-off pause)
    when the media driver is lost, also while waiting."""
    backoff = backoff or AsyncBackoff()
    backoff.reset()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        fragments = subscription.poll(handler, fragment_limit)  # raises DriverLostError once the driver is lost
        if fragments or subscription.is_closed:
            return fragments
        if deadline is not None and time.monotonic() >= deadline:
            return 0
        await backoff.idle()


async def offer_async(
    publication: ExclusivePublication,
    message: bytes | bytearray | memoryview,
    *,
    timeout_s: float | None = None,
    backoff: AsyncBackoff | None = None,
) -> int:
    """Offer, waiting out back-pressure and absent subscribers until ``timeout_s``; returns the new
    position, or the last refusal code (CLOSED and MAX_POSITION_EXCEEDED are returned at once).

    Raises ``DriverLostError`` (at once, also while waiting) when the media driver is lost."""
    backoff = backoff or AsyncBackoff()
    backoff.reset()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        result = publication.offer(message)
        if result not in _RETRY:
            if result == CLOSED and publication.driver_error is not None:
                raise renewed(publication.driver_error)
            return result
        if result == ADMIN_ACTION:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            return result
        await backoff.idle()
