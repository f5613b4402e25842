"""Doorbells: a parked asyncio reader is woken by the writer's ring, not by its timeout.

Unit parts (layout, ring, parking slots, waits) run in memory; the wake-ups run across real processes
over IPC and UDP loopback, and through the network layer's poller. Every wait is bounded; the safety
timeouts are long (5 s) so that a wake-up by timeout shows in the counters instead of passing unseen.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slipstream import Context, MediaDriver
from slipstream.client import AsyncBackoff, Header, poll_async
from slipstream.client.aio import Parking
from slipstream.files.doorbell import Doorbell, ParkingSlot, doorbell_address, ring, ring_parked, wait_any
from slipstream.logbuffer import LogBuffers, compute_log_length
from slipstream.logbuffer.layout import (
    ACTIVE_TRANSPORT_COUNT_OFFSET,
    CORRELATION_ID_OFFSET,
    DOORBELL_NUMBERS_INDEX,
    DOORBELL_NUMBERS_OFFSET,
    PARKED_WORD_INDEX,
    PARKED_WORD_OFFSET,
    PARKING_SLOTS,
)
from slipstream.testing import run_async

PEER = str(Path(__file__).with_name("doorbell_peer.py"))
PARK_S = 5.0
"""Safety timeout of every parked wait here: far longer than any wake-up the tests wait for."""


# -- unit ------------------------------------------------------------------------------------------


def test_parking_table_sits_in_free_metadata_bytes() -> None:
    assert PARKED_WORD_OFFSET == ACTIVE_TRANSPORT_COUNT_OFFSET + 4 and PARKED_WORD_OFFSET % 8 == 0
    assert DOORBELL_NUMBERS_OFFSET == PARKED_WORD_OFFSET + 8
    assert DOORBELL_NUMBERS_OFFSET + 8 * PARKING_SLOTS <= CORRELATION_ID_OFFSET
    assert PARKING_SLOTS == 8  # one parked byte each in one 8-byte word
    log = LogBuffers(bytearray(compute_log_length(1 << 16)), 1 << 16)
    log.initialize(initial_term_id=5, session_id=7, stream_id=9, mtu=1408, correlation_id=11)
    assert log.parked_word() == 0
    log.set_parked(3, True)
    log.set_doorbell_number(3, 1234)
    assert log.parked_word() == 1 << 24 and log.is_parked(3) and log.doorbell_number(3) == 1234
    assert log.meta_i64[DOORBELL_NUMBERS_INDEX + 3] == 1234
    assert log.correlation_id == 11 and log.session_id == 7 and log.stream_id == 9  # neighbours untouched
    with pytest.raises(IndexError):
        log.set_parked(PARKING_SLOTS, True)
    log.initialize(initial_term_id=5, session_id=7, stream_id=9, mtu=1408)
    assert log.parked_word() == 0 and log.doorbell_number(3) == 0


@pytest.fixture(params=["c", "python"])
def ring_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Ringing and draining in C (the GIL held) or in Python (each system call lets the GIL go): the same effect."""
    from slipstream.files import doorbell

    if request.param == "c" and (doorbell._c_send_ring is None or doorbell._c_drain is None):
        pytest.skip("C fast path not active")
    if request.param == "python":
        monkeypatch.setattr(doorbell, "_c_send_ring", None)
        monkeypatch.setattr(doorbell, "_c_drain", None)
    return str(request.param)


def test_ring_to_a_dead_or_full_doorbell_never_raises(ring_path: str) -> None:
    ring(0)
    ring((os.getpid() << 16) | 0xFFFF)  # never bound
    bell = Doorbell()
    number = bell.number
    for _ in range(10_000):  # far beyond the socket's queue: EAGAIN is swallowed, nothing blocks
        ring(number)
    assert bell.drain() > 0
    bell.close()
    ring(number)  # closed: ECONNREFUSED is swallowed
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, pytest.raises(OSError):
        sock.sendto(b"x", doorbell_address(number))  # what ring swallowed


