"""Faults and recovery (issue 28): errors said once, a lost media driver ending what it carried, the
client connecting again and the server binding again on their own, ``on_init`` before anything else.

The driver tests run a standalone driver in another process (``slipstream driver``) and kill it with
SIGKILL; the server and the client run here. Every wait is bounded."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slipstream import DriverLostError
from slipstream.network import Client, ClientConfig, Connection, ConnectionClosedError, Server, ServerConfig
from slipstream.network.errors import ErrorsSuppressed, MessageDispatchError
from slipstream.network.recovery import RetryDelays, driver_available
from slipstream.network.reporting import ErrorLimiter
from slipstream.testing import run_async

from .test_network_aio import free_ports, wait_for

S = 1_000_000_000


class Note(msgspec.Struct):
    n: int


class Stray(msgspec.Struct):
    n: int


# -- sans-I/O pieces -------------------------------------------------------------------------------


def test_an_error_is_said_once_then_counted_and_summed_up_when_its_window_ends() -> None:
    limiter = ErrorLimiter(window_ns=10 * S, distinct=2)
    boom = RuntimeError("boom")
    assert limiter.admit(7, boom, 0)
    assert not any(limiter.admit(7, RuntimeError("boom"), t) for t in range(1, 1000))  # the same: counted
    assert limiter.admit(8, boom, 5)  # another source is another window
    assert limiter.admit(7, ValueError("boom"), 5)  # another type too
    assert limiter.admit(7, RuntimeError("other text"), 6)  # a second text of the type, within `distinct`
    assert not limiter.admit(7, RuntimeError("a third text"), 7)  # past it: counted
    assert limiter.suppressed == 1000 and limiter.deadline_ns == 10 * S
    assert limiter.take_summaries(10 * S - 1) == []
    (summary,) = limiter.take_summaries(10 * S)
    assert (summary.source, summary.type_name, summary.count, summary.last) == (7, "RuntimeError", 1000, "a third text")
    assert limiter.deadline_ns is None
    assert limiter.admit(7, boom, 10 * S + 1)  # a new window: said again


def test_a_window_that_ends_while_errors_keep_coming_sums_up_and_starts_over() -> None:
    limiter = ErrorLimiter(window_ns=S)
    limiter.admit(None, OSError("x"), 0)
    limiter.admit(None, OSError("x"), 1)
    assert limiter.admit(None, OSError("x"), S)  # the next window opens with this one said...
    assert limiter.deadline_ns == 0  # ...and the last window's count due at once
    (summary,) = limiter.take_summaries(S)
    assert summary.count == 1
    limiter.admit(3, OSError("y"), S)
    limiter.admit(3, OSError("y"), S)
    (gone,) = limiter.forget(3)  # a connection that ends has its count said now
    assert gone.count == 1 and limiter.take_summaries(10 * S) == []


def test_retries_start_at_once_and_back_off_to_the_maximum() -> None:
    delays = RetryDelays(5.0)
    assert [delays.next() for _ in range(9)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    delays.reset()
    assert delays.next() == 0.05
    with pytest.raises(ValueError):
        RetryDelays(0.01)


def test_an_external_driver_is_waited_for_without_attaching(tmp_path: Path) -> None:
    assert not driver_available(tmp_path / "nothing-here", "external")
    assert driver_available(tmp_path / "nothing-here", "embedded")  # started by this process on attach


# -- on_init, and error floods, through real endpoints ----------------------------------------------


def configs(driver_dir: Path, **server: Any) -> tuple[ServerConfig, ClientConfig]:
    common: dict[str, Any] = {"app_id": "faults", "messages": [Note], "settings_store": ":memory:", "enable_ipc": False}
    return (
        ServerConfig(driver_directory=driver_dir, **common, **server),
        ClientConfig(driver_directory=driver_dir, **common),
    )


def test_an_async_on_init_finishes_before_on_connect_and_before_any_message(driver_dir: Path) -> None:
    async def main() -> list[str]:
        order: list[str] = []
        server_config, client_config = configs(driver_dir)
        async with Server(server_config) as server, Client(client_config) as client:

            @server.on_init
            async def init(connection: Connection) -> None:
                order.append("init start")
                await asyncio.sleep(0.3)  # the client's first messages arrive meanwhile
                order.append("init end")

            server.on_connect(lambda connection: order.append("connect"))
            server.on_message(Note)(lambda connection, note: order.append(f"message {note.n}"))
            port = free_ports(50)
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            for n in range(3):
                await connection.send(Note(n))
            await wait_for(lambda: len(order) == 6, 10)
        return order

    assert run_async(main(), 60) == ["init start", "init end", "connect", "message 0", "message 1", "message 2"]


def test_a_flood_of_one_error_reaches_on_error_once_then_as_a_count(driver_dir: Path) -> None:
    async def main() -> None:
        errors: list[BaseException] = []
        server_config, client_config = configs(driver_dir)
        client_config = ClientConfig(
            app_id="faults", messages=[Note, Stray], settings_store=":memory:", enable_ipc=False,
            driver_directory=driver_dir,
        )  # fmt: skip
        server_config = ServerConfig(
            app_id="faults", messages=[Note, Stray], settings_store=":memory:", enable_ipc=False,
            driver_directory=driver_dir,
        )  # fmt: skip
        async with Server(server_config) as server, Client(client_config) as client:
            server.on_error(lambda connection, error: errors.append(error))
            server.on_message(Note)(lambda connection, note: None)
            port = free_ports(50)
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            for n in range(2000):  # nobody listens for Stray: 2,000 MessageDispatchErrors
                await connection.send(Stray(n))
            await connection.send_sync(Note(0), timeout=10)
            assert [type(e) for e in errors] == [MessageDispatchError]
            assert server.errors_suppressed == 1999
            await connection.close()
            await wait_for(lambda: len(errors) == 2, 10)  # the connection's count is said when it ends
            assert isinstance(errors[1], ErrorsSuppressed) and errors[1].count == 1999
            assert "MessageDispatchError" in str(errors[1])

    run_async(main(), 60)


# -- a media driver lost, and back -------------------------------------------------------------------


def start_driver(directory: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "driver", "--dir", str(directory), "--client-liveness-timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and "media driver running" in proc.stdout.readline(), proc.stderr
    return proc


@pytest.fixture
def external_dir() -> Iterator[Path]:
    directory = Path("/dev/shm") / f"slipstream-ext-{uuid.uuid4().hex[:10]}"
    yield directory
    subprocess.run(["rm", "-rf", str(directory)], check=False)


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def test_a_lost_server_driver_ends_what_it_carried_once_and_both_sides_come_back(
    external_dir: Path, driver_dir: Path
) -> None:
    """The server's driver (standalone, external) is killed: one DriverLostError naming its directory,
    the connection closed (no buffered session here: its on_disconnect fires once, now), sends refused
    as ``driver lost``, no spinning; the driver comes back: the server binds the same port again and
    the client, whose server went quiet, connects again by itself before the connection's expiry."""
    driver = start_driver(external_dir)

    async def main() -> None:
        common: dict[str, Any] = {"app_id": "faults", "messages": [Note], "settings_store": ":memory:"}
        server_config = ServerConfig(
            driver_directory=external_dir, driver="external", enable_ipc=False, buffered_sessions=False, **common
        )
        client_config = ClientConfig(driver_directory=driver_dir, enable_ipc=False, reconnect_max_delay=0.5, **common)
        errors: list[BaseException] = []
        ended: list[Connection] = []
        got: list[int] = []
        async with Server(server_config) as server, Client(client_config) as client:
            server.on_error(lambda connection, error: errors.append(error))
            server.on_disconnect(ended.append)
            server.on_message(Note)(lambda connection, note: got.append(note.n))
            port = free_ports(50)
            await server.bind(port)
            first = await client.connect("127.0.0.1", port, timeout=10)
            await first.send_sync(Note(1), timeout=10)
            (server_side,) = server.connections
            kill(driver)
            killed_at = time.monotonic()
            await wait_for(lambda: not server.is_bound, 10)
            assert [type(e) for e in errors] == [DriverLostError] and str(external_dir) in str(errors[0])
            assert ended == [server_side] and server_side.is_closed and server.connections == []
            assert not server_side.send_nowait(Note(2)) and server_side.last_refusal == "driver lost"
            with pytest.raises(ConnectionClosedError):
                await server_side.send(Note(3))
            cpu = time.process_time()
            await asyncio.sleep(1.0)
            assert time.process_time() - cpu < 0.25, "a lost driver must not keep the endpoint spinning"
            assert len(errors) == 1  # said once
            restarted = start_driver(external_dir)
            try:
                await wait_for(lambda: server.is_bound, 15)
                await wait_for(lambda: client.connection is not None and client.connection is not first, 20)
                # The server forgot the connection with its driver: the client, hearing nothing for half the
                # expiry (4 s), connected again alongside instead of waiting it out (recovery.QUIET_PART).
                assert time.monotonic() - killed_at < 3.5 and first.is_closed
                assert client.connection is not None
                await client.connection.send_sync(Note(4), timeout=10)
                assert got == [1, 4]
                assert len(ended) == 1, "each connection ends once"
            finally:
                await client.close()
                await server.close()
                kill(restarted)

    try:
        run_async(main(), 90)
    finally:
        kill(driver)


