"""Network-layer peers in their own processes (each with its own driver), for the process tests.

    python network_peer.py client <driver_dir> <host> <port> <expiry_s> <count> <close|hang>
    python network_peer.py server <driver_dir> <listen_address> <port> [<expiry_s>]
    python network_peer.py receiver <driver_dir> <host> <port> <expiry_s> <settings_store> <expect>
    python network_peer.py streamer <driver_dir> <host> <port> <file>

The client prints ``connected <id>`` once connected, ``sent`` after ``count`` send_syncs, then either
closes (``closed``) or hangs until killed (at most 60 s). The server prints ``listening``, then
``connect <address>`` per client and ``message <n>`` per message, takes ``bytes`` messages silently (a
client's bulk load), and runs until killed (60 s).
The receiver (its identity key kept in ``settings_store``, so a second receiver is the same client)
prints ``connected <id>``, then ``received <n> <first>..<last> ordered`` (or ``unordered``) once ``expect``
messages arrived, and hangs until killed (60 s). The streamer sends ``file`` (a large file as a
stream), prints ``streaming``, and hangs until killed (60 s).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import msgspec

from slipstream.network import Client, ClientConfig, Connection, Server, ServerConfig
from slipstream.testing import run_async


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


async def receiver(directory: str, host: str, port: int, expiry: float, store: str, expect: int) -> None:
    config = ClientConfig(
        app_id="test",
        messages=[Base],
        settings_store=store,
        driver_directory=directory,
        enable_ipc=False,
        connection_expiry=expiry,
    )
    got: list[int] = []
    done = asyncio.Event()
    async with Client(config) as endpoint:

        @endpoint.on_message(Base)
        def message(connection: Connection, message: Base) -> None:
            got.append(message.n)
            if len(got) == expect:
                done.set()

        connection = await endpoint.connect(host, port, timeout=20)
        print(f"connected {connection.id}", flush=True)
        if expect:
            await done.wait()
            order = "ordered" if got == sorted(got) else "unordered"
            print(f"received {len(got)} {got[0]}..{got[-1]} {order}", flush=True)
        await asyncio.sleep(60)


async def streamer(directory: str, host: str, port: int, path: str) -> None:
    config = ClientConfig(
        app_id="test", messages=[Base], settings_store=":memory:", driver_directory=directory, enable_ipc=False
    )
    async with Client(config) as endpoint:
        connection = await endpoint.connect(host, port, timeout=20)
        await connection.send(Path(path))
        print("streaming", flush=True)
        await asyncio.sleep(60)


async def server(directory: str, address: str, port: int, expiry: float = 4.0) -> None:
    config = ServerConfig(
        app_id="test",
        messages=[Base],
        settings_store=":memory:",
        driver_directory=directory,
        enable_ipc=False,
        listen_address=address,
        max_clients=8,
        connection_expiry=expiry,
    )
    async with Server(config) as endpoint:

        @endpoint.on_connect
        def connected(connection: Connection) -> None:
            print(f"connect {connection.remote_address}", flush=True)

        @endpoint.on_message(Base)
        def message(connection: Connection, message: Base) -> None:
            print(f"message {message.n}", flush=True)

        @endpoint.on_message(bytes)
        def load(connection: Connection, message: bytes) -> None:
            pass

        await endpoint.bind(port)
        print("listening", flush=True)
        await asyncio.sleep(60)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "client":
        directory, host, port, expiry, count, mode = args
        coro = client(directory, host, int(port), float(expiry), int(count), mode)
    elif role == "streamer":
        directory, host, port, path = args
        coro = streamer(directory, host, int(port), path)
    elif role == "receiver":
        directory, host, port, expiry, store, expect = args
        coro = receiver(directory, host, int(port), float(expiry), store, int(expect))
    else:
        directory, address, port, *expiry = args
        coro = server(directory, address, int(port), *map(float, expiry))
    run_async(coro, 90)
