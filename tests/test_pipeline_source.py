"""The ``slipstream`` source reads only what a query needs, fairly and from where it says: columns and
row groups pushed into the Parquet reader, filters pushed down, writers drained fairly under
``maxRecordsPerTrigger``, bad paths refused by name, typed kinds whose message gained a field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from slipstream.pipeline.source import SlipstreamDataSource, SlipstreamSourceError, _StreamReader
from slipstream.telemetry import BUILTIN_SCHEMAS, Recorder, RecorderConfig, RecordError, Recording, typed_schema
from slipstream.telemetry.reader import Segment, read_segment, segment_ranges

T0 = 1_700_000_000 * 10**9
EVENTS = ("handshake_accepted", "connected", "disconnected", "handshake_rejected")


def _record(root: Path, writer: str, kind: str, tables: list[pa.Table]) -> None:
    """One finalized segment per table, by a real recorder."""
    with Recorder(root, writer_id=writer, config=RecorderConfig(fsync=False)) as recorder:
        for table in tables:
            recorder.extend_table(BUILTIN_SCHEMAS[kind], table, bounded=False)
            recorder.flush(finalize=True)


def _events(first: int, n: int) -> pa.Table:
    """Connection events one millisecond apart from ``T0 + first`` ms, the four events in turn."""
    i = np.arange(first, first + n)
    columns = {
        "timestamp_ns": T0 + i * 1_000_000,
        "event": np.array(EVENTS, dtype=object)[i % 4],
        "side": np.full(n, "server", dtype=object),
        "address": np.char.add("10.0.0.", (i % 7).astype(str)).astype(object),
        "tag": np.full(n, "", dtype=object),
        "transport": np.full(n, "udp", dtype=object),
        "connection_id": i,
        "reason": pa.nulls(n, pa.string()),
        "cause": pa.nulls(n, pa.string()),
        "local": np.full(n, "srv", dtype=object),
    }
    return pa.Table.from_pydict(columns, schema=_schema("connection_events"))


def _captured(first: int, n: int, payload: int = 0) -> pa.Table:
    i = np.arange(first, first + n)
    rng = np.random.default_rng(first)
    blob = rng.bytes(n * payload)
    columns = {
        "timestamp_ns": T0 + i * 1000,
        "channel": np.where(i % 2 == 0, "aeron:ipc", "aeron:udp?endpoint=10.0.0.1:40123").astype(object),
        "stream_id": 1000 + i % 8,
        "session_id": 7 + i % 8,
        "position": i * 64,
        "size": np.full(n, payload),
        "payload": pa.array([blob[k * payload : (k + 1) * payload] for k in range(n)], type=pa.binary()),
        "message_type": pa.nulls(n, pa.string()),
    }
    return pa.Table.from_pydict(columns, schema=_schema("captured"))


def _schema(kind: str) -> pa.Schema:
    from slipstream.telemetry.segments import arrow_schema

    return arrow_schema(BUILTIN_SCHEMAS[kind]).remove_metadata()


def _rchar() -> int:
    """Bytes this process has read through read(2) and friends (page cache included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_reads_only_the_columns_and_row_groups_asked_for(tmp_path: Path) -> None:
    """300 000 captured rows with 64 random bytes each (two row groups): a timestamp column, or 100
    rows of the second row group, costs a small part of the file. The old reader read the whole file
    every time and selected afterwards."""
    _record(tmp_path, "w", "captured", [_captured(0, 300_000, payload=64)])
    (segment,) = Recording(tmp_path).segments("captured")
    size = Path(segment.path).stat().st_size
    assert size > 19_000_000

    before = _rchar()
    times = read_segment(segment, columns=["timestamp_ns"])
    assert _rchar() - before < size // 5
    assert times.column_names == ["timestamp_ns"] and times.num_rows == 300_000

    before = _rchar()
    rows = read_segment(segment, 270_000, 270_100)
    assert _rchar() - before < size // 3
    assert rows.column("position").to_pylist() == [i * 64 for i in range(270_000, 270_100)]
    assert rows.column("payload")[0].as_py() == read_segment(segment, 270_000, 270_001).column("payload")[0].as_py()


def test_a_segment_inside_a_compacted_file_reads_from_its_base(tmp_path: Path) -> None:
    """A compacted file holds several segments: one starting at file row ``base`` reads file rows
    ``[base + start, base + stop)``, across a row-group boundary (262144), filters included."""
    _record(tmp_path, "w", "captured", [_captured(0, 300_000)])
    (whole,) = Recording(tmp_path).segments("captured")
    inner = Segment(whole.writer, whole.kind, 1, whole.path, rows=1000, base=262_000)
    assert segment_ranges(inner) == [(0, 144), (144, 1000)]
    assert read_segment(inner, 100, 300).column("position").to_pylist() == [i * 64 for i in range(262_100, 262_300)]
    odd = read_segment(inner, filters=[("stream_id", "in", (1001, 1003))], columns=["position"])
    assert odd.column("position").to_pylist() == [i * 64 for i in range(262_000, 263_000) if i % 8 in (1, 3)]


def test_partitions_follow_row_groups_whatever_rows_per_partition(spark: Any, tmp_path: Path) -> None:
    """A small ``rowsPerPartition`` used to cut a 300 000-row segment into 600 tasks, each reading the
    whole file: now a row group is read by one task only (and small segments share one)."""
    _record(tmp_path, "w", "captured", [_captured(0, 300_000)])
    _record(tmp_path, "x", "captured", [_captured(300_000 + 100 * k, 100) for k in range(5)])
    frame = spark.read.format("slipstream").option("columns", "position").option("rowsPerPartition", "500")
    small = frame.load(str(tmp_path))
    assert small.rdd.getNumPartitions() == 3  # two row groups of the big segment, the five small ones
    assert sorted(r.position // 64 for r in small.collect()) == list(range(300_500))


def test_filters_are_pushed_into_the_reader(spark: Any, tmp_path: Path) -> None:
    """Time ranges and equality / IN on event, channel and stream id skip the segments and row groups
    that cannot match and filter the rest; the answers equal pyarrow's over the whole table."""
    _record(tmp_path, "w", "connection_events", [_events(1000 * k, 1000) for k in range(8)])
    _record(tmp_path, "w2", "captured", [_captured(10_000 * k, 10_000) for k in range(4)])

    def load(kind: str, rows: int, where: str | None = None) -> Any:
        """A DataFrame of its own per query (pushed filters stay with the loaded relation: Spark 4.3)."""
        read = spark.read.format("slipstream").option("kind", kind).option("pushFilters", "true")
        frame = read.option("rowsPerPartition", str(rows)).load(str(tmp_path))
        return frame if where is None else frame.where(where)

    window = f"timestamp_ns >= {T0 + 2500 * 10**6} and timestamp_ns < {T0 + 3500 * 10**6}"
    assert load("connection_events", 1000).rdd.getNumPartitions() == 8
    assert load("connection_events", 1000, window).rdd.getNumPartitions() == 2  # segments 2 and 3 only
    assert load("connection_events", 1000, window).count() == 1000
    refused = load("connection_events", 1000, f"{window} and event = 'handshake_rejected'")
    assert {r.event for r in refused.select("event").collect()} == {"handshake_rejected"} and refused.count() == 250
    assert load("connection_events", 1000, "event in ('connected', 'disconnected') and connection_id < 10").count() == 5
    assert load("connection_events", 1000, f"timestamp_ns > {T0 + 8000 * 10**6}").count() == 0

    table = Recording(tmp_path).read("captured")
    ipc = pa.compute.sum(pa.compute.equal(table.column("channel"), "aeron:ipc")).as_py()
    chosen = pa.compute.sum(pa.compute.is_in(table.column("stream_id"), pa.array([1002, 1005]))).as_py()
    assert load("captured", 10_000, "channel = 'aeron:ipc' and stream_id in (1002, 1005)").count() == 5_000
    assert load("captured", 10_000, "channel = 'aeron:ipc'").count() == ipc == 20_000
    assert load("captured", 10_000, "stream_id in (1002, 1005)").count() == chosen == 10_000
    late = load("captured", 10_000, f"timestamp_ns >= {T0 + 35_000 * 1000} and size >= 0")  # size: Spark checks it
    assert late.count() == 5_000 and late.rdd.getNumPartitions() == 1
    plain = spark.read.format("slipstream").option("kind", "connection_events").load(str(tmp_path))
    assert plain.where("event = 'connected'").count() == 2000 and plain.count() == 8000  # pushFilters off


def test_a_busy_writer_does_not_starve_the_others(tmp_path: Path) -> None:
    """Under ``maxRecordsPerTrigger`` every writer with rows pending gets its share of each batch (the
    old reader drained writers in name order: ``b`` waited until ``a`` had nothing left), and the
    batches' offsets still name each row exactly once."""
    _record(tmp_path, "a-busy", "connection_events", [_events(1000 * k, 1000) for k in range(3)])
    _record(tmp_path, "b-quiet", "connection_events", [_events(10_000, 150)])
    _record(tmp_path, "c-quiet", "connection_events", [_events(20_000, 30)])
    source = SlipstreamDataSource({"path": str(tmp_path), "kind": "connection_events", "maxRecordsPerTrigger": "300"})
    reader = source.streamReader(source.schema())
    assert isinstance(reader, _StreamReader)
    start = reader.initialOffset()
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert first == {"writers": {"a-busy": [0, 135], "b-quiet": [0, 135], "c-quiet": [1, 0]}}
    seen: list[int] = []
    batches = 0
    while True:
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if end == start:
            break
        rows = [
            i
            for p in reader.partitions(start, end)
            for b in reader.read(p)
            for i in b.column("connection_id").to_pylist()
        ]
        replayed = [
            i
            for p in reader.partitions(start, end)
            for b in reader.read(p)
            for i in b.column("connection_id").to_pylist()
        ]
        assert rows == replayed and len(rows) <= 300
        seen += rows
        start, batches = end, batches + 1
    assert sorted(seen) == [*range(3000), *range(10_000, 10_150), *range(20_000, 20_030)]
    assert batches == 11


def test_bad_paths_are_named_and_file_uris_read(spark: Any, tmp_path: Path) -> None:
    """``file://`` reads as the local path; other schemes, a missing path and a root with no recording
    are errors naming the path (they read as 0 rows before); a kind nobody recorded is empty."""
    _record(tmp_path / "rec", "w", "connection_events", [_events(0, 100)])
    read = spark.read.format("slipstream").option("kind", "connection_events")
    assert read.load(f"file://{tmp_path}/rec").count() == 100
    assert spark.read.format("slipstream").option("kind", "loss_report").load(str(tmp_path / "rec")).count() == 0
    for path, said in [
        ("s3a://bucket/recordings", "locally mounted. filesystem only"),
        ("hdfs://namenode:8020/rec", "locally mounted. filesystem only"),
        (str(tmp_path / "missing"), "no such directory"),
    ]:
        with pytest.raises(SlipstreamSourceError, match=said) as caught:
            SlipstreamDataSource({"path": path, "kind": "connection_events"}).schema()
        assert path.split("://")[-1].split("/")[-1] in str(caught.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match=f"{tmp_path / 'empty'} holds no recording"):
        read.load(str(tmp_path / "empty")).count()
    with pytest.raises(Exception, match="missing: no such directory"):
        read.load(str(tmp_path / "missing")).count()


class QuoteV1(msgspec.Struct, tag="Quote"):
    symbol: str
    price: float


class QuoteV2(msgspec.Struct, tag="Quote"):
    symbol: str
    price: float
    venue: str | None = None


class QuoteBad(msgspec.Struct, tag="Quote"):
    symbol: str
    price: str


def _quotes(root: Path, writer: str, message_type: type, rows: list[tuple[object, ...]]) -> None:
    schema = typed_schema(message_type, name="Quote")
    with Recorder(root, writer_id=writer, config=RecorderConfig(fsync=False)) as recorder:
        recorder.extend(schema, [(T0 + i, "aeron:ipc", 1, 7, 64 * i, 32, *row) for i, row in enumerate(rows)])


@pytest.mark.parametrize("newer_writer", ["a-new", "z-new"])
def test_a_typed_message_that_gains_a_field_reads_with_the_merged_schema(
    spark: Any, tmp_path: Path, newer_writer: str
) -> None:
    """Older segments read the new field as null, whichever writer sorts first (before: a KeyError, or
    the new column silently missing); a field recorded with two types names both files."""
    _quotes(tmp_path, "m-old", QuoteV1, [("ACME", 1.5), ("INIT", 2.5)])
    _quotes(tmp_path, newer_writer, QuoteV2, [("ACME", 1.75, "XNAS")])
    table = Recording(tmp_path).read("typed.Quote", columns=["symbol", "venue"])
    assert sorted(table.to_pylist(), key=str) == sorted(
        [{"symbol": "ACME", "venue": None}, {"symbol": "INIT", "venue": None}, {"symbol": "ACME", "venue": "XNAS"}],
        key=str,
    )
    frame = spark.read.format("slipstream").option("kind", "typed.Quote").load(str(tmp_path))
    assert frame.columns[-3:] == ["symbol", "price", "venue"]
    assert sorted((r.symbol, r.price, r.venue) for r in frame.collect()) == [
        ("ACME", 1.5, None),
        ("ACME", 1.75, "XNAS"),
        ("INIT", 2.5, None),
    ]
    _quotes(tmp_path, "q-bad", QuoteBad, [("ACME", "cheap")])
    with pytest.raises(RecordError, match=r"column 'price' is double in \S+ but string in \S*q-bad"):
        Recording(tmp_path).schema("typed.Quote")
