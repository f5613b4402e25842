"""Aeron's to-driver ring buffer and to-clients broadcast buffer: layouts byte for byte, and many processes.

The offsets and rules asserted here are the facts of Aeron's documented layouts (the many-to-one ring
buffer's trailer of counters each on its own pair of 64-byte cache lines, 8-byte aligned records of
length, type id and message, the length written last; a padding record of type -1 up to the end of the
buffer when a record does not fit before it; the broadcast trailer's tail intent, tail and latest
counters), written as numbers, not taken from the modules under test.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import multiprocessing.connection
import multiprocessing.synchronize
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slipstream.errors import AtomicsUnavailableError, InvalidArgumentError
from slipstream.files import broadcast, ringbuffer
from slipstream.files.broadcast import (
    BroadcastLappedError,
    BroadcastReceiver,
    BroadcastTransmitter,
    CopyBroadcastReceiver,
)
from slipstream.files.ringbuffer import ManyToOneRingBuffer, RingBufferCorruptError
from slipstream.logbuffer.fastpath import ATOMICS

if ATOMICS is None and os.environ.get("SLIPSTREAM_REQUIRE_EXTENSIONS") == "1":
    raise RuntimeError("SLIPSTREAM_REQUIRE_EXTENSIONS=1 but the C extension's atomics did not load")

needs_atomics = pytest.mark.skipif(
    ATOMICS is None, reason="writers need the C extension's atomics (not built, or SLIPSTREAM_NO_EXTENSIONS is set)"
)

RB_TRAILER = 768  # 12 cache lines: tail, head cache, head, correlation counter, heartbeat, each 2 lines apart
BC_TRAILER = 128  # tail intent, tail, latest (i64 each), padded to two cache lines
CAP = 1024
TIMEOUT_S = 60.0


def i32(buf: memoryview | mmap.mmap, offset: int) -> int:
    return int(struct.unpack_from("<i", buf, offset)[0])


def i64(buf: memoryview | mmap.mmap, offset: int) -> int:
    return int(struct.unpack_from("<q", buf, offset)[0])


@pytest.fixture
def rb_mem() -> Iterator[mmap.mmap]:
    mem = mmap.mmap(-1, CAP + RB_TRAILER)
    yield mem
    with contextlib.suppress(BufferError):  # a view kept alive by a failed test's traceback
        mem.close()


@pytest.fixture
def bc_mem() -> Iterator[mmap.mmap]:
    mem = mmap.mmap(-1, CAP + BC_TRAILER)
    yield mem
    with contextlib.suppress(BufferError):  # a view kept alive by a failed test's traceback
        mem.close()


def collect(into: list[tuple[int, bytes]]) -> Callable[[int, memoryview | bytes], None]:
    return lambda type_id, message: into.append((type_id, bytes(message)))


# ---- the layouts' numbers --------------------------------------------------------------------------------


def test_layout_constants_are_aerons() -> None:
    assert (ringbuffer.TAIL_POSITION_OFFSET, ringbuffer.HEAD_CACHE_POSITION_OFFSET) == (128, 256)
    assert (ringbuffer.HEAD_POSITION_OFFSET, ringbuffer.CORRELATION_COUNTER_OFFSET) == (384, 512)
    assert (ringbuffer.CONSUMER_HEARTBEAT_OFFSET, ringbuffer.TRAILER_LENGTH) == (640, RB_TRAILER)
    assert (ringbuffer.RECORD_HEADER_LENGTH, ringbuffer.RECORD_ALIGNMENT, ringbuffer.PADDING_MSG_TYPE_ID) == (8, 8, -1)
    assert (broadcast.TAIL_INTENT_COUNTER_OFFSET, broadcast.TAIL_COUNTER_OFFSET) == (0, 8)
    assert (broadcast.LATEST_COUNTER_OFFSET, broadcast.TRAILER_LENGTH) == (16, BC_TRAILER)
    assert (broadcast.RECORD_HEADER_LENGTH, broadcast.RECORD_ALIGNMENT, broadcast.PADDING_MSG_TYPE_ID) == (8, 8, -1)


@pytest.mark.parametrize("length", [CAP + RB_TRAILER - 8, 1000 + RB_TRAILER, RB_TRAILER + 4, RB_TRAILER])
def test_ring_capacity_must_be_a_power_of_two(length: int) -> None:
    with pytest.raises(InvalidArgumentError, match="power of two"):
        ManyToOneRingBuffer(memoryview(bytearray(length)))


def test_ring_needs_a_writable_buffer() -> None:
    with pytest.raises(InvalidArgumentError, match="writable"):
        ManyToOneRingBuffer(memoryview(bytes(CAP + RB_TRAILER)))


def test_broadcast_capacity_must_be_a_power_of_two() -> None:
    for cls in (BroadcastTransmitter, BroadcastReceiver):
        with pytest.raises(InvalidArgumentError, match="power of two"):
            cls(memoryview(bytearray(1000 + BC_TRAILER)))


def test_max_message_length_is_an_eighth_of_the_capacity(rb_mem: mmap.mmap, bc_mem: mmap.mmap) -> None:
    assert ManyToOneRingBuffer(memoryview(rb_mem)).max_message_length == 128
    assert BroadcastTransmitter(memoryview(bc_mem)).max_message_length == 128
    assert ManyToOneRingBuffer(memoryview(bytearray(8 + RB_TRAILER))).max_message_length == 0  # Aeron's minimum


# ---- the ring buffer ---------------------------------------------------------------------------------------


@needs_atomics
def test_ring_record_layout_and_positions(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    assert rb.write(7, b"hello")
    assert rb.write(9, memoryview(b"0123456789abcdef"))
    assert rb_mem[0:13] == struct.pack("<ii", 13, 7) + b"hello"  # length counts the header, not the alignment
    assert rb_mem[13:16] == bytes(3)
    assert rb_mem[16:40] == struct.pack("<ii", 24, 9) + b"0123456789abcdef"
    assert i64(rb_mem, CAP + 128) == 40 == rb.producer_position
    assert i64(rb_mem, CAP + 384) == 0 == rb.consumer_position
    got: list[tuple[int, bytes]] = []
    assert rb.read(collect(got)) == 2
    assert got == [(7, b"hello"), (9, b"0123456789abcdef")]
    assert rb_mem[0:CAP] == bytes(CAP)  # consumed space is zeroed for the next lap
    assert i64(rb_mem, CAP + 384) == 40 == rb.consumer_position
    assert rb.size() == 0
    assert rb.read(collect(got)) == 0


@needs_atomics
def test_ring_read_limit_and_empty_message(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    for n in range(5):
        assert rb.write(n + 1, bytes([n]) * n)
    got: list[tuple[int, bytes]] = []
    assert rb.read(collect(got), 2) == 2
    assert rb.consumer_position == 8 + 16  # records of 8 and 9 bytes
    assert rb.read(collect(got)) == 3
    assert got == [(n + 1, bytes([n]) * n) for n in range(5)]


@needs_atomics
def test_ring_full_returns_false_without_blocking(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    for n in range(16):  # 16 records of 8 + 56 bytes fill 1024
        assert rb.write(1, bytes([n]) * 56)
    started = time.monotonic()
    assert not rb.write(1, b"x")
    assert time.monotonic() - started < 1.0
    assert rb.producer_position == CAP
    assert rb.read(collect([]), 1) == 1
    assert rb.write(1, bytes(56))
    assert not rb.write(1, b"")


@needs_atomics
def test_ring_padding_record_at_the_end_of_the_buffer(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    for _ in range(15):
        assert rb.write(1, bytes(56))
    assert rb.read(collect([]), 1) == 1  # head at 64: 128 bytes free in all, but only 64 before the head
    assert not rb.write(2, bytes(80))  # 88 bytes do not fit in the 64 at the end, nor before the head index
    assert rb.producer_position == 960
    assert rb.read(collect([]), 14) == 14
    assert rb.consumer_position == 960
    assert rb.write(2, b"A" * 80)
    assert rb_mem[960:968] == struct.pack("<ii", 64, -1)  # padding record up to the end of the buffer
    assert rb_mem[0:88] == struct.pack("<ii", 88, 2) + b"A" * 80
    assert rb.producer_position == 960 + 64 + 88
    got: list[tuple[int, bytes]] = []
    assert rb.read(collect(got)) == 0  # a read stops at the end of the buffer: the padding only
    assert rb.consumer_position == CAP
    assert rb.read(collect(got)) == 1
    assert got == [(2, b"A" * 80)]
    assert rb.consumer_position == rb.producer_position


@needs_atomics
@pytest.mark.parametrize("type_id", [0, -1, -5, 2**31])
def test_ring_rejects_bad_type_ids_before_writing(rb_mem: mmap.mmap, type_id: int) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    with pytest.raises(InvalidArgumentError, match="type id"):
        rb.write(type_id, b"x")
    assert rb_mem[:] == bytes(CAP + RB_TRAILER)


@needs_atomics
def test_ring_rejects_oversized_messages_before_writing(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    with pytest.raises(InvalidArgumentError, match="exceeds the maximum of 128"):
        rb.write(1, bytes(129))
    assert rb_mem[:] == bytes(CAP + RB_TRAILER)
    assert rb.write(1, bytes(128))


@needs_atomics
def test_ring_correlation_ids_and_heartbeat(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    assert [rb.next_correlation_id() for _ in range(3)] == [0, 1, 2]
    assert i64(rb_mem, CAP + 512) == 3
    rb.consumer_heartbeat_time = 1_700_000_000_123
    assert i64(rb_mem, CAP + 640) == 1_700_000_000_123 == rb.consumer_heartbeat_time


@needs_atomics
def test_ring_handler_that_raises_consumes_up_to_it(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    for n in range(3):
        assert rb.write(1, bytes([n]))

    def handler(type_id: int, message: memoryview) -> None:
        if message[0] == 1:
            raise KeyError("boom")

    with pytest.raises(KeyError):
        rb.read(handler)
    assert rb.consumer_position == 32
    got: list[tuple[int, bytes]] = []
    assert rb.read(collect(got)) == 1
    assert got == [(1, b"\x02")]


@needs_atomics
def test_ring_record_running_past_the_end_is_refused(rb_mem: mmap.mmap) -> None:
    rb = ManyToOneRingBuffer(memoryview(rb_mem))
    struct.pack_into("<qq", rb_mem, CAP + 128, 4096, 0)
    struct.pack_into("<ii", rb_mem, 0, 4096, 1)
    before = rb_mem[:]
    with pytest.raises(RingBufferCorruptError):
        rb.read(collect([]))
    assert rb_mem[:] == before  # nothing zeroed, the head not moved


# ---- the ring buffer in many processes ----------------------------------------------------------------------

WRITERS = 4
PER_WRITER = 10_000
RING_CAP = 4096


def ring_payload(writer: int, seq: int, correlation: int) -> bytes:
    body = bytes([(writer * 31 + seq) & 0xFF]) * ((seq * 37 + writer * 11) % 200)
    return struct.pack("<iiq", writer, seq, correlation) + body


def ring_writer(path: str, writer: int, count: int, go: multiprocessing.synchronize.Event) -> None:
    """A writer process: maps the file itself, writes ``count`` numbered messages, retries while full."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), RING_CAP + RB_TRAILER) as mem:
        rb = ManyToOneRingBuffer(memoryview(mem))
        if not go.wait(TIMEOUT_S):
            os._exit(4)
        deadline = time.monotonic() + TIMEOUT_S
        for seq in range(count):
            payload = ring_payload(writer, seq, rb.next_correlation_id())
            while not rb.write(writer + 1, payload):
                if time.monotonic() > deadline:
                    os._exit(3)
                time.sleep(0)
        del rb


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="slipstream-rb-", dir=base) as path:
        yield Path(path)


