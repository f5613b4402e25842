"""Per-peer limits after authentication (issue 29, item 2), each at its exact boundary: at the limit accepted,
one over refused with the typed error, on both sides. The machines in memory first, then over real
connections on loopback (the hostile suite, ``test_hostile_limits.py``, attacks a server in another process)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest

from slipstream.network import Client, ConfigError, MaxMessageSizeExceeded, RmiRequestRefused, Server, ServerConfig
from slipstream.network.events import MessageReceived, RmiRequestReceived
from slipstream.network.frames import FrameKind
from slipstream.network.limits import SpillQuota, Workload
from slipstream.network.requests import stream_error
from slipstream.network.streaming import StreamCompleted, StreamFailed, StreamFailure, Streams
from tests.test_network_aio import client_config, free_ports, run, server_config, wait_for

CHUNK = 1400


class Pair:
    """A sender and a receiver stream machine; ``pump`` moves frames both ways until nothing moves."""

    def __init__(self, tmp: Path, **receiver: Any) -> None:
        self.sender = Streams(chunk_payload=CHUNK, temp_dir=str(tmp))
        self.receiver = Streams(chunk_payload=CHUNK, temp_dir=str(tmp), **receiver)
        self.sent: list[Any] = []
        self.received: list[Any] = []

    def pump(self) -> None:
        for _ in range(100_000):
            frames = self.sender.take_frames(256 * 1024)
            for kind, stream_id, payload in frames:
                self.receiver.receive(kind, stream_id, bytes(payload), 0)
            back = self.receiver.take_frames()
            for kind, stream_id, payload in back:
                self.sender.receive(kind, stream_id, bytes(payload), 0)
            self.sent += self.sender.take_events()
            self.received += self.receiver.take_events()
            if not frames and not back and not self.sender.sending:
                return
        raise AssertionError("the streams did not settle")

    def outcome(self) -> tuple[Any, Any]:
        """The receiver's and the sender's last word on the last stream (completed, sent, or failed)."""
        done = [e for e in self.received if isinstance(e, (StreamCompleted, StreamFailed))]
        failed = [e for e in self.sent if isinstance(e, StreamFailed)]
        return done[-1], (failed[-1] if failed else None)


# -- max_message_size -------------------------------------------------------------------------------------


def test_a_message_at_max_message_size_is_decoded_and_one_byte_more_is_refused_to_both_sides(tmp_path: Path) -> None:
    limit = 100_000
    pair = Pair(tmp_path, max_message_size=limit)
    pair.sender.send(FrameKind.MESSAGE, 0, bytes(limit))
    pair.pump()
    done, failed = pair.outcome()
    assert isinstance(done, StreamCompleted) and done.size == limit and failed is None
    pair.receiver.release(done.stream_id)

    pair.sender.send(FrameKind.MESSAGE, 0, bytes(limit + 1))
    pair.pump()
    refused, told = pair.outcome()
    assert isinstance(refused, StreamFailed) and refused.failure is StreamFailure.MESSAGE_TOO_LARGE
    assert f"max_message_size ({limit})" in refused.detail and refused.incoming
    assert told is not None and told.failure is StreamFailure.MESSAGE_TOO_LARGE and not told.incoming
    assert f"max_message_size ({limit})" in told.detail
    for event in (refused, told):  # what each side's on_error (or send_sync) hears
        error = stream_error(event.failure, event.detail)
        assert isinstance(error, MaxMessageSizeExceeded) and "max_message_size" in str(error)
    assert pair.receiver.in_memory_bytes == 0 and os.listdir(tmp_path) == []


def test_a_file_is_not_held_to_max_message_size(tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(300_000))
    spill = tmp_path / "spill"
    spill.mkdir()
    pair = Pair(spill, max_message_size=100_000)
    pair.sender.send_file(source)
    pair.pump()
    done, failed = pair.outcome()
    assert isinstance(done, StreamCompleted) and done.is_file and done.size == 300_000 and failed is None
    assert done.path is not None and Path(done.path).read_bytes() == source.read_bytes()
    pair.receiver.close()


def test_config_bounds_of_the_new_limits() -> None:
    ServerConfig(app_id="a", max_message_size=64 * 1024, max_pending_calls=1, spill_quota=0)
    with pytest.raises(ConfigError, match="max_message_size"):
        ServerConfig(app_id="a", max_message_size=64 * 1024 - 1)
    with pytest.raises(ConfigError, match="max_pending_calls"):
        ServerConfig(app_id="a", max_pending_calls=0)
    with pytest.raises(ConfigError, match="spill_quota"):
        ServerConfig(app_id="a", spill_quota=-1)
    defaults = ServerConfig(app_id="a")
    assert (defaults.max_message_size, defaults.max_pending_calls, defaults.spill_quota) == (16 << 20, 1024, 1 << 30)
    assert defaults.rmi_tracebacks is False


# -- spill_quota ------------------------------------------------------------------------------------------


def test_spill_quota_is_shared_held_at_its_boundary_and_given_back(tmp_path: Path) -> None:
    limit = 300_000
    quota = SpillQuota(limit)
    one = Pair(tmp_path, quota=quota, spill_threshold=0)  # everything goes to disk
    two = Pair(tmp_path, quota=quota, spill_threshold=0)  # another connection of the same server
    one.sender.send(FrameKind.MESSAGE, 0, bytes(limit))
    one.pump()
    done, failed = one.outcome()
    assert isinstance(done, StreamCompleted) and done.path is not None and failed is None
    assert quota.used == limit

    two.sender.send(FrameKind.MESSAGE, 0, bytes(1))  # one byte over, on the other connection
    two.pump()
    refused, told = two.outcome()
    assert isinstance(refused, StreamFailed) and refused.failure is StreamFailure.OVER_QUOTA
    assert told is not None and told.failure is StreamFailure.OVER_QUOTA and "spill_quota" in told.detail
    assert type(stream_error(told.failure, told.detail)).__name__ == "SpillQuotaExceeded"
    assert quota.used == limit and quota.refused == 1

    one.receiver.release(done.stream_id)  # handled: the file goes, its room comes back
    assert quota.used == 0
    two.sender.send(FrameKind.MESSAGE, 0, bytes(limit + 1))
    two.pump()
    assert two.outcome()[0].failure is StreamFailure.OVER_QUOTA and quota.used == 0
    two.sender.send(FrameKind.MESSAGE, 0, bytes(limit))
    two.pump()
    accepted, _ = two.outcome()
    assert isinstance(accepted, StreamCompleted) and quota.used == limit
    two.receiver.close()  # closing removes the file and gives the room back
    assert quota.used == 0 and os.listdir(tmp_path) == []


def test_a_failed_or_detached_spilled_stream_gives_its_quota_back(tmp_path: Path) -> None:
    quota = SpillQuota(1_000_000)
    pair = Pair(tmp_path, quota=quota, spill_threshold=0)
    pair.sender.send(FrameKind.MESSAGE, 0, bytes(500_000))
    for kind, stream_id, payload in pair.sender.take_frames(100_000):  # START and some chunks, then the peer goes
        pair.receiver.receive(kind, stream_id, bytes(payload), 0)
    assert quota.used == 500_000 and len(os.listdir(tmp_path)) == 1
    pair.receiver.connection_lost()
    assert os.listdir(tmp_path) == []
    assert quota.used == 0
    pair = Pair(tmp_path, quota=quota, spill_threshold=0)
    pair.sender.send(FrameKind.MESSAGE, 0, bytes(200_000))
    pair.pump()
    done, _ = pair.outcome()
    path = pair.receiver.detach(done.stream_id)
    assert path is not None and quota.used == 0  # the application owns it now
    os.unlink(path)


# -- max_pending_calls: the machine -------------------------------------------------------------------------


def test_workload_holds_messages_when_full_and_keeps_order() -> None:
    work = Workload(2)
    first, second, third = (MessageReceived(n, 0) for n in range(3))
    call = RmiRequestReceived(1, 1, "I.m")
    work.started()
    assert work.admit(first, False) and not work.full  # one task: room for one more
    work.started()
    assert work.full and not work.holding
    assert not work.admit(second, False) and work.holding  # at the limit: held, reading pauses
    assert not work.admit(call, True)  # a call admitted meanwhile waits behind the message
    assert work.admit(object(), False)  # anything unordered (stream progress, a close) goes on
    assert work.release() is None  # still full
    work.finished()
    assert work.release() is second and work.release() is call  # (the call was counted when it came)
    assert work.release() is None and not work.holding
    assert work.admit(third, False)
    work.pause()
    assert not work.admit(third, False) and work.release() is None
    work.resume()
    assert work.release() is third


# -- max_pending_calls over a real connection ------------------------------------------------------------


class Item(msgspec.Struct):
    n: int


class IGate(Protocol):
    async def wait(self) -> int: ...

    def ping(self) -> int: ...


class Gate:
    def __init__(self) -> None:
        self.open = asyncio.Event()

    async def wait(self) -> int:
        await self.open.wait()
        return 1

    def ping(self) -> int:
        return 2


async def gate_proxy(server: Server, client: Client, gate: Gate) -> tuple[Any, Any, Any]:
    """The client connected to ``server``, which hosts ``gate`` as global object 1: the client's
    connection, its proxy of the gate and the server side's workload."""
    server.rmi.save(gate, 1)
    await server.bind(free_ports(50))
    connection = await client.connect("127.0.0.1", server._links[0].port, timeout=20)
    await wait_for(lambda: len(server.connections) == 1)
    (served,) = server.connections
    return connection, connection.rmi.get_global(IGate, 1), served.rmi.work


