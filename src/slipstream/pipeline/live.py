"""Live answers: a streaming query that keeps the abuse list up to date and publishes it on a stream.

It reads ``connection_events`` as a stream (the ``slipstream`` source, replayable offsets) and keeps
the refusals per host per minute (:func:`slipstream.pipeline.abuse.refusal_buckets`, complete mode).
Each trigger turns that table into the windowed snapshot (:func:`~slipstream.pipeline.abuse.abuse_snapshot`,
the report's computation too) and publishes it through the ``slipstream`` sink as ``AbuseEntry``
messages, numbered (query id, batch id, sequence) with the query id of the checkpoint, so a replayed
batch is dropped by receivers, and retained in the driver directory for servers that start later. A
server subscribes with :class:`slipstream.telemetry.abuse.AbuseListSubscriber`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from ..telemetry.abuse import ABUSE_LIST_TYPE
from .abuse import DEFAULT_BUCKET_S, DEFAULT_WINDOW_S, abuse_snapshot, refusal_buckets
from .jobs import server_side
from .sink import DEFAULT_RECEIVER_TIMEOUT_S, checkpoint_query_id, read_status

log = logging.getLogger(__name__)


def abuse_buckets_stream(spark: SparkSession, recording: str | Path, bucket_s: int = DEFAULT_BUCKET_S) -> DataFrame:
    """The streaming table the live query keeps: refusals per host per bucket (servers' view)."""
    events = spark.readStream.format("slipstream").option("kind", "connection_events").load(str(recording))
    return refusal_buckets(server_side(events), bucket_s)


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
    window_s: int = DEFAULT_WINDOW_S,
    bucket_s: int = DEFAULT_BUCKET_S,
    receiver_timeout_s: float = DEFAULT_RECEIVER_TIMEOUT_S,
) -> Any:
    """Start the query; returns the ``StreamingQuery`` (stop it with ``.stop()``).

    A batch no server receives within ``receiver_timeout_s`` is kept retained (a server that starts
    later reads it) and logged here; the query goes on."""
    sink = {
        "channel": channel,
        "stream": str(stream_id),
        "type": ABUSE_LIST_TYPE,
        "receiverTimeout": str(receiver_timeout_s),
    }
    if driver_dir is not None:
        sink["dir"] = str(driver_dir)

    def publish(buckets: DataFrame, batch_id: int) -> None:
        query_id = checkpoint_query_id(checkpoint)  # Spark wrote it before the first batch; stable on restart
        if query_id is None:
            raise RuntimeError(f"no streaming query id in {checkpoint}/metadata")
        snapshot = abuse_snapshot(buckets, threshold, window_s, bucket_s).orderBy("address")  # a total order
        writer = snapshot.coalesce(1).write.format("slipstream").mode("append").options(**sink)
        writer.option("queryId", query_id).option("batchId", str(batch_id)).save()
        status = read_status(sink)
        if status is not None and status.get("note") != "published":
            log.warning("abuse list, batch %s: %s", batch_id, status.get("note"))

    return (
        abuse_buckets_stream(spark, recording, bucket_s)
        .writeStream.outputMode("complete")
        .foreachBatch(publish)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger_s} seconds")
        .start()
    )