def shared_file(directory: Path, length: int) -> Path:
    path = directory / "buffer"
    with open(path, "wb") as f:
        f.truncate(length)
    return path


@needs_atomics
def test_ring_many_writer_processes_one_reader(shm_dir: Path) -> None:
    path = shared_file(shm_dir, RING_CAP + RB_TRAILER)
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()  # all writers start together, so that their claims race
    procs = [ctx.Process(target=ring_writer, args=(str(path), w, PER_WRITER, go)) for w in range(WRITERS)]
    next_seq = [0] * WRITERS
    correlations: set[int] = set()
    errors: list[str] = []

    def handler(type_id: int, message: memoryview) -> None:
        writer, seq, correlation = struct.unpack_from("<iiq", message)
        if type_id != writer + 1 or bytes(message) != ring_payload(writer, seq, correlation):
            errors.append(f"bad message {type_id} {writer} {seq}")
        elif seq != next_seq[writer]:
            errors.append(f"writer {writer}: got {seq}, expected {next_seq[writer]}")
        next_seq[writer] = seq + 1
        correlations.add(correlation)

    with open(path, "r+b") as f, mmap.mmap(f.fileno(), RING_CAP + RB_TRAILER) as mem:
        rb = ManyToOneRingBuffer(memoryview(mem))
        for p in procs:
            p.start()
        go.set()
        try:
            total = 0
            deadline = time.monotonic() + TIMEOUT_S
            idle_after_exit = 0
            while total < WRITERS * PER_WRITER and not errors and time.monotonic() < deadline:
                finished = not any(p.is_alive() for p in procs)  # before the read: their writes are all in
                read = rb.read(handler, 50)
                total += read
                idle_after_exit = idle_after_exit + 1 if finished and not read else 0
                if idle_after_exit == 2:  # (one empty read may be a padding record)
                    break
            for p in procs:
                p.join(timeout=max(1.0, deadline - time.monotonic()))
            assert not errors, errors[:5]
            assert total == WRITERS * PER_WRITER, f"{total} messages read before the timeout"
            assert next_seq == [PER_WRITER] * WRITERS
            assert rb.read(handler) == 0
            assert correlations == set(range(WRITERS * PER_WRITER))  # get-and-add across processes: no repeats
            assert rb.consumer_position == rb.producer_position > RING_CAP * 10  # it wrapped many times
            assert [p.exitcode for p in procs] == [0] * WRITERS
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
            del rb


