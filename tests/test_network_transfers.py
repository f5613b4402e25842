"""Large messages and files as a user meets them (issue 30, items 1, 2 and 5): ``send_sync`` tells the
truth about a transfer (a refusal raises at once; the timeout counts from the last progress; a stalled
transfer is cancelled so the receiver never gets it; a finished one is not reported as failed), and a
received file keeps the sender's name in a private directory removed after the listener."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slipstream.network import (
    Client,
    ClientConfig,
    Connection,
    SendSyncTimeout,
    Server,
    ServerConfig,
    StreamingError,
    StreamRefused,
    streamfiles,
)
from slipstream.network.localfiles import SpillFile, remove_spill, safe_name
from slipstream.network.streamfiles import InlineStreamFiles, ThreadedStreamFiles
from slipstream.network.streaming import StreamCompleted, Streams
from slipstream.testing import run_async

from .test_network_aio import wait_for

MiB = 1024 * 1024


class Blob(msgspec.Struct):
    data: bytes


@asynccontextmanager
async def pair(driver_dir: Path, spill: Path, **server: Any) -> AsyncIterator[tuple[Server, Connection, list[Any]]]:
    """A server (IPC, files spilled to ``spill``) and a connected client; the list collects what reaches
    either side's ``on_error``, as ("server" | "client", error)."""
    common: dict[str, Any] = dict(
        app_id="transfers", messages=[Blob], settings_store=":memory:", driver_directory=driver_dir, enable_ipc=True
    )
    errors: list[Any] = []
    server_config = ServerConfig(temp_directory=spill, **common, **server)
    async with Server(server_config) as srv, Client(ClientConfig(**common)) as client:
        srv.on_error(lambda connection, error: errors.append(("server", error)))
        client.on_error(lambda connection, error: errors.append(("client", error)))
        await srv.bind_ipc()
        connection = await client.connect_ipc(timeout=10)
        yield srv, connection, errors


def test_send_sync_raises_the_receivers_refusal_at_once(driver_dir: Path, tmp_path: Path) -> None:
    """A file and a message above the server's ``max_stream_size``: ``send_sync`` raises StreamRefused
    naming the limit as soon as the refusal is back, not at its 30 s timeout, and the sender's
    ``on_error`` does not hear it a second time."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * MiB))
    spill = tmp_path / "spill"
    spill.mkdir()

    async def main() -> list[tuple[float, str]]:
        outcomes: list[tuple[float, str]] = []
        async with pair(driver_dir, spill, max_stream_size=MiB) as (server, connection, errors):
            server.on_message(Path)(lambda c, p: None)
            server.on_message(Blob)(lambda c, b: None)
            for message in (big, Blob(os.urandom(2 * MiB))):
                started = time.monotonic()
                with pytest.raises(StreamRefused) as info:
                    await connection.send_sync(message, timeout=30)
                outcomes.append((time.monotonic() - started, str(info.value)))
            await connection.ping(5)  # the connection goes on
            await wait_for(lambda: len(errors) >= 2, 10)
            await asyncio.sleep(0.2)
            assert [side for side, _ in errors] == ["server", "server"], errors  # reported once on each side
            assert all(isinstance(error, StreamingError) for _, error in errors)
            assert connection.transfers == {}
        assert os.listdir(spill) == []
        return outcomes

    for waited, message in run_async(main(), 90):
        assert waited < 5, f"refused after {waited:.1f} s"
        assert "max_stream_size (1048576)" in message, message


class GatedDisk(InlineStreamFiles):
    """Real files whose spill writes take ``delay`` each and wait while ``gate`` is clear (a stalled disk)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def spill(self, directory: str | None, prefix: str, name: str = "") -> SpillFile:
        disk = self

        class Slow(SpillFile):
            def write(self, data: Any) -> None:
                if not disk.gate.wait(30):
                    raise OSError("the test's disk gate stayed shut")
                time.sleep(disk.delay)
                super().write(data)

        return Slow(directory, prefix, name)


