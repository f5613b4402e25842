"""The poller's pacing (``slipstream.network.pacing``) under a manual clock: the back-off ladder, the long
pause cut to the next timer, the busy nap, the recheck of input left unread and the pause of a poller that
cannot park. The poller itself (real time, real doorbells) is tested in test_network_aio and test_doorbell."""

from __future__ import annotations

import asyncio
import time

import pytest

from slipstream.network.aio.transport import IdleBackoff
from slipstream.network.pacing import (
    BUSY_NAP_EVERY_NS,
    UNPARKED_PAUSE_MAX_S,
    Backoff,
    Nap,
    Pacer,
    Park,
    Run,
    Sleep,
    Step,
    Wake,
    Yield,
)
from slipstream.testing import ManualClock

US = 1_000
MS = 1_000_000
YIELD_NS = 5 * US
"""How long one turn of the event loop takes in these tests."""


def spent(step: Step) -> int:
    """The time ``step`` takes, in ns."""
    return YIELD_NS if isinstance(step, Yield) else round(step.seconds * 1e9)


def idle_steps(backoff: Backoff, clock: ManualClock, count: int, *, nap: bool = False) -> list[Step]:
    """``count`` steps of the ladder with nothing to do, the clock moving by what each takes."""
    steps = []
    for _ in range(count):
        step = backoff.step(clock.now_ns(), nap=nap)
        steps.append(step)
        clock.advance(spent(step))
    return steps


def pauses(steps: list[Step]) -> list[float]:
    return [step.seconds for step in steps if isinstance(step, Sleep)]


def test_the_ladder_spins_then_pauses_doubling_to_the_cap_then_pauses_long() -> None:
    backoff, clock = Backoff(), ManualClock(10 * MS)
    steps = idle_steps(backoff, clock, 400)
    first_pause = next(i for i, step in enumerate(steps) if isinstance(step, Sleep))
    first_long = next(i for i, step in enumerate(steps) if isinstance(step, Sleep) and step.long)
    # Yields for spin_s (1 ms at 5 us a turn: 200 of them), then pauses doubling from 50 us to 1 ms...
    assert first_pause == 200 and all(isinstance(step, Yield) for step in steps[:first_pause])
    short = pauses(steps[first_pause:first_long])
    assert short[:8] == [5e-5, 1e-4, 2e-4, 4e-4, 8e-4, 1e-3, 1e-3, 1e-3] and set(short[5:]) == {1e-3}
    # ...and from 20 ms after the first pause, only the deep one (which the poller cuts to its timers).
    assert sum(short) == pytest.approx(0.02, abs=1e-3)
    assert len(steps) - first_long > 10 and all(step == Sleep(1.0, long=True) for step in steps[first_long:])


def test_the_ladder_spins_at_least_spins_times_however_slow_a_turn() -> None:
    backoff, clock = Backoff(), ManualClock()
    first = backoff.step(clock.now_ns(), nap=False)
    clock.advance(5 * MS)  # far past spin_s
    rest = idle_steps(backoff, clock, 10)
    assert isinstance(first, Yield)
    assert [isinstance(step, Yield) for step in rest] == [True] * 9 + [False]
    assert rest[-1] == Sleep(5e-5)


def test_a_spinning_ladder_gives_the_cpu_away_every_fourth_turn_or_naps_for_a_driver_thread() -> None:
    alone = idle_steps(Backoff(), ManualClock(), 12)
    assert [step for step in alone if isinstance(step, Yield) and step.give_cpu] == [Yield(give_cpu=True)] * 3
    assert [i for i, step in enumerate(alone) if step == Yield(give_cpu=True)] == [3, 7, 11]
    threaded = idle_steps(Backoff(), ManualClock(), 14, nap=True)
    assert threaded[:10] == [Yield()] * 10  # the first spins only yield: an answer may be just behind
    assert threaded[10:] == [Nap(2e-5)] * 4