def test_each_ring_is_drained_once_and_a_flood_is_drained_in_bounded_steps(ring_path: str) -> None:
    from slipstream.files import doorbell

    bell = Doorbell()
    try:
        assert bell.drain() == 0
        for _ in range(3):
            ring(bell.number)
        assert bell.drain() == 3 and bell.drain() == 0
        queued = 0
        for _ in range(20_000):  # until the queue is full (a datagram socket holds a few hundred rings)
            ring(bell.number)
        while (drained := bell.drain()) > 0:
            assert drained <= doorbell._DRAIN_LIMIT
            queued += drained
        assert 0 < queued <= 20_000
    finally:
        bell.close()
    assert bell.drain() == 0  # closed: its descriptor's number may be another file's by now, nothing is read


def test_a_doorbell_found_gone_is_left_alone_for_a_while(ring_path: str) -> None:
    """A subscriber that died parked must not cost its writers a failed system call per append."""
    from slipstream.files import doorbell

    number = (os.getpid() << 16) | 0xFFFE  # never bound by this process's doorbells
    ring(number)  # nobody there: remembered as gone
    assert doorbell._gone.get(number, 0) > time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as late:  # a new owner of the name (pid reuse)
        late.bind(doorbell_address(number))
        late.setblocking(False)
        ring(number)  # still within GONE_QUIET_S: not sent
        with pytest.raises(BlockingIOError):
            late.recv(16)
        doorbell._gone[number] = time.monotonic() - 1  # the quiet period is over
        ring(number)
        assert late.recv(16) == b"\x01" and number not in doorbell._gone


def test_doorbell_numbers_are_unique_and_drain_counts_rings() -> None:
    bells = [Doorbell() for _ in range(3)]
    try:
        assert len({bell.number for bell in bells}) == 3
        assert all(bell.number >> 16 == os.getpid() for bell in bells)
        ring(bells[1].number)
        ring(bells[1].number)
        assert [bell.drain() for bell in bells] == [0, 2, 0]
    finally:
        for bell in bells:
            bell.close()


def test_ring_parked_rings_only_parked_slots() -> None:
    log = LogBuffers(bytearray(compute_log_length(1 << 16)), 1 << 16)
    log.initialize(initial_term_id=0, session_id=1, stream_id=2, mtu=1408)
    bells = [Doorbell() for _ in range(3)]
    try:
        for slot, bell in enumerate(bells):
            log.set_doorbell_number(slot * 3, bell.number)
        log.set_parked(0, True)
        log.set_parked(6, True)
        log.set_parked(7, True)  # parked without a number: nobody to ring
        ring_parked(log.meta_i64)
        assert [bell.drain() for bell in bells] == [1, 0, 1]
    finally:
        for bell in bells:
            bell.close()


@pytest.mark.parametrize("fast", [False, True], ids=["python", "c"])
def test_an_ipc_appender_rings_only_while_someone_is_parked(fast: bool) -> None:
    """The appender reads the log's own parked word after each append (the C path from the metadata
    buffer it already holds) and calls for a ring only when some slot is parked."""
    from slipstream.logbuffer import ExclusiveAppender, PyExclusiveAppender, fast_path_active

    if fast and not fast_path_active():
        pytest.skip("C fast path not active")
    cls = ExclusiveAppender if fast else PyExclusiveAppender
    log = LogBuffers(bytearray(compute_log_length(1 << 16)), 1 << 16)
    log.initialize(initial_term_id=0, session_id=1, stream_id=2, mtu=1408)
    limit = memoryview(bytearray(8)).cast("q")
    limit[0] = 1 << 40
    rings: list[int] = []
    app = cls(log, (limit, 0), (log.meta_i64, PARKED_WORD_INDEX, lambda: rings.append(log.parked_word())))
    assert app.offer(b"x" * 32) > 0 and rings == []
    log.set_parked(5, True)
    assert app.offer(b"y" * 32) > 0 and app.offer(b"z" * 5000) > 0  # whole and fragmented
    assert rings == [1 << 40, 1 << 40]
    log.set_parked(5, False)
    assert app.offer(b"x" * 32) > 0 and len(rings) == 2


