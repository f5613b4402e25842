"""Network layer benchmarks: encrypted typed messages (a Struct of an int, a float and a short
string), one client to one server, throughput and round trip over UDP loopback and IPC, against
pyzmq with CURVE and msgspec over ``tcp://`` and ``ipc://``; handshakes per second; idle CPU; the
one-way latency of a message to a parked receiver (one every 30 ms, from ``send`` to the listener).
The same throughput and round trip through the blocking API (``slipstream.network.sync``, busy-polling
on both sides) beside the asyncio one; and, in the same run, the transport's own 32-byte round trip
(publications and subscriptions, no application layer, measured by ``bench.ipc.run_latency`` as
``python -m bench`` does), so the application layer's own cost is a printed figure.

    python -m bench.network [--quick] [--json PATH]

Every ratio, printed and stored (the JSON's ``ratios``), is > 1 where slipstream is better.
Every peer runs in its own "spawn" process (``bench.Children``); every wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from . import BenchError, Children, expect, ipc, report, scratch_dir, udp
from .report import Comparison

if TYPE_CHECKING:
    from slipstream.network import ClientConfig, ServerConfig


class Quote(msgspec.Struct):
    id: int
    price: float
    symbol: str


def _quote(i: int) -> Quote:
    return Quote(i, i * 0.25, "ACME")


@dataclass(frozen=True, slots=True)
class Params:
    transport: str  # "udp" or "ipc"
    port: int
    directory: str
    count: int = 200_000
    samples: int = 5_000
    idle_s: float = 3.0
    settle_s: float = 2.0
    """Idle CPU is measured from this long after the last message: a pair that just talked is still
    backing off (its poller's pauses and its streams' heartbeats lengthen over about 1.5 s)."""
    handshakes: int = 30
    parked: int = 150
    parked_gap_s: float = 0.03
    driver: str = "invoker"
    """Each process runs its embedded driver in its asyncio loop (no driver thread on the GIL)."""


PARKED_PROBE = -2
"""Quote id of the messages sent to a parked receiver (the server records their one-way latency)."""
WARMUP = 200
"""Round trips run before the kept samples, by every contender."""
TRANSPORT_SIZE = 32
"""Bytes of the transport's own round trip: the size ``python -m bench`` measures (an encrypted Quote
record is a few dozen bytes)."""
IPC_OVERHEAD_TARGET_US = 25.0
"""Issue 32: the application layer's own cost on an IPC round trip, p50, on the 2-core machine."""


def _dir() -> str:
    return str(Path("/dev/shm") / f"slipstream-bench-net-{uuid.uuid4().hex[:10]}")


async def readable(pipe: Pipe, timeout_s: float) -> None:
    """Wait until the parent wrote to ``pipe`` (or ``timeout_s`` passed) without blocking the event loop
    and without waking it in between: idle CPU is measured meanwhile, and a poll every 50 ms cost the
    measured process more than some of what it measures."""
    if pipe.poll(0):
        return
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(pipe.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready, timeout_s)
    finally:
        loop.remove_reader(pipe.fileno())


async def expect_async(pipe: Pipe, kind: str, timeout_s: float) -> Any:
    """``expect`` without blocking the event loop: the endpoints (and an invoker-mode driver) keep
    running while a worker waits for the parent."""
    await readable(pipe, timeout_s)
    return expect(pipe, kind, 0)


# -- slipstream ---------------------------------------------------------------------------------------


def _server_config(p: Params) -> ServerConfig:
    """The server's config, one for the asyncio and the blocking runs."""
    from slipstream.network import ServerConfig

    return ServerConfig(
        app_id="bench",
        messages=[Quote],
        settings_store=":memory:",
        driver_directory=p.directory,
        driver=p.driver,
        enable_ipc=p.transport == "ipc",
        enable_ipv6=False,
        term_length=4 << 20,
        ipc_term_length=8 << 20,
        max_clients=256,
    )


def _client_config(p: Params) -> ClientConfig:
    """The client's config, one for the asyncio and the blocking runs."""
    from slipstream.network import ClientConfig

    return ClientConfig(
        app_id="bench",
        messages=[Quote],
        settings_store=":memory:",
        # over UDP each side has its own driver, as on two hosts; over IPC the client uses the server's
        driver_directory=p.directory + "-client" if p.transport == "udp" else p.directory,
        driver=p.driver if p.transport == "udp" else "external",
        enable_ipc=p.transport == "ipc",
        enable_ipv6=False,
        term_length=4 << 20,
        ipc_term_length=8 << 20,
    )