def test_a_transfer_slower_than_the_timeout_succeeds_while_it_progresses(
    driver_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 12 MiB file onto a disk taking 15 ms per 64 KiB write (about 3 s in all) with ``timeout=1``: the
    timeout counts from the last progress, so the call succeeds, once the listener handled the file."""
    disk = GatedDisk(delay=0.015)
    monkeypatch.setattr(streamfiles, "ThreadedStreamFiles", lambda wake: ThreadedStreamFiles(wake, files=disk))
    source = tmp_path / "slow.bin"
    source.write_bytes(os.urandom(12 * MiB))
    spill = tmp_path / "spill"
    spill.mkdir()

    async def main() -> tuple[float, list[str]]:
        handled: list[str] = []
        async with pair(driver_dir, spill) as (server, connection, errors):
            server.on_message(Path)(lambda c, p: handled.append(p.name))
            started = time.monotonic()
            await connection.send_sync(source, timeout=1)
            took = time.monotonic() - started
            assert errors == []
        return took, handled

    took, handled = run_async(main(), 90)
    assert handled == ["slow.bin"], handled
    assert took > 1.5, f"the transfer took only {took:.1f} s: the test proves nothing"


def test_a_stalled_send_sync_is_cancelled_and_never_delivered(
    driver_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver's disk stalls: no progress for the timeout, so ``send_sync`` raises SendSyncTimeout
    and cancels the transfer; once the disk comes back, the receiver drops what it had (its listener
    never runs, nothing is left in its spill directory) and the connection goes on."""
    disk = GatedDisk()
    monkeypatch.setattr(streamfiles, "ThreadedStreamFiles", lambda wake: ThreadedStreamFiles(wake, files=disk))
    source = tmp_path / "stalled.bin"
    source.write_bytes(os.urandom(16 * MiB))
    spill = tmp_path / "spill"
    spill.mkdir()

    async def main() -> float:
        handled: list[Path] = []
        async with pair(driver_dir, spill) as (server, connection, errors):
            server.on_message(Path)(lambda c, p: handled.append(p))
            disk.gate.clear()
            started = time.monotonic()
            try:
                with pytest.raises(SendSyncTimeout, match="cancelled"):
                    await connection.send_sync(source, timeout=1)
            finally:
                disk.gate.set()
            waited = time.monotonic() - started
            assert connection.transfers == {}
            await wait_for(lambda: any(side == "server" for side, _ in errors), 10)  # told of the abort
            await connection.ping(5)
            await asyncio.sleep(0.5)
            assert handled == []
            assert not [e for side, e in errors if side == "client"], errors  # raised, not reported again
            await wait_for(lambda: os.listdir(spill) == [], 10)
        return waited

    waited = run_async(main(), 90)
    assert waited < 5, f"timed out after {waited:.1f} s"


def test_a_send_sync_whose_transfer_finished_does_not_raise(driver_dir: Path, tmp_path: Path) -> None:
    """A 4 MiB message handled by a listener slower than the timeout: its every byte left, so it cannot
    be taken back, and ``send_sync`` does not report a failure (the old call raised SendSyncTimeout
    while the message was delivered)."""
    spill = tmp_path / "spill"
    spill.mkdir()

    async def main() -> list[int]:
        handled: list[int] = []

        async def slow(connection: Connection, blob: Blob) -> None:
            await asyncio.sleep(1.5)
            handled.append(len(blob.data))

        async with pair(driver_dir, spill) as (server, connection, errors):
            server.on_message(Blob)(slow)
            await connection.send_sync(Blob(os.urandom(4 * MiB)), timeout=0.5)
            await wait_for(lambda: handled, 10)
            assert errors == []
        return handled

    assert run_async(main(), 60) == [4 * MiB]


def test_a_received_file_keeps_its_name_in_a_private_directory(driver_dir: Path, tmp_path: Path) -> None:
    """``on_message(Path)`` gets ``<private dir>/report.csv`` (the directory ``0700``); the directory is
    removed after the listener, and a file the application moved away stays where it went. The sender's
    ``transfers`` name its outgoing file while it is on its way."""
    (tmp_path / "out").mkdir()
    report = tmp_path / "out" / "report.csv"
    report.write_bytes(os.urandom(20 * MiB))
    spill = tmp_path / "spill"
    spill.mkdir()
    kept = tmp_path / "kept"
    kept.mkdir()

    async def main() -> tuple[list[tuple[str, int]], list[str]]:
        seen: list[tuple[str, int]] = []
        names: list[str] = []
        async with pair(driver_dir, spill) as (server, connection, errors):

            @server.on_message(Path)
            def on_file(c: Connection, path: Path) -> None:
                seen.append((path.name, path.parent.stat().st_mode & 0o777))
                assert path.parent.parent == spill
                if len(seen) == 2:
                    shutil.move(path, kept / path.name)  # the application keeps the second one

            await connection.send(report)
            outgoing = lambda: [t.name for t in connection.transfers.values() if not t.incoming]  # noqa: E731
            await wait_for(outgoing, 5)
            names = outgoing()
            await wait_for(lambda: len(seen) == 1, 30)
            await connection.send_sync(report, timeout=30)
            await wait_for(lambda: os.listdir(spill) == [], 10)
            assert errors == []
        return seen, names

    seen, names = run_async(main(), 90)
    assert seen == [("report.csv", 0o700), ("report.csv", 0o700)]
    assert names == ["report.csv"]
    assert (kept / "report.csv").read_bytes() == report.read_bytes()


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("../../etc/passwd", "passwd"),
        ("..", ""),
        ("a\\..\\b.txt", "b.txt"),
        ("/", ""),
        ("x\x00y", "y"),
        ("notes.txt", "notes.txt"),
    ],
)
def test_a_peers_file_name_never_leaves_its_private_directory(tmp_path: Path, sent: str, kept: str) -> None:
    """What a hostile sender puts in STREAM_START's name: cut to one path component, or a nameless file."""
    assert safe_name(sent) == kept
    spill = SpillFile(str(tmp_path), "slipstream-stream-", sent)
    spill.write(b"data")
    path = Path(spill.finish())
    assert path.read_bytes() == b"data"
    if kept:
        assert path.name == kept and path.parent.parent == tmp_path and path.parent.stat().st_mode & 0o777 == 0o700
    else:
        assert path.parent == tmp_path and path.name.endswith(".tmp")
    remove_spill(str(path))
    assert os.listdir(tmp_path) == []


