"""IPC within one process: the client API over a real driver and real shared memory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slipstream import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    NOT_CONNECTED,
    BufferClaim,
    ChannelUriError,
    Context,
    DriverAlreadyRunningError,
    DriverConfig,
    DriverUnavailableError,
    FragmentAssembler,
    Header,
    Image,
    MediaDriver,
    RegistrationError,
    block_frames,
    offer_async,
    poll_async,
)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.001)


def offer(pub, message: bytes) -> int:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 5
    while (result := pub.offer(message)) == ADMIN_ACTION and time.monotonic() < deadline:
        pass
    return int(result)


@pytest.fixture
def ctx(driver_dir: Path):  # type: ignore[no-untyped-def]
    with Context(driver_dir, driver_config=DriverConfig(ipc_term_length=1 << 16)) as context:
        yield context


def test_embedded_driver_by_default_and_files_in_directory(ctx: Context, driver_dir: Path) -> None:
    assert ctx.is_embedded
    assert (driver_dir / "cnc.dat").exists() and (driver_dir / "driver.sock").exists()
    pub = ctx.add_exclusive_publication("aeron:ipc", 7)
    assert list((driver_dir / "publications").glob("*.logbuffer"))
    labels = [c.label for c in ctx.counters()]
    assert any(label.startswith(f"pub-lmt: {pub.registration_id} {pub.session_id} 7 aeron:ipc") for label in labels)


def test_not_connected_until_a_subscriber_then_messages_flow(ctx: Context) -> None:
    pub = ctx.add_exclusive_publication("aeron:ipc", 7)
    assert pub.offer(b"nobody listens") == NOT_CONNECTED
    available: list[Image] = []
    sub = ctx.add_subscription("aeron:ipc", 7, on_available_image=available.append)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    assert len(available) == 1 and available[0].session_id == pub.session_id
    received: list[tuple[bytes, int]] = []
    for i in range(10):
        assert offer(pub, b"msg %d" % i) > 0
    assert sub.poll(lambda b, h: received.append((bytes(b), h.session_id)), 100) == 10
    assert received == [(b"msg %d" % i, pub.session_id) for i in range(10)]


def test_fragmented_messages_reassembled(ctx: Context) -> None:
    sub = ctx.add_subscription("aeron:ipc", 8)
    pub = ctx.add_publication("aeron:ipc", 8)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    messages = [bytes([i]) * n for i, n in enumerate([1, 1376, 1377, 5000, pub.max_message_length])]
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda b, h: got.append(bytes(b)))
    for m in messages:
        assert offer(pub, m) > 0
        while sub.poll(assembler, 100):
            pass
    assert got == messages
    with pytest.raises(ValueError, match="maximum message length"):
        pub.offer(bytes(pub.max_message_length + 1))


def test_back_pressure_when_subscriber_does_not_poll(ctx: Context) -> None:
    sub = ctx.add_subscription("aeron:ipc", 9)
    pub = ctx.add_exclusive_publication("aeron:ipc", 9)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    sent = 0
    while (result := pub.offer(sent.to_bytes(4, "little") * 64)) != BACK_PRESSURED:
        if result > 0:
            sent += 1
    assert pub.position_limit == 32 * 1024  # half a 64 KiB term ahead of the subscriber at 0
    total = sent + 2000
    got: list[int] = []
    deadline = time.monotonic() + 10
    while len(got) < total and time.monotonic() < deadline:
        sub.poll(lambda b, h: got.append(int.from_bytes(b[:4], "little")), 50)
        while sent < total and pub.offer(sent.to_bytes(4, "little") * 64) > 0:
            sent += 1
    assert got == list(range(total))  # nothing overwritten, nothing lost


def test_rotation_returns_admin_action_and_stream_continues(ctx: Context) -> None:
    sub = ctx.add_subscription("aeron:ipc", 10)
    pub = ctx.add_exclusive_publication("aeron:ipc", 10)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    admin = 0
    got: list[int] = []
    i = 0
    while i < 20_000:
        result = pub.offer(i.to_bytes(4, "little") * 100)
        if result > 0:
            i += 1
        elif result == ADMIN_ACTION:
            admin += 1
        sub.poll(lambda b, h: got.append(int.from_bytes(b[:4], "little")), 100)
    while sub.poll(lambda b, h: got.append(int.from_bytes(b[:4], "little")), 100):
        pass
    assert admin > 10  # 64 KiB terms: many rotations, partitions reused
    assert got == list(range(20_000))


def test_try_claim(ctx: Context) -> None:
    sub = ctx.add_subscription("aeron:ipc", 11)
    pub = ctx.add_exclusive_publication("aeron:ipc", 11)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    claim = BufferClaim()
    assert pub.try_claim(11, claim) > 0
    claim.buffer[:] = b"zero-copied"
    claim.reserved_value = 99
    claim.commit()
    got: list[tuple[bytes, int]] = []
    sub.poll(lambda b, h: got.append((bytes(b), h.reserved_value)), 10)
    assert got == [(b"zero-copied", 99)]


def test_close_gives_end_of_stream_then_unavailable_image(ctx: Context) -> None:
    gone: list[Image] = []
    sub = ctx.add_subscription("aeron:ipc", 12, on_unavailable_image=gone.append)
    pub = ctx.add_exclusive_publication("aeron:ipc", 12)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    assert offer(pub, b"last words") > 0
    image = sub.images[0]
    pub.close()
    assert pub.offer(b"late") == CLOSED
    got: list[bytes] = []
    wait_for(lambda: image.end_of_stream_position == 64)
    assert not image.is_end_of_stream
    sub.poll(lambda b, h: got.append(bytes(b)), 10)
    assert got == [b"last words"] and image.is_end_of_stream
    wait_for(lambda: bool(gone))
    assert gone == [image] and sub.image_count == 0


def test_session_id_filter_and_explicit_session(ctx: Context) -> None:
    sub_all = ctx.add_subscription("aeron:ipc", 13)
    sub_one = ctx.add_subscription("aeron:ipc?session-id=77", 13)
    pub77 = ctx.add_exclusive_publication("aeron:ipc?session-id=77", 13)
    pub_other = ctx.add_exclusive_publication("aeron:ipc", 13)
    assert pub77.session_id == 77 and not -1 <= pub_other.session_id <= 1000
    wait_for(lambda: sub_all.image_count == 2 and sub_one.image_count == 1)
    assert sub_one.images[0].session_id == 77
    with pytest.raises(RegistrationError) as err:
        ctx.add_exclusive_publication("aeron:ipc?session-id=77", 13)
    assert err.value.code == "SESSION_IN_USE"


def test_bad_channels_are_refused_with_reasons(ctx: Context) -> None:
    # Checked at the call (issue 11): the exported ChannelUriError, a ValueError, naming the parameter.
    with pytest.raises(ChannelUriError, match=r"term-length"):
        ctx.add_publication("aeron:ipc?term-length=1000", 1)
    with pytest.raises(ChannelUriError, match="aeron:"):
        ctx.add_subscription("tcp://nope", 1)
    # A frame longer than a term's largest message (an eighth of it): refused by the driver, as Aeron's is.
    with pytest.raises(RegistrationError, match="MTU greater than max message length") as err:
        ctx.add_exclusive_publication("aeron:ipc?term-length=64k|mtu=16k", 1)
    assert err.value.code == "INVALID_CHANNEL"
    assert ctx.add_exclusive_publication("aeron:ipc?term-length=64k|mtu=8k", 1).max_payload_length < 8192


def test_handler_exception_does_not_redeliver(ctx: Context) -> None:
    sub = ctx.add_subscription("aeron:ipc", 14)
    pub = ctx.add_exclusive_publication("aeron:ipc", 14)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    for i in range(3):
        offer(pub, bytes([i]))
    seen: list[int] = []

    def handler(b: memoryview, h: Header) -> None:
        seen.append(b[0])
        if b[0] == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        sub.poll(handler, 10)
    sub.poll(handler, 10)
    assert seen == [0, 1, 2]


def test_corrupted_log_marks_image_instead_of_crashing(ctx: Context) -> None:
    sub = ctx.add_subscription("aeron:ipc", 15)
    pub = ctx.add_exclusive_publication("aeron:ipc", 15)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    offer(pub, b"fine")
    pub._log.terms_i32[0][16] = 1 << 29  # a frame length past the end of the term, at offset 64
    pub._log.terms[0][64 + 6] = 1
    got: list[bytes] = []
    assert sub.poll(lambda b, h: got.append(bytes(b)), 10) == 1
    assert got == [b"fine"] and sub.images[0].is_corrupt
    assert sub.poll(lambda b, h: got.append(bytes(b)), 10) == 0


def test_asyncio_waits_without_spinning(ctx: Context) -> None:
    sub = ctx.add_subscription("aeron:ipc", 16)
    pub = ctx.add_exclusive_publication("aeron:ipc", 16)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)

    async def main() -> list[bytes]:
        got: list[bytes] = []

        async def later() -> None:
            await asyncio.sleep(0.05)
            assert await offer_async(pub, b"async hello", timeout_s=1) > 0

        task = asyncio.create_task(later())
        assert await poll_async(sub, lambda b, h: got.append(bytes(b)), timeout_s=5) == 1
        await task
        assert await poll_async(sub, lambda b, h: None, timeout_s=0.01) == 0
        return got

    assert asyncio.run(main()) == [b"async hello"]


def test_one_driver_per_directory(driver_dir: Path) -> None:
    with MediaDriver(DriverConfig(directory=driver_dir)).launch_embedded():
        with pytest.raises(DriverAlreadyRunningError, match="already uses"):
            MediaDriver(DriverConfig(directory=driver_dir)).start()
        with pytest.raises(DriverAlreadyRunningError):
            Context(driver_dir, driver="embedded")
        with Context(driver_dir) as attached:  # auto: attaches instead
            assert not attached.is_embedded


def test_external_mode_without_driver_fails_clearly(driver_dir: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DriverUnavailableError, match="slipstream driver"):
        Context(driver_dir, driver="external", driver_timeout_s=0.3)
    assert time.monotonic() - started < 5


def test_invalid_driver_config_names_the_setting(driver_dir: Path) -> None:
    with pytest.raises(ValueError, match="ipc_term_length"):
        MediaDriver(DriverConfig(directory=driver_dir, ipc_term_length=1000))
    with pytest.raises(ValueError, match="idle_strategy"):
        MediaDriver(DriverConfig(directory=driver_dir, idle_strategy="nap"))
    with pytest.raises(ValueError, match="ipc_mtu must be at most a term's largest message, 8192"):
        MediaDriver(DriverConfig(directory=driver_dir, ipc_term_length=1 << 16, ipc_mtu=16384))


def test_block_poll_hands_out_runs_of_whole_frames_across_term_ends(ctx: Context) -> None:
    """Every message exactly once, in order, one handler call per block, across several terms."""
    sub = ctx.add_subscription("aeron:ipc", 21)
    pub = ctx.add_exclusive_publication("aeron:ipc", 21)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    got: list[bytes] = []
    calls: list[tuple[int, int]] = []

    def on_block(block: memoryview, session_id: int, term_id: int) -> None:
        calls.append((session_id, len(block)))
        for offset, length in block_frames(block):
            got.append(bytes(block[offset : offset + length]))

    messages = [i.to_bytes(4, "little") * (1 + i % 50) for i in range(3000)]  # ~5 terms of 64 KiB
    sent = 0
    deadline = time.monotonic() + 10
    while len(got) < len(messages) and time.monotonic() < deadline:
        while sent < len(messages) and pub.offer(messages[sent]) > 0:
            sent += 1
        sub.block_poll(on_block, 8192)
    assert got == messages
    assert len(calls) < len(messages) // 4 and all(s == pub.session_id and 0 < n <= 8192 for s, n in calls)
