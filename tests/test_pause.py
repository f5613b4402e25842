"""Issue 28, item 4: a process stopped and continued (SIGSTOP/SIGCONT: a debugger, a VM migration, a
laptop lid) is not declared dead by its own parts, and a part that really stopped still is.

The embedded-driver tests stop a whole child process for longer than every liveness timeout it runs
(client 5 s, a publication's connection 5 s, image 10 s), then check that nothing in it noticed: its
driver judges timeouts on a clock that leaves its own stall out (``driver.clock.StallClock``), and its
client gives the driver a moment to beat again before reading an old heartbeat as a lost driver. The
standalone-driver tests check the other directions: a stopped driver is lost to a running client, and
a stopped client is timed out by a running driver.

The child processes are this module run as a program (``python -m tests.test_pause ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slipstream import (
    NOT_CONNECTED,
    Context,
    DriverConfig,
    DriverLostError,
    FragmentHandler,
    Header,
    Image,
    MediaDriver,
)
from slipstream.driver.clock import StallClock
from slipstream.driver.media_driver import DirectoryHandle
from slipstream.files import commands as cmd
from slipstream.files.cnc import CncFile
from slipstream.files.counters import SYSTEM_COUNTER_TYPE_ID
from slipstream.testing.clock import ManualClock

from .test_udp import free_port

ROOT = Path(__file__).resolve().parents[1]
STOP_S = 10.0
"""How long the embedded-driver children are stopped: past the client and image liveness timeouts."""
STREAM = 7
S = 1_000_000_000


# -- the stall-adjusted clock ---------------------------------------------------------------------


def test_gaps_up_to_the_threshold_count_in_full() -> None:
    source = ManualClock(5 * S)
    clock = StallClock(S, source.now_ns)
    start = clock.now_ns()
    for step in (1, S // 2, S, 3):  # a gap of exactly the threshold is still an ordinary cycle
        source.advance(step)
        assert clock.now_ns() - start == source.now_ns() - 5 * S
    assert clock.stalls == 0 and clock.stalled_ns == 0


def test_a_gap_above_the_threshold_counts_as_the_threshold_exactly() -> None:
    source = ManualClock(0)
    clock = StallClock(S, source.now_ns)
    source.advance(300)
    assert clock.now_ns() == 300
    source.advance(10 * S)  # the process was stopped for 10 s
    assert clock.now_ns() == 300 + S
    assert (clock.stalls, clock.stalled_ns, clock.last_stall_ns) == (1, 9 * S, 10 * S)
    source.advance(S // 10)  # ordinary cycles after it count in full again
    assert clock.now_ns() == 300 + S + S // 10
    source.advance(S + 1)  # one nanosecond over: a stall, left out to the nanosecond
    assert clock.now_ns() == 300 + 2 * S + S // 10
    assert (clock.stalls, clock.stalled_ns) == (2, 9 * S + 1)
    assert clock.to_source_ns(clock.now_ns()) == source.now_ns()  # deadlines go back to the source's time


def test_the_stall_clock_never_goes_back_and_refuses_a_bad_threshold() -> None:
    source = ManualClock(0)
    clock = StallClock(1000, source.now_ns)
    readings = []
    for gap in (0, 999, 1000, 1001, 50_000, 0, 7, 10**9):
        source.advance(gap)
        readings.append(clock.now_ns())
    assert readings == sorted(readings)
    with pytest.raises(ValueError):
        StallClock(0, source.now_ns)
    for bad in (0, 5 * S, 1.5):
        with pytest.raises(ValueError, match="stall_threshold_ns"):
            DriverConfig(stall_threshold_ns=bad)  # type: ignore[arg-type]
    assert DriverConfig(client_liveness_timeout_ns=S).effective_stall_threshold_ns() == S // 3
    assert DriverConfig(client_liveness_timeout_ns=60 * S).effective_stall_threshold_ns() == 2 * S
    assert DriverConfig(stall_threshold_ns=S // 2).effective_stall_threshold_ns() == S // 2


def test_the_driver_leaves_its_own_stall_out_of_client_liveness_but_not_a_clients_silence(driver_dir: Path) -> None:
    """Driven by a manual clock: a 10 s gap of the driver itself counts as the threshold (a third of the
    5 s liveness timeout), so the client (silent because it was stopped too) is not timed out on resume;
    a client that then stays silent while the driver runs is timed out after the rest of the 5 s, to the
    duty cycle."""
    config = DriverConfig(directory=driver_dir, threading_mode="invoker")
    liveness_ns, threshold_ns = config.client_liveness_timeout_ns, config.effective_stall_threshold_ns()
    assert (liveness_ns, threshold_ns) == (5 * S, 5 * S // 3)
    driver = MediaDriver(config).start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conductor = driver._conductor
        assert conductor is not None
        manual = ManualClock(time.monotonic_ns())
        conductor.clock = StallClock(threshold_ns, manual.now_ns)  # before any client is seen
        handle = DirectoryHandle(driver_dir)
        try:
            sock.connect(handle.socket_path())
        finally:
            handle.close()
        sock.sendall(cmd.encode(cmd.Hello(0, os.getpid())))

        def cycle(advance_ns: int) -> None:
            manual.advance(advance_ns)
            driver.invoke()

        deadline = time.monotonic() + 5
        while not conductor.clients:
            assert time.monotonic() < deadline, "the driver never welcomed the client"
            cycle(1_000_000)
        cycle(10 * S)  # the whole process was stopped for 10 s: the client sent nothing meanwhile
        for _ in range(5):
            cycle(10_000_000)
        assert conductor.clients and conductor.system_counters.client_timeouts == 0
        assert conductor.clock.stalls == 1
        cycles = 0
        expected = (liveness_ns - threshold_ns - 50_000_000) // (S // 10) + 1
        while conductor.clients:  # the client stays silent while the driver runs: the rest of the 5 s
            assert cycles < 100, "a silent client was never timed out"
            cycle(S // 10)
            cycles += 1
        assert expected - 1 <= cycles <= expected + 1 and conductor.system_counters.client_timeouts == 1
    finally:
        sock.close()
        driver.close()


def test_an_invoker_drivers_deadlines_stay_in_monotonic_time_after_stalls(driver_dir: Path) -> None:
    """An invoker-mode application waits on ``invoker_deadline_ns`` with ``time.monotonic_ns``: after a
    stall the driver's own clock is behind it, and a deadline handed out untranslated would be in the
    past, so the application would spin instead of parking."""
    config = DriverConfig(directory=driver_dir, threading_mode="invoker", stall_threshold_ns=1_000_000)
    with Context(driver_dir, driver="embedded", driver_config=config) as ctx:
        ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{free_port()}", STREAM)
        for _ in range(3):
            time.sleep(0.3)  # each gap is a stall of this driver: ~0.9 s left out in all
            ctx.invoke()
        driver = ctx._embedded
        assert driver is not None and driver._conductor is not None
        assert driver._conductor.clock.stalled_ns > 500_000_000
        deadline = ctx.invoker_deadline_ns()
        assert deadline is not None and deadline > time.monotonic_ns() - 50_000_000


# -- processes ------------------------------------------------------------------------------------


class Child:
    """A child process of this module, told what to do on stdin; every read of its stdout is bounded."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.test_pause", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._buffer = b""

    def line(self, timeout: float) -> str:
        """The child's next line of output, waiting at most ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([fd], [], [], max(0.0, left))
            chunk = os.read(fd, 65536) if readable else None
            if not chunk:
                self.proc.kill()
                _, err = self.proc.communicate(timeout=10)
                why = "timed out" if chunk is None else "exited"
                raise AssertionError(f"child {why} without a line: {err.decode(errors='replace')[-3000:]}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def expect(self, wanted: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while (got := self.line(max(0.0, deadline - time.monotonic()))) != wanted:
            pass
        assert got == wanted

    def tell(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        self.proc.stdin.flush()

    def report(self, timeout: float = 10.0, command: str = "report") -> dict[str, object]:
        """Ask for the child's JSON report."""
        self.tell(command)
        deadline = time.monotonic() + timeout
        while not (line := self.line(max(0.0, deadline - time.monotonic()))).startswith("{"):
            pass
        result: dict[str, object] = json.loads(line)
        return result

    def stop_for(self, seconds: float) -> float:
        """SIGSTOP, wait, SIGCONT; the time it was stopped."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)
        return time.monotonic() - stopped

    def finish(self) -> None:
        """Close its stdin (its cue to close and exit), and wait for it."""
        stdin = self.proc.stdin
        if stdin is not None:
            _end(self.proc, stdin.close)


def _end(proc: subprocess.Popen[Any], ask: Callable[[], object]) -> None:
    """End a child process: continue it (a failed test may leave it stopped), ``ask`` it to end, and
    kill it if it has not within 15 s."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGCONT)
    with contextlib.suppress(OSError):
        ask()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.finish()


