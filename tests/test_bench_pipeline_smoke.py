"""bench.pipeline still works end to end at tiny sizes; figures live in bench/, never in tests.

The recording part runs as the command does (``--part recording --quick``: driver, publisher,
subscriber and ``slipstream record`` processes); of the report part, the synthetic data and the
single-process tables are checked here (the Spark side is the report, tested in test_pipeline).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

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


def test_report_benchmark_data_and_single_process_tables(tmp_path: Path) -> None:
    """The synthetic recording and the pyarrow side of the comparison (the Spark side is the report
    itself, tested in test_pipeline; a second run of it here would only cost time)."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.pipeline import make_recording, pyarrow_tables
    finally:
        sys.path.remove(str(ROOT))
    from slipstream.pipeline.jobs import TABLES
    from slipstream.telemetry import Recording

    counts = make_recording(tmp_path, 20_000, segment_rows=5_000)
    assert counts == {"captured": 18_000, "connection_stats": 1_600, "connection_events": 400}
    assert len(Recording(tmp_path).segments("captured")) == 4
    tables = pyarrow_tables(tmp_path, threshold=5)
    assert set(tables) <= set(TABLES)
    assert sum(tables["stream_throughput"].column("size_count").to_pylist()) == counts["captured"]
    assert sum(tables["message_types"].column("size_count").to_pylist()) == counts["captured"]
    rejected = sum(tables["rejected_handshakes"].column("timestamp_ns_count").to_pylist())
    assert 0 < rejected < counts["connection_events"]