# ---- the broadcast buffer ---------------------------------------------------------------------------------


@needs_atomics
def test_broadcast_record_layout_and_counters(bc_mem: mmap.mmap) -> None:
    tx = BroadcastTransmitter(memoryview(bc_mem))
    tx.transmit(5, b"abc")
    assert bc_mem[0:11] == struct.pack("<ii", 11, 5) + b"abc"
    assert (i64(bc_mem, CAP), i64(bc_mem, CAP + 8), i64(bc_mem, CAP + 16)) == (16, 16, 0)  # intent, tail, latest
    tx.transmit(6, bytes(range(16)))
    assert bc_mem[16:40] == struct.pack("<ii", 24, 6) + bytes(range(16))
    assert (i64(bc_mem, CAP), i64(bc_mem, CAP + 8), i64(bc_mem, CAP + 16)) == (40, 40, 16)


@needs_atomics
def test_broadcast_padding_record_at_the_end_of_the_buffer(bc_mem: mmap.mmap) -> None:
    tx = BroadcastTransmitter(memoryview(bc_mem))
    for _ in range(127):
        tx.transmit(1, b"")  # 127 records of 8 bytes: the tail at 1016
    tx.transmit(2, b"B" * 8)
    assert bc_mem[1016:1024] == struct.pack("<ii", 8, -1)
    assert bc_mem[0:16] == struct.pack("<ii", 16, 2) + b"B" * 8
    assert (i64(bc_mem, CAP), i64(bc_mem, CAP + 8), i64(bc_mem, CAP + 16)) == (1040, 1040, 1024)


