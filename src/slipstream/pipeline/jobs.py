"""The report's Spark jobs: recordings in (through the ``slipstream`` source), Parquet tables out.

Each table is one function from DataFrames to a DataFrame, so a test or a notebook can run one on
its own; :func:`build_tables` runs them all. Results are deterministic (exact percentiles, total
orderings), which is what lets a test compare a cluster's tables with local mode's row for row.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ..telemetry import Recording, recover
from .abuse import abuse_list as windowed_abuse_list
from .abuse import host
from .options import ReportOptions

RECORDED_KINDS = (
    "connection_events",
    "connection_stats",
    "stream_stats",
    "captured",
    "driver_counters",
    "loss_report",
    "error_log",
)
_COLUMNS = {"captured": ("timestamp_ns", "channel", "stream_id", "session_id", "size", "message_type")}
"""Columns the jobs read, where a kind has columns they never need."""

TABLES = (
    "sessions",
    "rejected_handshakes",
    "abuse_list",
    "stream_throughput",
    "message_types",
    "driver_counters",
    "loss",
    "errors",
)
"""The report's tables, in the order they are built."""



def load(spark: SparkSession, root: str | Path, kind: str, columns: Sequence[str] | None = None) -> DataFrame:
    """One recorded kind as a DataFrame (empty, with its schema, when nothing of it was recorded);
    ``columns`` reads only those (the report never needs captured payloads)."""
    reader = spark.read.format("slipstream").option("kind", kind)
    if columns is not None:
        reader = reader.option("columns", ",".join(columns))
    return reader.load(str(root))


def _pct(column: str, q: float) -> Column:
    return F.percentile(F.col(column), F.lit(q))


# -- the tables -----------------------------------------------------------------------------------------


def server_side(frame: DataFrame) -> DataFrame:
    """The rows servers recorded. Both ends of a connection record it under the same id, and a client
    records its own refusals, so the report takes the servers' view; clients' rows stay in the
    recording for other questions. (``connection_stats`` before version 2 had no side: a server's.)"""
    return frame.where(F.coalesce(F.col("side"), F.lit("server")) == "server")


def sessions(events: DataFrame, stats: DataFrame) -> DataFrame:
    """Per connection: when and how long, messages and bytes each way, throughput, RTT percentiles, loss."""
    opened = events.where(F.col("connection_id").isNotNull()).groupBy("connection_id").agg(
        F.min_by("address", "timestamp_ns").alias("address"),
        F.min_by("tag", "timestamp_ns").alias("tag"),
        F.min_by("transport", "timestamp_ns").alias("transport"),
        F.min(F.when(F.col("event").isin("handshake_accepted", "connected"), F.col("timestamp_ns"))).alias("start_ns"),
        F.max(F.when(F.col("event") == "disconnected", F.col("timestamp_ns"))).alias("end_ns"),
        F.max_by(F.when(F.col("event") == "disconnected", F.col("cause")), "timestamp_ns").alias("cause"),
    )
    totals = stats.groupBy("connection_id").agg(
        F.max("messages_sent").alias("messages_sent"),
        F.max("messages_received").alias("messages_received"),
        F.max("bytes_sent").alias("bytes_sent"),
        F.max("bytes_received").alias("bytes_received"),
        F.max("bytes_lost").alias("bytes_lost"),
        F.max("naks_sent").alias("naks_sent"),
        F.max("retransmits").alias("retransmits"),
        F.max("back_pressure_events").alias("back_pressure_events"),
        F.max("timestamp_ns").alias("last_stats_ns"),
        _pct("rtt_ns", 0.5).alias("rtt_p50_ns"),
        _pct("rtt_ns", 0.95).alias("rtt_p95_ns"),
        _pct("rtt_ns", 0.99).alias("rtt_p99_ns"),
    )
    joined = opened.join(totals, "connection_id", "full_outer")
    end = F.coalesce(F.col("end_ns"), F.col("last_stats_ns"))
    duration_s = (end - F.col("start_ns")) / F.lit(1e9)
    moved = F.coalesce(F.col("bytes_sent"), F.lit(0)) + F.coalesce(F.col("bytes_received"), F.lit(0))
    return (
        joined.withColumn("duration_s", duration_s)
        .withColumn("throughput_bytes_per_s", F.when(F.col("duration_s") > 0, moved / F.col("duration_s")))
        .withColumn(
            "loss_rate",
            F.when(
                F.coalesce(F.col("bytes_received"), F.lit(0)) + F.coalesce(F.col("bytes_lost"), F.lit(0)) > 0,
                F.coalesce(F.col("bytes_lost"), F.lit(0))
                / (F.coalesce(F.col("bytes_received"), F.lit(0)) + F.coalesce(F.col("bytes_lost"), F.lit(0))),
            ).otherwise(F.lit(0.0)),
        )
        .drop("last_stats_ns")
        .orderBy("connection_id")
    )


