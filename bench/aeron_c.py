"""The Aeron C yardstick: the reference media driver (``aeronmd``) and its C client samples, on this machine.

``python -m bench.aeron_c --aeron-dir DIR`` (default: ``$SLIPSTREAM_AERON_C_DIR``) runs a prebuilt Aeron C
(built by the user outside this repository; nothing of Aeron lives here) through the same figures as
slipstream's suites: IPC throughput 32 B and 1 KiB (``streaming_publisher`` -> ``rate_subscriber`` on
``aeron:ipc``), UDP loopback throughput 32 B, 1 KiB and bulk (64 KiB messages, MTU 1408) on
``aeron:udp?endpoint=127.0.0.1:<port>``, and round trips (``cping``/``cpong``) over IPC and UDP. Each run
gets its own ``aeronmd`` in a fresh directory under /dev/shm, settings on its command line, stopped
(SIGINT, then SIGKILL) whatever happens; every sample has a fixed count and a time limit. The figures are
the samples' own printed ones, parsed. Without a build, every row is reported "not measured" with the
reason, so a full ``python -m bench`` never fails for want of Aeron.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from . import measure_parallelism, scratch_dir
from .report import RESULTS_DIR, Row, median, progress, size_label

ENV_VAR = "SLIPSTREAM_AERON_C_DIR"
SUITE = "aeron-c"
BINARIES = ("aeronmd", "streaming_publisher", "rate_subscriber", "cping", "cpong")
LOOPBACK = "127.0.0.1"
BULK_MTU = 1408
STREAM_ID = 1001
PING_STREAM_ID = 1002
PONG_STREAM_ID = 1003
DRIVER_SETTINGS: dict[str, str] = {
    # Aeron's defaults written out, plus slipstream's receive-side defaults (its driver's so_rcvbuf and
    # receiver_window), so both stand on the same socket buffers. One driver thread (SHARED): the machine
    # this was written on has two cores and every sample busy-spins.
    "aeron.threading.mode": "SHARED",
    "aeron.term.buffer.length": str(16 * 1024 * 1024),
    "aeron.ipc.term.buffer.length": str(64 * 1024 * 1024),
    "aeron.mtu.length": "1408",
    "aeron.socket.so_rcvbuf": str(2 * 1024 * 1024),
    "aeron.rcv.initial.window.length": str(1024 * 1024),
    "aeron.dir.delete.on.start": "true",
    "aeron.dir.delete.on.shutdown": "true",
}
SLIPSTREAM_ROWS = {
    # Aeron C row -> the slipstream row of ``python -m bench`` measured in the same setup.
    "aeron_c.ipc.throughput.32B": "throughput.32B.standalone",
    "aeron_c.ipc.throughput.1024B": "throughput.1024B.standalone",
    "aeron_c.ipc.latency.32B.p50": "latency.32B.spin.p50",
    "aeron_c.ipc.latency.32B.p99": "latency.32B.spin.p99",
    "aeron_c.udp.throughput.32B": "udp.throughput.32B",
    "aeron_c.udp.throughput.1024B": "udp.throughput.1024B",
    "aeron_c.udp.bulk.65536B": "udp.bulk.65536B",
    "aeron_c.udp.latency.32B.p50": "udp.latency.32B.spin.p50",
    "aeron_c.udp.latency.32B.p99": "udp.latency.32B.spin.p99",
}
PERCENTILES = (50.0, 99.0)


class AeronCError(RuntimeError):
    """A sample or the driver failed, or missed a deadline: the row is not measured, the suite goes on."""


@dataclass(frozen=True, slots=True)
class AeronCPlan:
    """Counts and limits. UDP counts are smaller than IPC ones: without GSO the reference driver makes
    a system call per datagram, which on a small VM bounds it to tens of thousands of datagrams a second."""

    ipc_messages: dict[int, int] = field(default_factory=lambda: {32: 10_000_000, 1024: 2_000_000})
    udp_messages: dict[int, int] = field(default_factory=lambda: {32: 3_000_000, 1024: 300_000})
    bulk_bytes: int = 512 << 20
    bulk_message_size: int = 64 * 1024
    latency_size: int = 32
    ipc_samples: int = 100_000
    udp_samples: int = 3000
    rounds: int = 3
    time_limit_s: float = 60.0


QUICK_PLAN = AeronCPlan(
    ipc_messages={32: 200_000, 1024: 50_000},
    udp_messages={32: 100_000, 1024: 20_000},
    bulk_bytes=4 << 20,
    ipc_samples=2000,
    udp_samples=200,
    rounds=1,
    time_limit_s=20.0,
)


@dataclass(slots=True)
class YardstickRow:
    """One Aeron C figure, and beside it the matching slipstream figure of the same invocation when the
    slipstream suites ran too. ``ratio`` > 1 favours slipstream, as in every other row."""

    id: str
    benchmark: str
    kind: Literal["throughput", "latency"]
    unit: str
    aeron_c: float
    aeron_c_extra: str = ""
    slipstream: float = math.nan
    slipstream_row: str = ""
    ratio: float = math.nan
    details: dict[str, Any] = field(default_factory=dict)
    suite: str = SUITE

    def compare(self, slip: Row) -> None:
        self.slipstream, self.slipstream_row = slip.slipstream, slip.id
        if self.kind == "throughput":
            self.ratio = self.slipstream / self.aeron_c if self.aeron_c > 0 else math.nan
        else:
            self.ratio = self.aeron_c / self.slipstream if self.slipstream > 0 else math.nan


@dataclass(slots=True)
class AeronCResult:
    rows: list[YardstickRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    not_measured: list[dict[str, str]] = field(default_factory=list)


PLANNED = {
    "aeron_c.ipc.throughput.32B": "Aeron C IPC throughput 32 B",
    "aeron_c.ipc.throughput.1024B": "Aeron C IPC throughput 1 KiB",
    "aeron_c.ipc.latency.32B": "Aeron C IPC round trip 32 B",
    "aeron_c.udp.throughput.32B": "Aeron C UDP throughput 32 B",
    "aeron_c.udp.throughput.1024B": "Aeron C UDP throughput 1 KiB",
    "aeron_c.udp.bulk.65536B": "Aeron C UDP bulk, 64 KiB messages",
    "aeron_c.udp.latency.32B": "Aeron C UDP round trip 32 B",
    "aeronmd.slipstream.udp.latency.32B": "slipstream ping/pong on aeronmd, UDP round trip 32 B",
    "aeronmd.slipstream.ipc.throughput.32B": "slipstream IPC throughput 32 B on aeronmd and on its own driver",
}
ON_AERONMD = ("aeronmd.slipstream.udp.latency.32B", "aeronmd.slipstream.ipc.throughput.32B")
"""Rows of slipstream's own clients on the reference driver (``Context(dir, driver="external")`` on an
aeronmd directory), beside the C samples on the same driver settings."""


def find_binaries(aeron_dir: str | os.PathLike[str] | None) -> tuple[dict[str, Path], str]:
    """The samples by name, looked for in DIR, DIR/binaries and DIR/build/binaries (a cmake build tree
    puts them in ``binaries/``), or an empty dict and the reason."""
    if not aeron_dir:
        return {}, f"no Aeron C build given (--aeron-dir or ${ENV_VAR})"
    base = Path(aeron_dir)
    for candidate in (base, base / "binaries", base / "build" / "binaries"):
        found = {name: candidate / name for name in BINARIES}
        if all(path.is_file() and os.access(path, os.X_OK) for path in found.values()):
            return found, ""
    missing = [name for name in BINARIES if not (base / "binaries" / name).is_file() and not (base / name).is_file()]
    return {}, f"Aeron C binaries missing under {base}: {', '.join(missing) or 'not executable'}"


class Sample:
    """One Aeron process whose stdout lines are collected by a thread, so waits on them are bounded.
    stdout goes through ``stdbuf -oL`` where it exists: the samples print with stdio, which a pipe would
    otherwise buffer until exit."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        self.name = name
        prefix = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        self.argv = [*prefix, *argv]
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[str], bool], timeout_s: float) -> str:
        """The first line (already printed or yet to come) for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if predicate(line):
                        return line
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AeronCError(f"{self.name} exited ({self.proc.returncode}): {self.tail()}")
                if remaining <= 0:
                    raise AeronCError(f"{self.name}: expected line not seen within {timeout_s:g} s: {self.tail()}")
                self._cond.wait(min(remaining, 0.1))

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(2.0)
        return code

    def interrupt(self, timeout_s: float = 5.0) -> int:
        """SIGINT (the samples' own way to stop and report), then SIGKILL if it does not go."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
        code = self.wait_exit(timeout_s)
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(5.0)
            self._reader.join(2.0)
        return code

    def tail(self, lines: int = 8) -> str:
        with self._cond:
            return " | ".join(self.lines[-lines:])


@contextlib.contextmanager
def sample(name: str, argv: Sequence[str], env: dict[str, str]) -> Iterator[Sample]:
    """A sample process that is gone when the block ends, however it ends."""
    proc = Sample(name, argv, env)
    try:
        yield proc
    finally:
        proc.interrupt()


@contextlib.contextmanager
def aeron_driver(
    binaries: dict[str, Path], directory: Path, settings: dict[str, str] | None = None
) -> Iterator[dict[str, str]]:
    """A standalone ``aeronmd`` serving ``directory``; yields the environment for its clients (AERON_DIR).
    The driver is stopped when the block ends and the directory removed."""
    env = dict(os.environ, AERON_DIR=str(directory))
    argv = [str(binaries["aeronmd"]), f"-Daeron.dir={directory}"]
    argv += [f"-D{name}={value}" for name, value in (settings or DRIVER_SETTINGS).items()]
    driver = Sample("aeronmd", argv, env)
    try:
        deadline = time.monotonic() + 10.0
        cnc = directory / "cnc.dat"
        while not (cnc.exists() and cnc.stat().st_size > 0):
            if driver.proc.poll() is not None:
                raise AeronCError(f"aeronmd exited ({driver.proc.returncode}): {driver.tail()}")
            if time.monotonic() > deadline:
                raise AeronCError(f"aeronmd made no {cnc} within 10 s: {driver.tail()}")
            time.sleep(0.02)
        time.sleep(0.1)  # the CnC file exists before the driver has finished writing its header
        yield env
    finally:
        driver.interrupt()
        shutil.rmtree(directory, ignore_errors=True)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def udp_channel(**params: int) -> str:
    extra = "".join(f"|{name}={value}" for name, value in params.items())
    return f"aeron:udp?endpoint={LOOPBACK}:{free_udp_port()}{extra}"


_TOTAL = re.compile(
    r"Total: (?P<ms>\d+)ms, (?P<mps>[\d.e+-]+) msgs/sec, (?P<bps>[\d.e+-]+) bytes/sec, totals (?P<n>\d+) messages"
)
_REPORT = re.compile(r"^(?P<ms>\d+)ms, (?P<mps>[\d.e+-]+) msgs/sec, .* totals (?P<n>\d+) messages")
_BACK_PRESSURE = re.compile(r"Publisher back pressure ratio (?P<ratio>[\d.e+-]+|nan|inf)")
_HISTOGRAM = re.compile(r"^\s*(?P<value>[\d.]+)\s+(?P<pct>[\d.]+)\s+(?P<count>\d+)\s+(?:[\d.]+|inf)\s*$")
_TOTAL_COUNT = re.compile(r"Total count\s*=\s*(?P<n>\d+)")
_MEAN = re.compile(r"Mean\s*=\s*(?P<mean>[\d.]+)")
_MAX = re.compile(r"Max\s*=\s*(?P<max>[\d.]+)")


def parse_publisher(lines: Sequence[str]) -> dict[str, Any]:
    """``streaming_publisher``'s closing lines: its own rate over the whole run, and how often its
    offer was refused (back-pressure ratio: refusals per message sent)."""
    result: dict[str, Any] = {}
    for line in lines:
        if m := _TOTAL.search(line):
            result.update(
                duration_ms=int(m["ms"]), msgs_per_s=float(m["mps"]), bytes_per_s=float(m["bps"]), sent=int(m["n"])
            )
        elif m := _BACK_PRESSURE.search(line):
            result["back_pressure_ratio"] = float(m["ratio"])
    if "msgs_per_s" not in result:
        raise AeronCError(f"no 'Total:' line from streaming_publisher: {' | '.join(lines[-8:])}")
    return result


def parse_reports(lines: Sequence[str]) -> list[dict[str, Any]]:
    """``rate_subscriber``'s once-a-second reports: interval, rate, running total of messages."""
    return [
        {"ms": int(m["ms"]), "msgs_per_s": float(m["mps"]), "total": int(m["n"])}
        for line in lines
        if (m := _REPORT.match(line))
    ]


def parse_histogram(lines: Sequence[str]) -> dict[str, Any]:
    """``cping``'s HdrHistogram percentile table (values already in microseconds): the smallest value
    at or above each percentile, as nearest-rank percentiles elsewhere in the benchmarks."""
    table = [(float(m["value"]), float(m["pct"]), int(m["count"])) for line in lines if (m := _HISTOGRAM.match(line))]
    if not table:
        raise AeronCError(f"no percentile table from cping: {' | '.join(lines[-8:])}")
    summary: dict[str, Any] = {"count": table[-1][2]}
    for line in lines:
        if m := _TOTAL_COUNT.search(line):
            summary["count"] = int(m["n"])
        if m := _MEAN.search(line):
            summary["mean_us"] = float(m["mean"])
        if m := _MAX.search(line):
            summary["max_us"] = float(m["max"])
    for pct in (50.0, 90.0, 99.0, 99.9):
        summary[f"p{pct:g}_us"] = next((value for value, p, _ in table if p >= pct / 100.0), table[-1][0])
    summary["min_us"] = table[0][0]
    return summary


def run_throughput(
    binaries: dict[str, Path], env: dict[str, str], channel: str, size: int, count: int, time_limit_s: float
) -> dict[str, Any]:
    """``rate_subscriber`` joined first, then ``streaming_publisher`` sends ``count`` messages; the row
    takes the publisher's own rate (it retries every refused offer, so over a run much longer than its
    window it cannot outrun the subscriber), and the subscriber's total checks that all arrived."""
    directory = env["AERON_DIR"]
    started = time.monotonic()
    common = ["-p", directory, "-c", channel, "-s", str(STREAM_ID)]
    with sample("rate_subscriber", [str(binaries["rate_subscriber"]), *common], env) as sub:
        sub.wait_for(lambda line: line.startswith("Subscription channel status"), 10.0)
        argv = [str(binaries["streaming_publisher"]), *common, "-L", str(size), "-m", str(count)]
        with sample("streaming_publisher", argv, env) as pub:
            code = pub.wait_exit(time_limit_s)
            timed_out = code is None
            if timed_out:
                code = pub.interrupt()  # stops the loop; the sample still prints its totals
        publisher = parse_publisher(pub.lines)
        publisher["exit_code"] = code
        sent = int(publisher.get("sent", 0)) if not timed_out else None
        # The subscriber reports once a second; wait for a report that counts everything sent.
        with contextlib.suppress(AeronCError):
            sub.wait_for(
                lambda line: bool((m := _REPORT.match(line)) and sent is not None and int(m["n"]) >= sent),
                max(3.0, min(15.0, time_limit_s)),
            )
        sub.interrupt()
        reports = parse_reports(sub.lines)
    received = reports[-1]["total"] if reports else 0
    busy = [r["msgs_per_s"] for r in reports if r["msgs_per_s"] > 0 and r["ms"] >= 900]
    return {
        "channel": channel,
        "size": size,
        "count": count,
        "msgs_per_s": publisher["msgs_per_s"],
        "mb_per_s": publisher["msgs_per_s"] * size / 1e6,
        "publisher": publisher,
        "received": received,
        "subscriber_report_rates": busy,
        "timed_out": timed_out,
        "wall_s": time.monotonic() - started,
    }


def run_latency(
    binaries: dict[str, Path], env: dict[str, str], ping: str, pong: str, size: int, samples: int, time_limit_s: float
) -> dict[str, Any]:
    """``cpong`` echoes; ``cping`` sends ``samples`` pings one at a time after a warm-up of a tenth as
    many, and prints the round trips' histogram. Both busy-spin, as written."""
    directory = env["AERON_DIR"]
    started = time.monotonic()
    channels = ["-p", directory, "-c", ping, "-C", pong, "-s", str(PING_STREAM_ID), "-S", str(PONG_STREAM_ID)]
    warmup = max(10, samples // 10)
    with sample("cpong", [str(binaries["cpong"]), *channels], env) as ponger:
        ponger.wait_for(lambda line: line.startswith("Publication channel status"), 10.0)
        argv = [str(binaries["cping"]), *channels, "-L", str(size), "-m", str(samples), "-w", str(warmup)]
        with sample("cping", argv, env) as pinger:
            code = pinger.wait_exit(time_limit_s)
            timed_out = code is None
            if timed_out:
                code = pinger.interrupt()  # stops pinging; the sample still prints what it measured
        summary = parse_histogram(pinger.lines)
    return {
        "ping_channel": ping,
        "pong_channel": pong,
        "size": size,
        "samples_planned": samples,
        "warmup": warmup,
        "summary": summary,
        "timed_out": timed_out,
        "exit_code": code,
        "wall_s": time.monotonic() - started,
    }


def _throughput_row(row_id: str, benchmark: str, runs: list[dict[str, Any]], unit: str, size: int) -> YardstickRow:
    rates = [r["msgs_per_s"] for r in runs]
    mbs = [r["mb_per_s"] for r in runs]
    rate, mb = median(rates), median(mbs)
    by_mb = unit == "MB/s"
    return YardstickRow(
        id=row_id,
        benchmark=benchmark,
        kind="throughput",
        unit=unit,
        aeron_c=mb if by_mb else rate,
        aeron_c_extra=f"{rate:.0f} msg/s" if by_mb else f"{mb:.1f} MB/s",
        details={
            "statistic": f"median of {len(runs)} rounds (streaming_publisher's 'Total' rate)",
            "size": size,
            "msgs_per_s_rounds": rates,
            "mb_per_s_rounds": mbs,
            "messages_sent": [r["publisher"].get("sent") for r in runs],
            "messages_received": [r["received"] for r in runs],
            "back_pressure_ratio": [r["publisher"].get("back_pressure_ratio") for r in runs],
            "stopped_at_time_limit": any(r["timed_out"] for r in runs),
            "missing_messages": sum(max(0, (r["publisher"].get("sent") or 0) - r["received"]) for r in runs),
        },
    )


def _latency_rows(prefix: str, title: str, result: dict[str, Any]) -> list[YardstickRow]:
    summary = result["summary"]
    return [
        YardstickRow(
            id=f"{prefix}.p{pct:g}",
            benchmark=f"RTT {result['size']} B p{pct:g}, {title}",
            kind="latency",
            unit="us",
            aeron_c=summary[f"p{pct:g}_us"],
            details={"samples": summary["count"], "stopped_at_time_limit": result["timed_out"]},
        )
        for pct in PERCENTILES
    ]


def run_suite(
    plan: AeronCPlan, aeron_dir: str | os.PathLike[str] | None, shm: Path, *, only: str | None = None
) -> AeronCResult:
    """Every Aeron C row this build allows; a failing part is recorded as not measured, never raised."""
    result = AeronCResult()
    binaries, reason = find_binaries(aeron_dir)
    do_throughput = only in (None, "throughput")
    do_latency = only in (None, "latency")
    planned = {
        k: v for k, v in PLANNED.items() if (do_latency if ".latency." in k else do_throughput)
    }
    if not binaries:
        result.not_measured.extend({"id": k, "benchmark": v, "reason": reason} for k, v in planned.items())
        return result
    result.raw["aeron_c.settings"] = {
        "binaries": {name: str(path) for name, path in binaries.items()},
        "driver": DRIVER_SETTINGS,
        "plan": asdict(plan),
        "clients": "the C samples as written: busy-spinning publisher, subscriber, ping and pong",
    }
    numbers = iter(range(1, 1_000_000))

    def attempt(key: str, run: Callable[[dict[str, str]], dict[str, Any]]) -> dict[str, Any] | None:
        directory = shm / f"aeronmd-{next(numbers)}"
        try:
            with aeron_driver(binaries, directory) as env:
                return run(env)
        except (AeronCError, OSError, subprocess.SubprocessError) as exc:
            result.not_measured.append({"id": key, "benchmark": PLANNED[key], "reason": f"failed: {exc}"})
            progress(f"aeron-c: {key} failed: {exc}")
            return None

    cases: list[tuple[str, str, str, int, int, Callable[[], str]]] = []
    for size, count in plan.ipc_messages.items():
        cases.append(("ipc", f"aeron_c.ipc.throughput.{size}B", f"IPC throughput {size_label(size)}", size, count,
                      lambda: "aeron:ipc"))  # fmt: skip
    for size, count in plan.udp_messages.items():
        cases.append(("udp", f"aeron_c.udp.throughput.{size}B", f"UDP throughput {size_label(size)}", size, count,
                      udp_channel))  # fmt: skip
    bulk = plan.bulk_message_size
    cases.append(("udp", f"aeron_c.udp.bulk.{bulk}B", f"UDP bulk, {size_label(plan.bulk_bytes)} in "
                  f"{size_label(bulk)} messages, MTU {BULK_MTU}", bulk, max(1, plan.bulk_bytes // bulk),
                  lambda: udp_channel(mtu=BULK_MTU)))  # fmt: skip

    if do_throughput:
        runs: dict[str, list[dict[str, Any]]] = {}
        failed: set[str] = set()
        for round_no in range(plan.rounds):
            for _, key, title, size, count, channel in cases:
                if key in failed:
                    continue
                progress(f"aeron-c round {round_no + 1}/{plan.rounds}: {title} ({count} messages)")
                ch = channel()
                run = attempt(
                    key, lambda env, ch=ch, size=size, count=count: run_throughput(  # type: ignore[misc]
                        binaries, env, ch, size, count, plan.time_limit_s
                    )
                )
                if run is None:
                    failed.add(key)
                    runs.pop(key, None)
                else:
                    runs.setdefault(key, []).append(run)
        result.raw["aeron_c.throughput"] = runs
        for transport, key, title, size, _, _ in cases:
            if key in runs:
                unit = "MB/s" if ".bulk." in key else "msg/s"
                mode = DRIVER_SETTINGS["aeron.threading.mode"]
                where = "aeron:ipc" if transport == "ipc" else f"aeron:udp 127.0.0.1, aeronmd {mode}"
                result.rows.append(_throughput_row(key, f"Aeron C {title} ({where})", runs[key], unit, size))
                row = result.rows[-1]
                note = (
                    f"Aeron C {title}: {len(runs[key])} rounds, "
                    + ", ".join(f"{r / 1e3:.0f}" for r in row.details["msgs_per_s_rounds"])
                    + f" k msg/s; back-pressure ratio {row.details['back_pressure_ratio']}"
                )
                if row.details["missing_messages"]:
                    note += f"; MISSING {row.details['missing_messages']} messages at rate_subscriber"
                result.notes.append(note)

    if do_latency:
        for transport, samples in (("ipc", plan.ipc_samples), ("udp", plan.udp_samples)):
            key = f"aeron_c.{transport}.latency.{plan.latency_size}B"
            progress(f"aeron-c: {transport} round trips ({samples} samples)")
            ping, pong = ("aeron:ipc", "aeron:ipc") if transport == "ipc" else (udp_channel(), udp_channel())
            lat = attempt(
                key, lambda env, ping=ping, pong=pong, samples=samples: run_latency(  # type: ignore[misc]
                    binaries, env, ping, pong, plan.latency_size, samples, plan.time_limit_s
                )
            )
            if lat is None:
                continue
            result.raw[f"aeron_c.{transport}.latency"] = lat
            title = (
                "Aeron C cping/cpong over aeron:ipc, busy-spin"
                if transport == "ipc"
                else "Aeron C cping/cpong over aeron:udp 127.0.0.1, busy-spin clients, aeronmd backoff"
            )
            result.rows.extend(_latency_rows(key, title, lat))
            s = lat["summary"]
            result.notes.append(
                f"Aeron C {transport} RTT: {s['count']} samples, min {s['min_us']:.2f} us, p90 {s['p90_us']:.2f} us, "
                f"max {s.get('max_us', math.nan):.0f} us" + (" (stopped at the time limit)" if lat["timed_out"] else "")
            )
    _slipstream_on_aeronmd(plan, result, attempt, do_latency=do_latency, do_throughput=do_throughput)
    return result


def _aeronmd_pid(env: dict[str, str]) -> int:
    from slipstream.files.cnc import CncFile

    cnc = CncFile.open(Path(env["AERON_DIR"]))
    try:
        return cnc.header.pid
    finally:
        cnc.close()


def _slipstream_on_aeronmd(
    plan: AeronCPlan,
    result: AeronCResult,
    attempt: Callable[[str, Callable[[dict[str, str]], dict[str, Any]]], dict[str, Any] | None],
    *,
    do_latency: bool,
    do_throughput: bool,
) -> None:
    """slipstream's clients on aeronmd: the UDP round trip against the C samples' (target: within 2x),
    and the IPC throughput against slipstream's own standalone driver (target: no worse), run by the
    same workers as ``python -m bench`` (``bench.ipc``), busy-spinning as the C samples do."""
    from . import ipc
    from .report import latency_summary

    by_id = {row.id: row for row in result.rows}
    if do_latency:
        key = "aeronmd.slipstream.udp.latency.32B"
        progress(f"aeron-c: slipstream ping/pong on aeronmd over UDP ({plan.udp_samples} samples)")
        ping, pong = udp_channel(), udp_channel()
        lat = attempt(
            key,
            lambda env: ipc.run_latency(
                Path(env["AERON_DIR"]), PING_STREAM_ID, plan.latency_size, max(10, plan.udp_samples // 10),
                plan.udp_samples, plan.time_limit_s, ping_channel=ping, pong_channel=pong,
                driver_pid=_aeronmd_pid(env),
            ),
        )  # fmt: skip
        if lat is not None:
            summary = latency_summary(lat.pop("rtt_ns"))
            result.raw[key] = {**lat, "summary": summary}
            for pct in PERCENTILES:
                c_row = by_id.get(f"aeron_c.udp.latency.{plan.latency_size}B.p{pct:g}")
                row = YardstickRow(
                    id=f"{key}.p{pct:g}",
                    benchmark=f"RTT {plan.latency_size} B p{pct:g}, slipstream ping/pong clients on aeronmd "
                    "over aeron:udp 127.0.0.1, busy-spin (Aeron C: cping/cpong on the same settings)",
                    kind="latency",
                    unit="us",
                    aeron_c=c_row.aeron_c if c_row is not None else math.nan,
                    slipstream=summary[f"p{pct:g}_us"],
                    slipstream_row="slipstream clients on aeronmd",
                    details={"samples": summary["count"], "stopped_at_time_limit": lat["timed_out"],
                             "target": "ratio >= 0.5 (p50 within 2x of the C samples')"},
                )  # fmt: skip
                if c_row is not None and row.slipstream > 0:
                    row.ratio = row.aeron_c / row.slipstream
                result.rows.append(row)
    if do_throughput:
        key = "aeronmd.slipstream.ipc.throughput.32B"
        count = plan.ipc_messages.get(32, 2_000_000)
        on_aeronmd: list[dict[str, Any]] = []
        on_own: list[dict[str, Any]] = []
        for round_no in range(plan.rounds):
            progress(f"aeron-c round {round_no + 1}/{plan.rounds}: slipstream IPC 32 B on aeronmd, then its own driver")
            run = attempt(
                key,
                lambda env: ipc.run_throughput(
                    Path(env["AERON_DIR"]), STREAM_ID, 32, count, plan.time_limit_s, driver_pid=_aeronmd_pid(env)
                ),
            )
            if run is None:
                return
            on_aeronmd.append(run)
            own_dir = Path(f"{run['params']['directory']}-own")  # beside aeronmd's, in the suite's scratch
            with ipc.standalone_driver(own_dir) as pid:
                on_own.append(ipc.run_throughput(own_dir, STREAM_ID, 32, count, plan.time_limit_s, driver_pid=pid))
            shutil.rmtree(own_dir, ignore_errors=True)
        result.raw[key] = {"on_aeronmd": on_aeronmd, "on_own_driver": on_own}
        rate = median([r["msgs_per_s"] for r in on_aeronmd])
        own = median([r["msgs_per_s"] for r in on_own])
        c_row = by_id.get("aeron_c.ipc.throughput.32B")
        row = YardstickRow(
            id=key,
            benchmark="IPC throughput 32 B, slipstream publisher and subscriber processes on aeronmd "
            "(Aeron C: streaming_publisher -> rate_subscriber)",
            kind="throughput",
            unit="msg/s",
            aeron_c=c_row.aeron_c if c_row is not None else math.nan,
            slipstream=rate,
            slipstream_row="slipstream clients on aeronmd",
            details={
                "statistic": f"median of {len(on_aeronmd)} rounds, alternating with the own-driver runs",
                "on_aeronmd_msgs_per_s_rounds": [r["msgs_per_s"] for r in on_aeronmd],
                "on_own_driver_msgs_per_s_rounds": [r["msgs_per_s"] for r in on_own],
                "on_own_driver_msgs_per_s": own,
                "aeronmd_over_own_driver": rate / own if own > 0 else math.nan,
                "target": "aeronmd_over_own_driver >= 1 (no worse than slipstream's own driver)",
            },
        )
        if c_row is not None and c_row.aeron_c > 0:
            row.ratio = rate / c_row.aeron_c
        result.rows.append(row)
        result.notes.append(
            f"slipstream IPC 32 B: {rate / 1e6:.2f} M msg/s on aeronmd, {own / 1e6:.2f} M msg/s on its own standalone "
            f"driver (ratio {rate / own:.2f}; target >= 1)"
        )


def compare(rows: Sequence[YardstickRow], slip_rows: Sequence[Row]) -> None:
    """Put each slipstream figure of this invocation beside its Aeron C counterpart."""
    by_id = {row.id: row for row in slip_rows}
    for row in rows:
        slip = by_id.get(SLIPSTREAM_ROWS.get(row.id, ""))
        if slip is not None:
            row.compare(slip)


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit == "msg/s":
        return f"{value / 1e6:.3f} M msg/s" if value >= 1e6 else f"{value / 1e3:.1f} k msg/s"
    return f"{value:.1f} {unit}" if value >= 100 else f"{value:.2f} {unit}"


def format_table(rows: Sequence[YardstickRow]) -> str:
    headers = ("benchmark", "Aeron C", "slipstream (this run)", "ratio")
    cells = [
        (
            row.benchmark,
            _fmt(row.aeron_c, row.unit) + (f" ({row.aeron_c_extra})" if row.aeron_c_extra else ""),
            _fmt(row.slipstream, row.unit),
            "-" if math.isnan(row.ratio) else f"{row.ratio:.2f}x",
        )
        for row in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [
        "[Aeron C yardstick: the reference C media driver and C client samples on this machine]",
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    for c in cells:
        lines.append("  ".join((c[0].ljust(widths[0]), *(v.rjust(w) for v, w in zip(c[1:], widths[1:], strict=True)))))
    lines.append("ratio > 1: slipstream is better (throughput slipstream/Aeron C, latency Aeron C/slipstream)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.aeron_c", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--aeron-dir",
        default=os.environ.get(ENV_VAR) or None,
        help=f"Aeron C build (its binaries/ directory or the cmake build tree); default ${ENV_VAR}",
    )
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks the suite works, measures little")
    parser.add_argument("--rounds", type=int, help="throughput rounds, median reported (default 3)")
    parser.add_argument("--time-limit", type=float, help="seconds one sample run may take (default 60)")
    parser.add_argument("--only", choices=("throughput", "latency"), help="run one half of the suite")
    parser.add_argument("--note", default="", help="a remark kept in the JSON (e.g. what else ran on the machine)")
    parser.add_argument("--out", type=Path, help="JSON output (default bench/results/aeron-c-<date>.json)")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.time_limit is not None and args.time_limit <= 0:
        parser.error("--time-limit must be positive")
    return args


def make_plan(quick: bool, rounds: int | None = None, time_limit_s: float | None = None) -> AeronCPlan:
    plan = QUICK_PLAN if quick else AeronCPlan()
    if rounds is not None:
        plan = replace(plan, rounds=rounds)
    if time_limit_s is not None:
        plan = replace(plan, time_limit_s=time_limit_s)
    return plan


def main(argv: list[str] | None = None) -> int:
    from . import report

    args = parse_args(argv)
    plan = make_plan(args.quick, args.rounds, args.time_limit)
    started = datetime.now()
    out: Path = args.out or RESULTS_DIR / f"aeron-c-{started.strftime('%Y-%m-%d-%H%M%S')}.json"
    t0 = time.perf_counter()
    parallelism = measure_parallelism(2, 1.0)
    with scratch_dir("slipstream-bench-aeron-c-", "/dev/shm") as shm:
        result = run_suite(plan, args.aeron_dir, shm, only=args.only)
    result.raw["parallelism_2_busy_processes"] = parallelism
    cores = f"two busy processes got {parallelism:.2f} cores together (os.cpu_count() = {os.cpu_count()})"
    result.notes.insert(0, cores)
    result.notes.append(f"aeron-c suite took {time.perf_counter() - t0:.1f} s")
    notes = list(result.notes)
    notes.extend(f"not measured: {item['benchmark']} ({item['reason']})" for item in result.not_measured)
    report.write_json(
        out,
        started=started,
        options={"suite": SUITE, "quick": args.quick, "only": args.only, "aeron_dir": args.aeron_dir},
        rows=[],
        notes=notes,
        raw=result.raw,
        suites=(SUITE,),
        not_measured=result.not_measured,
        aeron_c=result.rows,
        note=args.note or None,
    )
    print(format_table(result.rows))
    print()
    for note in notes:
        print(f"- {note}")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
