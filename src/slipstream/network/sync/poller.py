"""The blocking API's poller: one thread per process runs the duty cycle of every blocking server and
client, and a thread that waits for an answer (a remote call, ``receive``, ``ping``) runs the cycles itself
meanwhile, so the answer is taken in by the thread that wants it, with no hand-over between threads.

One re-entrant lock guards every machine the poller drives and the drivers it invokes: the poll thread
and a waiting caller hold it while they cycle, an application thread while it sends. A caller spinning for
its answer holds it between cycles too, and hands it over to a thread that waits for it (:class:`PollerLock`).
Listeners run on the thread that cycles (the poll thread, or a caller waiting for an answer), with the lock
held; they must not wait for an answer themselves (:class:`~..errors.BlockingListenerError`).

Waiting: the poll thread parks on the doorbells of the logs it reads (a writer rings) and on a pipe that
:meth:`PollThread.kick` writes to; with ``busy_poll`` it spins instead, stepping aside while an application
thread drives (two Python threads spinning would fight for the GIL)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import ClassVar, Generic, TypeVar

from ...files.doorbell import Doorbell
from ..endpoint import Polled
from ..errors import BlockingListenerError
from ..pacing import Backoff, Nap, Pacer, Sleep, Step, Wake
from ..polling import SEEN_CYCLE, SEEN_FRAME, SEEN_INPUT, SEEN_NOTHING, Parked, ParkOn, PollCore, Watch

__all__ = ["CALLER_SPIN_S", "Outcome", "PollThread", "PollerLock", "Signal", "ThreadBackoff"]

T = TypeVar("T")

log = logging.getLogger("slipstream.network")

CALLER_SPIN_S = 5e-4
"""How long a waiting caller runs the cycles itself before leaving them to the poll thread (without
``busy_poll``): an answer within this time is taken in by the caller, with no thread hand-over."""
DRIVEN_GRACE_NS = 2_000_000
"""A busy poll thread leaves the cycles to the application this long after a caller last drove them."""
SENT_ASIDE_NS = 1_000_000
"""The longest a busy poll thread stays aside at a stretch for an application thread's sends alone (no caller
drives): a thread that sends more often than every DRIVEN_GRACE_NS, and never waits, would otherwise keep every
listener, acknowledgement and timer of the process waiting for as long as it sends."""
HAND_OVER_NS = 2_000_000
"""How long a spinning caller that let the lock go waits for the threads that wanted it to take it, at most."""
HAND_OVER_SPINS = 64
"""A spinning caller looks for threads waiting for the lock (and yields the CPU) every this many turns."""
_SPIN_S = 5e-4
"""After work, how long the poll thread spins (yielding the GIL and the CPU between cycles) before it
parks: the next request of a steady stream is taken in without a wake-up."""
_SPIN_FOREVER_S = 1e9
_WATCH_NS = 1_000_000
"""A waiting caller runs a full duty cycle at least this often even when its watch sees nothing (new
images, chores of a driver with a thread of its own). When its watch sees a frame it runs only the
connections' part of the cycle, and when it sees datagrams for an invoker-mode driver that driver's cycle
and then the connections' part, so the answer is not taken in behind the endpoints' chores. (The poll
thread's own spin polls the connections between whole cycles instead, see ``..polling.SPIN_CHORES_NS``: a
watch there measured slower, twice, and again in 2026-11-29's interleaved runs of an asyncio IPC round trip
probe: 41 -> 45.5 us p50, where polling the connections measured 41 -> 36 us.)"""


class ThreadBackoff(Backoff):
    """The back-off ladder with blocking waits: a pause spent in ``select`` on the doorbells and on a
    pipe that :meth:`kick` writes to (so an application thread ends it at once)."""

    def __init__(self) -> None:
        super().__init__(spin_s=_SPIN_S)
        self._kick_read, self._kick_write = os.pipe()
        os.set_blocking(self._kick_read, False)
        os.set_blocking(self._kick_write, False)
        self.parked = False
        """True while waiting in :meth:`park` or :meth:`take`'s sleep."""
        self.pause_s = 0.0
        """How long the pause in progress (or the last one) may last."""
        self._kicked = _NOT_KICKED
        """A kick that came while not parked (the poll thread about to pause): the next :meth:`park` ends at once
        instead of sleeping it out (:data:`_KICKED_LONG`: only a long one)."""

    def busy(self, on: bool) -> None:
        """Spin (``busy_poll``) or wait on the doorbells when idle."""
        # Busy: yield, and nap (the GIL let go) after ``spins`` when an embedded driver thread needs it.
        self.spin_s = _SPIN_FOREVER_S if on else _SPIN_S
        self.reset()

    def kick(self, *, long_only: bool = False) -> None:
        """Reset the back-off and end a pause in progress, or the next one if none is (the poll thread may be
        between deciding on a pause and starting it); ``long_only``: only a pause longer than the ladder's
        short ones, which end soon by themselves."""
        self.reset()
        # (Noted before reading ``parked``, which park sets before reading this: one of the two sees the other.)
        self._kicked = max(self._kicked, _KICKED_LONG if long_only else _KICKED)
        if self.parked and not (long_only and self.pause_s <= self.max_sleep_s):
            with contextlib.suppress(BlockingIOError):
                os.write(self._kick_write, b"k")

    def take(self, step: Step) -> None:
        """Carry out ``step``: a pause (a kick ends it), a nap, or a yield of the CPU (which lets the GIL go)."""
        if isinstance(step, Sleep):
            self.park((), step.seconds)
        elif isinstance(step, Nap):
            time.sleep(step.seconds)
        else:
            os.sched_yield()  # (lets the GIL go too: the application's threads get their turn)

    def park(self, doorbells: Sequence[Doorbell], pause_s: float, inputs: Sequence[int] = ()) -> Wake:
        """A pause of up to ``pause_s`` on ``doorbells``, the readable descriptors ``inputs`` and the kick
        pipe; what ended it. The caller has set its parked bytes and checked its images once more."""
        bells = {bell.fileno(): bell for bell in doorbells}
        fds = [self._kick_read, *bells, *inputs]
        self.pause_s = pause_s
        self.parked = True
        kicked, self._kicked = self._kicked, _NOT_KICKED
        if kicked == _KICKED or (kicked == _KICKED_LONG and pause_s > self.max_sleep_s):
            self.parked = False  # kicked before it began (a byte the kick wrote too just ends the next one early)
            return Wake.KICK
        try:
            readable = _readable(fds, max(0.0, pause_s))
        except OSError:  # a doorbell or input closed meanwhile (its context went): park afresh, soon
            time.sleep(min(pause_s, self.max_sleep_s))
            return Wake.KICK
        finally:
            self.parked = False
        if not readable:
            return Wake.TIMEOUT
        rung = False
        for fd in readable:
            if fd == self._kick_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._kick_read, 512)
            elif (bell := bells.get(fd)) is not None:
                bell.drain()
                rung = True
        if rung:
            return Wake.RUNG
        return Wake.KICK if self._kick_read in readable else Wake.INPUT


