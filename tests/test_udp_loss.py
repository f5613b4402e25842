"""Reliable UDP under real packet loss: nftables drops datagrams inside a network namespace."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slipstream.files.cnc import CncFile
from slipstream.files.loss_report import read_loss_report
from slipstream.testing import Namespace, drop_random_udp, require_netns

PORT = 40501
MESSAGES = 90_000  # about 50 MB with the peer's size mix (mean ~560 bytes, up to 6000)


def cli(command: str, directory: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "slipstream", command, "--dir", str(directory), *args],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def counters(directory: Path) -> dict[str, int]:
    cnc = CncFile.open(directory)
    try:
        return {c.label: c.value for c in cnc.counters_reader()}
    finally:
        cnc.close()


@pytest.mark.parametrize(
    ("percent", "gso"),
    [
        # With GSO (the default) the sender hands the kernel batches that loopback delivers whole, so
        # the rule drops bursts of datagrams; without it every datagram is dropped on its own.
        (5, True),
        (20, True),
        (5, False),
    ],
)
def test_reliable_stream_survives_random_loss(percent: int, gso: bool, driver_dir: Path, tmp_path: Path) -> None:
    require_netns()
    peer = str(Path(__file__).with_name("ipc_peer.py"))
    config = tmp_path / "driver.toml"
    config.write_text(f"udp_gso = {'true' if gso else 'false'}\n")
    with Namespace(f"loss{percent}") as ns:
        rule = drop_random_udp(ns, PORT, percent)
        driver = ns.popen([sys.executable, "-m", "slipstream", "driver", "--dir", str(driver_dir),
                           "--config", str(config)])
        try:
            assert driver.stdout is not None and "running" in driver.stdout.readline()
            channel = f"aeron:udp?endpoint=127.0.0.1:{PORT}"
            common = ["--dir", str(driver_dir), "--channel", channel, "--count", str(MESSAGES), "--seed", "2",
                      "--timeout", "150"]
            sub = subprocess.Popen([sys.executable, peer, "subscribe", "--expect-eos", *common],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert sub.stdout is not None and sub.stdout.readline().strip() == "ready"
            started = time.monotonic()
            pub = subprocess.run([sys.executable, peer, "publish", *common], capture_output=True, text=True,
                                 timeout=200)
            elapsed = time.monotonic() - started
            out, err = sub.communicate(timeout=60)
            sent = json.loads(pub.stdout.splitlines()[-1])
            received = json.loads(out.splitlines()[-1])
            assert "error" not in sent, (sent, pub.stderr)
            assert received["received"] == sent["sent"] == MESSAGES, err
            assert received["errors"] == 0 and received["crc"] == sent["crc"]  # every byte, once, in order
            assert sent["position"] >= 50 * 1000 * 1000
            assert rule.dropped() > 0
            totals = counters(driver_dir)
            assert totals["NAKs sent"] > 0 and totals["NAKs received"] > 0
            assert totals["Retransmits sent"] > 0
            losses = list(read_loss_report(driver_dir))
            assert losses and losses[0].total_bytes_lost > 0 and losses[0].stream_id == 1001
            # The same, as a user reads it with the driver's tools.
            loss = cli("loss", driver_dir)
            assert losses[0].csv() in loss
            stat = cli("stat", driver_dir, "--once")
            assert re.search(r"[1-9][\d,]* - NAKs received", stat)
            assert re.search(r"[1-9][\d,]* - Retransmits sent", stat)
            print(f"{percent}% loss (gso {gso}): {sent['position'] / elapsed / 1e6:.1f} MB/s, "
                  f"{rule.dropped()} packets dropped, NAKs {totals['NAKs sent']}, "
                  f"retransmits {totals['Retransmits sent']}")
        finally:
            driver.terminate()
            driver.wait(10)
