"""The UDP suite: slipstream ``aeron:udp`` on 127.0.0.1 vs pyzmq over ``tcp://127.0.0.1``.

Over UDP the media driver is on the data path (it sends and receives every datagram), unlike IPC
where publisher and subscriber share the log directly. So every slipstream run here goes through a
standalone driver process, started by the suite in a fresh directory under /dev/shm and stopped
after, and the driver's CPU and system counters (NAKs, retransmits, flow-control limits) are kept
with each run. The publisher, subscriber and ping/pong workers are ``bench.ipc``'s, given UDP
channels; pyzmq's are ``bench.zmq_peer``'s on TCP loopback, the transport a pyzmq user would pick
between two hosts. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slipstream.files.cnc import CncError, CncFile
from slipstream.files.counters import SYSTEM_COUNTER_TYPE_ID

from . import ipc, report, zmq_peer
from .report import Plan, SuiteResult, progress, size_label

LOOPBACK = "127.0.0.1"
BULK_MTU = 1408
"""The MTU of the bulk row: Aeron's default, what fits an Ethernet frame with IP and UDP headers."""
COUNTER_SETTLE_S = 0.25
"""The driver mirrors its system counters on a 100 ms timer: wait this long before reading them."""
LATENCY_MODES = (
    # key, client wait (ping and pong), driver idle strategy (or "invoker"), row title
    ("spin", "spin", "backoff", "UDP, busy-spin clients, driver backoff (default) vs REQ/REP tcp"),
    ("yield", "yield", "yield", "UDP, clients and driver sched_yield when idle vs REQ/REP tcp"),
    ("invoker", "spin", "invoker", "UDP, busy-spin clients invoking their own embedded driver vs REQ/REP tcp"),
)
"""The first two share one standalone driver process (three processes on the machine's cores); with
``invoker`` each client embeds a driver in invoker mode and runs it from its polling loop (two
processes, no driver thread: the GIL is never handed over)."""


def free_port(kind: socket.SocketKind) -> int:
    """A port the kernel just had free on 127.0.0.1 (for a UDP endpoint or a TCP listener)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def udp_channel(**params: int) -> str:
    """``aeron:udp?endpoint=127.0.0.1:<free port>`` plus channel parameters (``mtu=1408`` ...)."""
    extra = "".join(f"|{name.replace('_', '-')}={value}" for name, value in params.items())
    return f"aeron:udp?endpoint={LOOPBACK}:{free_port(socket.SOCK_DGRAM)}{extra}"


def tcp_endpoint() -> str:
    return f"tcp://{LOOPBACK}:{free_port(socket.SOCK_STREAM)}"


def system_counters(directory: Path) -> dict[str, int]:
    """The driver's system counters by label, read from its CnC file like ``slipstream stat`` would."""
    try:
        cnc = CncFile.open(directory)
    except CncError:
        return {}
    try:
        return {c.label: c.value for c in cnc.counters_reader() if c.type_id == SYSTEM_COUNTER_TYPE_ID}
    finally:
        cnc.close()


class UdpDrivers:
    """Standalone drivers, each in a fresh directory under ``shm``, optionally under cProfile."""

    def __init__(self, shm: Path, profile_dir: Path | None) -> None:
        self.shm = shm
        self.profile_dir = profile_dir
        self._numbers = itertools.count(1)
        self.profiles: list[str] = []

    @contextlib.contextmanager
    def start(self, idle_strategy: str = "backoff") -> Iterator[tuple[Path, int]]:
        """Yields the driver's directory and pid; the directory is gone afterwards."""
        number = next(self._numbers)
        directory = self.shm / f"udp-driver-{number}"
        profile = None
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            profile = self.profile_dir / f"udp-driver-{number}-{idle_strategy}.prof"
            self.profiles.append(str(profile))
        with ipc.standalone_driver(directory, idle_strategy, profile) as pid:
            yield directory, pid