_NOT_KICKED, _KICKED_LONG, _KICKED = 0, 1, 2


class PollerLock:
    """The poller's re-entrant lock, which knows whether a thread is waiting for it.

    A caller spinning for its answer holds it from cycle to cycle (taking it for each cycle would cost a
    round trip more than the cycles). With ``busy_poll`` it spins until the answer comes, which may be never:
    every :data:`HAND_OVER_SPINS` turns it looks whether another thread waits for the lock (to send, close, or
    wait for an answer of its own) and lets it go to that thread (:meth:`hand_over`)."""

    __slots__ = ("_held", "_waiting", "raw")

    def __init__(self) -> None:
        self.raw = threading.RLock()
        """The lock itself. A hot path that may wait for it takes it as ``with`` does, in C: ``raw.acquire(False)``,
        else :meth:`acquire_waiting`; ``raw.release()`` after. The poll thread, which stands aside while a caller
        drives, takes it plainly (``with raw``): nobody needs to hand it over to that thread."""
        self._waiting: list[None] = []
        """One entry per thread blocked taking the lock (list appends and pops are atomic)."""
        self._held: list[int] = []
        """The thread that holds it through ``with``, once per level (only the holder's id can be there)."""

    def __enter__(self) -> None:
        if not self.raw.acquire(blocking=False):
            self.acquire_waiting()
        self._held.append(threading.get_ident())

    def __exit__(self, *exc: object) -> None:
        self._held.pop()
        self.raw.release()

    def held_here(self) -> bool:
        """Whether the calling thread holds it through ``with`` (the raw users never wait with it held)."""
        held = self._held
        return bool(held) and held[-1] == threading.get_ident()

    def acquire_waiting(self) -> None:
        """Take the lock, saying meanwhile that this thread waits for it (a caller spinning with it hands it over)."""
        waiting = self._waiting
        waiting.append(None)
        try:
            self.raw.acquire()
        finally:
            waiting.pop()

    @property
    def wanted(self) -> bool:
        """Whether another thread is waiting to take the lock."""
        return bool(self._waiting)

    def hand_over(self) -> None:
        """Let the lock go (the calling thread holds it once) until the threads waiting for it have taken it,
        or :data:`HAND_OVER_NS`; then take it back (waiting in turn, so a thread spinning with it hands it back)."""
        self.raw.release()
        try:
            deadline_ns = time.monotonic_ns() + HAND_OVER_NS
            while self._waiting and time.monotonic_ns() < deadline_ns:
                os.sched_yield()
        finally:
            interrupted: BaseException | None = None
            while True:  # (taken back even if an interrupt comes meanwhile: the caller releases it after)
                try:
                    self.acquire_waiting()
                    break
                except BaseException as exc:
                    interrupted = interrupted or exc
            if interrupted is not None:
                raise interrupted


