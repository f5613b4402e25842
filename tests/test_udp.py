"""UDP unicast through the media driver on real loopback sockets."""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slipstream import (
    NOT_CONNECTED,
    Context,
    DriverConfig,
    FragmentAssembler,
    Header,
    Image,
    RegistrationError,
)
from slipstream.files import observe


def free_port(family: socket.AddressFamily = socket.AF_INET) -> int:
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.001)


def offer(pub, message: bytes, timeout: float = 10.0, while_refused: Callable[[], object] | None = None) -> int:  # type: ignore[no-untyped-def]
    """Offer until taken. A publisher runs at most a window ahead of its subscriber: a test that offers
    more than that before it reads passes ``while_refused`` (its poll), or it deadlocks once reading lags."""
    deadline = time.monotonic() + timeout
    while (result := pub.offer(message)) < 0:
        assert time.monotonic() < deadline, f"offer refused: {result}"
        if while_refused is not None:
            while_refused()
    return int(result)


def counter(ctx: Context, label: str) -> int:
    return next(c.value for c in ctx.counters() if c.label == label)


@pytest.fixture
def ctx(driver_dir: Path):  # type: ignore[no-untyped-def]
    config = DriverConfig(udp_term_length=1 << 20, timer_interval_ns=10_000_000)
    with Context(driver_dir, driver_config=config) as context:
        yield context


def test_messages_fragments_and_end_of_stream_over_loopback(ctx: Context) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    gone: list[Image] = []
    pub = ctx.add_exclusive_publication(channel, 1001)
    time.sleep(0.2)  # SETUPs go unanswered: nobody listens yet
    assert pub.offer(b"too early") == NOT_CONNECTED  # only SETUP until the first status message
    sub = ctx.add_subscription(channel, 1001, on_unavailable_image=gone.append)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    image = sub.images[0]
    assert image.session_id == pub.session_id and image.source_identity.startswith("127.0.0.1:")
    rng = random.Random(3)
    messages = [rng.randbytes(rng.choice([1, 100, 1376, 1377, 5000, 20000])) for _ in range(300)]
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda b, h: got.append(bytes(b)))
    for m in messages:  # 1.4 MB: more than the window, so the subscriber reads while refused
        offer(pub, m, while_refused=lambda: sub.poll(assembler, 10))
        sub.poll(assembler, 10)
    wait_for(lambda: sub.poll(assembler, 100) == 0 and len(got) == len(messages))
    assert got == messages
    pub.close()
    wait_for(lambda: bool(gone))
    assert gone == [image] and image.is_end_of_stream


def test_late_subscriber_asks_for_setup_and_joins(ctx: Context) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    first = ctx.add_subscription(channel, 5)
    pub = ctx.add_exclusive_publication(channel, 5)
    wait_for(lambda: pub.is_connected and first.image_count == 1)
    offer(pub, b"before")
    first.close()
    time.sleep(0.05)
    # A new subscription on the same port receives data for a session it does not know: it must ask
    # for a SETUP (SM with SEND_SETUP) and then join at the sender's position.
    second = ctx.add_subscription(channel, 5)
    got: list[bytes] = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        pub.offer(b"after")
        second.poll(lambda b, h: got.append(bytes(b)), 10)
        time.sleep(0.01)
    assert got and got[0] == b"after"


def test_ipv6_loopback(ctx: Context) -> None:
    channel = f"aeron:udp?endpoint=[::1]:{free_port(socket.AF_INET6)}"
    sub = ctx.add_subscription(channel, 6)
    pub = ctx.add_exclusive_publication(channel, 6)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    offer(pub, b"over ipv6")
    got: list[bytes] = []
    wait_for(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) > 0)
    assert got == [b"over ipv6"] and sub.images[0].source_identity.startswith("[::1]:")


def test_unreliable_subscription_still_delivers_in_order(ctx: Context) -> None:
    port = free_port()
    sub = ctx.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|reliable=false", 7)
    pub = ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 7)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    got: list[int] = []
    for i in range(2000):
        offer(pub, i.to_bytes(4, "little"))
        sub.poll(lambda b, h: got.append(int.from_bytes(b, "little")), 10)
    wait_for(lambda: sub.poll(lambda b, h: got.append(int.from_bytes(b, "little")), 100) == 0 and len(got) >= 2000)
    assert got == list(range(2000))  # no loss on loopback: everything, in order


def test_session_filter_on_udp_subscription(ctx: Context) -> None:
    port = free_port()
    sub = ctx.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=55", 8)
    other = ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 8)
    wanted = ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=55", 8)
    wait_for(lambda: wanted.is_connected and sub.image_count == 1)
    assert sub.images[0].session_id == 55 and other.session_id != 55


def test_bad_udp_channels_refused(ctx: Context) -> None:
    with pytest.raises(RegistrationError, match="cannot resolve"):
        ctx.add_publication("aeron:udp?endpoint=no-such-host.invalid:4000", 1)
    with pytest.raises(RegistrationError, match="needs endpoint"):
        ctx.add_subscription("aeron:udp?control=127.0.0.1:4000|control-mode=manual", 1)
    with pytest.raises(RegistrationError, match="response channels"):
        ctx.add_publication("aeron:udp?endpoint=127.0.0.1:4000|control-mode=response", 1)
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(RegistrationError, match="RESOURCE"):
            ctx.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{taken.getsockname()[1]}", 1)
    finally:
        taken.close()


