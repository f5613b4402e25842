"""The poller: one task per event loop runs the duty cycle of every server and client on it, and waits
without spinning when they are idle (parked on the doorbells of the logs they read). When to cycle and
how to wait is decided by :class:`~..pacing.Pacer`; this module carries its decisions out."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import ClassVar

from ...client import Context
from ...client.aio import Parking
from ...files.doorbell import Doorbell
from ..endpoint import Polled
from ..pacing import Pacer, Run, Sleep, Wake
from ..transport import earliest, input_pending
from .transport import IdleBackoff

__all__ = ["PollGroup"]

log = logging.getLogger("slipstream.network")


Parked = tuple[Parking, list[Doorbell], list[int]]
"""A parking, the doorbells it rings and the invoker-mode drivers' input descriptors."""


class PollGroup:
    """One poller task per event loop for every server and client on it: a hundred clients in one
    process wake once per back-off step, not a hundred times."""

    _groups: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PollGroup]] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.endpoints: list[Polled] = []
        self.backoff = IdleBackoff()
        self.pacer = Pacer(self.backoff)
        self.task: asyncio.Task[None] | None = None
        self._threaded_now = False

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
        park. Notes on the way whether an embedded driver thread shares our GIL (one pass per cycle)."""
        threaded = False
        for context in self._contexts():
            context.invoke()
            threaded = threaded or (context.is_embedded and not context.is_invoker)
        self._threaded_now = threaded

    async def _run(self) -> None:
        """Cycle, and carry out what the pacer decides; the parking is held across pauses that time out."""
        pacer, backoff = self.pacer, self.backoff
        parked: Parked | None = None
        inputs: list[int] = []  # what the last park listened to
        try:
            while self.endpoints:
                now_ns = time.monotonic_ns()
                work = self._cycle(now_ns)
                unread = pacer.woken_by_input and not work and input_pending(inputs)
                step = pacer.cycled(now_ns, work, threaded=self._threaded(), unread_input=unread)
                if work and parked is not None:
                    parked[0].unpark()
                    parked = None
                if isinstance(step, Run):
                    continue
                if not isinstance(step, Sleep):
                    await backoff.take(step)
                    continue
                if parked is None:
                    parked = self._park()
                    if parked is not None and parked[0].ready():
                        continue  # appended before our bytes were visible: the next cycle takes it
                due_ns = self._due_ns(now_ns) if step.long else None
                pause = pacer.park_or_sleep(step, now_ns, due_ns, can_park=parked is not None)
                if isinstance(pause, Sleep):
                    await backoff.take(pause)
                    continue
                assert parked is not None  # the pacer parks only a poller that could
                inputs = parked[2] if pause.listen_inputs else []
                wake = await backoff.park(parked[1], pause.seconds, inputs)
                pacer.woke(wake)
                if wake != Wake.TIMEOUT:
                    # Images or endpoints may have changed: park afresh next time. A pause that timed
                    # out stays parked: no re-parking on every pause.
                    parked[0].unpark()
                    parked = None
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

    def _due_ns(self, now_ns: int) -> int | None:
        """When the earliest timer of the endpoints' connections or of an invoker-mode driver's streams
        (heartbeats, status messages, NAKs) is due; ``now_ns`` while such a driver has data in flight."""
        invokers = [context for context in self._contexts() if context.is_invoker]
        if any(context.invoker_busy() for context in invokers):
            return now_ns
        due = earliest((endpoint.next_deadline_ns(now_ns) for endpoint in self.endpoints), None)
        return earliest((context.invoker_deadline_ns() for context in invokers), due)

    def _until_due(self, pause_s: float, now_ns: int) -> float:
        """``pause_s`` as a long pause would be cut to the next timer (see ``Pacer.until_due``)."""
        return self.pacer.until_due(pause_s, now_ns, self._due_ns(now_ns))

    def _threaded(self) -> bool:
        """Whether an embedded driver thread shares our GIL (then a spinning poller naps for it), as the
        last cycle found it."""
        return self._threaded_now

    def _park(self) -> Parked | None:
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
