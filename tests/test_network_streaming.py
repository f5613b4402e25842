"""Streams of large payloads and files between two sans-I/O stream machines in memory."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.frames import FrameKind
from slipstream.network.rmi import RemoteRef, RmiCallCompleted, RmiEndpoint, RmiRegistry
from slipstream.network.serialization import Serialization
from slipstream.network.streamfiles import WRITE_BACKLOG_PAUSE, InlineStreamFiles, ThreadedStreamFiles
from slipstream.network.streaming import (
    FileSource,
    SpillFile,
    StreamCompleted,
    StreamFailed,
    StreamFailure,
    StreamingError,
    StreamProgressed,
    Streams,
    StreamSent,
    StreamStarted,
)

MiB = 1024 * 1024


class Link:
    """A sender and a receiver machine; ``pump`` moves frames both ways (optionally through a filter)."""

    def __init__(self, tmp: Path, *, chunk_payload: int = 64 * 1024, **receiver: Any) -> None:
        self.tmp = tmp
        self.sender = Streams(chunk_payload=chunk_payload, temp_dir=str(tmp))
        self.receiver = Streams(chunk_payload=chunk_payload, temp_dir=str(tmp), **receiver)
        self.sent_events: list[Any] = []
        self.received_events: list[Any] = []
        self.peak_memory = 0

    def pump(self, now_ns: int = 0, *, tamper: Any = None, max_rounds: int = 100_000) -> None:
        for _ in range(max_rounds):
            frames = self.sender.take_frames(256 * 1024)
            for kind, stream_id, payload in frames:
                if tamper is not None:
                    replaced = tamper(kind, stream_id, payload)
                    if replaced is None:
                        continue
                    payload = replaced
                self.receiver.receive(kind, stream_id, payload, now_ns)
                self.peak_memory = max(self.peak_memory, self.receiver.in_memory_bytes)
            back = self.receiver.take_frames()
            for kind, stream_id, payload in back:
                self.sender.receive(kind, stream_id, payload, now_ns)
            self.sent_events += self.sender.take_events()
            self.received_events += self.receiver.take_events()
            if not frames and not back and not self.sender.sending:
                return
        raise AssertionError("the streams did not settle")

    def outcome(self) -> Any:
        finals = [e for e in self.received_events if isinstance(e, (StreamCompleted, StreamFailed))]
        assert len(finals) == 1, finals
        return finals[0]

    def files(self) -> list[str]:
        return sorted(os.listdir(self.tmp))


def test_a_payload_larger_than_a_message_arrives_whole_in_memory(tmp_path: Path) -> None:
    link = Link(tmp_path, chunk_payload=1400)
    data = random.Random(1).randbytes(MiB + 17)
    assert link.sender.needs_streaming(len(data)) and not link.sender.needs_streaming(1400)
    stream_id = link.sender.send(FrameKind.RMI_RESPONSE, 0x1234_5678, data)
    link.pump()
    done = link.outcome()
    assert isinstance(done, StreamCompleted)
    assert done.payload == data and done.path is None and not done.is_file
    assert (done.kind, done.request_id, done.size) == (FrameKind.RMI_RESPONSE, 0x1234_5678, len(data))
    assert done.sha256 == hashlib.sha256(data).digest()
    assert isinstance(link.received_events[0], StreamStarted)
    (sent,) = [e for e in link.sent_events if isinstance(e, StreamSent)]
    assert sent.stream_id == stream_id and sent.sha256 == done.sha256
    assert link.receiver.in_memory_bytes == 0 and link.files() == []


def test_32_mib_random_bytes_spill_to_a_file_and_memory_stays_bounded(tmp_path: Path) -> None:
    link = Link(tmp_path)  # default spill threshold: 16 MiB
    data = os.urandom(32 * MiB)
    link.sender.send(FrameKind.MESSAGE, 0, data)
    link.pump()
    done = link.outcome()
    assert isinstance(done, StreamCompleted) and done.payload is None and done.path is not None
    assert link.peak_memory == 0  # announced above the threshold: straight to disk
    with SpillFile.mapped(done.path) as view:
        assert hashlib.sha256(view).digest() == hashlib.sha256(data).digest() == done.sha256
    assert link.files() == [os.path.basename(done.path)]
    assert link.receiver.release(done.stream_id) and link.files() == []
    assert not link.receiver.release(done.stream_id)


def test_memory_budget_across_concurrent_streams_spills_the_overflowing_one(tmp_path: Path) -> None:
    link = Link(tmp_path, spill_threshold=4 * MiB)
    payloads = [os.urandom(3 * MiB) for _ in range(3)]
    for payload in payloads:
        link.sender.send(FrameKind.MESSAGE, 0, payload)
    link.pump()
    done = [e for e in link.received_events if isinstance(e, StreamCompleted)]
    assert len(done) == 3
    assert link.peak_memory <= 4 * MiB
    assert link.receiver.stats.spilled_streams >= 1
    for event, payload in zip(sorted(done, key=lambda e: e.stream_id), payloads, strict=True):
        if event.payload is not None:
            assert event.payload == payload
        else:
            assert event.path is not None
            assert Path(event.path).read_bytes() == payload
    link.receiver.close()
    assert link.files() == []


def test_a_file_arrives_as_a_checked_temporary_copy(tmp_path: Path) -> None:
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    original = source_dir / "report.bin"
    original.write_bytes(os.urandom(3 * MiB + 5))
    link = Link(spill_dir)
    link.sender.send_file(original)
    link.pump()
    done = link.outcome()
    assert isinstance(done, StreamCompleted) and done.is_file and done.name == "report.bin"
    assert done.path is not None and Path(done.path).read_bytes() == original.read_bytes()
    assert done.sha256 == hashlib.sha256(original.read_bytes()).digest()
    with pytest.raises(StreamingError, match="cannot send file"):
        link.sender.send_file(source_dir / "missing")
    link.receiver.close()  # a completed copy nobody released is removed on close
    assert link.files() == []


def test_a_stream_names_the_frame_it_carries_and_a_copy_can_be_handed_over(tmp_path: Path) -> None:
    """What RMI needs for a ``Path`` argument or result: the start says which frame the stream carries
    (a MESSAGE marked for RMI), and ``detach`` gives the completed copy away (no longer removed)."""
    original = tmp_path / "argument.bin"
    original.write_bytes(os.urandom(200_000))
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    link = Link(spill_dir)
    stream_id = link.sender.send_file(original, kind=FrameKind.MESSAGE, request_id=0x524D4946)
    link.pump()
    started = next(e for e in link.received_events if isinstance(e, StreamStarted))
    assert (started.stream_id, started.kind, started.request_id, started.is_file) == (
        stream_id,
        FrameKind.MESSAGE,
        0x524D4946,
        True,
    )
    done = link.outcome()
    assert isinstance(done, StreamCompleted) and done.path is not None
    assert link.receiver.detach(stream_id) == done.path and link.receiver.detach(stream_id) is None
    assert not link.receiver.release(stream_id)
    link.receiver.close()
    assert Path(done.path).read_bytes() == original.read_bytes()  # the application's now, kept
    Path(done.path).unlink()


def test_an_empty_payload_and_an_empty_file(tmp_path: Path) -> None:
    link = Link(tmp_path)
    link.sender.send(FrameKind.MESSAGE, 0, b"")
    link.pump()
    done = link.outcome()
    assert isinstance(done, StreamCompleted) and done.payload == b""
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    link2 = Link(tmp_path)
    link2.sender.send_file(empty)
    link2.pump()
    done2 = link2.outcome()
    assert isinstance(done2, StreamCompleted) and done2.path is not None
    with SpillFile.mapped(done2.path) as view:
        assert bytes(view) == b""
    link2.receiver.close()


def test_progress_is_observable_on_both_sides(tmp_path: Path) -> None:
    link = Link(tmp_path)
    data = os.urandom(5 * MiB)
    stream_id = link.sender.send(FrameKind.MESSAGE, 0, data)
    assert link.sender.progress(stream_id, incoming=False) == (0, len(data))
    link.sender.receive(FrameKind.STREAM_END, 999, b"\x02", 0)  # a REFUSED for no stream of ours: counted
    frames = link.sender.take_frames(MiB)
    for frame in frames:
        link.receiver.receive(*frame, 0)
    done, total = link.receiver.progress(stream_id, incoming=True) or (0, 0)
    assert total == len(data) and 0 < done < total
    link.pump()
    for incoming in (True, False):
        steps = [
            e.done
            for e in link.sent_events + link.received_events
            if isinstance(e, StreamProgressed) and e.incoming == incoming
        ]
        assert steps == sorted(steps) and steps[-1] == len(data) and len(steps) >= 5


def test_take_frames_respects_its_budget(tmp_path: Path) -> None:
    link = Link(tmp_path, chunk_payload=1024 + 8)
    link.sender.send(FrameKind.MESSAGE, 0, bytes(100_000))
    frames = link.sender.take_frames(10_000)
    data = sum(len(p) - 8 for k, _, p in frames if k == FrameKind.STREAM_CHUNK)
    assert 9_000 <= data <= 11_000 and frames[0][0] == FrameKind.STREAM_START


# -- failures ---------------------------------------------------------------------------------------------


def test_an_absurd_announced_size_is_refused_before_allocating(tmp_path: Path) -> None:
    link = Link(tmp_path, max_stream_size=64 * MiB)
    start = struct.pack(">BBIQ", 0, FrameKind.MESSAGE, 0, 2**63)
    link.receiver.receive(FrameKind.STREAM_START, 7, start, 0)
    (failed,) = link.receiver.take_events()
    assert (
        isinstance(failed, StreamFailed) and failed.failure == StreamFailure.TOO_LARGE and "2^63" not in failed.detail
    )
    assert str(2**63) in failed.detail
    ((kind, stream_id, payload),) = link.receiver.take_frames()
    assert (kind, stream_id, payload[0]) == (FrameKind.STREAM_END, 7, 2)
    assert link.receiver.in_memory_bytes == 0 and link.files() == []
    # the real sender learns that its stream was refused
    link.sender.send(FrameKind.MESSAGE, 0, bytes(65 * MiB))
    link.pump()
    refused = [e for e in link.sent_events if isinstance(e, StreamFailed)]
    assert refused and refused[0].failure == StreamFailure.REFUSED and not refused[0].incoming
    assert not link.sender.sending and link.files() == []


def test_too_many_concurrent_streams_are_refused(tmp_path: Path) -> None:
    link = Link(tmp_path, max_incoming=2)
    for stream_id in (1, 2, 3):
        link.receiver.receive(FrameKind.STREAM_START, stream_id, struct.pack(">BBIQ", 0, 1, 0, 10), 0)
    failures = [e for e in link.receiver.take_events() if isinstance(e, StreamFailed)]
    assert [(f.stream_id, f.failure) for f in failures] == [(3, StreamFailure.TOO_MANY)]


def test_a_missing_chunk_fails_the_stream_on_both_sides_and_frees_the_file(tmp_path: Path) -> None:
    link = Link(tmp_path, spill_threshold=0)
    chunks = 0

    def drop_third(kind: int, stream_id: int, payload: bytes) -> bytes | None:
        nonlocal chunks
        if kind == FrameKind.STREAM_CHUNK:
            chunks += 1
            if chunks == 3:
                return None
        return payload

    link.sender.send(FrameKind.MESSAGE, 0, os.urandom(MiB))
    link.pump(tamper=drop_third)
    failed = link.outcome()
    assert isinstance(failed, StreamFailed) and failed.failure == StreamFailure.CHUNK_MISSING
    assert [e.failure for e in link.sent_events if isinstance(e, StreamFailed)] == [StreamFailure.REFUSED]
    assert link.files() == [] and not link.sender.sending


def test_a_corrupted_chunk_is_a_checksum_mismatch(tmp_path: Path) -> None:
    link = Link(tmp_path, spill_threshold=0)

    def flip(kind: int, stream_id: int, payload: bytes) -> bytes:
        if kind == FrameKind.STREAM_CHUNK and payload[:8] == bytes(8):
            return payload[:20] + bytes([payload[20] ^ 1]) + payload[21:]
        return payload

    link.sender.send(FrameKind.MESSAGE, 0, os.urandom(300_000))
    link.pump(tamper=flip)
    failed = link.outcome()
    assert isinstance(failed, StreamFailed) and failed.failure == StreamFailure.CHECKSUM_MISMATCH
    assert link.files() == []


def test_overrun_and_wrong_total_are_size_mismatches(tmp_path: Path) -> None:
    link = Link(tmp_path)
    link.receiver.receive(FrameKind.STREAM_START, 1, struct.pack(">BBIQ", 0, 1, 0, 4), 0)
    link.receiver.receive(FrameKind.STREAM_CHUNK, 1, struct.pack(">Q", 0) + b"12345", 0)
    link.receiver.receive(FrameKind.STREAM_START, 2, struct.pack(">BBIQ", 0, 1, 0, 4), 0)
    link.receiver.receive(FrameKind.STREAM_CHUNK, 2, struct.pack(">Q", 0) + b"1234", 0)
    link.receiver.receive(FrameKind.STREAM_END, 2, b"\x00" + struct.pack(">Q32s", 5, bytes(32)), 0)
    failures = [e for e in link.receiver.take_events() if isinstance(e, StreamFailed)]
    assert [(f.stream_id, f.failure) for f in failures] == [
        (1, StreamFailure.SIZE_MISMATCH),
        (2, StreamFailure.SIZE_MISMATCH),
    ]


def test_sender_abort_and_connection_loss_free_everything(tmp_path: Path) -> None:
    link = Link(tmp_path, spill_threshold=MiB)
    first = link.sender.send(FrameKind.MESSAGE, 0, os.urandom(4 * MiB))
    link.sender.send(FrameKind.MESSAGE, 0, os.urandom(4 * MiB))
    for frame in link.sender.take_frames(MiB):
        link.receiver.receive(*frame, 0)
    assert len(link.files()) == 2  # both spilled
    link.sender.abort(first, "user cancelled")
    for frame in link.sender.take_frames(0):
        link.receiver.receive(*frame, 0)
    aborted = [e for e in link.receiver.take_events() if isinstance(e, StreamFailed)]
    assert [(e.stream_id, e.failure, e.detail) for e in aborted] == [
        (first, StreamFailure.SENDER_ABORTED, "user cancelled")
    ]
    assert len(link.files()) == 1
    # the sender dies mid-stream (SIGKILL): the receiver learns it from the connection and removes the file
    link.receiver.connection_lost("peer expired")
    lost = link.receiver.take_events()
    assert [e.failure for e in lost if isinstance(e, StreamFailed)] == [StreamFailure.CONNECTION_LOST]
    assert link.files() == [] and link.receiver.in_memory_bytes == 0
    link.sender.connection_lost("peer expired")
    assert [e.failure for e in link.sender.take_events() if isinstance(e, StreamFailed)][
        -1
    ] == StreamFailure.CONNECTION_LOST
    assert not link.sender.sending


def test_an_idle_stream_times_out(tmp_path: Path) -> None:
    link = Link(tmp_path, idle_timeout_ns=1_000, spill_threshold=0)
    link.sender.send(FrameKind.MESSAGE, 0, bytes(200_000))
    for frame in link.sender.take_frames(100_000):
        link.receiver.receive(*frame, 500)
    assert link.receiver.deadline_ns == 1_500
    link.receiver.handle_timer(1_499)
    assert not any(isinstance(e, StreamFailed) for e in link.receiver.take_events())
    link.receiver.handle_timer(1_500)
    (failed,) = [e for e in link.receiver.take_events() if isinstance(e, StreamFailed)]
    assert failed.failure == StreamFailure.TIMED_OUT and link.files() == []
    assert link.receiver.deadline_ns is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([18, 19, 20, 1]), st.integers(0, 3), st.binary(max_size=40)), max_size=30))
def test_hostile_frames_never_escape_or_allocate(frames: list[tuple[int, int, bytes]]) -> None:
    receiver = Streams(chunk_payload=64, max_stream_size=1024, spill_threshold=512, temp_dir=None)
    for kind, stream_id, payload in frames:
        receiver.receive(kind, stream_id, payload, 0)
        assert receiver.in_memory_bytes <= 1024
    receiver.take_events()
    receiver.close()


@settings(max_examples=50, deadline=None)
@given(size=st.integers(0, 20_000), chunk=st.integers(9, 3000), threshold=st.integers(0, 30_000))
def test_round_trips_of_any_size(
    tmp_path_factory: pytest.TempPathFactory, size: int, chunk: int, threshold: int
) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    link = Link(tmp, chunk_payload=chunk, spill_threshold=threshold)
    data = random.Random(size).randbytes(size)
    link.sender.send(FrameKind.SYNC_REQUEST, 9, data)
    link.pump()
    done = link.outcome()
    assert isinstance(done, StreamCompleted)
    if done.payload is not None:
        assert done.payload == data
    else:
        assert done.path is not None and Path(done.path).read_bytes() == data
    link.receiver.close()
    assert link.files() == []


# -- composition: an RMI argument and result larger than a transport message ----------------------------


class IStore(Protocol):
    def put(self, data: bytes) -> str: ...

    def get(self, seed: int, size: int) -> bytes: ...


class Store:
    def put(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def get(self, seed: int, size: int) -> bytes:
        return random.Random(seed).randbytes(size)


def test_32_mib_rmi_argument_and_result_are_streamed_transparently(tmp_path: Path) -> None:
    """What the connection machine does: frames too big for a message go through Streams, and a
    completed stream is handled as the frame it carries."""
    chunk = 64 * 1024
    client_rmi = RmiEndpoint(RmiRegistry([IStore]))
    server_rmi = RmiEndpoint(RmiRegistry([(IStore, Store)]))
    ref = RemoteRef(0, server_rmi.objects.save(Store()))
    client_streams = Streams(chunk_payload=chunk, temp_dir=str(tmp_path))
    server_streams = Streams(chunk_payload=chunk, temp_dir=str(tmp_path))

    def outgoing(rmi: RmiEndpoint, streams: Streams) -> list[tuple[int, int, bytes]]:
        frames = []
        for kind, request_id, payload in rmi.take_frames():
            if streams.needs_streaming(len(payload)):
                streams.send(kind, request_id, payload)
            else:
                frames.append((kind, request_id, payload))
        return frames + streams.take_frames(4 * MiB)

    def incoming(rmi: RmiEndpoint, streams: Streams, frames: list[tuple[int, int, bytes]]) -> None:
        for kind, request_id, payload in frames:
            if kind in (FrameKind.STREAM_START, FrameKind.STREAM_CHUNK, FrameKind.STREAM_END):
                streams.receive(kind, request_id, payload, 0)
                carried = []
                for event in streams.take_events():
                    if isinstance(event, StreamCompleted):
                        if event.payload is not None:
                            carried.append((event.kind, event.request_id, event.payload))
                        else:
                            assert event.path is not None
                            carried.append((event.kind, event.request_id, Path(event.path).read_bytes()))
                            streams.release(event.stream_id)
                incoming(rmi, streams, carried)
            elif kind == FrameKind.RMI_REQUEST:
                invocation = rmi.receive_request(request_id, payload)
                assert invocation is not None
                rmi.execute(invocation)
            else:
                rmi.receive_response(request_id, payload)

    data = os.urandom(32 * MiB)
    put = client_rmi.call(ref, "put", [data], 0)
    get = client_rmi.call(ref, "get", [7, 32 * MiB], 0)
    for _ in range(1000):
        to_server = outgoing(client_rmi, client_streams)
        incoming(server_rmi, server_streams, to_server)
        to_client = outgoing(server_rmi, server_streams)
        incoming(client_rmi, client_streams, to_client)
        if not to_server and not to_client:
            break
    results = {e.call_id: e.value for e in client_rmi.take_events() if isinstance(e, RmiCallCompleted)}
    assert results[put] == hashlib.sha256(data).hexdigest()
    assert results[get] == random.Random(7).randbytes(32 * MiB)
    assert os.listdir(tmp_path) == []


# -- the seed's battery items that need no network -----------------------------------------------------


class Big(msgspec.Struct):
    seq: int
    text: str
    blob: bytes


def test_a_message_bigger_than_the_mtu_is_echoed_1002_times(tmp_path: Path) -> None:
    serialization = Serialization([Big])
    chunk = 1376 - 9  # one frame in a seed-sized message
    a = Streams(chunk_payload=chunk, temp_dir=str(tmp_path))
    b = Streams(chunk_payload=chunk, temp_dir=str(tmp_path))
    message = Big(0, "x" * 3000, os.urandom(4000))
    echoed = 0
    payload = serialization.encode(message)
    assert a.needs_streaming(len(payload))
    a.send(FrameKind.MESSAGE, 0, payload)
    sides = [(a, b), (b, a)]
    turn = 0
    while echoed < 1002:
        source, target = sides[turn % 2]
        frames = source.take_frames()
        assert frames
        for frame in frames:
            target.receive(*frame, 0)
        (done,) = [e for e in target.take_events() if isinstance(e, StreamCompleted)]
        assert done.payload is not None
        received = serialization.decode(done.payload)
        assert isinstance(received, Big) and received.seq == echoed and received.blob == message.blob
        echoed += 1
        target.send(FrameKind.MESSAGE, 0, serialization.encode(Big(echoed, received.text, received.blob)))
        source.take_events()
        turn += 1
    assert echoed == 1002 and os.listdir(tmp_path) == []


SENDER = """
import os, struct, sys, time
from slipstream.network.frames import FrameKind
from slipstream.network.streaming import Streams
streams = Streams(chunk_payload=64 * 1024)
streams.send(FrameKind.MESSAGE, 0, os.urandom(64 * 1024 * 1024))
out = sys.stdout.buffer
while streams.sending:
    for kind, stream_id, payload in streams.take_frames(256 * 1024):
        out.write(struct.pack(">BII", kind, stream_id, len(payload)) + payload)
    out.flush()
    time.sleep(0.01)
