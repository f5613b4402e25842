"""``python -m bench.pipeline_source``: the ``slipstream`` Spark source against Spark's own Parquet reader.

The same synthetic recording (``bench.pipeline.make_recording``: 90 % captured messages) is read by
Spark on ``local[2]`` twice, through ``format("slipstream")`` and through ``spark.read.parquet`` on the
very same segment files, with the same queries over the captured messages:

* ``count``: how many messages;
* ``group_by``: messages and bytes per (stream id, message type);
* ``minute``: messages in one minute (a time-range count).

The source is given what a user gives it to read less: the ``columns`` option (the Python data source
API has no column pruning; Spark's Parquet reader prunes by itself) and ``pushFilters=true`` for the
filtered query. Each query runs once to warm up, then ``--repeat`` rounds with the two readers
interleaved (other work on the machine slows both alike); the median counts.

Ratios are **native seconds / source seconds**: above 1 the source is faster, 1/1.3 = 0.77 is the
target's bound (the source at most 1.3 times slower). A ``reader`` part times the telemetry reader
alone on a column subset (the whole file read then selected, as before, against the columns passed to
the Parquet reader), and a ``profile`` part varies ``rowsPerPartition``.

A ``floor`` part counts the captured rows through a Python data source that reads nothing (the same rows,
partitions and Arrow batches, made in memory): the least any Python data source costs here, beside the
native reader.

Results print as a table and go to ``bench/results/pipeline-source-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
START_NS = 1_700_000_000 * 10**9  # make_recording's first timestamp
MINUTE = (START_NS + 120 * 10**9, START_NS + 180 * 10**9)
COLUMNS = {"count": "timestamp_ns", "group_by": "stream_id,message_type,size", "minute": "timestamp_ns"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _timed(runs: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, list[float], Any]]:
    """Each run once to warm up (Python workers started, files in the page cache), then ``repeat``
    rounds with the runs interleaved, so a busy machine slows them alike; medians."""
    answers = {name: run() for name, run in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            again = run()
            times[name].append(time.perf_counter() - started)
            assert again == answers[name], (name, again, answers[name])
    return {name: (statistics.median(times[name]), times[name], answers[name]) for name in runs}


def _query(name: str, frame: Any) -> Any:
    from pyspark.sql import functions as F

    if name == "count":
        return frame.count()
    if name == "group_by":
        rows = frame.groupBy("stream_id", "message_type").agg(F.count("*").alias("n"), F.sum("size").alias("b"))
        return sorted(tuple(r) for r in rows.collect())
    low, high = MINUTE
    return frame.where((F.col("timestamp_ns") >= low) & (F.col("timestamp_ns") < high)).count()


def run_queries(spark: Any, root: Path, repeat: int, per_partition: int | None = None) -> dict[str, Any]:
    from slipstream.telemetry import Recording

    paths = sorted({segment.path for segment in Recording(root).segments("captured")})
    out: dict[str, Any] = {}
    for name, columns in COLUMNS.items():

        def source(name: str = name, columns: str = columns) -> Any:
            reader = spark.read.format("slipstream").option("kind", "captured").option("columns", columns)
            if per_partition is not None:
                reader = reader.option("rowsPerPartition", str(per_partition))
            if name == "minute":
                reader = reader.option("pushFilters", "true")
            return _query(name, reader.load(str(root)))

        def native(name: str = name) -> Any:
            return _query(name, spark.read.parquet(*paths))

        timed = _timed({"native": native, "source": source}, repeat)
        native_s, native_all, native_answer = timed["native"]
        source_s, source_all, source_answer = timed["source"]
        assert native_answer == source_answer, (name, native_answer, source_answer)
        out[name] = {
            "native_s": native_s,
            "source_s": source_s,
            "ratio_native_over_source": native_s / source_s,
            "native_runs_s": native_all,
            "source_runs_s": source_all,
        }
        log(f"  {name:9} native {native_s:6.2f} s  source {source_s:6.2f} s  ratio {native_s / source_s:.2f}")
    return out


def floor_source(rows: int, per_partition: int, batch_rows: int) -> type:
    """A Python data source that reads nothing: ``rows`` int64 rows in the source's partitions and batches,
    made in memory. What Spark spends on it is the floor of any Python data source on these rows (the
    Arrow hand-off from the Python worker, the rows made in the JVM, the tasks), with no Parquet read."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from pyspark.sql.types import LongType, StructField, StructType

    class Part(InputPartition):
        def __init__(self, count: int) -> None:
            self.count = count

    class Reader(DataSourceReader):
        def partitions(self) -> Sequence[InputPartition]:
            full, rest = divmod(rows, per_partition)
            return [Part(per_partition) for _ in range(full)] + ([Part(rest)] if rest else [])

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            count = partition.count  # type: ignore[attr-defined]
            batch = pa.RecordBatch.from_arrays([pa.array(range(batch_rows), pa.int64())], names=["timestamp_ns"])
            while count > 0:
                yield batch if count >= batch_rows else batch.slice(0, count)
                count -= batch_rows

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "slipstream_bench_floor"

        def schema(self) -> StructType:
            return StructType([StructField("timestamp_ns", LongType())])

        def reader(self, schema: StructType) -> DataSourceReader:
            return Reader()

    return Floor


