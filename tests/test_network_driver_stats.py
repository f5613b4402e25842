"""``server.driver_stats()`` / ``client.driver_stats()`` (issue 34, item 2): the media driver under an
endpoint, as ``slipstream stat | backlog | errors | loss`` see it, over real UDP on loopback, for an
embedded, an invoker-mode and an external driver, and a clear error when the endpoint holds none."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest

from slipstream.network import Client, DriverNotAttachedError, DriverStats, Server
from slipstream.testing import run_async

from .test_network_aio import Quote, client_config, free_ports, server_config, wait_for
from .test_network_recovery import external_dir, kill, start_driver

__all__ = ["external_dir"]  # a fixture, imported for the tests below


def test_stats_show_the_connections_streams_and_a_forced_error(driver_dir: Path) -> None:
    """Two embedded drivers (server's and client's): each side's stats carry its half of the connection's
    streams with their positions, the system counters, the pid and version; garbage sent to the server's
    port shows in its driver's distinct errors. No driver before bind or connect, nor after close."""
    client_dir = Path("/dev/shm") / f"slipstream-test-{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        port = free_ports(50)
        server, client = Server(server_config(driver_dir)), Client(client_config(client_dir))
        for endpoint in (server, client):
            with pytest.raises(DriverNotAttachedError, match="holds no media driver"):
                endpoint.driver_stats()
        async with server, client:
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            for i in range(20):
                await connection.send_sync(Quote(i, i / 2, "STAT"), timeout=5)
            publication = connection.publication  # the client's stream to the server
            ids = {"session_id": publication.session_id, "stream_id": publication.stream_id}

            def sent(stats: DriverStats) -> bool:
                (stream,) = stats.streams(**ids)
                return stream.sender is not None and stream.sender.position == publication.position > 0

            def received(stats: DriverStats) -> bool:
                (stream,) = stats.streams(**ids)
                return (
                    len(stream.receivers) == 1
                    and stream.receivers[0].position == publication.position
                    and len(stream.subscribers) == 1
                    and stream.subscribers[0].position == publication.position
                )

            await wait_for(lambda: sent(client.driver_stats()) and received(server.driver_stats()), 10)
            stats = server.driver_stats()
            assert stats.directory == driver_dir and client.driver_stats().directory == client_dir
            assert stats.pid == os.getpid() and stats.embedded and not stats.invoker and stats.version == "0.2.0"
            assert stats.status.alive and stats.system["Bytes received"] > 0 and stats.counters[0].counter_id == 0
            assert stats.errors == () and stats.loss == ()
            assert any(c.label.startswith("net errors: server test") for c in stats.counters)

            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.sendto(b"not an aeron frame", ("127.0.0.1", port))

            def garbage_seen() -> bool:
                return any(e.text.startswith("invalid datagrams dropped") for e in server.driver_stats().errors)

            await wait_for(garbage_seen, 10)
            assert not any(e.text.startswith("invalid datagrams") for e in client.driver_stats().errors)
        for endpoint in (server, client):
            with pytest.raises(DriverNotAttachedError):
                endpoint.driver_stats()

    try:
        run_async(main(), 60)
    finally:
        shutil.rmtree(client_dir, ignore_errors=True)


def test_stats_of_an_invoker_mode_driver(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(driver_dir, driver="invoker")) as server,
            Client(client_config(driver_dir, driver="invoker")) as client,
        ):
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send_sync(Quote(1, 1.0, "INV"), timeout=5)
            stats = client.driver_stats()
            assert stats.invoker and stats.embedded and stats.pid == os.getpid()
            assert stats.streams(session_id=connection.publication.session_id) != ()

    run_async(main(), 60)


def test_stats_of_an_external_driver_and_after_it_was_lost(external_dir: Path, driver_dir: Path) -> None:
    """A client on a standalone driver sees that driver (its pid, not embedded); once the driver is
    killed the client holds none, and says so instead of reading the dead driver's files."""
    driver = start_driver(external_dir)

    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(driver_dir)) as server,
            Client(client_config(external_dir, driver="external", reconnect_max_delay=0.5)) as client,
        ):
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send_sync(Quote(1, 1.0, "EXT"), timeout=5)
            stats = client.driver_stats()
            assert stats.pid == driver.pid and not stats.embedded and not stats.invoker
            assert stats.directory == external_dir and stats.status.alive
            kill(driver)
            await wait_for(lambda: client.context is None, 10)
            with pytest.raises(DriverNotAttachedError):
                client.driver_stats()
            assert server.driver_stats().pid == os.getpid()  # the server's own driver is unaffected

    try:
        run_async(main(), 60)
    finally:
        kill(driver)
