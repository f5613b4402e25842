"""IPC across real processes: one driver, publishers and subscribers in separate interpreters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slipstream import MediaDriver

PEER = str(Path(__file__).with_name("ipc_peer.py"))


class Peer:
    """A peer process whose stdout lines we can wait for, with a bound on every wait."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, PEER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def expect(self, line: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), True)
        while time.monotonic() < deadline:
            got = self.proc.stdout.readline().strip()
            if got == line:
                return
            if not got and self.proc.poll() is not None:
                break
        self.proc.kill()
        raise AssertionError(f"peer did not print {line!r}: {self.proc.stderr.read() if self.proc.stderr else ''}")

    def result(self, timeout: float = 120.0) -> dict[str, object]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"peer timed out: {err}") from None
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"peer printed no result (rc {self.proc.returncode}): {err}"
        result: dict[str, object] = json.loads(lines[-1])
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.fixture
def peers():  # type: ignore[no-untyped-def]
    made: list[Peer] = []

    def make(*args: str) -> Peer:
        peer = Peer(*args)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.kill()


def test_million_messages_of_random_sizes_between_processes(driver: MediaDriver, peers) -> None:  # type: ignore[no-untyped-def]
    common = ["--dir", str(driver.directory), "--count", "1000000", "--seed", "7"]
    sub = peers("subscribe", *common)
    sub.expect("ready")
    pub = peers("publish", *common)
    sent = pub.result(timeout=240)
    received = sub.result(timeout=240)
    assert "error" not in sent, sent
    assert received["received"] == sent["sent"] == 1_000_000
    assert received["errors"] == 0 and received["crc"] == sent["crc"]
    assert isinstance(sent["back_pressured"], int) and sent["back_pressured"] > 0


def test_slow_subscriber_back_pressures_and_gets_everything(driver: MediaDriver, peers) -> None:  # type: ignore[no-untyped-def]
    common = ["--dir", str(driver.directory), "--count", "30000", "--seed", "3"]
    sub = peers("subscribe", "--slow", "--expect-eos", *common)
    sub.expect("ready")
    sent = peers("publish", *common).result()
    received = sub.result()
    assert received["received"] == sent["sent"] == 30000
    assert received["errors"] == 0 and received["crc"] == sent["crc"]
    assert isinstance(sent["back_pressured"], int) and sent["back_pressured"] > 0
    assert received["end_of_stream"] is True


def test_sigkill_of_one_subscriber_releases_the_publisher(driver: MediaDriver, peers) -> None:  # type: ignore[no-untyped-def]
    common = ["--dir", str(driver.directory), "--count", "200000", "--seed", "5"]
    healthy = peers("subscribe", *common)
    stuck = peers("subscribe", "--stall-after", "2000", *common)
    healthy.expect("ready")
    stuck.expect("ready")
    pub = peers("publish", *common)
    stuck.expect("stalled")
    time.sleep(0.5)  # the publisher is now held back by the stalled subscriber
    killed_at = time.monotonic()
    os.kill(stuck.proc.pid, signal.SIGKILL)
    sent = pub.result()
    released_after = time.monotonic() - killed_at
    received = healthy.result()
    assert "error" not in sent, sent
    assert received["received"] == sent["sent"] == 200000 and received["errors"] == 0
    assert sent["back_pressured"] > 0
    liveness_s = driver.config.client_liveness_timeout_ns / 1e9
    assert released_after < liveness_s + 30  # bounded: released within the liveness timeout plus the tail of the run
