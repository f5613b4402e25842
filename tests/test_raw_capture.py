"""The stream capture's two halves: raw files on the hot side, conversion off it.

Conversion is checked against a plain subscriber with a fragment assembler on the same real stream
(mixed sizes, fragmented messages, padding at term ends, two sessions), the vectorized path against
the frame walk, torn raw tails, and recovery: SIGKILL of ``slipstream record`` (both processes, or
the capture alone), raw leftovers converted by the next recorder, rows made durable before a kill not
duplicated, and a message fragmented across two raw files reassembled after a kill.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slipstream import ADMIN_ACTION, BACK_PRESSURED, Context, DriverConfig
from slipstream.client import FragmentAssembler
from slipstream.telemetry import (
    Recorder,
    RecorderConfig,
    Recording,
    StreamCapture,
    msgspec_decoder,
    rawcapture,
    recover,
)
from slipstream.telemetry.convert import RawConverter, _Run
from slipstream.telemetry.rawcapture import (
    _BLOCK,
    _BLOCK_MAGIC,
    RAW_DIR,
    RawContent,
    _data_path,
    _prelude,
    raw_files,
    read_raw,
)
from slipstream.telemetry.segments import journal_dir, try_lock

ROOT = Path(__file__).resolve().parent.parent


def _frame(payload: bytes, flags: int, session_id: int, stream_id: int, term_offset: int, frame_type: int = 1) -> bytes:
    header = struct.pack(
        "<iBBHiiiiq", 32 + len(payload), 0, flags, frame_type, term_offset, session_id, stream_id, 0, 0
    )
    data = header + payload
    return data + bytes(-len(data) % 32)


def _write_raw(path: Path, blocks: list[tuple[int, int, bytes]], decoder: str | None = None) -> None:
    """One rotation as RawCapture writes it (index and data files): blocks of (session_id, position, frames)."""
    seq = int(path.name[:12])
    bases: dict[int, int] = {}
    with open(path, "wb") as index:
        index.write(_prelude("aeron:ipc", 9, decoder))
        for session_id, position, data in blocks:
            base = bases.setdefault(session_id, position & -512)
            with open(_data_path(path.parent, seq, session_id), "ab") as f:
                f.truncate(max(f.tell(), position - base))
            with open(_data_path(path.parent, seq, session_id), "r+b") as f:
                f.seek(position - base)
                f.write(data)
            index.write(_BLOCK.pack(_BLOCK_MAGIC, len(data), session_id, 0, position, 1000 + position, position - base))


class _ListSink:
    def __init__(self) -> None:
        self.tables: list[Any] = []

    def extend_table(self, schema: object, table: Any, *, bounded: bool = True) -> bool:
        self.tables.append(table)
        return True

    def extend(self, schema: object, rows: list[tuple[object, ...]]) -> bool:
        return True


@pytest.mark.parametrize(
    ("direct_io", "refused"),
    [(False, False), (True, False), (True, True)],
    ids=["page_cache", "o_direct", "o_direct_refused"],
)
def test_capture_matches_a_plain_subscriber_on_mixed_sizes_fragments_and_term_padding(
    driver_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_io: bool, refused: bool
) -> None:
    direct_writes: list[int] = []
    write_direct = rawcapture._Mirror.write_direct

    def counted(self: rawcapture._Mirror, sectors: memoryview, offset: int) -> None:
        direct_writes.append(len(sectors))
        if refused:  # as on a file system that takes O_DIRECT at open and refuses the writes: pwrite instead
            raise OSError(errno.EINVAL, "refused")
        write_direct(self, sectors, offset)

    monkeypatch.setattr(rawcapture._Mirror, "write_direct", counted)
    rng = random.Random(5)
    sizes = [0, 1, 31, 32, 33] + [rng.choice([8, 8, 8, 100, 1000, 1376, 1377, 3000, 8000]) for _ in range(1500)]
    config = DriverConfig(directory=driver_dir, ipc_term_length=64 << 10)
    recorder = Recorder(tmp_path, writer_id="w", config=RecorderConfig(flush_interval_s=0.05))
    expected: list[tuple[int, int, bytes]] = []
    with Context(driver_dir, driver="embedded", driver_config=config) as context:
        capture = StreamCapture(context, "aeron:ipc", 9, recorder, direct_io=direct_io)
        plain = context.add_subscription("aeron:ipc", 9)
        assembler = FragmentAssembler(lambda b, h: expected.append((h.session_id, h.position, bytes(b))))
        publications = [context.add_exclusive_publication("aeron:ipc", 9) for _ in range(2)]
        deadline = time.monotonic() + 60
        while not all(p.is_connected for p in publications):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for i, size in enumerate(sizes):
            message = bytes([i % 251]) * size
            for publication in publications:
                while (result := publication.offer(message)) < 0:
                    assert result in (BACK_PRESSURED, ADMIN_ACTION) and time.monotonic() < deadline, result
                    capture.poll()
                    plain.poll(assembler, 100)
        while len(expected) < 2 * len(sizes):
            assert time.monotonic() < deadline
            capture.poll()
            plain.poll(assembler, 100)
        while capture.poll():
            pass
        capture.close()
    recorder.close()
    rows = Recording(tmp_path).read("captured").to_pylist()
    got = sorted((r["session_id"], r["position"], r["payload"]) for r in rows)
    assert got == sorted(expected)
    assert all(r["size"] == len(r["payload"]) and r["channel"] == "aeron:ipc" for r in rows)
    assert not raw_files(capture.raw.raw_dir), "raw files are deleted once their rows are durable"
    assert bool(direct_writes) == direct_io  # O_DIRECT only when asked for (and tried again per file when refused)


def test_a_uniform_run_converted_with_numpy_equals_the_frame_walk() -> None:
    frames = b"".join(_frame(bytes([i % 256]) * 24, 0xC0, 7, 9, 64 * i) for i in range(500))
    content = RawContent("aeron:ipc", 9, None, [])
    run = _Run(7, 4096, frames, [0, 64 * 200], [111, 222])
    converter = RawConverter(Path("/nonexistent"), _ListSink())
    vectorized = converter._block_table(run, content)
    walked = converter._walk(run, content)
    assert vectorized.to_pylist() == walked.to_pylist()
    assert vectorized.num_rows == 500 and vectorized.column("timestamp_ns").to_pylist()[199:201] == [111, 222]


def test_a_torn_raw_tail_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "000000000000.raw"
    one = _frame(b"a" * 10, 0xC0, 1, 9, 0)
    _write_raw(path, [(1, 0, one), (1, 64, _frame(b"b" * 10, 0xC0, 1, 9, 64))])
    whole = path.read_bytes()
    for cut in range(len(whole) - 1, len(whole) - _BLOCK.size, -1):
        path.write_bytes(whole[:cut])
        content = read_raw(path)
        assert content is not None and [bytes(b.data) for b in content.blocks] == [one]
    path.write_bytes(whole)
    data = _data_path(tmp_path, 0, 1)
    data.write_bytes(data.read_bytes()[:100])  # the second block's data never reached the disk
    content = read_raw(path)
    assert content is not None and [bytes(b.data) for b in content.blocks] == [one]
    path.write_bytes(whole[:10])
    assert read_raw(path) is None


def test_recovery_reassembles_a_message_split_across_raw_files_and_skips_rows_already_durable(tmp_path: Path) -> None:
    raw_dir = journal_dir(tmp_path, "w") / RAW_DIR / "capture-0"
    raw_dir.mkdir(parents=True)
    a = _frame(b"A" * 10, 0xC0, 5, 9, 0)
    b1 = _frame(b"B" * 100, 0x80, 5, 9, 64)
    b2 = _frame(b"b" * 50, 0x40, 5, 9, 64 + 160)
    c = _frame(b"C" * 3, 0xC0, 5, 9, 64 + 160 + 96)
    _write_raw(raw_dir / "000000000000.raw", [(5, 0, a + b1)])
    _write_raw(raw_dir / "000000000001.raw.open", [(5, 224, b2 + c)])  # the capture died writing it
    capture_lock = try_lock(raw_dir)  # a live capture holds its directory: recovery leaves it alone
    assert capture_lock is not None
    recorder = Recorder(tmp_path, writer_id="w", config=RecorderConfig(flush_interval_s=3600))
    converter = RawConverter(raw_dir, recorder)
    converter.flush_hook()
    recorder.flush()
    converter.durable()
    assert (raw_dir / "000000000000.raw").exists(), "kept: the message it begins is not complete"
    recorder.close()  # killed here, as far as the raw files know: A is durable, B's start only in the raw file
    os.close(capture_lock)
    assert recover(tmp_path) == 1
    rows = Recording(tmp_path).read("captured").to_pylist()
    assert [r["payload"] for r in rows] == [b"A" * 10, b"B" * 100 + b"b" * 50, b"C" * 3]
    assert [r["position"] for r in rows] == [64, 224 + 96, 224 + 96 + 64]
    assert not raw_files(raw_dir)


def _record(driver_dir: Path, out: Path, stream: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "record", "--dir", str(driver_dir), "--channel", "aeron:ipc",
         "--stream", str(stream), "--output", str(out), "--flush-interval", "0.2", "--segment-age", "0.4"],
        stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(f"recording aeron:ipc stream {stream}")
    return proc


def _publish_until(context: Context, stream: int, seconds: float, kill: Any) -> list[tuple[float, int]]:
    """Offer sequence-numbered messages for ``seconds``, then call ``kill``; (time, sent) along the way."""
    publication = context.add_publication("aeron:ipc", stream)
    deadline = time.monotonic() + 20
    while not publication.is_connected:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sent = 0
    progress: list[tuple[float, int]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            if publication.offer(sent.to_bytes(8, "little") * 4) > 0:
                sent += 1
        progress.append((time.monotonic(), sent))
        time.sleep(0.001)
    kill()
    progress.append((time.monotonic(), sent))
    return progress


def _wait_unlocked(out: Path) -> None:
    writer_dir = next(p for p in (out / "_journals").iterdir() if p.is_dir())
    deadline = time.monotonic() + 60
    while (lock := try_lock(writer_dir)) is None:
        assert time.monotonic() < deadline, f"{writer_dir} stays locked"
        time.sleep(0.05)
    os.close(lock)


def _sequences(out: Path) -> list[int]:
    rows = Recording(out).read("captured").to_pylist()
    rows.sort(key=lambda r: r["position"])
    return [int.from_bytes(r["payload"][:8], "little") for r in rows]


def _hashes(out: Path) -> dict[str, str]:
    paths = {segment.path for segment in Recording(out).segments("captured")}
    return {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in paths}


def test_sigkill_of_record_mid_stream_loses_at_most_a_flush_interval(
    driver_dir: Path, tmp_path: Path, driver: object
) -> None:
    out = tmp_path / "rec"
    proc = _record(driver_dir, out, 81)
    finalized: dict[str, str] = {}

    def kill() -> None:
        finalized.update(_hashes(out))
        os.killpg(proc.pid, signal.SIGKILL)  # the capture and its converter

    try:
        with Context(driver_dir, driver="external") as context:
            progress = _publish_until(context, 81, 1.5, kill)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    kill_time = progress[-1][0]
    sent_a_flush_before = max(sent for t, sent in progress if t <= kill_time - 0.2)
    _wait_unlocked(out)  # both processes are gone, not only the one we waited for
    assert any(raw_files(d) for d in out.glob(f"_journals/*/{RAW_DIR}/*")), "the kill left raw files"
    assert recover(out) >= 1
    sequences = _sequences(out)
    assert sequences == list(range(len(sequences))), "no gaps, no duplicates"
    assert len(sequences) >= sent_a_flush_before
    assert {path: h for path, h in _hashes(out).items() if path in finalized} == finalized, "finalized intact"
    assert not any(raw_files(d) for d in out.glob(f"_journals/*/{RAW_DIR}/*"))


def test_sigkill_of_the_capture_alone_leaves_the_converter_to_finish(
    driver_dir: Path, tmp_path: Path, driver: object
) -> None:
    out = tmp_path / "rec"
    proc = _record(driver_dir, out, 82)
    try:
        with Context(driver_dir, driver="external") as context:
            progress = _publish_until(context, 82, 1.0, proc.kill)
    finally:
        proc.kill()
        proc.wait(10)
    _wait_unlocked(out)  # the converter holds the writer's lock until it is done
    sequences = _sequences(out)
    assert sequences == list(range(len(sequences)))
    assert len(sequences) >= max(sent for t, sent in progress if t <= progress[-1][0] - 0.2)
    assert not any(raw_files(d) for d in out.glob(f"_journals/*/{RAW_DIR}/*"))


class Ping(msgspec.Struct, tag=True):
    n: int


PING_DECODER = msgspec_decoder(Ping)


def test_recovery_types_leftover_rows_with_the_captures_decoder(tmp_path: Path) -> None:
    raw_dir = journal_dir(tmp_path, "w") / RAW_DIR / "capture-0"
    raw_dir.mkdir(parents=True)
    data = _frame(msgspec.msgpack.encode(Ping(3)), 0xC0, 1, 9, 0)
    _write_raw(raw_dir / "000000000000.raw.open", [(1, 0, data)], decoder=f"{__name__}:PING_DECODER")
    assert recover(tmp_path) == 2
    recording = Recording(tmp_path)
    assert recording.read("captured").column("message_type").to_pylist() == ["Ping"]
    assert recording.read("typed.Ping").column("n").to_pylist() == [3]


def test_a_raw_file_is_kept_only_while_a_message_begun_in_it_is_incomplete(tmp_path: Path) -> None:
    raw_dir = journal_dir(tmp_path, "w") / RAW_DIR / "capture-0"
    raw_dir.mkdir(parents=True)
    capture_lock = try_lock(raw_dir)
    begin, end = _frame(b"B" * 100, 0x80, 5, 9, 0), _frame(b"b" * 50, 0x40, 5, 9, 160)
    _write_raw(raw_dir / "000000000000.raw", [(5, 0, _frame(b"A", 0xC0, 5, 9, 0))])
    _write_raw(raw_dir / "000000000001.raw", [(5, 64, begin)])
    with Recorder(tmp_path, writer_id="w", config=RecorderConfig(flush_interval_s=3600)) as recorder:
        converter = RawConverter(raw_dir, recorder)
        for step, expected in ((None, [1]), ((5, 224, end), [])):
            if step is not None:
                _write_raw(raw_dir / "000000000002.raw", [step])
            converter.flush_hook()
            recorder.flush()
            converter.durable()
            assert [raw.seq for raw in raw_files(raw_dir)] == expected
    assert capture_lock is not None
    os.close(capture_lock)
