"""Storage an operator can keep: partitions by date, hour and a stable name, compaction that keeps streaming
offsets, retention, segments never finalized behind a stream (defect 4) and reading without write access."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slipstream.telemetry import Recorder, RecorderConfig, RecordError, Recording, StreamStats, read_segment, recover
from slipstream.telemetry.maintenance import MaintenanceError, compact, parse_bytes, parse_period
from slipstream.telemetry.records import BUILTIN_SCHEMAS
from slipstream.telemetry.segments import (
    JOURNALS_DIR,
    arrow_schema,
    hour_of,
    journal_dir,
    journal_name,
    write_segment,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
KIND = "stream_stats"
MANUAL = RecorderConfig(flush_interval_s=3600, segment_max_age_s=3600)
"""Nothing happens on its own: the test flushes and finalizes."""


def stats(i: int) -> StreamStats:
    return StreamStats(i, "aeron:ipc", 1, 2, "pub", i, i, i)


def positions(recording: Recording, segments: list[Any] | None = None) -> list[int]:
    found: list[int] = []
    for segment in recording.segments(KIND) if segments is None else segments:
        found.extend(read_segment(segment).column("position").to_pylist())
    return found


def record_segments(root: Path, writer: str, counts: list[int], *, first: int = 0, name: str = "srv") -> int:
    """One finalized segment per count, rows numbered from ``first``; returns the next number."""
    with Recorder(root, writer_id=writer, config=MANUAL, name=name) as recorder:
        for count in counts:
            for i in range(first, first + count):
                recorder.record(stats(i))
            first += count
            recorder.flush(finalize=True)
    return first


def in_mount_namespace(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a private mount namespace (mounts it makes vanish with it); skip without root."""
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script, *args],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0 and proc.stderr.startswith("unshare:"):
        pytest.skip(f"needs a private mount namespace: {proc.stderr.strip()}")
    return proc


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


# -- layout ---------------------------------------------------------------------------------------------


