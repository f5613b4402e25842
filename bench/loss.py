"""Throughput under real packet loss: slipstream over UDP and pyzmq over TCP, in network namespaces.

Each case runs in a namespace made for it (root only; otherwise the rows are reported as not
measured, with the reason). An nftables rule there drops a random share of the packets arriving for
the receiver's port (``slipstream.testing.drop_random``), and the measurement itself runs inside the
namespace as ``python -m bench.loss --inner ...``, so both ends and slipstream's standalone driver
send over that namespace's loopback. Nothing leaves it.

slipstream runs in two configurations, each without loss (the baseline its loss figure is held
against: at least half, says the target) and with 5 %: with UDP segmentation offload (the driver's
default: loopback carries a GSO batch as one packet, so the rule drops bursts of datagrams), and with
``udp_gso`` off (every datagram a packet, dropped on its own, as on a wire; one system call per
datagram, so slower even without loss). pyzmq runs PUSH/PULL over TCP without loss and with 5 %.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from slipstream.testing import Namespace, NetnsUnavailableError, drop_random, require_netns

from . import BenchError, ipc, report, scratch_dir, zmq_peer
from .report import Plan, SuiteResult, progress, size_label
from .udp import system_counters

PORT = 40711
SIZE = 1024
LOSS_PERCENT = 5
TOTAL_BYTES = 50_000_000
QUICK_TOTAL_BYTES = 2_000_000
INNER_TIMEOUT_S = 120.0
SLIPSTREAM_CASES = (
    # key, percent, udp_gso
    ("lossfree", 0, True),
    ("loss5", LOSS_PERCENT, True),
    ("lossfree.nogso", 0, False),
    ("loss5.nogso", LOSS_PERCENT, False),
)
ZMQ_CASES = (("lossfree", 0), ("loss5", LOSS_PERCENT))
_ROOT = Path(__file__).resolve().parent.parent


def _inner(ns: Namespace, params: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement inside ``ns`` and return what it printed (its last line, JSON)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])))
    child = ns.popen([sys.executable, "-m", "bench.loss", "--inner", json.dumps(params)], env=env)
    try:
        out, err = child.communicate(timeout=INNER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate(timeout=10)
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise BenchError(f"loss case {params} failed (exit {child.returncode}): {err.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _case(label: str, protocol: str, percent: int, params: dict[str, Any]) -> dict[str, Any]:
    with Namespace(label) as ns:
        rule = drop_random(ns, protocol, PORT, percent) if percent else None
        result = _inner(ns, params)
        result["loss_percent"] = percent
        result["packets_dropped"] = rule.dropped() if rule is not None else 0
        result["packets_seen"] = rule.seen() if rule is not None else None
        return result


def run_suite(plan: Plan, *, quick: bool) -> SuiteResult:
    """The loss rows, or a not-measured entry saying why they could not run here."""
    result = SuiteResult()
    try:
        require_netns()
    except NetnsUnavailableError as exc:
        result.not_measured.append(
            {
                "id": "udp.loss5",
                "benchmark": "UDP throughput with 5 % random loss",
                "reason": f"needs network namespaces with nftables: {exc}",
            }
        )
        return result
    count = (QUICK_TOTAL_BYTES if quick else TOTAL_BYTES) // SIZE
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_no in range(plan.rounds):
        for key, percent, gso in SLIPSTREAM_CASES:
            progress(f"loss round {round_no + 1}/{plan.rounds}: slipstream {key} ({percent} %, gso {gso})")
            params = {"peer": "slipstream", "size": SIZE, "count": count, "gso": gso, "wait": plan.udp_wait}
            runs.setdefault(f"slipstream.{key}", []).append(_case(f"bl{percent}", "udp", percent, params))
        for key, percent in ZMQ_CASES:
            progress(f"loss round {round_no + 1}/{plan.rounds}: pyzmq tcp {key} ({percent} %)")
            params = {"peer": "pyzmq", "size": SIZE, "count": count}
            runs.setdefault(f"pyzmq.{key}", []).append(_case(f"bz{percent}", "tcp", percent, params))
    result.raw["udp.loss"] = runs
    label = size_label(SIZE)
    rows = (
        ("udp.lossfree", "lossfree", "lossfree", f"UDP {label}, no loss, in a namespace vs PUSH/PULL tcp"),
        ("udp.loss5", "loss5", "loss5", f"UDP {label}, 5 % random loss (GSO bursts) vs tcp with 5 % loss"),
        ("udp.lossfree.nogso", "lossfree.nogso", "lossfree", f"UDP {label}, no loss, gso off vs tcp"),
        ("udp.loss5.nogso", "loss5.nogso", "loss5", f"UDP {label}, 5 % loss of single datagrams (gso off) vs tcp 5 %"),
    )
    for row_id, slip_key, zmq_key, title in rows:
        slip, zmq = runs[f"slipstream.{slip_key}"], runs[f"pyzmq.{zmq_key}"]
        result.rows.append(
            report.throughput_row(
                row_id, title, slip, zmq, suite="udp", unit="MB/s", details={"channel": slip[0]["params"]["channel"]}
            )
        )
    for key, base_key in (("loss5", "lossfree"), ("loss5.nogso", "lossfree.nogso")):
        baseline = report.median([r["mb_per_s"] for r in runs[f"slipstream.{base_key}"]])
        lossy = report.median([r["mb_per_s"] for r in runs[f"slipstream.{key}"]])
        dropped = sum(r["packets_dropped"] for r in runs[f"slipstream.{key}"])
        naks = sum(r["driver_counters"].get("NAKs sent", 0) for r in runs[f"slipstream.{key}"])
        result.notes.append(
            f"UDP {key}: {lossy:.1f} MB/s is {lossy / baseline:.0%} of the same setup's loss-free {baseline:.1f} MB/s "
            f"(target: at least 50 %); {dropped} packets dropped by the rule, {naks} NAKs sent, every byte delivered"
        )
    zmq_base = report.median([r["mb_per_s"] for r in runs["pyzmq.lossfree"]])
    zmq_lossy = report.median([r["mb_per_s"] for r in runs["pyzmq.loss5"]])
    result.notes.append(f"tcp with 5 % loss: {zmq_lossy:.1f} MB/s, {zmq_lossy / zmq_base:.0%} of its loss-free rate")
    return result


# -- inside the namespace ---------------------------------------------------------------------------


def _measure(params: dict[str, Any]) -> dict[str, Any]:
    size, count = int(params["size"]), int(params["count"])
    if params["peer"] == "pyzmq":
        return zmq_peer.run_throughput(f"tcp://127.0.0.1:{PORT}", size, count, INNER_TIMEOUT_S / 2)
    with scratch_dir("slipstream-bench-loss-", "/dev/shm") as shm:
        directory = shm / "driver"
        with ipc.standalone_driver(directory, udp_gso=bool(params["gso"])) as pid:
            before = system_counters(directory)
            run = ipc.run_throughput(
                directory,
                5000,
                size,
                count,
                INNER_TIMEOUT_S / 2,
                driver_pid=pid,
                channel=f"aeron:udp?endpoint=127.0.0.1:{PORT}",
                wait=str(params["wait"]),
            )
            after = system_counters(directory)
    if run["subscriber"]["received"] != count:
        raise BenchError(f"only {run['subscriber']['received']} of {count} messages arrived under loss")
    run["driver_counters"] = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loss", description="one loss measurement (internal)")
    parser.add_argument("--inner", required=True, help="JSON parameters of the measurement")
    args = parser.parse_args(argv)
    print(json.dumps(_measure(json.loads(args.inner))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

