"""bench.pipeline still works end to end at tiny sizes; figures live in bench/, never in tests.

The recording part runs as the command does (``--part recording --quick``: driver, publisher,
subscriber and ``slipstream record`` processes); the report part runs in this process on the suite's
Spark, and its DuckDB tables must equal Spark's.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_quick_recording_overhead_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "pipeline.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--part", "recording", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    recording = json.loads(out.read_text())["recording"]
    for key in ("median_without", "median_with", "overhead_percent", "recorder_cpu_us_per_message"):
        assert isinstance(recording[key], float) and math.isfinite(recording[key]), key
    assert all("recorded 100000 messages" in line for line in recording["recorder_lines"])
    assert "overhead" in proc.stdout


@pytest.mark.slow
def test_report_benchmark_duckdb_tables_match_spark_row_for_row(spark: Any, tmp_path: Path) -> None:
    """The report part at 200 k rows: every table of the report computed by Spark (through the
    ``slipstream`` source) and by DuckDB's SQL (reading the same segments) is the same, row for row
    (percentiles to a tolerance); every table has rows, so none agrees by being empty."""
    pytest.importorskip("duckdb", reason="duckdb is not installed: bench.pipeline's DuckDB side needs it")
    sys.path.insert(0, str(ROOT))
    try:
        from bench import pipeline_duckdb as duck
        from bench.pipeline import print_report, run_report_part
    finally:
        sys.path.remove(str(ROOT))
    from slipstream.pipeline.jobs import TABLES

    assert [name for name in TABLES if name not in duck.TABLES] == [], "tables without DuckDB SQL"
    report = run_report_part([200_000], tmp_path, threshold=5, stop=False, warmup_rows=0)
    (entry,) = report["sizes"]
    assert entry["input_rows"]["captured"] == 180_000
    assert entry["differences"] == {}
    assert entry["tables_agree"]
    assert all(entry["table_rows"][name] > 0 for name in TABLES), entry["table_rows"]
    assert set(entry["duckdb_per_table_s"]) == set(TABLES)
    per_connection, per_minute = entry["rtt_percentiles"]["per_connection"], entry["rtt_percentiles"]["per_minute"]
    assert per_connection["groups"] == 160 and per_minute["groups"] == 11  # ten minutes, not from a minute boundary
    for percentiles in (per_connection, per_minute):
        assert percentiles["exact_engines_agree"]
        assert percentiles["spark_approx_max_rel_error"] < 0.1 and percentiles["duckdb_approx_max_rel_error"] < 0.1
    print_report(report)  # the command's table prints from these keys


def test_duckdb_comparison_finds_a_changed_row() -> None:
    """The comparison the test above relies on is not blind: a changed value, a missing row, another
    column order, a percentile off by more than the tolerance are each reported."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.pipeline_duckdb import compare
    finally:
        sys.path.remove(str(ROOT))
    table = [{"address": "a", "rejections": 7, "p50": 100.0}, {"address": "b", "rejections": 5, "p50": 10.0}]
    assert compare(table, [dict(row) for row in table], ("p50",)) == []
    assert compare(table, [table[0], {**table[1], "rejections": 6}]) == ["row 1 column rejections: 5 against 6"]
    assert compare(table, table[:1]) == ["2 rows against 1"]
    assert compare(table, [{"rejections": 7, "address": "a", "p50": 100.0}])[0].startswith("columns differ")
    assert compare(table, [table[0], {**table[1], "p50": 10.005}], ("p50",)) == []  # within PERCENTILE_REL
    assert compare(table, [table[0], {**table[1], "p50": 10.1}], ("p50",)) == ["row 1 column p50: 10.0 against 10.1"]
    assert compare(table, [table[0], {**table[1], "p50": 10.005}]) != []  # not a percentile: exact
    assert compare(table, [table[0], {**table[1], "p50": None}], ("p50",)) != []  # "n too small" is not a value


def test_report_benchmark_data(tmp_path: Path) -> None:
    """The synthetic recording: the kinds and counts the report part's docstring promises."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.pipeline import make_recording
    finally:
        sys.path.remove(str(ROOT))
    import pyarrow.parquet as pq

    from slipstream.telemetry import Recording

    counts = make_recording(tmp_path, 20_000, segment_rows=5_000)
    assert counts == {
        "captured": 18_000,
        "connection_stats": 1_600,
        "driver_counters": 20,
        "loss_report": 2,
        "error_log": 2,
        "connection_events": 376,
    }
    recording = Recording(tmp_path)
    assert len(recording.segments("captured")) == 4
    for kind, count in counts.items():
        assert sum(segment.rows for segment in recording.segments(kind)) == count, kind
    # the partitioned layout, each server's events and stats in its own host= partition, by its own recorder
    servers = {f"srv-{i}" for i in range(4)}
    for kind in counts:
        partitions = {path.parent.relative_to(tmp_path / kind) for path in (tmp_path / kind).rglob("*.parquet")}
        hosts = servers if kind.startswith("connection_") else {"bench-capture"}
        assert partitions == {Path("date=2023-11-14", "hour=22", f"host={host}") for host in hosts}, kind
    events = pq.read_table(tmp_path / "connection_events" / "date=2023-11-14" / "hour=22" / "host=srv-1")
    assert set(events["local"].to_pylist()) == {"srv-1"}
    assert {path.name for path in (tmp_path / "captured").rglob("*.parquet")} == {
        f"rec-bench-capture-1.{seq:08d}.parquet" for seq in range(4)
    }
