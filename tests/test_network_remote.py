"""Remote objects and large messages over real connections (UDP loopback and IPC), as the seed's suite
has them: the RmiSimpleTest battery, scoped ids, nested objects, counted calls, fire-and-forget,
32 MiB payloads and files (also as RMI arguments), messages bigger than the MTU echoed back."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest

from slipstream.network import Client, Connection, RegistrationMismatch, Server
from slipstream.network.rmi import RemoteError, RemoteObjectMissing, RmiCallTimeout, RmiConnectionClosed
from slipstream.network.streaming import StreamingError
from tests.test_network_aio import client_config, free_ports, run, server_config, wait_for
from tests.test_network_rmi import (
    Calc,
    CalcError,
    Counter,
    Factory,
    ICalc,
    ICounter,
    IFactory,
    Point,
)


class Blob(msgspec.Struct):
    """A message that may be far bigger than one record."""

    name: str
    data: bytes


class IStore(Protocol):
    def put(self, blob: Blob) -> str: ...

    def digest_of(self, data: bytes) -> str: ...

    def fetch(self, size: int) -> bytes: ...


class Store:
    def put(self, blob: Blob) -> str:
        return hashlib.sha256(blob.data).hexdigest()

    def digest_of(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def fetch(self, size: int) -> bytes:
        return random.Random(size).randbytes(size)


MESSAGES = [Point, Blob]
SERVER_INTERFACES: list[Any] = [(ICalc, Calc), (ICounter, Counter), (IFactory, Factory), (IStore, Store)]
CLIENT_INTERFACES: list[Any] = [ICalc, (ICounter, Counter), IFactory, IStore]
TRANSPORTS = ["udp", "ipc"]


@contextlib.asynccontextmanager
async def connected(
    driver_dir: Path, transport: str, tmp_path: Path | None = None, **client_kwargs: Any
) -> AsyncIterator[tuple[Server, Client, Connection]]:
    """A server hosting every interface and a client connected to it over ``transport``."""
    ipc = transport == "ipc"
    temp = {} if tmp_path is None else {"temp_directory": tmp_path}
    server = Server(server_config(
        driver_dir, messages=MESSAGES, interfaces=SERVER_INTERFACES, exceptions=[CalcError], enable_ipc=ipc, **temp,
    ))  # fmt: skip
    client_kwargs.setdefault("interfaces", CLIENT_INTERFACES)
    client = Client(client_config(
        driver_dir, messages=MESSAGES, exceptions=[CalcError], enable_ipc=ipc, **temp, **client_kwargs
    ))  # fmt: skip
    async with server, client:
        await server.bind(free_ports(50))
        port = server._links[0].port
        connection = await client.connect("127.0.0.1", port, timeout=20)
        assert connection.is_ipc is ipc
        yield server, client, connection


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rmi_simple_battery(driver_dir: Path, transport: str) -> None:
    """The seed's RmiSimpleTest: sync, async (fire-and-forget), exceptions, timeouts, coroutines."""

    async def main() -> None:
        async with connected(driver_dir, transport) as (server, _client, connection):
            calc_id = server.rmi.save(Calc())
            calc = connection.rmi.get_global(ICalc, calc_id)
            assert await calc.add(2, 3) == 5
            assert await calc.move(Point(1, 1), dx=4) == Point(5, 1)
            (server_side,) = server.connections
            assert await calc.whoami() == str(server_side)  # the implementation takes the calling connection
            assert await calc.slow(20) == 20  # a coroutine method on the host
            with pytest.raises(CalcError, match="boom"):
                await calc.fail("boom")
            with pytest.raises(RemoteError, match="Unregistered"):
                await calc.fail_unregistered("nope")
            with pytest.raises(RemoteObjectMissing, match="999"):
                await connection.rmi.get_global(ICalc, 999).add(1, 1)
            with pytest.raises(AttributeError, match="secret"):
                calc.secret  # noqa: B018 (nothing but the interface's methods exists on a proxy)
            calc.rmi_timeout = 1.0
            assert await calc.slow(200) == 200
            with pytest.raises(RmiCallTimeout, match="slow"):
                await calc.slow(2000)
            oneway = calc.rmi_async()
            for _ in range(10):
                assert await oneway.bump() is None
            oneway.fail("ignored")  # fire-and-forget never raises here
            assert await calc.count() == 10

    run(main(), 60)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_scoped_ids_created_objects_and_counted_calls(driver_dir: Path, transport: str) -> None:
    async def main() -> None:
        async with connected(driver_dir, transport) as (server, _client, connection):
            # Connection-scoped objects: two clients save different objects under the same id.
            async with Client(client_config(
                driver_dir, messages=MESSAGES, interfaces=CLIENT_INTERFACES, exceptions=[CalcError],
                enable_ipc=transport == "ipc",
            )) as other:  # fmt: skip
                second = await other.connect("127.0.0.1", server._links[0].port, timeout=20)
                await wait_for(lambda: len(server.connections) == 2)
                first_side, second_side = sorted(server.connections, key=lambda c: c.id != connection.id)
                first_side.rmi.save(Counter(100), 7)
                second_side.rmi.save(Counter(200), 7)
                assert await connection.rmi.get(ICounter, 7).value() == 100
                assert await second.rmi.get(ICounter, 7).value() == 200
                # The client hosts a counter too; the server calls it.
                connection.rmi.save(Counter(5), 3)
                assert await first_side.rmi.get(ICounter, 3).increment(2) == 7
            # Remote construction and nested objects.
            factory = await connection.rmi.create(IFactory)
            counter = await factory.make_counter(40)
            assert await counter.increment(2) == 42
            assert await factory.total(counter) == 42  # a proxy sent back arrives as the real object
            assert await factory.echo(None) is None
            # 4,000 awaited calls counting exactly, 100 delayed calls on a global object.
            calc = connection.rmi.get_global(ICalc, server.rmi.save(Calc()))
            results = await asyncio.gather(*(calc.add(i, 1) for i in range(4000)))
            assert results == [i + 1 for i in range(4000)]
            assert await asyncio.gather(*(calc.slow(10) for _ in range(100))) == [10] * 100
            await connection.close()
            with pytest.raises(RmiConnectionClosed):
                await calc.add(1, 1)

    run(main(), 90)


