"""``python -m bench.pipeline --quick`` still runs end to end (tiny sizes); figures live in bench/, not here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_quick_pipeline_benchmark_reports_both_parts(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    out = tmp_path / "pipeline.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    document = json.loads(out.read_text())
    report = document["report"]
    assert report["spark_startup_s"] > 0
    (size,) = report["sizes"]
    assert size["rows"] == 20_000 and size["totals_agree"] is True
    assert size["spark_s"] > 0 and size["pyarrow_s"] > 0
    recording = document["recording"]
    for key in ("median_without", "median_with", "overhead_percent", "recorder_cpu_us_per_message"):
        assert isinstance(recording[key], float) and math.isfinite(recording[key]), key
    assert all("recorded 100000 messages" in line for line in recording["recorder_lines"])
    assert "overhead" in proc.stdout and "Spark/pyarrow" in proc.stdout
