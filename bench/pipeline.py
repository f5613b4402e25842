"""``python -m bench.pipeline``: the Spark report against single-process pyarrow, and the cost of recording.

Three parts, all by default (``--part report|recording|api|all``):

* **report**: synthetic telemetry (captured messages, connection events, connection stats) written
  as real recording segments, then the report's tables computed by Spark on ``local[2]`` (through
  the ``slipstream`` source) and by pyarrow in this one process (through ``telemetry``'s reader), at
  each ``--rows`` size, so the crossover shows. Spark's cold start-up is timed on its own.
* **api**: what ``Recorder.record`` / ``append`` cost the calling thread (the network layer's hot path).
* **recording**: a 32-byte-message IPC stream (publisher and subscriber processes, a standalone
  driver) with and without ``slipstream record`` capturing the same stream; interleaved rounds,
  median throughput, and the overhead in percent (target <= 10 %). The recorder's CPU is reported
  whole (start-up included) and split: the capture's polling loop, the only part that competes with
  the stream, and the conversion, which runs at idle priority in a child process.

Results print as a table and go to one JSON file (``bench/results/pipeline-<date>.json``).
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
    """Write ``rows`` synthetic rows as finalized segments: 90 % captured messages on 8 streams (10 typed
    kinds of message, empty payloads: the report reads sizes, not bytes), 8 % connection stats, 2 %
    connection events (a third of them refused handshakes from 1000 addresses)."""
    import numpy as np
    import pyarrow as pa

    from slipstream.telemetry import BUILTIN_SCHEMAS
    from slipstream.telemetry.segments import arrow_schema, write_segment

    rng = np.random.default_rng(seed)
    counts = {"captured": rows * 90 // 100, "connection_stats": rows * 8 // 100}
    counts["connection_events"] = rows - counts["captured"] - counts["connection_stats"]
    start_ns = 1_700_000_000 * 10**9
    span_ns = 600 * 10**9  # ten minutes of traffic

    def write(kind: str, n: int, build: Any) -> None:
        schema = arrow_schema(BUILTIN_SCHEMAS[kind], "bench")
        kind_dir = root / "bench" / kind
        kind_dir.mkdir(parents=True, exist_ok=True)
        for seq, first in enumerate(range(0, n, segment_rows)):
            size = min(segment_rows, n - first)
            columns = build(first, size)
            write_segment(pa.Table.from_pydict(columns, schema=schema), kind_dir, seq, fsync=False)

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
            "timestamp_ns": start_ns + tick * 1000,
            "connection_id": conn,
            "address": np.char.add("10.1.0.", (conn % 250).astype(str)).astype(object),
            "tag": np.full(n, "client", dtype=object),
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
        offender = np.char.add("203.0.113.", (rng.integers(0, 1000, n) % 250).astype(str)).astype(object)
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

    write("captured", counts["captured"], captured)
    write("connection_stats", counts["connection_stats"], stats)
    write("connection_events", counts["connection_events"], events)
    return counts


# -- the same tables, single process --------------------------------------------------------------------


def pyarrow_tables(root: Path, threshold: int) -> dict[str, Any]:
    """The report's main tables with pyarrow compute (exact percentiles are not in pyarrow's grouped
    aggregates: its t-digest gives approximate ones, which is the one difference)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from slipstream.telemetry import Recording

    recording = Recording(root)
    captured = recording.read("captured", columns=["timestamp_ns", "channel", "stream_id", "session_id", "size",
                                                   "message_type"])  # fmt: skip
    second = pc.divide(captured.column("timestamp_ns"), pa.scalar(1_000_000_000, pa.int64()))
    throughput = (
        captured.append_column("second", second)
        .group_by(["channel", "stream_id", "session_id", "second"])
        .aggregate([("size", "count"), ("size", "sum")])
    )
    typed = captured.set_column(
        captured.schema.get_field_index("message_type"), "message_type",
        pc.fill_null(captured.column("message_type"), "(raw)"),
    )  # fmt: skip
    types = typed.group_by("message_type").aggregate(
        [("size", "count"), ("size", "sum"), ("size", "min"), ("size", "approximate_median"), ("size", "max")]
    )
    events = recording.read("connection_events")
    events = events.filter(pc.equal(events.column("side"), "server"))  # the servers' view, as the report
    rejected_rows = events.filter(pc.equal(events.column("event"), "handshake_rejected"))
    rejected = rejected_rows.group_by(["address", "reason"]).aggregate(
        [("timestamp_ns", "count"), ("timestamp_ns", "min"), ("timestamp_ns", "max")]
    )
    by_address = rejected_rows.group_by("address").aggregate([("timestamp_ns", "count")])
    abuse = by_address.filter(pc.greater_equal(by_address.column("timestamp_ns_count"), threshold))
    stats = recording.read("connection_stats")
    stats = stats.filter(pc.equal(pc.fill_null(stats.column("side"), "server"), "server"))
    totals = stats.group_by("connection_id").aggregate(
        [("messages_sent", "max"), ("messages_received", "max"), ("bytes_sent", "max"), ("bytes_received", "max"),
         ("bytes_lost", "max"), ("timestamp_ns", "max"), ("rtt_ns", "tdigest", pc.TDigestOptions(q=[0.5, 0.95, 0.99]))]
    )  # fmt: skip
    digest = totals.column("rtt_ns_tdigest")
    totals = totals.drop_columns(["rtt_ns_tdigest"])
    for i, name in enumerate(("rtt_p50_ns", "rtt_p95_ns", "rtt_p99_ns")):
        totals = totals.append_column(name, pc.list_element(digest, i))
    opened = (
        events.filter(pc.is_valid(events.column("connection_id")))
        .group_by("connection_id")
        .aggregate([("timestamp_ns", "min"), ("timestamp_ns", "max")])
    )
    sessions = opened.join(totals, "connection_id", join_type="full outer")
    return {
        "stream_throughput": throughput,
        "message_types": types,
        "rejected_handshakes": rejected,
        "abuse_list": abuse,
        "sessions": sessions,
    }


