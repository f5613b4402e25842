"""Registrations that do not block (Aeron's asyncAdd*): ``Context.async_add_*`` returns at once, the
answer is polled, a cancelled one leaves nothing behind, and asyncio code awaits them while its loop
goes on. An invoker-mode driver runs only inside ``invoke``, so each step here is deterministic."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from slipstream import Context
from slipstream.client import DriverError, Registration, RegistrationError, registered
from slipstream.driver.conductor import COMMAND_DRAIN_LIMIT

from .test_invoker import invoke_until_received, invoker_context

TIMEOUT_S = 20.0


def settle(ctx: Context, registration: Registration[object]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not registration.done:
        assert time.monotonic() < deadline, "the driver never answered"
        if ctx.invoke() == 0:
            time.sleep(0.0005)


def images_of(ctx: Context, channel: str, stream_id: int, within_s: float = 0.5) -> int:
    """How many publishers a fresh subscription sees within ``within_s`` (the driver invoked meanwhile)."""
    subscription = ctx.add_subscription(channel, stream_id)
    deadline = time.monotonic() + within_s
    while subscription.image_count == 0 and time.monotonic() < deadline:
        ctx.invoke()
        time.sleep(0.0005)
    count = subscription.image_count
    subscription.close()
    return count


def test_an_async_add_answers_only_once_the_driver_ran(driver_dir: Path) -> None:
    with invoker_context(driver_dir) as ctx:
        sub_registration = ctx.async_add_subscription("aeron:ipc", 5)
        pub_registration = ctx.async_add_exclusive_publication("aeron:ipc", 5)
        assert sub_registration.poll() is None and pub_registration.poll() is None  # the driver has not run
        assert not pub_registration.done
        settle(ctx, sub_registration)
        settle(ctx, pub_registration)
        subscription = sub_registration.poll()
        publication = pub_registration.poll()
        assert subscription is not None and publication is not None
        assert subscription.registration_id == sub_registration.registration_id
        assert publication.registration_id == pub_registration.registration_id
        assert pub_registration.poll() is publication  # the same object every time
        assert publication.offer(b"ping") > 0
        assert invoke_until_received(ctx, subscription) == [b"ping"]


def test_a_refused_registration_raises_from_poll_each_time_and_leaves_nothing(driver_dir: Path) -> None:
    with invoker_context(driver_dir) as ctx:
        registration = ctx.async_add_subscription("aeron:udp?endpoint=203.0.113.1:40456", 5)  # not ours: no bind
        assert ctx.subscriptions  # images that arrive before the answer are kept for it
        settle(ctx, registration)
        for _ in range(2):
            with pytest.raises(RegistrationError, match="cannot bind") as info:
                registration.poll()
        assert "Registration" not in "".join(str(line) for line in info.traceback[1:])  # raised fresh
        assert ctx.subscriptions == ()
        assert ctx.add_subscription("aeron:ipc", 6) is not None  # the context lives on


@pytest.mark.parametrize("answered", [False, True], ids=["before-the-answer", "after-the-answer"])
def test_a_cancelled_registration_is_removed_from_the_driver(driver_dir: Path, answered: bool) -> None:
    with invoker_context(driver_dir) as ctx:
        registration = ctx.async_add_exclusive_publication("aeron:ipc", 7)
        if answered:
            settle(ctx, registration)
            assert registration.poll() is not None
        registration.cancel()
        with pytest.raises(DriverError, match="cancelled"):
            registration.poll()
        assert images_of(ctx, "aeron:ipc", 7) == 0
        kept = ctx.async_add_exclusive_publication("aeron:ipc", 7)  # the control: one not cancelled is seen
        settle(ctx, kept)
        assert images_of(ctx, "aeron:ipc", 7) == 1


def test_more_commands_than_the_socket_holds_do_not_block_an_invoker_context(driver_dir: Path) -> None:
    """The command socket fills when hundreds of commands are sent before the driver runs; sending
    then runs the driver to make room (before, the sender waited for a reader that was itself)."""
    done = threading.Event()
    outcome: list[object] = []

    def burst() -> None:
        try:
            with invoker_context(driver_dir) as ctx:
                registrations = [ctx.async_add_subscription("aeron:ipc", 1000 + i) for i in range(2000)]
                for registration in registrations:
                    settle(ctx, registration)
                outcome.append(sum(r.poll() is not None for r in registrations))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=burst, daemon=True)
    worker.start()
    assert done.wait(60), "sending commands blocked"
    assert outcome == [2000]


@pytest.mark.parametrize("mode", ["invoker", "thread"])
def test_awaiting_registrations_lets_the_event_loop_run_and_a_cancelled_await_leaves_nothing(
    driver_dir: Path, mode: str
) -> None:
    """With a driver thread, the waiter is woken by the answer (nothing polls: a hundred polling
    waiters kept the GIL from that thread until its heartbeat stopped); in invoker mode it polls and
    runs the driver."""

    async def main() -> None:
        with invoker_context(driver_dir) if mode == "invoker" else Context(driver_dir, driver="embedded") as ctx:
            ticks = 0
            stop = False

            async def ticker() -> None:
                nonlocal ticks
                while not stop:
                    ticks += 1
                    await asyncio.sleep(0)

            task = asyncio.ensure_future(ticker())
            subscriptions = await asyncio.wait_for(
                asyncio.gather(*(registered(ctx.async_add_subscription("aeron:ipc", 100 + i)) for i in range(50))),
                TIMEOUT_S,
            )
            assert len(subscriptions) == 50 and ticks > 0
            before = ticks
            waiting = asyncio.ensure_future(registered(ctx.async_add_exclusive_publication("aeron:ipc", 9)))
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            stop = True
            await task
            assert ticks > before
            assert images_of(ctx, "aeron:ipc", 9) == 0
            kept = await registered(ctx.async_add_exclusive_publication("aeron:ipc", 9))  # the control
            assert images_of(ctx, "aeron:ipc", 9) == 1
            kept.close()

    asyncio.run(main())


def test_a_burst_of_commands_is_run_a_few_per_duty_cycle(driver_dir: Path) -> None:
    """Adding a stream costs the driver a millisecond or so: a burst is spread over duty cycles (each
    runs at most COMMAND_DRAIN_LIMIT), and while commands wait the driver says it is due at once."""
    with invoker_context(driver_dir) as ctx:
        burst = 3 * COMMAND_DRAIN_LIMIT + 1
        registrations = [ctx.async_add_subscription("aeron:ipc", 200 + i) for i in range(burst)]
        deadline = time.monotonic() + TIMEOUT_S
        answered: list[int] = []
        while len(answered) < burst:
            assert time.monotonic() < deadline
            before = sum(r.done for r in registrations)
            ctx.invoke()
            time.sleep(0.02)  # the client thread takes the answers in
            answered.append(sum(r.done for r in registrations))
            assert answered[-1] - before <= COMMAND_DRAIN_LIMIT
            if answered[-1] < burst and answered[-1] > before:
                assert ctx.invoker_deadline_ns() == 0  # the rest are due now, not at a stream's timer
        assert len(answered) >= 4  # 31 commands took four cycles at least


@pytest.mark.parametrize("mode", ["invoker", "thread"])
def test_closing_does_not_wait_yet_what_comes_next_sees_it_done(driver_dir: Path, mode: str) -> None:
    """A close sends the removal and returns (Aeron's clients do the same); commands are handled in
    order, so a subscription on the port just given up binds it again at once."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        channel = f"aeron:udp?endpoint=127.0.0.1:{probe.getsockname()[1]}"
    ctx = invoker_context(driver_dir) if mode == "invoker" else Context(driver_dir, driver="embedded")
    with ctx:
        for _ in range(20):
            subscription = ctx.add_subscription(channel, 5)
            subscription.close()
            assert subscription.is_closed
        publication = ctx.add_exclusive_publication("aeron:ipc", 5)
        publication.close()
        assert ctx.subscriptions == ()
    # The context closed cleanly: the directory is free for another driver.
    Context(driver_dir, driver="embedded").close()


def test_with_a_driver_thread_an_awaited_registration_is_woken_not_polled(
    driver_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls = [0]
    original = Registration.poll

    def counting(self: Registration[object]) -> object:
        polls[0] += 1
        return original(self)

    monkeypatch.setattr(Registration, "poll", counting)

    async def main() -> None:
        with Context(driver_dir, driver="embedded") as ctx:
            for stream_id in range(10):
                polls[0] = 0
                await asyncio.wait_for(registered(ctx.async_add_subscription("aeron:ipc", stream_id)), TIMEOUT_S)
                assert polls[0] <= 3  # before the wait, after the wake (and one spare for a race)

    asyncio.run(main())