def test_parking_slot_counts_its_holders(tmp_path: Path) -> None:
    term_length = 1 << 16
    path = tmp_path / "log"
    with path.open("wb") as f:
        f.truncate(compute_log_length(term_length))
    with path.open("r+b") as f:
        mapping = mmap.mmap(f.fileno(), 0)
    log = LogBuffers(memoryview(mapping), term_length)
    log.initialize(initial_term_id=0, session_id=1, stream_id=2, mtu=1408)
    page = mmap.mmap(os.open(path, os.O_RDWR), mmap.PAGESIZE, offset=3 * term_length)
    slot = ParkingSlot(page, 2)
    slot.park(99)
    slot.park(99)
    assert log.is_parked(2) and log.doorbell_number(2) == 99
    slot.unpark()
    assert log.is_parked(2)  # another waiter of this process still parks
    slot.unpark()
    assert not log.is_parked(2) and log.parked_word() == 0
    slot.park(99)
    slot.close()
    assert log.parked_word() == 0
    log.close()
    mapping.close()


def test_wait_ends_by_ring_or_by_timeout() -> None:
    async def main() -> None:
        bell = Doorbell()
        try:
            assert await bell.wait(0.01) is False
            assert (bell.wakeups, bell.timeouts) == (0, 1)
            loop = asyncio.get_running_loop()
            loop.call_later(0.01, ring, bell.number)
            assert await bell.wait(PARK_S) is True
            assert (bell.wakeups, bell.timeouts) == (1, 1)
            # Two waiters on one doorbell (one registration with the loop) both wake.
            loop.call_later(0.01, ring, bell.number)
            both = await asyncio.gather(bell.wait(PARK_S), wait_any([bell], PARK_S))
            assert both == [True, True] and bell.wakeups == 3
            # A waiter's own future ends the wait too (the network poller's kick).
            future: asyncio.Future[bool | None] = loop.create_future()
            loop.call_later(0.01, future.set_result, None)
            assert await wait_any([bell], PARK_S, future) is None
        finally:
            bell.close()

    run_async(main(), 30)


# -- the parking protocol against a real driver ------------------------------------------------------


@pytest.fixture
def context(driver: MediaDriver) -> Iterator[Context]:
    with Context(driver.config.directory, driver="external") as ctx:
        yield ctx


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.001)


def test_the_driver_assigns_eight_slots_and_takes_them_back(context: Context) -> None:
    pub = context.add_exclusive_publication("aeron:ipc", 1001)
    subs = [context.add_subscription("aeron:ipc", 1001) for _ in range(PARKING_SLOTS + 1)]
    wait_until(lambda: all(sub.image_count == 1 for sub in subs))
    images = [sub.images[0] for sub in subs]
    assert sum(image.can_park for image in images) == PARKING_SLOTS  # the ninth falls back to sleeping
    log = pub._log
    parking = Parking()
    assert parking.park(subs[:2], 77) is True
    assert log.parked_word() != 0
    assert parking.park(subs, 77) is False  # one image has no slot (the others are parked all the same)
    parking.unpark()
    assert log.parked_word() == 0
    # A subscriber that goes away parked: the driver clears its slot, so nobody rings a dead doorbell.
    parked = next(sub for sub in subs if sub.images[0].can_park)
    parked.images[0]._park(77)
    assert log.parked_word() != 0
    parked.close()
    wait_until(lambda: log.parked_word() == 0)
    for sub in subs:
        sub.close()
    pub.close()


