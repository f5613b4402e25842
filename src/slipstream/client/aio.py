"""Waiting for data and for room from asyncio code, without burning a core.

Shared memory has no file descriptor to wake an event loop, so a waiting reader first yields to the
loop a few times (fast when data follows closely), then parks on its context's doorbell (see
``slipstream.files.doorbell``): it sets its parked byte in each image's log, polls once more (a frame
appended before the byte was visible is found here), and waits on the doorbell's descriptor, which the
writer rings after its append. So a parked reader costs nothing while idle and still wakes within
microseconds. The wait has a timeout (``park_timeout_s``) as a safety net only. An image without a
parking slot (more readers than slots) makes the reader fall back to sleeping, doubling the pause up
to ``max_sleep_s``. Waiting for room (``offer_async``) always uses the timed back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from ..logbuffer import ADMIN_ACTION, BACK_PRESSURED, CLOSED, NOT_CONNECTED, FragmentHandler
from .context import Registration
from .errors import renewed
from .image import Image
from .publication import ExclusivePublication
from .subscription import Subscription

_RETRY = frozenset((BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION))
T = TypeVar("T")


class AsyncBackoff:
    """Yield ``spins`` times, then park on the doorbell (``poll_async``: at most ``park_timeout_s`` per
    wait) or sleep from ``min_sleep_s`` doubling to ``max_sleep_s``."""

    def __init__(
        self, spins: int = 20, min_sleep_s: float = 5e-5, max_sleep_s: float = 1e-3, park_timeout_s: float = 0.01
    ) -> None:
        if spins < 0 or not 0 < min_sleep_s <= max_sleep_s or not park_timeout_s > 0:
            raise ValueError("need spins >= 0, 0 < min_sleep_s <= max_sleep_s and park_timeout_s > 0")
        self.spins = spins
        self.min_sleep_s = min_sleep_s
        self.max_sleep_s = max_sleep_s
        self.park_timeout_s = park_timeout_s
        self._count = 0
        self._sleep_s = min_sleep_s

    @property
    def spinning(self) -> bool:
        """True while ``idle`` would still only yield."""
        return self._count < self.spins

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


class Parking:
    """The parked bytes one wait has set, in the logs of the images it reads: ``unpark`` clears them.

    ``park`` is the first step of the protocol (set parked, poll once more, then wait on the doorbell);
    it reports whether every image could park, since a reader that waits on the doorbell for an image
    without a slot would wait out its timeout."""

    __slots__ = ("_images",)

    def __init__(self) -> None:
        self._images: list[Image] = []

    def park(self, subscriptions: Iterable[Subscription], number: int) -> bool:
        """Ask the writers of every image of ``subscriptions`` to ring doorbell ``number``; False if
        some image has no parking slot (the others are parked all the same: ``unpark`` still needed)."""
        complete = True
        images = self._images
        for subscription in subscriptions:
            for image in subscription.images:
                if image._park(number):
                    images.append(image)
                elif not image.is_closed:
                    complete = False
        return complete

    def ready(self) -> bool:
        """True when some parked image already holds a frame (appended before its byte was visible):
        the re-check of the parking protocol, cheaper than a poll when no handler is at hand."""
        return any(image._has_frame() for image in self._images)

    def unpark(self) -> None:
        """Clear what ``park`` set (call once the wait is over, woken or not)."""
        images, self._images = self._images, []
        for image in images:
            image._unpark()


async def poll_async(
    subscription: Subscription,
    handler: FragmentHandler,
    fragment_limit: int = 10,
    *,
    timeout_s: float | None = None,
    backoff: AsyncBackoff | None = None,
) -> int:
    """Wait until at least one fragment was delivered (returns the count) or ``timeout_s`` passed (0).

    After ``backoff.spins`` yields it parks on the context's doorbell (see the module's docstring).
    Returns 0 at once for a closed subscription; raises ``DriverLostError`` (the context rings parked
    readers when it loses the driver) when the media driver is lost, also while waiting."""
    backoff = backoff or AsyncBackoff()
    backoff.reset()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        fragments = subscription.poll(handler, fragment_limit)  # raises DriverLostError once the driver is lost
        if fragments or subscription.is_closed:
            return fragments
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return 0
        bell = None if backoff.spinning else subscription.doorbell
        if bell is None:
            await backoff.idle()
            continue
        parking = Parking()
        try:
            if not parking.park((subscription,), bell.number):
                parking.unpark()
                await backoff.idle()  # some image has no slot: its writer would not ring
                continue
            # Parked: poll once more, so a frame appended before our byte was visible is not missed.
            fragments = subscription.poll(handler, fragment_limit)
            if fragments or subscription.is_closed:
                return fragments
            wait_s = backoff.park_timeout_s if deadline is None else min(backoff.park_timeout_s, deadline - now)
            await bell.wait(wait_s)
        finally:
            parking.unpark()


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


async def registered(
    registration: Registration[T],
    *,
    invoke: Callable[[], int] | None = None,
    backoff: AsyncBackoff | None = None,
) -> T:
    """Await what a ``Context.async_add_*`` call adds while the event loop goes on (the blocking
    ``add_*`` would stop it for the driver's round trip: a millisecond or more, and many at once add
    up). A driver with a thread of its own wakes the waiter when it answers (nothing polls meanwhile:
    a hundred polling waiters would keep the GIL from that very thread). An invoker-mode driver is
    run between polls: ``invoke`` (default: the context's ``invoke``), with ``backoff`` between.
    Raises as ``Registration.poll``; cancelled or failed, nothing stays added."""
    try:
        if registration.context.is_invoker:
            invoke = invoke or registration.context.invoke
            backoff = backoff or AsyncBackoff()
            while (result := registration.poll()) is None:
                if invoke():
                    backoff.reset()
                await backoff.idle()
            return result
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, answered)

        registration.add_done_callback(wake)
        while (result := registration.poll()) is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(answered), registration.remaining_s + 1e-3)
        return result
    except BaseException:
        registration.cancel()
        raise


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
