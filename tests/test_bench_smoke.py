"""The benchmark suite still runs end to end: ``python -m bench --quick`` in a real subprocess.

Only that it works and reports every row with usable numbers is checked here; speed targets live in
the benchmarks and issues, never in timed unit tests.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXPECTED_ROWS = {
    "throughput.32B.standalone",
    "throughput.32B.embedded",
    "throughput.1024B.standalone",
    *(
        f"latency.32B.{mode}.p{pct}"
        for mode in ("spin", "yield", "asyncio", "asyncio-parked")
        for pct in ("50", "99", "99.9")
    ),
}


def test_quick_benchmark_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=55,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    document = json.loads(out.read_text())

    rows = {row["id"]: row for row in document["rows"]}
    assert set(rows) == EXPECTED_ROWS
    for row in rows.values():
        for key in ("slipstream", "pyzmq", "ratio"):
            value = row[key]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (row["id"], key, value)
        assert row["benchmark"] in proc.stdout

    machine = document["machine"]
    assert machine["cpu_count"] >= 1
    assert machine["python"] and machine["pyzmq"] and machine["libzmq"]
    assert document["raw"], "raw figures are kept"