def test_offer_and_claim_ring_a_parked_reader_in_this_process(context: Context) -> None:
    pub = context.add_exclusive_publication("aeron:ipc", 1002)
    sub = context.add_subscription("aeron:ipc", 1002)
    wait_until(lambda: sub.image_count == 1 and pub.is_connected)
    bell = context.doorbell
    got: list[bytes] = []

    def handler(buffer: memoryview, header: Header) -> None:
        got.append(bytes(buffer))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for how in ("offer", "claim"):
            before = bell.wakeups
            task = asyncio.ensure_future(poll_async(sub, handler, backoff=AsyncBackoff(spins=2, park_timeout_s=PARK_S)))
            deadline = loop.time() + 10
            while not pub._log.parked_word():
                assert loop.time() < deadline and not task.done()
                await asyncio.sleep(0.001)
            if how == "offer":
                assert pub.offer(b"offered") > 0
            else:
                from slipstream.client import BufferClaim

                claim = BufferClaim()
                assert pub.try_claim(7, claim) > 0
                claim.buffer[:] = b"claimed"
                claim.commit()
            assert await asyncio.wait_for(task, 10) == 1
            assert bell.wakeups > before and bell.timeouts == 0
            assert pub._log.parked_word() == 0  # the reader cleared its byte when it woke

    run_async(main(), 60)
    assert got == [b"offered", b"claimed"]


class Publisher:
    """``doorbell_peer.py``: offers one message per ``go``."""

    def __init__(self, directory: Path, channel: str, stream: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, PEER, "--dir", str(directory), "--channel", channel, "--stream", str(stream)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def expect(self, prefix: str, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        result: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith(prefix) or line.startswith("error"):
                    result.append(line.strip())
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0].startswith(prefix):
            self.proc.kill()
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"peer did not print {prefix!r}: {result} {stderr}")
        return result[0]

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def parked_reader_wakes_on_another_process_offer(context: Context, channel: str, stream: int, rounds: int) -> None:
    sub = context.add_subscription(channel, stream)
    publisher = Publisher(context.directory, channel, stream)
    try:
        publisher.expect("connected")
        wait_until(lambda: sub.image_count == 1)
        image = sub.images[0]
        assert image.can_park
        bell = context.doorbell
        got: list[bytes] = []

        def handler(buffer: memoryview, header: Header) -> None:
            got.append(bytes(buffer))

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for i in range(1, rounds + 1):
                backoff = AsyncBackoff(spins=2, park_timeout_s=PARK_S)
                task = asyncio.ensure_future(poll_async(sub, handler, timeout_s=30, backoff=backoff))
                deadline = loop.time() + 10
                while not (image._parking is not None and image._parking.is_parked):
                    assert loop.time() < deadline and not task.done()
                    await asyncio.sleep(0.001)
                await loop.run_in_executor(None, publisher.go)
                assert await asyncio.wait_for(task, 20) == 1
                assert got[-1] == i.to_bytes(8, "little") * 4
                await loop.run_in_executor(None, publisher.expect, "offered")
            # Every round ended by a ring (the writer's), none by the 5 s safety timeout.
            assert bell.wakeups >= rounds and bell.timeouts == 0

        run_async(main(), 120)
        assert len(got) == rounds
    finally:
        publisher.close()
        sub.close()


def test_parked_reader_wakes_on_another_process_ipc_offer(context: Context) -> None:
    parked_reader_wakes_on_another_process_offer(context, "aeron:ipc", 1003, rounds=5)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_parked_reader_wakes_on_another_process_udp_offer(context: Context) -> None:
    """The driver's receive path rings: it rebuilt the frame into the image log the reader maps."""
    parked_reader_wakes_on_another_process_offer(context, f"aeron:udp?endpoint=127.0.0.1:{free_port()}", 1004, 5)


# -- the network layer's poller --------------------------------------------------------------------


class Note(msgspec.Struct):
    n: int


