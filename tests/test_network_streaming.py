"""Streams of large payloads and files between two sans-I/O stream machines in memory."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import struct
import subprocess
import sys
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
from slipstream.network.streaming import (
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
