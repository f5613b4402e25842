"""The Aeron C yardstick without Aeron: its parsers on the samples' printed lines, and a run with no build,
which must report every row as not measured instead of failing (``tests/test_aeron_interop.py`` runs it
against a real build)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from bench import aeron_c
from bench.report import Row

ROOT = Path(__file__).resolve().parent.parent


def test_publisher_totals_and_subscriber_reports_are_parsed() -> None:
    lines = [
        "Streaming 3000 messages of payload length 32 bytes to aeron:ipc on stream id 1001",
        "Done sending.",
        "Publisher back pressure ratio 0.2129",
        "Total: 1605ms, 6.228e+06 msgs/sec, 1.993e+08 bytes/sec, totals 10000000 messages 305 MB payloads",
    ]
    pub = aeron_c.parse_publisher(lines)
    assert (pub["sent"], pub["msgs_per_s"], pub["back_pressure_ratio"]) == (10_000_000, 6.228e6, 0.2129)
    reports = aeron_c.parse_reports(
        [
            "3ms, 0 msgs/sec, 0 bytes/sec, totals 0 messages 0 MB payloads",
            "Available image on aeron:ipc streamId=1001 sessionId=1 mtu=1408 term-length=67108864 from aeron:ipc",
            "1003ms, 7.441e+06 msgs/sec, 2.381e+08 bytes/sec, totals 8688779 messages 265 MB payloads",
        ]
    )
    assert [r["total"] for r in reports] == [0, 8_688_779]


def test_cping_histogram_gives_nearest_rank_percentiles() -> None:
    lines = [
        "       Value   Percentile   TotalCount 1/(1-Percentile)",
        "",
        "       0.300     0.000000            1         1.00",
        "       0.320     0.500000         2600         2.00",
        "       3.597     0.990625         4955       106.67",
        "      86.911     1.000000         5000          inf",
        "#[Mean    =        0.327, StdDeviation   =        2.477]",
        "#[Max     =       86.911, Total count    =         5000]",
    ]
    summary = aeron_c.parse_histogram(lines)
    assert (summary["p50_us"], summary["p99_us"], summary["count"], summary["max_us"]) == (0.32, 3.597, 5000, 86.911)


def test_yardstick_rows_sit_beside_the_matching_slipstream_rows() -> None:
    tp = aeron_c.YardstickRow("aeron_c.udp.throughput.32B", "t", "throughput", "msg/s", aeron_c=2e6)
    lat = aeron_c.YardstickRow("aeron_c.ipc.latency.32B.p50", "l", "latency", "us", aeron_c=0.5)
    slip = [
        Row("udp.throughput.32B", "t", "throughput", "msg/s", slipstream=1e6, pyzmq=1e6, suite="udp"),
        Row("latency.32B.spin.p50", "l", "latency", "us", slipstream=2.0, pyzmq=50.0),
    ]
    aeron_c.compare([tp, lat], slip)
    assert (tp.slipstream, tp.ratio, tp.slipstream_row) == (1e6, 0.5, "udp.throughput.32B")
    assert (lat.slipstream, lat.ratio) == (2.0, 0.25)
    assert "0.50x" in aeron_c.format_table([tp, lat])


def test_without_a_build_every_row_is_not_measured(tmp_path: Path) -> None:
    out = tmp_path / "aeron-c.json"
    env = {k: v for k, v in os.environ.items() if k != aeron_c.ENV_VAR}
    done = subprocess.run(
        [sys.executable, "-m", "bench.aeron_c", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["aeron_c"] == []
    assert {item["id"] for item in document["not_measured"]} == set(aeron_c.PLANNED)
    assert all(aeron_c.ENV_VAR in item["reason"] for item in document["not_measured"])
    missing = aeron_c.find_binaries(tmp_path)
    assert missing[0] == {} and "missing" in missing[1]
    assert not math.isnan(document["raw"]["parallelism_2_busy_processes"])