"""


def test_a_stream_cut_off_by_sigkill_of_the_sender_leaves_no_temporary_file(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    child = subprocess.Popen([sys.executable, "-c", SENDER], stdout=subprocess.PIPE, env=env)
    receiver = Streams(chunk_payload=64 * 1024, spill_threshold=MiB, temp_dir=str(tmp_path))
    header = struct.Struct(">BII")
    assert child.stdout is not None
    try:
        received = 0
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the sender never got going"
            head = child.stdout.read(header.size)
            if len(head) < header.size:
                break  # EOF: the transport says the peer is gone
            kind, stream_id, length = header.unpack(head)
            receiver.receive(kind, stream_id, child.stdout.read(length), 0)
            received += length
            if received > 4 * MiB and child.poll() is None:
                assert len(os.listdir(tmp_path)) == 1  # spilled mid-stream
                child.send_signal(signal.SIGKILL)
        receiver.connection_lost("the sender vanished")
    finally:
        child.kill()
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    failures = [e for e in receiver.take_events() if isinstance(e, StreamFailed)]
    assert [f.failure for f in failures] == [StreamFailure.CONNECTION_LOST]
    assert os.listdir(tmp_path) == []


def test_bad_arguments_and_a_closed_machine_are_refused(tmp_path: Path) -> None:
    streams = Streams(chunk_payload=100, temp_dir=str(tmp_path))
    with pytest.raises(StreamingError, match="request_id"):
        streams.send(FrameKind.MESSAGE, 2**32, b"x")
    with pytest.raises(StreamingError, match="kind"):
        streams.send(256, 0, b"x")
    with pytest.raises(ValueError, match="chunk_payload"):
        Streams(chunk_payload=8)
    streams.close()
    with pytest.raises(StreamingError, match="closed"):
        streams.send(FrameKind.MESSAGE, 0, b"x")
    streams.receive(FrameKind.STREAM_START, 1, struct.pack(">BBIQ", 0, 1, 0, 10), 0)
    assert streams.take_events() == []


# -- file I/O on a worker thread ---------------------------------------------------------------------------

WAIT_S = 60.0
"""Every wait below gives up (and fails the test) after this long."""


class Doorbell:
    """The ``wake`` an adapter passes: an event to wait on, and the threads that rang it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.threads: set[int] = set()
        self.rings = 0

    def __call__(self) -> None:
        self.threads.add(threading.get_ident())
        self.rings += 1
        self.event.set()

    def wait(self, timeout: float) -> bool:
        rang = self.event.wait(timeout)
        self.event.clear()
        return rang


