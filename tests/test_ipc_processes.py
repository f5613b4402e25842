"""IPC across real processes: one driver, publishers and subscribers in separate interpreters."""

from __future__ import annotations

import os
import signal
import time

from slipstream import MediaDriver


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
