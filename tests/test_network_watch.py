"""``polling.Watch``: what a caller spinning for an answer sees between duty cycles, on real logs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from slipstream import Context, DriverConfig
from slipstream.network.polling import Seen, Watch


def test_a_watch_tells_a_frame_from_a_timer_and_from_nothing(driver_dir: Path) -> None:
    config = DriverConfig(directory=driver_dir, ipc_term_length=64 * 1024)
    with Context(driver_dir, driver="embedded", driver_config=config) as context:
        subscription = context.add_subscription("aeron:ipc", 11)
        publication = context.add_publication("aeron:ipc", 11)
        deadline = time.monotonic() + 10
        while not subscription.images:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        now_ns = time.monotonic_ns()
        watch = Watch(list(subscription.images), (), now_ns + 1_000_000_000)
        assert watch.sees(now_ns) is Seen.NOTHING
        while publication.offer(b"answer") < 0:
            assert time.monotonic() < deadline
        assert watch.sees(now_ns) is Seen.FRAME  # the connections' part of a cycle takes it in
        assert watch.sees(now_ns + 1_000_000_000) is Seen.CYCLE  # a timer due: the whole cycle
        got: list[bytes] = []
        while not got:
            subscription.poll(lambda buffer, header: got.append(bytes(buffer)), 10)
            assert time.monotonic() < deadline
        assert got == [b"answer"]
        assert watch.sees(now_ns) is Seen.NOTHING  # taken in: nothing more to see
        assert Watch([], (), None).sees(now_ns) is Seen.NOTHING


def test_input_for_an_invoker_mode_driver_asks_for_its_cycle_then_the_connections() -> None:
    read, write = os.pipe()
    try:
        watch = Watch([], (read,), None)
        assert watch.sees(time.monotonic_ns()) is Seen.NOTHING
        os.write(write, b"x")  # a datagram or a command waits: only the driver's duty cycle takes it in
        assert watch.sees(time.monotonic_ns()) is Seen.INPUT  # the driver's cycle, then the connections'
    finally:
        os.close(read)
        os.close(write)