class Disk(InlineStreamFiles):
    """Real files whose spill writes and reads take ``delay`` seconds each (a slow disk), writes fail past
    ``fail_after`` bytes (a full one; 0: when the file is closed, as buffered data is flushed) and reads
    past ``fail_reads_after`` chunks; notes what it did, where."""

    def __init__(
        self,
        delay: float = 0.0,
        fail_after: int | None = None,
        fail_reads_after: int | None = None,
        gate: threading.Event | None = None,
    ) -> None:
        self.gate = gate
        """When given, each write first waits (at most WAIT_S) until it is set: a write that hangs."""
        self.writing = threading.Event()
        self.delay = delay
        self.fail_after = fail_after
        self.fail_reads_after = fail_reads_after
        self.written = 0
        self.closed_at_written: int | None = None
        self.threads: set[int] = set()

    def spill(self, directory: str | None, prefix: str, name: str = "") -> SpillFile:
        return DiskSpill(self, directory, prefix, name)

    def source(self, path: str | os.PathLike[str], *, chunk: int, headroom: int) -> FileSource:
        return DiskSource(self, path, chunk=chunk, headroom=headroom)


class DiskSpill(SpillFile):
    def __init__(self, disk: Disk, directory: str | None, prefix: str, name: str = "") -> None:
        super().__init__(directory, prefix, name)
        self.disk = disk

    def write(self, data: bytes | bytearray | memoryview) -> None:
        disk = self.disk
        disk.threads.add(threading.get_ident())
        n = memoryview(data).nbytes
        if disk.fail_after and disk.written + n > disk.fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        disk.writing.set()
        if disk.gate is not None:
            disk.gate.wait(WAIT_S)
        time.sleep(disk.delay)
        super().write(data)
        disk.written += n

    def finish(self) -> str:
        if self.disk.fail_after == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        path = super().finish()
        self.disk.closed_at_written = self.disk.written
        return path


