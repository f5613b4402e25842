"""slipstream.telemetry: schemas, the recorder (atomic segments, SIGKILL, bounded memory), the reader,
stream capture of a real driver's streams, the driver sampler and ``slipstream record``."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from slipstream import BACK_PRESSURED, Context, DriverConfig
from slipstream.telemetry import (
    BUILTIN_SCHEMAS,
    ConnectionStats,
    DriverSampler,
    KindSchema,
    Recorder,
    RecorderClosedError,
    RecorderConfig,
    RecordError,
    Recording,
    RecordingLockedError,
    SchemaVersionError,
    StreamCapture,
    StreamStats,
    connected,
    disconnected,
    handshake_accepted,
    handshake_rejected,
    msgspec_decoder,
    recover,
)
from slipstream.telemetry.segments import arrow_schema, journal_dir, journals, write_segment

ROOT = Path(__file__).resolve().parent.parent


class Chat(msgspec.Struct, tag=True):
    sender: str
    text: str
    sequence: int


class Trade(msgspec.Struct, tag=True):
    symbol: str
    price: float
    quantity: int
    buy: bool


def test_import_slipstream_and_telemetry_do_not_import_spark_or_arrow() -> None:
    code = (
        "import slipstream, slipstream.telemetry, slipstream.pipeline, slipstream.cli, sys; "
        "bad = [m for m in ('pyspark', 'pyarrow', 'matplotlib') if m in sys.modules]; "
        "assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr


def test_schemas_are_typed_and_versioned() -> None:
    events = BUILTIN_SCHEMAS["connection_events"]
    assert events.version == 2  # 2 added local (the recording host)
    assert ("reason", "string", True) in events.columns and ("timestamp_ns", "int64", False) in events.columns
    assert set(BUILTIN_SCHEMAS) == {
        "connection_events",
        "connection_stats",
        "stream_stats",
        "driver_counters",
        "loss_report",
        "error_log",
        "captured",
    }
    with pytest.raises(RecordError, match="event"):
        handshake_rejected(1, address="a", reason="r").__class__(1, "exploded", "server", "a", "", "udp")  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="kind"):
        KindSchema("Bad Kind", 1, ())


def test_records_round_trip_through_segments(tmp_path: Path) -> None:
    sent = [
        handshake_accepted(1, connection_id=7, address="10.0.0.1:4000", tag="alice"),
        connected(2, connection_id=7, address="10.0.0.1:4000", tag="alice"),
        handshake_rejected(3, address="10.0.0.9:5000", reason="ip_filter"),
        disconnected(4, connection_id=7, address="10.0.0.1:4000", cause="timeout", tag="alice"),
    ]
    stats = ConnectionStats(5, 7, "10.0.0.1:4000", "alice", 10, 11, 320, 352, rtt_ns=42_000, naks_sent=1)
    with Recorder(tmp_path, writer_id="w1") as recorder:
        for event in sent:
            assert recorder.record(event)
        recorder.record(stats)
    with pytest.raises(RecorderClosedError):
        recorder.record(stats)
    recording = Recording(tmp_path)
    assert recording.writers() == ["w1"]
    assert recording.kinds() == ["connection_events", "connection_stats"]
    assert list(recording.records("connection_events")) == sent
    assert list(recording.records("connection_stats")) == [stats]
    assert recording.read("captured").num_rows == 0  # a kind nothing recorded reads as empty, with its schema
    assert "payload" in recording.read("captured").column_names


def test_segments_roll_by_size_and_time_and_only_finalized_ones_are_listed(tmp_path: Path) -> None:
    config = RecorderConfig(flush_interval_s=0.05, segment_max_bytes=2_000, segment_max_age_s=30)
    with Recorder(tmp_path, writer_id="w", config=config) as recorder:
        for i in range(400):
            recorder.record(StreamStats(i, "aeron:ipc", 1, 2, "pub", i * 32, i, i * 32))
            if i % 50 == 49:
                recorder.flush()
        recorder.flush()
        by_size = Recording(tmp_path).segments("stream_stats")
        assert len(by_size) >= 3  # 8 flushes of ~50 rows, 2 kB per segment
        assert sum(s.rows for s in by_size) < 400 or not journals(journal_dir(tmp_path, "w") / "stream_stats")
    rows = Recording(tmp_path).read("stream_stats")
    assert rows.column("position").to_pylist() == [i * 32 for i in range(400)]

    aged = RecorderConfig(flush_interval_s=0.05, segment_max_age_s=0.2)
    with Recorder(tmp_path / "aged", writer_id="w", config=aged) as recorder:
        recorder.record(StreamStats(1, "aeron:ipc", 1, 2, "pub", 0, 0, 0))
        deadline = time.monotonic() + 10
        while not Recording(tmp_path / "aged").segments("stream_stats"):
            assert time.monotonic() < deadline, "a segment older than segment_max_age_s was not finalized"
            time.sleep(0.05)
        # Readers see the open journal's flushed rows only when they ask for them.
        recorder.record(StreamStats(2, "aeron:ipc", 1, 2, "pub", 32, 1, 32))
        recorder.flush()
        recording = Recording(tmp_path / "aged")
        assert recording.read("stream_stats").num_rows == 1
        assert recording.read("stream_stats", include_open=True).num_rows == 2


def test_bounded_memory_drops_and_counts(tmp_path: Path) -> None:
    config = RecorderConfig(flush_interval_s=3600, max_pending_rows=100)
    with Recorder(tmp_path, writer_id="w", config=config) as recorder:
        accepted = sum(recorder.record(StreamStats(i, "c", 1, 1, "pub", i, i, i)) for i in range(150))
        assert accepted == 100 and recorder.dropped_rows == 50 and recorder.pending_rows == 100
    assert Recording(tmp_path).read("stream_stats").num_rows == 100


def test_one_live_recorder_per_writer_directory(tmp_path: Path) -> None:
    with Recorder(tmp_path, writer_id="w"), pytest.raises(RecordingLockedError):
        Recorder(tmp_path, writer_id="w")


def test_newer_schema_versions_are_refused_and_older_ones_upgraded(tmp_path: Path) -> None:
    newer = KindSchema("stream_stats", 99, BUILTIN_SCHEMAS["stream_stats"].columns)
    kind_dir = tmp_path / "w" / "stream_stats"
    kind_dir.mkdir(parents=True)
    table = pa.Table.from_pylist([], schema=arrow_schema(newer))
    write_segment(table, kind_dir, 0)
    with pytest.raises(SchemaVersionError, match="version 99"):
        Recording(tmp_path).read("stream_stats")
    # Version 1 of a kind with a column fewer: the missing column reads as null.
    old_columns = tuple(c for c in BUILTIN_SCHEMAS["connection_stats"].columns if c[0] != "rtt_ns")
    old = KindSchema("connection_stats", 1, old_columns)
    old_dir = tmp_path / "w" / "connection_stats"
    old_dir.mkdir(parents=True)
    row = {name: (1 if kind == "int64" else "x") for name, kind, _ in old_columns}
    write_segment(pa.Table.from_pylist([row], schema=arrow_schema(old)), old_dir, 0)
    (stats,) = Recording(tmp_path).records("connection_stats")
    assert isinstance(stats, ConnectionStats) and stats.rtt_ns is None and stats.messages_sent == 1


VICTIM = textwrap.dedent(
    """
    import sys, time
    from slipstream.telemetry import Recorder, RecorderConfig, StreamStats
    config = RecorderConfig(flush_interval_s=float(sys.argv[2]), segment_max_age_s=0.5)
    recorder = Recorder(sys.argv[1], writer_id="victim", config=config)
    print("ready", flush=True)
    i = 0
    while True:
        recorder.record(StreamStats(time.time_ns(), "aeron:ipc", 1, 1, "pub", i, i, i))
        i += 1
        time.sleep(0.0005)
    """
)


def _digests(root: Path) -> dict[str, str]:
    paths = {s.path for s in Recording(root).segments("stream_stats")}
    return {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in paths}


def test_sigkill_loses_at_most_one_flush_interval_and_no_finalized_segment(tmp_path: Path) -> None:
    flush_s = 0.25
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(tmp_path), str(flush_s)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(2.0)
        before = _digests(tmp_path)
        killed_ns = time.time_ns()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(before) >= 2, "segments should have rolled (0.5 s) before the kill"
    after = _digests(tmp_path)
    assert {p: d for p, d in after.items() if p in before} == before, "a finalized segment changed"
    # The open journal's flushed rows are readable before recovery, and recovery makes them a segment.
    live = Recording(tmp_path).read("stream_stats", include_open=True).num_rows
    assert recover(tmp_path) in (0, 1)  # 0 when the kill came before the open segment's first fsync
    assert not journals(journal_dir(tmp_path, "victim") / "stream_stats")
    table = Recording(tmp_path).read("stream_stats")
    assert table.num_rows == live
    positions = table.column("position").to_pylist()
    assert positions == list(range(len(positions))), "rows lost or duplicated in the middle"
    last_ns = max(table.column("timestamp_ns").to_pylist())
    slack_s = 0.75  # the writer thread's scheduling and fsync on a loaded 2-core machine
    assert killed_ns - last_ns <= (flush_s + slack_s) * 1e9, f"lost {(killed_ns - last_ns) / 1e9:.2f} s of rows"


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_capture_of_real_ipc_and_udp_streams_with_typed_messages(driver_dir: Path, tmp_path: Path) -> None:
    udp = f"aeron:udp?endpoint=127.0.0.1:{_udp_port()}"
    encoder = msgspec.msgpack.Encoder()
    messages: list[bytes] = []
    for i in range(600):
        if i % 3 == 0:
            messages.append(encoder.encode(Chat("alice", f"hello {i}", i)))
        elif i % 3 == 1:
            messages.append(encoder.encode(Trade("XYZ", 1.5 * i, i, i % 2 == 0)))
        else:
            messages.append(bytes([i % 256]) * (40 + i))
    messages.append(os.urandom(5000))  # fragmented on both media, reassembled by the capture
    config = DriverConfig(directory=driver_dir, ipc_term_length=1 << 20)
    recorder = Recorder(tmp_path, writer_id="capture", config=RecorderConfig(flush_interval_s=0.1))
    with Context(driver_dir, driver="embedded", driver_config=config) as context:
        decoder = msgspec_decoder(Chat, Trade)
        captures = [
            StreamCapture(context, "aeron:ipc", 10, recorder, decoder=decoder),
            StreamCapture(context, udp, 11, recorder, decoder=decoder),
        ]
        sampler = DriverSampler(recorder, driver_dir)
        publications = [context.add_publication("aeron:ipc", 10), context.add_publication(udp, 11)]
        deadline = time.monotonic() + 30
        while not all(p.is_connected for p in publications):
            assert time.monotonic() < deadline, "publications did not connect"
            time.sleep(0.01)
        for publication in publications:
            for message in messages:
                while (result := publication.offer(message)) < 0:
                    assert result == BACK_PRESSURED and time.monotonic() < deadline, result
                    for capture in captures:
                        capture.poll()
        while any(c.messages < len(messages) for c in captures):
            assert time.monotonic() < deadline, [c.messages for c in captures]
            for capture in captures:
                capture.poll()
                capture.convert()
        sampler.stop()
    recorder.close()
    recording = Recording(tmp_path)
    captured = recording.read("captured")
    assert captured.num_rows == 2 * len(messages)
    for channel, stream_id in (("aeron:ipc", 10), (udp, 11)):
        rows = [r for r in captured.to_pylist() if r["stream_id"] == stream_id]
        assert [r["payload"] for r in rows] == messages
        assert all(r["channel"] == channel and r["size"] == len(r["payload"]) for r in rows)
        positions = [r["position"] for r in rows]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
    types = captured.column("message_type").to_pylist()
    assert types.count("Chat") == 2 * 200 and types.count("Trade") == 2 * 200 and types.count(None) == 2 * 201
    chats = recording.read("typed.Chat")
    assert chats.schema.field("sequence").type == pa.int64() and chats.schema.field("text").type == pa.string()
    assert sorted(chats.column("sequence").to_pylist()) == sorted(2 * list(range(0, 600, 3)))
    trades = recording.read("typed.Trade")
    assert trades.schema.field("buy").type == pa.bool_() and trades.num_rows == 400
    counters = recording.read("driver_counters").to_pylist()
    assert any(r["type_name"] == "sub-pos" and r["stream_id"] == 10 for r in counters)
    assert any(r["label"].startswith("Bytes sent") or r["type_name"] == "system" for r in counters)


def test_record_command_captures_a_stream_until_sigterm(driver_dir: Path, tmp_path: Path, driver: object) -> None:
    out = tmp_path / "rec"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "record", "--dir", str(driver_dir), "--channel", "aeron:ipc",
         "--stream", "77", "--output", str(out), "--counters", "--flush-interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("recording aeron:ipc stream 77")
        with Context(driver_dir, driver="external") as context:
            publication = context.add_publication("aeron:ipc", 77)
            deadline = time.monotonic() + 20
            while not publication.is_connected:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            for i in range(1000):
                while publication.offer(i.to_bytes(4, "little") * 8) < 0:
                    assert time.monotonic() < deadline
                    time.sleep(0.0001)
            while Recording(out).read("captured", include_open=True).num_rows < 1000:
                assert time.monotonic() < deadline, "the recorder did not flush what it captured"
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "recorded 1000 messages (32000 bytes)" in stdout
    captured = Recording(out).read("captured")
    assert [int.from_bytes(p[:4], "little") for p in captured.column("payload").to_pylist()] == list(range(1000))
    assert Recording(out).read("driver_counters").num_rows > 0


def test_recording_config_opens_a_recorder_only_when_enabled(tmp_path: Path) -> None:
    from slipstream.telemetry import RecordingConfig

    assert RecordingConfig().open("server") is None
    recorder = RecordingConfig(directory=tmp_path).open("server")
    assert recorder is not None
    with recorder:
        recorder.record(handshake_rejected(1, address="192.0.2.1:9", reason="ip_filter"))
    assert recorder.writer_id.startswith("server-")
    assert Recording(tmp_path).read("connection_events").num_rows == 1
    with pytest.raises(RecordError, match="stats_interval_s"):
        RecordingConfig(stats_interval_s=0)


@pytest.mark.parametrize("how", ["options", "config file"])
def test_standalone_driver_records_its_counters_by_configuration(driver_dir: Path, tmp_path: Path, how: str) -> None:
    out = tmp_path / "rec"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if how == "options":
        settings = ["--record", str(out), "--record-interval", "0.2"]
    else:
        config = tmp_path / "driver.toml"
        config.write_text(f'record_directory = "{out}"\nrecord_interval = "200ms"\n')
        settings = ["--config", str(config)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "driver", "--dir", str(driver_dir), *settings],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("media driver running")
        assert proc.stdout.readline().startswith("recording counters")
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    samples = Recording(out).read("driver_counters").to_pylist()
    assert len({r["timestamp_ns"] for r in samples}) >= 3  # several samples, each of every counter
    assert any(r["type_name"] == "system" for r in samples)


def test_a_damaged_segment_file_is_skipped_and_reported_not_fatal(tmp_path: Path) -> None:
    with Recorder(tmp_path, writer_id="w") as recorder:
        recorder.record(StreamStats(1, "aeron:ipc", 1, 2, "pub", 0, 0, 0))
    damaged = Path(Recording(tmp_path).segments("stream_stats")[0].path).with_name("w.00000009.parquet")
    damaged.write_bytes(b"PAR1 not really parquet")
    recording = Recording(tmp_path)
    assert recording.read("stream_stats").num_rows == 1
    assert recording.unreadable == [str(damaged)]


def test_closing_the_recorder_before_the_capture_still_writes_what_was_captured(
    driver_dir: Path, tmp_path: Path
) -> None:
    recorder = Recorder(tmp_path, writer_id="w", config=RecorderConfig(flush_interval_s=3600))
    with Context(driver_dir, driver="embedded") as context:
        capture = StreamCapture(context, "aeron:ipc", 3, recorder)
        publication = context.add_publication("aeron:ipc", 3)
        deadline = time.monotonic() + 10
        for i in range(100):
            while publication.offer(i.to_bytes(2, "little") * 16) < 0:
                assert time.monotonic() < deadline
        read = 0
        while read < 100 * 64:
            assert time.monotonic() < deadline
            read += capture.poll()
        recorder.close()  # the capture's blocks are converted by the close's last flush
        capture.subscription.close()
    payloads = Recording(tmp_path).read("captured").column("payload").to_pylist()
    assert [int.from_bytes(p[:2], "little") for p in payloads] == list(range(100))


def test_stats_sampler_records_periodically_and_the_final_totals(tmp_path: Path) -> None:
    from slipstream.telemetry import StatsSampler

    sent = [0]

    def collect(now_ns: int) -> list[ConnectionStats]:
        return [ConnectionStats(now_ns, 7, "10.0.0.1:4000", "c", sent[0], 0, 32 * sent[0], 0)]

    with Recorder(tmp_path, writer_id="w") as recorder, StatsSampler(recorder, collect, interval_s=0.05) as sampler:
        deadline = time.monotonic() + 10
        while sampler.samples < 3:
            assert time.monotonic() < deadline
            sent[0] += 1
            time.sleep(0.01)
        sent[0] = 1000
    rows = list(Recording(tmp_path).records("connection_stats"))
    assert len(rows) >= 4 and rows[-1].messages_sent == 1000  # the last sample, taken at stop
    assert [r.timestamp_ns for r in rows] == sorted(r.timestamp_ns for r in rows)