@pytest.mark.parametrize("mode", ["udp", "ipc", "udp-invoker"])
def test_parked_server_is_rung_by_a_client_message(driver_dir: Path, mode: str) -> None:
    """Server and client run on two event loops (two pollers), so the client's send cannot kick the
    server's poller: only the doorbell wakes it before its (lengthened) deep sleep ends. With
    invoker-mode drivers (one each: a driver is invoked from one thread) nobody rings for a datagram
    the server's own driver has not taken in yet: the parked poller waits on that driver's input too."""
    from slipstream.network import Client, ClientConfig, Connection, Server, ServerConfig
    from slipstream.network.aio.endpoint import PollGroup

    ipc = mode == "ipc"
    invoker = mode == "udp-invoker"
    driver = "invoker" if invoker else "auto"
    client_dir = Path(f"{driver_dir}-client") if invoker else driver_dir

    port = free_port()
    received: list[int] = []
    server_ready = threading.Event()
    stop = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        config = ServerConfig(
            app_id="test",
            messages=[Note],
            settings_store=":memory:",
            driver_directory=driver_dir,
            driver=driver,
            enable_ipc=ipc,
        )
        async with Server(config) as server:

            @server.on_message(Note)
            def on_note(connection: Connection, note: Note) -> None:
                received.append(note.n)

            await server.bind(port)
            group = PollGroup.for_loop(asyncio.get_running_loop())
            # Every pause is the long one, 5 s: a wake-up by timeout would take that long (the test sees it).
            group.backoff.deep_sleep_s = PARK_S
            group.backoff.deep_after_s = 0.0
            state["group"] = group
            state["context"] = server._context
            server_ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    try:
        assert server_ready.wait(30)

        async def main() -> None:
            config = ClientConfig(
                app_id="test",
                messages=[Note],
                settings_store=":memory:",
                driver_directory=client_dir,
                driver=driver,
                enable_ipc=ipc,
            )
            async with Client(config) as client:
                connection = await client.connect("127.0.0.1", port, timeout=20)
                assert connection.is_ipc == ipc
                group = state["group"]
                context = state["context"]
                bell = context.doorbell
                rung = 0
                i = 0
                while rung < 5:
                    i += 1
                    assert i <= 15, f"only {rung} of {i - 1} messages woke the server by its doorbell"
                    # Wait until the server's poller is parked on the doorbell.
                    deadline = time.monotonic() + 15
                    while not group.backoff.parked:
                        assert time.monotonic() < deadline, "server poller never parked"
                        await asyncio.sleep(0.005)
                    before, timeouts = bell.wakeups, bell.timeouts
                    sent = time.monotonic()
                    await connection.send(Note(i))
                    while len(received) < i:
                        assert time.monotonic() - sent < PARK_S - 1, "server woke only by its timeout"
                        await asyncio.sleep(0.001)
                    # (an invoker-mode server wakes for its driver's input instead)
                    if invoker or bell.wakeups > before:
                        rung += 1
                    else:  # only if a connection's timer ended the pause just then (rare, inconclusive)
                        assert bell.timeouts > timeouts, "the message was handled, but not by a wake-up"
                assert received == list(range(1, i + 1))

        run_async(main(), 120)
    finally:
        stop.set()
        thread.join(30)
        if invoker:
            shutil.rmtree(client_dir, ignore_errors=True)


def test_the_c_ring_and_drain_refuse_bad_arguments() -> None:
    from slipstream.files import doorbell

    if doorbell._c_send_ring is None or doorbell._c_drain is None:
        pytest.skip("C fast path not active")
    for fd in (-1, 2**40):
        with pytest.raises(ValueError, match="bad fd"):
            doorbell._c_drain(fd)
        with pytest.raises(ValueError, match="bad fd"):
            doorbell._c_send_ring(fd, doorbell_address(1))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for address in (b"", b"x" * 200):
            with pytest.raises(ValueError, match="bad address"):
                doorbell._c_send_ring(sock.fileno(), address)
        with pytest.raises(TypeError):
            doorbell._c_send_ring(sock.fileno(), "not bytes")
