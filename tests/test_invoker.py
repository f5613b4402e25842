"""Invoker mode: an embedded driver without a thread, run by the application's own loop."""

from __future__ import annotations

import shutil
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream import Context, DriverConfig, Header, MediaDriver, Subscription

TIMEOUT_S = 20.0


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def two_dirs() -> Iterator[tuple[Path, Path]]:
    base = Path("/dev/shm") / f"slipstream-test-{uuid.uuid4().hex[:12]}"
    yield base.with_name(base.name + "-a"), base.with_name(base.name + "-b")
    for suffix in ("-a", "-b"):
        shutil.rmtree(base.with_name(base.name + suffix), ignore_errors=True)


def invoker_context(directory: Path) -> Context:
    config = DriverConfig(directory=directory, threading_mode="invoker")
    return Context(directory, driver="embedded", driver_config=config)


def driver_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("slipstream-driver")]


def test_threading_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="threading_mode must be one of dedicated, invoker"):
        DriverConfig(threading_mode="shared").validate()


def test_udp_stream_moves_only_inside_invoke_and_arrives_whole(two_dirs: tuple[Path, Path]) -> None:
    """Publisher and subscriber each embed an invoker-mode driver; one thread drives both."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with invoker_context(two_dirs[0]) as sender, invoker_context(two_dirs[1]) as receiver:
        assert sender.is_invoker and receiver.is_invoker
        assert driver_threads() == []
        sub = receiver.add_subscription(channel, 7)
        pub = sender.add_exclusive_publication(channel, 7)

        # Nobody invokes: no SETUP leaves, so nothing connects.
        time.sleep(0.3)
        assert not pub.is_connected and not sub.is_connected

        deadline = time.monotonic() + TIMEOUT_S
        while not (pub.is_connected and sub.is_connected):
            assert time.monotonic() < deadline, "not connected while invoking"
            sender.invoke()
            receiver.invoke()

        count, sent_crc, got = 20_000, 0, []
        received_crc = 0

        def on_fragment(payload: memoryview, header: Header) -> None:
            nonlocal received_crc
            received_crc = zlib.crc32(payload, received_crc)
            got.append(len(payload))

        index = 0
        while len(got) < count:
            assert time.monotonic() < deadline, f"stalled at {len(got)} of {count}"
            while index < count:
                message = index.to_bytes(4, "little") * (1 + index % 40)
                if pub.offer(message) < 0:
                    break
                sent_crc = zlib.crc32(message, sent_crc)
                index += 1
            sender.invoke()
            receiver.invoke()
            sub.poll(on_fragment, 256)
        assert received_crc == sent_crc
        assert sum(got) == sum(4 * (1 + i % 40) for i in range(count))

        # Closing drains the publication through invoke: the subscriber's image sees end of stream.
        image = sub.images[0]
        pub.close()
        while not image.is_end_of_stream:
            assert time.monotonic() < deadline, "no end of stream"
            sender.invoke()
            receiver.invoke()
            sub.poll(on_fragment, 256)


def test_invoke_is_a_no_op_without_an_invoker_driver(driver_dir: Path) -> None:
    with Context(driver_dir, driver="embedded") as ctx:
        assert not ctx.is_invoker
        assert ctx.invoke() == 0
        assert driver_threads()


def invoke_until_received(ctx: Context, sub: Subscription) -> list[bytes]:
    """Invoke the context's driver and poll ``sub`` until something arrives (within ``TIMEOUT_S``)."""
    seen: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while not seen:
        assert time.monotonic() < deadline
        ctx.invoke()
        sub.poll(lambda payload, header: seen.append(bytes(payload)), 10)
    return seen


def test_invoker_driver_answers_commands_and_closes_cleanly(driver_dir: Path) -> None:
    """Registration waits invoke the driver; close drains and releases the directory."""
    with invoker_context(driver_dir) as ctx:
        sub = ctx.add_subscription("aeron:ipc", 3)
        pub = ctx.add_exclusive_publication("aeron:ipc", 3)
        assert pub.offer(b"hello") > 0
        assert invoke_until_received(ctx, sub) == [b"hello"]
    # The directory is free again: another driver can take it.
    MediaDriver(DriverConfig(directory=driver_dir)).start().close()


