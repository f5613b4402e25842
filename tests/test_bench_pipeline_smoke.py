"""bench.pipeline still works end to end at tiny sizes; figures live in bench/, never in tests.

The recording part runs as the command does (``--part recording --quick``: driver, publisher,
subscriber and ``slipstream record`` processes); the report part runs in this process on the test
run's Spark session (a second JVM would only add start-up time).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_report_benchmark_computes_the_same_totals_in_spark_and_pyarrow(spark: Any, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from bench.pipeline import run_report_part
    finally:
        sys.path.remove(str(ROOT))
    result = run_report_part([20_000], tmp_path, 5, stop=False)
    (size,) = result["sizes"]
    assert size["rows"] == 20_000 and size["totals_agree"] is True
    assert size["spark_s"] > 0 and size["pyarrow_s"] > 0
