"""Issue 11: every CLI command ends with a message and a status, never a traceback; the demo leaves
no orphan process and no shared-memory files behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slipstream
from slipstream.cli import main
from slipstream.cli.demo import Histogram

from .test_observe import cli, free_port


def _popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slipstream", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _readline_until(proc: subprocess.Popen[str], needle: str, timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if needle in line:
            return line
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no line with {needle!r}; stderr: {proc.stderr.read() if proc.stderr else ''}")


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"  # a zombie has finished


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def _long_demo() -> tuple[subprocess.Popen[str], Path, int]:
    proc = _popen("demo", "--messages", "200000000", "--pings", "1")
    line = _readline_until(proc, "driver directory")
    directory = Path(line.split("driver directory", 1)[1].strip())
    deadline = time.monotonic() + 30
    while not _children(proc.pid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (peer,) = _children(proc.pid)
    _readline_until(proc, "... sent")  # the peer subscribed: the exchange runs
    return proc, directory, peer


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_demo_stopped_by_a_signal_stops_its_peer_and_removes_its_files(signum: int) -> None:
    proc, directory, peer = _long_demo()
    assert directory.is_dir()
    started = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=15)
    assert time.monotonic() - started < 10
    assert proc.returncode == 128 + signum
    assert "Traceback" not in err
    _wait_gone(peer, 5)
    assert not directory.exists()


def test_demo_peer_dies_with_a_killed_parent_and_cleans_up() -> None:
    proc, directory, peer = _long_demo()
    proc.kill()
    proc.wait(5)
    _wait_gone(peer, 5)
    deadline = time.monotonic() + 5
    while directory.exists():
        assert time.monotonic() < deadline, "the demo's shared memory stayed behind"
        time.sleep(0.05)


def test_demo_refuses_a_size_beyond_the_maximum_message_length() -> None:
    done = cli("demo", "--size", str(2**31), "--messages", "1", "--pings", "1", timeout=30)
    assert done.returncode == 2 and "exceeds the maximum message length" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_under_a_standalone_driver_says_so(driver) -> None:  # type: ignore[no-untyped-def]
    done = cli("demo", "--dir", str(driver.directory), "--messages", "1000", "--large", "1", "--pings", "10")
    assert done.returncode == 0, done.stderr
    assert "standalone media driver (pid" in done.stdout and "embedded" not in done.stdout


def test_ping_histogram_has_fixed_size_and_one_percent_precision() -> None:
    histogram = Histogram()
    size = len(histogram._counts)
    for i in range(1, 100_001):
        histogram.record(i / 10)  # 0.1 us .. 10 ms, uniform
    assert len(histogram._counts) == size and histogram.count == 100_000
    for pct, exact in ((50, 5000.0), (99, 9900.0), (99.9, 9990.0)):
        assert exact <= histogram.percentile(pct) <= exact * 1.0201
    assert Histogram().percentile(50) == 0.0


def test_unwritable_driver_directory_is_one_line_and_status_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for args in (("driver", "--dir", str(blocker / "d")), ("subscribe", "--dir", str(blocker / "d"), "--timeout", "1"),
                 ("demo", "--dir", str(blocker / "d"), "--messages", "1", "--pings", "1"),
                 ("echo", "server", "--take", "2", "--directory", str(blocker / "d"), "--local-address", "127.0.0.1",
                  "--data-port", "40901", "--control-port", "40902", "--base-port", "40910", "--duration", "1")):
        done = cli(*args, timeout=30)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr and f"cannot use driver directory {blocker / 'd'}" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    with pytest.raises(slipstream.DriverDirectoryError, match="cannot use driver directory"):
        slipstream.Context(blocker / "d")


def test_huge_client_liveness_timeout_is_a_message() -> None:
    for value in ("1e300", "inf", "nan", "-1"):
        done = cli("driver", "--client-liveness-timeout", value, "--print-config")
        assert done.returncode == 2 and "--client-liveness-timeout" in done.stderr, (value, done.stderr)
        assert "Traceback" not in done.stderr


def test_broken_pipe_from_stat_is_quiet(driver) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        f"{sys.executable} -m slipstream stat --dir {driver.directory} --interval 0.01 --duration 5 | head -1",
        shell=True, capture_output=True, text=True, timeout=30,
    )
    assert done.stdout.strip() and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


@pytest.mark.parametrize("command", ["publish", "subscribe"])
def test_ctrl_c_in_samples_is_a_message(command: str, driver) -> None:  # type: ignore[no-untyped-def]
    proc = _popen(command, "--dir", str(driver.directory), "--channel", "aeron:ipc", "--count", "5")
    _readline_until(proc, "publishing on" if command == "publish" else "subscribed to")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err


def test_publish_and_subscribe_check_arguments_and_explain_themselves(driver) -> None:  # type: ignore[no-untyped-def]
    d = str(driver.directory)
    assert cli("publish", "--dir", d, "--count", "-5").returncode == 2
    done = cli("subscribe", "--dir", d, "--timeout", "-1")
    assert done.returncode == 2 and "--timeout" in done.stderr
    done = cli("subscribe", "--dir", d, "--channel", "aeron:ipc", "--count", "3", "--timeout", "0.5")
    assert done.returncode == 1 and "timed out after 0.5 s with 0 of 3 messages" in done.stderr
    done = cli("publish", "--dir", d, "--channel", "aeron:ipc", "--count", "1", "--timeout", "0.5")
    assert done.returncode == 1 and "waiting for a subscriber" in done.stdout
    assert "offer failed: NOT_CONNECTED" in done.stderr
    for command in ("publish", "subscribe"):
        assert "Exit status" in cli(command, "--help").stdout


def test_version_and_verbose_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith(f"slipstream {slipstream.__version__} (")
    done = cli("driver", "--print-config", "-v")
    assert done.returncode == 0, done.stderr


def test_log_lines_carry_the_level(driver) -> None:  # type: ignore[no-untyped-def]
    done = cli("subscribe", "-v", "--dir", str(driver.directory), "--channel", "aeron:ipc", "--timeout", "0.2")
    assert done.returncode == 0
    from slipstream.cli import LOG_FORMAT

    assert "%(levelname)s" in LOG_FORMAT


def test_echo_client_stopped_by_a_signal_says_so(driver_dir: Path) -> None:
    port = free_port()
    proc = _popen("echo", "client", "--take", "2", "--directory", str(driver_dir), "--remote-address", "127.0.0.1",
                  "--remote-data-port", str(port), "--remote-control-port", str(free_port()), "--timeout", "30")
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=15)
    assert "timed out" not in err and "stopped by SIGINT" in err and proc.returncode == 130, err


def test_stat_flags_a_killed_driver_at_once(driver_dir: Path) -> None:
    proc = _popen("driver", "--dir", str(driver_dir), "--client-liveness-timeout", "30")
    _readline_until(proc, "media driver running")
    proc.kill()
    proc.wait(5)
    done = cli("stat", "--dir", str(driver_dir), "--once")
    assert f"driver not alive: process {proc.pid} is gone" in done.stdout, done.stdout + done.stderr