class DiskSource(FileSource):
    def __init__(self, disk: Disk, path: str | os.PathLike[str], *, chunk: int, headroom: int) -> None:
        super().__init__(path, chunk=chunk, headroom=headroom)
        self.disk = disk
        self.reads = 0

    def take(self) -> bytearray:
        self.disk.threads.add(threading.get_ident())
        self.reads += 1
        if self.disk.fail_reads_after is not None and self.reads > self.disk.fail_reads_after:
            raise OSError(errno.EIO, "Input/output error")
        time.sleep(self.disk.delay)
        return super().take()


class ThreadedLink:
    """Two machines whose file I/O runs on worker threads, driven as an adapter drives them: frames cross
    while the receiver's write backlog is at most ``pause`` (above it the adapter stops polling its
    subscription), a due ``deadline_ns`` runs ``handle_timer``, and with nothing to do it waits for a wake."""

    def __init__(
        self,
        tmp: Path,
        *,
        chunk_payload: int = 64 * 1024,
        sender_disk: Disk | None = None,
        receiver_disk: Disk | None = None,
        read_ahead: int = 1024 * 1024,
        pause: float = WRITE_BACKLOG_PAUSE,
        **receiver: Any,
    ) -> None:
        self.tmp = tmp
        self.bell = Doorbell()
        self.sender_files = ThreadedStreamFiles(self.bell, files=sender_disk, read_ahead=read_ahead)
        self.receiver_files = ThreadedStreamFiles(self.bell, files=receiver_disk)
        self.sender = Streams(chunk_payload=chunk_payload, temp_dir=str(tmp), files=self.sender_files)
        self.receiver = Streams(chunk_payload=chunk_payload, temp_dir=str(tmp), files=self.receiver_files, **receiver)
        self.pause = pause
        self.sent_events: list[Any] = []
        self.received_events: list[Any] = []
        self.peak_backlog = 0
        self.receiving_s = 0.0
        """Time spent inside ``receiver.receive`` (what the event loop would spend)."""

    def step(self) -> bool:
        """One duty cycle of both sides; whether anything happened."""
        moved = False
        for machine in (self.sender, self.receiver):
            due = machine.deadline_ns
            if due is not None and due <= time.monotonic_ns():
                machine.handle_timer(time.monotonic_ns())
        if self.receiver.write_backlog <= self.pause:
            frames = self.sender.take_frames(self.sender.chunk_data)
            for kind, stream_id, payload in frames:
                began = time.perf_counter()
                self.receiver.receive(kind, stream_id, bytes(payload), time.monotonic_ns())
                self.receiving_s += time.perf_counter() - began
                self.peak_backlog = max(self.peak_backlog, self.receiver.write_backlog)
            moved = bool(frames)
        for kind, stream_id, payload in self.receiver.take_frames():
            self.sender.receive(kind, stream_id, bytes(payload), time.monotonic_ns())
            moved = True
        for events, machine in ((self.sent_events, self.sender), (self.received_events, self.receiver)):
            new = machine.take_events()
            events += new
            moved = moved or bool(new)
        return moved

    def run(self, until: Any) -> None:
        deadline = time.monotonic() + WAIT_S
        while not until():
            assert time.monotonic() < deadline, "the streams did not settle in time"
            if not self.step():
                self.bell.wait(0.05)

    def finals(self, events: list[Any]) -> list[Any]:
        return [e for e in events if isinstance(e, (StreamCompleted, StreamFailed))]

    def settled(self) -> bool:
        return bool(self.finals(self.received_events)) and not self.sender.sending

    def close(self) -> None:
        self.receiver.close()
        self.sender.close()
        self.receiver_files.close()
        self.sender_files.close()