def run_floor_part(spark: Any, root: Path, rows: int, repeat: int) -> dict[str, Any]:
    """``count`` through :func:`floor_source` beside Spark's Parquet reader on the recording's files: how
    close to the native reader any Python data source can get here."""
    from slipstream.pipeline.source import BATCH_ROWS, DEFAULT_ROWS_PER_PARTITION
    from slipstream.telemetry import Recording

    spark.dataSource.register(floor_source(rows, DEFAULT_ROWS_PER_PARTITION, BATCH_ROWS))
    paths = sorted({segment.path for segment in Recording(root).segments("captured")})
    timed = _timed(
        {
            "native": lambda: spark.read.parquet(*paths).count(),
            "floor": lambda: spark.read.format("slipstream_bench_floor").load().count(),
        },
        repeat,
    )
    (native_s, native_all, native_n), (floor_s, floor_all, floor_n) = timed["native"], timed["floor"]
    assert native_n == floor_n == rows, (native_n, floor_n, rows)
    log(f"  floor: a data source reading nothing, {rows:,} rows counted in {floor_s:.2f} s (native {native_s:.2f} s)")
    return {
        "rows": rows,
        "native_s": native_s,
        "floor_s": floor_s,
        "ratio_native_over_floor": native_s / floor_s,
        "native_runs_s": native_all,
        "floor_runs_s": floor_all,
    }


def run_reader_part(root: Path, repeat: int) -> dict[str, Any]:
    """The telemetry reader alone, every captured segment, three columns: the old way (``read_table``
    of the whole file, then ``select``) against the columns passed to the Parquet reader."""
    import pyarrow.parquet as pq

    from slipstream.telemetry import Recording
    from slipstream.telemetry.reader import read_segment

    segments = Recording(root).segments("captured")
    columns = ["timestamp_ns", "stream_id", "size"]

    def whole() -> int:
        return sum(pq.read_table(s.path).select(columns).num_rows for s in segments)

    def pushed() -> int:
        return sum(read_segment(s, columns=columns).num_rows for s in segments)

    timed = _timed({"whole": whole, "pushed": pushed}, repeat)
    (whole_s, _, rows), (pushed_s, _, rows_again) = timed["whole"], timed["pushed"]
    assert rows == rows_again
    log(f"  reader: {rows:,} rows, 3 columns: whole file then select {whole_s:.2f} s, columns pushed {pushed_s:.2f} s")
    return {"rows": rows, "columns": columns, "read_table_then_select_s": whole_s, "columns_pushed_s": pushed_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline_source", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[5_000_000, 20_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", type=int, nargs="*", default=[262_144, 4_194_304],
                        help="rowsPerPartition values tried on the first size (none: skip)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the benchmark works")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeat, args.profile = [200_000], 1, [65_536]

    from bench.pipeline import make_recording
    from slipstream.pipeline.session import spark_session
    from slipstream.pipeline.source import DEFAULT_ROWS_PER_PARTITION

    result: dict[str, Any] = {
        "started": datetime.now().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "convention": "ratio = native Parquet seconds / slipstream source seconds: > 1 means the source is "
        "faster; the target (source within 1.3x of native) is ratio >= 0.77",
        "default_rows_per_partition": DEFAULT_ROWS_PER_PARTITION,
        "sizes": [],
    }
    scratch = Path(tempfile.mkdtemp(prefix="slipstream-bench-source-"))
    try:
        started = time.monotonic()
        spark = spark_session("local[2]", app_name="slipstream-bench-source")
        result["spark_startup_s"] = time.monotonic() - started
        for index, rows in enumerate(args.rows):
            root = scratch / f"rec-{rows}"
            started = time.monotonic()
            counts = make_recording(root, rows)
            log(f"{rows:,} rows generated in {time.monotonic() - started:.1f} s ({counts})")
            entry: dict[str, Any] = {"rows": rows, "captured_rows": counts["captured"]}
            entry["queries"] = run_queries(spark, root, args.repeat)
            entry["floor"] = run_floor_part(spark, root, counts["captured"], args.repeat)
            if index == 0:
                result["reader"] = run_reader_part(root, args.repeat)
                if args.profile:
                    entry["rows_per_partition"] = {}
                    for per in args.profile:
                        log(f" rowsPerPartition {per}")
                        entry["rows_per_partition"][str(per)] = run_queries(spark, root, args.repeat, per)
            result["sizes"].append(entry)
            shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["load_average_after"] = os.getloadavg()

    print("\nslipstream source vs Spark's Parquet reader (local[2]); ratio = native s / source s (> 1: source faster)")
    print(f"{'rows':>12} {'query':>9} {'native':>9} {'source':>9} {'ratio':>6}")
    for entry in result["sizes"]:
        for name, q in entry["queries"].items():
            print(f"{entry['rows']:>12,} {name:>9} {q['native_s']:>7.2f} s {q['source_s']:>7.2f} s "
                  f"{q['ratio_native_over_source']:>6.2f}")  # fmt: skip
    for entry in result["sizes"]:
        f = entry["floor"]
        print(f"{entry['rows']:>12,} {'floor':>9} {f['native_s']:>7.2f} s {f['floor_s']:>7.2f} s "
              f"{f['ratio_native_over_floor']:>6.2f}  (a Python data source that reads nothing)")  # fmt: skip
    reader = result.get("reader")
    if reader:
        print(f"telemetry reader, {reader['rows']:,} rows, 3 columns: {reader['read_table_then_select_s']:.2f} s "
              f"(whole file, then select) vs {reader['columns_pushed_s']:.2f} s (columns pushed)")  # fmt: skip
    out = args.out or RESULTS / f"pipeline-source-{datetime.now():%Y-%m-%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