@pytest.mark.parametrize(("transport", "calls"), [("ipc", 1_000_000), ("udp", 200_000)])
def test_fire_and_forget_calls_all_arrive(driver_dir: Path, transport: str, calls: int) -> None:
    """The seed sends 1,000,000 over its IPC; UDP loopback gets a fifth of that (suite time)."""

    async def main() -> None:
        async with connected(driver_dir, transport) as (server, _client, connection):
            host = Calc()
            calc = connection.rmi.get_global(ICalc, server.rmi.save(host)).rmi_async()
            for i in range(calls):
                calc.bump()
                if i % 4096 == 0:
                    await asyncio.sleep(0)  # let the transport drain
            await wait_for(lambda: host.bumps == calls, 60)
            assert await connection.rmi.get_global(ICalc, 1).count() == calls

    run(main(), 120)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_large_messages_files_and_rmi_arguments_arrive_intact(driver_dir: Path, transport: str, tmp_path: Path) -> None:
    data = random.Random(7).randbytes(32 * 1024 * 1024)
    digest = hashlib.sha256(data).hexdigest()
    source = tmp_path / "payload.bin"
    source.write_bytes(data[: 5 * 1024 * 1024 + 17])
    spill = tmp_path / "spill"
    spill.mkdir()

    async def main() -> None:
        got: list[Any] = []
        copies: list[tuple[str, str]] = []
        async with connected(driver_dir, transport, spill) as (server, _client, connection):

            @server.on_message(Blob)
            def on_blob(conn: Connection, blob: Blob) -> None:
                got.append((blob.name, hashlib.sha256(blob.data).hexdigest()))

            @server.on_message(Path)
            def on_file(conn: Connection, path: Path) -> None:
                assert path.parent == spill and path.exists()  # a temporary copy, removed after this listener
                copies.append((str(path), hashlib.sha256(path.read_bytes()).hexdigest()))

            await connection.send(Blob("big", data))
            await connection.send_sync(source, timeout=60)  # the file: acknowledged once handled
            await wait_for(lambda: len(got) == 1, 60)
            assert got == [("big", digest)]
            ((copy, copy_digest),) = copies
            assert copy_digest == hashlib.sha256(source.read_bytes()).hexdigest()
            await wait_for(lambda: not os.path.exists(copy), 10)
            store = connection.rmi.get_global(IStore, server.rmi.save(Store()))
            store.rmi_timeout = 60
            assert await store.put(Blob("arg", data)) == digest  # a 32 MiB RMI argument
            assert await store.digest_of(data) == digest
            fetched = await store.fetch(3 * 1024 * 1024)  # a 3 MiB RMI result
            assert fetched == random.Random(3 * 1024 * 1024).randbytes(3 * 1024 * 1024)
            assert connection.transfers == {}
            (server_side,) = server.connections
            assert server_side._machine.streams is not None and server_side._machine.streams.in_memory_bytes == 0
        assert os.listdir(spill) == []  # nothing left behind

    run(main(), 180)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_message_bigger_than_the_mtu_echoed_1002_times(driver_dir: Path, transport: str) -> None:
    blob = Blob("mtu", random.Random(1).randbytes(12_000))

    async def main() -> None:
        async with connected(driver_dir, transport) as (server, client, connection):
            server.on_message(Blob)(lambda conn, message: conn.send_nowait(message))
            echoes: asyncio.Queue[Blob] = asyncio.Queue()
            client.on_message(Blob)(lambda conn, message: echoes.put_nowait(message))
            for _ in range(1002):
                await connection.send(blob)
                assert await asyncio.wait_for(echoes.get(), 10) == blob

    run(main(), 120)