def test_a_lost_client_driver_ends_its_connection_once_and_sends_wait_for_the_next(
    external_dir: Path, driver_dir: Path
) -> None:
    """The client's driver is killed: its connection ends once (``driver lost``), ``send_nowait`` says
    so, an ``await send`` waits; the driver comes back and the client connects again by itself: the
    waiting send goes out on the new connection."""
    driver = start_driver(external_dir)

    async def main() -> None:
        common: dict[str, Any] = {"app_id": "faults", "messages": [Note], "settings_store": ":memory:"}
        common["enable_ipc"] = False
        errors: list[BaseException] = []
        ended: list[Connection] = []
        got: list[int] = []
        server_config = ServerConfig(driver_directory=driver_dir, **common)
        client_config = ClientConfig(
            driver_directory=external_dir, driver="external", reconnect_max_delay=0.5, send_timeout=20, **common
        )
        async with Server(server_config) as server, Client(client_config) as client:
            server.on_message(Note)(lambda connection, note: got.append(note.n))
            client.on_error(lambda connection, error: errors.append(error))
            client.on_disconnect(ended.append)
            port = free_ports(50)
            await server.bind(port)
            first = await client.connect("127.0.0.1", port, timeout=10)
            await first.send_sync(Note(1), timeout=10)
            kill(driver)
            await wait_for(lambda: first.is_closed, 10)
            assert ended == [first] and client.connection is None
            assert [type(e) for e in errors] == [DriverLostError]
            assert not first.send_nowait(Note(2)) and first.last_refusal == "driver lost"
            waiting = asyncio.ensure_future(first.send(Note(3)))  # waits for the next connection
            await asyncio.sleep(0.5)
            assert not waiting.done()
            restarted = start_driver(external_dir)
            try:
                await asyncio.wait_for(waiting, 20)
                await wait_for(lambda: 3 in got, 10)
                assert client.connection is not None and client.connection is not first
                assert got == [1, 3] and ended == [first]
            finally:
                await client.close()
                kill(restarted)

    try:
        run_async(main(), 90)
    finally:
        kill(driver)