def test_calls_beyond_max_pending_calls_are_refused_busy_and_messages_wait_unread(driver_dir: Path) -> None:
    limit = 4

    async def main() -> None:
        gate = Gate()
        handled: list[int] = []
        release = asyncio.Event()
        server = Server(server_config(
            driver_dir, messages=[Item], interfaces=[(IGate, Gate)], max_pending_calls=limit
        ))  # fmt: skip
        client = Client(client_config(driver_dir, messages=[Item], interfaces=[IGate]))

        @server.on_message(Item)
        async def slow(connection: Any, item: Item) -> None:
            await release.wait()
            handled.append(item.n)

        async with server, client:
            connection, proxy, work = await gate_proxy(server, client, gate)
            calls = [asyncio.ensure_future(proxy.wait()) for _ in range(limit)]
            await wait_for(lambda: work.tasks == limit)  # at the limit: every one runs
            with pytest.raises(RmiRequestRefused, match="max_pending_calls") as refused:
                await asyncio.wait_for(proxy.wait(), 10)  # one over
            assert refused.value.reason == "busy" and work.refused == 1
            with pytest.raises(RmiRequestRefused) as refused:  # while full, any call is refused unrun
                await asyncio.wait_for(proxy.ping(), 10)
            assert refused.value.reason == "busy" and work.refused == 2
            gate.open.set()
            assert await asyncio.wait_for(asyncio.gather(*calls), 10) == [1] * limit
            await wait_for(lambda: work.tasks == 0)
            assert await asyncio.wait_for(proxy.wait(), 10) == 1  # room again
            assert await asyncio.wait_for(proxy.ping(), 10) == 2

            for n in range(limit + 3):  # three more messages than listeners may run: they wait, unread
                await connection.send(Item(n))
            await wait_for(lambda: work.tasks == limit and work.holding)
            await asyncio.sleep(0.2)
            assert work.tasks == limit and handled == []
            release.set()
            await wait_for(lambda: len(handled) == limit + 3)
            assert sorted(handled) == list(range(limit + 3)) and not work.holding

    run(main(), 60)