@needs_atomics
def test_broadcast_rejects_bad_type_ids_and_oversized_messages(bc_mem: mmap.mmap) -> None:
    tx = BroadcastTransmitter(memoryview(bc_mem))
    for type_id in (0, -1):
        with pytest.raises(InvalidArgumentError, match="type id"):
            tx.transmit(type_id, b"x")
    with pytest.raises(InvalidArgumentError, match="exceeds"):
        tx.transmit(1, bytes(129))
    assert bc_mem[:] == bytes(CAP + BC_TRAILER)


def lay_out_broadcast(mem: mmap.mmap | memoryview, records: list[tuple[int, bytes]], start: int = 0) -> int:
    """Broadcast records written by hand from the layout facts alone (no transmitter), from position ``start``."""
    tail = start
    for type_id, message in records:
        offset = tail % CAP
        aligned = (len(message) + 8 + 7) & ~7
        if CAP - offset < aligned:
            struct.pack_into("<ii", mem, offset, CAP - offset, -1)
            tail += CAP - offset
            offset = 0
        struct.pack_into("<ii", mem, offset, len(message) + 8, type_id)
        mem[offset + 8 : offset + 8 + len(message)] = message
        struct.pack_into("<qq", mem, CAP, tail + aligned, tail + aligned)
        struct.pack_into("<q", mem, CAP + 16, tail)
        tail += aligned
    return tail


