"""Live answers: a streaming query that keeps the abuse list up to date and publishes it on a stream.

It reads ``connection_events`` as a stream (the ``slipstream`` source, replayable offsets), counts
refused handshakes per address, and publishes, each trigger, every address at or over the threshold
as an ``AbuseEntry`` message through the ``slipstream`` sink (complete mode: the whole list each
time). A server subscribes with :class:`slipstream.telemetry.abuse.AbuseListSubscriber`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..telemetry.abuse import ABUSE_LIST_TYPE
from .jobs import host, server_side


def abuse_list_stream(spark: SparkSession, recording: str | Path, threshold: int) -> DataFrame:
    """The streaming abuse list: address (a host), rejections, reasons (hosts at or over ``threshold``)."""
    events = spark.readStream.format("slipstream").option("kind", "connection_events").load(str(recording))
    return (
        server_side(events)
        .where(F.col("event") == "handshake_rejected")
        .groupBy(host(F.col("address")).alias("address"))
        .agg(
            F.count(F.lit(1)).alias("rejections"),
            F.concat_ws(",", F.array_sort(F.collect_set(F.coalesce(F.col("reason"), F.lit("unknown"))))).alias(
                "reasons"
            ),
        )
        .where(F.col("rejections") >= threshold)
    )


def start_abuse_list_query(
    spark: SparkSession,
    recording: str | Path,
    *,
    channel: str,
    stream_id: int,
    checkpoint: str | Path,
    driver_dir: str | Path | None = None,
    threshold: int = 5,
    trigger_s: float = 1.0,
) -> Any:
    """Start the query; returns the ``StreamingQuery`` (stop it with ``.stop()``)."""
    writer = (
        abuse_list_stream(spark, recording, threshold)
        .writeStream.format("slipstream")
        .outputMode("complete")
        .option("channel", channel)
        .option("stream", str(stream_id))
        .option("type", ABUSE_LIST_TYPE)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger_s} seconds")
    )
    if driver_dir is not None:
        writer = writer.option("dir", str(driver_dir))
    return writer.start()