def _rtt_figures(rtts: list[float]) -> dict[str, float]:
    """p50 and p99 (nearest rank) of round trips in seconds, in microseconds: every contender's summary."""
    rtts.sort()
    return {"rtt_p50_us": report.percentile(rtts, 50) * 1e6, "rtt_p99_us": report.percentile(rtts, 99) * 1e6}


def slip_server(pipe: Pipe, p: Params) -> None:
    from slipstream.network import Connection, Server

    async def main() -> None:
        async with Server(_server_config(p)) as server:
            received = 0
            parked: list[float] = []

            @server.on_message(Quote)
            def on_quote(connection: Connection, quote: Quote) -> None:
                nonlocal received
                received += 1
                if quote.id == PARKED_PROBE:  # sent to a parked receiver; price is its perf_counter time
                    parked.append(time.perf_counter() - quote.price)
                elif quote.id < 0:  # round-trip probe: echo it
                    connection.send_nowait(quote)

            if p.transport == "ipc":
                await server.bind_ipc()
            else:
                await server.bind(p.port)
            pipe.send(("ready", None))
            start_cpu = time.process_time()
            while not pipe.poll(0):
                await readable(pipe, 3600)
            kind, _ = pipe.recv()
            if kind == "cpu":
                start_cpu = time.process_time()
                pipe.send(("cpu-start", None))
                await expect_async(pipe, "cpu-stop", 60)
                pipe.send(("cpu", (time.process_time() - start_cpu, parked)))
                await expect_async(pipe, "stop", 60)

    asyncio.run(main())


def slip_client(pipe: Pipe, p: Params) -> None:
    from slipstream.network import Client

    async def main() -> None:
        config = _client_config(p)
        results: dict[str, Any] = {}
        # handshakes per second: sequential connect + close
        start = time.perf_counter()
        for _ in range(p.handshakes):
            async with Client(config) as client:
                if p.transport == "ipc":
                    await client.connect_ipc(timeout=20)
                else:
                    await client.connect("127.0.0.1", p.port, timeout=20)
        results["handshakes_per_s"] = p.handshakes / (time.perf_counter() - start)
        async with Client(config) as client:
            if p.transport == "ipc":
                connection = await client.connect_ipc(timeout=20)
            else:
                connection = await client.connect("127.0.0.1", p.port, timeout=20)
            echoes: asyncio.Queue[float] = asyncio.Queue()

            @client.on_message(Quote)
            def on_echo(conn: Any, quote: Quote) -> None:
                echoes.put_nowait(time.perf_counter())

            # throughput
            messages = [_quote(i) for i in range(1000)]
            await connection.send_sync(_quote(0), timeout=10)
            start = time.perf_counter()
            for i in range(p.count):
                message = messages[i % 1000]
                if not connection.send_nowait(message):
                    await connection.send(message)
            await connection.send_sync(_quote(0), timeout=60)
            elapsed = time.perf_counter() - start
            results["throughput_msgs_per_s"] = p.count / elapsed
            # round trip: send, the server's listener echoes, our listener sees it
            rtts = []
            probe = Quote(-1, 0.5, "ACME")
            for i in range(p.samples + WARMUP):
                sent = time.perf_counter()
                await connection.send(probe)
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the wait in a task of its
                # own, two more loop turns per round trip (about 50 us here), which the blocking pyzmq
                # client does not pay either.
                async with asyncio.timeout(5):
                    got = await echoes.get()
                if i >= WARMUP:
                    rtts.append(got - sent)
                if i % 50 == 0:
                    await asyncio.sleep(0.0005)  # a few round trips land on a parked receiver
            results.update(_rtt_figures(rtts))
            # one way to a parked receiver: a message every 30 ms, so both sides are deep in their idle
            # pauses when it is sent (perf_counter is one clock for every process of the host)
            for _ in range(p.parked):
                await asyncio.sleep(p.parked_gap_s)
                await connection.send(Quote(PARKED_PROBE, time.perf_counter(), "PARK"))
            await connection.send_sync(_quote(0), timeout=10)
            # idle CPU of the connected pair, once settled
            await asyncio.sleep(p.settle_s)
            pipe.send(("idle", None))
            await expect_async(pipe, "cpu-go", 30)
            start_cpu = time.process_time()
            await asyncio.sleep(p.idle_s)
            results["client_idle_cpu_s"] = time.process_time() - start_cpu
            pipe.send(("result", results))
            await expect_async(pipe, "close", 30)

    asyncio.run(main())