def _readable(fds: list[int], timeout_s: float) -> list[int]:
    """Which of ``fds`` became readable within ``timeout_s``: ``select`` (microsecond timeouts) while every
    descriptor fits its set, ``poll`` (millisecond ones) in a process with more than 1024 open."""
    if max(fds) < 1024:
        return select.select(fds, [], [], timeout_s)[0]
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(timeout_s * 1e3)]


class PollThread(PollCore):
    """The process's poll thread for blocking endpoints, and the lock over what it drives."""

    _shared: ClassVar[PollThread | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.backoff: ThreadBackoff = ThreadBackoff()
        super().__init__(Pacer(self.backoff))
        self.lock = PollerLock()
        """Held while a machine of the polled endpoints is driven (by the poll thread, a waiting caller,
        or an application thread sending)."""
        self._state = threading.Lock()
        self._thread: threading.Thread | None = None
        self._busy: set[int] = set()
        """The ids of the endpoints that asked for ``busy_poll``."""
        self._local = threading.local()
        self._driving = 0
        self._driven_ns = 0
        self._kept: tuple[Watch, int] | None = None
        """The last caller's watch and until when it holds (see :meth:`drive`); dropped when anything else
        runs a cycle or kicks."""
        self._resumed = threading.Event()
        """Set when a caller that ran the cycles leaves them to the poll thread."""

    @classmethod
    def shared(cls) -> PollThread:
        """The process's poll thread (made on first use; its thread runs while endpoints are polled)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = PollThread()
            return cls._shared

    @classmethod
    def reset_after_fork(cls) -> None:
        """In a forked child: the parent's poll thread did not come along (a new one is made on first use)."""
        cls._shared = None
        cls._shared_lock = threading.Lock()

    # -- endpoints ----------------------------------------------------------------------------------

    def add(self, endpoint: Polled, *, busy: bool = False) -> None:
        """Poll ``endpoint`` from now on (starting the thread if needed); ``busy``: spin when idle."""
        with self._state:
            if endpoint not in self.endpoints:
                self.endpoints.append(endpoint)
            if busy:
                self._busy.add(id(endpoint))
            self.backoff.busy(bool(self._busy))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="slipstream-network-poller", daemon=True)
                self._thread.start()
        self.kick()

    def remove(self, endpoint: Polled) -> None:
        """Stop polling ``endpoint`` (the thread ends with the last one)."""
        with self._state:
            if endpoint in self.endpoints:
                self.endpoints.remove(endpoint)
            self._busy.discard(id(endpoint))
            self.backoff.busy(bool(self._busy))
        self.kick()

    def kick(self, *, long_only: bool = False) -> None:
        """Have the poll thread run a cycle now (new work, or a new timer; a caller's kept watch, which knows
        neither, is dropped); ``long_only``: only if it is in a long pause (a short one ends within a
        millisecond anyway)."""
        self._kept = None
        self.backoff.kick(long_only=long_only)

    def note_application(self) -> None:
        """An application thread sent something: a busy poll thread leaves it the GIL for a moment."""
        if self._busy and not self.cycling:
            self._driven_ns = time.monotonic_ns()

    # -- cycles ----------------------------------------------------------------------------------------

    @property
    def cycling(self) -> bool:
        """Whether the calling thread is inside a duty cycle (a listener runs)."""
        return bool(getattr(self._local, "cycling", False))

    def _cycle(self, now_ns: int) -> int:
        return self._as_cycling(super()._cycle, now_ns)

    def _poll_connections(self, now_ns: int) -> int:
        return self._as_cycling(super()._poll_connections, now_ns)

    def _spin_cycle(self, now_ns: int) -> int:
        return self._as_cycling(super()._spin_cycle, now_ns)

    def _input_cycle(self, now_ns: int) -> int:
        return self._as_cycling(super()._input_cycle, now_ns)

    def _as_cycling(self, run: Callable[[int], int], now_ns: int) -> int:
        """``run(now_ns)`` with the lock held, the calling thread marked as cycling (listeners run)."""
        with self.lock.raw:  # (a waiting caller holds it already; the poll thread needs no hand-over)
            if not self._driving:  # (the poll thread: images and timers may change behind a kept watch)
                self._kept = None
            self._local.cycling = True
            try:
                return run(now_ns)
            finally:
                self._local.cycling = False

    def _park(self) -> Parked | None:
        with self.lock.raw:
            return super()._park()

    def _run(self) -> None:
        """The poll thread: serve while endpoints remain (a bug logged, never the end of every connection)."""
        while True:
            try:
                self._serve()
            except Exception:
                log.exception("network poll thread failed")
                time.sleep(0.01)
            with self._state:
                if not self.endpoints:
                    self._thread = None
                    return

    def _serve(self) -> None:
        """Carry out each wait of :meth:`~..polling.PollCore.waits`, stepping aside while an application
        thread drives the cycles itself."""
        waits = self.waits()
        try:
            wait = next(waits)
            while True:
                wake: Wake | None = None
                self._step_aside()
                if isinstance(wait, ParkOn):
                    wake = self.backoff.park(wait.doorbells, wait.seconds, wait.inputs)
                else:
                    self.backoff.take(wait)
                wait = waits.send(wake)
        except StopIteration:
            pass
        finally:
            waits.close()

    def _step_aside(self) -> None:
        """While an application thread drives the cycles (or did, or sent, a moment ago, with ``busy_poll``:
        two Python threads that both spin hand the GIL over only every few milliseconds), wait; for sends
        alone, no longer than :data:`SENT_ASIDE_NS` at a stretch."""
        aside_ns = 0
        while self._driven():
            if self._driving:
                aside_ns = 0
            else:
                now_ns = time.monotonic_ns()
                if not aside_ns:
                    aside_ns = now_ns
                elif now_ns - aside_ns >= SENT_ASIDE_NS:
                    return  # a cycle now: nobody waits for an answer, and the sends go on
            self._resumed.clear()
            if self._driven():
                self._resumed.wait(DRIVEN_GRACE_NS / 2e9)  # (each wake takes the GIL from a spinning caller)

    def _driven(self) -> bool:
        """Whether an application thread drives the cycles, or did (or sent) within DRIVEN_GRACE_NS with
        ``busy_poll``. Asked before every wait of a spinning poll thread: no closure, the cheap test first."""
        if not self._driving and not (self._busy and time.monotonic_ns() - self._driven_ns < DRIVEN_GRACE_NS):
            return False
        return bool(self.endpoints)

    def drive(
        self, done: Callable[[], bool], block: Callable[[float], object], deadline_ns: int | None, *, busy: bool
    ) -> bool:
        """Run the duty cycles in the calling thread until ``done()`` (True) or ``deadline_ns`` (False).
        Without ``busy`` only for :data:`CALLER_SPIN_S`; then ``block(seconds)`` waits (woken, or not, by
        what the poll thread does), in slices, until done or the deadline."""
        if self.cycling:
            raise BlockingListenerError(
                "a listener cannot wait for an answer (it runs inside the cycle that would take the answer "
                "in): send with send_nowait, or wait in another thread"
            )
        spin_until = time.monotonic_ns() + (2**62 if busy else int(CALLER_SPIN_S * 1e9))
        turns = 0
        watch: Watch | None = None
        watch_until_ns = 0
        lock = self.lock
        raw = lock.raw
        # Held already (a connect step's listener waits): handing it over would let go of one level only.
        nested = lock.held_here()
        if not raw.acquire(blocking=False):  # (``with lock``, in C when nobody holds it: once per answer)
            lock.acquire_waiting()
        try:
            self._driving += 1
            if self._kept is not None:  # the last caller's watch, if nothing else cycled since
                watch, watch_until_ns = self._kept
            kept_until_ns = watch_until_ns
            try:
                while not done():
                    now_ns = time.monotonic_ns()
                    if deadline_ns is not None and now_ns >= deadline_ns:
                        return False
                    if now_ns >= spin_until:
                        break
                    turns += 1
                    if not turns % HAND_OVER_SPINS:
                        if lock.wanted and not nested:  # another thread waits to send, close or wait: it goes first
                            lock.hand_over()
                            watch = None  # (what it did may need a whole cycle: a new image, a timer)
                            continue
                        os.sched_yield()  # (give a process waiting for this CPU its turn now and then)
                    seen = SEEN_CYCLE if watch is None or now_ns >= watch_until_ns else watch.sees(now_ns)
                    if seen is SEEN_NOTHING:
                        continue
                    if seen is SEEN_FRAME and self._poll_connections(now_ns):
                        watch_until_ns = 0  # (a whole cycle next, if the answer was not in it)
                        continue
                    if seen is SEEN_INPUT and self._input_cycle(now_ns):
                        watch_until_ns = 0
                        continue
                    # A timer, or a frame or datagram no connection took (a handshake's): the whole cycle.
                    if self._cycle(now_ns):
                        watch = None
                        continue
                    if self._threaded():  # (an embedded driver thread moves the answer: no watch sees it)
                        time.sleep(self.backoff.nap_s)
                        continue
                    watch, watch_until_ns = self._watch(now_ns), now_ns + _WATCH_NS
                    kept_until_ns = watch_until_ns
                else:
                    return True
            finally:
                # Kept for the next caller (the next round trip's answer, most likely): it starts with the watch
                # instead of a whole cycle and a new watch. What the answer's cycle changed (a timer, an image)
                # waits for the watch's end at most.
                self._kept = None if watch is None else (watch, watch_until_ns or kept_until_ns)
                self._driving -= 1
                self._driven_ns = time.monotonic_ns()
                if not self._busy:
                    # (Busy, the poll thread keeps out for DRIVEN_GRACE_NS anyway: waking it now only has it
                    # take the GIL from the caller, at its next system call, to go back to waiting.)
                    self._resumed.set()
        finally:
            raw.release()
        self.kick()  # the poll thread takes over the cycles
        while not done():
            remaining = None if deadline_ns is None else (deadline_ns - time.monotonic_ns()) / 1e9
            if remaining is not None and remaining <= 0:
                return False
            block(0.05 if remaining is None else min(0.05, remaining))
        return True