def test_work_and_a_kick_start_the_ladder_over() -> None:
    clock = ManualClock()
    pacer = Pacer()
    steps = [pacer.cycled(clock.advance(2 * MS), 0, threaded=False) for _ in range(60)]
    assert isinstance(steps[-1], Sleep) and steps[-1].long  # deep in the ladder
    assert pacer.cycled(clock.advance(2 * MS), 3, threaded=False) == Yield()  # work: no pause
    again = pacer.cycled(clock.advance(2 * MS), 0, threaded=False)
    assert isinstance(again, Yield)  # spinning afresh
    backoff = IdleBackoff()
    idle_steps(backoff, clock, 300)
    assert isinstance(backoff.step(clock.now_ns(), nap=False), Sleep)
    backoff.kick()
    assert isinstance(backoff.step(clock.now_ns(), nap=False), Yield)


def test_a_kick_ends_a_pause_in_progress() -> None:
    async def main() -> float:
        backoff = IdleBackoff()
        started = time.monotonic()
        asyncio.get_running_loop().call_later(0.05, backoff.kick)
        await asyncio.wait_for(backoff.sleep(30.0), 10)
        return time.monotonic() - started

    assert asyncio.run(main()) < 5.0


def test_idle_backoff_keeps_its_seconds_api_over_the_ladder() -> None:
    backoff = IdleBackoff(spins=2, spin_s=0.0)
    assert backoff.next_pause(100.0) is None
    asyncio.run(backoff.idle(100.0, nap=False))
    asyncio.run(backoff.idle(100.0, nap=False))
    assert [backoff.next_pause(100.0 + i * 1e-3) for i in range(3)] == [5e-5, 1e-4, 2e-4]


def deep_pause(pacer: Pacer, clock: ManualClock) -> Sleep:
    """Cycles without work until the ladder gives its deep pause."""
    for _ in range(1000):
        step = pacer.cycled(clock.advance(2 * MS), 0, threaded=False)
        if isinstance(step, Sleep) and step.long:
            return step
    raise AssertionError("the ladder never reached its deep pause")


def test_a_long_pause_ends_at_the_next_timer_but_never_below_the_short_pause() -> None:
    clock = ManualClock()
    pacer = Pacer()
    step = deep_pause(pacer, clock)
    now = clock.now_ns()
    assert pacer.park_or_sleep(step, now, None, can_park=True) == Park(1.0, listen_inputs=True)
    assert pacer.park_or_sleep(step, now, now + 300 * MS, can_park=True) == Park(0.3, listen_inputs=True)
    assert pacer.park_or_sleep(step, now, now + 5 * 1_000 * MS, can_park=True) == Park(1.0, listen_inputs=True)
    # A timer due in 10 us, due now (a driver with data in flight) or overdue: the short pause, not a spin.
    for due in (now + 10 * US, now, now - 50 * MS):
        assert pacer.park_or_sleep(step, now, due, can_park=True) == Park(1e-3, listen_inputs=True)
    # A short pause is what the ladder says, whatever the timers.
    assert pacer.park_or_sleep(Sleep(2e-4), now, now + 10 * US, can_park=True) == Park(2e-4, listen_inputs=True)


def test_a_poller_that_cannot_park_sleeps_at_most_the_unparked_pause() -> None:
    clock = ManualClock()
    pacer = Pacer()
    step = deep_pause(pacer, clock)
    now = clock.now_ns()
    assert pacer.park_or_sleep(step, now, None, can_park=False) == Sleep(UNPARKED_PAUSE_MAX_S)
    assert pacer.park_or_sleep(step, now, now + 20 * MS, can_park=False) == Sleep(0.02)
    assert pacer.park_or_sleep(Sleep(4e-4), now, None, can_park=False) == Sleep(4e-4)


@pytest.mark.parametrize("threaded", [True, False])
def test_a_busy_poller_naps_every_millisecond_only_for_a_driver_thread(threaded: bool) -> None:
    clock = ManualClock(7 * MS)
    pacer = Pacer()
    naps: list[int] = []
    for _ in range(50):
        step = pacer.cycled(clock.advance(100 * US), 1, threaded=threaded)
        if isinstance(step, Nap):
            assert step.seconds == pacer.backoff.nap_s
            naps.append(clock.now_ns())
        else:
            assert step == Yield()  # busy: no sched_yield, no pause
    if not threaded:
        assert naps == []
        return
    start = 7 * MS + 100 * US  # the first busy cycle
    assert naps == [start + n * BUSY_NAP_EVERY_NS for n in range(1, 5)]
    # A cycle without work ends the busy spell: the next nap is a full BUSY_NAP_EVERY_NS of work away.
    pacer.cycled(clock.advance(100 * US), 0, threaded=True)
    steps = [pacer.cycled(clock.advance(100 * US), 1, threaded=True) for _ in range(10)]
    assert [isinstance(step, Nap) for step in steps] == [False] * 10
    assert isinstance(pacer.cycled(clock.advance(100 * US), 1, threaded=True), Nap)


