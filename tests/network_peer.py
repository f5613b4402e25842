"""A network-layer client in its own process (with its own driver), for the process tests.

    python network_peer.py <driver_dir> <host> <port> <expiry_s> <count> <close|hang>

Prints ``connected <id>`` once connected, ``sent`` after ``count`` send_syncs, then either closes
(``closed``) or hangs until killed (at most 60 s)."""

from __future__ import annotations

import asyncio
import sys

import msgspec

from slipstream.network import Client, ClientConfig


class Base(msgspec.Struct):
    n: int


async def main(directory: str, host: str, port: int, expiry: float, count: int, mode: str) -> None:
    config = ClientConfig(
        app_id="test",
        messages=[Base],
        settings_store=":memory:",
        driver_directory=directory,
        enable_ipc=False,
        connection_expiry=expiry,
    )
    async with Client(config) as client:
        connection = await client.connect(host, port, timeout=20)
        print(f"connected {connection.id}", flush=True)
        for n in range(count):
            await connection.send_sync(Base(n), timeout=10)
        print("sent", flush=True)
        if mode == "hang":
            await asyncio.sleep(60)
        await connection.close()
        print("closed", flush=True)


if __name__ == "__main__":
    directory, host, port, expiry, count, mode = sys.argv[1:7]
    asyncio.run(asyncio.wait_for(main(directory, host, int(port), float(expiry), int(count), mode), 90))