def test_the_machine_hands_over_a_named_copy(tmp_path: Path) -> None:
    """Sans-I/O: a file stream's completion names ``<private dir>/<sender's name>``; ``announce=False``
    (remote calls' files) keeps the nameless temporary file."""
    source = tmp_path / "data.bin"
    source.write_bytes(os.urandom(100_000))
    spill = tmp_path / "spill"
    spill.mkdir()
    sender = Streams(chunk_payload=16 * 1024)
    receiver = Streams(chunk_payload=16 * 1024, temp_dir=str(spill))
    paths: list[Path] = []
    for announce in (True, False):
        sender.send_file(source, announce=announce)
        while sender.sending:
            for kind, stream_id, payload in sender.take_frames():
                receiver.receive(kind, stream_id, payload, 0)
        (done,) = [e for e in receiver.take_events() if isinstance(e, StreamCompleted)]
        assert done.path is not None and done.name == ("data.bin" if announce else "")
        paths.append(Path(done.path))
        assert paths[-1].read_bytes() == source.read_bytes()
        receiver.release(done.stream_id)
    assert paths[0].name == "data.bin" and paths[0].parent.parent == spill
    assert paths[1].parent == spill and paths[1].name.startswith("slipstream-stream-")
    assert os.listdir(spill) == []