def test_broadcast_receiver_reads_the_documented_layout(bc_mem: mmap.mmap) -> None:
    """Runs without the extension too: a receiver only loads."""
    joined_at = lay_out_broadcast(bc_mem, [(9, b"lost"), (3, b"x" * 16)], start=976)  # the second at 992
    assert (joined_at, i64(bc_mem, CAP + 16)) == (1016, 992)
    rx = CopyBroadcastReceiver(BroadcastReceiver(memoryview(bc_mem)))  # a receiver starts at the latest record
    records = [(3, bytes([n]) * (n * 5)) for n in range(1, 12)]
    lay_out_broadcast(bc_mem, records, start=joined_at)  # the first does not fit in the last 8 bytes: padding
    assert bc_mem[1016:1024] == struct.pack("<ii", 8, -1)
    assert bc_mem[0:13] == struct.pack("<ii", 13, 3) + b"\x01" * 5
    got: list[tuple[int, bytes]] = []
    for _ in range(len(records) + 1):
        assert rx.receive(collect(got)) == 1
    assert rx.receive(collect(got)) == 0
    assert got == [(3, b"x" * 16), *records]
    assert rx.lapped_count == 0


@needs_atomics
def test_broadcast_lapped_receiver_recovers(bc_mem: mmap.mmap) -> None:
    tx = BroadcastTransmitter(memoryview(bc_mem))
    rx = CopyBroadcastReceiver(BroadcastReceiver(memoryview(bc_mem)))
    tx.transmit(1, b"first")
    got: list[tuple[int, bytes]] = []
    assert rx.receive(collect(got)) == 1
    for n in range(40):  # 40 records of 32 bytes: more than a capacity past the receiver
        tx.transmit(2, bytes([n]) * 24)
    with pytest.raises(BroadcastLappedError):
        rx.receive(collect(got))
    assert rx.lapped_count == 1
    assert rx.receive(collect(got)) == 0  # it moved to the latest record, which was lost with the rest
    tx.transmit(3, b"after")
    tx.transmit(4, b"again")
    assert rx.receive(collect(got)) == 1
    assert rx.receive(collect(got)) == 1
    assert got == [(1, b"first"), (3, b"after"), (4, b"again")]
    assert rx.lapped_count == 1


BC_CAP = 4096
BC_MESSAGES = 3000


def bc_payload(seq: int) -> bytes:
    return struct.pack("<i", seq) + bytes([seq & 0xFF]) * ((seq * 13) % 180)


