"""Aeron's CnC layout (0.2.0) both ways: Aeron's tools read a slipstream driver's directory, slipstream reads aeronmd's.

The recognition tests (a crafted Aeron file, a wrong version, the pre-Aeron slipstream layout) need nothing
but this repository. The rest run the reference Aeron C tools (``AeronStat``, ``ErrorStat``, ``LossStat``,
``aeronmd``) and are skipped unless ``SLIPSTREAM_AERON_C_DIR`` names a build of them.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream import Context, DriverConfig, ExclusivePublication, MediaDriver
from slipstream.files import broadcast, observe, ringbuffer
from slipstream.files.cnc import (
    CNC_VERSION,
    HEADER_LENGTH,
    LAYOUT_VERSION_OFFSET,
    MARKER_OFFSET,
    PARKED_INDEX,
    SLIPSTREAM_LAYOUT_VERSION,
    SLIPSTREAM_MARKER,
    STATE_RUNNING,
    CncError,
    CncFile,
    semantic_version,
)
from slipstream.files.counters import (
    METADATA_LENGTH,
    SYSTEM_COUNTER_TYPE_ID,
    VALUE_LENGTH,
    CountersManager,
)
from slipstream.files.directory import CNC_FILE
from slipstream.files.loss_report import LossReport
from slipstream.logbuffer.fastpath import ATOMICS
from tests.test_aeron_interop import ENV_VAR, aeron_binaries, running_aeronmd, wait_until

TOOLS = ("aeronmd", "AeronStat", "ErrorStat", "LossStat")
SYSTEM_LABELS = ("Bytes sent", "Bytes received", "NAKs sent", "Status Messages sent", "Invalid packets", "Errors")


BINARIES = aeron_binaries(TOOLS)
needs_aeron = pytest.mark.skipif(
    BINARIES is None, reason=f"needs a reference Aeron C build: set {ENV_VAR} (with {', '.join(TOOLS)})"
)


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path("/dev/shm") / f"slipstream-cnc-{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- recognition, without Aeron -----------------------------------------------------------------------

TO_DRIVER_CAPACITY = 1024
TO_CLIENTS_CAPACITY = 2048
COUNTERS = 4
ERROR_LOG_LENGTH = 1024


def write_aeron_file(directory: Path, version: int = CNC_VERSION, *, heartbeat_ms: int = 0) -> None:
    """A CnC file as aeronmd lays it out (Aeron's field offsets and sections, zeros in the padding),
    written field by field here, so that the reader is checked against the layout, not against itself."""
    directory.mkdir(parents=True, exist_ok=True)
    to_driver = TO_DRIVER_CAPACITY + 768
    to_clients = TO_CLIENTS_CAPACITY + 128
    metadata, values = COUNTERS * 512, COUNTERS * 128
    data = bytearray(HEADER_LENGTH + to_driver + to_clients + metadata + values + ERROR_LOG_LENGTH)
    struct.pack_into("<iiiiii", data, 0, version, to_driver, to_clients, metadata, values, ERROR_LOG_LENGTH)
    struct.pack_into("<qqqi", data, 24, 10_000_000_000, 1_700_000_000_000, 4242, 4096)
    struct.pack_into("<q", data, HEADER_LENGTH + TO_DRIVER_CAPACITY + 640, heartbeat_ms)  # consumer heartbeat
    (directory / CNC_FILE).write_bytes(data)


def test_an_aeron_file_opens_with_its_heartbeat_buffers_and_counters(directory: Path) -> None:
    write_aeron_file(directory, heartbeat_ms=1_700_000_000_123)
    cnc = CncFile.open(directory)
    try:
        assert cnc.flavour == "aeron" and cnc.header.version_text == "0.2.0"
        assert (cnc.header.pid, cnc.header.client_liveness_timeout_ns) == (4242, 10_000_000_000)
        assert cnc.heartbeat_ms == 1_700_000_000_123
        assert len(cnc.to_driver_buffer) == TO_DRIVER_CAPACITY + ringbuffer.TRAILER_LENGTH
        assert len(cnc.to_clients_buffer) == TO_CLIENTS_CAPACITY + broadcast.TRAILER_LENGTH
        assert (len(cnc.counters_metadata), len(cnc.counters_values)) == (COUNTERS * 512, COUNTERS * 128)
        assert len(cnc.error_log) == ERROR_LOG_LENGTH
        assert cnc.state == STATE_RUNNING and cnc.header_i64[PARKED_INDEX] == 0  # aeronmd keeps neither
        with pytest.raises(CncError, match="Aeron driver"):
            cnc.state = STATE_RUNNING
        manager = CountersManager(cnc.counters_metadata, cnc.counters_values)  # as aeronmd would allocate it
        manager.set(manager.allocate("Bytes sent", type_id=SYSTEM_COUNTER_TYPE_ID), 77)
        assert {c.label: c.value for c in cnc.counters_reader()} == {"Bytes sent": 77}
    finally:
        cnc.close()


@pytest.mark.parametrize(("version", "text"), [((0, 3, 0), "0.3.0"), ((1, 0, 0), "1.0.0"), ((0, 1, 9), "0.1.9")])
def test_another_cnc_version_is_refused_naming_both(directory: Path, version: tuple[int, int, int], text: str) -> None:
    write_aeron_file(directory, semantic_version(*version))
    with pytest.raises(CncError) as raised:
        CncFile.open(directory)
    assert f"CnC version {text}" in str(raised.value) and "reads CnC version 0.2.x" in str(raised.value)


def test_a_later_patch_of_0_2_is_read(directory: Path) -> None:
    write_aeron_file(directory, semantic_version(0, 2, 7))
    cnc = CncFile.open(directory)
    try:
        assert cnc.flavour == "aeron" and cnc.header.version_text == "0.2.7"
    finally:
        cnc.close()


def test_the_pre_aeron_slipstream_layout_is_named(directory: Path) -> None:
    """The old layout: 'S' in the version's top byte, zero-length buffers, the heartbeat in the header."""
    directory.mkdir()
    data = bytearray(HEADER_LENGTH + 512 + 128 + 64)
    struct.pack_into("<iiiiiiqqqi", data, 0, 0x53010001, 0, 0, 512, 128, 64, 10**10, 1, os.getpid(), 4096)
    (directory / CNC_FILE).write_bytes(data)
    with pytest.raises(CncError, match="written by an older slipstream"):
        CncFile.open(directory)


def test_a_slipstream_file_of_another_layout_version_is_refused(directory: Path) -> None:
    write_aeron_file(directory)
    with (directory / CNC_FILE).open("r+b") as f:
        f.seek(MARKER_OFFSET)
        f.write(SLIPSTREAM_MARKER + struct.pack("<i", SLIPSTREAM_LAYOUT_VERSION + 1))
    with pytest.raises(CncError, match=f"layout version {SLIPSTREAM_LAYOUT_VERSION + 1}"):
        CncFile.open(directory)


def test_a_file_without_a_version_yet_or_with_a_bad_buffer_is_refused(directory: Path) -> None:
    write_aeron_file(directory, 0)
    with pytest.raises(CncError, match="still starting"):
        CncFile.open(directory)
    write_aeron_file(directory)
    with (directory / CNC_FILE).open("r+b") as f:
        f.seek(4)
        f.write(struct.pack("<i", 1000 + 768))  # a to-driver capacity that is no power of two
    with pytest.raises(CncError, match="do not fit"):
        CncFile.open(directory)


def test_slipstream_writes_aeron_layout_marked_as_its_own(directory: Path) -> None:
    directory.mkdir()
    created = CncFile.create(
        directory,
        counters_capacity=COUNTERS,
        error_log_length=ERROR_LOG_LENGTH,
        client_liveness_timeout_ns=5_000_000_000,
        start_timestamp_ms=123,
        pid=99,
    )
    try:
        created.heartbeat_ms = 1_700_000_000_456
        created.state = STATE_RUNNING
        created.header_i64[PARKED_INDEX] = 1
        raw = (directory / CNC_FILE).read_bytes()
        version, to_driver, to_clients, metadata, values, errors = struct.unpack_from("<iiiiii", raw, 0)
        assert version == semantic_version(0, 2, 0) == 0x200
        capacity = to_driver - 768
        assert capacity > 0 and capacity & (capacity - 1) == 0 and capacity <= 1 << 20
        assert to_clients > 128 and (to_clients - 128) & (to_clients - 129) == 0
        assert (metadata, values, errors) == (COUNTERS * METADATA_LENGTH, COUNTERS * VALUE_LENGTH, ERROR_LOG_LENGTH)
        assert struct.unpack_from("<qqqi", raw, 24) == (5_000_000_000, 123, 99, mmap.PAGESIZE)
        assert raw[MARKER_OFFSET : MARKER_OFFSET + 4] == b"SLIP"
        assert struct.unpack_from("<i", raw, LAYOUT_VERSION_OFFSET)[0] == SLIPSTREAM_LAYOUT_VERSION
        # One heartbeat, in Aeron's place: the to-driver ring buffer's consumer heartbeat, nowhere in the header.
        assert struct.unpack_from("<q", raw, HEADER_LENGTH + capacity + 640)[0] == 1_700_000_000_456
        assert struct.unpack_from("<q", raw, 64)[0] == 0
        assert struct.unpack_from("<qq", raw, 72) == (STATE_RUNNING, 1)
        assert len(raw) % mmap.PAGESIZE == 0
        opened = CncFile.open(directory)
        try:
            assert opened.flavour == "slipstream" and opened.heartbeat_ms == 1_700_000_000_456
            assert opened.state == STATE_RUNNING and opened.header_i64[PARKED_INDEX] == 1
        finally:
            opened.close()
    finally:
        created.close()


# -- Aeron's tools on a slipstream driver ---------------------------------------------------------------


def run_tool(name: str, directory: Path, *args: str) -> str:
    assert BINARIES is not None
    done = subprocess.run(
        [str(BINARIES / name), "-d", str(directory), *args], capture_output=True, text=True, timeout=15, check=False
    )
    assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
    return done.stdout


def stat_counters(output: str) -> dict[str, int]:
    """AeronStat's ``id: value - label`` lines, by label (values have thousands separators)."""
    found: dict[str, int] = {}
    for line in output.splitlines():
        if m := re.fullmatch(r"\s*\d+:\s+(-?[\d,]+) - (.*)", line):
            found.setdefault(m[2], int(m[1].replace(",", "")))
    return found


def offer(pub: ExclusivePublication, message: bytes, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pub.offer(message) < 0:
        assert time.monotonic() < deadline, "offer refused for 10 s"
        time.sleep(0.0001)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def slipstream_driver(directory: Path) -> Iterator[MediaDriver]:
    config = DriverConfig(directory=directory, ipc_term_length=1 << 16, dir_delete_on_shutdown=False)
    driver = MediaDriver(config).launch_embedded()
    yield driver
    driver.close()


@needs_aeron
@pytest.mark.timeout(60)
def test_aeron_stat_reads_a_slipstream_driver(slipstream_driver: MediaDriver, directory: Path) -> None:
    with Context(directory, driver="external") as ctx:
        sub = ctx.add_subscription("aeron:ipc", 3301)
        pub = ctx.add_exclusive_publication("aeron:ipc", 3301)
        wait_until(lambda: pub.is_connected, 10.0, "IPC publication connected")
        got: list[bytes] = []
        for i in range(10):
            offer(pub, b"m%d" % i)
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) >= 0 and len(got) == 10, 10.0, "10 messages")
        time.sleep(0.3)  # a timer tick or two: the driver refreshes pub-pos
        out = run_tool("AeronStat", directory, "-w", "false")
    head = out.splitlines()[0]
    m = re.fullmatch(rf"\S+ \S+ - Aeron Stat \(CnC v0\.2\.0\), pid {os.getpid()}, heartbeat age (-?\d+)ms", head)
    assert m is not None, head
    assert 0 <= int(m[1]) < 5_000, "the heartbeat AeronStat reads is the one the driver beats"
    counters = stat_counters(out)
    assert all(label in counters for label in SYSTEM_LABELS), out
    assert counters["Errors"] == 0
    (pub_pos,) = [v for label, v in counters.items() if label.startswith("pub-pos") and " 3301 aeron:ipc" in label]
    assert pub_pos > 0, out
    assert any(label.startswith("sub-pos") and " 3301 aeron:ipc" in label for label in counters), out


