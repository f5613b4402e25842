"""The abuse list, computed once for the report (batch) and the live query (streaming).

A host is listed when its refused handshakes within the last ``window`` reach ``threshold``; the window
ends at the watermark, the latest refusal the data holds (event time, so a replay or a report over an
old recording gives the same list as the live run did). Refusals are counted per host per ``bucket``
(default one minute): a streaming query can keep that table (one aggregation, complete mode) and
every trigger turns it into the snapshot with :func:`abuse_snapshot`, the same function the report
runs over a recording. Each entry carries ``expires_ns``: when, with no further refusal, the host falls
below the threshold (the newest bucket it needs leaves the window). Receivers drop an entry at that
time themselves, because Spark runs no batch until new data arrives.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

DEFAULT_WINDOW_S = 600
"""The abuse list counts refusals within the last ten minutes."""
DEFAULT_BUCKET_S = 60
"""Refusals are counted per minute: the window slides (and entries expire) in one-minute steps."""

SNAPSHOT_COLUMNS = ("address", "rejections", "reasons", "last_ns", "expires_ns")


def host(address: Column) -> Column:
    """The host of ``host:port`` or ``[v6]:port`` (anything else unchanged): a peer that is refused
    reconnects from new ephemeral ports, so refusals are counted, and listed, per host."""
    return (
        F.when(address.rlike(r"^\[.*\]:[0-9]+$"), F.regexp_extract(address, r"^\[(.*)\]:[0-9]+$", 1))
        .when(address.rlike(r"^[^:]*:[0-9]+$"), F.regexp_extract(address, r"^([^:]*):[0-9]+$", 1))
        .otherwise(address)
    )


def _check(threshold: int, window_s: int, bucket_s: int) -> None:
    if threshold < 1:
        raise ValueError(f"abuse threshold must be >= 1, not {threshold}")
    if bucket_s < 1 or window_s < bucket_s:
        raise ValueError(f"abuse window ({window_s} s) must be at least one bucket ({bucket_s} s), and a bucket >= 1 s")


def refusal_buckets(events: DataFrame, bucket_s: int = DEFAULT_BUCKET_S) -> DataFrame:
    """Refused handshakes per host per bucket: ``address`` (the host), ``bucket_ns``, ``rejections``,
    ``last_ns``, ``reasons`` (an array). One aggregation, so a streaming DataFrame can keep it."""
    width = bucket_s * 1_000_000_000
    refused = events.where(F.col("event") == "handshake_rejected")
    return refused.groupBy(
        host(F.col("address")).alias("address"),
        (F.floor(F.col("timestamp_ns") / F.lit(width)) * F.lit(width)).cast("long").alias("bucket_ns"),
    ).agg(
        F.count(F.lit(1)).alias("rejections"),
        F.max("timestamp_ns").alias("last_ns"),
        F.collect_set(F.coalesce(F.col("reason"), F.lit("unknown"))).alias("reasons"),
    )


def abuse_snapshot(
    buckets: DataFrame,
    threshold: int,
    window_s: int = DEFAULT_WINDOW_S,
    bucket_s: int = DEFAULT_BUCKET_S,
) -> DataFrame:
    """The listed hosts (:data:`SNAPSHOT_COLUMNS`) from a (batch) table of :func:`refusal_buckets`.

    A bucket counts while it overlaps the window ``(watermark - window, watermark]``; ``expires_ns`` is
    the end of the newest bucket that brings the host to ``threshold``, plus the window."""
    _check(threshold, window_s, bucket_s)
    width, span = bucket_s * 1_000_000_000, window_s * 1_000_000_000
    watermark = buckets.agg(F.max("last_ns").alias("watermark_ns"))
    newest_first = (
        Window.partitionBy("address")
        .orderBy(F.desc("bucket_ns"))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    live = (
        buckets.crossJoin(watermark)
        .where(F.col("bucket_ns") + F.lit(width) > F.col("watermark_ns") - F.lit(span))
        .withColumn("running", F.sum("rejections").over(newest_first))
    )
    return (
        live.groupBy("address")
        .agg(
            F.sum("rejections").alias("rejections"),
            F.concat_ws(",", F.array_sort(F.array_distinct(F.flatten(F.collect_list("reasons"))))).alias("reasons"),
            F.max("last_ns").alias("last_ns"),
            F.max(F.when(F.col("running") >= threshold, F.col("bucket_ns"))).alias("needed_ns"),
        )
        .where(F.col("rejections") >= threshold)
        .select(
            "address",
            F.col("rejections").cast("long").alias("rejections"),
            "reasons",
            "last_ns",
            (F.col("needed_ns") + F.lit(width + span)).alias("expires_ns"),
        )
    )


def abuse_list(
    events: DataFrame,
    threshold: int,
    window_s: int = DEFAULT_WINDOW_S,
    bucket_s: int = DEFAULT_BUCKET_S,
) -> DataFrame:
    """The abuse list of a (batch) DataFrame of connection events, most refused first."""
    snapshot = abuse_snapshot(refusal_buckets(events, bucket_s), threshold, window_s, bucket_s)
    return snapshot.orderBy(F.desc("rejections"), "address")
