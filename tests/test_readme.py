"""The README's tour is executed, so it cannot drift from the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
ECHO_GUIDE = README.parent / "docs" / "guides" / "echo.md"  # the echo section moved there with issue 30


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def is_network_tour(block: str) -> bool:
    return "Server(server_config)" in block and "class Hello" in block


def test_the_network_tour_is_found() -> None:
    """Its printed lines are checked only if the test finds it: exactly one snippet (and one blocking one)."""
    assert sum(map(is_network_tour, blocks("python"))) == 1
    assert sum("slipstream.network.sync" in block for block in blocks("python")) == 1


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
    if is_network_tour(blocks("python")[index]):
        lines = done.stdout.splitlines()
        assert len(lines) == 2 and lines[0] == "hello, world", done.stdout
        assert re.fullmatch(r"round trip \d+ us, server key [0-9a-f]{8}\.\.\.", lines[1]), done.stdout
    if "slipstream.network.sync" in blocks("python")[index]:  # the blocking tour
        assert done.stdout.splitlines() == ["hello, world", "hello, sync"], done.stdout
    if "IAccount" in blocks("python")[index]:  # the remote-objects tour
        assert done.stdout.splitlines() == ["100 70", "refused: balance 70, asked 1000", "True"], done.stdout


def test_shell_tour_runs(tmp_path: Path) -> None:
    tour = [b for b in blocks("sh") if "slipstream driver" in b]
    assert len(tour) == 1
    assert "/dev/shm/slipstream-tour" in tour[0]
    script = tour[0].replace("/dev/shm/slipstream-tour", str(tmp_path / "tour"))  # (nothing left in /dev/shm)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "checksum ok" in done.stdout and "media driver running" in done.stdout


def test_tour_comment_shows_the_printed_image(driver_dir: Path) -> None:
    """The comment after ``print("joined", ...)`` shows what is printed (issue 11: it said position=0)."""
    snippet = blocks("python")[0]
    comment = re.search(r'print\("joined", joined\[0\]\)  # (Image\(.*)', snippet)
    assert comment is not None
    env = {**os.environ, "SLIPSTREAM_DIR": str(driver_dir)}
    done = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True, text=True, timeout=60)
    printed = next(line for line in done.stdout.splitlines() if line.startswith("joined "))[len("joined ") :]
    shown = comment.group(1).rstrip(".)").replace("...", "")
    for part in (p.strip() for p in shown.split(",")):
        if part and "=..." not in part and not part.startswith("session_id"):
            assert part in printed, (part, printed)


def _shape(line: str) -> str:
    """A log line with its time, numbers and keys masked: what must match between README and reality."""
    return re.sub(r"-?\b[0-9A-Fa-f]+\b", "#", line.strip())


def test_echo_log_sample_matches_what_the_client_prints(driver_dir: Path) -> None:
    sample = re.search(r"```text\n(.*?)```", ECHO_GUIDE.read_text(), flags=re.S)
    assert sample is not None
    from .test_observe import free_port

    ports = [str(free_port()) for _ in range(3)]
    common = [sys.executable, "-m", "slipstream", "echo"]
    server = subprocess.Popen(
        [*common, "server", "--take", "2", "--directory", str(driver_dir / "s"), "--local-address", "127.0.0.1",
         "--data-port", ports[0], "--control-port", ports[1], "--base-port", ports[2], "--duration", "20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        client = subprocess.run(
            [*common, "client", "--take", "2", "--directory", str(driver_dir / "c"), "--remote-address", "127.0.0.1",
             "--data-port", ports[0], "--control-port", ports[1], "--count", "1"],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        server.kill()
        server.wait(10)
    assert client.returncode == 0, client.stderr
    assert [_shape(x) for x in sample.group(1).splitlines()] == [_shape(x) for x in client.stderr.splitlines()]


def test_publish_subscribe_sample_runs(tmp_path: Path) -> None:
    from .test_observe import free_port

    (block,) = [b for b in blocks("sh") if "slipstream publish" in b]
    block = block.replace("localhost:20121", f"localhost:{free_port()}")
    block = block.replace("/dev/shm/sub", str(tmp_path / "sub")).replace("/dev/shm/pub", str(tmp_path / "pub"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", block], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("message from session") == 3 and done.stdout.count("sent Hello World!") == 3
