"""The poller: one task per event loop runs the duty cycle of every server and client on it, and waits
without spinning when they are idle (parked on the doorbells of the logs they read)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Sequence
from typing import ClassVar, Protocol

from ...client import Context
from ...client.aio import Parking
from ...files.doorbell import Doorbell
from ..transport import earliest
from .transport import IdleBackoff, input_pending

__all__ = ["PollGroup", "Polled"]

log = logging.getLogger("slipstream.network")


class Polled(Protocol):
    """What the poller asks of a server or client."""

    @property
    def context(self) -> Context | None:
        """The driver context it uses (None before the first bind or connect)."""

    def duty_cycle(self, now_ns: int) -> int:
        """One duty cycle; the work done."""

    def next_deadline_ns(self, now_ns: int) -> int | None:
        """When the next duty cycle is due if nothing arrives."""

    def report_error(self, connection: None, error: BaseException) -> None:
        """Tell the ``on_error`` listeners."""


UNPARKED_PAUSE_MAX_S = 0.1
"""The longest pause of a poller that nothing would wake for some input: an image without a parking
slot (no doorbell), or an invoker-mode driver's input left out of the wait (a cycle left it unread).
Only the pause's end lets it see a message there."""

BUSY_NAP_EVERY_NS = 1_000_000
"""A poller busy this long without a pause naps once, when an embedded driver thread shares its GIL."""