class Signal:
    """A flag that the cycling thread sets and other threads may block on, cheap when none blocks (the usual
    case: a waiting caller runs the cycles itself and only reads the flag). The ``threading.Event`` behind
    it (a lock and a condition to make, set and clear) exists only once a thread waits."""

    __slots__ = ("_event", "_on")

    _making: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._on = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        """Whether it is set (a plain read: what a caller running the cycles checks)."""
        return self._on

    def set(self) -> None:
        """Set it, waking any thread blocked in :meth:`wait`."""
        self._on = True  # (before reading _event: a waiter making it reads _on after)
        if (event := self._event) is not None:
            event.set()

    def clear(self) -> None:
        """Clear it (only the thread that consumes what it signals does)."""
        self._on = False
        if (event := self._event) is not None:
            event.clear()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until set; whether it is."""
        event = self._event
        if event is None:
            with self._making:
                if (event := self._event) is None:
                    event = self._event = threading.Event()
        if self._on:  # (set before the event existed)
            return True
        return event.wait(timeout)


class Outcome(Generic[T]):
    """What one blocking caller waits for: a result or an exception, set by whichever thread cycles."""

    __slots__ = ("_error", "_result", "_signal")

    def __init__(self) -> None:
        self._signal = Signal()
        self._result: T | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._signal.is_set()

    def set_result(self, result: T) -> None:
        self._result = result
        self._signal.set()

    def set_exception(self, exception: BaseException) -> None:
        self._error = exception
        self._signal.set()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for the outcome; whether it is there."""
        return self._signal.wait(timeout)

    def result(self) -> T:
        """The result (raising the exception instead); only once :meth:`done`."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


os.register_at_fork(after_in_child=PollThread.reset_after_fork)
