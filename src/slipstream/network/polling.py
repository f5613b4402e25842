"""The poller's logic, whichever adapter waits for it: the duty cycle of every server and client it polls
(and of invoker-mode drivers), when the next timer is due, parking on the doorbells of the logs they
read, and the loop of cycles and pauses as a generator of waits (:meth:`PollCore.waits`).

The generator yields what to wait for (a :class:`~.pacing.Step` of the back-off ladder, or
:class:`ParkOn`: doorbells and inputs for up to some seconds) and takes back what ended a park; the asyncio
poller awaits each wait, the blocking one blocks on it. When to cycle and how to wait is decided by
:class:`~.pacing.Pacer`."""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from enum import Enum

from ..client import Context, Image
from ..client.aio import Parking
from ..files.doorbell import Doorbell
from .endpoint import Polled
from .pacing import Pacer, Run, Sleep, Step, Wake
from .transport import earliest, input_pending

__all__ = [
    "SEEN_CYCLE", "SEEN_FRAME", "SEEN_INPUT", "SEEN_NOTHING", "SPIN_CHORES_MIN_NS", "SPIN_CHORES_NS",
    "ParkOn", "PollCore", "Seen", "Watch",
]  # fmt: skip

log = logging.getLogger("slipstream.network")

SPIN_CHORES_NS = 1_000_000
"""While a poller spins (idle, or busy with a stream of messages), how often it runs whole duty cycles at most;
in between it polls the connections alone, with the invoker-mode drivers only when one carries UDP
(:meth:`PollCore._spin_cycle`). A whole cycle also runs the endpoints' chores (handshakes, tables, error
summaries, the connections' timers) and an IPC-only driver's cycle (publication limits, commands): 35-65 us in
a slow phase of this VM even with nothing to do, and a frame that arrives meanwhile waits for it. The next whole
cycle comes sooner when a connection's timer (as the last whole cycle found them) is due sooner, or when an
IPC-only driver did work in the last one (a publisher pressing on its limit: :data:`SPIN_CHORES_MIN_NS`). What
waits up to this long: the chores without a timer (a handshake's first packet, an IPC publisher's limit while it
has room) and a timer started between whole cycles (an acknowledgement's, 10 ms by default; a ping's timeout).

Measured with a two-process blocking IPC round-trip probe, interleaved runs, a slow phase of the VM: at 200 us
the server's whole cycles (p50 65 us: the driver's 39, its IPC limits 22 of them, the chores 21) took a quarter
of its time and p50 round trips were 134-144 us; at 1 ms they were 75-106 us (4 pairs). Earlier, in a quiet
hour, 30, 50, 100 and 200 us had measured alike."""
SPIN_CHORES_MIN_NS = 50_000
"""The soonest a spinning poller's next whole cycle comes after one (see :data:`SPIN_CHORES_NS`)."""


Parked = tuple[Parking, list[Doorbell], list[int]]
"""A parking, the doorbells it rings and the invoker-mode drivers' input descriptors."""


@dataclass(frozen=True, slots=True)
class ParkOn:
    """Wait up to ``seconds`` on ``doorbells`` and the readable descriptors ``inputs``; send back the
    :class:`~.pacing.Wake` that ended it."""

    doorbells: Sequence[Doorbell]
    seconds: float
    inputs: Sequence[int]


class Watch:
    """What a caller spinning for an answer looks at between duty cycles instead of running them: a frame in an
    image of the endpoints' subscriptions, a datagram for an invoker-mode driver, or a timer due. Made
    after a cycle (the images it knows then), so a cycle with nothing to do is not repeated while nothing
    arrives: a check costs a few loads, a cycle of an idle endpoint several microseconds."""

    __slots__ = ("_due_ns", "_images", "_inputs")

    def __init__(self, images: list[Image], inputs: Sequence[int], due_ns: int | None) -> None:
        self._images = images
        self._due_ns = due_ns
        self._inputs: select.poll | None = None
        if inputs:
            self._inputs = select.poll()
            for fd in inputs:
                self._inputs.register(fd, select.POLLIN)

    def sees(self, now_ns: int) -> Seen:
        """What a duty cycle would find: a timer due (then the whole cycle), a frame (then the connections'
        part of it), input for a driver (its cycle, then the connections'), or nothing."""
        if self._due_ns is not None and now_ns >= self._due_ns:
            return SEEN_CYCLE
        for image in self._images:
            if image.has_frame():
                return SEEN_FRAME
        if self._inputs is not None and self._inputs.poll(0):
            return SEEN_INPUT
        return SEEN_NOTHING