@needs_aeron
@pytest.mark.timeout(60)
def test_error_stat_reads_a_slipstream_drivers_errors(slipstream_driver: MediaDriver, directory: Path) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    with Context(directory, driver="external") as ctx:
        ctx.add_subscription(channel, 3302)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as junk:
            junk.sendto(b"junk!", ("127.0.0.1", int(channel.rsplit(":", 1)[1])))
        wait_until(lambda: "invalid datagrams" in run_tool("ErrorStat", directory), 10.0, "the error logged")
        out = run_tool("ErrorStat", directory)
    assert re.search(
        rf"1 observations from .+ to .+ for:\n invalid datagrams dropped on {re.escape(channel)}\n", out
    ), out
    assert "1 distinct errors observed." in out


@needs_aeron
@pytest.mark.timeout(60)
def test_loss_stat_reads_a_slipstream_drivers_loss_report(directory: Path) -> None:
    """Real loss needs a lossy network (tests/test_udp_loss.py); here the driver's own writer fills the
    report of a stopped driver, whose files stay (``dir_delete_on_shutdown=False``)."""
    with MediaDriver(DriverConfig(directory=directory, dir_delete_on_shutdown=False)).launch_embedded():
        pass
    report = LossReport(directory)
    try:
        channel = "aeron:udp?endpoint=127.0.0.1:40121"
        report.record("image", 64, 1_000, 84968302, 3303, channel, "127.0.0.1:43450")
        report.record("image", 32, 2_000, 84968302, 3303, channel, "127.0.0.1:43450")
    finally:
        report.close()
    out = run_tool("LossStat", directory)
    assert re.search(rf"^2,96,[^,]+,[^,]+,84968302,3303,{re.escape(channel)},127\.0\.0\.1:43450$", out, re.M), out
    assert "1 entries read" in out


