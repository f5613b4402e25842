"""Shared fixtures: a fresh driver directory in shared memory, and a driver serving it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream import DriverConfig, MediaDriver

# Every JVM the tests start (the suite's Spark, spark-submit, a standalone master and worker and their
# executors, the sink's child queries) lives for seconds to minutes: the client compiler alone (C1) gets
# such a run done sooner than the tiered pair, whose C2 compilations a short run never earns back (the
# standalone-cluster test: 185 s -> 130 s). The results are the same; a developer's own setting wins.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")


@pytest.fixture
def driver_dir() -> Iterator[Path]:
    path = Path("/dev/shm") / f"slipstream-test-{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def driver(driver_dir: Path) -> Iterator[MediaDriver]:
    """A media driver on a thread of the test process, serving clients in other processes."""
    config = DriverConfig(directory=driver_dir, client_liveness_timeout_ns=2_000_000_000, ipc_term_length=1 << 20)
    media_driver = MediaDriver(config).launch_embedded()
    yield media_driver
    media_driver.close()


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


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local Spark (local[2], UI off) for the whole test run: start-up costs ~10 s, paid once."""
    pytest.importorskip("pyspark")
    from slipstream.pipeline.session import spark_session

    session = spark_session("local[2]", app_name="slipstream-tests")
    yield session
    session.stop()
