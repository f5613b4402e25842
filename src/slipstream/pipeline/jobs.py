"""The report's Spark jobs: recordings in (through the ``slipstream`` source), Parquet tables out.

Each table is a pure function from DataFrames to a DataFrame, with a one-line docstring that says
what it computes (window, grouping, measures), so a test or a notebook can run one on its own and
another engine can mirror it in SQL; :func:`build_tables` runs them all. The recording is only read:
journals a dead writer left unfinalized are not read (``slipstream pipeline compact`` finalizes them).

Windows are tumbling, ``window_s`` wide, on the rows' ``timestamp_ns`` (``window_start_ns`` = the
timestamp rounded down to a multiple of the window). Percentiles are approximate
(``percentile_approx`` at :data:`PERCENTILE_ACCURACY`): a group of fewer than accuracy / 2 samples
is never compressed, so its percentiles are exact sample values and the same however Spark splits
the rows (which is what lets a test compare a cluster's tables with local mode's row for row);
larger groups are within 1 / accuracy in rank. A percentile ``q`` is null from fewer than
``ceil(1 / (1 - q))`` samples (p95: 20, p99: 100): the report prints "n too small" instead.
Every table has a total ordering.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..telemetry import Recording
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
    "server_windows",
    "link_windows",
    "churn",
    "top_talkers",
    "rejected_handshakes",
    "abuse_list",
    "stream_throughput",
    "message_types",
    "driver_counters",
    "loss",
    "errors",
)
"""The report's tables, in the order they are built."""

PERCENTILE_ACCURACY = 10_000
"""``percentile_approx``'s accuracy (Spark's default): relative rank error 1 / accuracy; groups of
fewer than accuracy / 2 samples are exact."""
QUANTILES = (0.5, 0.95, 0.99)
"""The RTT percentiles every table with RTT reports, as ``rtt_p50_ns``, ``rtt_p95_ns``, ``rtt_p99_ns``."""
UNKNOWN_SERVER = "(unrecorded)"
"""The server of rows recorded before records carried ``local`` (connection_events v1, connection_stats v2)."""
_COUNTERS = ("messages_sent", "messages_received", "bytes_sent", "bytes_received", "naks_sent", "naks_received",
             "retransmits", "bytes_lost", "back_pressure_events")  # fmt: skip
"""The cumulative per-connection counters of ``connection_stats``."""


def min_samples(q: float) -> int:
    """The fewest samples a ``q`` percentile is reported from: one sample beyond it (p95: 20, p99: 100)."""
    return math.ceil(round(1 / (1 - q), 9))


def load(spark: SparkSession, root: str | Path, kind: str, columns: Sequence[str] | None = None) -> DataFrame:
    """One recorded kind as a DataFrame (empty, with its schema, when nothing of it was recorded);
    ``columns`` reads only those (the report never needs captured payloads)."""
    reader = spark.read.format("slipstream").option("kind", kind)
    if columns is not None:
        reader = reader.option("columns", ",".join(columns))
    return reader.load(str(root))


def window_start(window_s: int) -> Column:
    """The tumbling window a row falls in: its ``timestamp_ns`` rounded down to a multiple of the window."""
    width = F.lit(window_s * 1_000_000_000)
    return (F.col("timestamp_ns") - F.pmod(F.col("timestamp_ns"), width)).alias("window_start_ns")


def _percentiles(column: str, prefix: str) -> list[Column]:
    """``<prefix>_samples`` and the :data:`QUANTILES` of ``column`` (null from too few samples)."""
    n = F.count(F.col(column))
    values = F.percentile_approx(F.col(column), list(QUANTILES), PERCENTILE_ACCURACY)
    columns = [n.alias(f"{prefix}_samples")]
    for i, q in enumerate(QUANTILES):
        value = F.when(n >= min_samples(q), values[i])
        columns.append(value.alias(f"{prefix}_p{round(q * 100)}_ns"))
    return columns


def server_name() -> Column:
    """The server a row belongs to: its ``local`` host (:data:`UNKNOWN_SERVER` for older records)."""
    return F.coalesce(F.col("local"), F.lit(UNKNOWN_SERVER)).alias("server")


# -- the tables -----------------------------------------------------------------------------------------


def server_side(frame: DataFrame) -> DataFrame:
    """The rows servers recorded. Both ends of a connection record it under the same id, and a client
    records its own refusals, so the report takes the servers' view; clients' rows stay in the
    recording for other questions. (``connection_stats`` before version 2 had no side: a server's.)"""
    return frame.where(F.coalesce(F.col("side"), F.lit("server")) == "server")


