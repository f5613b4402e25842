"""The report's operations analytics (issue 31, defect 11 and deliverable 5) on a real local Spark, over a
recording written by the real recorder with known numbers: windows per server and per link, RTT
percentiles with their sample counts (none from too few), churn, top talkers; the page's formatting;
the recording opened read-only; and the RTT sampling setting on a real server and client."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from slipstream.network import Client, Server
from slipstream.pipeline.jobs import TABLES, TablesResult, build_tables, min_samples
from slipstream.pipeline.options import ReportOptions
from slipstream.pipeline.report import cell, write_report
from slipstream.telemetry import (
    ConnectionStats,
    Recorder,
    RecorderConfig,
    Recording,
    RecordingConfig,
    connected,
    disconnected,
    handshake_accepted,
    handshake_rejected,
    read_segment,
)
from tests.test_network_aio import client_config, free_ports, run, server_config

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_795_000_040_000_000_000
"""A wall-clock time 20 s into a minute (2026-11-18T11:07:20Z)."""
MINUTE = 60_000_000_000
BIG_ID = 1_234_567


def _stats(ts: int, cid: int, address: str, tag: str, n: int, rtt: int | None, local: str) -> ConnectionStats:
    """Cumulative counters after ``n`` samples: 10 messages and 1000 bytes in, 1 message and 100 bytes out each."""
    return ConnectionStats(ts, cid, address, tag, n, 10 * n, 100 * n, 1000 * n, rtt_ns=rtt, naks_sent=n // 50,
                           bytes_lost=2 * n, local=local)  # fmt: skip


def record_known(root: Path) -> None:
    """Server ``srv-a``: connection BIG_ID (alice, 10.0.0.1) pinged 150 times 1 s apart from T0 (RTT
    1..150 µs), connection 2 (bob, 10.0.0.2) 30 times in the first minute; server ``srv-b``: connection 3
    (carol) 5 times. Refusals of 192.0.2.7: 2 in the first minute, 1 in the third."""
    with Recorder(root, writer_id="known") as recorder:
        a, b = "10.0.0.1:4000", "10.0.0.2:5000"
        recorder.record(handshake_accepted(T0, connection_id=BIG_ID, address=a, tag="alice", local="srv-a"))
        recorder.record(connected(T0 + 1, connection_id=BIG_ID, address=a, tag="alice", local="srv-a"))
        recorder.record(connected(T0 + 2, connection_id=2, address=b, tag="bob", local="srv-a"))
        recorder.record(connected(T0 + 3, connection_id=3, address="ipc", tag="carol", transport="ipc", local="srv-b"))
        for i in range(150):
            recorder.record(_stats(T0 + i * 1_000_000_000, BIG_ID, a, "alice", i + 1, (i + 1) * 1000, "srv-a"))
        for i in range(30):
            recorder.record(_stats(T0 + i * 1_000_000_000 + 5, 2, b, "bob", i + 1, 500_000, "srv-a"))
        for i in range(5):
            recorder.record(_stats(T0 + i * 1_000_000_000 + 7, 3, "ipc", "carol", i + 1, 50_000, "srv-b"))
        end = T0 + 150 * 1_000_000_000
        recorder.record(disconnected(end, connection_id=BIG_ID, address=a, cause="timeout", tag="alice", local="srv-a"))
        recorder.record(disconnected(T0 + 31_000_000_000, connection_id=2, address=b, cause="peer_closed", tag="bob",
                                     local="srv-a"))  # fmt: skip
        for ts in (T0 + 10, T0 + 11, T0 + 2 * MINUTE):
            recorder.record(handshake_rejected(ts, address="192.0.2.7:999", reason="not_permitted", local="srv-a"))


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("known") / "recording"
    record_known(root)
    return root


@pytest.fixture(scope="module")
def known_report(spark: Any, known: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[TablesResult, Path]:
    """The tables of the known recording (one-minute windows) and the page written from them."""
    out = tmp_path_factory.mktemp("known-report")
    options = ReportOptions(abuse_threshold=3, window_s=60, top=1)
    result = build_tables(spark, known, out, options)
    assert set(result.rows) == set(TABLES)
    page = write_report(result, out, input_dir=known, options=options, master="local", spark_version="4",
                        elapsed_s=1.0)  # fmt: skip
    return result, page


@pytest.fixture(scope="module")
def tables(known_report: tuple[TablesResult, Path]) -> dict[str, list[dict[str, Any]]]:
    return known_report[0].rows


def test_rtt_percentiles_carry_their_sample_count_and_no_p99_comes_from_fewer_than_100(
    tables: dict[str, list[dict[str, Any]]],
) -> None:
    sessions = {row["connection_id"]: row for row in tables["sessions"]}
    alice, bob, carol = sessions[BIG_ID], sessions[2], sessions[3]
    # 150 samples of 1..150 µs: percentile_approx picks samples (exact below accuracy / 2 samples).
    assert alice["rtt_samples"] == 150
    assert (alice["rtt_p50_ns"], alice["rtt_p95_ns"], alice["rtt_p99_ns"]) == (75_000, 143_000, 149_000)
    assert (bob["rtt_samples"], bob["rtt_p50_ns"], bob["rtt_p95_ns"], bob["rtt_p99_ns"]) == (30, 500_000, 500_000, None)
    assert (carol["rtt_samples"], carol["rtt_p50_ns"], carol["rtt_p95_ns"], carol["rtt_p99_ns"]) == (
        5,
        50_000,
        None,
        None,
    )
    assert (min_samples(0.5), min_samples(0.95), min_samples(0.99)) == (2, 20, 100)
    # Per server and minute: srv-a's first window holds alice's first 40 samples and bob's 30.
    windows = {(row["server"], row["window_start_ns"]): row for row in tables["server_windows"]}
    first = T0 - T0 % MINUTE
    assert [row["rtt_samples"] for key, row in sorted(windows.items()) if key[0] == "srv-a"] == [70, 60, 50]
    assert windows[("srv-a", first)]["rtt_p99_ns"] is None  # 70 samples: "n too small"
    assert windows[("srv-a", first + MINUTE)]["rtt_p50_ns"] == 70_000  # samples 41..100 µs
    assert windows[("srv-b", first)]["rtt_samples"] == 5


def test_windows_turn_cumulative_counters_into_traffic_per_server_and_link(
    tables: dict[str, list[dict[str, Any]]],
) -> None:
    first = T0 - T0 % MINUTE
    windows = {(row["server"], row["window_start_ns"]): row for row in tables["server_windows"]}
    assert sorted(windows) == [("srv-a", first), ("srv-a", first + MINUTE), ("srv-a", first + 2 * MINUTE),
                               ("srv-b", first)]  # fmt: skip
    minute1 = windows[("srv-a", first)]  # alice's samples 1..40 and bob's 1..30: deltas of 10 messages each
    assert (minute1["connections"], minute1["messages_in"], minute1["bytes_in"]) == (2, 700, 70_000)
    assert minute1["messages_per_s"] == pytest.approx((700 + 70) / 60)
    assert minute1["bytes_lost"] == 140 and minute1["loss_rate"] == pytest.approx(140 / (70_000 + 140))
    assert minute1["naks_sent"] == 0  # bob's 30 // 50, alice's 40 // 50
    assert windows[("srv-a", first + MINUTE)]["naks_sent"] == 2  # alice passed 50 and 100
    assert sum(row["messages_in"] for key, row in windows.items() if key[0] == "srv-a") == 10 * (150 + 30)
    links = {(row["server"], row["remote"], row["window_start_ns"]): row for row in tables["link_windows"]}
    assert links[("srv-a", "10.0.0.2", first)]["messages_in"] == 300
    assert links[("srv-b", "ipc", first)]["messages_in"] == 50
    churn = {(row["server"], row["event"], row["detail"], row["window_start_ns"]): row["events"]
             for row in tables["churn"]}  # fmt: skip
    assert churn[("srv-a", "disconnected", "timeout", first + 2 * MINUTE)] == 1
    assert churn[("srv-a", "disconnected", "peer_closed", first)] == 1
    assert churn[("srv-a", "handshake_rejected", "not_permitted", first)] == 2
    assert churn[("srv-b", "connected", "", first)] == 1
    talkers = [(row["window_start_ns"], row["dimension"], row["key"]) for row in tables["top_talkers"]]
    assert (first, "address", "10.0.0.1") in talkers and (first, "tag", "alice") in talkers  # top=1: the biggest
    assert len([t for t in talkers if t[0] == first]) == 2


def test_the_page_prints_ids_plainly_times_as_iso_utc_and_no_percentile_from_too_few(
    tables: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    assert cell(BIG_ID, "connection_id") == f'<td class="num">{BIG_ID}</td>'
    assert ">2026-11-18<wbr>T11:07:20.000Z<" in cell(T0, "start_ns")
    assert ">2026-11-18<wbr>T11:07:20.000Z<" in cell(T0 // 1_000_000, "last_observation_ms")
    assert "n too small" in cell(None, "rtt_p99_ns", {"rtt_samples": 70})
    assert ">-<" in cell(None, "rtt_p99_ns", {"rtt_samples": 0})
    assert ">149<" in cell(149_000, "rtt_p99_ns") and ">75.5<" in cell(75_500, "rtt_p50_ns")  # µs


def test_the_written_page_has_no_thousands_separators_and_states_its_window(
    known_report: tuple[TablesResult, Path],
) -> None:
    page = known_report[1].read_text()
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", page)]  # text, no <wbr>
    assert f"{BIG_ID}" in cells and not [c for c in cells if re.search(r"\d,\d{3}", c)]
    assert "tumbling, 60 s" in page and "n too small" in page
    assert "2026-11-18T11:07:20.000Z" in cells  # alice's start


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


DEAD_WRITER = """
import os, sys, time
from slipstream.telemetry import Recorder, RecorderConfig, handshake_rejected
recorder = Recorder(sys.argv[1], writer_id="dead", config=RecorderConfig(flush_interval_s=0.05))
recorder.record(handshake_rejected(time.time_ns(), address="198.51.100.1:1", reason="not_permitted"))
time.sleep(0.5)  # flushed into its journal, never finalized
os._exit(0)
"""


def test_the_report_opens_the_recording_read_only_and_leaves_dead_journals_unread(
    spark: Any, known: Path, tmp_path: Path
) -> None:
    root = tmp_path / "recording"
    record_known(root)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-c", DEAD_WRITER, str(root)], check=True, env=env, timeout=60)
    assert list((root / "_journals" / "dead").rglob("*.arrows")), _tree(root)  # a journal, unfinalized
    before = _tree(root)
    result = build_tables(spark, root, tmp_path / "out", ReportOptions(abuse_threshold=1))
    assert _tree(root) == before  # no lock file, no finalized journal: nothing written
    assert {row["address"] for row in result.rows["rejected_handshakes"]} == {"192.0.2.7"}  # not the dead one's


def test_rtt_interval_pings_every_connection_for_enough_samples(driver_dir: Path, tmp_path: Path) -> None:
    """``RecordingConfig.rtt_interval_s``: a server records an RTT sample per interval per connection
    without the application pinging (100+ in 1.5 s at 10 ms); off by default."""
    sampled = RecordingConfig(directory=tmp_path / "on", recorder=RecorderConfig(flush_interval_s=0.1),
                              rtt_interval_s=0.01)  # fmt: skip
    plain = RecordingConfig(directory=tmp_path / "off", recorder=RecorderConfig(flush_interval_s=0.1))

    async def main(recording: RecordingConfig) -> None:
        port = free_ports(50)
        async with Server(server_config(driver_dir, recording=recording)) as server:
            await server.bind(port)
            async with Client(client_config(driver_dir, tag="quiet")) as client:
                await client.connect("127.0.0.1", port, timeout=10)
                await asyncio.sleep(1.5)

    for recording in (sampled, plain):
        run(main(recording))
    assert recording.directory is not None

    def samples(root: Path | None) -> list[int]:
        assert root is not None
        found = [read_segment(s).to_pylist() for s in Recording(root).segments("connection_stats")]
        return [row["rtt_ns"] for rows in found for row in rows if row["rtt_ns"] is not None]

    on = samples(sampled.directory)
    assert len(on) >= 100 and all(0 < rtt < 1_000_000_000 for rtt in on)
    assert samples(plain.directory) == []
    with pytest.raises(ValueError, match="rtt_interval_s"):
        RecordingConfig(rtt_interval_s=0)