class Seen(Enum):
    """What a :class:`Watch` saw."""

    NOTHING = 0
    FRAME = 1
    """A frame in an image: the connections' part of the duty cycle takes it in."""
    CYCLE = 2
    """A timer due: a whole duty cycle."""
    INPUT = 3
    """Datagrams for an invoker-mode driver: its cycle takes them in, then the connections' part of the duty
    cycle (the answer, most likely; a datagram no connection takes, a handshake's, waits for a whole cycle)."""


SEEN_NOTHING, SEEN_FRAME, SEEN_CYCLE, SEEN_INPUT = Seen.NOTHING, Seen.FRAME, Seen.CYCLE, Seen.INPUT
"""The members as module names: a spinning caller compares one on every look, and on Python 3.11 reading an
attribute of an Enum class goes through its metaclass's ``__getattr__`` hook (about 80 ns, eight times a global's)."""


class PollCore:
    """Every server and client one poller runs: a hundred clients in one process wake once per back-off
    step, not a hundred times."""

    def __init__(self, pacer: Pacer) -> None:
        self.endpoints: list[Polled] = []
        self.pacer = pacer
        self.backoff = pacer.backoff
        self._threaded_now = False
        self._network_now = False
        self._drivers_worked = False
        """The invoker-mode drivers did work in the last whole cycle (commands, a publisher's limit)."""
        self.idle = False
        """The last duty cycle did no work (set by :meth:`waits`)."""

    def waits(self) -> Generator[Step | ParkOn, Wake | None, None]:
        """Cycle while there are endpoints, yielding each wait the pacer decides on; a :class:`ParkOn` is
        answered with what ended it. The parking is held across pauses that time out."""
        pacer = self.pacer
        parked: Parked | None = None
        inputs: list[int] = []  # what the last park listened to
        spin_until_ns = 0  # (spinning, cycles without the chores until then: see SPIN_CHORES_NS)
        try:
            while self.endpoints:
                now_ns = time.monotonic_ns()
                if now_ns < spin_until_ns:
                    work = self._spin_cycle(now_ns)
                else:
                    work = self._cycle(now_ns)
                    spin_until_ns = self._chores_due_ns(now_ns)
                self.idle = not work
                unread = pacer.woken_by_input and not work and input_pending(inputs)
                step = pacer.cycled(now_ns, work, threaded=self._threaded(), unread_input=unread)
                if work and parked is not None:
                    parked[0].unpark()
                    parked = None
                if isinstance(step, Run):
                    continue
                if not isinstance(step, Sleep):
                    yield step
                    continue
                spin_until_ns = 0  # (after a pause, a whole cycle first)
                if parked is None:
                    parked = self._park()
                    if parked is not None and parked[0].ready():
                        continue  # appended before our bytes were visible: the next cycle takes it
                due_ns = self._due_ns(now_ns) if step.long else None
                pause = pacer.park_or_sleep(step, now_ns, due_ns, can_park=parked is not None)
                if isinstance(pause, Sleep):
                    yield pause
                    continue
                assert parked is not None  # the pacer parks only a poller that could
                inputs = parked[2] if pause.listen_inputs else []
                wake = yield ParkOn(parked[1], pause.seconds, inputs)
                assert wake is not None
                pacer.woke(wake)
                if wake != Wake.TIMEOUT:
                    # Images or endpoints may have changed: park afresh next time. A pause that timed
                    # out stays parked: no re-parking on every pause.
                    parked[0].unpark()
                    parked = None
        finally:
            if parked is not None:
                parked[0].unpark()

    def _watch(self, now_ns: int) -> Watch | None:
        """A :class:`Watch` over the endpoints' images and invoker-mode drivers' input, due at their next
        timer; None when a timer is due already (or a driver has data in flight): cycle on."""
        due_ns = self._due_ns(now_ns)
        if due_ns is not None and due_ns <= now_ns:
            return None
        images: list[Image] = []
        inputs: list[int] = []
        for context in self._contexts():
            fd = context.invoker_fileno()
            if fd is not None:
                inputs.append(fd)
            for subscription in context.subscriptions:
                images.extend(subscription.images)
        return Watch(images, inputs, due_ns)

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

    def _invoke_drivers(self) -> int:
        """One duty cycle of each invoker-mode driver the endpoints use (a no-op for the others); the work
        they did (datagrams taken in, but also their own chores). Notes on the way whether an embedded
        driver thread shares our GIL, and whether such a driver carries UDP (one pass per cycle)."""
        threaded = network = False
        work = 0
        for context in self._contexts():
            work += context.invoke()
            threaded = threaded or (context.is_embedded and not context.is_invoker)
            network = network or context.invoker_carries_network()
        self._threaded_now = threaded
        self._network_now = network
        return work

    def _cycle(self, now_ns: int) -> int:
        """One duty cycle of every endpoint, then of invoker-mode drivers; returns the endpoints' work (a
        driver's own chores, heartbeats and status messages, do not count, or an idle endpoint would
        never park).

        The endpoints come first: a frame already in an IPC image is taken in (and answered) without
        waiting for the drivers' cycle, which costs a few microseconds even with nothing to do. When a
        driver did work (it may have taken datagrams in), the connections are polled again at once, so a
        datagram is not left behind the endpoints' chores and a turn of the loop; if none took anything,
        the whole cycle runs again (the datagram may be a handshake's). What the application sends leaves
        without a driver cycle (``Connection._flush_out``); the rest (handshake packets, status messages)
        goes with the next one."""
        work = self._endpoints_cycle(now_ns)
        self._drivers_worked = bool(self._invoke_drivers())
        if self._drivers_worked:
            work += self._connections_cycle(now_ns) or self._endpoints_cycle(now_ns)
        return work

    def _spin_cycle(self, now_ns: int) -> int:
        """What a spinning poller runs between whole cycles (see :data:`SPIN_CHORES_NS`): the connections'
        part of the endpoints' cycles, and the invoker-mode drivers when one carries UDP (its datagrams come
        in only with its cycle), the connections again if they did work; the work done."""
        work = self._connections_cycle(now_ns)
        if self._network_now and self._invoke_drivers():
            work += self._connections_cycle(now_ns)
        return work

    def _input_cycle(self, now_ns: int) -> int:
        """A watch saw datagrams for an invoker-mode driver (:attr:`Seen.INPUT`): the drivers' cycles, then,
        if they did work, the connections' part of the endpoints' cycles, without the endpoints' chores in
        front of them; the connections' work (0: a whole cycle should follow)."""
        return self._connections_cycle(now_ns) if self._invoke_drivers() else 0

    def _endpoints_cycle(self, now_ns: int) -> int:
        """Every endpoint's duty cycle; the work done."""
        work = 0
        for endpoint in list(self.endpoints):
            try:
                work += endpoint.duty_cycle(now_ns)
            except Exception as exc:  # a bug must not silently stop every connection
                log.exception("network poller failed")
                endpoint.report_error(None, exc)
        return work

    def _poll_connections(self, now_ns: int) -> int:
        """The connections' part of every endpoint's duty cycle (a watch saw a frame); the work done."""
        return self._connections_cycle(now_ns)

    def _connections_cycle(self, now_ns: int) -> int:
        """:meth:`_poll_connections` itself (which an adapter wraps; a cycle calls this from inside its own)."""
        work = 0
        for endpoint in list(self.endpoints):
            try:
                work += endpoint.poll_connections(now_ns)
            except Exception as exc:  # as in a duty cycle: a bug must not silently stop every connection
                log.exception("network poller failed")
                endpoint.report_error(None, exc)
        return work

    def _chores_due_ns(self, now_ns: int) -> int:
        """When a spinning poller's next whole cycle is due: :data:`SPIN_CHORES_NS` after this one, or at the
        endpoints' earliest timer if that comes first (never sooner than :data:`SPIN_CHORES_MIN_NS`: a timer
        that stays due costs a whole cycle that often, not one per spin)."""
        if self._drivers_worked and not self._network_now:  # (a driver that carries UDP runs on every spin anyway)
            return now_ns + SPIN_CHORES_MIN_NS
        due = earliest((endpoint.next_deadline_ns(now_ns) for endpoint in self.endpoints), now_ns + SPIN_CHORES_NS)
        return max(now_ns + SPIN_CHORES_MIN_NS, due or 0)

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
