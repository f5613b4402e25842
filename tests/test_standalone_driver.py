"""A standalone media driver shared by several client processes, and liveness in both directions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream import Context, DriverLostError
from slipstream.files.cnc import CncFile

from .test_udp import free_port

LIVENESS_S = 2.0


@pytest.fixture
def standalone(driver_dir: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "driver", "--dir", str(driver_dir),
         "--client-liveness-timeout", str(LIVENESS_S)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "media driver running" in line, proc.stderr.read() if proc.stderr else ""
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sub_positions(directory: Path) -> int:
    cnc = CncFile.open(directory)
    try:
        return sum(1 for c in cnc.counters_reader() if c.label.startswith("sub-pos"))
    finally:
        cnc.close()


def test_three_processes_and_a_killed_subscriber(standalone, driver_dir: Path, peers) -> None:  # type: ignore[no-untyped-def]
    udp = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    common = ["--dir", str(driver_dir), "--count", "100000", "--seed", "4"]
    ipc_sub = peers("subscribe", "--channel", "aeron:ipc", "--stall-after", "3000", *common)
    udp_sub = peers("subscribe", "--channel", udp, *common)
    ipc_sub.expect("ready")
    udp_sub.expect("ready")
    pub = peers("publish", "--channel", "aeron:ipc", "--channel", udp, "--tolerate-disconnect", *common)
    ipc_sub.expect("stalled")
    assert sub_positions(driver_dir) == 2
    os.kill(ipc_sub.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    deadline = killed_at + LIVENESS_S + 5
    while sub_positions(driver_dir) != 1:
        assert time.monotonic() < deadline, "driver kept the dead subscriber's position"
        time.sleep(0.05)
    released_s = time.monotonic() - killed_at
    sent = pub.result()
    received = udp_sub.result()
    assert "error" not in sent, sent
    assert sent["dropped"] == ["aeron:ipc"]  # its only subscriber died; the UDP stream went on
    assert received["received"] == 100000 and received["errors"] == 0 and received["crc"] == sent["crc"]
    assert released_s <= LIVENESS_S + 1


def test_client_reports_a_killed_driver(standalone, driver_dir: Path) -> None:  # type: ignore[no-untyped-def]
    lost = threading.Event()
    with Context(driver_dir, driver="external", on_driver_lost=lambda error: lost.set()) as ctx:
        pub = ctx.add_exclusive_publication("aeron:ipc", 3)
        standalone.kill()
        assert lost.wait(LIVENESS_S + 1)
        assert isinstance(ctx.driver_error, DriverLostError) and "went away" in str(ctx.driver_error)
        with pytest.raises(DriverLostError):
            ctx.add_subscription("aeron:ipc", 3)
        assert pub.offer(b"x") == -4  # CLOSED


def test_client_reports_a_hung_driver(standalone, driver_dir: Path) -> None:  # type: ignore[no-untyped-def]
    lost = threading.Event()
    with Context(driver_dir, driver="external", on_driver_lost=lambda error: lost.set()) as ctx:
        os.kill(standalone.pid, signal.SIGSTOP)
        try:
            assert lost.wait(LIVENESS_S * 3)
            assert "heartbeat" in str(ctx.driver_error)
        finally:
            os.kill(standalone.pid, signal.SIGCONT)


def test_restarted_driver_serves_new_clients(driver_dir: Path) -> None:
    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slipstream", "driver", "--dir", str(driver_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert proc.stdout is not None and "running" in proc.stdout.readline()
        return proc

    first = start()
    first.kill()
    first.wait()
    second = start()  # the directory is reclaimed from the dead driver
    try:
        with Context(driver_dir, driver="external") as ctx:
            sub = ctx.add_subscription("aeron:ipc", 4)
            pub = ctx.add_exclusive_publication("aeron:ipc", 4)
            deadline = time.monotonic() + 5
            while not (pub.is_connected and sub.image_count):
                assert time.monotonic() < deadline
                time.sleep(0.001)
        again = subprocess.run(
            [sys.executable, "-m", "slipstream", "driver", "--dir", str(driver_dir)],
            capture_output=True, text=True, timeout=30,
        )
        assert again.returncode == 2 and "already uses" in again.stderr
    finally:
        second.send_signal(signal.SIGINT)
        second.wait(10)