class PollGroup:
    """One poller task per event loop for every server and client on it: a hundred clients in one
    process wake once per back-off step, not a hundred times."""

    _groups: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PollGroup]] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.endpoints: list[Polled] = []
        self.backoff = IdleBackoff()
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

    def _contexts(self) -> list[Context]:
        """The transport contexts the endpoints use, each once (endpoints of one directory share one).
        Asked twice per duty cycle: a lone endpoint, the common case, costs no dictionary."""
        if len(self.endpoints) == 1:
            context = self.endpoints[0].context
            return [] if context is None else [context]
        contexts: list[Context] = []
        for endpoint in self.endpoints:
            context = endpoint.context
            if context is not None and all(context is not seen for seen in contexts):
                contexts.append(context)
        return contexts

    def _invoke_drivers(self) -> None:
        """One duty cycle of each invoker-mode driver the endpoints use (a no-op for the others). Its
        own chores (heartbeats, status messages) do not count as work, or an idle endpoint would never
        park."""
        for context in self._contexts():
            context.invoke()

    async def _run(self) -> None:
        backoff = self.backoff
        parked: tuple[Parking, list[Doorbell], list[int]] | None = None
        woken_by: Sequence[int] = ()
        mute_inputs = False
        rechecked = False
        busy_since_ns: int | None = None
        try:
            while self.endpoints:
                now_ns = time.monotonic_ns()
                work = self._cycle(now_ns)
                # Input a cycle leaves unread must not wake us in a loop: the next wait leaves it out.
                # But a datagram may also have come in just after the driver read its socket: one more
                # cycle tells the two apart (muted, that message would wait out the pause).
                mute_inputs = bool(woken_by) and not work and input_pending(woken_by)
                if mute_inputs and not rechecked:
                    rechecked = True
                    continue
                rechecked = False
                woken_by = ()
                if work:
                    if parked is not None:
                        parked[0].unpark()
                        parked = None
                    backoff.reset()
                    if busy_since_ns is None:
                        busy_since_ns = now_ns
                    elif now_ns - busy_since_ns >= BUSY_NAP_EVERY_NS:
                        busy_since_ns = now_ns
                        if self._threaded():
                            # Each loop turn lets go of the GIL for a moment (the selector's poll) and
                            # takes it straight back, before a waiting thread can wake: an embedded
                            # driver thread would starve (for seconds on a loaded machine), and with it
                            # the data this loop is busy with. A nap now and then lets it in.
                            time.sleep(backoff.nap_s)
                    await asyncio.sleep(0)
                    continue
                busy_since_ns = None
                pause = backoff.next_pause(now_ns / 1e9)
                if pause is not None and pause > backoff.max_sleep_s:
                    pause = self._until_due(pause, now_ns)  # a long pause ends by the next timer
                if pause is None:
                    await backoff.idle(now_ns / 1e9, nap=self._threaded())  # still yielding: no pause yet
                    continue
                if parked is None:
                    parked = self._park()
                    if parked is None:
                        # some image has no parking slot: a timed pause, and a short one (no ring ends it)
                        await backoff.sleep(min(pause, UNPARKED_PAUSE_MAX_S))
                        continue
                    if parked[0].ready():
                        continue  # appended before our bytes were visible: the next cycle takes it
                inputs: Sequence[int] = parked[2]
                if mute_inputs:  # nothing wakes us for the driver's input: keep the pause short
                    inputs, pause = (), min(pause, UNPARKED_PAUSE_MAX_S)
                outcome = await backoff.park(parked[1], pause, inputs)
                if outcome != "timeout":
                    # Rung, kicked or input: images or endpoints may have changed, so park afresh next
                    # time. A pause that timed out stays parked: no re-parking on every pause.
                    parked[0].unpark()
                    parked = None
                if outcome == "input":
                    woken_by = inputs
        finally:
            if parked is not None:
                parked[0].unpark()
            self.task = None

    def _cycle(self, now_ns: int) -> int:
        """One duty cycle of every endpoint (and of invoker-mode drivers); returns the work done.

        The drivers run first (what arrived reaches the images the endpoints poll) and not again after
        the endpoints: what the application sends leaves at once (``Connection._flush_out``), and the
        rest (handshake packets, status messages) with the next cycle, one loop turn later, after the
        tasks this cycle woke have run."""
        work = 0
        self._invoke_drivers()
        for endpoint in list(self.endpoints):
            try:
                work += endpoint.duty_cycle(now_ns)
            except Exception as exc:  # a bug must not silently stop every connection
                log.exception("network poller failed")
                endpoint.report_error(None, exc)
        return work

    def _until_due(self, pause_s: float, now_ns: int) -> float:
        """``pause_s``, cut short to end when the earliest timer of the endpoints' connections or of an
        invoker-mode driver's streams (heartbeats, status messages, NAKs) is due, or to the back-off's
        short pause while such a driver has data in flight; never below that short pause (a timer
        already due gets a cycle soon, not a spin). The driver's periodic chores (client liveness,
        counters) run at the pause's end: they may be late, nothing is lost."""
        short = self.backoff.max_sleep_s
        invokers = [context for context in self._contexts() if context.is_invoker]
        if any(context.invoker_busy() for context in invokers):
            return short
        due = earliest((endpoint.next_deadline_ns(now_ns) for endpoint in self.endpoints), None)
        due = earliest((context.invoker_deadline_ns() for context in invokers), due)
        if due is None:
            return pause_s
        return min(pause_s, max(short, (due - now_ns) / 1e9))

    def _threaded(self) -> bool:
        """Whether an embedded driver thread shares our GIL (then a spinning poller naps for it)."""
        return any(
            (context := endpoint.context) is not None and context.is_embedded and not context.is_invoker
            for endpoint in self.endpoints
        )

    def _park(self) -> tuple[Parking, list[Doorbell], list[int]] | None:
        """Park every subscription of the endpoints' contexts on the contexts' doorbells, for the idle
        pauses; None (nothing left parked) when some image has no parking slot: the caller then sleeps.

        Parking protocol: set the parked bytes, re-check the images (``Parking.ready``), then wait; the
        bytes are cleared once work is found."""
        parking = Parking()
        bells: list[Doorbell] = []
        inputs: list[int] = []
        for context in self._contexts():
            fd = context.invoker_fileno()  # an invoker-mode driver's datagrams wake us too
            if fd is not None:
                inputs.append(fd)
            try:
                bell = context.doorbell
            except RuntimeError:  # closing
                parking.unpark()
                return None
            bells.append(bell)
            if not parking.park(context.subscriptions, bell.number):
                parking.unpark()
                return None
        return (parking, bells, inputs) if bells else None
