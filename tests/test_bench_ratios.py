"""The network benchmarks' ratios read one way: > 1 where slipstream is better, round trips included (issue 32).

``bench.network`` used to store its round-trip ratio as slipstream/pyzmq, the inverse of its printed rule; these
build the ratios and the application layer's overhead from a results document as the benchmarks do, without running
them (``tests/test_bench_smoke.py`` runs them).
"""

from __future__ import annotations

import math

from bench import network, rmi
from bench.report import Comparison, comparison_table, oriented_ratio, ratios


def _network_results() -> dict[str, object]:
    return {
        "slipstream-udp": {"throughput_msgs_per_s": 300e3, "rtt_p50_us": 100.0, "rtt_p99_us": 400.0},
        "slipstream-ipc": {"throughput_msgs_per_s": 400e3, "rtt_p50_us": 40.0, "rtt_p99_us": 90.0},
        "zmq-curve-tcp": {"throughput_msgs_per_s": 100e3, "rtt_p50_us": 150.0, "rtt_p99_us": 200.0},
        "zmq-curve-ipc": {"throughput_msgs_per_s": 200e3, "rtt_p50_us": 160.0, "rtt_p99_us": 180.0},
        "transport-udp": {"rtt_p50_us": 50.0},
        "transport-ipc": {"rtt_p50_us": 2.0},
    }


def test_a_faster_round_trip_and_a_higher_rate_both_give_a_ratio_above_one() -> None:
    assert oriented_ratio("latency", 50.0, 150.0) == 3.0
    assert oriented_ratio("throughput", 300.0, 100.0) == 3.0
    assert math.isnan(oriented_ratio("latency", 0.0, 1.0)) and math.isnan(oriented_ratio("throughput", 1.0, 0.0))


def test_network_ratios_put_pyzmq_over_slipstream_for_round_trips() -> None:
    rows = network.comparisons(_network_results())
    stored = ratios(rows)
    assert stored["note"].startswith("> 1: slipstream better")
    assert stored["udp.asyncio.rtt_p50_vs_pyzmq_curve_tcp"] == 1.5
    assert stored["udp.asyncio.rtt_p99_vs_pyzmq_curve_tcp"] == 0.5
    assert stored["ipc.asyncio.rtt_p50_vs_pyzmq_curve_ipc"] == 4.0
    assert stored["udp.asyncio.throughput_vs_pyzmq_curve_tcp"] == 3.0
    assert not any(".blocking." in key for key in stored), "no blocking rows when none were measured"
    table = comparison_table(rows)
    assert "IPC asyncio: encrypted typed round trip p50" in table and "4.00x" in table and "0.50x" in table


def test_blocking_rows_sit_beside_the_asyncio_ones_when_measured() -> None:
    results = _network_results()
    results["slipstream-blocking-ipc"] = {"throughput_msgs_per_s": 500e3, "rtt_p50_us": 20.0, "rtt_p99_us": 60.0}
    stored = ratios(network.comparisons(results))
    assert stored["ipc.blocking.rtt_p50_vs_pyzmq_curve_ipc"] == 8.0
    assert "udp.blocking.rtt_p50_vs_pyzmq_curve_tcp" not in stored
    overhead = network.app_overhead(results)
    assert overhead["ipc.blocking"]["overhead_us"] == 18.0 and overhead["ipc.blocking"]["met"] is True


def test_app_overhead_is_the_round_trip_minus_the_transports() -> None:
    overhead = network.app_overhead(_network_results())
    ipc, udp = overhead["ipc.asyncio"], overhead["udp.asyncio"]
    assert (ipc["overhead_us"], ipc["app_over_transport"], ipc["met"]) == (38.0, 20.0, False)
    assert (udp["overhead_us"], udp["app_over_transport"]) == (50.0, 2.0) and "target_us" not in udp
    assert "not met" in network.overhead_table(overhead)


def test_rmi_ratios_compare_each_peer_and_skip_what_did_not_run() -> None:
    peer = {"awaited_per_s": 5e3, "concurrent_per_s": 4e3, "oneway_per_s": 20e3}
    results = {
        "slipstream-ipc": {"awaited_per_s": 10e3, "concurrent_per_s": 40e3, "oneway_per_s": 100e3},
        "slipstream-blocking": "blocking API not available (no module)",
        "slipstream-blocking-udp": {"awaited_per_s": 2.5e3},
        "pyro5": peer,
        "rpyc": {**peer, "awaited_per_s": 10e3},
    }
    rows = rmi.comparisons(results, 16)
    stored = ratios(rows)
    assert stored["ipc.asyncio.awaited_vs_pyro5"] == 2.0 and stored["ipc.asyncio.awaited_vs_rpyc"] == 1.0
    assert stored["ipc.asyncio.concurrent_vs_rpyc"] == 10.0
    assert stored["udp.blocking.awaited_vs_rpyc"] == 0.25
    assert not any(key.startswith("udp.asyncio") or "blocking.oneway" in key for key in stored)
    assert all(isinstance(row, Comparison) and row.unit == "calls/s" for row in rows)


def test_a_transport_slower_than_the_application_marks_the_run_disturbed() -> None:
    results = _network_results()
    results["transport-ipc"] = {"rtt_p50_us": 1000.0}  # two spinning processes starved onto one core
    ipc = network.app_overhead(results)["ipc.asyncio"]
    assert ipc["disturbed"] is True and ipc["met"] is False and ipc["overhead_us"] == -960.0
    assert "DISTURBED" in network.overhead_table({"ipc.asyncio": ipc})
