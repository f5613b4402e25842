"""Client and server in separate processes (each with its own media driver): messages, a graceful
close, and a client killed with SIGKILL seen by the server within the connection expiry."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from slipstream.network import Connection, Server, ServerConfig
from slipstream.testing import NatTopology, remove_stale_namespaces, require_netns

from .test_network_aio import free_ports, run

PEER = str(Path(__file__).with_name("network_peer.py"))


class Base(msgspec.Struct):
    n: int


def start_peer(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, PEER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def read_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
    if not line:
        stderr = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"peer ended: {stderr[-2000:]}")
    return line.strip()


def peer_dir() -> Path:
    return Path("/dev/shm") / f"slipstream-test-{uuid.uuid4().hex[:12]}"


def test_client_in_another_process(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        got: list[int] = []
        disconnected = asyncio.Event()
        directory = peer_dir()
        config = ServerConfig(
            app_id="test",
            messages=[Base],
            settings_store=":memory:",
            driver_directory=driver_dir,
            enable_ipc=False,
            max_clients=4,
        )
        async with Server(config) as server:
            server.on_message(Base)(lambda c, m: got.append(m.n))
            server.on_disconnect(lambda c: disconnected.set())
            await server.bind(port)
            proc = start_peer("client", str(directory), "127.0.0.1", str(port), "4", "50", "close")
            try:
                line = await read_line(proc)
                assert line.startswith("connected ")
                assert await read_line(proc) == "sent"
                assert await read_line(proc) == "closed"
                await asyncio.wait_for(disconnected.wait(), 5)
                assert got == list(range(50))
                assert proc.wait(20) == 0
            finally:
                proc.kill()
                shutil.rmtree(directory, ignore_errors=True)

    run(main(), 90)


@pytest.mark.parametrize("mode", ["unbuffered", "rule_refuses", "buffered_by_default"])
def test_sigkilled_client_is_seen_within_the_expiry(driver_dir: Path, mode: str) -> None:
    """The connection of a SIGKILLed client leaves ``server.connections`` within the expiry. Its
    ``on_disconnect`` fires then too when no buffered session waits for it (buffering off, or the
    server's rule refusing it); with the default buffered session, when the session ends (here: the
    server closes)."""

    async def main() -> None:
        port = free_ports(50)
        expiry = 2.0
        gone: list[tuple[Connection, float]] = []
        asked: list[tuple[str | None, str]] = []

        def rule(address: str | None, tag: str) -> bool:
            asked.append((address, tag))
            return False

        buffering: dict[str, object] = {
            "unbuffered": {"buffered_sessions": False},
            "rule_refuses": {"buffered_rule": rule},
            "buffered_by_default": {},
        }[mode]  # type: ignore[assignment]
        directory = peer_dir()
        config = ServerConfig(
            app_id="test",
            messages=[Base],
            settings_store=":memory:",
            driver_directory=driver_dir,
            enable_ipc=False,
            connection_expiry=expiry,
            max_clients=4,
            **buffering,  # type: ignore[arg-type]
        )
        assert ServerConfig(app_id="test").buffered_sessions  # on by default, as the seed's
        async with Server(config) as server:
            server.on_disconnect(lambda c: gone.append((c, time.monotonic())))
            await server.bind(port)
            proc = start_peer("client", str(directory), "127.0.0.1", str(port), str(expiry), "3", "hang")
            try:
                assert (await read_line(proc)).startswith("connected ")
                assert await read_line(proc) == "sent"
                await asyncio.sleep(expiry)  # a connected, quiet pair stays up past the expiry (keepalives)
                assert not gone and len(server.connections) == 1
                (connection,) = server.connections
                os.kill(proc.pid, signal.SIGKILL)
                killed = time.monotonic()
                proc.wait(10)
                deadline = killed + expiry + 2.0
                while server.connections and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                assert not server.connections, "the server did not notice the dead client"
                seen = time.monotonic() - killed
                assert expiry * 0.7 <= seen <= expiry + 1.0, seen
                assert connection.is_closed
                if mode == "buffered_by_default":
                    await asyncio.sleep(0.2)
                    assert not gone, "a buffered session's on_disconnect waits for the session to end"
                else:
                    while not gone and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)
                    assert [c for c, _ in gone] == [connection]
                    assert expiry * 0.7 <= gone[0][1] - killed <= expiry + 1.0
                assert asked == ([("127.0.0.1", "")] if mode == "rule_refuses" else [])
            finally:
                proc.kill()
                shutil.rmtree(directory, ignore_errors=True)
            deadline = time.monotonic() + 5
            while server.allocated and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert server.allocated == 0
        assert [c for c, _ in gone] == [connection]  # exactly once, whatever the mode

    run(main(), 90)


def test_client_behind_a_masquerading_router(tmp_path: Path) -> None:
    """The echo NAT experiment's topology: the client's address is rewritten by a router that drops
    unsolicited traffic; the handshake and messages still get through (dynamic MDC, as echo take 2)."""
    remove_stale_namespaces()
    require_netns()
    with NatTopology() as nat:
        server_dir, client_dir = peer_dir(), peer_dir()
        server_log = (tmp_path / "server.log").open("w+")
        server = nat.server.popen(
            [sys.executable, PEER, "server", str(server_dir), str(nat.server_address), "9000"],
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 20
            while "listening" not in (tmp_path / "server.log").read_text():
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.02)
            result = nat.client.run(
                [sys.executable, PEER, "client", str(client_dir), str(nat.server_address), "9000", "4", "3", "close"],
                timeout=40,
                check=False,
            )
            output = (tmp_path / "server.log").read_text()
            assert result.returncode == 0, result.stdout + result.stderr + "\n--- server ---\n" + output
            assert result.stdout.split() == ["connected", result.stdout.split()[1], "sent", "closed"]
            assert f"connect {nat.router_public_address}" in output  # the server sees the router
            assert [line for line in output.splitlines() if line.startswith("message")] == [
                "message 0",
                "message 1",
                "message 2",
            ]
        finally:
            server.kill()
            server.wait(10)
            shutil.rmtree(server_dir, ignore_errors=True)
            shutil.rmtree(client_dir, ignore_errors=True)


# -- buffered sessions: a client lost (SIGKILL) and the same client (same key) back -------------------------


def buffered_server(driver_dir: Path, **kwargs: object) -> Server:
    return Server(ServerConfig(
        app_id="test", messages=[Base], settings_store=":memory:", driver_directory=driver_dir, enable_ipc=False,
        connection_expiry=1.0, max_clients=4, buffered_sessions=True, **kwargs,  # type: ignore[arg-type]
    ))  # fmt: skip


async def lose_a_client(server: Server, port: int, store: Path, directory: Path) -> Connection:
    """A receiver process connects, is SIGKILLed, and the server sees its connection expire."""
    proc = start_peer("receiver", str(directory), "127.0.0.1", str(port), "1.0", str(store), "0")
    try:
        assert (await read_line(proc)).startswith("connected ")
        while not server.connections:
            await asyncio.sleep(0.01)
        (lost,) = server.connections
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    while not lost.is_closed:
        assert time.monotonic() < deadline, "the server did not notice the lost client"
        await asyncio.sleep(0.02)
    return lost


def test_messages_sent_while_a_client_is_lost_arrive_in_order_when_it_returns(driver_dir: Path, tmp_path: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        disconnects: list[Connection] = []
        first_dir, second_dir = peer_dir(), peer_dir()
        store = tmp_path / "client.db"
        async with buffered_server(driver_dir, buffered_timeout=30.0) as server:
            server.on_disconnect(disconnects.append)
            await server.bind(port)
            try:
                lost = await lose_a_client(server, port, store, first_dir)
                assert disconnects == []  # the session waits for the client
                for n in range(1000):
                    await lost.send(Base(n))  # queued, in order
                # Not handed to a transport (False), but queued as well: the refusal says so.
                assert not lost.send_nowait(Base(1000)) and "queued" in (lost.last_refusal or "")
                back = start_peer("receiver", str(second_dir), "127.0.0.1", str(port), "1.0", str(store), "1002")
                try:
                    assert (await read_line(back)).startswith("connected ")
                    await lost.send(Base(1001))  # after the return, the old connection forwards to the new one
                    assert await read_line(back) == "received 1002 0..1001 ordered"
                    assert disconnects == [lost]  # the lost connection's end, reported when the session resumed
                    (current,) = server.connections
                    assert current.remote_public_key == lost.remote_public_key and current is not lost
                finally:
                    back.kill()
            finally:
                shutil.rmtree(first_dir, ignore_errors=True)
                shutil.rmtree(second_dir, ignore_errors=True)

    run(main(), 120)


def test_a_session_that_expires_or_overflows_tells_the_application_what_was_not_delivered(
    driver_dir: Path, tmp_path: Path
) -> None:
    from slipstream.network import UndeliveredError

    async def main() -> None:
        port = free_ports(50)
        disconnects: list[Connection] = []
        errors: list[BaseException] = []
        directory = peer_dir()
        async with buffered_server(driver_dir, buffered_timeout=1.5, buffered_capacity=3) as server:
            server.on_disconnect(disconnects.append)
            server.on_error(lambda connection, error: errors.append(error))
            await server.bind(port)
            try:
                lost = await lose_a_client(server, port, tmp_path / "client.db", directory)
                for n in range(3):
                    await lost.send(Base(n))
                try:
                    await lost.send(Base(3))
                    raise AssertionError("a full queue must refuse")
                except UndeliveredError as full:
                    assert full.messages == (Base(3),)
                assert disconnects == []
                deadline = time.monotonic() + 10
                while not disconnects:
                    assert time.monotonic() < deadline, "the session did not expire"
                    await asyncio.sleep(0.02)
                assert disconnects == [lost]
                # Reported once each: the overflow to the sender (above), the expiry to on_error.
                undelivered = [e.messages for e in errors if isinstance(e, UndeliveredError)]
                assert undelivered == [(Base(0), Base(1), Base(2))]
                try:
                    await lost.send(Base(9))
                    raise AssertionError("an expired session queues nothing")
                except Exception as exc:
                    assert type(exc).__name__ == "ConnectionClosedError", exc
            finally:
                shutil.rmtree(directory, ignore_errors=True)

    run(main(), 90)


def test_a_stream_cut_off_by_sigkill_of_its_sender_leaves_no_temporary_file(driver_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    with source.open("wb") as out:  # 1 GiB, sparse: the sender reads it while the receiver spills it
        out.truncate(1 << 30)
    spill = tmp_path / "spill"
    spill.mkdir()

    async def main() -> None:
        port = free_ports(50)
        directory = peer_dir()
        errors: list[BaseException] = []
        config = ServerConfig(
            app_id="test", messages=[Base], settings_store=":memory:", driver_directory=driver_dir, enable_ipc=False,
            connection_expiry=1.0, max_clients=4, temp_directory=spill,
        )  # fmt: skip
        async with Server(config) as server:
            server.on_error(lambda connection, error: errors.append(error))
            await server.bind(port)
            proc = start_peer("streamer", str(directory), "127.0.0.1", str(port), str(source))
            try:
                assert await read_line(proc) == "streaming"
                deadline = time.monotonic() + 20
                while not (server.connections and any(t.done for t in server.connections[0].transfers.values())):
                    assert time.monotonic() < deadline, "no bytes of the stream arrived"
                    await asyncio.sleep(0.01)
                assert os.listdir(spill)  # the incoming file is being written to a temporary file
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
            finally:
                proc.kill()
                shutil.rmtree(directory, ignore_errors=True)
            deadline = time.monotonic() + 10
            while server.connections or os.listdir(spill):
                assert time.monotonic() < deadline, os.listdir(spill)
                await asyncio.sleep(0.02)
            assert any("connection_lost" in str(e) for e in errors), errors

    run(main(), 90)
