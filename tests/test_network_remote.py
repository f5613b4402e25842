"""Remote objects and large messages over real connections (UDP loopback and IPC), as the seed's suite
has them: the RmiSimpleTest battery, scoped ids, nested objects, counted calls, fire-and-forget,
32 MiB payloads and files (also as RMI arguments and results, ``pathlib.Path``), messages bigger than
the MTU echoed back; deleted objects, and proxies and implementations sent as messages."""

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
from slipstream.network.aio.rmi import Proxy
from slipstream.network.rmi import (
    InterfaceError,
    RemoteError,
    RemoteObjectMissing,
    RmiCallTimeout,
    RmiConnectionClosed,
)
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

    def checksum(self, file: Path) -> str: ...

    async def export(self, size: int) -> Path: ...

    def maybe(self, file: Path | None) -> Path | None: ...


class Store:
    def __init__(self, export_dir: Path | None = None) -> None:
        self.export_dir = export_dir
        self.seen: list[tuple[Path, bool, str]] = []
        """(path, existed, SHA-256) of each file argument, as the method saw it."""

    def put(self, blob: Blob) -> str:
        return hashlib.sha256(blob.data).hexdigest()

    def digest_of(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def fetch(self, size: int) -> bytes:
        return random.Random(size).randbytes(size)

    def checksum(self, file: Path) -> str:
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        self.seen.append((file, file.exists(), digest))
        return digest

    async def export(self, size: int) -> Path:
        assert self.export_dir is not None
        await asyncio.sleep(0)
        path = self.export_dir / f"export-{size}.bin"
        path.write_bytes(random.Random(size).randbytes(size))
        return path

    def maybe(self, file: Path | None) -> Path | None:
        return file  # a file argument sent straight back: the caller gets its own copy


MESSAGES = [Point, Blob]
SERVER_INTERFACES: list[Any] = [(ICalc, Calc), (ICounter, Counter), (IFactory, Factory), (IStore, Store)]
CLIENT_INTERFACES: list[Any] = [ICalc, (ICounter, Counter), IFactory, IStore]
TRANSPORTS = ["udp", "ipc"]
BIG_MESSAGES = 64 * 1024 * 1024
"""The seed's battery sends 32 MiB messages: above the default ``max_message_size`` (16 MiB), so opted in."""


@contextlib.asynccontextmanager
async def connected(
    driver_dir: Path, transport: str, tmp_path: Path | None = None, **client_kwargs: Any
) -> AsyncIterator[tuple[Server, Client, Connection]]:
    """A server hosting every interface and a client connected to it over ``transport``."""
    ipc = transport == "ipc"
    temp = {} if tmp_path is None else {"temp_directory": tmp_path}
    server = Server(server_config(
        driver_dir, messages=MESSAGES, interfaces=SERVER_INTERFACES, exceptions=[CalcError], enable_ipc=ipc, **temp,
        max_message_size=BIG_MESSAGES,
    ))  # fmt: skip
    client_kwargs.setdefault("interfaces", CLIENT_INTERFACES)
    client_kwargs.setdefault("max_message_size", BIG_MESSAGES)
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
                assert path.exists() and path.name == "payload.bin"  # the sender's name, in a private directory
                assert path.parent.parent == spill and path.parent.stat().st_mode & 0o777 == 0o700
                copies.append((str(path), hashlib.sha256(path.read_bytes()).hexdigest()))

            await connection.send(Blob("big", data))
            await connection.send_sync(source, timeout=60)  # the file: acknowledged once handled
            await wait_for(lambda: len(got) == 1, 60)
            assert got == [("big", digest)]
            ((copy, copy_digest),) = copies
            assert copy_digest == hashlib.sha256(source.read_bytes()).hexdigest()
            await wait_for(lambda: not os.path.exists(os.path.dirname(copy)), 10)  # removed after the listener
            store = connection.rmi.get_global(IStore, server.rmi.save(Store()))
            store.rmi_timeout = 60
            assert await store.put(Blob("arg", data)) == digest  # a 32 MiB RMI argument
            assert await store.digest_of(data) == digest
            fetched = await store.fetch(3 * 1024 * 1024)  # a 3 MiB RMI result
            assert fetched == random.Random(3 * 1024 * 1024).randbytes(3 * 1024 * 1024)
            assert connection.transfers == {}
            (server_side,) = server.connections
            assert server_side.machine.streams is not None and server_side.machine.streams.in_memory_bytes == 0
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
            machine = connection.machine
            hostile = [
                request.pack(1, calc_id, 0, 9999) + args,  # a method index outside the interface
                request.pack(1, calc_id, 999, 0) + args,  # an unknown interface
                request.pack(1, calc_id, 0, 0) + b"\xc1\xff",  # garbage arguments
            ]
            for n, payload in enumerate(hostile):
                machine.send_frame(FrameKind.RMI_REQUEST, (n + 100) << 16 | 7, payload)
            machine.send_frame(FrameKind.RMI_RESPONSE, 12345 << 16 | 9, b"\x00\x01")  # forged response
            machine.send_frame(FrameKind.STREAM_START, 77, start.pack(0, FrameKind.MESSAGE, 0, 1 << 62))
            connection.flush()
            await wait_for(lambda: host.stats.requests_refused == len(hostile), 10)
            await wait_for(lambda: host.stats.responses_dropped == 1, 10)
            await wait_for(lambda: any(isinstance(e, StreamingError) and "too_large" in str(e) for e in errors), 10)
            streams = server_side.machine.streams
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


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_files_as_rmi_arguments_and_results_arrive_intact(driver_dir: Path, transport: str, tmp_path: Path) -> None:
    """A ``Path`` argument streams the file (the host's method gets a temporary copy, removed once the
    call completed); a ``Path`` result streams back (the caller owns the copy it gets)."""
    spill = tmp_path / "spill"  # both sides' temporary directory
    exports = tmp_path / "exports"
    spill.mkdir()
    exports.mkdir()
    source = tmp_path / "argument.bin"
    source.write_bytes(random.Random(11).randbytes(9 * 1024 * 1024 + 5))  # spilled, many chunks
    small = tmp_path / "small.txt"
    small.write_bytes(b"one chunk")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")

    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    async def main() -> None:
        errors: list[BaseException] = []
        messages: list[object] = []
        async with connected(driver_dir, transport, spill) as (server, client, connection):
            client.on_error(lambda conn, error: errors.append(error))
            server.on_error(lambda conn, error: errors.append(error))
            server.on_message(Path)(lambda conn, path: messages.append(path))  # RMI files never land here
            host = Store(exports)
            store = connection.rmi.get_global(IStore, server.rmi.save(host))
            store.rmi_timeout = 60
            for file in (source, small, empty):
                assert await store.checksum(file) == sha(file)
            assert [digest for _, _, digest in host.seen] == [sha(source), sha(small), sha(empty)]
            for copy, existed, _ in host.seen:
                assert existed and copy.parent == spill and copy != source  # the host's temporary copy...
                await wait_for(lambda copy=copy: not copy.exists(), 10)  # ...removed once the call completed
            # fire-and-forget with a file: the host still gets it whole
            store.rmi_async().checksum(source)
            await wait_for(lambda: len(host.seen) == 4, 30)
            assert host.seen[3][2] == sha(source)
            # a Path result (from a coroutine method): the caller's own copy, in its temporary directory
            exported = await store.export(3 * 1024 * 1024 + 1)
            assert isinstance(exported, Path) and exported.parent == spill
            assert sha(exported) == sha(exports / f"export-{3 * 1024 * 1024 + 1}.bin")
            assert await store.maybe(None) is None
            back = await store.maybe(small)  # an argument going straight back as the result
            assert back is not None and back.read_bytes() == b"one chunk" and back.parent == spill
            # failures: an awaited call raises, a fire-and-forget call reports to on_error
            with pytest.raises(InterfaceError, match=r"os\.PathLike"):
                await store.checksum(str(source))  # type: ignore[arg-type]
            with pytest.raises(StreamingError, match="cannot send file"):
                await store.checksum(tmp_path / "missing.bin")
            store.rmi_async().checksum(tmp_path / "missing.bin")
            await wait_for(lambda: any(isinstance(e, StreamingError) for e in errors), 10)
            assert await store.digest_of(b"still serving") == hashlib.sha256(b"still serving").hexdigest()
            assert messages == [] and len(errors) == 1, errors
            assert connection.transfers == {}
        assert exported.exists() and back.exists()  # the caller owns a result's copy, even after close
        exported.unlink()
        back.unlink()
        assert os.listdir(spill) == []  # nothing else left behind

    run(main(), 120)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_deleted_objects_and_objects_sent_as_messages(driver_dir: Path, transport: str) -> None:
    """``delete(id)`` on both sides (a call afterwards names the id); ``id=`` keywords; a proxy and an
    implementation sent with ``connection.send``; a fire-and-forget call that cannot be sent reports to
    ``on_error`` instead of raising."""

    async def main() -> None:
        async with connected(driver_dir, transport) as (server, client, connection):
            client_errors: list[BaseException] = []
            client.on_error(lambda conn, error: client_errors.append(error))
            await wait_for(lambda: server.connections)
            (server_side,) = server.connections
            # a global object deleted with server.rmi.delete(id)
            assert server.rmi.save(Calc(), id=77) == 77
            calc = connection.rmi.get_global(ICalc, id=77)
            assert await calc.add(1, 1) == 2
            assert server.rmi.delete(id=77) and not server.rmi.delete(77)
            with pytest.raises(RemoteObjectMissing, match=r"remote object 77 \(global\)") as missing:
                await calc.add(1, 1)
            assert missing.value.object_id == 77 and missing.value.is_global
            # connection-scoped objects deleted with connection.rmi.delete(id), on each side
            server_side.rmi.save(Counter(3), id=9)
            counter = connection.rmi.get(ICounter, id=9)
            assert await counter.value() == 3
            assert server_side.rmi.delete(id=9)
            with pytest.raises(RemoteObjectMissing, match=r"remote object 9 \(connection-scoped\)"):
                await counter.value()
            assert connection.rmi.save(Counter(5), 4) == 4
            assert await server_side.rmi.get(ICounter, 4).value() == 5
            assert connection.rmi.delete(4)
            with pytest.raises(RemoteObjectMissing, match="remote object 4 "):
                await server_side.rmi.get(ICounter, id=4).value()
            # objects as messages: an implementation arrives as a proxy, a proxy at home as the object
            got_proxy: asyncio.Queue[Any] = asyncio.Queue()
            got_home: asyncio.Queue[Any] = asyncio.Queue()
            server.on_message(Proxy)(lambda conn, value: got_proxy.put_nowait(value))
            server.on_message(Calc)(lambda conn, value: got_home.put_nowait(value))
            client.on_message(Counter)(lambda conn, value: got_home.put_nowait(value))
            mine = Counter(10)
            await connection.send(mine)
            proxy = await asyncio.wait_for(got_proxy.get(), 10)
            assert isinstance(proxy, Proxy) and await proxy.increment(1) == 11  # the server calls the client's
            assert mine.current == 11
            await server_side.send(proxy)  # the proxy goes home: the client gets its own object
            assert await asyncio.wait_for(got_home.get(), 10) is mine
            host_calc = Calc()
            remote_calc = connection.rmi.get_global(ICalc, server.rmi.save(host_calc))
            await connection.send(remote_calc)  # a proxy of a global object comes home as it
            assert await asyncio.wait_for(got_home.get(), 10) is host_calc
            # fire-and-forget calls that cannot be sent never raise: on_error hears of them
            oneway = remote_calc.rmi_async()
            oneway.add(1)  # one argument short
            oneway.add(1, object())  # not encodable
            assert await remote_calc.add(2, 2) == 4  # awaited calls still raise for the same mistakes
            with pytest.raises(InterfaceError):
                await remote_calc.add(1)
            await wait_for(lambda: len(client_errors) == 2)
            assert all(isinstance(e, InterfaceError) for e in client_errors), client_errors
            assert "add" in str(client_errors[0]) and "serialized" in str(client_errors[1])
            await connection.close()
            oneway.add(1, 2)  # closed: reported, not raised
            await wait_for(lambda: len(client_errors) == 3)
            assert isinstance(client_errors[2], RmiConnectionClosed)

    run(main(), 60)