def rejected_handshakes(events: DataFrame) -> DataFrame:
    """Refused handshakes by host and reason, most frequent first."""
    return (
        events.where(F.col("event") == "handshake_rejected")
        .groupBy(host(F.col("address")).alias("address"), F.coalesce(F.col("reason"), F.lit("unknown")).alias("reason"))
        .agg(
            F.count(F.lit(1)).alias("rejections"),
            F.min("timestamp_ns").alias("first_ns"),
            F.max("timestamp_ns").alias("last_ns"),
        )
        .orderBy(F.desc("rejections"), "address", "reason")
    )


def abuse_list(events: DataFrame, threshold: int) -> DataFrame:
    """Hosts with at least ``threshold`` refused handshakes within the last ten minutes of the recording,
    with when each entry expires: the one computation the live query runs too (:mod:`.abuse`)."""
    return windowed_abuse_list(events, threshold)


def stream_throughput(captured: DataFrame, bucket_s: int = 1) -> DataFrame:
    """Messages and bytes per stream per time bucket, from captured streams."""
    bucket = (F.floor(F.col("timestamp_ns") / F.lit(bucket_s * 1_000_000_000)) * F.lit(bucket_s)).cast("long")
    return (
        captured.groupBy("channel", "stream_id", "session_id", bucket.alias("second"))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"))
        .orderBy("channel", "stream_id", "session_id", "second")
    )


def message_types(captured: DataFrame) -> DataFrame:
    """Message types by count, with their sizes; untyped payloads count as ``(raw)``."""
    return (
        captured.groupBy(F.coalesce(F.col("message_type"), F.lit("(raw)")).alias("message_type"))
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("size").alias("bytes"),
            F.min("size").alias("min_size"),
            _pct("size", 0.5).alias("p50_size"),
            F.max("size").alias("max_size"),
        )
        .orderBy(F.desc("messages"), "message_type")
    )


def driver_counters(samples: DataFrame) -> DataFrame:
    """Each counter's last sampled value."""
    return (
        samples.groupBy("driver", "counter_id", "registration_id", "type_name")
        .agg(F.max_by("label", "timestamp_ns").alias("label"), F.max_by("value", "timestamp_ns").alias("value"))
        .orderBy("driver", "counter_id", "registration_id")
    )


def loss(samples: DataFrame) -> DataFrame:
    """Each loss-report entry's last state."""
    return (
        samples.groupBy("driver", "session_id", "stream_id", "channel", "source")
        .agg(
            F.max("observation_count").alias("observation_count"),
            F.max("total_bytes_lost").alias("total_bytes_lost"),
            F.min("first_observation_ms").alias("first_observation_ms"),
            F.max("last_observation_ms").alias("last_observation_ms"),
        )
        .orderBy(F.desc("total_bytes_lost"), "driver", "session_id", "stream_id", "channel", "source")
    )


def errors(samples: DataFrame) -> DataFrame:
    """Each distinct error's last state."""
    return (
        samples.groupBy("driver", "text")
        .agg(
            F.max("observation_count").alias("observation_count"),
            F.min("first_observation_ms").alias("first_observation_ms"),
            F.max("last_observation_ms").alias("last_observation_ms"),
        )
        .orderBy(F.desc("observation_count"), "driver", "text")
    )


# -- running them ---------------------------------------------------------------------------------------