def test_streams_are_refused_above_the_receivers_limit_and_reported_on_both_sides(driver_dir: Path) -> None:
    async def main() -> None:
        errors: dict[str, list[BaseException]] = {"server": [], "client": []}
        server = Server(server_config(driver_dir, messages=MESSAGES, max_stream_size=1024 * 1024))
        client = Client(client_config(driver_dir, messages=MESSAGES))
        server.on_error(lambda conn, error: errors["server"].append(error))
        client.on_error(lambda conn, error: errors["client"].append(error))
        got: list[Blob] = []
        server.on_message(Blob)(lambda conn, blob: got.append(blob))
        async with server, client:
            await server.bind(free_ports(50))
            connection = await client.connect("127.0.0.1", server._links[0].port, timeout=20)
            await connection.send(Blob("too big", bytes(2 * 1024 * 1024)))
            try:
                await wait_for(lambda: errors["server"] and errors["client"], 20)
            except AssertionError:
                raise AssertionError(errors) from None
            assert all(isinstance(e, StreamingError) for e in errors["server"] + errors["client"])
            assert "too_large" in str(errors["server"][0]) and "refused" in str(errors["client"][0])
            await connection.send(Blob("small", b"fits"))  # the connection goes on
            await wait_for(lambda: [b.name for b in got] == ["small"], 10)

    run(main(), 60)


def test_registration_of_interfaces_is_compared_in_the_handshake(driver_dir: Path) -> None:
    async def main() -> None:
        with pytest.raises(RegistrationMismatch, match="RMI interface"):
            async with connected(driver_dir, "udp", interfaces=[ICalc, (ICounter, Counter), IStore, IFactory]):
                pass
        with pytest.raises(RegistrationMismatch, match="RMI"):
            async with connected(driver_dir, "udp", interfaces=[]):
                pass

    run(main(), 60)