def bc_receiver(
    path: str, ready: multiprocessing.synchronize.Event, conn: multiprocessing.connection.Connection
) -> None:
    """A receiver process: maps the file, checks every message arrives in order, reports its progress."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), BC_CAP + BC_TRAILER + 8) as mem:
        view = memoryview(mem)
        rx = CopyBroadcastReceiver(BroadcastReceiver(view[: BC_CAP + BC_TRAILER]))
        progress = BC_CAP + BC_TRAILER
        got: list[tuple[int, bytes]] = []
        ready.set()
        deadline = time.monotonic() + TIMEOUT_S
        failure = ""
        while len(got) < BC_MESSAGES and time.monotonic() < deadline and not failure:
            try:
                if rx.receive(collect(got)):
                    assert ATOMICS is not None
                    ATOMICS.store_release_i64(mem, progress, len(got))
            except BroadcastLappedError as exc:
                failure = str(exc)
        expected = [(7, bc_payload(n)) for n in range(BC_MESSAGES)]
        conn.send((failure, len(got), got == expected, rx.lapped_count))
        del rx, view


@needs_atomics
def test_broadcast_to_a_receiver_in_another_process(shm_dir: Path) -> None:
    path = shared_file(shm_dir, BC_CAP + BC_TRAILER + 8)  # the last 8 bytes: the receiver's progress
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=bc_receiver, args=(str(path), ready, child))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), BC_CAP + BC_TRAILER + 8) as mem:
        view = memoryview(mem)
        tx = BroadcastTransmitter(view[: BC_CAP + BC_TRAILER])
        proc.start()
        try:
            assert ready.wait(TIMEOUT_S)
            deadline = time.monotonic() + TIMEOUT_S
            for seq in range(BC_MESSAGES):
                # No flow control in a broadcast: the test keeps within 8 records (under half the capacity)
                # of the receiver, so that wrapping is exercised without lapping it.
                while seq - i64(mem, BC_CAP + BC_TRAILER) > 8 and time.monotonic() < deadline:
                    time.sleep(0)
                tx.transmit(7, bc_payload(seq))
            assert parent.poll(TIMEOUT_S), "the receiver did not report"
            failure, count, in_order, lapped = parent.recv()
            proc.join(TIMEOUT_S)
            assert failure == "" and count == BC_MESSAGES and in_order and lapped == 0
            assert i64(mem, BC_CAP + 8) > BC_CAP * 50  # wrapped many times
            assert proc.exitcode == 0
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            del tx, view


# ---- without the extension ------------------------------------------------------------------------------

PURE_SCRIPT = textwrap.dedent(
    """
    import mmap, sys
    from slipstream.errors import AtomicsUnavailableError
    from slipstream.files.broadcast import BroadcastReceiver, BroadcastTransmitter, CopyBroadcastReceiver
    from slipstream.files.ringbuffer import ManyToOneRingBuffer
    from slipstream.logbuffer.fastpath import ATOMICS
    assert ATOMICS is None
    with open(sys.argv[1], "r+b") as f, mmap.mmap(f.fileno(), 0) as mem:
        view = memoryview(mem)
        rx = CopyBroadcastReceiver(BroadcastReceiver(view[: {cap} + {bc}]))
        got = []
        while rx.receive(lambda t, m: got.append((t, m))):
            pass
        print("received", got)
        rb = ManyToOneRingBuffer(view[{cap} + {bc} :])
        print("positions", rb.producer_position, rb.consumer_position, rb.consumer_heartbeat_time)
        for name, call in [
            ("write", lambda: rb.write(1, b"x")),
            ("read", lambda: rb.read(lambda t, m: None)),
            ("correlation", rb.next_correlation_id),
            ("transmit", lambda: BroadcastTransmitter(view[: {cap} + {bc}]).transmit(1, b"x")),
        ]:
            try:
                call()
            except AtomicsUnavailableError as exc:
                print(name, "refused:", exc)
        del rx, rb, view
    """
).format(cap=CAP, bc=BC_TRAILER)


def test_without_the_extension_writers_refuse_and_readers_read(shm_dir: Path) -> None:
    path = shared_file(shm_dir, CAP + BC_TRAILER + CAP + RB_TRAILER)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mem:
        lay_out_broadcast(mem, [(4, b"one"), (5, b"two")])
        struct.pack_into("<q", mem, CAP + BC_TRAILER + CAP + 128, 48)  # the ring's tail
        struct.pack_into("<q", mem, CAP + BC_TRAILER + CAP + 640, 77)  # and its consumer heartbeat
    env = {**os.environ, "SLIPSTREAM_NO_EXTENSIONS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PURE_SCRIPT, str(path)], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "received [(5, b'two')]"  # a receiver starts at the latest message
    assert lines[1] == "positions 48 0 77"
    assert [line.split(" refused:")[0] for line in lines[2:]] == ["write", "read", "correlation", "transmit"]
    assert all("needs atomic operations on shared memory" in line and "C extension" in line for line in lines[2:])
    assert issubclass(AtomicsUnavailableError, RuntimeError)


# ---- against the reference Aeron C media driver ------------------------------------------------------------


def _aeron_binaries() -> dict[str, Path]:
    aeron_c = pytest.importorskip("bench.aeron_c", reason="bench/ (which starts aeronmd) is not in this tree")
    found, reason = aeron_c.find_binaries(os.environ.get(aeron_c.ENV_VAR))
    if not found:
        pytest.skip(f"needs a reference Aeron C build: {reason}")
    return found


@needs_atomics
def test_reference_aeronmd_reads_our_command_and_we_read_its_broadcast(shm_dir: Path) -> None:
    """A remove-publication command for a registration that does not exist, written to aeronmd's to-driver
    ring buffer in its cnc.dat: the driver consumes it (the ring's head reaches its tail, the space zeroed)
    and answers on its to-clients broadcast with an error naming our correlation id."""
    binaries = _aeron_binaries()
    from bench.aeron_c import aeron_driver

    directory = shm_dir / "aeron"
    settings = {"aeron.threading.mode": "SHARED", "aeron.dir.delete.on.start": "true"}
    with (
        aeron_driver(binaries, directory, settings),
        open(directory / "cnc.dat", "r+b") as f,
        mmap.mmap(f.fileno(), 0) as mem,
    ):
        view = memoryview(mem)
        deadline = time.monotonic() + 10.0
        while i32(mem, 0) == 0 and time.monotonic() < deadline:  # the CnC version goes in last
            time.sleep(0.01)
        to_driver, to_clients = i32(mem, 4), i32(mem, 8)  # CnC metadata: version, then the two lengths
        rb = ManyToOneRingBuffer(view[128 : 128 + to_driver])  # after two cache lines of metadata
        rx = CopyBroadcastReceiver(BroadcastReceiver(view[128 + to_driver : 128 + to_driver + to_clients]))
        assert abs(rb.consumer_heartbeat_time - time.time() * 1000) < 10_000  # the driver's epoch ms
        client_id, correlation_id = rb.next_correlation_id(), rb.next_correlation_id()
        remove_publication, on_error, unknown_registration = 0x02, 0x0F01, 0x7FFF_0001
        assert rb.write(remove_publication, struct.pack("<qqqQ", client_id, correlation_id, unknown_registration, 0))
        errors: list[tuple[int, int, str]] = []

        def handler(type_id: int, message: bytes) -> None:
            if type_id == on_error:
                offending, code, length = struct.unpack_from("<qii", message)
                errors.append((offending, code, message[16 : 16 + length].decode()))

        while not errors and time.monotonic() < deadline + 10.0:
            if not rx.receive(handler):
                time.sleep(0.001)
        assert errors and errors[0][0] == correlation_id, errors
        assert str(unknown_registration) in errors[0][2]
        assert rb.consumer_position == rb.producer_position == 40
        assert bytes(rb.buffer[:40]) == bytes(40)
        assert rx.lapped_count == 0
        del rb, rx, view
