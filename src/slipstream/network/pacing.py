"""Pacing: when the network poller runs its next duty cycle, and how it waits meanwhile.

Sans-I/O: :class:`Pacer` takes ``now_ns`` and what the last cycle and the last pause did, and returns a decision,
pure data (:class:`Run`, :class:`Yield`, :class:`Nap`, :class:`Sleep`, :class:`Park`); no clock, sleep or event
loop here. ``aio/poller.py`` carries the decisions out, and ``aio/transport.IdleBackoff`` the steps of the
:class:`Backoff` ladder for the client's connect loops. The numbers are the ones the benchmarks (idle CPU, the
one-way latency to a parked receiver) were tuned with.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "BUSY_NAP_EVERY_NS",
    "UNPARKED_PAUSE_MAX_S",
    "Backoff",
    "Nap",
    "Pacer",
    "Park",
    "Run",
    "Sleep",
    "Step",
    "Wake",
    "Yield",
]

UNPARKED_PAUSE_MAX_S = 0.1
"""The longest pause of a poller that nothing would wake for some input: an image without a parking
slot (no doorbell), or an invoker-mode driver's input left out of the wait (a cycle left it unread).
Only the pause's end lets it see a message there."""

BUSY_NAP_EVERY_NS = 1_000_000
"""A poller busy this long without a pause naps once, when an embedded driver thread shares its GIL."""


@dataclass(frozen=True, slots=True)
class Run:
    """Run the next duty cycle at once."""


@dataclass(frozen=True, slots=True)
class Yield:
    """One turn of the event loop; ``give_cpu``: first give the CPU to any process waiting for it."""

    give_cpu: bool = False


@dataclass(frozen=True, slots=True)
class Nap:
    """A blocking sleep of ``seconds`` (the GIL let go), then one turn of the event loop."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Sleep:
    """A pause of ``seconds`` that only its end or a kick ends. ``long``: the deep pause, which
    :meth:`Pacer.park_or_sleep` cuts short to the next timer (so only then is that timer needed)."""

    seconds: float
    long: bool = False


@dataclass(frozen=True, slots=True)
class Park:
    """A pause of up to ``seconds`` parked on the doorbells (a writer rings), and on the invoker-mode
    drivers' input when ``listen_inputs``."""

    seconds: float
    listen_inputs: bool


Step = Yield | Nap | Sleep
"""A step of the back-off ladder."""


class Wake(StrEnum):
    """What ended a parked pause."""

    TIMEOUT = "timeout"
    RUNG = "rung"
    INPUT = "input"
    KICK = "kick"


_RUN = Run()
_YIELD = Yield()
_GIVE_CPU = Yield(give_cpu=True)


class Backoff:
    """The idle back-off ladder: yield for ``spin_s`` (at least ``spins`` times), then pause from 50 us
    doubling to 1 ms, and after 20 ms without work pause up to 1 s (the poller cuts that to its next
    timer: each wake-up of an idle endpoint is a cold start that costs far more on a loaded machine
    than on an idle one). asyncio cannot sleep less than about a millisecond (its selector waits in
    milliseconds), so right after work only yielding polls an answer that follows closely within
    microseconds. :meth:`reset` (work done, or a kick) starts over."""

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
        self._idle_since_ns: int | None = None
        self._spin_until_ns = 0

    def reset(self) -> None:
        """Work was done: start over with the short waits."""
        self._count = 0
        self._sleep_s = self.min_sleep_s
        self._idle_since_ns = None
        self._spin_until_ns = 0

    def pause(self, now_ns: int) -> float | None:
        """The pause the next wait takes (and the ladder moves on), or None while it only yields."""
        if self._count < self.spins or now_ns < self._spin_until_ns:
            return None
        if self._idle_since_ns is None:
            self._idle_since_ns = now_ns
        if now_ns - self._idle_since_ns >= self.deep_after_s * 1e9:
            return self.deep_sleep_s
        pause = self._sleep_s
        self._sleep_s = min(pause * 2, self.max_sleep_s)
        return pause

    def step(self, now_ns: int, *, nap: bool) -> Step:
        """The next wait: a pause, or a yield. ``nap``: an embedded driver thread shares our GIL, so
        spinning naps to let it in; without one (an invoker-mode or standalone driver) a nap only
        delays the answer (Linux sleeps 50 us or more)."""
        pause = self.pause(now_ns)
        if pause is not None:
            return Sleep(pause, long=pause > self.max_sleep_s)
        if self._count == 0:
            self._spin_until_ns = now_ns + round(self.spin_s * 1e9)
        self._count += 1
        if nap:
            # A bare yield would keep the GIL from the driver thread moving the data we wait for.
            return Nap(self.nap_s) if self._count > self.spins else _YIELD
        # Every fourth spin, give the CPU to a process waiting for it: the peer we just sent to is
        # woken on our CPU (the kernel puts a wakee near its waker) and would otherwise wait out our
        # millisecond of spinning. A parked receiver's one-way latency: 2.1 -> 1.1 ms over IPC, 2.1
        # -> 1.3 ms over UDP (/tmp probe, 30 ms apart); yielding on every spin cost a busy UDP round
        # trip 8 %, every fourth spin nothing measurable.
        return _YIELD if self._count & 3 else _GIVE_CPU


