"""Servers and clients over the real transport on loopback, written as a user would use the API
(they mirror the seed library's test suite)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slipstream.files import observe
from slipstream.files.counters import NETWORK_RECORDS_DROPPED_TYPE_ID
from slipstream.network import (
    Client,
    ClientConfig,
    ConfigError,
    Connection,
    ConnectionNotPermitted,
    ConnectTimeout,
    MessageDispatchError,
    RegistrationMismatch,
    Server,
    ServerConfig,
    ServerFull,
    ServerKeyChanged,
    UnregisteredTypeError,
)
from slipstream.testing import run_async


class Quote(msgspec.Struct):
    id: int
    price: float
    symbol: str


class Base(msgspec.Struct):
    n: int


class Derived(Base):
    label: str


MESSAGES = [Quote, Base, Derived]


def allocator_in_use(allocator: object) -> frozenset[int]:
    """What an allocator reports as handed out (``in_use`` as a property or a method)."""
    value = getattr(allocator, "in_use", frozenset())
    return frozenset(value() if callable(value) else value)


run = run_async
"""Run a coroutine in a fresh loop, bounded (the other network test files import it from here)."""


def free_ports(count: int) -> int:
    """A base port with ``count`` consecutive free UDP ports (both families)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        try:
            for port in range(base, base + count):
                for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
                    with socket.socket(family, socket.SOCK_DGRAM) as sock:
                        sock.bind((host, port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port block")


def server_config(driver_dir: Path, **kwargs: Any) -> ServerConfig:
    kwargs.setdefault("max_clients", 40)
    kwargs.setdefault("messages", MESSAGES)
    return ServerConfig(
        app_id="test",
        settings_store=":memory:",
        driver_directory=driver_dir,
        enable_ipc=kwargs.pop("enable_ipc", False),
        **kwargs,
    )


def client_config(driver_dir: Path, **kwargs: Any) -> ClientConfig:
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("settings_store", ":memory:")
    return ClientConfig(
        app_id="test", driver_directory=driver_dir, enable_ipc=kwargs.pop("enable_ipc", False), **kwargs
    )


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def test_config_errors_name_the_field(driver_dir: Path) -> None:
    with pytest.raises(ConfigError, match="app_id"):
        ServerConfig(app_id="bad id!")
    with pytest.raises(ConfigError, match="max_clients"):
        ServerConfig(app_id="a", max_clients=0)
    with pytest.raises(TypeError, match="connection_expiry"):
        ClientConfig(app_id="a", connection_expiry="4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"ip_filters\[0\]"):
        ServerConfig(app_id="a", ip_filters=["10.0.0.0/33"])
    with pytest.raises(ConfigError, match="enable_ipv4"):
        ClientConfig(app_id="a", enable_ipv4=False, enable_ipv6=False, enable_ipc=False)
    with pytest.raises(ConfigError, match=r"network_mtu must be at most term_length / 8 \(8192\)"):
        ClientConfig(app_id="a", term_length=64 << 10, network_mtu=9024)
    assert ServerConfig(app_id="a").max_clients > 0  # a fresh server accepts clients


def test_messages_pings_and_send_syncs(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with Server(server_config(driver_dir)) as server, Client(client_config(driver_dir)) as client:
            handled: list[Quote] = []

            @server.on_message(Quote)
            def on_quote(connection: Connection, quote: Quote) -> None:
                handled.append(quote)

            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            assert connection.remote_address == "127.0.0.1" and not connection.is_ipc
            assert connection.remote_public_key == server.public_key
            pings = [await connection.ping(timeout=5) for _ in range(100)]
            assert all(0 < p.round_trip < 1 for p in pings)
            for i in range(100):
                await connection.send_sync(Quote(i, i / 2, "SYNC"), timeout=5)
                assert len(handled) == i + 1  # completes only once the server's listener ran
            (server_side,) = server.connections
            assert server_side.id == connection.id and server_side.remote_public_key == client.public_key
            with pytest.raises(UnregisteredTypeError):
                await connection.send(object())

    run(main())


def test_thirty_clients_closed_in_on_connect(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        counts = {"s_init": 0, "s_connect": 0, "s_disconnect": 0, "c_init": 0, "c_connect": 0, "c_disconnect": 0}
        async with Server(server_config(driver_dir)) as server:

            @server.on_init
            def s_init(connection: Connection) -> None:
                counts["s_init"] += 1

            @server.on_connect
            async def s_connect(connection: Connection) -> None:
                counts["s_connect"] += 1
                await connection.close()

            @server.on_disconnect
            def s_disconnect(connection: Connection) -> None:
                counts["s_disconnect"] += 1

            await server.bind(port)
            clients = [Client(client_config(driver_dir)) for _ in range(30)]
            for client in clients:
                client.on_init(lambda c: counts.__setitem__("c_init", counts["c_init"] + 1))
                client.on_connect(lambda c: counts.__setitem__("c_connect", counts["c_connect"] + 1))
                client.on_disconnect(lambda c: counts.__setitem__("c_disconnect", counts["c_disconnect"] + 1))
            await asyncio.gather(*(client.connect("127.0.0.1", port, timeout=20) for client in clients))
            await wait_for(lambda: counts["c_disconnect"] == 30 and counts["s_disconnect"] == 30, 15)
            for client in clients:
                await client.close()
            await wait_for(lambda: server.allocated == 0, 5)
            assert not allocator_in_use(server.sessions) and not allocator_in_use(server.streams)
        assert counts == dict.fromkeys(counts, 30)

    run(main(), 90)


def test_echo_loop_21_messages_with_global_and_per_connection_listeners(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        fired = {"server_global": 0, "server_connection": 0, "client_global": 0, "client_connection": 0}
        done = asyncio.Event()
        async with Server(server_config(driver_dir)) as server, Client(client_config(driver_dir)) as client:

            @server.on_connect
            def hook(connection: Connection) -> None:
                @connection.on_message(Base)
                def per_connection(conn: Connection, message: Base) -> None:
                    fired["server_connection"] += 1

            @server.on_message(Base)
            async def echo(connection: Connection, message: Base) -> None:  # a coroutine listener
                fired["server_global"] += 1
                await connection.send(message)

            @client.on_message(Base)
            def bounce(connection: Connection, message: Base) -> None:
                fired["client_global"] += 1
                if message.n < 20:
                    connection.send_nowait(Derived(message.n + 1, "x"))  # subclasses reach Base's listeners

            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)

            @connection.on_message(Derived)
            def client_connection(conn: Connection, message: Derived) -> None:
                fired["client_connection"] += 1
                if message.n == 20:
                    done.set()

            await connection.send(Derived(0, "start"))
            await asyncio.wait_for(done.wait(), 10)
            await asyncio.sleep(0.05)
        assert fired == {"server_global": 21, "server_connection": 21, "client_global": 21, "client_connection": 21}

    run(main())


def test_four_servers_each_with_its_own_client(driver_dir: Path) -> None:
    async def main() -> None:
        got: dict[int, list[int]] = {i: [] for i in range(4)}
        servers = [Server(server_config(driver_dir, max_clients=4)) for _ in range(4)]
        clients = [Client(client_config(driver_dir)) for _ in range(4)]
        ports = []
        for index, server in enumerate(servers):
            server.on_message(Base)(lambda c, m, index=index: got[index].append(m.n))
            port = free_ports(8)
            await server.bind(port)
            ports.append(port)
        connections = [await c.connect("127.0.0.1", p, timeout=10) for c, p in zip(clients, ports, strict=True)]
        for index, connection in enumerate(connections):
            for n in range(10):
                await connection.send(Base(index * 100 + n))
        await wait_for(lambda: all(len(v) == 10 for v in got.values()))
        assert got == {i: [i * 100 + n for n in range(10)] for i in range(4)}
        for endpoint in [*clients, *servers]:
            await endpoint.close()

    run(main())


def test_unhandled_messages_and_listener_errors_go_to_on_error(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        errors: list[BaseException] = []
        async with Server(server_config(driver_dir)) as server, Client(client_config(driver_dir)) as client:
            server.on_error(lambda connection, error: errors.append(error))

            @server.on_message(Base)
            def broken(connection: Connection, message: Base) -> None:
                raise RuntimeError(f"listener failed on {message.n}")

            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send(Quote(1, 1.0, "nobody listens"))
            await connection.send_sync(Base(7), timeout=5)  # still acknowledged, connection lives on
            await wait_for(lambda: len(errors) == 2)
            assert isinstance(errors[0], MessageDispatchError) and "Quote" in str(errors[0])
            assert isinstance(errors[1], RuntimeError) and "7" in str(errors[1])
            assert (await connection.ping(timeout=5)).round_trip > 0

    run(main())


@pytest.mark.parametrize(
    ("rules", "host", "allowed"),
    [
        (["127.0.0.0/8"], "127.0.0.1", True),
        (["10.0.0.0/8"], "127.0.0.1", False),
        (["::1/128"], "::1", True),
        (["fd00::/8"], "::1", False),
        (["fd00::/8", "127.0.0.1/32"], "127.0.0.1", True),
    ],
)
def test_ip_filters(driver_dir: Path, rules: list[str], host: str, allowed: bool) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(driver_dir, ip_filters=rules)) as server,
            Client(client_config(driver_dir)) as client,
        ):
            await server.bind(port)
            if allowed:
                connection = await client.connect(host, port, timeout=10)
                assert connection.remote_address == host
            else:
                with pytest.raises(ConnectionNotPermitted, match="permit"):
                    await client.connect(host, port, timeout=10)
                assert server.allocated == 0

    run(main())


def test_filter_callback_sees_address_and_tag(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        seen: list[tuple[str | None, str]] = []

        def only_friends(address: str | None, tag: str) -> bool:
            seen.append((address, tag))
            return tag == "friend"

        async with Server(server_config(driver_dir, filter=only_friends)) as server:
            await server.bind(port)
            async with Client(client_config(driver_dir, tag="friend")) as friend:
                assert (await friend.connect("127.0.0.1", port, timeout=10)).tag == "friend"
            async with Client(client_config(driver_dir, tag="stranger")) as stranger:
                with pytest.raises(ConnectionNotPermitted):
                    await stranger.connect("127.0.0.1", port, timeout=10)
        assert ("127.0.0.1", "friend") in seen and ("127.0.0.1", "stranger") in seen

    run(main())


def test_per_address_limit_and_server_full(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with Server(server_config(driver_dir, max_clients=3, max_connections_per_address=2)) as server:
            await server.bind(port)
            clients = [Client(client_config(driver_dir)) for _ in range(4)]
            await clients[0].connect("127.0.0.1", port, timeout=10)
            await clients[1].connect("127.0.0.1", port, timeout=10)
            # Loopback is exempt from the per-address limit, as in the seed (a non-loopback client is
            # held to it: test_network_extension's LAN test).
            await clients[2].connect("127.0.0.1", port, timeout=10)
            with pytest.raises(ServerFull):
                await clients[3].connect("::1", port, timeout=10)
            for client in clients:
                await client.close()
            await wait_for(lambda: server.allocated == 0, 5)

    run(main())


def test_registration_mismatch_names_the_type(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(driver_dir)) as server,
            Client(client_config(driver_dir, messages=[Quote, Base])) as client,
        ):
            await server.bind(port)
            with pytest.raises(RegistrationMismatch, match="Derived"):
                await client.connect("127.0.0.1", port, timeout=10)

    run(main())


def test_disconnect_and_reconnect_five_times(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        disconnects = {"client": 0, "server": 0}
        async with Server(server_config(driver_dir)) as server, Client(client_config(driver_dir)) as client:
            server.on_disconnect(lambda c: disconnects.__setitem__("server", disconnects["server"] + 1))
            client.on_disconnect(lambda c: disconnects.__setitem__("client", disconnects["client"] + 1))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            ids = {connection.id}
            for _ in range(5):
                await connection.close()
                connection = await client.reconnect()
                ids.add(connection.id)
            await connection.close()
            await wait_for(lambda: disconnects["server"] == 6)
            assert disconnects == {"client": 6, "server": 6} and len(ids) == 6
            await wait_for(lambda: server.allocated == 0, 5)

    run(main())


@pytest.mark.parametrize(
    ("ipv4", "ipv6", "ipc", "host", "is_ipc"),
    [
        (True, False, False, "127.0.0.1", False),
        (False, True, False, "::1", False),
        (True, True, False, "127.0.0.1", False),
        (True, True, False, "::1", False),
        (False, False, True, "localhost", True),
        (True, True, True, "localhost", True),
    ],
)
def test_modes(driver_dir: Path, ipv4: bool, ipv6: bool, ipc: bool, host: str, is_ipc: bool) -> None:
    async def main() -> None:
        port = free_ports(50)
        flags = {"enable_ipv4": ipv4, "enable_ipv6": ipv6, "enable_ipc": ipc}
        async with (
            Server(server_config(driver_dir, **flags)) as server,
            Client(client_config(driver_dir, **flags)) as client,
        ):
            got: list[int] = []
            server.on_message(Base)(lambda c, m: got.append(m.n))
            await server.bind(port)
            connection = await client.connect(host, port, timeout=10)
            assert connection.is_ipc is is_ipc
            await connection.send_sync(Base(5), timeout=5)
            assert got == [5]
            if ipv4 and not ipv6 and not ipc:
                with pytest.raises(ConnectTimeout, match=r"\[::1\]"):
                    await Client(client_config(driver_dir)).connect("::1", port, timeout=1)

    run(main())


def test_ipc_only_server_with_bind_ipc(driver_dir: Path) -> None:
    async def main() -> None:
        async with (
            Server(server_config(driver_dir, enable_ipc=True)) as server,
            Client(client_config(driver_dir, enable_ipc=True)) as client,
        ):
            await server.bind_ipc()
            connection = await client.connect_ipc(timeout=10)
            assert connection.is_ipc and connection.remote_address is None
            assert (await connection.ping(timeout=5)).round_trip < 0.5

    run(main())


def dropped_counters(driver_dir: Path) -> dict[str, int]:
    """The network endpoints' records-dropped counters in the driver's counters file, by label."""
    return {c.label: c.value for c in observe.counters(driver_dir) if c.type_id == NETWORK_RECORDS_DROPPED_TYPE_ID}


def test_tampered_and_replayed_records_on_the_wire_are_dropped_and_counted(driver_dir: Path) -> None:
    """Dropped and counted per connection (by reason), per endpoint (``records_dropped``) and in the
    driver's counters file, which ``slipstream stat`` shows: an operator sees an attack unaided."""

    async def main() -> None:
        port = free_ports(50)
        got: list[int] = []
        async with Server(server_config(driver_dir)) as server, Client(client_config(driver_dir)) as client:
            server.on_message(Base)(lambda c, m: got.append(m.n))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            counters = dropped_counters(driver_dir)
            assert len(counters) == 2 and set(counters.values()) == {0}  # the server's and the client's
            labels = set(counters)
            (server_label,) = [label for label in counters if label.startswith("net records dropped: server")]
            records: list[bytes] = []
            publication = connection.publication
            original = publication.offer

            def capture(message: Any, reserved_value: int = 0) -> int:
                records.append(bytes(message))
                return original(message, reserved_value)

            publication.offer = capture  # type: ignore[method-assign]
            await connection.send_sync(Base(1), timeout=5)
            publication.offer = original  # type: ignore[method-assign]
            record = records[0]
            tampered = bytearray(record)
            tampered[20] ^= 0x40
            tampered[:8] = (1000).to_bytes(8, "big")
            for bad in (record, bytes(tampered), b"short"):  # replayed, tampered, malformed: over UDP
                assert original(bad) > 0
            await connection.send_sync(Base(2), timeout=5)
            (server_side,) = server.connections
            stats = server_side.stats
            assert got == [1, 2]
            assert stats["rejected_replayed"] == 1 and stats["rejected_tampered"] == 1
            assert stats["rejected_malformed"] == 1 and stats["records_dropped"] == 3
            assert server.records_dropped == 3 and client.records_dropped == 0
            assert dropped_counters(driver_dir)[server_label] == 3
            done = subprocess.run(
                [sys.executable, "-m", "slipstream", "stat", "--dir", str(driver_dir), "--once", "--json"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            shown = {c["label"]: c for c in json.loads(done.stdout)["counters"]}
            assert shown[server_label]["value"] == 3 and shown[server_label]["type_name"] == "net-drop"
            async with Client(client_config(driver_dir)) as keeper:  # keeps the shared driver and its files
                await keeper.connect("127.0.0.1", port, timeout=10)
                await server.close()
                await client.close()
                await wait_for(lambda: not labels & set(dropped_counters(driver_dir)), 10)  # freed with their endpoints

    run(main())


def test_changed_server_key_is_refused(driver_dir: Path, tmp_path: Path) -> None:
    """The client pins the key of the server it first met; an impostor answering at the same
    address (as a relay substituting its own key would) is refused with ServerKeyChanged."""

    async def main() -> None:
        port = free_ports(50)
        store = tmp_path / "client.db"
        async with Server(server_config(driver_dir)) as genuine:
            await genuine.bind(port)
            async with Client(client_config(driver_dir, settings_store=store)) as client:
                await client.connect("127.0.0.1", port, timeout=10)
        async with Server(server_config(driver_dir)) as impostor:
            await impostor.bind(port)
            async with Client(client_config(driver_dir, settings_store=store)) as client:
                with pytest.raises(ServerKeyChanged, match="pinned"):
                    await client.connect("127.0.0.1", port, timeout=10)
                assert impostor.allocated == 0
                client.remove_server_key("127.0.0.1")
                await client.connect("127.0.0.1", port, timeout=10)

    run(main())


def test_connect_timeout_names_address_and_seconds(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(4)
        async with Client(client_config(driver_dir)) as client:
            with pytest.raises(ConnectTimeout, match=rf"127\.0\.0\.1:{port}.*[01]\.\d s"):
                await client.connect("127.0.0.1", port, timeout=1)

    run(main())


def test_hello_flood_over_the_wire(driver_dir: Path) -> None:
    """Forged HELLOs from many source ports (never completing the handshake) keep the server's
    half-open table bounded, allocate nothing, and real clients connect during the flood."""
    import os
    import shutil
    import time
    import uuid

    from slipstream import Context
    from slipstream.network.handshake import VERSION
    from slipstream.network.transport import HANDSHAKE_STREAM

    async def main() -> None:
        port = free_ports(50)
        attacker_dir = Path("/dev/shm") / f"slipstream-test-{uuid.uuid4().hex[:12]}"
        config = server_config(driver_dir, max_pending_handshakes=16, handshake_timeout=2.0)
        async with Server(config) as server:
            await server.bind(port)
            attacker = Context(attacker_dir)
            try:
                channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"  # all a handshake port accepts
                publications = [attacker.add_exclusive_publication(channel, HANDSHAKE_STREAM) for _ in range(12)]
                await wait_for(lambda: all(p.is_connected for p in publications))
                flooding = True
                peak = 0

                async def flood() -> int:
                    nonlocal peak
                    sent = 0
                    while flooding:
                        for publication in publications:
                            hello = bytes([VERSION, 1]) + os.urandom(8) + b"\x04test\x00\x00" + os.urandom(32)
                            if publication.offer(hello) > 0:
                                sent += 1
                        peak = max(peak, server.pending_handshakes)
                        await asyncio.sleep(0.001)
                    return sent

                flooder = asyncio.ensure_future(flood())
                await asyncio.sleep(0.3)
                clients = [Client(client_config(driver_dir)) for _ in range(4)]
                started = time.monotonic()
                connections = await asyncio.gather(*(c.connect("127.0.0.1", port, timeout=20) for c in clients))
                took = time.monotonic() - started
                flooding = False
                sent = await flooder
                assert len({c.id for c in connections}) == 4 and took < 15
                assert sent > 500 and peak <= 16
                assert server.allocated == 4  # nothing for the forged HELLOs
                stats = server.handshake_stats[0]
                assert stats.hellos >= sent * 0.5 and stats.evicted + stats.rate_limited > 0
                for client in clients:
                    await client.close()
                await wait_for(lambda: server.allocated == 0 and server.pending_handshakes == 0, 6)
            finally:
                attacker.close()
                shutil.rmtree(attacker_dir, ignore_errors=True)

    run(main(), 90)


def test_auto_ipc_falls_back_to_udp_when_the_server_has_no_ipc(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(driver_dir, enable_ipc=False)) as server,
            Client(client_config(driver_dir, enable_ipc=True)) as client,
        ):
            await server.bind(port)
            connection = await client.connect("localhost", port, timeout=10)
            assert not connection.is_ipc and connection.remote_address == "127.0.0.1"

    run(main())


def test_a_client_accepted_as_the_server_closes_is_not_left_up(driver_dir: Path) -> None:
    """Closed the moment it accepted a client (its streams still coming up), the server either leaves
    that client's connect failing or tells it CLOSE: never a client that counts itself connected to a
    server that is gone, until its expiry."""

    async def main() -> None:
        port = free_ports(50)
        server = Server(server_config(driver_dir, connection_expiry=30.0))
        await server.bind(port)
        async with Client(client_config(driver_dir, connection_expiry=30.0)) as client:
            connecting = asyncio.ensure_future(client.connect("127.0.0.1", port, timeout=5))
            await wait_for(lambda: server.allocated > 0 or connecting.done(), timeout=10)
            await server.close()
            try:
                connection = await connecting
            except ConnectTimeout:
                return
            assert await connection.wait_closed(2), "the client stayed connected to a closed server"

    run(main())


def test_server_close_reaches_the_client_at_once(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        gone: list[float] = []
        server = Server(server_config(driver_dir, connection_expiry=30.0))
        server_side: list[Connection] = []
        server.on_disconnect(lambda c: server_side.append(c))
        await server.bind(port)
        async with Client(client_config(driver_dir, connection_expiry=30.0)) as client:
            client.on_disconnect(lambda c: gone.append(asyncio.get_running_loop().time()))
            connection = await client.connect("127.0.0.1", port, timeout=10)
            closed_at = asyncio.get_running_loop().time()
            await server.close()
            assert await connection.wait_closed(5)
            assert len(gone) == 1 and gone[0] - closed_at < 2.0  # not the 30 s expiry
            assert len(server_side) == 1 and client.connection is None
            assert server.allocated == 0

    run(main())


def test_invoker_mode_runs_the_driver_in_the_event_loop(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(driver_dir, driver="invoker")) as server,
            Client(client_config(driver_dir, driver="invoker")) as client,
        ):
            got: list[int] = []
            server.on_message(Base)(lambda c, m: got.append(m.n))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            assert client._context is not None and client._context.is_invoker
            for n in range(20):
                await connection.send_sync(Base(n), timeout=5)
            assert got == list(range(20))
            assert (await connection.ping(timeout=5)).round_trip < 0.5
            # What the application sends leaves at once (Connection._flush_out), not with the poller's
            # next duty cycle a loop turn later: no await between the send and the check.
            driver = client._context._embedded
            assert driver is not None and driver._conductor is not None
            network = driver._conductor.network_publications[connection.publication.registration_id]
            await asyncio.sleep(0)
            before = network.sender.sender_position
            assert connection.send_nowait(Base(20))
            assert network.sender.sender_position == network.sender.producer_position() > before
            await wait_for(lambda: got[-1:] == [20], 5)

    run(main())


def test_key_allowlist_and_tag_limit(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        async with (
            Client(client_config(driver_dir, tag="ok")) as known,
            Client(client_config(driver_dir)) as stranger,
            Client(client_config(driver_dir, tag="far too long")) as chatty,
        ):
            config = server_config(driver_dir, allowed_keys=[known.public_key, chatty.public_key], max_tag_length=5)
            async with Server(config) as server:
                await server.bind(port)
                connection = await known.connect("127.0.0.1", port, timeout=10)
                assert connection.remote_public_key == server.public_key
                await wait_for(lambda: len(server.connections) == 1)  # the server's side comes up a moment later
                assert server.connections[0].remote_public_key == known.public_key
                with pytest.raises(ConnectionNotPermitted):
                    await stranger.connect("127.0.0.1", port, timeout=10)
                with pytest.raises(ConnectionNotPermitted):
                    await chatty.connect("127.0.0.1", port, timeout=10)
                assert len(server.connections) == 1

    run(main())


def test_plaintext_ipc_when_both_sides_turn_encryption_off(driver_dir: Path) -> None:
    async def main() -> None:
        flags = {"enable_ipc": True, "encrypt_ipc": False}
        async with (
            Server(server_config(driver_dir, **flags)) as server,
            Client(client_config(driver_dir, **flags)) as client,
            Client(client_config(driver_dir, enable_ipc=True)) as careful,
        ):
            got: list[int] = []
            server.on_message(Base)(lambda c, m: got.append(m.n))
            await server.bind_ipc()
            plain = await client.connect_ipc(timeout=10)
            await plain.send_sync(Base(1), timeout=5)
            sealed = await careful.connect_ipc(timeout=10)  # wants encryption: gets it
            await sealed.send_sync(Base(2), timeout=5)
            assert got == [1, 2]
            assert type(plain.machine.records).__name__ == "PlainRecords"
            assert type(sealed.machine.records).__name__ == "RecordLayer"

    run(main())


def test_unreliable_streams_and_a_fixed_client_port(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        client_port = free_ports(1)
        async with (
            Server(server_config(driver_dir, reliable=False)) as server,
            Client(client_config(driver_dir, reliable=False, port=client_port)) as client,
        ):
            got: list[int] = []
            server.on_message(Base)(lambda c, m: got.append(m.n))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            for n in range(50):
                await connection.send(Base(n))
            await connection.send_sync(Base(50), timeout=5)
            assert got == list(range(51))  # loopback loses nothing; the records are in order
            bound = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with pytest.raises(OSError):
                bound.bind(("0.0.0.0", client_port))  # the connection's subscription holds it
            bound.close()

    run(main())


def test_packet_capture_shows_no_plaintext(driver_dir: Path) -> None:
    """Sniff loopback (a raw packet socket; root) during a session: the messages' text never
    appears on the wire, though the capture saw the session's datagrams."""
    import time

    marker = b"PLAINTEXT-MARKER-7f3a"
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sniffer.bind(("lo", 0))
    sniffer.settimeout(0.05)
    frames: list[bytes] = []
    stop = threading.Event()

    def capture() -> None:
        while not stop.is_set():
            try:
                frames.append(sniffer.recv(65535))
            except TimeoutError:
                continue

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()

    async def main() -> None:
        port = free_ports(50)
        got: list[str] = []
        async with Server(server_config(driver_dir)) as server, Client(client_config(driver_dir)) as client:
            server.on_message(Quote)(lambda c, m: got.append(m.symbol))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            for i in range(20):
                await connection.send(Quote(i, 1.5, marker.decode()))
            await connection.send_sync(Quote(99, 0.0, marker.decode()), timeout=5)
            assert got == [marker.decode()] * 21

    control = b"CONTROL-" + marker  # the sniffer does see payloads: a plain datagram shows up
    try:
        run(main())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as plain:
            plain.sendto(control, ("127.0.0.1", free_ports(1)))
        deadline = time.monotonic() + 5
        while not any(control in frame for frame in frames) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(5)
        sniffer.close()
    assert any(control in frame for frame in frames)
    assert len(frames) > 20
    assert not any(marker in frame.replace(control, b"") for frame in frames)


def test_160_clients_at_once_are_never_refused_an_image(driver_dir: Path) -> None:
    """Every client's handshake stream and connection stream land on the server's one port, and a
    closed handshake stream lingers: the receiver's image bound must leave room for both (at 256, the
    97th client's connection stream was refused until the linger ended, 10 s later). And the connect
    storm does not stop the event loop: with blocking driver requests it stalled for 3-4.5 s in one
    piece, and connections that came up first expired (default 4 s) during it."""
    from slipstream.files import observe

    async def main() -> None:
        port = free_ports(300)
        clients_dir = driver_dir.with_name(driver_dir.name + "-clients")
        stalls = [0.0]
        stop = asyncio.Event()

        async def watch_loop() -> None:
            while not stop.is_set():
                started = time.monotonic()
                await asyncio.sleep(0.01)
                stalls.append(time.monotonic() - started - 0.01)

        async with Server(server_config(driver_dir, max_clients=200, driver="invoker")) as server:
            await server.bind(port)
            clients = [Client(client_config(clients_dir, driver="invoker")) for _ in range(160)]
            watcher = asyncio.ensure_future(watch_loop())
            try:
                results = await asyncio.gather(
                    *(client.connect("127.0.0.1", port, timeout=60) for client in clients), return_exceptions=True
                )
                # Only the handshake port's budget per address (128 at once) may have refused a SETUP: that
                # client's publication tried again once an earlier handshake image was given back.
                refused = [e.text for e in observe.errors(driver_dir) if "SETUP refused" in e.text]
                assert all("max-images-per-source" in text for text in refused), refused
                assert [r for r in results if isinstance(r, BaseException)] == []
                # A client is up when its WELCOME and the server's stream arrived; the server counts it
                # once it sees the client's stream too, a moment later.
                await wait_for(lambda: len(server.connections) == 160, 10)
                await asyncio.sleep(0.5)  # an expiry that the storm caused would show by now
                closed = [i for i, c in enumerate(clients) if c.connection is None or c.connection.is_closed]
                assert (len(server.connections), closed) == (160, []), f"longest loop stall {max(stalls):.2f} s"
            finally:
                stop.set()
                await watcher
                await asyncio.gather(*(client.close() for client in clients))

    try:
        run(main(), 120)
    finally:
        shutil.rmtree(driver_dir.with_name(driver_dir.name + "-clients"), ignore_errors=True)


def test_an_idle_connection_parks_long_and_timers_still_fire(driver_dir: Path) -> None:
    """Idle, the poller sleeps up to 1 s between duty cycles (each wake-up costs CPU), but a pause ends
    when a connection's timer (a ping's timeout) or a timer of the invoker-mode driver's streams (a
    heartbeat, a status message) is due, not at the pause's end."""

    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(driver_dir, driver="invoker")) as server,
            Client(client_config(driver_dir, driver="invoker")) as client,
        ):
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.ping(timeout=5)
            group = server._group
            context = server._context
            assert group is not None and group is client._group  # one poller for the loop
            assert context is not None and context is client._context  # and one driver
            cycles = 0
            real_cycle = group._cycle

            def counted(now_ns: int) -> int:
                nonlocal cycles
                cycles += 1
                return real_cycle(now_ns)

            group._cycle = counted  # type: ignore[method-assign]
            await asyncio.sleep(0.2)  # past the short pauses
            cycles = 0
            await asyncio.sleep(1.0)
            # Pauses end at the streams' heartbeats and status messages (backing off to one a second)
            # and a cycle runs per datagram; 100 ms pauses made about 40 here, 10 ms pauses 140.
            assert cycles < 100, cycles
            # A long pause ends when the driver's streams want a duty cycle...
            now = time.monotonic_ns()
            streams_due = context.invoker_deadline_ns()
            assert streams_due is not None
            assert group._until_due(10.0, now) <= max(group.backoff.max_sleep_s, (streams_due - now) / 1e9) + 1e-6
            assert group._until_due(10.0, now) <= 1.0 + 1e-6  # idle heartbeats come at least once a second
            # ...or when a connection's timer is due: here a ping's timeout.
            ping = asyncio.ensure_future(connection.ping(timeout=0.3))
            await asyncio.sleep(0)
            assert group._until_due(10.0, time.monotonic_ns()) <= 0.3
            await ping

    run(main())


@pytest.fixture
def client_dir(driver_dir: Path) -> Iterator[Path]:
    """A second driver directory beside ``driver_dir``, for a client with its own driver (removed after)."""
    path = driver_dir.with_name(driver_dir.name + "-c")
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def longest_stall(coro: Coroutine[Any, Any, Any]) -> float:
    """Await ``coro`` and return the longest time the event loop stood still meanwhile."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    await coro
    await asyncio.sleep(0.01)  # the ticker's turn: it records the gap the coroutine left
    ticker.cancel()
    return max(gaps)


def test_closing_a_client_does_not_stop_the_event_loop(driver_dir: Path, client_dir: Path) -> None:
    """A client's embedded driver lets its closed publications finish before it stops (nothing the
    application sent is dropped), but awaiting, not blocking: the server on the same loop goes on, and
    acknowledges the end of stream, so the close is quick too. It used to block the loop for 1 s."""

    async def main() -> None:
        port = free_ports(50)
        got: list[int] = []
        async with Server(server_config(driver_dir, driver="invoker")) as server:
            server.on_message(Base)(lambda connection, message: got.append(message.n))
            await server.bind(port)
            client = Client(client_config(client_dir, driver="invoker"))
            connection = await client.connect("127.0.0.1", port, timeout=10)
            for n in range(100):
                await connection.send(Base(n))
            stall = await longest_stall(client.close())
            await wait_for(lambda: len(got) == 100)
            assert got == list(range(100))
            assert stall < 0.3, f"the loop stood still for {stall:.3f} s while the client closed"

    run(main())


def test_closing_a_client_whose_server_is_gone_does_not_stop_the_event_loop(driver_dir: Path, client_dir: Path) -> None:
    """With nobody left to acknowledge the end of stream, the client's driver gives its publications
    half a second, awaited; closing the context must not then wait for them again, blocking (it did)."""

    async def main() -> None:
        port = free_ports(50)
        server = Server(server_config(driver_dir, driver="invoker"))
        await server.bind(port)
        client = Client(client_config(client_dir, driver="invoker"))
        connection = await client.connect("127.0.0.1", port, timeout=10)
        await server.close()
        assert await connection.wait_closed(5)
        stall = await longest_stall(client.close())
        assert stall < 0.3, f"the loop stood still for {stall:.3f} s while the client closed"

    run(main())


def test_keepalives_are_not_work_for_the_poller(driver_dir: Path) -> None:
    """A record that only keeps the connection alive, sent or received, does not count as work: work
    resets the idle back-off (a millisecond of spinning, then short pauses), and an idle pair would
    spin up each time a keepalive passes. A message is still work."""

    async def main() -> None:
        async with (
            Server(server_config(driver_dir, driver="invoker", enable_ipc=True)) as server,
            Client(client_config(driver_dir, driver="invoker", enable_ipc=True)) as client,
        ):
            received: list[object] = []
            server.on_message(Base)(lambda connection, message: received.append(message))
            await server.bind_ipc()
            connection = await client.connect_ipc(timeout=10)
            await wait_for(lambda: len(server.connections) == 1)
            remote = server.connections[0]
            polls: dict[str, list[tuple[int, int]]] = {"client": [], "server": []}

            def recorded(side: str, conn: Any) -> None:
                real_poll = conn.poll

                def poll(now_ns: int, *, timers: bool = True) -> int:
                    before = conn.machine.liveness_records
                    work = real_poll(now_ns, timers=timers)
                    polls[side].append((work, conn.machine.liveness_records - before))
                    return work

                conn.poll = poll

            recorded("client", connection)
            recorded("server", remote)
            connection.machine.keepalive_ns = 20_000_000  # a keepalive every 20 ms
            await wait_for(lambda: sum(live for _, live in polls["server"]) >= 5, timeout=10)
            sent = [work for work, live in polls["client"] if live]
            got = [work for work, live in polls["server"] if live]
            assert len(sent) >= 5 and sent.count(0) == len(sent), sent
            assert len(got) >= 5 and got.count(0) == len(got), got
            await connection.send(Base(7))
            await wait_for(lambda: received == [Base(7)])
            assert any(work > 0 and not live for work, live in polls["server"])

    run(main())


def test_a_datagram_arriving_just_after_the_driver_read_still_wakes_the_poller(driver_dir: Path) -> None:
    """A parked invoker-mode poller woken by its driver's input runs a cycle; if the descriptor is still
    readable after a cycle that did nothing, the next wait leaves it out (input the driver leaves unread
    must not spin the loop). A datagram that lands right after the driver read its socket looks the
    same: the poller must take one more cycle to tell, or that datagram waits out a 100 ms pause."""

    async def main() -> None:
        port = free_ports(2)
        async with Server(server_config(driver_dir, driver="invoker")) as server:
            await server.bind(port)
            group = server._group
            assert group is not None
            junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            state: dict[str, Any] = {"inject": False, "outcome": None, "pause": 0.0}
            waits: list[tuple[int, ...]] = []
            real_cycle, real_park = group._cycle, group.backoff.park

            def cycle(now_ns: int) -> int:
                work = real_cycle(now_ns)
                if state["inject"] and state["outcome"] == "input":
                    state["inject"] = False  # a datagram lands after the driver's read in this cycle
                    junk.sendto(b"late", ("127.0.0.1", port))
                return work

            async def park(doorbells: Any, pause_s: float, inputs: Any = ()) -> str:
                waits.append(tuple(inputs))
                state["pause"] = pause_s
                outcome = await real_park(doorbells, pause_s, inputs)
                state["outcome"], state["pause"] = outcome, 0.0
                return outcome

            group._cycle = cycle  # type: ignore[method-assign]
            group.backoff.park = park  # type: ignore[method-assign]
            try:
                # Deep in its idle pauses (parked on doorbells and the driver's input).
                await wait_for(lambda: group.backoff.parked and state["pause"] > 0.01, timeout=10)
                assert waits[-1], "a parked invoker-mode poller waits on its driver's input"
                waits.clear()
                state["inject"] = True
                junk.sendto(b"wake", ("127.0.0.1", port))  # wakes the poller by input
                await wait_for(lambda: not state["inject"] and len(waits) >= 1, timeout=10)
                assert waits[0], "the wait after a late datagram left the driver's input out"
            finally:
                junk.close()

    run(main())


def test_a_handshake_datagram_an_invoker_mode_driver_took_in_is_handled_in_the_same_cycle(
    driver_dir: Path, client_dir: Path
) -> None:
    """A cycle runs the endpoints, then the invoker-mode drivers; when a driver took input that no connection
    took (a handshake's datagram), the endpoints cycle again at once: it does not wait in the handshake image
    for the next cycle, which for a parked poller may be a pause away. The test runs the server's cycles itself,
    one at a time; only the server's driver (in this loop) writes its images, so after each cycle they are read."""
    from slipstream.network import sync
    from slipstream.network.pacing import Pacer
    from slipstream.network.polling import PollCore
    from slipstream.network.transport import HANDSHAKE_STREAM

    async def main() -> None:
        port = free_ports(2)
        async with Server(server_config(driver_dir, driver="invoker")) as server:
            await server.bind(port)
            group, context = server._group, server.context
            assert group is not None and context is not None
            group.remove(server)  # (its poller task ends: this test cycles the server)
            core = PollCore(Pacer())
            core.endpoints.append(server)
            connected: list[bool] = []

            def connect() -> None:
                with sync.Client(client_config(client_dir)) as client:
                    connection = client.connect("127.0.0.1", port, timeout=10)
                    connection.send_sync(Quote(1, 1.0, "HELLO"), timeout=10)
                    connected.append(True)

            thread = threading.Thread(target=connect, daemon=True)
            thread.start()
            deadline = time.monotonic() + 20
            cycles = 0
            try:
                while thread.is_alive():
                    assert time.monotonic() < deadline, "the client did not connect"
                    core._cycle(time.monotonic_ns())
                    cycles += 1
                    handshakes = [s for s in context.subscriptions if s.stream_id == HANDSHAKE_STREAM]
                    assert handshakes
                    left = [image for s in handshakes for image in s.images if image.has_frame()]
                    assert not left, f"cycle {cycles} left a handshake datagram for the next one"
                    await asyncio.sleep(0)  # (the server's stream registrations are awaited in the loop)
            finally:
                group.add(server)  # back to its poller, to close
                thread.join(15)
            assert connected == [True] and cycles > 0

    run(main())


def test_a_connection_port_another_program_holds_is_skipped(driver_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The server's publication to a client binds a port from ``connection_ports``; when another
    program holds it, the driver refuses and the server asks again with the next port (four of the
    five ports here are held, so most runs retry at least once) and the client connects."""
    base = free_ports(8)
    held = []
    for port in range(base + 2, base + 6):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("0.0.0.0", port))
        held.append(sock)

    async def main() -> None:
        config = server_config(driver_dir, connection_ports=(base + 2, 5), driver="invoker")
        async with Server(config) as server:
            await server.bind(base)
            async with Client(client_config(driver_dir.with_name(driver_dir.name + "-c"), driver="invoker")) as client:
                connection = await client.connect("127.0.0.1", base, timeout=20)
                assert await connection.ping(timeout=5)
                await wait_for(lambda: len(server.connections) == 1)

    try:
        with caplog.at_level(logging.INFO, logger="slipstream.network"):
            run(main())
        retries = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
        assert len(retries) <= 4
        if retries:  # each names a held port, and the last moves to the free one
            assert all(int(text.split()[2]) in range(base + 2, base + 6) for text in retries), retries
            assert retries[-1].endswith(f"trying {base + 6}"), retries
    finally:
        for sock in held:
            sock.close()
        shutil.rmtree(driver_dir.with_name(driver_dir.name + "-c"), ignore_errors=True)


def test_a_spinning_poller_still_gives_the_loops_other_tasks_their_turns(driver_dir: Path) -> None:
    """After work the poller spins for a while (the next message usually follows closely); idle cycles run
    back to back, but only for ``IDLE_TURN_NS`` between turns of the event loop: the application's tasks
    must not wait out the whole spin."""

    async def main() -> None:
        async with (
            Server(server_config(driver_dir, enable_ipc=True, driver="invoker")) as server,
            Client(client_config(driver_dir, enable_ipc=True, driver="invoker")) as client,
        ):  # (an invoker-mode driver: no driver thread, so the pollers spin by yielding, as the benchmark's)
            await server.bind_ipc()
            connection = await client.connect_ipc(timeout=10)
            gaps: list[int] = []
            for i in range(20):
                await connection.send_sync(Quote(i, 1.0, "SPIN"), timeout=5)  # both pollers spin after this
                last = time.perf_counter_ns()
                end = last + 500_000  # inside the spin (about a millisecond after work)
                while last < end:
                    await asyncio.sleep(0)
                    now = time.perf_counter_ns()
                    gaps.append(now - last)
                    last = now
            gaps.sort()
            assert gaps[len(gaps) // 2] < 200_000, f"median turn gap {gaps[len(gaps) // 2] / 1e3:.0f} us"

    run(main())


class CycleTrace:
    """The poller's calls of an endpoint's cycles (see :func:`traced_cycles`), counted and in order."""

    def __init__(self) -> None:
        self.counts = {"whole": 0, "connections": 0, "driver": 0}
        self.order: list[str] = []
        """W: a whole duty cycle; C: the connections' part alone, when it took something in; D / d: the
        invoker-mode driver's cycle, with work or without."""


@contextmanager
def traced_cycles(endpoint: Any) -> Iterator[CycleTrace]:
    """Meanwhile, trace the poller's calls of ``endpoint``'s whole duty cycle, of its connections' part alone
    and of its invoker-mode driver's cycle."""
    trace = CycleTrace()
    counts, order = trace.counts, trace.order
    whole, connections, invoke = endpoint.duty_cycle, endpoint.poll_connections, endpoint.context.invoke

    def duty_cycle(now_ns: int) -> int:
        counts["whole"] += 1
        order.append("W")
        return int(whole(now_ns))

    def poll_connections(now_ns: int) -> int:
        counts["connections"] += 1
        work = int(connections(now_ns))
        if work:
            order.append("C")
        return work

    def invoked() -> int:
        counts["driver"] += 1
        work = int(invoke())
        order.append("D" if work else "d")
        return work

    endpoint.duty_cycle, endpoint.poll_connections, endpoint.context.invoke = duty_cycle, poll_connections, invoked
    try:
        yield trace
    finally:
        endpoint.duty_cycle, endpoint.poll_connections, endpoint.context.invoke = whole, connections, invoke


@pytest.mark.parametrize("transport", ["ipc", "udp"])
def test_a_spinning_poller_runs_the_chores_now_and_then_and_polls_the_connections_in_between(
    driver_dir: Path, client_dir: Path, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a poller spins idle after work, a whole duty cycle (the endpoint's chores, the invoker-mode
    driver's own cycle) runs at most every ``SPIN_CHORES_NS``; in between only the connections are polled,
    so a frame is not left waiting behind the chores. A driver that carries UDP still runs on every spin
    (its datagrams come in only with its cycle); one that carries IPC alone waits for the whole cycles.

    The window is widened here: in a slow phase of a loaded machine one spin takes more than the default's
    50 us, and every spin is then a whole cycle (as it should be), which says nothing of the mechanism."""
    from slipstream.network import polling

    chores_ns = 400_000
    monkeypatch.setattr(polling, "SPIN_CHORES_NS", chores_ns)

    async def main() -> None:
        ipc = transport == "ipc"
        async with (
            Server(server_config(driver_dir, enable_ipc=ipc, driver="invoker")) as server,
            Client(client_config(driver_dir if ipc else client_dir, enable_ipc=ipc, driver="invoker")) as client,
        ):
            port = free_ports(2)
            if ipc:
                await server.bind_ipc()
                connection = await client.connect_ipc(timeout=10)
            else:
                await server.bind(port)
                connection = await client.connect("127.0.0.1", port, timeout=10)
            spun_ns = 0
            with traced_cycles(server) as trace:
                counts = trace.counts
                for i in range(20):
                    await connection.send_sync(Quote(i, 1.0, "SPIN"), timeout=5)  # the pollers spin after this
                    before = dict(counts)
                    start = time.monotonic_ns()
                    await asyncio.sleep(0.0004)  # (inside the spin: about a millisecond after work)
                    while counts["whole"] == before["whole"]:  # the chores still run (a stalled process: later)
                        assert time.monotonic_ns() - start < 5e9, "no whole cycle in 5 s"
                        await asyncio.sleep(0.0001)
                    spun_ns += time.monotonic_ns() - start
            # At most one whole cycle per SPIN_CHORES_NS, one more after each round's work, and a few for the
            # send_syncs themselves.
            assert counts["whole"] <= spun_ns // chores_ns + 20 * 4, counts
            if ipc:  # many more polls of the connections alone; the driver (shared with the client) waits
                assert counts["connections"] > counts["whole"], counts
                assert counts["driver"] <= counts["whole"], counts
            else:  # the driver runs on the spins between whole cycles too (two more UDP drivers' cycles each
                # spin here, the client's too: fewer spins than over IPC, so no count of the connections' polls)
                assert counts["driver"] > counts["whole"], counts

    run(main())


def test_messages_sent_together_after_a_lone_one_share_records_and_arrive_in_order(driver_dir: Path) -> None:
    """The first message since a connection's last poll leaves alone, at once; the ones sent right after it
    wait in the batch and go out together with the connection's next poll (no callback of their own)."""

    async def main() -> None:
        async with (
            Server(server_config(driver_dir, enable_ipc=True, driver="invoker")) as server,
            Client(client_config(driver_dir, enable_ipc=True, driver="invoker")) as client,
        ):
            got: list[int] = []

            @server.on_message(Quote)
            def on_quote(connection: Connection, quote: Quote) -> None:
                got.append(quote.id)

            await server.bind_ipc()
            connection = await client.connect_ipc(timeout=10)
            await connection.send_sync(Quote(-1, 1.0, "FIRST"), timeout=5)
            before = connection.stats["records_sent"]
            for i in range(40):  # one step of this task: the poller cannot run in between
                assert connection.send_nowait(Quote(i, 1.0, "BURST"))
            assert connection.stats["records_sent"] == before + 1  # the first alone; the rest wait
            await wait_for(lambda: len(got) == 41, timeout=5)
            assert got == [-1, *range(40)]
            assert connection.stats["records_sent"] - before <= 3  # the 39 went in one record (two at most)
            after = connection.stats["records_sent"]
            assert connection.send_nowait(Quote(99, 1.0, "NEXT"))  # a poll ran since: alone, at once, again
            assert connection.stats["records_sent"] == after + 1
            await wait_for(lambda: got[-1] == 99, timeout=5)

    run(main())


def test_the_smallest_ipc_term_carries_a_burst_in_records_its_log_takes(driver_dir: Path) -> None:
    """With ``ipc_term_length`` at its smallest (64 KiB) a log takes messages of at most a term's eighth,
    8 KiB. The connections' IPC streams used a 64 KiB MTU whatever the term, so a burst's records filled
    64 KiB frames: taken while the log had room, but a back-pressured offer of one raised in the poller, and
    again every cycle. The MTU is now cut to the term's largest message, as Aeron's driver requires."""
    count = 20_000

    async def main() -> None:
        async with (
            Server(server_config(driver_dir, enable_ipc=True, ipc_term_length=64 << 10)) as server,
            Client(client_config(driver_dir, enable_ipc=True, ipc_term_length=64 << 10)) as client,
        ):
            got: list[int] = []
            errors: list[BaseException] = []
            server.on_message(Quote)(lambda connection, quote: got.append(quote.id))
            server.on_error(lambda connection, error: errors.append(error))
            client.on_error(lambda connection, error: errors.append(error))
            await server.bind_ipc()
            connection = await client.connect_ipc(timeout=10)
            publication = connection._link.publication
            assert publication.max_payload_length <= publication.max_message_length == 8 << 10
            sent = 0
            while sent < count:  # a burst in one step of this task until back-pressured, then a millisecond
                if connection.send_nowait(Quote(sent, 1.0, "BURST")):
                    sent += 1
                else:
                    await asyncio.sleep(0.001)
            await wait_for(lambda: len(got) == count or bool(errors), timeout=30)
            assert not errors and got == list(range(count))
            assert connection.stats["back_pressure_events"] > 0  # (what made the old records fail)

    run(main())


def test_a_client_connects_through_a_driver_configured_for_jumbo_datagrams(driver_dir: Path) -> None:
    """An external driver with ``udp_mtu`` 9 KiB (jumbo frames) refuses a publication whose MTU exceeds its
    term's largest message, as Aeron's does. A connecting client's handshake publication has small terms (64 KiB:
    8 KiB messages), so it names its own MTU instead of taking the driver's."""
    from slipstream import DriverConfig, MediaDriver

    media_driver = MediaDriver(DriverConfig(directory=driver_dir, udp_mtu=9024)).launch_embedded()

    async def main() -> None:
        port = free_ports(50)
        async with (
            Server(server_config(Path(f"{driver_dir}-server"))) as server,
            Client(client_config(driver_dir, driver="external")) as client,
        ):
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            assert (await connection.ping(timeout=5)).round_trip < 1

    try:
        run(main())
    finally:
        media_driver.close()
        shutil.rmtree(f"{driver_dir}-server", ignore_errors=True)