def _flood(port: int, stop: threading.Event, sent: list[int]) -> None:
    """Random datagrams: garbage, truncated and mutated frames, absurd SETUPs, unknown sessions."""
    rng = random.Random(11)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        while not stop.is_set() and sent[0] < 200_000:
            kind = rng.randrange(4)
            if kind == 0:
                data = rng.randbytes(rng.randrange(0, 1500))
            elif kind == 1:  # DATA header for an unknown session
                data = bytes([64, 0, 0, 0, 0, 0xC0, 1, 0]) + rng.randbytes(56)
            elif kind == 2:  # SETUP with absurd term length / mtu
                data = (40).to_bytes(4, "little") + bytes([0, 0, 5, 0]) + rng.randbytes(32)
            else:  # wrong version
                data = (32).to_bytes(4, "little") + bytes([7, 0xC0, 1, 0]) + rng.randbytes(24)
            s.sendto(data, ("127.0.0.1", port))
            sent[0] += 1
            if sent[0] % 200 == 0:
                time.sleep(0.001)


def test_flood_of_hostile_datagrams_does_not_disturb_a_stream(ctx: Context) -> None:
    port = free_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    sub = ctx.add_subscription(channel, 9)
    pub = ctx.add_exclusive_publication(channel, 9)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    stop, sent = threading.Event(), [0]
    flooder = threading.Thread(target=_flood, args=(port, stop, sent), daemon=True)
    flooder.start()
    got: list[int] = []

    def on(b: memoryview, h: Header) -> None:
        got.append(int.from_bytes(b[:4], "little"))

    try:
        for i in range(20_000):  # 1.3 MB of frames: more than the window
            offer(pub, i.to_bytes(4, "little") * 8, while_refused=lambda: sub.poll(on, 10))
            sub.poll(on, 10)
        wait_for(lambda: sub.poll(on, 100) == 0 and len(got) >= 20_000, timeout=30)
    finally:
        stop.set()
        flooder.join(5)
    assert got == list(range(20_000))
    assert sent[0] > 1000
    wait_for(lambda: counter(ctx, "Invalid packets") > 0, timeout=5)

    # The error log holds each distinct error once, with how often it was seen.
    def invalid_records() -> list[int]:
        return [r.observation_count for r in observe.errors(ctx.directory) if r.text.startswith("invalid datagrams")]

    wait_for(lambda: invalid_records() == [counter(ctx, "Invalid packets")], timeout=5)
    assert invalid_records()[0] > 1


def test_udp_between_processes(driver, peers) -> None:  # type: ignore[no-untyped-def]
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    common = ["--dir", str(driver.directory), "--channel", channel, "--count", "50000", "--seed", "9"]
    sub = peers("subscribe", "--expect-eos", *common)
    sub.expect("ready")
    sent = peers("publish", *common).result()
    received = sub.result()
    assert "error" not in sent, sent
    assert received["received"] == sent["sent"] == 50000
    assert received["errors"] == 0 and received["crc"] == sent["crc"]
    assert received["end_of_stream"] is True
    assert os.path.isdir(driver.directory / "images")


def test_closing_an_embedded_driver_finishes_its_streams_first(tmp_path: Path) -> None:
    """Everything offer() accepted reaches the subscriber, and it sees end of stream, even when the
    publisher's process closes its context (and embedded driver) right after the last offer."""
    import shutil
    import uuid

    dirs = [Path("/dev/shm") / f"slipstream-test-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    gone: list[Image] = []
    try:
        with Context(dirs[0]) as receiving:
            sub = receiving.add_subscription(channel, 12, on_unavailable_image=gone.append)
            got: list[int] = []
            sending = Context(dirs[1])
            pub = sending.add_exclusive_publication(channel, 12)
            wait_for(lambda: pub.is_connected and sub.image_count == 1)
            stop = threading.Event()

            def consume() -> None:  # the receiving application keeps polling meanwhile
                while not stop.is_set():
                    if sub.poll(lambda b, h: got.append(int.from_bytes(b[:4], "little")), 100) == 0:
                        time.sleep(0.0005)

            consumer = threading.Thread(target=consume, daemon=True)
            consumer.start()
            for i in range(3000):
                offer(pub, i.to_bytes(4, "little") * 100)
            sending.close()  # at once: the driver must finish the stream before it stops
            wait_for(lambda: bool(gone), timeout=15)
            stop.set()
            consumer.join(5)
            assert got == list(range(3000)) and gone[0].is_end_of_stream
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_explicit_session_ids_clash_only_within_a_channel(ctx: Context) -> None:
    first = f"aeron:udp?endpoint=127.0.0.1:{free_port()}|session-id=77"
    ctx.add_exclusive_publication(first, 13)
    ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{free_port()}|session-id=77", 13)  # other channel
    with pytest.raises(RegistrationError, match="SESSION_IN_USE"):
        ctx.add_exclusive_publication(first, 13)


def test_a_setup_the_receiver_refuses_is_reported_in_the_error_log(driver_dir: Path) -> None:
    """A valid SETUP refused by a local limit (here a term longer than max_term_length) never connects;
    the driver says why in its error log instead of leaving the stream silently unconnected."""
    port = free_port()
    with Context(driver_dir) as ctx:
        ctx.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 9)
        publication = ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=128m", 9)

        def refused() -> bool:
            return any("SETUP refused" in e.text and "max_term_length" in e.text for e in observe.errors(driver_dir))

        wait_for(refused, 10)
        assert not publication.is_connected