def _params(transport: str, quick: bool) -> Params:
    return Params(
        transport,
        47000 + os.getpid() % 1000,
        _dir(),
        count=50_000 if quick else 200_000,
        samples=1000 if quick else 5000,
        handshakes=10 if quick else 30,
        parked=50 if quick else 150,
    )


def run_slipstream(transport: str, quick: bool) -> dict[str, Any]:
    params = _params(transport, quick)
    directory = params.directory
    try:
        with Children() as children:
            server = children.start("net-server", slip_server, params)
            server.expect("ready", 30)
            client = children.start("net-client", slip_client, params)
            client.expect("idle", 300)
            server.send("cpu")
            server.expect("cpu-start", 10)
            client.send("cpu-go")
            result = client.expect("result", 60)
            server.send("cpu-stop")
            server_cpu, parked = server.expect("cpu", 10)
            client.send("close")  # the client first: over IPC it uses the server's driver
            client.finish()
            server.send("stop")
            server.finish()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(directory + "-client", ignore_errors=True)
    idle_s = params.idle_s
    result["idle_cpu_percent_of_core"] = 100 * (result.pop("client_idle_cpu_s") + server_cpu) / idle_s
    parked.sort()
    result["parked_samples"] = len(parked)
    result["parked_one_way_p50_us"] = parked[len(parked) // 2] * 1e6
    result["parked_one_way_p99_us"] = parked[min(len(parked) - 1, int(len(parked) * 0.99))] * 1e6
    return result


# -- slipstream, blocking API -----------------------------------------------------------------------


def blocking_api_missing() -> str | None:
    """Why the blocking API cannot be measured here (``slipstream.network.sync`` does not import), or None."""
    try:
        import slipstream.network.sync  # noqa: F401
    except ImportError as exc:
        return f"blocking API not available ({exc})"
    return None


def slip_server_sync(pipe: Pipe, p: Params) -> None:
    """``slip_server`` through the blocking API: the listener echoes on the server's busy-polling thread."""
    from slipstream.network.sync import Connection, Server

    with Server(_server_config(p), busy_poll=True) as server:

        @server.on_message(Quote)
        def on_quote(connection: Connection, quote: Quote) -> None:
            if quote.id < 0:  # round-trip probe: echo it
                connection.send_nowait(quote)

        if p.transport == "ipc":
            server.bind_ipc()
        else:
            server.bind(p.port)
        pipe.send(("ready", None))
        expect(pipe, "stop", 600, "blocking server")


def slip_client_sync(pipe: Pipe, p: Params) -> None:
    """``slip_client``'s throughput and round trip through the blocking API (no listener: the echo is
    taken with ``receive``); busy-polling, so no idle CPU or parked figures."""
    from slipstream.network.sync import Client

    with Client(_client_config(p), busy_poll=True) as client:
        if p.transport == "ipc":
            connection = client.connect_ipc(timeout=20)
        else:
            connection = client.connect("127.0.0.1", p.port, timeout=20)
        results: dict[str, Any] = {}
        messages = [_quote(i) for i in range(1000)]
        connection.send_sync(_quote(0), timeout=10)
        start = time.perf_counter()
        for i in range(p.count):
            message = messages[i % 1000]
            if not connection.send_nowait(message):
                connection.send(message)
        connection.send_sync(_quote(0), timeout=60)
        results["throughput_msgs_per_s"] = p.count / (time.perf_counter() - start)
        rtts = []
        probe = Quote(-1, 0.5, "ACME")
        for i in range(p.samples + WARMUP):
            sent = time.perf_counter()
            connection.send(probe)
            echo = connection.receive(timeout=5)
            got = time.perf_counter()
            if not isinstance(echo, Quote) or echo.id != probe.id:
                raise BenchError(f"blocking round trip: expected the probe back, got {echo!r}")
            if i >= WARMUP:
                rtts.append(got - sent)
            if i % 50 == 0:
                time.sleep(0.0005)  # as the asyncio client does
        results.update(_rtt_figures(rtts))
        pipe.send(("result", results))
        expect(pipe, "close", 30, "blocking client")


def run_slipstream_sync(transport: str, quick: bool) -> dict[str, Any]:
    params = _params(transport, quick)
    try:
        with Children() as children:
            server = children.start("net-server-sync", slip_server_sync, params)
            server.expect("ready", 30)
            client = children.start("net-client-sync", slip_client_sync, params)
            result: dict[str, Any] = client.expect("result", 300)
            client.send("close")  # the client first: over IPC it uses the server's driver
            client.finish()
            server.send("stop")
            server.finish()
    finally:
        shutil.rmtree(params.directory, ignore_errors=True)
        shutil.rmtree(params.directory + "-client", ignore_errors=True)
    return result


# -- the transport alone ------------------------------------------------------------------------------


TRANSPORT_WAITS = ("spin", "yield")
"""How the transport's ping and pong wait (``bench.ipc``'s modes): busy spin is its best on an idle machine, but
two spinning processes starved onto one core of a loaded 2-core machine take milliseconds a round trip; yielding
ones give way to each other. Both are measured and the faster p50 is the transport's round trip."""


def run_transport(transport: str, quick: bool) -> dict[str, Any]:
    """The transport's own round trip (publication, subscription, no application layer), as ``python -m
    bench`` measures it, in each of ``TRANSPORT_WAITS``: over IPC through a standalone driver (the data
    path does not touch it), over UDP with an invoker-mode driver in each process, as the network
    benchmarks' processes run theirs."""
    samples = 1000 if quick else 5000
    time_limit_s = 60.0
    modes: dict[str, dict[str, Any]] = {}
    for wait in TRANSPORT_WAITS:
        with scratch_dir("slipstream-bench-net-transport-", "/dev/shm") as shm:
            if transport == "ipc":
                with ipc.standalone_driver(shm / "driver") as driver_pid:
                    run = ipc.run_latency(
                        shm / "driver", 1000, TRANSPORT_SIZE, WARMUP, samples, time_limit_s, driver_pid=driver_pid,
                        ping_wait=wait, pong_wait=wait,
                    )  # fmt: skip
            else:
                run = ipc.run_latency(
                    shm / "udp", 2000, TRANSPORT_SIZE, WARMUP, samples, time_limit_s, invoker=True,
                    ping_channel=udp.udp_channel(), pong_channel=udp.udp_channel(),
                    ping_wait=wait, pong_wait=wait,
                )  # fmt: skip
        summary = report.latency_summary(run["rtt_ns"])
        modes[wait] = {
            "samples": summary["count"], "timed_out": run["timed_out"],
            "rtt_p50_us": summary["p50_us"], "rtt_p99_us": summary["p99_us"],
        }  # fmt: skip
    best = min(modes, key=lambda wait: modes[wait]["rtt_p50_us"])
    where = "aeron:ipc, standalone driver" if transport == "ipc" else "aeron:udp 127.0.0.1, invoker-mode drivers"
    return {
        "mode": f"{where}, ping and pong {best} (the faster p50 of {', '.join(TRANSPORT_WAITS)})",
        "size_bytes": TRANSPORT_SIZE, "rtt_p50_us": modes[best]["rtt_p50_us"],
        "rtt_p99_us": modes[best]["rtt_p99_us"], "modes": modes,
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class ManyParams:
    port: int
    directory: str
    clients: int
    term_length: int = 65536


def many_clients(pipe: Pipe, p: ManyParams) -> None:
    """``clients`` clients of one process connecting at once; reports when all are connected."""
    from slipstream.network import Client, ClientConfig

    async def main() -> None:
        config = ClientConfig(
            app_id="bench",
            messages=[Quote],
            settings_store=":memory:",
            driver_directory=p.directory,
            driver="invoker",
            enable_ipc=False,
            enable_ipv6=False,
            term_length=p.term_length,
        )
        clients = [Client(config) for _ in range(p.clients)]
        pipe.send(("ready", None))
        await expect_async(pipe, "go", 60)
        start = time.perf_counter()
        results = await asyncio.gather(
            *(c.connect("127.0.0.1", p.port, timeout=60) for c in clients), return_exceptions=True
        )
        failures = [repr(r) for r in results if isinstance(r, BaseException)]
        pipe.send(("connected", (time.perf_counter() - start, len(failures), failures[:3])))
        await expect_async(pipe, "close", 120)
        for client in clients:
            await client.close()

    asyncio.run(main())


def idle_server(pipe: Pipe, p: Params) -> None:
    """A server on the default config that says what it costs (``memory``) until ``stop``."""
    from slipstream.network import Server, ServerConfig
    from tests.hostile_peer import tree_bytes

    async def main() -> None:
        config = ServerConfig(
            app_id="bench", messages=[Quote], settings_store=":memory:", driver_directory=p.directory,
            driver=p.driver, enable_ipc=False, enable_ipv6=False, max_clients=256,
        )  # fmt: skip
        async with Server(config) as server:
            await server.bind(p.port)
            pipe.send(("ready", None))
            while (kind := (await expect_any(pipe, 600))[0]) != "stop":
                assert kind == "memory", kind
                gc.collect()
                with open("/proc/self/statm") as statm:
                    rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                pipe.send(
                    ("memory", {"rss": rss, "shm": tree_bytes(p.directory), "connections": len(server.connections)})
                )

    asyncio.run(main())


async def expect_any(pipe: Pipe, timeout_s: float) -> tuple[str, Any]:
    """The next message from the parent, whatever it is, without blocking the event loop."""
    await readable(pipe, timeout_s)
    message: tuple[str, Any] = pipe.recv()
    return message


def run_idle_memory(clients: int = 64, settle_s: float = 2.0) -> dict[str, Any]:
    """What an idle, authenticated UDP connection costs its server, both sides on the default config:
    the server process's RSS and its driver directory's allocated bytes, before and after ``clients``
    clients (one process) connected and went idle, per connection."""
    directory = _dir()
    port = 47000 + os.getpid() % 1000
    try:
        with Children() as children:
            server = children.start("net-server", idle_server, Params("udp", port, directory))
            server.expect("ready", 30)
            worker = children.start(
                "clients", many_clients, ManyParams(port, f"{directory}-c", clients, term_length=256 * 1024)
            )
            worker.expect("ready", 60)
            time.sleep(settle_s)
            server.send("memory")
            before = server.expect("memory", 30)
            worker.send("go")
            _, failed, errors = worker.expect("connected", 120)
            time.sleep(settle_s)  # handshakes' images reclaimed, the connections idle
            server.send("memory")
            after = server.expect("memory", 30)
            worker.send("close")
            server.send("stop")
    finally:
        for path in Path("/dev/shm").glob(Path(directory).name + "*"):
            shutil.rmtree(path, ignore_errors=True)
    connected = after["connections"] - before["connections"]
    return {
        "clients": clients, "connected": connected, "failed": failed, "errors": errors,
        "server_rss_per_connection_bytes": (after["rss"] - before["rss"]) // max(1, connected),
        "server_shm_per_connection_bytes": (after["shm"] - before["shm"]) // max(1, connected),
        "before": before, "after": after,
    }  # fmt: skip


def run_many(total: int, processes: int) -> dict[str, Any]:
    """``total`` clients in ``processes`` processes connect to one server at once."""
    directory = _dir()
    port = 46000 + os.getpid() % 1000
    server_params = Params("udp", port, directory)
    try:
        with Children() as children:
            server = children.start("net-server", slip_server, server_params)
            server.expect("ready", 30)
            workers = [
                children.start(f"clients-{i}", many_clients, ManyParams(port, f"{directory}-c{i}", total // processes))
                for i in range(processes)
            ]
            for worker in workers:
                worker.expect("ready", 60)
            start = time.perf_counter()
            for worker in workers:
                worker.send("go")
            outcomes = [worker.expect("connected", 120) for worker in workers]
            elapsed = time.perf_counter() - start
            failed = sum(outcome[1] for outcome in outcomes)
            errors = [error for outcome in outcomes for error in outcome[2]][:3]
            for worker in workers:
                worker.send("close")
            server.send("stop")
    finally:
        for path in Path("/dev/shm").glob(Path(directory).name + "*"):
            shutil.rmtree(path, ignore_errors=True)
    return {"clients": total, "processes": processes, "all_connected_s": elapsed, "failed": failed, "errors": errors}


# -- pyzmq + CURVE + msgspec --------------------------------------------------------------------------


def zmq_server(pipe: Pipe, args: tuple[str, bytes, bytes]) -> None:
    import zmq

    endpoint, public, secret = args
    ctx = zmq.Context()
    pull = ctx.socket(zmq.ROUTER)
    pull.curve_server = True
    pull.curve_publickey = public
    pull.curve_secretkey = secret
    pull.setsockopt(zmq.RCVTIMEO, 200)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(endpoint)
    decoder = msgspec.msgpack.Decoder(Quote)
    encoder = msgspec.msgpack.Encoder()
    pipe.send(("ready", None))
    while not pipe.poll(0):
        try:
            identity, data = pull.recv_multipart()
        except zmq.Again:
            continue
        quote = decoder.decode(data)
        if quote.id < 0 or quote.id == 999_999_999:
            pull.send_multipart([identity, encoder.encode(quote)])
    pull.close()
    ctx.term()


def zmq_client(pipe: Pipe, args: tuple[str, bytes, int, int]) -> None:
    import zmq

    endpoint, server_public, count, samples = args
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(Quote)
    sock.send(encoder.encode(Quote(999_999_999, 0, "x")))
    decoder.decode(sock.recv())
    messages = [_quote(i) for i in range(1000)]
    start = time.perf_counter()
    for i in range(count):
        sock.send(encoder.encode(messages[i % 1000]))
    sock.send(encoder.encode(Quote(999_999_999, 0, "x")))
    decoder.decode(sock.recv())
    elapsed = time.perf_counter() - start
    rtts = []
    probe = Quote(-1, 0.5, "ACME")
    for i in range(samples + WARMUP):
        sent = time.perf_counter()
        sock.send(encoder.encode(probe))
        decoder.decode(sock.recv())
        if i >= WARMUP:
            rtts.append(time.perf_counter() - sent)
    pipe.send(("result", {"throughput_msgs_per_s": count / elapsed, **_rtt_figures(rtts)}))
    sock.close()
    ctx.term()


def run_zmq(kind: str, quick: bool) -> dict[str, Any]:
    import zmq

    scratch = tempfile.mkdtemp(prefix="bench-zmq-")
    endpoint = f"ipc://{scratch}/sock" if kind == "ipc" else f"tcp://127.0.0.1:{48000 + os.getpid() % 1000}"
    public, secret = zmq.curve_keypair()
    try:
        with Children() as children:
            server = children.start("zmq-server", zmq_server, (endpoint, public, secret))
            server.expect("ready", 30)
            client = children.start(
                "zmq-client", zmq_client, (endpoint, public, 50_000 if quick else 200_000, 1000 if quick else 5000)
            )
            result = client.expect("result", 120)
            server.send("stop")
            client.finish()
            server.finish()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dict(result)


PEERS = {"udp": ("tcp", "pyzmq CURVE tcp"), "ipc": ("ipc", "pyzmq CURVE ipc")}
"""The pyzmq CURVE run each slipstream transport is held against: its results key and its name."""
APIS = {"asyncio": "slipstream-{}", "blocking": "slipstream-blocking-{}"}
"""The results key of each API's run, by transport."""


def comparisons(results: dict[str, Any]) -> list[Comparison]:
    """Every slipstream-against-pyzmq figure of the run, asyncio and (if measured) blocking."""
    rows = []
    for api, key in APIS.items():
        for transport, (kind, peer) in PEERS.items():
            ours, theirs = results.get(key.format(transport)), results[f"zmq-curve-{kind}"]
            if ours is None:
                continue
            where, versus = f"{transport.upper()} {api}", f"vs_pyzmq_curve_{kind}"
            rows += [
                Comparison(
                    f"{transport}.{api}.throughput_{versus}", f"{where}: encrypted typed throughput", "throughput",
                    "msg/s", ours["throughput_msgs_per_s"], peer, theirs["throughput_msgs_per_s"],
                ),
                *(
                    Comparison(
                        f"{transport}.{api}.rtt_{pct}_{versus}", f"{where}: encrypted typed round trip {pct}",
                        "latency", "us", ours[f"rtt_{pct}_us"], peer, theirs[f"rtt_{pct}_us"],
                    )
                    for pct in ("p50", "p99")
                ),
            ]  # fmt: skip
    return rows


def app_overhead(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What the application layer adds to the transport's own round trip (p50, same run), per transport
    and API: the difference in microseconds and the ratio of the two round trips. A transport slower than
    the application over it says the run was disturbed (a starved process), not that the layer costs
    nothing: ``disturbed``, and no target is met then."""
    overhead = {}
    for api, key in APIS.items():
        for transport in PEERS:
            ours = results.get(key.format(transport))
            if ours is None:
                continue
            app, alone = ours["rtt_p50_us"], results[f"transport-{transport}"]["rtt_p50_us"]
            disturbed = app < alone
            overhead[f"{transport}.{api}"] = {
                "app_rtt_p50_us": app, "transport_rtt_p50_us": alone, "overhead_us": app - alone,
                "app_over_transport": app / alone if alone > 0 else float("nan"), "disturbed": disturbed,
                **({"target_us": IPC_OVERHEAD_TARGET_US, "met": not disturbed and app - alone <= IPC_OVERHEAD_TARGET_US}
                   if transport == "ipc" else {}),
            }  # fmt: skip
    return overhead


def overhead_table(overhead: dict[str, dict[str, Any]]) -> str:
    lines = [
        "application layer's own round-trip cost (encrypted typed round trip p50 minus the transport's, same run):"
    ]
    for name, o in overhead.items():
        target = f"  target <= {o['target_us']:g} us: {'met' if o['met'] else 'not met'}" if "target_us" in o else ""
        if o["disturbed"]:
            target = "  DISTURBED: the transport alone was slower than the application over it"
        lines.append(
            f"  {name:14s} {o['app_rtt_p50_us']:8.1f} us - transport {o['transport_rtt_p50_us']:6.2f} us"
            f" = {o['overhead_us']:8.1f} us ({o['app_over_transport']:.1f}x the transport's round trip){target}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts: checks the suite works")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from . import corun  # (here: it imports bench.instructions, which imports this module)

    results: dict[str, Any] = {"machine-before": corun.measure(**corun.QUICK if args.quick else {})}
    print(corun.describe(results["machine-before"]), flush=True)
    for transport in ("udp", "ipc"):
        results[f"slipstream-{transport}"] = run_slipstream(transport, args.quick)
        print(transport, json.dumps(results[f"slipstream-{transport}"], indent=None), flush=True)
    missing = blocking_api_missing()
    if missing is not None:
        results["slipstream-blocking"] = missing
        print(missing, flush=True)
    for transport in ("udp", "ipc") if missing is None else ():
        results[f"slipstream-blocking-{transport}"] = run_slipstream_sync(transport, args.quick)
        print("blocking", transport, json.dumps(results[f"slipstream-blocking-{transport}"]), flush=True)
    for transport in ("udp", "ipc"):
        results[f"transport-{transport}"] = run_transport(transport, args.quick)
        print("transport", transport, json.dumps(results[f"transport-{transport}"]), flush=True)
    results["connect-200"] = run_many(200 if not args.quick else 100, 4)
    print("many", json.dumps(results["connect-200"]), flush=True)
    results["idle-connection-memory"] = run_idle_memory(64 if not args.quick else 8)
    print("idle memory", json.dumps(results["idle-connection-memory"]), flush=True)
    for kind in ("tcp", "ipc"):
        results[f"zmq-curve-{kind}"] = run_zmq(kind, args.quick)
        print("zmq", kind, json.dumps(results[f"zmq-curve-{kind}"]), flush=True)
    results["machine-after"] = corun.measure(**corun.QUICK if args.quick else {})
    print(corun.describe(results["machine-after"]), flush=True)
    rows = comparisons(results)
    results["ratios"] = report.ratios(rows)
    results["comparisons"] = [asdict(row) for row in rows]
    results["app_overhead"] = app_overhead(results)
    text = json.dumps(results, indent=2)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    else:
        print(text)
    print()
    print(report.comparison_table(rows))
    print()
    print(overhead_table(results["app_overhead"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
