"""The network layer's promises, checked as a user meets them (real sockets on loopback, every wait
bounded): a man-in-the-middle relay refused by a pinned key, back-pressure from a stalled peer and
closed connections, the order in which listeners fire, and what listeners may do."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from slipstream.network import (
    Client,
    ClientConfig,
    Connection,
    ConnectionClosedError,
    SendTimeout,
    Server,
    ServerKeyChanged,
)

from .test_network_aio import Base, Derived, Quote, client_config, free_ports, run, server_config, wait_for
from .test_network_processes import peer_dir, read_line, start_peer

# -- 1. a man in the middle ----------------------------------------------------------------------------


class Relay:
    """A man in the middle: a Server of its own (its own key) that opens, for each client that connects
    to it, a Client connection to the genuine server, forwards every message the client sends up that
    connection, and every message the genuine server answers back down."""

    def __init__(self, driver_dir: Path, upstream_port: int) -> None:
        self.server = Server(server_config(driver_dir, buffered_sessions=False))
        self.upstreams: dict[int, Client] = {}
        self.ready: dict[int, asyncio.Future[Connection]] = {}
        self.inits = 0
        self.closing: list[asyncio.Future[None]] = []

        @self.server.on_init
        def opened(downstream: Connection) -> None:  # plain: the upstream exists before any message
            self.inits += 1
            upstream = Client(client_config(driver_dir))
            upstream.on_message(object)(lambda connection, message: downstream.send_nowait(message))
            self.upstreams[downstream.id] = upstream
            self.ready[downstream.id] = asyncio.ensure_future(upstream.connect("127.0.0.1", upstream_port, timeout=10))

        @self.server.on_message(object)
        async def forward(downstream: Connection, message: object) -> None:
            upstream = await self.ready[downstream.id]
            await upstream.send(message)

        @self.server.on_disconnect
        def closed(downstream: Connection) -> None:
            upstream = self.upstreams.pop(downstream.id, None)
            if upstream is not None:
                self.closing.append(asyncio.ensure_future(upstream.close()))

    async def close(self) -> None:
        """Close the relay and every upstream client (those its disconnects began closing too: a client
        left closing when the loop ends keeps its embedded driver's thread)."""
        await self.server.close()
        for upstream in list(self.upstreams.values()):
            await upstream.close()
        await asyncio.gather(*self.closing)


def test_a_relay_with_its_own_key_relays_but_a_pinned_client_refuses_it(driver_dir: Path, tmp_path: Path) -> None:
    async def main() -> None:
        genuine_port, relay_port = free_ports(50), free_ports(50)
        store = tmp_path / "pinning-client.db"
        callers: list[bytes] = []
        async with Server(server_config(driver_dir, buffered_sessions=False)) as genuine:

            @genuine.on_message(Quote)
            async def answer(connection: Connection, quote: Quote) -> None:
                callers.append(connection.remote_public_key)
                await connection.send(Quote(quote.id, quote.price * 2, f"genuine:{quote.symbol}"))

            await genuine.bind(genuine_port)
            async with Client(client_config(driver_dir, settings_store=store)) as pinner:
                first = await pinner.connect("127.0.0.1", genuine_port, timeout=10)
                assert first.remote_public_key == genuine.public_key  # pinned for 127.0.0.1, in the file

            relay = Relay(driver_dir, genuine_port)
            try:
                await relay.server.bind(relay_port)
                assert relay.server.public_key != genuine.public_key

                # A client that never met the genuine server accepts the relay's key, and through it
                # reaches the genuine server: the relay relays (both ways).
                async with Client(client_config(driver_dir)) as fresh:
                    answers: asyncio.Queue[Quote] = asyncio.Queue()
                    fresh.on_message(Quote)(lambda connection, message: answers.put_nowait(message))
                    relayed = await fresh.connect("127.0.0.1", relay_port, timeout=10)
                    assert relayed.remote_public_key == relay.server.public_key
                    await relayed.send(Quote(1, 1.5, "AAPL"))
                    assert await asyncio.wait_for(answers.get(), 10) == Quote(1, 3.0, "genuine:AAPL")
                    (upstream,) = relay.upstreams.values()
                    assert callers == [upstream.public_key] != [fresh.public_key]  # the genuine server saw the relay
                    await wait_for(lambda: len(relay.server.connections) == 1)
                    allocated = relay.server.allocated

                    # The client that pinned the genuine key (same IP, another port) refuses the relay's,
                    # and the relay gets no connection from it.
                    async with Client(client_config(driver_dir, settings_store=store)) as pinner:
                        for host in ("127.0.0.1", "localhost"):  # pins are per address: the name is 127.0.0.1
                            with pytest.raises(ServerKeyChanged, match="pinned"):
                                await pinner.connect(host, relay_port, timeout=10)
                        await asyncio.sleep(0.2)
                        assert relay.inits == 1 and relay.server.allocated == allocated
                        assert [c.id for c in relay.server.connections] == [relayed.id]
                        assert pinner.connection is None

                        # Removing the pin by the name given to connect lets the next connect through.
                        assert pinner.remove_server_key("localhost") is True
                        assert pinner.remove_server_key("localhost") is False  # nothing pinned any more
                        accepted = await pinner.connect("localhost", relay_port, timeout=10)
                        assert accepted.remote_public_key == relay.server.public_key
                        got: asyncio.Queue[Quote] = asyncio.Queue()
                        pinner.on_message(Quote)(lambda connection, message: got.put_nowait(message))
                        await accepted.send(Quote(2, 2.0, "MSFT"))
                        assert await asyncio.wait_for(got.get(), 10) == Quote(2, 4.0, "genuine:MSFT")
                        assert pinner.remove_server_key("localhost") is True  # the relay's key, pinned now
            finally:
                await relay.close()

    run(main())


# -- 2. back-pressure and closed connections ----------------------------------------------------------


def test_a_stalled_peer_back_pressures_send_nowait_and_times_send_out(driver_dir: Path) -> None:
    """The server (its own process and driver) is stopped with SIGSTOP: it takes nothing, so the flow
    control window fills, then the connection's backlog; ``send_nowait`` refuses and says why, ``send``
    raises SendTimeout (a TimeoutError) after ``send_timeout``. Resumed, everything goes through."""

    async def main() -> None:
        port = free_ports(50)
        directory = peer_dir()
        proc = start_peer("server", str(directory), "127.0.0.1", str(port), "15")
        try:
            assert await read_line(proc) == "listening"
            config = ClientConfig(
                app_id="test",
                messages=[Base],
                settings_store=":memory:",
                driver_directory=driver_dir,
                enable_ipc=False,
                send_timeout=1.0,
                connection_expiry=15.0,
            )
            async with Client(config) as client:
                connection = await client.connect("127.0.0.1", port, timeout=20)
                assert (await read_line(proc)).startswith("connect ")
                await connection.send_sync(Base(0), timeout=10)
                assert await read_line(proc) == "message 0"
                assert connection.last_refusal is None

                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    load = bytes(1000)
                    sent = 0
                    refused_since: float | None = None
                    deadline = time.monotonic() + 15.0  # a few hundred ms alone; the whole suite loads the machine
                    # Fill until refused for a while: a first refusal can come while the driver's sender
                    # still catches up with the window the peer granted before it stopped.
                    while refused_since is None or time.monotonic() - refused_since < 0.3:
                        assert time.monotonic() < deadline, f"{sent} messages taken from a stalled peer"
                        if connection.send_nowait(load):
                            sent += 1
                            refused_since = None
                            if sent % 64 == 0:
                                await asyncio.sleep(0)  # the poller and the driver take what they can
                            continue
                        assert connection.last_refusal == "back-pressured"
                        if refused_since is None:
                            refused_since = time.monotonic()
                        await asyncio.sleep(0.01)
                    assert connection.stats["back_pressure_events"] > 0
                    assert sent >= 256  # the window's worth, then the backlog's

                    started = time.monotonic()
                    with pytest.raises(SendTimeout) as raised:
                        await asyncio.wait_for(connection.send(load), 10)
                    waited = time.monotonic() - started
                    assert isinstance(raised.value, TimeoutError)
                    assert 0.8 <= waited <= 4.0, waited
                    assert not connection.is_closed
                finally:
                    os.kill(proc.pid, signal.SIGCONT)

                await connection.send_sync(Base(1), timeout=10)  # after the backlog: all of it went
                assert await read_line(proc) == "message 1"
                assert connection.send_nowait(load)
                await connection.send(Base(2))
                assert await read_line(proc) == "message 2"
                assert (await connection.ping(timeout=5)).round_trip > 0
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(10)
            shutil.rmtree(directory, ignore_errors=True)

    run(main(), 90)


async def assert_refuses_everything(connection: Connection) -> None:
    """On a closed connection: ``send``, ``send_sync`` and ``ping`` raise, ``send_nowait`` says no."""
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(connection.send(Base(1)), 5)
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(connection.send_sync(Base(2), timeout=2), 5)
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(connection.ping(timeout=2), 5)
    assert connection.send_nowait(Base(3)) is False
    assert connection.last_refusal == "closed"


def test_a_closed_connection_refuses_sends_on_both_sides(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        got: list[int] = []
        async with (
            Server(server_config(driver_dir, buffered_sessions=False)) as server,
            Client(client_config(driver_dir)) as client,
        ):
            server.on_message(Base)(lambda connection, message: got.append(message.n))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send_sync(Base(0), timeout=5)
            (remote,) = server.connections
            await connection.close()
            assert connection.is_closed
            await assert_refuses_everything(connection)  # closed here
            assert await remote.wait_closed(5)
            await assert_refuses_everything(remote)  # closed by the peer
            assert got == [0]

    run(main())


# -- 3. dispatch order ---------------------------------------------------------------------------------


def test_listeners_fire_most_specific_type_first(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        fired: list[str] = []
        async with (
            Server(server_config(driver_dir, buffered_sessions=False)) as server,
            Client(client_config(driver_dir)) as client,
        ):
            # Registered least specific first: the order of firing comes from the types, not from this.
            server.on_message(object)(lambda connection, message: fired.append("object"))
            server.on_message(Base)(lambda connection, message: fired.append("Base"))
            server.on_message(Derived)(lambda connection, message: fired.append("Derived"))
            server.on_message(Base)(lambda connection, message: fired.append("Base, second"))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)

            await connection.send_sync(Derived(1, "d"), timeout=5)
            assert fired == ["Derived", "Base", "Base, second", "object"]
            fired.clear()
            await connection.send_sync(Base(2), timeout=5)
            assert fired == ["Base", "Base, second", "object"]
            fired.clear()
            await connection.send_sync(Quote(3, 1.0, "q"), timeout=5)  # only the catch-all takes it
            assert fired == ["object"]
            fired.clear()

            # The server's side of the connection adds its own: the types still decide, and for one
            # type the connection's listeners come before the server's.
            (server_side,) = server.connections
            server_side.on_message(Base)(lambda connection, message: fired.append("connection Base"))
            server_side.on_message(object)(lambda connection, message: fired.append("connection object"))
            await connection.send_sync(Derived(4, "d"), timeout=5)
            assert fired == ["Derived", "connection Base", "Base", "Base, second", "connection object", "object"]

    run(main())


# -- 4. what listeners may do --------------------------------------------------------------------------


def test_per_connection_on_disconnect_fires_once_on_each_side(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        gone = {"server": 0, "client": 0}
        async with (
            Server(server_config(driver_dir, buffered_sessions=False)) as server,
            Client(client_config(driver_dir)) as client,
        ):

            @server.on_connect
            def watch(connection: Connection) -> None:
                connection.on_disconnect(lambda c: gone.__setitem__("server", gone["server"] + 1))

            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            connection.on_disconnect(lambda c: gone.__setitem__("client", gone["client"] + 1))
            await wait_for(lambda: len(server.connections) == 1)
            assert gone == {"server": 0, "client": 0}
            await connection.close()
            await wait_for(lambda: gone["server"] == 1)
            await connection.close()  # a second close changes nothing
            await client.close()
            await asyncio.sleep(0.3)
        assert gone == {"server": 1, "client": 1}

    run(main())


def test_an_async_listener_that_raises_reaches_on_error_and_the_connection_goes_on(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        errors: list[tuple[Connection | None, BaseException]] = []
        got: list[int] = []
        async with (
            Server(server_config(driver_dir, buffered_sessions=False)) as server,
            Client(client_config(driver_dir)) as client,
        ):
            server.on_error(lambda connection, error: errors.append((connection, error)))

            @server.on_message(Base)
            async def broken(connection: Connection, message: Base) -> None:
                await asyncio.sleep(0.01)
                if message.n == 1:
                    raise ValueError("the async listener failed on 1")
                got.append(message.n)

            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send(Base(1))
            await wait_for(lambda: len(errors) == 1)
            (remote,) = server.connections
            assert errors[0][0] is remote and isinstance(errors[0][1], ValueError)
            assert "failed on 1" in str(errors[0][1])
            await connection.send_sync(Base(2), timeout=5)  # the connection lives on
            assert got == [2] and not remote.is_closed and not connection.is_closed
            assert (await connection.ping(timeout=5)).round_trip > 0
            assert len(errors) == 1

    run(main())


def test_a_sleeping_coroutine_listener_does_not_block_the_receive_path(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        log: list[str] = []
        release = asyncio.Event()
        async with (
            Server(server_config(driver_dir, buffered_sessions=False)) as server,
            Client(client_config(driver_dir)) as client,
        ):

            @server.on_message(Quote)
            async def slow(connection: Connection, quote: Quote) -> None:
                log.append("slow started")
                await asyncio.wait_for(release.wait(), 10)  # sleeps until the test lets it go
                log.append("slow done")

            @server.on_message(Base)
            def quick(connection: Connection, message: Base) -> None:
                log.append(f"quick {message.n}")

            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send(Quote(1, 1.0, "slow"))
            await wait_for(lambda: "slow started" in log)
            await connection.send(Base(2))
            await wait_for(lambda: "quick 2" in log, 5)
            assert log == ["slow started", "quick 2"]  # the second message came while the first slept
            release.set()
            await wait_for(lambda: "slow done" in log, 5)

    run(main())


# -- closing with listeners still running ----------------------------------------------------------------


async def _cancel_midway(close: Coroutine[Any, Any, None], reached: asyncio.Event) -> None:
    """Run ``close``, cancel it a moment after it ``reached`` the step under test, and see the cancellation go on."""
    task = asyncio.ensure_future(close)
    await asyncio.wait_for(reached.wait(), 10)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _driver_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("slipstream-driver")]


def test_close_lets_an_async_on_disconnect_finish_and_cancels_a_listener_that_never_ends(driver_dir: Path) -> None:
    """``close`` runs each connection's ``on_disconnect``; an async one (a user's cleanup) runs to its end
    before the endpoint goes, on the server and on the client. A listener still running after
    ``close_timeout`` is cancelled: the close is bounded."""

    async def main() -> None:
        port = free_ports(50)
        log: list[str] = []
        server = Server(server_config(driver_dir, close_timeout=0.5, buffered_sessions=False))
        client = Client(client_config(driver_dir, close_timeout=0.5))

        async def cleanup(side: str) -> None:
            await asyncio.sleep(0.05)  # a few turns of the loop, as a real cleanup's I/O takes
            log.append(f"{side} cleaned up")

        @server.on_disconnect
        async def server_gone(connection: Connection) -> None:
            await cleanup("server")

        @client.on_disconnect
        async def client_gone(connection: Connection) -> None:
            await cleanup("client")

        @server.on_message(Quote)
        async def forever(connection: Connection, quote: Quote) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                log.append("forever ended")

        open_ = [client, server]  # (closed in the end whatever happens: no driver thread outlives the test)
        try:
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send(Quote(1, 1.0, "HANG"))
            await wait_for(lambda: server.connections)
            await asyncio.sleep(0.1)  # (the listener started)
            started = time.monotonic()
            await open_.pop().close()
            assert 0.45 <= time.monotonic() - started < 2.0  # the never-ending listener held it close_timeout
            assert log.count("server cleaned up") == 1 and log.count("forever ended") == 1
            await wait_for(lambda: connection.is_closed, 5)
            await open_.pop().close()
            assert log.count("client cleaned up") == 1
        finally:
            for endpoint in open_:
                await endpoint.close()

    run(main())


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_close_cancelled_midway_still_releases_the_driver(driver_dir: Path, side: str) -> None:
    """A close cancelled while it waits (here for a slow ``on_disconnect``), as when the task around an
    ``async with`` is cancelled: the cancellation goes on, and the endpoint's embedded driver and its
    thread go all the same (they used to outlive the close)."""

    async def main() -> None:
        port = free_ports(50)
        before = _driver_threads()
        server = Server(server_config(driver_dir, close_timeout=5.0, driver="embedded"))
        client = Client(client_config(Path(f"{driver_dir}-client"), close_timeout=5.0, driver="embedded"))
        closing, other = (server, client) if side == "server" else (client, server)
        started = asyncio.Event()
        finished: list[str] = []

        @closing.on_disconnect
        async def slow(connection: Connection) -> None:
            started.set()
            try:
                await asyncio.sleep(30)
            finally:
                finished.append("cancelled")

        try:
            await server.bind(port)
            await client.connect("127.0.0.1", port, timeout=10)
            assert len(_driver_threads()) == len(before) + 2
            await _cancel_midway(closing.close(), started)
            assert finished == ["cancelled"]
            assert len(_driver_threads()) == len(before) + 1  # the other endpoint's driver alone
        finally:
            await other.close()
            shutil.rmtree(f"{driver_dir}-client", ignore_errors=True)
        assert _driver_threads() == before

    run(main())


def test_a_server_close_cancelled_while_it_settles_starting_connections_still_tells_its_clients(
    driver_dir: Path,
) -> None:
    """A server's close first waits for starting connections that are half up (``_settle_starting``, up to
    ``close_timeout``). Cancelled there, its clients still hear CLOSE, where they used to find out by their
    expiry (or the stream's end) after the server's driver went."""

    async def main() -> None:
        port = free_ports(50)
        server = Server(server_config(driver_dir, close_timeout=5.0))
        client = Client(client_config(Path(f"{driver_dir}-client"), close_timeout=5.0))
        ended: list[tuple[bool, bool, str]] = []
        try:
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            hears = client.connection_ended

            def connection_ended(conn: Connection, event: Any) -> None:
                ended.append((event.by_peer, event.expired, event.reason))
                hears(conn, event)

            client.connection_ended = connection_ended  # type: ignore[method-assign]
            settling = asyncio.Event()

            def half_up() -> bool:  # (as a client whose handshake is midway leaves one)
                settling.set()
                return True

            server._half_up = half_up  # type: ignore[method-assign]
            await _cancel_midway(server.close(), settling)
            assert await connection.wait_closed(timeout=10)
            assert ended == [(True, False, "server closing")]
        finally:
            await client.close()
            await server.close()
            shutil.rmtree(f"{driver_dir}-client", ignore_errors=True)

    run(main())