def run_report_part(sizes: list[int], scratch: Path, threshold: int, *, stop: bool = True) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from slipstream.pipeline.jobs import build_tables
    from slipstream.pipeline.options import ReportOptions
    from slipstream.pipeline.session import spark_session

    started = time.monotonic()
    spark = spark_session("local[2]", app_name="slipstream-bench")
    startup_s = time.monotonic() - started
    log(f"Spark local[2] start-up: {startup_s:.1f} s")
    # The first job in a session also starts Python workers: time one tiny job to show that cost apart.
    started = time.monotonic()
    spark.range(10).select(F.sum("id")).collect()
    first_job_s = time.monotonic() - started
    results: dict[str, Any] = {"spark_startup_s": startup_s, "first_tiny_job_s": first_job_s, "sizes": []}
    for rows in sizes:
        root = scratch / f"rec-{rows}"
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        counts = make_recording(root, rows)
        log(f"{rows:,} rows generated in {time.monotonic() - started:.1f} s ({counts})")
        started = time.monotonic()
        tables = build_tables(spark, root, scratch / f"out-{rows}", ReportOptions(abuse_threshold=threshold),
                              collect=False)  # fmt: skip
        spark_s = time.monotonic() - started
        started = time.monotonic()
        arrow = pyarrow_tables(root, threshold)
        arrow_s = time.monotonic() - started
        spark_messages = spark.read.parquet(str(tables.paths["stream_throughput"])).agg(F.sum("messages")).first()[0]
        arrow_messages = arrow["stream_throughput"].column("size_count").to_pylist()
        agree = spark_messages == sum(arrow_messages) == counts["captured"]
        entry = {
            "rows": rows,
            "spark_s": spark_s,
            "spark_per_table_s": tables.seconds,
            "pyarrow_s": arrow_s,
            "ratio_spark_over_pyarrow": spark_s / arrow_s,
            "totals_agree": agree,
        }
        log(f"{rows:,} rows: Spark local[2] {spark_s:.1f} s, pyarrow {arrow_s:.1f} s, totals agree: {agree}")
        results["sizes"].append(entry)
        shutil.rmtree(root, ignore_errors=True)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("report", "recording", "api", "all"), default="all")
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000],
                        help="report sizes in rows (default 100000 1000000 10000000)")  # fmt: skip
    parser.add_argument("--messages", type=int, default=2_000_000, help="messages per recording round (default 2M)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved recording rounds (default 3)")
    parser.add_argument(
        "--direct-io", action="store_true", help="the capture writes with O_DIRECT (slipstream record --direct-io)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the benchmark works")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.messages, args.rounds = [20_000], 100_000, 1
    result: dict[str, Any] = {"started": datetime.now().isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                              "load_average": os.getloadavg()}  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="slipstream-bench-pipeline-"))
    try:
        if args.part in ("report", "all"):
            result["report"] = run_report_part(args.rows, scratch, threshold=5)
        if args.part in ("recording", "all"):
            result["recording"] = run_recording_part(scratch, args.messages, args.rounds, args.direct_io)
        if args.part in ("api", "all"):
            result["api"] = run_api_part(scratch, 20_000 if args.quick else 200_000)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\nslipstream pipeline benchmark")
    if "report" in result:
        report = result["report"]
        startup, first = report["spark_startup_s"], report["first_tiny_job_s"]
        print(f"Spark local[2] start-up: {startup:.1f} s (then a first tiny job: {first:.1f} s)")
        print(f"{'rows':>12} {'Spark local[2]':>15} {'pyarrow 1 proc':>15} {'Spark/pyarrow':>14}")
        for entry in report["sizes"]:
            print(f"{entry['rows']:>12,} {entry['spark_s']:>13.1f} s {entry['pyarrow_s']:>13.2f} s "
                  f"{entry['ratio_spark_over_pyarrow']:>13.1f}x")  # fmt: skip
        sizes = report["sizes"]
        if len(sizes) >= 2:
            a, b = sizes[-2], sizes[-1]
            per_m = 1e6 / (b["rows"] - a["rows"])
            spark_slope = (b["spark_s"] - a["spark_s"]) * per_m
            arrow_slope = (b["pyarrow_s"] - a["pyarrow_s"]) * per_m
            report["marginal_s_per_million_rows"] = {"spark": spark_slope, "pyarrow": arrow_slope}
            print(f"marginal cost per extra million rows: Spark {spark_slope:.2f} s, pyarrow {arrow_slope:.2f} s "
                  f"(pyarrow holds the kind in memory; Spark streams it and can use more machines)")  # fmt: skip
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
