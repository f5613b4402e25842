"""``python -m bench.pipeline``: the Spark report against DuckDB on one machine, and the cost of recording.

Three parts, all by default (``--part report|recording|api|all``):

* **report**: synthetic telemetry (captured messages, connection events and stats, driver counters,
  loss reports, error logs) written as real recording segments, then the report's tables
  (``jobs.TABLES``) computed at each ``--rows`` size, in one run, by Spark on ``local[2]`` (through the
  ``slipstream`` source, ``jobs.build_tables``) and by DuckDB on two threads (the same SQL tables,
  ``bench/pipeline_duckdb.py``, reading the same Parquet segments). Each engine writes its tables as
  Parquet; they are compared row for row at every size. Spark's cold start-up is timed on its own; at
  the largest size the per-connection RTT percentiles are timed exact and approximate in both engines.
  (The single-process pyarrow comparison of earlier runs is dropped: it computed fewer, approximate
  tables; DuckDB computes the same ones.)
* **api**: what ``Recorder.record`` / ``append`` cost the calling thread (the network layer's hot path).
* **recording**: a 32-byte-message IPC stream (publisher and subscriber processes, a standalone
  driver) with and without ``slipstream record`` capturing the same stream; interleaved rounds,
  median throughput, and the overhead in percent (target <= 10 %). The recorder's CPU is reported
  whole (start-up included) and split: the capture's polling loop, the only part that competes with
  the stream, and the conversion, which runs at idle priority in a child process.

Results print as a table and go to one JSON file (``bench/results/pipeline-<date>.json``, or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- synthetic telemetry --------------------------------------------------------------------------------


def make_recording(root: Path, rows: int, *, seed: int = 7, segment_rows: int = 1_000_000) -> dict[str, int]:
    """Write ``rows`` synthetic rows as finalized segments in the partitioned layout
    (``ROOT/<kind>/date=.../hour=.../host=<name>/<writer>.<seq>.parquet``, as recorders write them):
    90 % captured messages on 8 streams (10 typed kinds of message, empty payloads: the report reads
    sizes, not bytes), 8 % connection stats (100 per connection), 2 % connection events (a third of them
    refused handshakes from 250 hosts, each time from a new port), of which 0.1 % driver counter samples
    and 0.01 % each loss-report and error-log samples (so every table of the report has rows). Ten
    minutes of traffic on four servers (``local`` ``srv-0`` .. ``srv-3``): each server's connection
    events and stats are in its own ``host=`` partition, written by its own recorder; captured messages
    and the driver's kinds by a fifth host, ``bench-capture``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from slipstream.telemetry import BUILTIN_SCHEMAS
    from slipstream.telemetry.segments import META_HOST, META_HOUR, arrow_schema, hour_of, partition_dir, write_segment

    rng = np.random.default_rng(seed)
    counts = {"captured": rows * 90 // 100, "connection_stats": rows * 8 // 100}
    counts["driver_counters"] = rows // 1000
    counts["loss_report"] = counts["error_log"] = rows // 10_000
    counts["connection_events"] = rows - sum(counts.values())
    start_ns = 1_700_000_000 * 10**9
    span_ns = 600 * 10**9  # ten minutes of traffic
    hour = hour_of(start_ns / 1e9)  # the ten minutes fall in one UTC hour: one date= and hour= partition
    assert hour == hour_of((start_ns + span_ns) / 1e9)
    next_seq: dict[tuple[str, str], int] = {}

    def write(kind: str, n: int, build: Any, *, per_server: bool = False) -> None:
        for first in range(0, n, segment_rows):
            size = min(segment_rows, n - first)
            columns = build(first, size)
            base = arrow_schema(BUILTIN_SCHEMAS[kind])
            table = pa.Table.from_pydict(columns, schema=base)
            hosts = sorted(set(table["local"].to_pylist())) if per_server else ["bench-capture"]
            for name in hosts:
                part = table.filter(pc.equal(table["local"], name)) if per_server else table
                writer = f"rec-{name}-1"
                seq = next_seq.get((writer, kind), 0)
                next_seq[writer, kind] = seq + 1
                schema = arrow_schema(BUILTIN_SCHEMAS[kind], writer)
                schema = schema.with_metadata({**schema.metadata, META_HOUR: hour.encode(), META_HOST: name.encode()})
                directory = partition_dir(root, kind, hour, name)
                write_segment(part.cast(schema), directory, seq, fsync=False, writer=writer)

    types = np.array([f"Type{i}" for i in range(10)], dtype=object)

    def captured(first: int, n: int) -> dict[str, Any]:
        stream = rng.integers(0, 8, n)
        return {
            "timestamp_ns": start_ns + np.sort(rng.integers(0, span_ns, n)),
            "channel": np.where(stream % 2 == 0, "aeron:ipc", "aeron:udp?endpoint=10.0.0.1:40123").astype(object),
            "stream_id": 1000 + stream,
            "session_id": 7 + stream,
            "position": (first + np.arange(n)) * 64,
            "size": rng.integers(16, 1024, n),
            "payload": pa.array([b""] * n, type=pa.binary()),
            "message_type": types[rng.zipf(1.6, n) % 10],
        }

    connections = max(1, counts["connection_stats"] // 100)

    def stats(first: int, n: int) -> dict[str, Any]:
        conn = rng.integers(0, connections, n)
        tick = first + np.arange(n)
        return {
            "timestamp_ns": start_ns + tick * (span_ns // counts["connection_stats"]),  # over the ten minutes
            "connection_id": conn,
            "address": np.char.add("10.1.0.", (conn % 250).astype(str)).astype(object),
            "tag": np.char.add("app-", (conn % 5).astype(str)).astype(object),  # top talkers by tag
            "messages_sent": tick,
            "messages_received": tick,
            "bytes_sent": tick * 32,
            "bytes_received": tick * 32,
            "rtt_ns": rng.integers(20_000, 200_000, n),
            "naks_sent": np.zeros(n, dtype=np.int64),
            "naks_received": np.zeros(n, dtype=np.int64),
            "retransmits": np.zeros(n, dtype=np.int64),
            "bytes_lost": rng.integers(0, 64, n),
            "back_pressure_events": np.zeros(n, dtype=np.int64),
            "side": np.full(n, "server", dtype=object),
            "local": np.char.add("srv-", (conn % 4).astype(str)).astype(object),
        }

    def events(first: int, n: int) -> dict[str, Any]:
        kind = rng.integers(0, 3, n)  # 0 accepted, 1 disconnected, 2 rejected
        conn = rng.integers(0, connections, n)
        names = np.array(["handshake_accepted", "disconnected", "handshake_rejected"], dtype=object)
        host = rng.integers(0, 250, n)  # refused peers come back from new ports; a tenth over IPv6
        v4 = np.char.add("203.0.113.", host.astype(str))
        v6 = np.char.add(np.char.add("[2001:db8::", host.astype(str)), "]")
        port = np.char.add(":", rng.integers(1024, 65536, n).astype(str))
        offender = np.char.add(np.where(host % 10 == 0, v6, v4), port).astype(object)
        return {
            "timestamp_ns": start_ns + np.sort(rng.integers(0, span_ns, n)),
            "event": names[kind],
            "side": np.full(n, "server", dtype=object),
            "address": np.where(kind == 2, offender, np.char.add("10.1.0.", (conn % 250).astype(str)).astype(object)),
            "tag": np.full(n, "", dtype=object),
            "transport": np.full(n, "udp", dtype=object),
            "connection_id": pa.array(np.where(kind == 2, 0, conn), mask=kind == 2),
            "reason": pa.array(np.array(["ip_filter", "bad_key", "too_many"], dtype=object)[conn % 3], mask=kind != 2),
            "cause": pa.array(np.full(n, "closed", dtype=object), mask=kind != 1),
            "local": np.char.add("srv-", (conn % 4).astype(str)).astype(object),
        }

    drivers = np.array(["driver-a", "driver-b"], dtype=object)

    def counters(first: int, n: int) -> dict[str, Any]:
        tick = first + np.arange(n)  # distinct timestamps: "last value" is well defined
        counter = tick % 50
        return {
            "timestamp_ns": start_ns + tick * 1000,
            "driver": drivers[(tick // 50) % 2],
            "counter_id": counter,
            "type_id": counter % 5,
            "type_name": np.char.add("type-", (counter % 5).astype(str)).astype(object),
            "label": np.char.add("counter ", tick.astype(str)).astype(object),
            "value": tick,
            "registration_id": counter * 10,
            "session_id": pa.array(counter, mask=counter % 2 == 0),
            "stream_id": pa.array(1000 + counter % 8, mask=counter % 2 == 0),
            "channel": pa.array(np.full(n, "aeron:ipc", dtype=object), mask=counter % 2 == 0),
        }

    def loss(first: int, n: int) -> dict[str, Any]:
        tick = first + np.arange(n)
        entry = tick % 12
        return {
            "timestamp_ns": start_ns + tick * 1000,
            "driver": drivers[entry % 2],
            "observation_count": tick,
            "total_bytes_lost": tick * 64 + entry,
            "first_observation_ms": 1_700_000_000_000 + entry,
            "last_observation_ms": 1_700_000_000_000 + tick,
            "session_id": 7 + entry % 4,
            "stream_id": 1000 + entry % 3,
            "channel": np.full(n, "aeron:udp?endpoint=10.0.0.1:40123", dtype=object),
            "source": np.char.add("10.1.0.", (entry % 6).astype(str)).astype(object),
        }

    def errors(first: int, n: int) -> dict[str, Any]:
        tick = first + np.arange(n)
        text = tick % 7
        return {
            "timestamp_ns": start_ns + tick * 1000,
            "driver": drivers[text % 2],
            "observation_count": tick + 1,
            "first_observation_ms": 1_700_000_000_000 + text,
            "last_observation_ms": 1_700_000_000_000 + tick,
            "text": np.char.add("error ", text.astype(str)).astype(object),
        }

    write("captured", counts["captured"], captured)
    write("connection_stats", counts["connection_stats"], stats, per_server=True)
    write("connection_events", counts["connection_events"], events, per_server=True)
    write("driver_counters", counts["driver_counters"], counters)
    write("loss_report", counts["loss_report"], loss)
    write("error_log", counts["error_log"], errors)
    return counts


# -- the report: Spark against DuckDB -------------------------------------------------------------------


def _spark_rtt_percentiles(spark: Any, root: Path, out: Path, key: str, exact: bool) -> float:
    """Seconds to compute and write the RTT percentiles per ``key`` through the source, exact
    (``percentile``, as the report's sessions table) or approximate (``percentile_approx``, its
    default accuracy), the three from one state either way."""
    from pyspark.sql import functions as F

    from slipstream.pipeline.jobs import load, server_side

    stats = server_side(load(spark, root, "connection_stats"))
    qs = F.array(*(F.lit(q) for q in (0.5, 0.95, 0.99)))
    values = F.percentile("rtt_ns", qs) if exact else F.percentile_approx("rtt_ns", qs).cast("array<double>")
    names = ("rtt_p50_ns", "rtt_p95_ns", "rtt_p99_ns")
    frame = (
        stats.groupBy(F.expr(key.replace("//", "div")).alias("key"))  # DuckDB's integer division is Spark's div
        .agg(F.count("rtt_ns").alias("samples"), values.alias("q"))
        .select("key", "samples", *(F.col("q")[i].alias(name) for i, name in enumerate(names)))
    )
    started = time.monotonic()
    frame.orderBy("key").coalesce(1).write.mode("overwrite").parquet(str(out))
    return time.monotonic() - started


def _duckdb_rtt_percentiles(root: Path, out: Path, key: str, percentiles: str) -> float:
    """The same through DuckDB (``interpolated``: ``quantile_cont``, or ``approx``: ``approx_quantile``)."""
    from bench import pipeline_duckdb as duck

    con = duck.connect(root, percentiles=percentiles)
    try:
        started = time.monotonic()
        con.execute(f"COPY ({duck.query(duck.rtt_percentiles(key))}) TO '{out}' (FORMAT parquet)")
        return time.monotonic() - started
    finally:
        con.close()


def percentile_costs(spark: Any, root: Path, scratch: Path) -> dict[str, Any]:
    """Exact against approximate RTT percentiles, per connection and per minute, in both engines, and
    how far the approximations land from the exact values."""
    from bench import pipeline_duckdb as duck

    result: dict[str, Any] = {}
    for grouping, key in duck.RTT_GROUPINGS.items():
        entry: dict[str, Any] = {}
        tables: dict[str, list[dict[str, Any]]] = {}
        for engine in ("spark", "duckdb"):
            for mode in ("exact", "approx"):
                out = scratch / f"{grouping}-{engine}-{mode}" / ("part" if engine == "spark" else "rtt.parquet")
                out.parent.mkdir(parents=True, exist_ok=True)
                if engine == "spark":
                    seconds = _spark_rtt_percentiles(spark, root, out, key, exact=mode == "exact")
                else:
                    seconds = _duckdb_rtt_percentiles(root, out, key, "interpolated" if mode == "exact" else mode)
                entry[f"{engine}_{mode}_s"] = seconds
                tables[f"{engine}_{mode}"] = duck.rows(out)
                log(f"  RTT percentiles {grouping}, {engine} {mode}: {seconds:.2f} s")
        exact = tables["spark_exact"]
        entry["groups"] = len(exact)
        entry["samples_per_group"] = sum(row["samples"] for row in exact) / max(1, len(exact))
        entry["exact_engines_agree"] = not duck.compare(exact, tables["duckdb_exact"], percentile_rel=1e-9)
        for name in ("spark_approx", "duckdb_approx"):  # how far the approximations land from the exact values
            worst = 0.0
            for want, have in zip(exact, tables[name], strict=True):
                for column in ("rtt_p50_ns", "rtt_p95_ns", "rtt_p99_ns"):
                    worst = max(worst, abs(have[column] - want[column]) / abs(want[column]))
            entry[f"{name}_max_rel_error"] = worst
        result[grouping] = entry
    return result


def run_report_part(
    sizes: list[int],
    scratch: Path,
    threshold: int,
    *,
    stop: bool = True,
    percentiles_at: int | None = None,
    warmup_rows: int = 20_000,
    repeats: int = 1,
) -> dict[str, Any]:
    """Spark and DuckDB over the same recording at each size, ``repeats`` times each (medians); the
    RTT percentiles both ways at ``percentiles_at`` rows (default: the largest size). Spark's cold
    start is timed apart: the session, a first tiny job, and a first report over ``warmup_rows`` (its
    JIT and its Python workers warm up there, not in the first measured size)."""
    import duckdb
    import pyspark
    from pyspark.sql import functions as F

    from bench import pipeline_duckdb as duck
    from slipstream.pipeline.jobs import TABLES, build_tables
    from slipstream.pipeline.options import ReportOptions
    from slipstream.pipeline.session import spark_session

    missing = [name for name in TABLES if name not in duck.TABLES]
    if missing:
        raise SystemExit(f"bench/pipeline_duckdb.py has no SQL for the report's tables {missing}: add it")
    started = time.monotonic()
    spark = spark_session("local[2]", app_name="slipstream-bench")
    startup_s = time.monotonic() - started
    log(f"Spark local[2] start-up: {startup_s:.1f} s")
    # The first job in a session also starts Python workers: time one tiny job to show that cost apart.
    started = time.monotonic()
    spark.range(10).select(F.sum("id")).collect()
    first_job_s = time.monotonic() - started
    results: dict[str, Any] = {
        "spark_startup_s": startup_s,
        "first_tiny_job_s": first_job_s,
        "pyspark": pyspark.__version__,
        "duckdb": duckdb.__version__,
        "duckdb_threads": 2,
        "tables": list(TABLES),
        "sizes": [],
    }
    options = ReportOptions(abuse_threshold=threshold)
    if warmup_rows:
        make_recording(scratch / "warmup", warmup_rows)
        started = time.monotonic()
        build_tables(spark, scratch / "warmup", scratch / "warmup-spark", options, collect=False)
        results["first_report_s"] = time.monotonic() - started
        log(f"Spark's first report ({warmup_rows} rows, warm-up): {results['first_report_s']:.1f} s")
        duck.build_tables(scratch / "warmup", scratch / "warmup-duckdb")
        for path in ("warmup", "warmup-spark", "warmup-duckdb"):
            shutil.rmtree(scratch / path, ignore_errors=True)
    percentiles_at = percentiles_at or max(sizes)
    for rows in sizes:
        root = scratch / f"rec-{rows}"
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        counts = make_recording(root, rows)
        generate_s = time.monotonic() - started
        log(f"{rows} rows generated in {generate_s:.1f} s ({counts})")
        spark_runs: list[float] = []
        duck_runs: list[float] = []
        spark_tables: list[dict[str, float]] = []
        duck_tables: list[dict[str, float]] = []
        for _ in range(repeats):  # interleaved, so a slow phase of the machine hits both engines
            started = time.monotonic()
            tables = build_tables(spark, root, scratch / f"spark-{rows}", options, collect=False)
            spark_runs.append(time.monotonic() - started)
            spark_tables.append(tables.seconds)
            started = time.monotonic()
            duck_tables.append(
                duck.build_tables(
                    root,
                    scratch / f"duckdb-{rows}",
                    abuse_threshold=options.abuse_threshold,
                    window_s=options.window_s,
                    top=options.top,
                )
            )
            duck_runs.append(time.monotonic() - started)
            log(f"  Spark local[2]: {spark_runs[-1]:.1f} s, DuckDB 2 threads: {duck_runs[-1]:.2f} s")
        spark_s, duck_s = statistics.median(spark_runs), statistics.median(duck_runs)
        differences: dict[str, list[str]] = {}
        table_rows: dict[str, int] = {}
        for name in TABLES:
            spark_rows = duck.rows(tables.paths[name])
            table_rows[name] = len(spark_rows)
            found = duck.compare(spark_rows, duck.rows(scratch / f"duckdb-{rows}" / f"{name}.parquet"),
                                 duck.TABLES[name].percentiles)  # fmt: skip
            if found:
                differences[name] = found
        entry = {
            "rows": rows,
            "input_rows": counts,
            "generate_s": generate_s,
            "spark_s": spark_s,
            "spark_runs_s": spark_runs,
            "spark_per_table_s": {name: statistics.median(run[name] for run in spark_tables) for name in TABLES},
            "duckdb_s": duck_s,
            "duckdb_runs_s": duck_runs,
            "duckdb_per_table_s": {name: statistics.median(run[name] for run in duck_tables) for name in TABLES},
            "spark_s_per_million_rows": spark_s / (rows / 1e6),
            "duckdb_s_per_million_rows": duck_s / (rows / 1e6),
            "ratio_spark_over_duckdb": spark_s / duck_s,
            "table_rows": table_rows,
            "load_average_after": os.getloadavg(),  # the machine is shared: how busy it was
            "tables_agree": not differences,
            "differences": differences,
        }
        log(f"  Spark/DuckDB {spark_s / duck_s:.1f}x; tables agree: {not differences} {differences or ''}")
        if rows == percentiles_at:
            entry["rtt_percentiles"] = percentile_costs(spark, root, scratch / f"pct-{rows}")
        results["sizes"].append(entry)
        for path in (root, scratch / f"spark-{rows}", scratch / f"duckdb-{rows}", scratch / f"pct-{rows}"):
            shutil.rmtree(path, ignore_errors=True)
    if stop:
        spark.stop()
    return results


# -- recording overhead ---------------------------------------------------------------------------------

PUBLISHER = textwrap.dedent(
    """
    import sys, time
    from slipstream import Context, BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION
    directory, stream, count, subscribers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with Context(directory, driver="external") as ctx:
        pub = ctx.add_exclusive_publication("aeron:ipc", stream)
        deadline = time.monotonic() + 30
        while not pub.is_connected:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.5)  # every subscriber's image is attached
        message = b"x" * 32
        offer = pub.offer
        start = time.perf_counter()
        for _ in range(count):
            while offer(message) < 0:
                pass
        print(count / (time.perf_counter() - start), flush=True)
        time.sleep(0.5)
    """
)

SUBSCRIBER = textwrap.dedent(
    """
    import sys, time
    from slipstream import Context
    directory, stream, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    got = [0]
    def handler(buffer, header):
        got[0] += 1
    with Context(directory, driver="external") as ctx:
        sub = ctx.add_subscription("aeron:ipc", stream)
        print("ready", flush=True)
        poll = sub.poll
        deadline = time.monotonic() + 120
        while got[0] == 0:
            poll(handler, 256)
        start = time.perf_counter()
        while got[0] < count and time.monotonic() < deadline:
            poll(handler, 256)
        print((got[0] - 1) / (time.perf_counter() - start), flush=True)
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _one_round(
    directory: Path, stream: int, count: int, record: bool, out: Path, direct_io: bool = False
) -> dict[str, Any]:
    env = _env()
    recorder = None
    if record:
        recorder = subprocess.Popen(
            [sys.executable, "-m", "slipstream", "record", "--dir", str(directory), "--channel", "aeron:ipc",
             "--stream", str(stream), "--output", str(out), *(["--direct-io"] if direct_io else [])],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert recorder.stdout is not None
        line = recorder.stdout.readline()
        if not line.startswith("recording"):
            raise RuntimeError(f"slipstream record did not start: {line!r}")
    subscriber = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, str(directory), str(stream), str(count)], stdout=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    assert subscriber.stdout is not None
    assert subscriber.stdout.readline().strip() == "ready"
    publisher = subprocess.run(
        [sys.executable, "-c", PUBLISHER, str(directory), str(stream), str(count), "2" if record else "1"],
        capture_output=True, text=True, env=env, timeout=180,
    )  # fmt: skip
    if publisher.returncode != 0:
        raise RuntimeError(f"publisher failed: {publisher.stderr[-2000:]}")
    sub_out, _ = subscriber.communicate(timeout=180)
    result = {"publisher_rate": float(publisher.stdout.split()[-1]), "subscriber_rate": float(sub_out.split()[-1])}
    if recorder is not None:
        recorder.send_signal(signal.SIGTERM)
        rec_out, _ = recorder.communicate(timeout=60)
        result["recorder"] = rec_out.strip().splitlines()[-1]
    return result


def run_recording_part(scratch: Path, count: int, rounds: int, direct_io: bool = False) -> dict[str, Any]:
    directory = Path("/dev/shm") / f"slipstream-bench-rec-{os.getpid()}"
    driver = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "driver", "--dir", str(directory)],
        stdout=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        driver.stdout.readline()
        plain: list[float] = []
        recorded: list[float] = []
        notes = []
        for r in range(rounds):
            for record in (False, True):
                out = scratch / f"capture-{r}"
                result = _one_round(directory, 3000 + r * 2 + record, count, record, out, direct_io)
                (recorded if record else plain).append(result["subscriber_rate"])
                log(f"round {r + 1} {'with' if record else 'without'} recording: "
                    f"{result['subscriber_rate'] / 1e6:.2f} M msg/s {result.get('recorder', '')}")  # fmt: skip
                if record:
                    notes.append(result["recorder"])
                    shutil.rmtree(out, ignore_errors=True)
        base, with_rec = statistics.median(plain), statistics.median(recorded)
        cpu = [float(line.rsplit("cpu ", 1)[1].split()[0]) for line in notes if "cpu " in line]
        polling = [float(line.split("of which polling ", 1)[1].split()[0]) for line in notes if "polling " in line]
        conversion = [float(line.split("conversion ", 1)[1].split()[0]) for line in notes if "conversion " in line]
        return {
            "messages": count,
            "size": 32,
            "direct_io": direct_io,
            "without_recording_msgs_per_s": plain,
            "with_recording_msgs_per_s": recorded,
            "median_without": base,
            "median_with": with_rec,
            "overhead_percent": 100 * (1 - with_rec / base),
            "paired_ratio_median": statistics.median(w / p for w, p in zip(recorded, plain, strict=True)),
            "spread_without": [min(plain), max(plain)],
            "recorder_cpu_s": cpu,
            "recorder_cpu_us_per_message": 1e6 * statistics.median(cpu) / count if cpu else None,
            "capture_polling_cpu_s": polling,
            "capture_polling_ns_per_message": 1e9 * statistics.median(polling) / count if polling else None,
            "conversion_cpu_s": conversion,
            "recorder_lines": notes,
        }
    finally:
        driver.send_signal(signal.SIGINT)
        try:
            driver.wait(20)
        except subprocess.TimeoutExpired:
            driver.kill()
        shutil.rmtree(directory, ignore_errors=True)


def run_api_part(scratch: Path, count: int = 200_000) -> dict[str, Any]:
    """What recording one row costs: the call on the caller's thread (making a ``ConnectionStats`` and
    ``record`` -ing it, or ``append(schema, row)`` with a tuple), and the writer's conversion and write
    per row, which runs on another thread but shares the GIL (in CPython, the process's cost too)."""
    from slipstream.telemetry import ConnectionStats, Recorder, RecorderConfig

    schema = ConnectionStats.SCHEMA
    results: dict[str, Any] = {"calls": count}
    config = RecorderConfig(flush_interval_s=3600, max_pending_rows=4 * count)
    with Recorder(scratch / "api", writer_id="api", config=config) as recorder:
        started = time.perf_counter()
        for i in range(count):  # as the network layer does: make the record, hand it over, drop it
            recorder.record(ConnectionStats(i, 7, "10.0.0.1:4000", "bench", i, i, 32 * i, 32 * i, rtt_ns=40_000))
        results["record_ns_per_call"] = (time.perf_counter() - started) / count * 1e9
        started = time.perf_counter()
        recorder.flush()
        results["writer_ns_per_row_record"] = (time.perf_counter() - started) / count * 1e9
        started = time.perf_counter()
        for i in range(count):
            row = (i, 7, "10.0.0.1:4000", "bench", i, i, 32 * i, 32 * i, 40_000, 0, 0, 0, 0, 0)
            recorder.append(schema, row)
        results["append_ns_per_call"] = (time.perf_counter() - started) / count * 1e9
        results["dropped"] = recorder.dropped_rows
    log(f"Recorder.record {results['record_ns_per_call']:.0f} ns/call, append {results['append_ns_per_call']:.0f} "
        f"ns/call; the writer {results['writer_ns_per_row_record']:.0f} ns/row")  # fmt: skip
    return results


def print_report(report: dict[str, Any]) -> None:
    """The report part's table; adds the marginal cost per extra million rows to ``report``."""
    startup, first = report["spark_startup_s"], report["first_tiny_job_s"]
    warm = (
        f", a first report of the tiny warm-up recording {report['first_report_s']:.1f} s"
        if "first_report_s" in report
        else ""
    )
    print(f"Spark local[2] cold start-up: {startup:.1f} s (then a first tiny job {first:.1f} s{warm}), not in the "
          f"figures below; DuckDB {report['duckdb']} on 2 threads, same tables, same Parquet segments")  # fmt: skip
    print(f"{'rows':>10} {'Spark':>9} {'DuckDB':>9} {'Spark s/M rows':>15} {'DuckDB s/M rows':>16} "
          f"{'Spark/DuckDB':>13}  tables agree")  # fmt: skip
    for entry in report["sizes"]:
        print(f"{entry['rows']:>10} {entry['spark_s']:>7.1f} s {entry['duckdb_s']:>7.2f} s "
              f"{entry['spark_s_per_million_rows']:>15.2f} {entry['duckdb_s_per_million_rows']:>16.3f} "
              f"{entry['ratio_spark_over_duckdb']:>12.1f}x  {'yes' if entry['tables_agree'] else 'NO'}")  # fmt: skip
    sizes = report["sizes"]
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        per_m = 1e6 / (b["rows"] - a["rows"])
        slopes = {engine: (b[f"{engine}_s"] - a[f"{engine}_s"]) * per_m for engine in ("spark", "duckdb")}
        report["marginal_s_per_million_rows"] = slopes
        print(f"marginal cost per extra million rows ({a['rows']} -> {b['rows']}): Spark {slopes['spark']:.2f} s, "
              f"DuckDB {slopes['duckdb']:.3f} s")  # fmt: skip
    for entry in sizes:
        spark_top = sorted(entry["spark_per_table_s"].items(), key=lambda item: -item[1])[:3]
        print(f"  {entry['rows']} rows, costliest tables in Spark: "
              + ", ".join(f"{name} {seconds:.1f} s (DuckDB {entry['duckdb_per_table_s'][name]:.2f} s)"
                          for name, seconds in spark_top))  # fmt: skip
        for grouping, pct in entry.get("rtt_percentiles", {}).items():
            print(f"RTT p50/p95/p99 {grouping.replace('_', ' ')} at {entry['rows']} rows ({pct['groups']} groups "
                  f"of {pct['samples_per_group']:.0f} samples): Spark exact {pct['spark_exact_s']:.1f} s, "
                  f"approximate {pct['spark_approx_s']:.1f} s; DuckDB exact {pct['duckdb_exact_s']:.2f} s, "
                  f"approximate {pct['duckdb_approx_s']:.2f} s; largest relative error of the approximations: "
                  f"Spark {pct['spark_approx_max_rel_error']:.2%}, "
                  f"DuckDB {pct['duckdb_approx_max_rel_error']:.2%}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("report", "recording", "api", "all"), default="all")
    parser.add_argument("--rows", nargs="+", default=["1000000,5000000,20000000"],
                        help="report sizes in rows, comma- or space-separated (default 1M, 5M, 20M)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="report runs per engine and size, median (default 3)")
    parser.add_argument("--messages", type=int, default=2_000_000, help="messages per recording round (default 2M)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved recording rounds (default 3)")
    parser.add_argument(
        "--direct-io", action="store_true", help="the capture writes with O_DIRECT (slipstream record --direct-io)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the benchmark works")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.rows = [int(size) for sizes in args.rows for size in sizes.split(",") if size]
    if args.quick:
        args.rows, args.messages, args.rounds, args.repeats = [20_000], 100_000, 1, 1
    result: dict[str, Any] = {"started": datetime.now().isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                              "load_average": os.getloadavg()}  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="slipstream-bench-pipeline-"))
    try:
        if args.part in ("report", "all"):
            result["report"] = run_report_part(args.rows, scratch, threshold=5, repeats=args.repeats)
        if args.part in ("recording", "all"):
            result["recording"] = run_recording_part(scratch, args.messages, args.rounds, args.direct_io)
        if args.part in ("api", "all"):
            result["api"] = run_api_part(scratch, 20_000 if args.quick else 200_000)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\nslipstream pipeline benchmark")
    if "report" in result:
        print_report(result["report"])
    if "recording" in result:
        rec = result["recording"]
        print(f"IPC 32 B: {rec['median_without'] / 1e6:.2f} M msg/s without recording, "
              f"{rec['median_with'] / 1e6:.2f} M msg/s while `slipstream record` captures it: "
              f"overhead {rec['overhead_percent']:.1f} % (target <= 10 %); the recorder process used "
              f"{rec['recorder_cpu_us_per_message']:.2f} us of CPU per message, start-up included")  # fmt: skip
        if rec.get("capture_polling_ns_per_message") is not None:
            print(f"  of which the capture's polling loop (the only part that runs during the stream, start-up "
                  f"excluded): {rec['capture_polling_ns_per_message']:.0f} ns per message; the conversion "
                  f"(idle priority, after or beside the stream) "
                  f"{statistics.median(rec['conversion_cpu_s']):.2f} s")  # fmt: skip
        low, high = rec["spread_without"]
        print(f"  paired rounds (with/without) median {rec['paired_ratio_median']:.2f}; rounds without recording "
              f"ranged {low / 1e6:.2f}-{high / 1e6:.2f} M msg/s on this machine")  # fmt: skip
    if "api" in result:
        api = result["api"]
        print(f"recording one row: Recorder.record {api['record_ns_per_call']:.0f} ns, Recorder.append "
              f"{api['append_ns_per_call']:.0f} ns on the caller's thread; the writer thread then spends "
              f"{api['writer_ns_per_row_record']:.0f} ns per row (Arrow conversion, journal, fsync)")  # fmt: skip
    out = args.out or RESULTS / f"pipeline-{datetime.now():%Y-%m-%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
