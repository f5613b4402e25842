"""Issue 34, items 3 and 5, over real connections on loopback: a Connection subclass named in the config
sees and rewrites what is sent and routes what arrives; ``is_network``; ``remote_key_changed``; a connect
timeout of 0 waits forever; loopback clients are not held to ``max_connections_per_address``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slipstream.network import Client, ClientConfig, ConfigError, ConfigTypeError, Connection, Server
from slipstream.network.connecting import connect_window, is_local_host

from .test_network_aio import client_config, free_ports, run, server_config, wait_for


class Note(msgspec.Struct):
    text: str


class Audit(msgspec.Struct):
    text: str


MESSAGES = [Note, Audit]


class Shouting(Connection):
    """Upper-cases every Note it sends; keeps Audit messages from the listeners (routes them to a list),
    and hands the listeners a marked copy of every Note."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[object] = []
        self.audits: list[str] = []

    def outgoing(self, message: object) -> object:
        self.sent.append(message)
        return Note(message.text.upper()) if isinstance(message, Note) else message

    def dispatch(self, message: object) -> None:
        if isinstance(message, Audit):
            self.audits.append(message.text)  # routed here: the listeners never see it
            return
        assert isinstance(message, Note)
        super().dispatch(Note(message.text + "!"))


def test_a_connection_subclass_sees_transforms_and_routes_messages(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        heard: list[str] = []
        server_config_ = server_config(driver_dir, messages=MESSAGES, connection_class=Shouting)
        async with Server(server_config_) as server:
            server.on_message(Note)(lambda connection, note: heard.append(note.text))
            await server.bind(port)
            async with Client(client_config(driver_dir, messages=MESSAGES, connection_class=Shouting)) as client:
                connection = await client.connect("127.0.0.1", port, timeout=10)
                assert isinstance(connection, Shouting)
                await connection.send(Note("hello"))
                connection.send_nowait(Audit("quietly"))
                await connection.send_sync(Audit("acknowledged although no listener ran"), timeout=5)
                await connection.send_sync(Note("synced"), timeout=5)
                assert connection.sent == [
                    Note("hello"),
                    Audit("quietly"),
                    Audit("acknowledged although no listener ran"),
                    Note("synced"),
                ]
                (on_server,) = server.connections
                assert isinstance(on_server, Shouting)
                await wait_for(lambda: len(heard) == 2, 5)
                assert heard == ["HELLO!", "SYNCED!"]  # rewritten by the sender's hook, then the receiver's
                assert on_server.audits == ["quietly", "acknowledged although no listener ran"]
                assert server.errors == 0  # no "nobody listens for Audit": the subclass took them

    run(main())


def test_connection_class_is_checked_when_the_config_is_built() -> None:
    with pytest.raises(ConfigTypeError, match="connection_class"):
        ClientConfig(app_id="a", connection_class=dict)
    with pytest.raises(ConfigTypeError, match="connection_class"):
        ClientConfig(app_id="a", connection_class=object())  # type: ignore[arg-type]


def test_is_network_and_a_changed_server_key_flag(driver_dir: Path, tmp_path: Path) -> None:
    """A connection says whether it is UDP (``is_network``) or IPC; a client that met a server whose key
    changed and was allowed to accept it (``allow_key_change``) says so on the connection."""

    async def main() -> None:
        port = free_ports(50)
        store = tmp_path / "client.db"
        async with Server(server_config(driver_dir, enable_ipc=True)) as first:
            await first.bind(port)
            async with Client(client_config(driver_dir, settings_store=store)) as client:
                udp = await client.connect("127.0.0.1", port, timeout=10)
                assert udp.is_network and not udp.is_ipc and not udp.remote_key_changed
            async with Client(client_config(driver_dir, enable_ipc=True)) as client:
                ipc = await client.connect("127.0.0.1", port, timeout=10)
                assert ipc.is_ipc and not ipc.is_network
        async with Server(server_config(driver_dir)) as second:  # a new key at the same address
            await second.bind(port)
            async with Client(client_config(driver_dir, settings_store=store, allow_key_change=True)) as client:
                changed = await client.connect("127.0.0.1", port, timeout=10)
                assert changed.remote_key_changed
                assert changed.remote_public_key == second.public_key
            async with Client(client_config(driver_dir, settings_store=store)) as client:
                again = await client.connect("127.0.0.1", port, timeout=10)  # re-pinned: no change now
                assert not again.remote_key_changed

    run(main())


def test_a_connect_timeout_of_zero_waits_forever(driver_dir: Path) -> None:
    """0 (or None in the config) waits until the server comes, as the seed's 0 does; negative is refused."""
    assert connect_window(0) == connect_window(None) == float("inf")
    with pytest.raises(ValueError, match="timeout"):
        connect_window(-1)
    with pytest.raises(ConfigError, match="connect_timeout"):
        ClientConfig(app_id="a", connect_timeout=-1)

    async def main() -> None:
        port = free_ports(50)
        async with Client(client_config(driver_dir, connect_timeout=None, handshake_timeout=1.0)) as client:
            with pytest.raises(ValueError, match="timeout"):
                await client.connect("127.0.0.1", port, timeout=-1)
            connecting = asyncio.ensure_future(client.connect("127.0.0.1", port, timeout=0))
            await asyncio.sleep(2.5)  # longer than a handshake timeout: it still waits
            assert not connecting.done()
            async with Server(server_config(driver_dir)) as server:
                await server.bind(port)
                connection = await asyncio.wait_for(connecting, 15)
                assert connection.is_network
                await wait_for(lambda: len(server.connections) == 1, 5)

    run(main())


def test_loopback_clients_are_not_held_to_the_per_address_limit(driver_dir: Path) -> None:
    """The seed exempts loopback clients from the per-address limit (``max_clients`` still holds)."""

    async def main() -> None:
        port = free_ports(50)
        async with Server(server_config(driver_dir, max_clients=3, max_connections_per_address=1)) as server:
            await server.bind(port)
            clients = [Client(client_config(driver_dir)) for _ in range(3)]
            for client in clients:
                await client.connect("127.0.0.1", port, timeout=10)
            await wait_for(lambda: len(server.connections) == 3, 5)
            for client in clients:
                await client.close()

    run(main())


def test_this_hosts_own_addresses_are_local() -> None:
    assert is_local_host("localhost") and is_local_host("127.0.0.2") and is_local_host("::1")
    assert not is_local_host("203.0.113.77")  # TEST-NET-3: nobody's
    assert not is_local_host("no-such-host.invalid")


# Inside a namespace whose only non-loopback address is ADDRESS: a client connecting to that address
# (this host's own) with IPC on both sides uses IPC; over UDP from it, the per-address limit holds.
LAN_SCRIPT = """
import asyncio, shutil, sys, uuid
from pathlib import Path
from slipstream.network import Client, ClientConfig, Server, ServerConfig, TooManyConnectionsForAddress
address = sys.argv[1]
driver = Path("/dev/shm") / f"slipstream-lan-{uuid.uuid4().hex[:12]}"
def config(kind, **kwargs):
    return kind(app_id="lan", settings_store=":memory:", driver_directory=driver, **kwargs)
async def main():
    async with Server(config(ServerConfig, max_connections_per_address=1)) as server:
        await server.bind(40200)
        async with Client(config(ClientConfig)) as client:
            print("ipc", (await client.connect(address, 40200, timeout=10)).is_ipc, flush=True)
        async with Client(config(ClientConfig, enable_ipc=False)) as one:
            print("udp", (await one.connect(address, 40200, timeout=10)).is_network, flush=True)
            async with Client(config(ClientConfig, enable_ipc=False)) as two:
                try:
                    await two.connect(address, 40200, timeout=10)
                except TooManyConnectionsForAddress:
                    print("limited", flush=True)
try:
    asyncio.run(main())
finally:
    shutil.rmtree(driver, ignore_errors=True)
"""


def test_automatic_ipc_covers_this_hosts_lan_address_and_the_limit_holds_there() -> None:
    """The seed's automatic IPC covers the host's own LAN address, not only loopback; and a client from
    a non-loopback address is held to ``max_connections_per_address`` (in a namespace: a LAN address
    of our own without touching the machine's network)."""
    from slipstream.testing.netns import Namespace, python_command

    from .test_netns import needs_netns

    needs_netns()
    address = "10.77.0.1"
    with Namespace(label="lan") as ns:
        ns.ip("link", "add", "lan0", "type", "veth", "peer", "name", "lan1")  # (both ends in the namespace)
        ns.ip("addr", "add", f"{address}/24", "dev", "lan0")
        for end in ("lan0", "lan1"):
            ns.ip("link", "set", end, "up")
        result = ns.run(python_command(LAN_SCRIPT, address), timeout=60)
    assert result.stdout.split("\n")[:3] == ["ipc True", "udp True", "limited"], result.stderr


# A client process with the default settings store (under XDG_DATA_HOME): connects, says its key, and
# stays connected until its stdin closes.
CLIENT_PROCESS = """
import asyncio, sys
from slipstream.network import Client, ClientConfig
async def main():
    config = ClientConfig(app_id="test", driver_directory=sys.argv[1], enable_ipc=False)
    async with Client(config) as client:
        await client.connect("127.0.0.1", int(sys.argv[2]), timeout=20)
        print(client.public_key.hex(), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""


def test_client_processes_without_a_settings_store_have_identities_of_their_own(
    driver_dir: Path, tmp_path: Path
) -> None:
    """Two client processes of one application on one host (no ``settings_store``: the per-user default)
    connect with keys of their own, so the server never takes one for the other; the store keeps each
    claimed key, and a client started again alone has the first one back."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}

    def start(port: int) -> subprocess.Popen[str]:
        command = [sys.executable, "-c", CLIENT_PROCESS, str(driver_dir), str(port)]
        return subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    async def main() -> None:
        port = free_ports(50)
        async with Server(server_config(driver_dir, messages=[])) as server:
            await server.bind(port)
            loop = asyncio.get_running_loop()
            processes = [start(port), start(port)]
            try:
                keys = [await asyncio.wait_for(loop.run_in_executor(None, p.stdout.readline), 40) for p in processes]  # type: ignore[union-attr]
                await wait_for(lambda: len(server.connections) == 2, 10)
                assert keys[0] != keys[1]
                assert {c.remote_public_key.hex() for c in server.connections} == {k.strip() for k in keys}
            finally:
                for process in processes:
                    process.communicate(timeout=20)
            again = start(port)
            try:
                key = await asyncio.wait_for(loop.run_in_executor(None, again.stdout.readline), 40)  # type: ignore[union-attr]
                assert key.strip() in {k.strip() for k in keys}  # a slot freed: the lone client has a kept key
            finally:
                again.communicate(timeout=20)
        assert sorted(p.name for p in (tmp_path / "slipstream").glob("test-client.db*")) == [
            "test-client.db", "test-client.db.identity-1.lock", "test-client.db.identity-2.lock",
        ]  # fmt: skip

    run(main())
