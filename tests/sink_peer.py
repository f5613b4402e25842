"""Real processes for tests/test_pipeline_sink.py.

``query REC CHECKPOINT DRIVER_DIR STREAM``: a streaming query (its own local Spark, its own JVM) that
publishes the recording's ``stream_stats`` rows through the ``slipstream`` sink; prints ``started``,
then ``done`` once everything available is published. A test kills it (the whole process group).

``server DRIVER_DIR STREAM ADDRESS``: a server's side of the abuse list: an ``AbuseListSubscriber`` on
an external driver; prints one JSON line once ``ADDRESS`` is refused (seconds from the subscriber's
creation, the snapshot's version and entries), then waits to be killed.
"""

from __future__ import annotations

import json
import sys
import time

LOADED = time.monotonic()  # before slipstream is imported: what a server's start-up costs is counted too


def query(recording: str, checkpoint: str, driver_dir: str, stream: str) -> None:
    from slipstream.pipeline.session import spark_session

    spark = spark_session("local[2]", app_name="slipstream-sink-peer")
    stream_df = spark.readStream.format("slipstream").option("kind", "stream_stats").load(recording)
    running = (
        stream_df.select("position", "messages")
        .writeStream.format("slipstream")
        .option("channel", "aeron:ipc")
        .option("stream", stream)
        .option("dir", driver_dir)
        .option("type", "Stat")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    print("started", flush=True)
    running.processAllAvailable()
    print("done", flush=True)
    running.stop()


def server(driver_dir: str, stream: str, address: str) -> None:
    from slipstream import Context
    from slipstream.telemetry.abuse import AbuseListSubscriber

    with Context(driver_dir, driver="external") as context:
        started = time.monotonic()
        listed = AbuseListSubscriber(context, "aeron:ipc", int(stream))
        while listed.admit(address):
            if time.monotonic() - started > 30:
                print(json.dumps({"error": "not listed within 30 s"}), flush=True)
                return
            if listed.poll() == 0:
                time.sleep(0.001)
        elapsed = time.monotonic() - started
        entries = {a: [e.rejections, e.expires_ns] for a, e in listed.entries.items()}
        since_start = time.monotonic() - LOADED
        print(json.dumps({"seconds": elapsed, "since_start": since_start, "version": listed.version,
                          "entries": entries}), flush=True)  # fmt: skip
        time.sleep(120)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    {"query": query, "server": server}[role](*args)