def woken(wake: Wake) -> tuple[Pacer, ManualClock]:
    """A pacer deep in its ladder whose park ended by ``wake``, and its clock."""
    clock = ManualClock()
    pacer = Pacer()
    deep_pause(pacer, clock)
    pacer.woke(wake)
    return pacer, clock


def test_input_left_unread_is_rechecked_once_then_left_out_of_a_short_park() -> None:
    pacer, clock = woken(Wake.INPUT)
    # The cycle left the input readable: one more cycle (a datagram may have just come in)...
    assert pacer.cycled(clock.advance(10 * US), 0, threaded=False, unread_input=True) == Run()
    # ...and if it is still unread, the next park does not listen to it, and is short.
    step = pacer.cycled(clock.advance(10 * US), 0, threaded=False, unread_input=True)
    assert isinstance(step, Sleep) and step.long
    now = clock.now_ns()
    assert pacer.park_or_sleep(step, now, None, can_park=True) == Park(UNPARKED_PAUSE_MAX_S, listen_inputs=False)
    assert pacer.park_or_sleep(step, now, now + 30 * MS, can_park=True) == Park(0.03, listen_inputs=False)
    # Only that park: once it times out, the next listens again (no recheck without a wake by input).
    pacer.woke(Wake.TIMEOUT)
    step = pacer.cycled(clock.advance(100 * MS), 0, threaded=False, unread_input=True)
    assert isinstance(step, Sleep)
    assert pacer.park_or_sleep(step, clock.now_ns(), None, can_park=True) == Park(1.0, listen_inputs=True)


@pytest.mark.parametrize("second", ["taken", "work"])
def test_input_the_recheck_took_in_is_listened_to_again(second: str) -> None:
    pacer, clock = woken(Wake.INPUT)
    assert pacer.cycled(clock.advance(10 * US), 0, threaded=False, unread_input=True) == Run()
    if second == "taken":  # the late datagram was read by the second cycle: a plain pause follows
        step = pacer.cycled(clock.advance(10 * US), 0, threaded=False, unread_input=False)
        assert isinstance(step, Sleep)
        assert pacer.park_or_sleep(step, clock.now_ns(), None, can_park=True) == Park(1.0, listen_inputs=True)
    else:  # it was a message: work, spinning, and the pauses after listen again
        assert pacer.cycled(clock.advance(10 * US), 1, threaded=False, unread_input=True) == Yield()
        step = deep_pause(pacer, clock)
        assert pacer.park_or_sleep(step, clock.now_ns(), None, can_park=True) == Park(1.0, listen_inputs=True)
    # That wake is dealt with: input found readable later is no reason for another recheck.
    assert not isinstance(pacer.cycled(clock.advance(10 * US), 0, threaded=False, unread_input=True), Run)


def test_a_cycle_that_worked_after_a_wake_by_input_needs_no_recheck() -> None:
    pacer, clock = woken(Wake.INPUT)
    assert pacer.cycled(clock.advance(10 * US), 1, threaded=False, unread_input=True) == Yield()


@pytest.mark.parametrize("wake", [Wake.TIMEOUT, Wake.RUNG, Wake.KICK])
def test_only_a_wake_by_input_is_rechecked(wake: Wake) -> None:
    pacer, clock = woken(wake)
    step = pacer.cycled(clock.advance(10 * US), 0, threaded=False, unread_input=True)
    assert isinstance(step, Sleep)
    assert pacer.park_or_sleep(step, clock.now_ns(), None, can_park=True) == Park(1.0, listen_inputs=True)