class Progress:
    """Prints which job runs and its stage's task progress, from Spark's status tracker, every ``interval_s``.

    On a terminal the line is redrawn in place; otherwise one line per change (logs stay readable).
    """

    def __init__(self, spark: SparkSession, total: int, out: TextIO | None = None, interval_s: float = 0.5) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.total = total
        self.out = out or sys.stderr
        self.interval_s = interval_s
        self.tty = self.out.isatty()
        self._step = 0
        self._name = ""
        self._started = 0.0
        self._last = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _line(self) -> str:
        tasks = []
        for stage_id in sorted(self.tracker.getActiveStageIds()):
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                tasks.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
        elapsed = time.monotonic() - self._started
        detail = f" ({'; '.join(tasks)})" if tasks else ""
        return f"[{self._step}/{self.total}] {self._name} {elapsed:5.1f} s{detail}"

    def _emit(self, line: str, final: bool = False) -> None:
        if self.tty:
            self.out.write("\r\x1b[K" + line + ("\n" if final else ""))
        elif line != self._last or final:
            self.out.write(line + "\n")
        self.out.flush()
        self._last = line

    def _run(self) -> None:
        last_detail = ""
        last_emit = time.monotonic()
        while not self._stop.wait(self.interval_s):
            try:
                line = self._line()
            except Exception:  # the tracker can race with the job's end; progress is best effort
                continue
            if not self.tty:  # a log: a line when the stages move, or every 5 s, not every tick
                detail = line.partition(" s (")[2]  # the stages' part, without the elapsed time
                if detail == last_detail and time.monotonic() - last_emit < 5.0:
                    continue
                last_detail, last_emit = detail, time.monotonic()
            self._emit(line)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Show ``name`` as the running step while the block runs, then its time."""
        self._step += 1
        self._name = name
        self._started = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="slipstream-progress", daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()
            self._emit(f"[{self._step}/{self.total}] {name} done in {time.monotonic() - self._started:.1f} s", True)


@dataclass
class TablesResult:
    """Where each table was written, and each table's rows collected (they are small aggregates)."""

    paths: dict[str, Path] = field(default_factory=dict)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    input_rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def build_tables(
    spark: SparkSession,
    input_dir: str | Path,
    output_dir: str | Path,
    options: ReportOptions | None = None,
    *,
    progress: Progress | None = None,
    collect: bool = True,
) -> TablesResult:
    """Run every job over a recording and write the tables as Parquet under ``output_dir/tables``.

    Segments that a killed recorder left unfinalized are finalized first (through ``telemetry``).
    """
    options = options or ReportOptions()
    input_dir = Path(input_dir)
    recover(input_dir)
    tables_dir = Path(output_dir) / "tables"
    recording = Recording(input_dir)
    result = TablesResult()
    for kind in RECORDED_KINDS:
        result.input_rows[kind] = sum(segment.rows for segment in recording.segments(kind))
    frames = {kind: load(spark, input_dir, kind, _COLUMNS.get(kind)) for kind in RECORDED_KINDS}
    events = server_side(frames["connection_events"])
    jobs: dict[str, Callable[[], DataFrame]] = {
        "sessions": lambda: sessions(events, server_side(frames["connection_stats"])),
        "rejected_handshakes": lambda: rejected_handshakes(events),
        "abuse_list": lambda: abuse_list(events, options.abuse_threshold),
        "stream_throughput": lambda: stream_throughput(frames["captured"], options.bucket_s),
        "message_types": lambda: message_types(frames["captured"]),
        "driver_counters": lambda: driver_counters(frames["driver_counters"]),
        "loss": lambda: loss(frames["loss_report"]),
        "errors": lambda: errors(frames["error_log"]),
    }
    for name in TABLES:
        started = time.monotonic()
        with progress.step(name) if progress is not None else _nothing():
            frame = jobs[name]().coalesce(1)
            path = tables_dir / name
            frame.write.mode("overwrite").parquet(str(path))
            result.paths[name] = path
            if collect:
                written = spark.read.parquet(str(path))
                result.rows[name] = [row.asDict() for row in written.collect()]
        result.seconds[name] = time.monotonic() - started
    return result


@contextmanager
def _nothing() -> Iterator[None]:
    yield