def _system_counters(directory: Path) -> dict[str, int]:
    cnc = CncFile.open(directory)
    try:
        return {c.label: c.value for c in cnc.counters_reader() if c.type_id == SYSTEM_COUNTER_TYPE_ID}
    finally:
        cnc.close()


@pytest.mark.parametrize("threading_mode", ["dedicated", "invoker"])
def test_a_process_stopped_10s_with_its_embedded_driver_carries_on(
    driver_dir: Path, children: list[Child], threading_mode: str
) -> None:
    """The whole process stops for 10 s, longer than the client liveness (5 s), a UDP publication's
    connection (5 s) and image liveness (10 s) timeouts: afterwards its IPC and UDP publications are still
    connected, its subscriptions still receive every message in order, no image went away, no
    ``DriverLostError``, and the driver timed out no client (it counted one stall instead)."""
    child = Child("endpoint", "--dir", str(driver_dir), "--port", str(free_port()), "--mode", threading_mode)
    children.append(child)
    child.expect("ready")
    stopped_s = child.stop_for(STOP_S)
    child.tell("mark")  # from here every offer must find its stream connected
    time.sleep(2.0)
    report = child.report()
    print(f"\n{threading_mode}: stopped {stopped_s:.1f} s; after SIGCONT: {report}")
    assert report["lost"] is None
    assert report["unavailable_images"] == []
    assert report["connected"] == {"ipc": True, "udp": True}
    assert report["not_connected_since_mark"] == {"ipc": 0, "udp": 0}
    received = report["received_since_mark"]
    assert isinstance(received, dict) and received["ipc"] >= 20 and received["udp"] >= 20
    assert report["out_of_order"] == {"ipc": 0, "udp": 0}
    counters = report["counters"]
    assert isinstance(counters, dict)
    assert counters["Client liveness timeouts"] == 0
    assert counters["Driver stalls"] >= 1  # the stop was seen, and left out