def test_segments_are_partitioned_by_date_hour_and_a_stable_name_not_the_pid(tmp_path: Path) -> None:
    for pid in (4001, 4002):  # two runs (restarts): new writer ids, the same partitions
        with Recorder(tmp_path, writer_id=f"rec-vm-{pid}", config=MANUAL, name="srv-a") as recorder:
            recorder.record(stats(1))
    hour = hour_of(time.time())
    segments = Recording(tmp_path).segments(KIND)
    assert len(segments) == 2 and len({s.writer for s in segments}) == 2
    for segment in segments:
        relative = Path(segment.path).relative_to(tmp_path).as_posix()
        expected = (
            rf"{KIND}/date={hour[:10]}/hour={hour[11:]}/host=srv-a/{re.escape(segment.writer)}\.00000000\.parquet"
        )
        assert re.fullmatch(expected, relative), relative
        assert segment.host == "srv-a" and segment.hour == hour and segment.base == 0
        assert segment.writer not in relative.rsplit("/", 1)[0], "the writer id (pid) is in no directory name"
    # Hive-style: any Parquet reader that knows partitions sees date, hour and host as columns.
    import pyarrow.dataset as ds

    table = ds.dataset(tmp_path / KIND, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 2 and set(table.column("host").to_pylist()) == {"srv-a"}
    assert not any(p.name.endswith(".lock") for p in (tmp_path / KIND).rglob("*"))  # locks live in _journals
    with Recorder(tmp_path, config=MANUAL) as recorder:  # the default name is the host name
        recorder.record(stats(2))
    assert {s.host for s in Recording(tmp_path).segments(KIND)} == {"srv-a", recorder.name}
    assert recorder.name and "/" not in recorder.name


def test_duckdb_reads_the_partitions_natively(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    record_segments(tmp_path, "w", [3, 4], name="edge-1")
    glob = str(tmp_path / KIND / "**" / "*.parquet")
    rows = duckdb.sql(f"SELECT host, count(*) FROM read_parquet('{glob}', hive_partitioning=true) GROUP BY host")
    assert rows.fetchall() == [("edge-1", 7)]


def test_a_bad_name_is_refused_where_it_is_given(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="name 'a/b'"):
        Recorder(tmp_path, name="a/b")
    with pytest.raises(RecordError, match=r"RecorderConfig\.name"):
        RecorderConfig(name=".hidden")
    proc = subprocess.run(
        [sys.executable, "-m", "slipstream", "record", "--channel", "aeron:ipc", "--stream", "1",
         "--output", str(tmp_path), "--name", "no/slash"],
        capture_output=True, text=True, env=ENV, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "no/slash" in proc.stderr


def test_the_recorder_rolls_its_segments_at_each_utc_hour(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path, writer_id="w", config=MANUAL, name="srv")
    before = 1_764_334_799.5  # 2025-11-28 12:59:59.5 UTC
    recorder._wall = lambda: before
    recorder.record(stats(0))
    recorder.flush()
    recorder._wall = lambda: before + 1  # 13:00:00.5
    recorder.record(stats(1))
    recorder.flush()
    recorder.close()
    segments = Recording(tmp_path).segments(KIND)
    assert [(s.seq, s.hour, s.rows) for s in segments] == [(0, "2025-11-28T12", 1), (1, "2025-11-28T13", 1)]
    assert "/date=2025-11-28/hour=13/host=srv/" in segments[1].path


def test_the_layout_of_earlier_versions_is_still_listed_read_and_continued(tmp_path: Path) -> None:
    schema = arrow_schema(BUILTIN_SCHEMAS[KIND], "w")
    for seq in range(2):  # ROOT/<writer>/<kind>/<seq>.parquet, as the previous version wrote
        rows = [stats(seq * 10 + i).row() for i in range(3)]
        write_segment(pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema),
                      tmp_path / "w" / KIND, seq)  # fmt: skip
    (tmp_path / "w" / ".lock").touch()
    old_journal = tmp_path / "w" / KIND / journal_name(2)  # left by a killed recorder of that version
    with pa.OSFile(str(old_journal), "wb") as sink, pa.ipc.new_stream(sink, schema) as stream:
        stream.write_table(pa.Table.from_pylist([dict(zip(schema.names, stats(20).row(), strict=True))], schema=schema))
    recording = Recording(tmp_path)
    assert [s.seq for s in recording.segments(KIND)] == [0, 1]
    assert recording.read(KIND, include_open=True).num_rows == 7
    assert recording.writers() == ["w"] and recording.kinds() == [KIND]
    # The same writer id recording again continues after every seq it used, in either layout.
    record_segments(tmp_path, "w", [2], first=30)  # its start recovers the old journal in place (seq 2)
    segments = Recording(tmp_path).segments(KIND)
    assert [s.seq for s in segments] == [0, 1, 2, 3]
    assert positions(Recording(tmp_path)) == [0, 1, 2, 10, 11, 12, 20, 30, 31]
    assert segments[2].path.endswith("w/stream_stats/00000002.parquet") and segments[3].host == "srv"


# -- defect 4: no segment behind a stream's position ------------------------------------------------------

DISK_FULL = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys
    from pathlib import Path
    from slipstream.telemetry import Recorder, RecorderConfig, Recording, StreamStats, recover

    mount = Path(sys.argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    root = mount / "rec"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the recording process: a write fails on a full disk, later ones succeed; then it is killed
        os.close(read)
        recorder = Recorder(root, writer_id="w", config=RecorderConfig(flush_interval_s=3600, segment_max_age_s=3600))
        stats = lambda i: StreamStats(i, "aeron:ipc", 1, 2, "pub", i, i, i)
        for i in range(0, 100):
            recorder.record(stats(i))
        recorder.flush()  # journal 0 holds rows 0-99
        filler = open(mount / "filler", "wb")
        try:
            while True:
                filler.write(b"x" * 65536)
                filler.flush()
        except OSError:
            pass
        for i in range(100, 200):
            recorder.record(stats(i))
        try:
            recorder.flush()
            failed = False
        except OSError:
            failed = True  # rows 100-199 are lost and counted; journal 0 is given up
        filler.close()
        os.unlink(mount / "filler")
        for i in range(200, 300):
            recorder.record(stats(i))
        recorder.flush(finalize=True)  # the next segment is finalized
        # A streaming query reads everything listed now and stands after it: {w: [last seq + 1, 0]}.
        listed = Recording(root).segments("stream_stats")
        seen = []
        from slipstream.telemetry import read_segment
        for s in listed:
            seen += read_segment(s).column("position").to_pylist()
        offset = max((s.seq for s in listed), default=-1) + 1
        os.write(write, json.dumps({"failed": failed, "dropped": recorder.dropped_rows, "seen": seen,
                                    "offset": offset}).encode())
        os.close(write)
        os.kill(os.getpid(), signal.SIGKILL)
    os.close(write)
    state = json.loads(os.read(read, 1 << 20))
    os.waitpid(pid, 0)
    recover(root)
    later = []
    from slipstream.telemetry import read_segment
    for s in Recording(root).segments("stream_stats"):
        if s.seq >= state["offset"]:
            later += read_segment(s).column("position").to_pylist()
    print(json.dumps({**state, "later": later}))
    """
)


def test_rows_of_a_journal_given_up_after_a_disk_write_failure_reach_a_stream(tmp_path: Path) -> None:
    """A real ENOSPC (a 4 MB tmpfs in a private mount namespace): the old recorder finalized segment 1 while
    journal 0 waited, so recovery's segment 0 landed behind a stream already at [2, 0]."""
    mount = tmp_path / "small"
    mount.mkdir()
    proc = in_mount_namespace(DISK_FULL, str(mount))
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state["failed"] and state["dropped"] == 100
    delivered = state["seen"] + state["later"]
    assert sorted(delivered) == [*range(0, 100), *range(200, 300)], "rows of journal 0 never reach the stream"
    assert len(delivered) == len(set(delivered))


@pytest.mark.parametrize("layout", ["partitioned", "earlier"])
def test_recovery_finalizes_a_late_journal_after_the_last_segment_not_behind_it(tmp_path: Path, layout: str) -> None:
    """A dead writer left journal 0 (abandoned) while segment 1 was finalized: recovery makes it segment 2."""
    schema = arrow_schema(BUILTIN_SCHEMAS[KIND], "w")

    def table(first: int) -> pa.Table:
        rows = [dict(zip(schema.names, stats(i).row(), strict=True)) for i in range(first, first + 5)]
        return pa.Table.from_pylist(rows, schema=schema)

    if layout == "earlier":
        kind_dir = tmp_path / "w" / KIND
        write_segment(table(5), kind_dir, 1)
        (tmp_path / "w" / ".lock").touch()
    else:
        record_segments(tmp_path, "w", [5], first=100)  # segment 0, so the writer's directories exist
        kind_dir = journal_dir(tmp_path, "w") / KIND
        write_segment(table(5), Path(Recording(tmp_path).segments(KIND)[0].path).parent, 1, writer="w")
        for path in Path(Recording(tmp_path).segments(KIND)[0].path).parent.glob("w.00000000.parquet"):
            path.unlink()  # only segment 1 is left, as in the issue
    stream_at = max(s.seq for s in Recording(tmp_path).segments(KIND)) + 1  # a stream has read everything: [2, 0]
    with pa.OSFile(str(kind_dir / journal_name(0)), "wb") as sink, pa.ipc.new_stream(sink, schema) as stream:
        stream.write_table(table(0))
    assert recover(tmp_path) == 1
    segments = Recording(tmp_path).segments(KIND)
    assert [s.seq for s in segments] == [1, 2]
    assert positions(Recording(tmp_path), [s for s in segments if s.seq >= stream_at]) == [0, 1, 2, 3, 4]


# -- reading needs no write access ----------------------------------------------------------------------

KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from slipstream.telemetry import Recorder, RecorderConfig, StreamStats
    recorder = Recorder(sys.argv[1], writer_id="dead", config=RecorderConfig(flush_interval_s=3600))
    for i in range(5):
        recorder.record(StreamStats(i, "aeron:ipc", 1, 2, "pub", i, i, i))
    recorder.flush(finalize=True)
    recorder.record(StreamStats(5, "aeron:ipc", 1, 2, "pub", 5, 5, 5))
    recorder.flush()  # a journal, never finalized: the process dies
    os.kill(os.getpid(), signal.SIGKILL)
    """
)

READ_ONLY = textwrap.dedent(
    """
    import json, subprocess, sys
    from slipstream.telemetry import Recording
    source, mount = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "--bind", source, mount], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", mount], check=True)
    try:
        open(mount + "/probe", "w")
        raise SystemExit("the mount is writable")
    except OSError:
        pass
    recording = Recording(mount)
    print(json.dumps({
        "kinds": recording.kinds(),
        "writers": recording.writers(),
        "segments": [[s.writer, s.seq, s.rows] for s in recording.segments("stream_stats")],
        "rows": recording.read("stream_stats").num_rows,
        "open": recording.read("stream_stats", include_open=True).num_rows,
        "schema": recording.schema("stream_stats").names[:2],
    }))
    """
)


def test_a_recording_is_listed_and_read_from_a_read_only_mount_and_nothing_is_written(tmp_path: Path) -> None:
    source = tmp_path / "rec"
    record_segments(source, "w", [3, 2])
    killed = subprocess.run([sys.executable, "-c", KILLED, str(source)], env=ENV, timeout=60)
    assert killed.returncode == -9
    before = files_under(source)
    recording = Recording(source)  # the writable copy: the reader changes nothing either
    assert recording.read(KIND, include_open=True).num_rows == 11 and recording.writers() == ["dead", "w"]
    assert files_under(source) == before, "reading created, changed or finished files"
    mount = tmp_path / "ro"
    mount.mkdir()
    proc = in_mount_namespace(READ_ONLY, str(source), str(mount))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["kinds"] == [KIND] and seen["writers"] == ["dead", "w"]
    assert seen["segments"] == [["dead", 0, 5], ["w", 0, 3], ["w", 1, 2]]
    assert seen["rows"] == 10 and seen["open"] == 11 and seen["schema"] == ["timestamp_ns", "channel"]


# -- compaction and retention ---------------------------------------------------------------------------


def _stream_reader(root: Path) -> Any:
    pytest.importorskip("pyspark")
    from slipstream.pipeline.source import SlipstreamDataSource

    source = SlipstreamDataSource({"path": str(root), "kind": KIND})
    return source.streamReader(source.schema())


def _read_batch(reader: Any, start: Any, end: Any) -> list[int]:
    found: list[int] = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            found.extend(batch.column(batch.schema.get_field_index("position")).to_pylist())
    return found


def test_compaction_merges_small_segments_and_a_running_stream_keeps_its_offsets(tmp_path: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    following = record_segments(tmp_path, "a", [3, 4, 5, 6])
    following = record_segments(tmp_path, "b", [2, 2, 2], first=following)
    reader = _stream_reader(tmp_path)
    start = reader.initialOffset()
    middle = reader.latestOffset(start, ReadMaxRows(9))  # shared fairly: a stands inside its segment 1
    assert middle["writers"] == {"a": [1, 2], "b": [2, 0]}
    delivered = _read_batch(reader, start, middle)
    before = [(s.writer, s.seq, s.rows) for s in Recording(tmp_path).segments(KIND)]

    result = compact(tmp_path, grace_s=3600)
    assert sorted(Path(path).name for path, *_ in result.merged) == ["a.00000000-00000003.parquet",
                                                                      "b.00000000-00000002.parquet"]  # fmt: skip
    segments = Recording(tmp_path).segments(KIND)
    assert [(s.writer, s.seq, s.rows) for s in segments] == before
    a_segments = [s for s in segments if s.writer == "a"]
    assert {s.path for s in a_segments} == {str(Path(a_segments[0].path).with_name("a.00000000-00000003.parquet"))}
    assert [s.base for s in a_segments] == [0, 3, 7, 12]
    metadata = pq.read_metadata(a_segments[0].path).metadata
    assert json.loads(metadata[b"slipstream.segments"]) == [[0, 3], [1, 4], [2, 5], [3, 6]]
    originals = sorted(p.name for p in Path(a_segments[0].path).parent.glob("a.0000000?.parquet"))
    assert len(originals) == 4, "originals stay for the grace period (an executor may have listed them)"

    end = reader.latestOffset(middle, ReadAllAvailable())
    delivered += _read_batch(reader, middle, end)
    assert sorted(delivered) == list(range(following)) and len(delivered) == following, "offsets survived"

    # More segments of a, then a compaction past the grace period: merged again, originals deleted.
    record_segments(tmp_path, "a", [1, 1], first=following)
    again = compact(tmp_path, grace_s=0)
    assert len(again.deleted) == 4 + 3  # the originals of a and b
    names = sorted(p.name for p in Path(a_segments[0].path).parent.iterdir())
    assert names == ["a.00000000-00000003.parquet", "a.00000000-00000005.parquet", "a.00000004.parquet",
                     "a.00000005.parquet", "b.00000000-00000002.parquet"]  # fmt: skip
    assert {s.path for s in Recording(tmp_path).segments(KIND) if s.writer == "a"} == {
        str(Path(a_segments[0].path).with_name("a.00000000-00000005.parquet"))
    }
    final = compact(tmp_path, grace_s=0)  # what the last one replaced
    assert len(final.deleted) == 3 and not final.merged
    assert sorted(positions(Recording(tmp_path))) == list(range(following + 2))


def test_compaction_never_merges_across_writers_gaps_partitions_or_past_the_target(tmp_path: Path) -> None:
    record_segments(tmp_path, "a", [2, 2, 2])  # seqs 0, 1, 2
    layout_dir = Path(Recording(tmp_path).segments(KIND)[0].path).parent
    (layout_dir / "a.00000001.parquet").unlink()  # a gap: 0 | 2
    record_segments(tmp_path, "b", [1])
    recorder = Recorder(tmp_path, writer_id="a", config=MANUAL, name="srv")
    recorder._wall = lambda: time.time() - 7200  # an earlier hour: another partition
    recorder.record(stats(99))
    recorder.close()
    size = max(Path(s.path).stat().st_size for s in Recording(tmp_path).segments(KIND))
    assert not compact(tmp_path, grace_s=0).merged
    record_segments(tmp_path, "b", [1, 1, 1])
    merged = compact(tmp_path, target_bytes=2 * size + size // 2, grace_s=0).merged
    assert sorted(Path(path).name for path, *_ in merged) == ["b.00000000-00000001.parquet",
                                                                "b.00000002-00000003.parquet"]  # fmt: skip
    assert all(made <= 2 * size + size // 2 for *_, made in merged)


def test_retention_drops_whole_old_partitions_and_compact_recovers_dead_writers(tmp_path: Path) -> None:
    for days in (10, 8, 1):
        recorder = Recorder(tmp_path, writer_id=f"d{days}", config=MANUAL, name="srv")
        recorder._wall = lambda days=days: time.time() - days * 86400
        recorder.record(stats(days))
        recorder.close()
    killed = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], env=ENV, timeout=60)
    assert killed.returncode == -9
    dry = compact(tmp_path, retain_s=parse_period("7d"), dry_run=True)
    assert len(dry.dropped_partitions) == 2 and dry.recovered == 0
    assert len(Recording(tmp_path).segments(KIND)) == 4, "a dry run changes nothing"
    result = compact(tmp_path, retain_s=parse_period("7d"))
    assert result.recovered == 1 and len(result.dropped_partitions) == 2
    assert sorted(s.writer for s in Recording(tmp_path).segments(KIND)) == ["d1", "dead", "dead"]
    assert not list((tmp_path / JOURNALS_DIR).glob("d*/stream_stats/*.arrows"))
    assert not (tmp_path / JOURNALS_DIR / "d10").exists(), "a dead writer's empty journal directory is removed"


def test_pipeline_compact_command(tmp_path: Path) -> None:
    record_segments(tmp_path, "a", [1, 1, 1])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "slipstream", "pipeline", "compact", *args],
                              capture_output=True, text=True, env=ENV, timeout=120)  # fmt: skip

    dry = run(str(tmp_path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert re.search(r"would merge 3 segments \(\d+ bytes\) into stream_stats/date=", dry.stdout)
    done = run(str(tmp_path), "--target-size", "64MiB", "--retain", "30d", "--grace", "0s")
    assert (
        done.returncode == 0
        and re.search(r"merge 3 segments \(\d+ bytes\) into .* \(\d+ bytes\)", done.stdout)
        and "would" not in done.stdout
    )
    assert run(str(tmp_path / "missing")).returncode == 2
    bad = run(str(tmp_path), "--retain", "soon")
    assert bad.returncode == 2 and "--retain" in bad.stderr
    assert parse_bytes("128MiB") == 128 << 20 and parse_bytes("1g") == 1 << 30
    with pytest.raises(MaintenanceError, match="--target-size"):
        parse_bytes("big")


@pytest.mark.slow
def test_sparks_own_parquet_reader_reads_the_partitions(spark: Any, tmp_path: Path) -> None:
    record_segments(tmp_path, "w", [3, 4], name="edge-1")
    frame = spark.read.parquet(str(tmp_path / KIND))
    assert {"date", "hour", "host"} <= set(frame.columns)
    assert [tuple(r) for r in frame.groupBy("host").count().collect()] == [("edge-1", 7)]
    hour = hour_of(time.time())
    assert frame.where(f"date = '{hour[:10]}' AND hour = {int(hour[11:])}").count() == 7  # partition pruning works


def test_a_damaged_compacted_file_is_reported_and_its_originals_listed_again(tmp_path: Path) -> None:
    record_segments(tmp_path, "a", [2, 3])
    ((merged, *_),) = compact(tmp_path).merged
    assert [s.path for s in Recording(tmp_path).segments(KIND)] == [merged, merged]
    Path(merged).write_bytes(b"PAR1 not really parquet")
    recording = Recording(tmp_path)
    assert positions(recording) == [0, 1, 2, 3, 4] and recording.unreadable == [merged]
