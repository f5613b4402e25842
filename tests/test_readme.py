"""The README's tour is executed, so it cannot drift from the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_snippet_runs(index: int, driver_dir: Path) -> None:
    env = {**os.environ, "SLIPSTREAM_DIR": str(driver_dir)}
    done = subprocess.run(
        [sys.executable, "-c", blocks("python")[index]], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    if index == 0:
        assert "[5, 5, 5000]" in done.stdout and "joined Image(" in done.stdout
    if index == 1:
        assert "[b'ping']" in done.stdout


def test_shell_tour_runs() -> None:
    tour = [b for b in blocks("sh") if "slipstream driver" in b]
    assert len(tour) == 1
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", tour[0]], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "checksum ok" in done.stdout and "media driver running" in done.stdout
