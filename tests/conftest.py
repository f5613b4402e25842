"""Shared fixtures: a fresh driver directory in shared memory, and a driver serving it."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream import DriverConfig, MediaDriver


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
