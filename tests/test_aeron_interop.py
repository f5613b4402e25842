"""Interoperation with the reference Aeron C: two media drivers speaking Aeron's wire protocol on loopback.

slipstream's embedded driver on one side, the reference ``aeronmd`` with its C client samples on the
other, UDP between them on 127.0.0.1: a slipstream publication read by ``basic_subscriber``, and
``streaming_publisher`` read by a slipstream subscription, every message compared. Skipped unless
``SLIPSTREAM_AERON_C_DIR`` names an Aeron C build (its ``binaries/`` directory or the cmake build tree);
nothing of Aeron lives in this repository: build it elsewhere (README, "Benchmarks").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from slipstream import Context, FragmentAssembler
from slipstream.files.cnc import CncError, CncFile
from slipstream.files.counters import SYSTEM_COUNTER_TYPE_ID

ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "SLIPSTREAM_AERON_C_DIR"
NEEDED = ("aeronmd", "basic_subscriber", "streaming_publisher", "rate_subscriber", "cping", "cpong")
STREAM_ID = 1001


def aeron_binaries(needed: Sequence[str]) -> Path | None:
    """The directory of an Aeron C build with the executables ``needed`` (given by ``$SLIPSTREAM_AERON_C_DIR``:
    the build's ``binaries/``, the cmake build tree or its parent), or None."""
    given = os.environ.get(ENV_VAR)
    if not given:
        return None
    for candidate in (Path(given), Path(given) / "binaries", Path(given) / "build" / "binaries"):
        if all(os.access(candidate / name, os.X_OK) for name in needed):
            return candidate
    return None


BINARIES = aeron_binaries(NEEDED)
pytestmark = [
    pytest.mark.skipif(
        BINARIES is None,
        reason=f"needs a reference Aeron C build: set {ENV_VAR} to its directory (with {', '.join(NEEDED)})",
    ),
    pytest.mark.timeout(120),
]


class AeronProcess:
    """An Aeron C process whose stdout lines a thread collects (line-buffered through stdbuf), so each
    wait on them has a deadline."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        prefix = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def matching(self, predicate: Callable[[str], bool]) -> list[str]:
        with self._cond:
            return [line for line in self.lines if predicate(line)]

    def wait_for(self, predicate: Callable[[str], bool], count: int = 1, timeout_s: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = [line for line in self.lines if predicate(line)]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    tail = "\n".join(self.lines[-10:])
                    pytest.fail(f"{len(found)} of {count} expected lines within {timeout_s} s; output ends:\n{tail}")
                self._cond.wait(min(remaining, 0.1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5.0)
        self._reader.join(2.0)
        return self.proc.returncode


@contextlib.contextmanager
def aeron_process(argv: Sequence[str], env: dict[str, str]) -> Iterator[AeronProcess]:
    proc = AeronProcess(argv, env)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def running_aeronmd(*properties: str, directory: Path | None = None) -> Iterator[tuple[Path, AeronProcess]]:
    """The reference driver (one SHARED thread) in ``directory`` (default: a fresh one under /dev/shm),
    with extra ``-D`` ``properties``; yields once its cnc.dat opens, stops it (SIGINT, then SIGKILL) and
    removes the directory whatever happens."""
    assert BINARIES is not None
    directory = directory or Path("/dev/shm") / f"aeron-test-{uuid.uuid4().hex[:12]}"
    argv = [
        str(BINARIES / "aeronmd"),
        f"-Daeron.dir={directory}",
        "-Daeron.threading.mode=SHARED",
        "-Daeron.dir.delete.on.start=true",
        "-Daeron.dir.delete.on.shutdown=true",
        *properties,
    ]
    try:
        with aeron_process(argv, dict(os.environ, AERON_DIR=str(directory))) as driver:
            deadline = time.monotonic() + 10.0
            while True:
                try:
                    CncFile.open(directory).close()
                    break
                except CncError:  # not there yet, or its header not written yet
                    assert driver.proc.poll() is None, f"aeronmd exited: {driver.lines}"
                    assert time.monotonic() < deadline, "aeronmd made no complete cnc.dat within 10 s"
                    time.sleep(0.02)
            yield directory, driver
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def aeronmd() -> Iterator[dict[str, str]]:
    """The reference driver in a fresh directory; yields its clients' environment (AERON_DIR)."""
    with running_aeronmd() as (directory, _):
        time.sleep(0.1)
        yield dict(os.environ, AERON_DIR=str(directory))
        assert_aeron_saw_no_errors(directory)


QUIET_COUNTERS = ("Invalid packets", "Errors", "Status Messages rejected", "Images rejected", "Error Frames received")
"""Counters of ``aeronmd`` that a well-formed peer never moves."""


def assert_aeron_saw_no_errors(directory: Path) -> None:
    """What the reference driver thought of slipstream's traffic, read with Aeron's own AeronStat and
    ErrorStat (when the build has them: cmake targets ``AeronStat ErrorStat``)."""
    assert BINARIES is not None
    stat, errors = BINARIES / "AeronStat", BINARIES / "ErrorStat"
    if not (stat.is_file() and errors.is_file()):
        return
    out = subprocess.run(
        [str(stat), "-d", str(directory), "-w", "false"], capture_output=True, text=True, timeout=10
    ).stdout
    counters: dict[str, int] = {}
    for line in out.splitlines():
        if m := re.match(r"^\s*\d+:\s+([\d,]+) - ([^:]+)", line):
            counters.setdefault(m.group(2).strip(), int(m.group(1).replace(",", "")))
    assert counters, f"AeronStat printed no counters: {out}"
    assert {name: counters.get(name) for name in QUIET_COUNTERS} == dict.fromkeys(QUIET_COUNTERS, 0), out
    log = subprocess.run([str(errors), "-d", str(directory)], capture_output=True, text=True, timeout=10).stdout
    assert "0 distinct errors observed" in log, log


@pytest.fixture
def slipstream_dir() -> Iterator[Path]:
    path = Path("/dev/shm") / f"slipstream-interop-{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def assert_slipstream_saw_no_errors(directory: Path) -> None:
    """The same from slipstream's side: its driver's invalid-packet and error counters stayed at zero."""
    cnc = CncFile.open(directory)
    try:
        counters = {c.label: c.value for c in cnc.counters_reader() if c.type_id == SYSTEM_COUNTER_TYPE_ID}
    finally:
        cnc.close()
    assert (counters["Invalid packets"], counters["Errors"]) == (0, 0), counters


def udp_channel() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"aeron:udp?endpoint=127.0.0.1:{port}"


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.001)