# -- slipstream on an aeronmd directory ---------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slipstream", *args], capture_output=True, text=True, timeout=60, check=False
    )


@needs_aeron
@pytest.mark.timeout(60)
def test_slipstream_reads_an_aeronmd_directory(directory: Path) -> None:
    with running_aeronmd(directory=directory) as (_, aeronmd):
        check_aeronmd_directory(directory, aeronmd.proc.pid)


def check_aeronmd_directory(directory: Path, pid: int) -> None:
    cnc = CncFile.open(directory)
    try:
        assert cnc.flavour == "aeron" and cnc.header.version_text == "0.2.0" and cnc.header.pid == pid
        capacity = len(cnc.to_driver_buffer) - ringbuffer.TRAILER_LENGTH
        assert capacity > 0 and capacity & (capacity - 1) == 0
        wait_until(
            lambda: abs(time.time_ns() // 1_000_000 - cnc.heartbeat_ms) < 5_000, 10.0, "a fresh aeronmd heartbeat"
        )
        # aeronmd suffixes some labels ("Errors: version=1.53.0 commit=..."): match the name before the colon.
        system = {c.label.split(":")[0]: c.value for c in cnc.counters_reader() if c.type_id == SYSTEM_COUNTER_TYPE_ID}
    finally:
        cnc.close()
    assert all(label in system for label in SYSTEM_LABELS), system

    done = cli("stat", "--dir", str(directory), "--once")
    assert done.returncode == 0, done.stderr
    head, *rest = done.stdout.splitlines()
    assert re.fullmatch(
        rf"\S+ - slipstream stat, pid {pid}, heartbeat age \d+ms, CnC v0\.2\.0 \(Aeron driver\)", head
    ), head
    printed = {line.split(" - ", 1)[1].split(":")[0] for line in rest if " - " in line}
    assert printed >= set(SYSTEM_LABELS), done.stdout
    as_json = cli("stat", "--dir", str(directory), "--once", "--json")
    assert '"flavour": "aeron"' in as_json.stdout and '"alive": true' in as_json.stdout, as_json.stdout
    errors = cli("errors", "--dir", str(directory))
    assert errors.returncode == 0 and errors.stdout.endswith("0 distinct errors observed.\n"), errors
    loss = cli("loss", "--dir", str(directory))
    assert loss.returncode == 0 and loss.stdout.startswith("#OBSERVATION_COUNT,"), loss


@needs_aeron
@pytest.mark.skipif(ATOMICS is None, reason="the driver reads its ring buffer only with the C fast path's atomics")
@pytest.mark.timeout(60)
def test_an_aeron_client_is_told_at_once_that_a_slipstream_driver_does_not_serve_it(
    slipstream_driver: MediaDriver, directory: Path
) -> None:
    """Aeron's basic_publisher on a slipstream driver's directory: its ADD_PUBLICATION is answered with
    ON_ERROR naming the reason, within a second (not its 10 s driver timeout), and logged once."""
    assert BINARIES is not None
    started = time.monotonic()
    done = subprocess.run(
        [str(BINARIES / "basic_publisher"), "-p", str(directory), "-c", "aeron:ipc", "-s", "3304"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "serves slipstream's clients only" in output, output
    assert elapsed < 5.0, f"refused after {elapsed:.1f} s"
    wait_until(
        lambda: "an Aeron client wrote a command" in run_tool("ErrorStat", directory), 10.0, "the refusal logged"
    )


@pytest.mark.skipif(ATOMICS is None, reason="the driver reads its ring buffer only with the C fast path's atomics")
@pytest.mark.timeout(60)
def test_a_corrupt_ring_buffer_is_reported_once_and_the_driver_goes_on(
    slipstream_driver: MediaDriver, directory: Path
) -> None:
    """Any local process can write into cnc.dat: a record whose length runs past the buffer's end is an
    error in the driver's log, once, and the ring is no longer read; the driver serves its clients still."""
    cnc = CncFile.open(directory)
    try:
        struct.pack_into("<ii", cnc.to_driver_buffer, 0, 0x7FFF0000, 1)  # a "record" longer than the buffer
    finally:
        cnc.close()
    wait_until(
        lambda: any("ring buffer is corrupt" in e.text for e in observe.errors(directory)), 10.0, "corruption logged"
    )
    time.sleep(0.2)  # more timer ticks: still one observation
    (record,) = [e for e in observe.errors(directory) if "ring buffer is corrupt" in e.text]
    assert record.observation_count == 1
    with Context(directory, driver="external") as ctx:
        pub = ctx.add_exclusive_publication("aeron:ipc", 3305)
        assert pub.session_id is not None
