"""The benchmark suites still run end to end: ``python -m bench --quick`` (IPC and UDP) in a real subprocess.

Only that they work and report every row with usable numbers is checked here; speed targets live in
the benchmarks and issues, never in timed unit tests.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PERCENTILES = ("50", "99", "99.9")
IPC_ROWS = {
    "throughput.32B.standalone",
    "throughput.32B.embedded",
    "throughput.1024B.standalone",
    "throughput.32B.pure",
    "throughput.1024B.pure",
    "throughput.32B.block",
    "drain.32B.poll",
    "drain.32B.block",
    *(f"latency.32B.{mode}.p{pct}" for mode in ("spin", "yield", "asyncio", "asyncio-parked") for pct in PERCENTILES),
}
UDP_ROWS = {
    "udp.throughput.32B",
    "udp.throughput.1024B",
    "udp.bulk.65536B",
    "udp.throughput.32B.invoker",
    "udp.throughput.1024B.invoker",
    "udp.bulk.65536B.invoker",
    "udp.throughput.32B.invoker.pure",
    "udp.throughput.1024B.invoker.pure",
    "udp.bulk.65536B.invoker.pure",
    *(f"udp.latency.32B.{mode}.p{pct}" for mode in ("spin", "yield", "invoker") for pct in PERCENTILES),
}
LOSS_ROWS = {"udp.lossfree", "udp.loss5", "udp.lossfree.nogso", "udp.loss5.nogso"}
"""Measured in network namespaces when the run may make them (root, nftables), else not measured."""


def test_quick_benchmark_writes_every_row_of_both_suites(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        env={k: v for k, v in os.environ.items() if k != "SLIPSTREAM_AERON_C_DIR"},  # the aeron-c suite stays out
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    document = json.loads(out.read_text())

    assert document["suites"] == ["ipc", "udp"]
    rows = {row["id"]: row for row in document["rows"]}
    not_measured = [item["id"] for item in document["not_measured"]]
    if not_measured:
        assert not_measured == ["udp.loss5"] and "UDP throughput with 5 % random loss" in proc.stdout
        assert set(rows) == IPC_ROWS | UDP_ROWS
    else:
        assert set(rows) == IPC_ROWS | UDP_ROWS | LOSS_ROWS
        assert "of the same setup's loss-free" in proc.stdout
    assert {rows[r]["suite"] for r in IPC_ROWS} == {"ipc"} and {rows[r]["suite"] for r in UDP_ROWS} == {"udp"}
    for row in rows.values():
        for key in ("slipstream", "pyzmq", "ratio"):
            value = row[key]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (row["id"], key, value)
        assert row["benchmark"] in proc.stdout

    bulk = rows["udp.bulk.65536B"]["details"]
    assert bulk["slipstream_bytes_received"] == bulk["bytes_planned"] == 4 << 20, "quick bulk moved every byte"

    machine = document["machine"]
    assert machine["cpu_count"] >= 1
    assert machine["python"] and machine["pyzmq"] and machine["libzmq"]
    assert document["raw"], "raw figures are kept"


def test_rmi_and_streaming_benchmark_runs_with_its_peers(tmp_path: Path) -> None:
    """``python -m bench.rmi --quick``: slipstream over IPC and UDP, Pyro5 and RPyC, and a file streamed."""
    out = tmp_path / "rmi.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.rmi", "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    rmi = results["rmi"]
    blocking = {"slipstream-blocking-ipc", "slipstream-blocking-udp"}
    if importlib.util.find_spec("slipstream.network.sync") is not None:
        assert set(rmi) == {"slipstream-ipc", "slipstream-udp", "pyro5", "rpyc"} | blocking
        assert all(rmi[key]["awaited_per_s"] > 0 for key in blocking)
        assert results["ratios"]["ipc.blocking.awaited_vs_rpyc"] > 0
    else:
        assert set(rmi) == {"slipstream-ipc", "slipstream-udp", "pyro5", "rpyc", "slipstream-blocking"}
        assert rmi["slipstream-blocking"].startswith("blocking API not available")
    for key in ("slipstream-ipc", "slipstream-udp", "pyro5", "rpyc"):
        assert rmi[key]["awaited_per_s"] > 0 and rmi[key]["oneway_per_s"] > 0
    assert results["ratios"]["note"].startswith("> 1: slipstream better")
    assert results["ratios"]["udp.asyncio.awaited_vs_pyro5"] > 0 and "ratio > 1" in done.stdout
    for row in results["streaming"].values():
        assert row["bytes"] == results["params"]["file_bytes"] and row["mb_per_s"] > 0
    assert results["machine-before"]["warm_us"] > 0 and results["machine-after"]["cold_us"] > 0
    assert done.stdout.startswith("machine: a round trip of two connection machines")