@pytest.fixture
def standalone(driver_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """``slipstream driver`` with a 2 s client liveness timeout."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "driver", "--dir", str(driver_dir), "--client-liveness-timeout", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], 20)
    line = proc.stdout.readline() if readable else ""
    assert "media driver running" in line, proc.stderr.read() if proc.stderr and proc.poll() is not None else line
    yield proc
    _end(proc, lambda: proc.send_signal(signal.SIGINT))


def test_a_stopped_standalone_driver_is_lost_to_a_running_client(
    standalone: subprocess.Popen[str], driver_dir: Path
) -> None:
    """The stall allowance is the stopped party's own: a client that kept running while its driver was
    stopped declares it lost within about the liveness timeout (2 s here), as before."""
    lost: list[tuple[float, DriverLostError]] = []

    def on_lost(error: object) -> None:
        assert isinstance(error, DriverLostError)
        lost.append((time.monotonic(), error))

    with Context(driver_dir, driver="external", on_driver_lost=on_lost) as ctx:
        ctx.add_exclusive_publication("aeron:ipc", STREAM)
        os.kill(standalone.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            deadline = stopped + 2.0 + 3.0
            while not lost and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            os.kill(standalone.pid, signal.SIGCONT)
        assert lost, "a client did not notice its driver stopped"
        after_s = lost[0][0] - stopped
        print(f"\nstandalone driver stopped: client declared it lost after {after_s:.2f} s")
        assert 1.5 <= after_s <= 2.0 + 0.4 + 1.0  # the liveness timeout, plus a keep-alive interval and slack
        assert "heartbeat" in str(lost[0][1])


def test_a_stopped_client_process_is_timed_out_by_its_running_driver(
    standalone: subprocess.Popen[str], driver_dir: Path, children: list[Child]
) -> None:
    """A client that sent no keep-alive for longer than the liveness timeout while the driver ran is
    released: it holds subscriber positions that would hold publishers back for as long as it is stopped,
    and the driver cannot tell stopped from hung. On SIGCONT the client learns it was dropped, and why."""
    child = Child("client", "--dir", str(driver_dir))
    children.append(child)
    child.expect("ready")
    before = _system_counters(driver_dir)["Client liveness timeouts"]
    os.kill(child.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        deadline = stopped + 2.0 + 3.0
        while (timeouts := _system_counters(driver_dir)["Client liveness timeouts"]) == before:
            assert time.monotonic() < deadline, "the driver kept a client that stopped sending keep-alives"
            time.sleep(0.05)
        timed_out_s = time.monotonic() - stopped
        time.sleep(0.5)
    finally:
        os.kill(child.proc.pid, signal.SIGCONT)
    assert timeouts == before + 1
    assert _system_counters(driver_dir)["Driver stalls"] == 0  # the driver itself ran throughout
    print(f"\nclient stopped: the driver timed it out after {timed_out_s:.2f} s")
    assert 1.5 <= timed_out_s <= 2.0 + 1.0  # the liveness timeout after its last keep-alive (0.4 s apart)
    report = child.report(command="await-lost")
    lost = report["lost"]
    assert isinstance(lost, str) and "closed this client's connection" in lost and "keep-alive" in lost, lost


def test_a_client_and_its_standalone_driver_stopped_together_carry_on(
    standalone: subprocess.Popen[str], driver_dir: Path, children: list[Child]
) -> None:
    """Everything stops (a VM migrates, a laptop sleeps) and the client happens to run first: the
    heartbeat it reads is 4 s old, past the 2 s liveness timeout, only because the driver has not run
    since. The client gives it a keep-alive interval and a margin (1.4 s) to beat; the driver leaves its
    own stall out and keeps the client. The driver is continued 0.7 s after the client, whose keep-alive
    tick (0.4 s apart, its wait resumes where it stopped) certainly reads the old heartbeat first."""
    child = Child("client", "--dir", str(driver_dir))
    children.append(child)
    child.expect("ready")
    os.kill(child.proc.pid, signal.SIGSTOP)
    os.kill(standalone.pid, signal.SIGSTOP)
    try:
        time.sleep(4.0)
        os.kill(child.proc.pid, signal.SIGCONT)
        time.sleep(0.7)
    finally:
        os.kill(standalone.pid, signal.SIGCONT)
    time.sleep(1.5)  # past the grace: the client has judged the heartbeat again by now
    report = child.report()
    assert report["lost"] is None, report["lost"]
    counters = _system_counters(driver_dir)
    assert counters["Client liveness timeouts"] == 0
    assert counters["Driver stalls"] == 1


# -- the child processes --------------------------------------------------------------------------


def _endpoint(directory: Path, port: int, mode: str) -> None:
    """Publish and subscribe on IPC and on a UDP loopback pair through an embedded driver, a message
    every 10 ms each; on stdin ``mark`` start counting afresh, ``report`` print what happened as JSON."""
    lost: list[str] = []
    unavailable: list[str] = []
    config = DriverConfig(directory=directory, threading_mode=mode)
    channels = {"ipc": "aeron:ipc", "udp": f"aeron:udp?endpoint=127.0.0.1:{port}"}
    with Context(
        directory, driver="embedded", driver_config=config, on_driver_lost=lambda error: lost.append(str(error))
    ) as ctx:

        def gone(name: str) -> Callable[[Image], None]:
            return lambda image: unavailable.append(name)

        subs = {
            name: ctx.add_subscription(channel, STREAM, on_unavailable_image=gone(name))
            for name, channel in channels.items()
        }
        pubs = {name: ctx.add_exclusive_publication(channel, STREAM) for name, channel in channels.items()}
        sent = dict.fromkeys(channels, 0)
        expected = dict.fromkeys(channels, 0)
        received = dict.fromkeys(channels, 0)
        out_of_order = dict.fromkeys(channels, 0)
        not_connected = dict.fromkeys(channels, 0)
        marked = dict.fromkeys(channels, 0)
        ready = False
        next_send = 0.0
        deadline = time.monotonic() + 120  # never outlive a test run
        stdin = _Commands()

        def handler(name: str) -> FragmentHandler:
            def on_fragment(payload: memoryview, header: Header) -> None:
                number = int.from_bytes(payload[:8], "little")
                if number != expected[name]:
                    out_of_order[name] += 1
                expected[name] = number + 1
                received[name] += 1

            return on_fragment

        handlers = {name: handler(name) for name in channels}
        while time.monotonic() < deadline:
            ctx.invoke()  # an invoker-mode driver runs here; 0 and nothing done for a driver thread
            now = time.monotonic()
            if now >= next_send:
                next_send = now + 0.01
                for name, pub in pubs.items():
                    result = pub.offer(sent[name].to_bytes(8, "little"))
                    if result > 0:
                        sent[name] += 1
                    elif result == NOT_CONNECTED:
                        not_connected[name] += 1
            for name, sub in subs.items():
                sub.poll(handlers[name], 100)
            if not ready and all(received.values()):
                ready = True
                print("ready", flush=True)
            for command in stdin.commands(0.0):
                if command == "mark":
                    marked = dict(received)
                    not_connected = dict.fromkeys(channels, 0)
                elif command == "report":
                    counters = {c.label: c.value for c in ctx.counters() if c.type_id == SYSTEM_COUNTER_TYPE_ID}
                    report = {
                        "lost": lost[0] if lost else None,
                        "unavailable_images": unavailable,
                        "connected": {name: pub.is_connected for name, pub in pubs.items()},
                        "not_connected_since_mark": not_connected,
                        "received_since_mark": {name: received[name] - marked[name] for name in channels},
                        "out_of_order": out_of_order,
                        "counters": counters,
                    }
                    print(json.dumps(report), flush=True)
            if stdin.closed:
                return
            time.sleep(0.001)


def _client(directory: Path) -> None:
    """A client of an external driver with a subscription and a publication; ``report`` tells whether it
    lost the driver, and why."""
    lost: list[str] = []
    with Context(directory, driver="external", on_driver_lost=lambda error: lost.append(str(error))) as ctx:
        ctx.add_subscription("aeron:ipc", STREAM)
        ctx.add_exclusive_publication("aeron:ipc", STREAM)
        print("ready", flush=True)
        deadline = time.monotonic() + 120
        stdin = _Commands()
        while time.monotonic() < deadline and not stdin.closed:
            for command in stdin.commands(0.05):  # "report", or "await-lost" to give it up to 5 s first
                wait_until = time.monotonic() + (5.0 if command == "await-lost" else 0.0)
                while not lost and time.monotonic() < wait_until:
                    time.sleep(0.01)
                print(json.dumps({"lost": lost[0] if lost else None}), flush=True)


class _Commands:
    """The parent's commands on stdin, one a line, read without blocking the child's loop."""

    def __init__(self) -> None:
        self._buffer = b""
        self.closed = False

    def commands(self, timeout: float) -> list[str]:
        """The complete lines that arrived (waiting up to ``timeout`` for the first); ``closed`` at EOF."""
        if self.closed or not select.select([0], [], [], timeout)[0]:
            return []
        chunk = os.read(0, 4096)
        if not chunk:
            self.closed = True
            return []
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line.decode().strip() for line in lines]


def main(argv: list[str]) -> None:
    """Run a child: ``endpoint --dir D --port P --mode dedicated|invoker`` or ``client --dir D``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["endpoint", "client"])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", default="dedicated")
    args = parser.parse_args(argv)
    if args.role == "endpoint":
        _endpoint(args.dir, args.port, args.mode)
    else:
        _client(args.dir)


if __name__ == "__main__":
    main(sys.argv[1:])