MESSAGE_LINE = re.compile(r"^Message to stream (\d+) from session (-?\d+) \((\d+) bytes\) <<(.*)>>$")


def test_aeron_c_subscriber_receives_a_slipstream_publication(aeronmd: dict[str, str], slipstream_dir: Path) -> None:
    """slipstream driver -> UDP -> aeronmd -> basic_subscriber: every message, in order, byte for byte,
    fragmented ones (5000 and 3000 bytes over a 1408-byte MTU) reassembled by Aeron's assembler."""
    assert BINARIES is not None
    channel = udp_channel()
    messages = [f"slipstream message {i}".encode() for i in range(500)]
    messages[100:100] = [b"A" * 5000]
    messages[300:300] = [bytes(ord("a") + i % 26 for i in range(3000))]
    argv = [str(BINARIES / "basic_subscriber"), "-p", aeronmd["AERON_DIR"], "-c", channel, "-s", str(STREAM_ID)]
    with aeron_process(argv, aeronmd) as sub:
        sub.wait_for(lambda line: line.startswith("Subscription channel status"))
        with Context(slipstream_dir, driver="embedded") as ctx:
            pub = ctx.add_exclusive_publication(channel, STREAM_ID)
            wait_until(lambda: pub.is_connected, 10.0, "Aeron's receiver sent no status message to slipstream")
            deadline = time.monotonic() + 20.0
            for message in messages:
                while pub.offer(message) < 0:
                    assert time.monotonic() < deadline, "slipstream publication refused offers for 20 s"
                    time.sleep(0.0005)
            lines = sub.wait_for(lambda line: line.startswith("Message to stream"), len(messages), timeout_s=20.0)
            session_id = pub.session_id
            assert_slipstream_saw_no_errors(slipstream_dir)
    parsed = [MESSAGE_LINE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed, strict=True) if m is None][:3]
    received = [m.group(4).encode() for m in parsed if m]
    assert [int(m.group(3)) for m in parsed if m] == [len(m) for m in messages]
    assert received == messages
    assert {(int(m.group(1)), int(m.group(2))) for m in parsed if m} == {(STREAM_ID, session_id)}
    assert sub.matching(lambda line: line.startswith("Available image")), "Aeron saw the image come"