def test_threaded_files_carry_a_20_mb_file_intact(tmp_path: Path) -> None:
    (tmp_path / "spill").mkdir()
    original = tmp_path / "big.bin"
    data = os.urandom(20 * MiB)
    original.write_bytes(data)
    link = ThreadedLink(tmp_path / "spill")
    try:
        stream_id = link.sender.send_file(original)
        link.run(link.settled)
        (done,) = link.finals(link.received_events)
        assert isinstance(done, StreamCompleted) and done.is_file and done.path is not None
        assert hashlib.sha256(Path(done.path).read_bytes()).digest() == hashlib.sha256(data).digest() == done.sha256
        (sent,) = [e for e in link.sent_events if isinstance(e, StreamSent)]
        assert sent.stream_id == stream_id and sent.sha256 == done.sha256
        assert not link.finals(link.sent_events[:-1]) and link.receiver.write_backlog == 0
        assert link.bell.threads and threading.get_ident() not in link.bell.threads  # woken from the worker
        assert link.receiver.release(done.stream_id)
    finally:
        link.close()
    assert os.listdir(tmp_path / "spill") == []  # the removal was queued on the worker, done by close
    assert not link.sender_files.running and not link.receiver_files.running


def test_a_slow_disk_lags_behind_receive_with_a_bounded_backlog_and_completes_after_its_writes(
    tmp_path: Path,
) -> None:
    chunk = 256 * 1024
    disk = Disk(delay=0.02)
    original = tmp_path / "twelve.bin"
    original.write_bytes(os.urandom(12 * MiB))
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    link = ThreadedLink(spill_dir, chunk_payload=chunk + 8, receiver_disk=disk)
    try:
        link.sender.send_file(original)
        link.run(lambda: not link.sender.sending)  # the last frame (END) was received
        assert link.receiver.write_backlog > 0 and disk.written < original.stat().st_size  # the writes lag
        assert not link.finals(link.received_events) and disk.closed_at_written is None
        # the loop's share: the writes slept 20 ms each, receive() only queued them
        assert link.receiving_s < 0.25 * disk.delay * (original.stat().st_size // chunk)
        assert WRITE_BACKLOG_PAUSE / 2 < link.peak_backlog <= WRITE_BACKLOG_PAUSE + chunk
        assert disk.threads and threading.get_ident() not in disk.threads
        # the completion waits for the file: the worker wakes us (every MiB written, and once the file is
        # closed), and deadline_ns is due only once there is something to take in
        link.bell.event.clear()
        rings = link.bell.rings
        while True:
            assert link.bell.wait(10.0), "the worker never woke us"
            due = link.receiver.deadline_ns
            if due is not None and due <= time.monotonic_ns():
                link.receiver.handle_timer(time.monotonic_ns())
                finals = link.finals(link.receiver.take_events())
                assert finals, "deadline_ns was due with nothing to take in"
                break
        (done,) = finals
        assert isinstance(done, StreamCompleted) and done.path is not None
        assert link.bell.rings - rings >= 3  # > 4 MiB were still to write: a paused adapter hears as they go
        assert disk.closed_at_written == disk.written == original.stat().st_size
        assert Path(done.path).read_bytes() == original.read_bytes()
        assert link.receiver.write_backlog == 0 and link.receiver.deadline_ns is None
    finally:
        link.close()
    assert os.listdir(spill_dir) == []


def test_a_backlog_past_max_write_backlog_fails_the_stream_once(tmp_path: Path) -> None:
    """An adapter that ignores the pause still holds no more than ``max_write_backlog``."""
    link = ThreadedLink(
        tmp_path, receiver_disk=Disk(delay=0.01), pause=float("inf"), max_write_backlog=MiB, spill_threshold=0
    )
    try:
        link.sender.send(FrameKind.MESSAGE, 0, os.urandom(4 * MiB))
        link.run(link.settled)
        for _ in range(20):
            link.step()
        (failed,) = link.finals(link.received_events)
        assert isinstance(failed, StreamFailed) and failed.failure == StreamFailure.SPILL_FAILED
        assert "behind" in failed.detail and link.peak_backlog <= MiB
        assert [e.failure for e in link.finals(link.sent_events)] == [StreamFailure.REFUSED]
    finally:
        link.close()
    assert os.listdir(tmp_path) == []


def test_a_file_being_sent_waits_for_its_reads_and_the_worker_says_when(tmp_path: Path) -> None:
    """take_frames hands out only chunks already read (a starved stream just waits, no error), and the
    first chunk read for a starved stream wakes the adapter, with deadline_ns due."""
    original = tmp_path / "slow.bin"
    original.write_bytes(os.urandom(20 * 1024))
    bell = Doorbell()
    files = ThreadedStreamFiles(bell, files=Disk(delay=0.03), read_ahead=8 * 1024)
    sender = Streams(chunk_payload=1024 + 8, files=files)
    try:
        sender.send_file(original)
        (start,) = sender.take_frames()
        assert start[0] == FrameKind.STREAM_START and sender.sending
        chunks: list[bytes] = []
        while sender.sending:
            ready = [p for k, _, p in sender.take_frames() if k == FrameKind.STREAM_CHUNK]
            chunks += [bytes(p[8:]) for p in ready]
            assert len(ready) < 8, "woken only once the whole read-ahead was read"
            if sender.sending and not ready:
                assert bell.wait(10.0), "the worker never woke us"
                if (due := sender.deadline_ns) is not None and due <= time.monotonic_ns():
                    sender.handle_timer(time.monotonic_ns())
        assert b"".join(chunks) == original.read_bytes() and sender.deadline_ns is None
        assert [type(e) for e in sender.take_events() if not isinstance(e, StreamProgressed)] == [
                StreamStarted,
                StreamSent,
            ]
    finally:
        sender.close()
        files.close()


@pytest.mark.parametrize("where", ["write", "close", "create"])
def test_a_failing_disk_gives_one_spill_failure(tmp_path: Path, where: str) -> None:
    """Whenever the worker meets it (the sender is told, even after its last chunk left)."""
    spill_dir = tmp_path / ("missing" if where == "create" else "spill")
    if where != "create":
        spill_dir.mkdir()
    disk = Disk(fail_after=0 if where == "close" else MiB)
    link = ThreadedLink(spill_dir, receiver_disk=disk, spill_threshold=0)
    try:
        link.sender.send(FrameKind.MESSAGE, 0, os.urandom(3 * MiB))
        link.run(link.settled)
        for _ in range(20):  # nothing more is reported
            link.step()
        (failed,) = link.finals(link.received_events)
        assert isinstance(failed, StreamFailed) and failed.failure == StreamFailure.SPILL_FAILED
        assert ("No such file" if where == "create" else "No space left") in failed.detail
        assert [e.failure for e in link.finals(link.sent_events)] == [StreamFailure.REFUSED]
        assert link.receiver.write_backlog == 0 and link.receiver.deadline_ns is None
    finally:
        link.close()
    assert where == "create" or os.listdir(spill_dir) == []


@pytest.mark.parametrize("how", ["vanished", "unreadable"])
def test_a_source_file_lost_mid_send_gives_one_sender_failure(tmp_path: Path, how: str) -> None:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    original = tmp_path / "going.bin"
    original.write_bytes(os.urandom(8 * MiB))
    disk = Disk(fail_reads_after=40 if how == "unreadable" else None)
    link = ThreadedLink(spill_dir, sender_disk=disk, read_ahead=256 * 1024)
    try:
        stream_id = link.sender.send_file(original)
        if how == "vanished":
            link.run(lambda: (link.receiver.progress(stream_id, incoming=True) or (0, 0))[0] >= MiB)
            os.truncate(original, 0)
            original.unlink()
        link.run(link.settled)
        for _ in range(20):
            link.step()
        (failed,) = link.finals(link.sent_events)
        assert isinstance(failed, StreamFailed) and failed.failure == StreamFailure.SENDER_ABORTED
        assert ("shrank" if how == "vanished" else "Input/output error") in failed.detail
        (told,) = link.finals(link.received_events)
        assert isinstance(told, StreamFailed) and told.failure == StreamFailure.SENDER_ABORTED
        assert not link.sender.sending
    finally:
        link.close()
    assert os.listdir(spill_dir) == []  # the receiver's removal ran on its worker


@pytest.mark.parametrize("machines_first", [True, False])
@pytest.mark.parametrize("when", ["arriving", "finishing"])
def test_closing_mid_transfer_leaves_no_temporary_file_and_no_thread(
    tmp_path: Path, when: str, machines_first: bool
) -> None:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    original = tmp_path / "long.bin"
    original.write_bytes(os.urandom(6 * MiB))
    disk = Disk(delay=0.005)
    link = ThreadedLink(spill_dir, receiver_disk=disk)
    stream_id = link.sender.send_file(original)
    if when == "arriving":
        link.run(lambda: link.receiver.write_backlog > MiB and disk.written > 0)
    else:  # all arrived and checked, the file still being written
        link.run(lambda: not link.sender.sending)
        assert disk.closed_at_written is None and not link.finals(link.received_events)
    assert len(os.listdir(spill_dir)) == 1
    if machines_first:
        link.close()
    else:  # the endpoint's provider goes first: it removes what it was writing; the machines then fail
        link.receiver_files.close()
        link.sender_files.close()
        link.receiver.close()
        link.sender.close()
    assert os.listdir(spill_dir) == []
    assert not link.receiver_files.running and not link.sender_files.running
    lost = [e for e in link.receiver.take_events() if isinstance(e, StreamFailed)]
    assert [(e.stream_id, e.failure) for e in lost] == [(stream_id, StreamFailure.CONNECTION_LOST)]
    assert link.receiver.write_backlog == 0 and not link.sender.sending
    with pytest.raises(StreamingError, match="closed"):
        link.sender.send_file(original)


def test_closing_while_a_write_hangs_removes_the_file_under_it(tmp_path: Path) -> None:
    gate = threading.Event()
    disk = Disk(gate=gate)
    link = ThreadedLink(tmp_path, receiver_disk=disk, spill_threshold=0)
    try:
        link.sender.send(FrameKind.MESSAGE, 0, os.urandom(MiB))
        link.run(lambda: not link.sender.sending)
        assert disk.writing.wait(WAIT_S) and len(os.listdir(tmp_path)) == 1
        link.receiver_files.close(timeout=0.2)
        assert link.receiver_files.running  # stuck in the write
        assert os.listdir(tmp_path) == []  # unlinked under it: the write goes on to a nameless file
        gate.set()
        link.receiver_files.close(timeout=WAIT_S)
        assert not link.receiver_files.running and os.listdir(tmp_path) == []
        link.receiver.handle_timer(time.monotonic_ns())
        (failed,) = link.finals(link.receiver.take_events())
        assert isinstance(failed, StreamFailed) and failed.failure == StreamFailure.SPILL_FAILED
        assert "closed" in failed.detail
    finally:
        gate.set()
        link.close()


def test_a_slow_disk_under_one_connection_never_stalls_another(
    driver_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real server and clients on one event loop: one client streams a 4 MiB file onto a disk
    that takes 20 ms per write (about 1.3 s for its 64 chunks) while another pings the server. Writes run
    on the loop's file worker, so the loop is never held for long and the pings keep coming back; were
    they on the event loop, one poll of 64 chunks would hold every connection for that long."""
    from slipstream.network import Client, Server, streamfiles
    from slipstream.testing import run_async
    from tests.test_network_aio import client_config, server_config

    disk = Disk(delay=0.02)
    monkeypatch.setattr(streamfiles, "ThreadedStreamFiles", lambda wake: ThreadedStreamFiles(wake, files=disk))
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(4 * MiB))
    spill = tmp_path / "spill"
    spill.mkdir()

    async def main() -> tuple[float, bytes, int]:
        loop = asyncio.get_running_loop()
        received: list[bytes] = []
        held = 0.0

        async def ticker() -> None:  # how long the loop is held: the lateness of a 5 ms sleep
            nonlocal held
            while True:
                before = loop.time()
                await asyncio.sleep(0.005)
                held = max(held, loop.time() - before - 0.005)

        config = server_config(driver_dir, enable_ipc=True, temp_directory=spill)
        async with Server(config) as server, Client(client_config(driver_dir, enable_ipc=True)) as sender:
            server.on_message(Path)(lambda connection, path: received.append(path.read_bytes()))
            await server.bind_ipc()
            async with Client(client_config(driver_dir, enable_ipc=True)) as pinger:
                streaming = await sender.connect_ipc(timeout=10)
                pinging = await pinger.connect_ipc(timeout=10)
                await pinging.ping(5)
                ticking = asyncio.ensure_future(ticker())
                transfer = asyncio.ensure_future(streaming.send(source))
                pings = 0
                deadline = loop.time() + 30
                while not received and loop.time() < deadline:
                    await pinging.ping(5)
                    pings += 1
                    await asyncio.sleep(0.01)
                await transfer
                ticking.cancel()
        return held, received[0] if received else b"", pings

    held, data, pings = run_async(main(), 60)
    print(f"loop held at most {held * 1e3:.1f} ms; {pings} pings during the transfer")
    assert data == source.read_bytes(), "the file arrived whole"
    assert disk.threads and threading.get_ident() not in disk.threads, "every write ran off the event loop"
    assert held < 0.25, f"the event loop was held {held:.3f} s behind the slow disk"
    assert pings >= 20, f"only {pings} pings came back while the file was written"