def sessions(events: DataFrame, stats: DataFrame) -> DataFrame:
    """Per (server, connection_id), whole recording: address, tag, transport, start, end, cause, max of each
    counter, duration, throughput, loss rate, RTT samples and p50/p95/p99."""
    opened = (
        events.where(F.col("connection_id").isNotNull())
        .groupBy(server_name(), "connection_id")
        .agg(
            F.min_by("address", "timestamp_ns").alias("address"),
            F.min_by("tag", "timestamp_ns").alias("tag"),
            F.min_by("transport", "timestamp_ns").alias("transport"),
            F.min(F.when(F.col("event").isin("handshake_accepted", "connected"), F.col("timestamp_ns"))).alias(
                "start_ns"
            ),
            F.max(F.when(F.col("event") == "disconnected", F.col("timestamp_ns"))).alias("end_ns"),
            F.max_by(F.when(F.col("event") == "disconnected", F.col("cause")), "timestamp_ns").alias("cause"),
        )
    )
    totals = stats.groupBy(server_name(), "connection_id").agg(
        *(F.max(name).alias(name) for name in _COUNTERS if name != "naks_received"),
        F.max("timestamp_ns").alias("last_stats_ns"),
        *_percentiles("rtt_ns", "rtt"),
    )
    joined = opened.join(totals, ["server", "connection_id"], "full_outer")
    end = F.coalesce(F.col("end_ns"), F.col("last_stats_ns"))
    duration_s = (end - F.col("start_ns")) / F.lit(1e9)
    moved = F.coalesce(F.col("bytes_sent"), F.lit(0)) + F.coalesce(F.col("bytes_received"), F.lit(0))
    received = F.coalesce(F.col("bytes_received"), F.lit(0))
    lost = F.coalesce(F.col("bytes_lost"), F.lit(0))
    return (
        joined.withColumn("duration_s", duration_s)
        .withColumn("throughput_bytes_per_s", F.when(F.col("duration_s") > 0, moved / F.col("duration_s")))
        .withColumn("loss_rate", F.when(received + lost > 0, lost / (received + lost)).otherwise(F.lit(0.0)))
        .drop("last_stats_ns")
        .orderBy("server", "connection_id")
    )


def stats_deltas(stats: DataFrame) -> DataFrame:
    """Each ``connection_stats`` row with its counters turned into the change since the connection's previous row
    (per server and connection id, by time; a counter that went down, a new connection under a reused id,
    counts from zero): sums of these over any window are that window's traffic."""
    previous = Window.partitionBy("server", "connection_id").orderBy("timestamp_ns")
    deltas = [
        F.when(F.col(name) >= F.lag(name, 1, 0).over(previous), F.col(name) - F.lag(name, 1, 0).over(previous))
        .otherwise(F.col(name))
        .alias(name)
        for name in _COUNTERS
    ]
    named = stats.select("timestamp_ns", server_name(), "connection_id", "address", "tag", "rtt_ns", *_COUNTERS)
    return named.select(
        "timestamp_ns", "server", "connection_id", "tag", "rtt_ns", host(F.col("address")).alias("remote"), *deltas
    )


def _traffic(deltas: DataFrame, keys: Sequence[str | Column], window_s: int) -> DataFrame:
    """Per window and ``keys``: connections, traffic each way and its rates, repairs, loss, back pressure, RTT."""
    received = F.sum("bytes_received")
    lost = F.sum("bytes_lost")
    return deltas.groupBy(window_start(window_s), *keys).agg(
        # collect_set, not countDistinct: a distinct aggregate beside percentile_approx makes Spark expand
        # every row once per aggregate (3.4x the time of the two apart on 5 M rows); windows hold few connections.
        F.size(F.collect_set("connection_id")).alias("connections"),
        F.sum("messages_received").alias("messages_in"),
        F.sum("messages_sent").alias("messages_out"),
        received.alias("bytes_in"),
        F.sum("bytes_sent").alias("bytes_out"),
        ((F.sum("messages_received") + F.sum("messages_sent")) / F.lit(float(window_s))).alias("messages_per_s"),
        ((received + F.sum("bytes_sent")) / F.lit(float(window_s))).alias("bytes_per_s"),
        F.sum("naks_sent").alias("naks_sent"),
        F.sum("naks_received").alias("naks_received"),
        F.sum("retransmits").alias("retransmits"),
        lost.alias("bytes_lost"),
        F.when(received + lost > 0, lost / (received + lost)).otherwise(F.lit(0.0)).alias("loss_rate"),
        F.sum("back_pressure_events").alias("back_pressure_events"),
        *_percentiles("rtt_ns", "rtt"),
    )


def server_windows(stats: DataFrame, window_s: int) -> DataFrame:
    """Per window and server (``local``): connections, messages and bytes in/out and per second, NAKs sent and
    received, retransmits, bytes lost, loss rate, back-pressure events, RTT samples and p50/p95/p99."""
    return _traffic(stats_deltas(stats), ["server"], window_s).orderBy("window_start_ns", "server")


def link_windows(stats: DataFrame, window_s: int) -> DataFrame:
    """Per window and link (server ``local``, ``remote`` host of ``address``): :func:`server_windows`' measures."""
    return _traffic(stats_deltas(stats), ["server", "remote"], window_s).orderBy("window_start_ns", "server", "remote")


def churn(events: DataFrame, window_s: int) -> DataFrame:
    """Per window, server, event and detail (a disconnect's cause, a refusal's reason, else ""): events."""
    detail = F.coalesce(F.col("cause"), F.col("reason"), F.lit("")).alias("detail")
    return (
        events.groupBy(window_start(window_s), server_name(), "event", detail)
        .agg(F.count(F.lit(1)).alias("events"))
        .orderBy("window_start_ns", "server", "event", "detail")
    )