@pytest.mark.parametrize(("length", "count"), [(100, 20_000), (5000, 300)])
def test_slipstream_subscription_receives_an_aeron_c_publication(
    aeronmd: dict[str, str], slipstream_dir: Path, length: int, count: int
) -> None:
    """streaming_publisher -> aeronmd -> UDP -> slipstream driver -> subscription: ``count`` messages
    numbered 0.. in their first 8 bytes, all of ``length`` bytes (5000: fragments reassembled here)."""
    assert BINARIES is not None
    channel = udp_channel()
    received: list[tuple[int, int]] = []

    def on_message(payload: memoryview, header: object) -> None:
        received.append((struct.unpack_from("<Q", payload)[0], len(payload)))

    assembler = FragmentAssembler(on_message)
    with Context(slipstream_dir, driver="embedded") as ctx:
        sub = ctx.add_subscription(channel, STREAM_ID)
        argv = [
            str(BINARIES / "streaming_publisher"),
            *("-p", aeronmd["AERON_DIR"], "-c", channel, "-s", str(STREAM_ID)),
            *("-L", str(length), "-m", str(count)),
        ]
        with aeron_process(argv, aeronmd) as pub:
            deadline = time.monotonic() + 30.0
            while len(received) < count and time.monotonic() < deadline:
                if sub.poll(assembler, 256) == 0:
                    time.sleep(0.0002)
            assert pub.proc.wait(10.0) == 0, pub.lines[-5:]
            assert pub.matching(lambda line: line.startswith("Total:")), pub.lines[-5:]
            images = sub.images
        assert_slipstream_saw_no_errors(slipstream_dir)
    assert len(received) == count, f"{len(received)} of {count} messages within 30 s"
    assert [index for index, _ in received] == list(range(count))
    assert {size for _, size in received} == {length}
    assert len(images) <= 1


def test_aeron_c_pong_echoes_slipstream_pings(aeronmd: dict[str, str], slipstream_dir: Path) -> None:
    """Both directions at once: slipstream pings over UDP, Aeron's cpong echoes each through aeronmd, and
    slipstream's subscription gets every one back, unchanged."""
    assert BINARIES is not None
    ping_channel, pong_channel = udp_channel(), udp_channel()
    argv = [
        str(BINARIES / "cpong"),
        *("-p", aeronmd["AERON_DIR"], "-c", ping_channel, "-C", pong_channel, "-s", "1002", "-S", "1003"),
    ]
    echoed: list[bytes] = []
    with Context(slipstream_dir, driver="embedded") as ctx:
        sub = ctx.add_subscription(pong_channel, 1003)
        pub = ctx.add_exclusive_publication(ping_channel, 1002)
        with aeron_process(argv, aeronmd) as pong:
            pong.wait_for(lambda line: line.startswith("Publication channel status"))
            wait_until(lambda: pub.is_connected and sub.image_count > 0, 10.0, "ping and pong not connected")
            deadline = time.monotonic() + 20.0
            for i in range(200):
                ping = struct.pack("<QQ", time.monotonic_ns(), i) + b"p" * 16
                while pub.offer(ping) < 0:
                    assert time.monotonic() < deadline, "ping refused for 20 s"
                    time.sleep(0.0002)
                while len(echoed) <= i:
                    assert time.monotonic() < deadline, f"pong {i} not back within 20 s"
                    if sub.poll(lambda payload, header: echoed.append(bytes(payload)), 10) == 0:
                        time.sleep(0.0001)
                assert echoed[i] == ping
        assert_slipstream_saw_no_errors(slipstream_dir)
    assert len(echoed) == 200


def test_aeron_c_yardstick_quick_run(tmp_path: Path) -> None:
    """``python -m bench.aeron_c --quick`` measures every row against this build."""
    out = tmp_path / "aeron-c.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.aeron_c", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["not_measured"] == []
    rows = {row["id"]: row for row in document["aeron_c"]}
    assert set(rows) == {
        *(f"aeron_c.{t}.throughput.{s}B" for t in ("ipc", "udp") for s in (32, 1024)),
        "aeron_c.udp.bulk.65536B",
        *(f"aeron_c.{t}.latency.32B.p{p}" for t in ("ipc", "udp") for p in (50, 99)),
        *(f"aeronmd.slipstream.udp.latency.32B.p{p}" for p in (50, 99)),
        "aeronmd.slipstream.ipc.throughput.32B",
    }
    for row in rows.values():
        assert row["aeron_c"] > 0, row
        if row["id"].startswith("aeronmd."):
            assert row["slipstream"] > 0 and row["ratio"] > 0, row