def test_a_hostile_peer_gets_errors_and_the_host_keeps_serving(driver_dir: Path, tmp_path: Path) -> None:
    """Over a real connection: calls outside the interface, an absurd stream size, replayed and forged
    RMI responses. Each is refused or dropped and counted; nothing is allocated for the announced size;
    the server goes on serving the same connection."""
    import struct

    from slipstream.network.frames import FrameKind

    request = struct.Struct(">BHHH")  # flags, object id, interface index, method index (network.rmi)
    start = struct.Struct(">BBIQ")  # flags, inner kind, inner request id, total (network.streaming)

    async def main() -> None:
        errors: list[BaseException] = []
        async with connected(driver_dir, "udp", tmp_path) as (server, _client, connection):
            server.on_error(lambda conn, error: errors.append(error))
            calc_id = server.rmi.save(Calc())
            calc = connection.rmi.get_global(ICalc, calc_id)
            assert await calc.add(1, 2) == 3
            (server_side,) = server.connections
            host = server_side.rmi.endpoint
            args = msgspec.msgpack.encode([1, 2])
            machine = connection._machine
            hostile = [
                request.pack(1, calc_id, 0, 9999) + args,  # a method index outside the interface
                request.pack(1, calc_id, 999, 0) + args,  # an unknown interface
                request.pack(1, calc_id, 0, 0) + b"\xc1\xff",  # garbage arguments
            ]
            for n, payload in enumerate(hostile):
                machine.send_frame(FrameKind.RMI_REQUEST, (n + 100) << 16 | 7, payload)
            machine.send_frame(FrameKind.RMI_RESPONSE, 12345 << 16 | 9, b"\x00\x01")  # forged response
            machine.send_frame(FrameKind.STREAM_START, 77, start.pack(0, FrameKind.MESSAGE, 0, 1 << 62))
            connection._after_append()
            await wait_for(lambda: host.stats.requests_refused == len(hostile), 10)
            await wait_for(lambda: host.stats.responses_dropped == 1, 10)
            await wait_for(lambda: any(isinstance(e, StreamingError) and "too_large" in str(e) for e in errors), 10)
            streams = server_side._machine.streams
            assert streams is not None and streams.in_memory_bytes == 0 and os.listdir(tmp_path) == []
            # The same connection still serves: calls, and a large message that does fit the limit.
            assert await calc.add(20, 22) == 42
            assert await connection.rmi.get_global(IStore, server.rmi.save(Store())).digest_of(b"ok") == (
                hashlib.sha256(b"ok").hexdigest()
            )
            assert not server_side.is_closed and not connection.is_closed

    run(main(), 60)


def test_progress_of_a_large_transfer_is_observable(driver_dir: Path, tmp_path: Path) -> None:
    data = random.Random(5).randbytes(24 * 1024 * 1024)

    async def main() -> None:
        async with connected(driver_dir, "ipc", tmp_path) as (server, _client, connection):
            got: list[int] = []
            server.on_message(Blob)(lambda conn, blob: got.append(len(blob.data)))
            seen: list[tuple[int, int]] = []
            await wait_for(lambda: server.connections)  # the server may activate it just after the client
            (server_side,) = server.connections
            send = asyncio.ensure_future(connection.send(Blob("progress", data)))
            while not got:
                for transfer in list(server_side.transfers.values()) + list(connection.transfers.values()):
                    seen.append((transfer.done, transfer.total))
                await asyncio.sleep(0.001)
            await send
            assert got == [len(data)]
            assert seen and all(0 <= done <= total for done, total in seen)
            assert any(0 < done < total for done, total in seen)  # bytes so far of the total, mid-way
            assert connection.transfers == {} and server_side.transfers == {}

    run(main(), 60)
