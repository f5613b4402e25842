"""Network-layer peers in their own processes (each with its own driver), for the process tests.

    python network_peer.py client <driver_dir> <host> <port> <expiry_s> <count> <close|hang>
    python network_peer.py server <driver_dir> <listen_address> <port>

The client prints ``connected <id>`` once connected, ``sent`` after ``count`` send_syncs, then either
closes (``closed``) or hangs until killed (at most 60 s). The server prints ``listening``, then
``connect <address>`` per client and ``message <n>`` per message, and runs until killed (60 s).
"""

from __future__ import annotations

import asyncio
import sys

import msgspec

from slipstream.network import Client, ClientConfig, Connection, Server, ServerConfig


class Base(msgspec.Struct):
    n: int


async def client(directory: str, host: str, port: int, expiry: float, count: int, mode: str) -> None:
    config = ClientConfig(
        app_id="test",
        messages=[Base],
        settings_store=":memory:",
        driver_directory=directory,
        enable_ipc=False,
        connection_expiry=expiry,
    )
    async with Client(config) as endpoint:
        connection = await endpoint.connect(host, port, timeout=20)
        print(f"connected {connection.id}", flush=True)
        for n in range(count):
            await connection.send_sync(Base(n), timeout=10)
        print("sent", flush=True)
        if mode == "hang":
            await asyncio.sleep(60)
        await connection.close()
        print("closed", flush=True)


async def server(directory: str, address: str, port: int) -> None:
    config = ServerConfig(
        app_id="test",
        messages=[Base],
        settings_store=":memory:",
        driver_directory=directory,
        enable_ipc=False,
        listen_address=address,
        max_clients=8,
    )
    async with Server(config) as endpoint:

        @endpoint.on_connect
        def connected(connection: Connection) -> None:
            print(f"connect {connection.remote_address}", flush=True)

        @endpoint.on_message(Base)
        def message(connection: Connection, message: Base) -> None:
            print(f"message {message.n}", flush=True)

        await endpoint.bind(port)
        print("listening", flush=True)
        await asyncio.sleep(60)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "client":
        directory, host, port, expiry, count, mode = args
        coro = client(directory, host, int(port), float(expiry), int(count), mode)
    else:
        directory, address, port = args
        coro = server(directory, address, int(port))
    asyncio.run(asyncio.wait_for(coro, 90))
