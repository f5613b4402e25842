"""Headless Chromium for tests that look at a page as a person would: the pipeline's report, the docs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=10000",
]

CONSOLE_LOGGING = ["--enable-logging=stderr", "--v=0"]
"""Extra flags: every console message of the page (``console.*`` and uncaught errors) goes to stderr."""
_CONSOLE_LINE = re.compile(r"^\[[^\]]*:CONSOLE[^\]]*\] (.*)$", re.M)


def chromium(args: list[str], profile: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with ``args`` (``--dump-dom URL``, ``--screenshot=...``), bounded by ``timeout``."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is missing: `make test` installs it (scripts/ensure-system-deps.sh)")
    return subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout
    )


def console_messages(stderr: str) -> list[str]:
    """The page's console messages in the stderr of a run with :data:`CONSOLE_LOGGING`."""
    return _CONSOLE_LINE.findall(stderr)