def test_async_calls_arriving_together_run_exactly_max_pending_calls(driver_dir: Path) -> None:
    """Calls sent at once travel in one record, whose calls the machine takes in before the adapter runs
    any: each ``async def`` call is counted as it arrives, so exactly ``limit`` run and the rest are
    refused busy (before, every call of the record ran: 1,074 of 1,024 in the hostile burst)."""
    limit, extra = 4, 6

    async def main() -> None:
        gate = Gate()
        server = Server(server_config(driver_dir, messages=[Item], interfaces=[(IGate, Gate)], max_pending_calls=limit))
        client = Client(client_config(driver_dir, messages=[Item], interfaces=[IGate]))
        async with server, client:
            _, proxy, work = await gate_proxy(server, client, gate)
            calls = [asyncio.ensure_future(proxy.wait()) for _ in range(limit + extra)]  # one record
            await wait_for(lambda: work.refused == extra)
            assert work.tasks == limit
            gate.open.set()
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
            assert results.count(1) == limit, results
            refused = [r for r in results if isinstance(r, RmiRequestRefused)]
            assert len(refused) == extra and {r.reason for r in refused} == {"busy"}
            await wait_for(lambda: work.tasks == 0)

    run(main(), 60)


class Blob(msgspec.Struct):
    data: bytes


def test_a_message_over_max_message_size_fails_send_sync_typed_and_the_server_hears_it(driver_dir: Path) -> None:
    limit = 256 * 1024

    async def main() -> None:
        errors: list[BaseException] = []
        got: list[int] = []
        server = Server(server_config(driver_dir, messages=[Blob], max_message_size=limit))
        client = Client(client_config(driver_dir, messages=[Blob]))
        server.on_error(lambda connection, error: errors.append(error))
        server.on_message(Blob)(lambda connection, blob: got.append(len(blob.data)))
        async with server, client:
            await server.bind(free_ports(50))
            connection = await client.connect("127.0.0.1", server._links[0].port, timeout=20)
            await asyncio.wait_for(connection.send_sync(Blob(bytes(limit - 64))), 20)  # under: delivered
            with pytest.raises(MaxMessageSizeExceeded, match=f"max_message_size \\({limit}\\)"):
                await asyncio.wait_for(connection.send_sync(Blob(bytes(limit + 1))), 20)
            await wait_for(lambda: any(isinstance(e, MaxMessageSizeExceeded) for e in errors))
            assert got == [limit - 64]

    run(main(), 60)