def _with_counters(directory: Path, run: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a slipstream measurement and attach what the driver's system counters moved by meanwhile."""
    before = system_counters(directory)
    result: dict[str, Any] = run(directory, *args, **kwargs)
    time.sleep(COUNTER_SETTLE_S)
    after = system_counters(directory)
    result["driver_counters"] = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return result


def _counters_note(label: str, runs: list[dict[str, Any]]) -> str:
    totals: dict[str, int] = {}
    for run in runs:
        for key, value in run["driver_counters"].items():
            totals[key] = totals.get(key, 0) + value
    keys = (
        "NAKs sent",
        "Retransmits sent",
        "Loss gap fills",
        "Short sends",
        "Sender flow control limits, i.e. back-pressure events",
        "Status Messages sent",
    )
    return f"{label} driver counters over all rounds: " + ", ".join(f"{k} {totals.get(k, 0)}" for k in keys)


PURE = {False: "", True: " (pure Python)"}
"""Row-name suffix of the runs whose clients, and so their invoker-mode drivers, run without the extension."""


def _invoker_run(
    shm: Path,
    stream: int,
    size: int,
    count: int,
    time_limit_s: float,
    channel: str,
    plan: Plan,
    pure: bool,
    *,
    assemble: bool = False,
) -> dict[str, Any]:
    """A throughput run whose two clients each run an invoker-mode driver (so ``pure`` covers the whole
    data path: log, sender, receiver)."""
    run = ipc.run_throughput(
        shm / f"udp-invoker-{stream}",
        stream,
        size,
        count,
        time_limit_s,
        driver_pid=None,
        channel=channel,
        assemble=assemble,
        wait=plan.udp_wait,
        invoker=True,
        pure=pure,
    )
    return run | {"driver_counters": {}}


def run_suite(plan: Plan, shm: Path, *, quick: bool, only: str | None, profile_dir: Path | None = None) -> SuiteResult:
    """Throughput (32 B, 1 KiB), round-trip latency (32 B) and a bulk transfer (large fragmented
    messages, 1408-byte MTU), each against its pyzmq TCP counterpart in the same invocation."""
    result = SuiteResult()
    notes, raw = result.notes, result.raw
    drivers = UdpDrivers(shm, profile_dir)
    do_throughput = only in (None, "throughput")
    do_latency = only in (None, "latency")
    raw["udp.settings"] = {
        "throughput_client_wait": plan.udp_wait,
        "throughput_channel_parameters": "driver defaults (mtu 1408, term 16 MiB, rcv-wnd 1 MiB)",
        "bulk_channel_parameters": f"mtu={BULK_MTU}",
        "latency_modes": [{"key": k, "client_wait": w, "driver_idle": d} for k, w, d, _ in LATENCY_MODES],
    }
    stream = 2000

    if do_latency:
        for key, wait, driver_idle, _ in LATENCY_MODES:
            progress(f"udp: slipstream latency, clients {wait}, driver {driver_idle}")
            args = (stream, plan.latency_size, plan.warmup, plan.udp_samples, plan.time_limit_s)
            channels = {"ping_channel": udp_channel(), "pong_channel": udp_channel()}
            if driver_idle == "invoker":
                raw[f"udp.slipstream.latency.{key}"] = ipc.run_latency(
                    shm / f"udp-invoker-{stream}", *args, pong_wait=wait, ping_wait=wait, invoker=True, **channels
                ) | {"driver_counters": {}}
            else:
                with drivers.start(driver_idle) as (directory, pid):
                    raw[f"udp.slipstream.latency.{key}"] = _with_counters(
                        directory, ipc.run_latency, *args, pong_wait=wait, ping_wait=wait, driver_pid=pid, **channels
                    )
            stream += 10
        progress("udp: pyzmq REQ/REP latency over tcp")
        zmq_latency = zmq_peer.run_latency(
            tcp_endpoint(), plan.latency_size, plan.warmup, plan.udp_samples, plan.time_limit_s
        )
        raw["udp.pyzmq.latency"] = zmq_latency

    # Rounds interleave the contenders (see the IPC suite); the medians are reported.
    tp: dict[str, list[dict[str, Any]]] = {}
    for round_no in range(plan.rounds if do_throughput else 0):
        tag = f"udp round {round_no + 1}/{plan.rounds}"
        with drivers.start() as (directory, pid):
            for size in plan.sizes:
                progress(f"{tag}: slipstream throughput {size} B")
                tp.setdefault(f"udp.slipstream.throughput.{size}B", []).append(
                    _with_counters(
                        directory,
                        ipc.run_throughput,
                        stream,
                        size,
                        plan.udp_messages,
                        plan.time_limit_s,
                        driver_pid=pid,
                        channel=udp_channel(),
                        wait=plan.udp_wait,
                    )
                )
                stream += 10
        for size in plan.sizes:
            for pure in (False, True):  # the C fast path and the pure-Python reference, drivers included
                progress(f"{tag}: slipstream throughput {size} B, invoker-mode drivers in the clients{PURE[pure]}")
                tp.setdefault(f"udp.slipstream.invoker{'.pure' if pure else ''}.throughput.{size}B", []).append(
                    _invoker_run(shm, stream, size, plan.udp_messages, plan.time_limit_s, udp_channel(), plan, pure)
                )
                stream += 10
        for size in plan.sizes:  # no slipstream driver runs during these
            progress(f"{tag}: pyzmq PUSH/PULL throughput {size} B over tcp")
            tp.setdefault(f"udp.pyzmq.throughput.{size}B", []).append(
                zmq_peer.run_throughput(tcp_endpoint(), size, plan.udp_messages, plan.time_limit_s)
            )
    if do_throughput:
        size = plan.bulk_message_size
        count = max(2, plan.bulk_bytes // size)
        progress(f"udp: slipstream bulk {size_label(count * size)} in {size_label(size)} messages")
        with drivers.start() as (directory, pid):
            tp["udp.slipstream.bulk"] = [
                _with_counters(
                    directory,
                    ipc.run_throughput,
                    stream,
                    size,
                    count,
                    plan.bulk_time_limit_s,
                    driver_pid=pid,
                    channel=udp_channel(mtu=BULK_MTU),
                    assemble=True,
                    wait=plan.udp_wait,
                )
            ]
        for pure in (False, True):
            label = f"udp: slipstream bulk {size_label(count * size)}, invoker-mode drivers in the clients"
            progress(label + PURE[pure])
            channel = udp_channel(mtu=BULK_MTU)
            run = _invoker_run(shm, stream, size, count, plan.bulk_time_limit_s, channel, plan, pure, assemble=True)
            tp[f"udp.slipstream.invoker{'.pure' if pure else ''}.bulk"] = [run]
            stream += 10
        progress(f"udp: pyzmq bulk {size_label(count * size)} in {size_label(size)} messages over tcp")
        tp["udp.pyzmq.bulk"] = [zmq_peer.run_throughput(tcp_endpoint(), size, count, plan.bulk_time_limit_s)]
    raw.update(tp)

    if do_throughput:
        wait = "busy-spin" if plan.udp_wait == "spin" else "sched_yield"
        for size in plan.sizes:
            runs, zmq_runs = tp[f"udp.slipstream.throughput.{size}B"], tp[f"udp.pyzmq.throughput.{size}B"]
            result.rows.append(
                report.throughput_row(
                    f"udp.throughput.{size}B",
                    f"UDP throughput {size_label(size)} (clients {wait} when idle) vs PUSH/PULL tcp",
                    runs,
                    zmq_runs,
                    suite="udp",
                    details={"channel": runs[0]["params"]["channel"]},
                )
            )
            notes.append(report.refusals_note(f"UDP throughput {size_label(size)}", runs))
            notes.append(_counters_note(f"UDP throughput {size_label(size)}", runs))
            notes.append(report.zmq_spread_note(f"tcp throughput {size_label(size)}", zmq_runs))
            for pure in (False, True):
                runs = tp[f"udp.slipstream.invoker{'.pure' if pure else ''}.throughput.{size}B"]
                result.rows.append(
                    report.throughput_row(
                        f"udp.throughput.{size}B.invoker{'.pure' if pure else ''}",
                        f"UDP throughput {size_label(size)}, clients run invoker-mode drivers{PURE[pure]}"
                        " vs PUSH/PULL tcp",
                        runs,
                        zmq_runs,
                        suite="udp",
                        details={"channel": runs[0]["params"]["channel"], "driver": "invoker mode, one per side"},
                    )
                )
                notes.append(report.refusals_note(f"UDP throughput {size_label(size)} invoker{PURE[pure]}", runs))
        runs, zmq_runs = tp["udp.slipstream.bulk"], tp["udp.pyzmq.bulk"]
        size = plan.bulk_message_size
        total = runs[0]["params"]["count"] * size
        result.rows.append(
            report.throughput_row(
                f"udp.bulk.{size}B",
                f"UDP bulk {size_label(total)} in {size_label(size)} messages, mtu {BULK_MTU} vs PUSH/PULL tcp",
                runs,
                zmq_runs,
                suite="udp",
                unit="MB/s",
                details={
                    "channel": runs[0]["params"]["channel"],
                    "bytes_planned": total,
                    "slipstream_bytes_received": runs[0]["subscriber"]["received"] * size,
                    "pyzmq_bytes_received": zmq_runs[0]["pull"]["received"] * size,
                },
            )
        )
        notes.append(report.refusals_note(f"UDP bulk {size_label(size)} messages", runs))
        notes.append(_counters_note("UDP bulk", runs))
        for pure in (False, True):
            runs = tp[f"udp.slipstream.invoker{'.pure' if pure else ''}.bulk"]
            result.rows.append(
                report.throughput_row(
                    f"udp.bulk.{size}B.invoker{'.pure' if pure else ''}",
                    f"UDP bulk {size_label(total)}, mtu {BULK_MTU}, clients run invoker-mode drivers{PURE[pure]}"
                    " vs PUSH/PULL tcp",
                    runs,
                    zmq_runs,
                    suite="udp",
                    unit="MB/s",
                    details={"channel": runs[0]["params"]["channel"], "driver": "invoker mode, one per side"},
                )
            )
            notes.append(report.refusals_note(f"UDP bulk {size_label(size)} messages, invoker{PURE[pure]}", runs))
    if do_latency:
        for key, _, _, title in LATENCY_MODES:
            slip = raw[f"udp.slipstream.latency.{key}"]
            rows, note = report.latency_rows(
                f"udp.latency.{plan.latency_size}B.{key}", title, slip, zmq_latency, suite="udp", size=plan.latency_size
            )
            result.rows.extend(rows)
            notes.append(f"UDP latency {key}: {note}")
    if drivers.profiles:
        raw["udp.driver_profiles"] = drivers.profiles
        notes.append(f"UDP drivers ran under cProfile (figures slowed accordingly): {', '.join(drivers.profiles)}")
    return result