def test_invoker_busy_while_a_stream_has_data_in_flight(two_dirs: tuple[Path, Path]) -> None:
    """An event loop parks long only when no stream of its invoker-mode driver has data in flight: a
    subscriber in another process would move without waking it, and its publisher waits on our limit."""
    seen: list[bytes] = []

    def drain(ctx: Context, sub: Subscription, deadline: float) -> None:
        while ctx.invoker_busy():
            assert time.monotonic() < deadline, "still busy with everything consumed"
            ctx.invoke()
            sub.poll(lambda payload, header: seen.append(bytes(payload)), 10)

    with invoker_context(two_dirs[0]) as ctx:
        assert not ctx.invoker_busy()
        sub = ctx.add_subscription("aeron:ipc", 4)
        pub = ctx.add_exclusive_publication("aeron:ipc", 4)
        deadline = time.monotonic() + TIMEOUT_S
        while not pub.is_connected:
            assert time.monotonic() < deadline
            ctx.invoke()
        assert not ctx.invoker_busy()
        assert pub.offer(b"ipc") > 0
        assert ctx.invoker_busy()  # appended, not yet read
        drain(ctx, sub, deadline)
        assert seen == [b"ipc"]

        channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        udp_sub = ctx.add_subscription(channel, 5)
        udp_pub = ctx.add_exclusive_publication(channel, 5)
        while not (udp_pub.is_connected and udp_sub.image_count):
            assert time.monotonic() < deadline
            ctx.invoke()
        drain(ctx, udp_sub, deadline)
        assert udp_pub.offer(b"udp") > 0
        assert ctx.invoker_busy()  # not yet sent
        drain(ctx, udp_sub, deadline)
        while not seen[1:]:
            assert time.monotonic() < deadline
            ctx.invoke()
            udp_sub.poll(lambda payload, header: seen.append(bytes(payload)), 10)
        assert seen == [b"ipc", b"udp"]
    with Context(two_dirs[1], driver="embedded") as threaded:
        assert not threaded.invoker_busy()  # a driver thread keeps its own time


def test_send_now_sends_one_udp_publication_without_a_duty_cycle(two_dirs: tuple[Path, Path]) -> None:
    """``send_now`` puts what the application just offered on the wire at once (the network layer
    calls it after each flush, instead of waiting for its poller's next duty cycle); nothing for IPC
    or for a driver with its own thread."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with invoker_context(two_dirs[0]) as sender, invoker_context(two_dirs[1]) as receiver:
        sub = receiver.add_subscription(channel, 8)
        pub = sender.add_exclusive_publication(channel, 8)
        ipc = sender.add_exclusive_publication("aeron:ipc", 8)
        deadline = time.monotonic() + TIMEOUT_S
        while not (pub.is_connected and sub.image_count):
            assert time.monotonic() < deadline, "not connected while invoking"
            sender.invoke()
            receiver.invoke()
        assert sender.send_now(pub) == 0  # nothing offered: nothing sent
        seen: list[bytes] = []
        for payload in (b"first", b"second"):
            limit = pub.position_limit
            assert pub.offer(payload) > 0
            assert sender.send_now(pub) == 1  # the datagram left without sender.invoke()
            assert pub.position_limit > limit  # and the publisher's window moved with it, as a duty cycle does
            while len(seen) < 1 + (payload == b"second"):
                assert time.monotonic() < deadline, f"{payload!r} did not arrive"
                receiver.invoke()
                sub.poll(lambda data, header: seen.append(bytes(data)), 10)
        assert seen == [b"first", b"second"]
        assert sender.send_now(ipc) == 0
    with Context(two_dirs[1], driver="embedded") as threaded:
        udp = threaded.add_exclusive_publication(channel, 9)
        assert threaded.send_now(udp) == 0


def test_ipc_limits_are_recomputed_every_interval_or_every_cycle_under_pressure(driver_dir: Path) -> None:
    """Recomputing the IPC limits reads every subscriber's position: a spinning invoker would pay it on
    each turn, so it runs every IPC_TRACK_INTERVAL_NS, and on every duty cycle while a publisher has
    used more than half its window (so a fast publisher never waits an interval for its limit)."""
    from slipstream.driver.conductor import IPC_TRACK_INTERVAL_NS

    config = DriverConfig(directory=driver_dir, threading_mode="invoker", ipc_term_length=64 * 1024)
    with Context(driver_dir, driver="embedded", driver_config=config) as ctx:
        sub = ctx.add_subscription("aeron:ipc", 6)
        pub = ctx.add_exclusive_publication("aeron:ipc", 6)
        deadline = time.monotonic() + TIMEOUT_S
        while not (pub.is_connected and sub.image_count):  # the image too: consume() must read from it
            assert time.monotonic() < deadline
            ctx.invoke()
        driver = ctx._embedded
        assert driver is not None and driver._conductor is not None
        conductor = driver._conductor
        window = conductor.publications[pub.registration_id].window
        now = time.monotonic_ns() + IPC_TRACK_INTERVAL_NS  # past whatever the invokes above scheduled
        conductor.do_work(now)
        start = pub.position_limit

        def consume() -> None:
            while sub.poll(lambda payload, header: None, 1000):
                pass

        assert pub.offer(b"x" * 100) > 0  # far from the limit: no hurry
        consume()
        conductor.do_work(now + IPC_TRACK_INTERVAL_NS // 2)
        assert pub.position_limit == start
        conductor.do_work(now + IPC_TRACK_INTERVAL_NS)
        assert pub.position_limit == start + pub.position
        now += IPC_TRACK_INTERVAL_NS

        while pub.position_limit - pub.position > window // 2 - 1000:  # past half the window
            assert pub.offer(b"y" * 900) > 0
        consume()
        conductor.do_work(now + IPC_TRACK_INTERVAL_NS)  # due: the limit moves, and the publisher was close
        assert pub.position_limit == start + pub.position
        assert pub.offer(b"z" * 900) > 0
        consume()
        conductor.do_work(now + IPC_TRACK_INTERVAL_NS + 1)  # so the very next cycle recomputes again
        assert pub.position_limit == start + pub.position