def top_talkers(stats: DataFrame, window_s: int, top: int) -> DataFrame:
    """Per window and dimension (``address``: remote host, ``tag``: connection tag): the ``top`` keys by bytes
    (in + out; ties by messages, then key), with messages, bytes and rank."""
    deltas = stats_deltas(stats)
    traffic = [F.col(name) for name in _COUNTERS[:4]]
    window = window_start(window_s)
    by_address = deltas.select(window, F.lit("address").alias("dimension"), F.col("remote").alias("key"), *traffic)
    by_tag = deltas.select(window, F.lit("tag").alias("dimension"), F.col("tag").alias("key"), *traffic)
    totals = (
        by_address.unionByName(by_tag)
        .groupBy("window_start_ns", "dimension", "key")
        .agg(
            (F.sum("messages_sent") + F.sum("messages_received")).alias("messages"),
            (F.sum("bytes_sent") + F.sum("bytes_received")).alias("bytes"),
        )
    )
    order = Window.partitionBy("window_start_ns", "dimension").orderBy(F.desc("bytes"), F.desc("messages"), "key")
    return (
        totals.withColumn("rank", F.row_number().over(order))
        .where(F.col("rank") <= top)
        .orderBy("window_start_ns", "dimension", "rank")
    )


def rejected_handshakes(events: DataFrame) -> DataFrame:
    """Refused handshakes per remote host and reason, whole recording: count, first and last time; most first."""
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


def stream_throughput(captured: DataFrame, window_s: int) -> DataFrame:
    """Per captured stream (channel, stream_id, session_id) and window: messages, bytes, both per second."""
    return (
        captured.groupBy("channel", "stream_id", "session_id", window_start(window_s))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"))
        .withColumn("messages_per_s", F.col("messages") / F.lit(float(window_s)))
        .withColumn("bytes_per_s", F.col("bytes") / F.lit(float(window_s)))
        .orderBy("channel", "stream_id", "session_id", "window_start_ns")
    )


def message_types(captured: DataFrame) -> DataFrame:
    """Per message type (``(raw)`` if untyped), whole recording: messages, bytes, min, approx p50, max size."""
    return (
        captured.groupBy(F.coalesce(F.col("message_type"), F.lit("(raw)")).alias("message_type"))
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("size").alias("bytes"),
            F.min("size").alias("min_size"),
            F.percentile_approx(F.col("size"), 0.5, PERCENTILE_ACCURACY).alias("p50_size"),
            F.max("size").alias("max_size"),
        )
        .orderBy(F.desc("messages"), "message_type")
    )


def driver_counters(samples: DataFrame) -> DataFrame:
    """Per driver and counter (counter_id, registration_id): type and label, first and last sample's time and
    value, and the change between them; biggest change first."""
    return (
        samples.groupBy("driver", "counter_id", "registration_id")
        .agg(
            F.max_by("type_name", "timestamp_ns").alias("type_name"),
            F.max_by("label", "timestamp_ns").alias("label"),
            F.min("timestamp_ns").alias("first_ns"),
            F.max("timestamp_ns").alias("last_ns"),
            F.min_by("value", "timestamp_ns").alias("first_value"),
            F.max_by("value", "timestamp_ns").alias("last_value"),
        )
        .withColumn("change", F.col("last_value") - F.col("first_value"))
        .orderBy(F.desc(F.abs(F.col("change"))), F.desc("last_value"), "driver", "counter_id", "registration_id")
    )


def loss(samples: DataFrame) -> DataFrame:
    """Per loss entry (driver, session_id, stream_id, channel, source): max count and bytes lost, first/last seen."""
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
    """Per distinct error (driver, text): max observation count, first and last observation; most first."""
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

    The recording is opened read-only: finalized segments only (a dead writer's journal is not read
    until ``slipstream pipeline compact`` finalizes it), nothing written beside them.
    """
    options = options or ReportOptions()
    input_dir = Path(input_dir)
    tables_dir = Path(output_dir) / "tables"
    recording = Recording(input_dir)
    result = TablesResult()
    for kind in RECORDED_KINDS:
        result.input_rows[kind] = sum(segment.rows for segment in recording.segments(kind))
    frames = {kind: load(spark, input_dir, kind, _COLUMNS.get(kind)) for kind in RECORDED_KINDS}
    events = server_side(frames["connection_events"])
    stats = server_side(frames["connection_stats"])
    window = options.window_s
    jobs: dict[str, Callable[[], DataFrame]] = {
        "sessions": lambda: sessions(events, stats),
        "server_windows": lambda: server_windows(stats, window),
        "link_windows": lambda: link_windows(stats, window),
        "churn": lambda: churn(events, window),
        "top_talkers": lambda: top_talkers(stats, window, options.top),
        "rejected_handshakes": lambda: rejected_handshakes(events),
        "abuse_list": lambda: abuse_list(events, options.abuse_threshold),
        "stream_throughput": lambda: stream_throughput(frames["captured"], window),
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