class Pacer:
    """The poller's decisions between duty cycles. After each cycle, :meth:`cycled` says what to do; a
    :class:`Sleep` from it is a pause, which :meth:`park_or_sleep` turns into a :class:`Park` on the
    doorbells (or a shorter :class:`Sleep` when the poller cannot park); :meth:`woke` hears what ended
    a park.

    The rules: work resets the ladder, and busy time naps every ``busy_nap_every_ns`` when an embedded
    driver thread shares the GIL (each loop turn lets the GIL go for a moment and takes it straight
    back, before a waiting thread can wake: the driver, and the data we are busy with, would starve
    for seconds on a loaded machine). Input that woke a park and that a cycle left unread must not
    wake us in a loop, so the next park leaves it out, and is short (nothing else ends it); but a
    datagram may also have come in just after the driver read its socket, so one more cycle first
    tells the two apart."""

    def __init__(
        self,
        backoff: Backoff | None = None,
        *,
        busy_nap_every_ns: int = BUSY_NAP_EVERY_NS,
        unparked_pause_max_s: float = UNPARKED_PAUSE_MAX_S,
    ) -> None:
        self.backoff = backoff if backoff is not None else Backoff()
        self.busy_nap_every_ns = busy_nap_every_ns
        self.unparked_pause_max_s = unparked_pause_max_s
        self.woken_by_input = False
        """The last park ended by input: the poller says after the next cycle whether it is still unread."""
        self._rechecked = False
        self._mute_inputs = False
        self._busy_since_ns: int | None = None

    def cycled(self, now_ns: int, work: int, *, threaded: bool, unread_input: bool = False) -> Run | Step:
        """A duty cycle at ``now_ns`` did ``work``. ``threaded``: an embedded driver thread shares our
        GIL. ``unread_input``: the input that woke the last park is still readable (asked only after a
        wake by input and a cycle without work)."""
        mute = unread_input and self.woken_by_input and not work
        if mute and not self._rechecked:
            self._rechecked = True
            return _RUN
        self._rechecked = False
        self.woken_by_input = False
        self._mute_inputs = mute
        if not work:
            self._busy_since_ns = None
            return self.backoff.step(now_ns, nap=threaded)
        self.backoff.reset()
        if self._busy_since_ns is None:
            self._busy_since_ns = now_ns
        elif now_ns - self._busy_since_ns >= self.busy_nap_every_ns:
            self._busy_since_ns = now_ns
            if threaded:
                return Nap(self.backoff.nap_s)
        return _YIELD

    def park_or_sleep(self, sleep: Sleep, now_ns: int, due_ns: int | None, *, can_park: bool) -> Sleep | Park:
        """How to spend the pause ``sleep`` that :meth:`cycled` chose. ``due_ns``: the earliest timer
        (needed only for a long pause; ``now_ns`` while a driver has data in flight); ``can_park``: every
        image has a parking slot, so a ring ends the pause (else the pause is short)."""
        seconds = self.until_due(sleep.seconds, now_ns, due_ns)
        if not can_park:
            return Sleep(min(seconds, self.unparked_pause_max_s))
        if self._mute_inputs:
            return Park(min(seconds, self.unparked_pause_max_s), listen_inputs=False)
        return Park(seconds, listen_inputs=True)

    def until_due(self, pause_s: float, now_ns: int, due_ns: int | None) -> float:
        """``pause_s``, cut short to end at ``due_ns``, but never below the ladder's short pause (a timer
        already due gets a cycle soon, not a spin; a short pause stays as it is). Chores with no timer
        run at the pause's end: late, but nothing is lost."""
        if due_ns is None:
            return pause_s
        return min(pause_s, max(self.backoff.max_sleep_s, (due_ns - now_ns) / 1e9))

    def woke(self, wake: Wake) -> None:
        """A park ended by ``wake``."""
        self.woken_by_input = wake == Wake.INPUT
