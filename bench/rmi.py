"""Remote objects and streaming: slipstream's RMI against Pyro5 and RPyC, and a 1 GiB file streamed.

    python -m bench.rmi [--quick] [--json PATH]

RMI: one client process calls ``add(i, 1)`` on an object a server process hosts, awaiting each
result (round trips per second); then ``concurrency`` callers at once, each awaiting its own calls one
by one (coroutines on one connection for slipstream, as asyncio does it; threads with a proxy or
connection each for the peers, as they do it); then sends fire-and-forget ``bump()`` calls and waits
until the host counted them all (calls per second). The blocking API (``slipstream.network.sync``, both
sides busy-polling) is measured beside the asyncio one: a blocking proxy's calls one at a time, the way
the peers are called. slipstream is encrypted (Noise + ChaCha20-Poly1305) over UDP loopback and over IPC;
Pyro5 (serpent over TCP) and RPyC (its classic brine protocol over TCP) run with their unencrypted
defaults. RPyC has no fire-and-forget: ``rpyc.async_`` still receives a reply, so its row counts calls
whose replies were not awaited one by one. Every ratio, printed and stored (the JSON's ``ratios``), is
> 1 where slipstream is better.

Streaming: a client sends a 1 GiB file (``connection.send(Path)``) to a server over IPC and over UDP
loopback; the time runs from the send to the server's listener holding the checked copy; each
process reports its peak resident memory (``ru_maxrss``).

Every peer runs in its own "spawn" process (``bench.Children``); every wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any, Protocol

from . import Children, corun, expect, report
from .network import blocking_api_missing
from .report import Comparison


class ICalc(Protocol):
    def add(self, a: int, b: int) -> int: ...

    def bump(self) -> None: ...

    def count(self) -> int: ...


class Calc:
    def __init__(self) -> None:
        self.bumps = 0

    def add(self, a: int, b: int) -> int:
        return a + b

    def bump(self) -> None:
        self.bumps += 1

    def count(self) -> int:
        return self.bumps


@dataclass(frozen=True, slots=True)
class Params:
    transport: str  # udp, ipc (slipstream); tcp (peers)
    port: int
    directory: str
    calls: int = 20_000
    concurrency: int = 16
    oneway: int = 100_000
    file_bytes: int = 1 << 30
    file: str = ""
    spill: str = ""


def _free_port() -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as second:
                second.bind(("127.0.0.1", port + 1))
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                tcp.bind(("127.0.0.1", port))
        except OSError:
            continue
        if port < 60000:
            return port
    raise RuntimeError("no free port")


def _dir() -> str:
    return str(Path("/dev/shm") / f"slipstream-bench-rmi-{uuid.uuid4().hex[:10]}")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _wait_stop(pipe: Pipe, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pipe.poll(0) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def _configs(p: Params, **extra: Any) -> tuple[Any, Any]:
    from slipstream.network import ClientConfig, ServerConfig

    common: dict[str, Any] = dict(
        app_id="bench", settings_store=":memory:", enable_ipv6=False, enable_ipc=p.transport == "ipc",
        term_length=4 << 20, ipc_term_length=8 << 20, **extra,
    )  # fmt: skip
    server = ServerConfig(
        interfaces=[(ICalc, Calc)], driver_directory=p.directory, driver="invoker", max_clients=8, **common
    )
    client = ClientConfig(
        interfaces=[ICalc],
        # over UDP each side has its own driver, as on two hosts; over IPC the client uses the server's
        driver_directory=p.directory + "-client" if p.transport == "udp" else p.directory,
        driver="invoker" if p.transport == "udp" else "external",
        **common,
    )
    return server, client


# -- slipstream RMI -------------------------------------------------------------------------------------


def slip_server(pipe: Pipe, p: Params) -> None:
    from slipstream.network import Server

    async def main() -> None:
        server_config, _ = _configs(p)
        async with Server(server_config) as server:
            object_id = server.rmi.save(Calc())
            await server.bind(p.port)
            pipe.send(("ready", object_id))
            await _wait_stop(pipe, 300)
            pipe.send(("memory", _peak_mib()))

    asyncio.run(main())


def slip_client(pipe: Pipe, p: Params) -> None:
    from slipstream.network import Client

    async def main() -> None:
        object_id = expect(pipe, "go", 60, "client")
        _, client_config = _configs(p)
        async with Client(client_config) as client:
            connection = await client.connect("127.0.0.1", p.port, timeout=30)
            calc = connection.rmi.get_global(ICalc, object_id)
            for i in range(500):  # warm-up
                await calc.add(i, 1)

            async def calls(count: int) -> None:
                for i in range(count):
                    assert await calc.add(i, 1) == i + 1

            start = time.perf_counter()
            await calls(p.calls)
            awaited = p.calls / (time.perf_counter() - start)
            each = p.calls // p.concurrency
            start = time.perf_counter()
            await asyncio.gather(*(calls(each) for _ in range(p.concurrency)))
            concurrent = each * p.concurrency / (time.perf_counter() - start)
            oneway = calc.rmi_async()
            start = time.perf_counter()
            for i in range(p.oneway):
                oneway.bump()
                if i % 2048 == 0:
                    await asyncio.sleep(0)
            deadline = time.monotonic() + 120
            while await calc.count() < p.oneway:
                if time.monotonic() > deadline:
                    raise TimeoutError("fire-and-forget calls did not all arrive")
                await asyncio.sleep(0.001)
            fire = p.oneway / (time.perf_counter() - start)
        pipe.send(("result", {"awaited_per_s": awaited, "concurrent_per_s": concurrent, "oneway_per_s": fire}))

    asyncio.run(main())


def slip_server_sync(pipe: Pipe, p: Params) -> None:
    """``slip_server`` through the blocking API: calls run on the server's busy-polling thread."""
    from slipstream.network.sync import Server

    server_config, _ = _configs(p)
    with Server(server_config, busy_poll=True) as server:
        object_id = server.rmi.save(Calc())
        server.bind(p.port)
        pipe.send(("ready", object_id))
        expect(pipe, "stop", 300, "blocking server")
        pipe.send(("memory", _peak_mib()))


def slip_client_sync(pipe: Pipe, p: Params) -> None:
    """A blocking proxy's calls one at a time, as a Pyro5 or RPyC user makes them."""
    from slipstream.network.sync import Client

    object_id = expect(pipe, "go", 60, "blocking client")
    _, client_config = _configs(p)
    with Client(client_config, busy_poll=True) as client:
        connection = client.connect("127.0.0.1", p.port, timeout=30)
        calc = connection.rmi.get_global(ICalc, object_id)
        result = {"awaited_per_s": _awaited_rate(calc.add, p)}
    pipe.send(("result", result))


# -- Pyro5 ----------------------------------------------------------------------------------------------


def pyro_server(pipe: Pipe, p: Params) -> None:
    import Pyro5.api

    @Pyro5.api.expose
    class PyroCalc:
        def __init__(self) -> None:
            self.bumps = 0

        def add(self, a: int, b: int) -> int:
            return a + b

        @Pyro5.api.oneway
        def bump(self) -> None:
            with lock:
                self.bumps += 1

        def count(self) -> int:
            return self.bumps

    lock = threading.Lock()
    daemon = Pyro5.api.Daemon(host="127.0.0.1", port=p.port)
    uri = daemon.register(PyroCalc(), "calc")
    thread = threading.Thread(target=daemon.requestLoop, daemon=True)
    thread.start()
    pipe.send(("ready", str(uri)))
    expect(pipe, "stop", 300, "pyro server")
    daemon.shutdown()


def pyro_client(pipe: Pipe, p: Params) -> None:
    import Pyro5.api

    uri = expect(pipe, "go", 60, "pyro client")
    with Pyro5.api.Proxy(uri) as calc:

        def oneway() -> None:
            for _ in range(p.oneway):
                calc.bump()

        result = _blocking_rates(calc.add, oneway, calc.count, p, "Pyro5 oneway calls")

    def caller() -> None:
        with Pyro5.api.Proxy(uri) as own:  # a Pyro5 proxy belongs to one thread
            _calls(own.add, p.calls // p.concurrency)

    result["concurrent_per_s"] = _threaded_rate(caller, p)
    pipe.send(("result", result))


def _calls(add: Callable[[int, int], int], count: int) -> None:
    for i in range(count):
        assert add(i, 1) == i + 1


def _threaded_rate(caller: Callable[[], None], p: Params) -> float:
    """Awaited calls per second of ``p.concurrency`` threads each running ``caller`` (its own proxy, its
    own ``p.calls // p.concurrency`` calls), from the first thread's start to the last one's end."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            caller()
        except BaseException as exc:  # reported below: a failed peer must not look fast
            errors.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(p.concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    elapsed = time.perf_counter() - start
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"concurrent callers failed: {errors[:1] or 'timed out'}")
    return p.calls // p.concurrency * p.concurrency / elapsed


def _blocking_rates(
    add: Callable[[int, int], int], oneway: Callable[[], None], count: Callable[[], int], p: Params, what: str
) -> dict[str, float]:
    """A blocking peer's awaited calls per second (``add`` one at a time) and fire-and-forget calls per
    second (``oneway`` sends ``p.oneway`` of them; done once the host's ``count`` has them all)."""
    awaited = _awaited_rate(add, p)
    start = time.perf_counter()
    oneway()
    deadline = time.monotonic() + 120
    while count() < p.oneway:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not all arrive")
        time.sleep(0.001)
    return {"awaited_per_s": awaited, "oneway_per_s": p.oneway / (time.perf_counter() - start)}


def _awaited_rate(add: Callable[[int, int], int], p: Params) -> float:
    """Blocking calls of ``add`` one at a time per second, after a warm-up."""
    for i in range(500):
        add(i, 1)
    start = time.perf_counter()
    _calls(add, p.calls)
    return p.calls / (time.perf_counter() - start)


# -- RPyC -----------------------------------------------------------------------------------------------


def rpyc_server(pipe: Pipe, p: Params) -> None:
    import rpyc
    from rpyc.utils.server import ThreadedServer

    class CalcService(rpyc.Service):  # type: ignore[misc]
        calc = Calc()

        def exposed_add(self, a: int, b: int) -> int:
            return a + b

        def exposed_bump(self) -> None:
            CalcService.calc.bumps += 1

        def exposed_count(self) -> int:
            return CalcService.calc.bumps

    server = ThreadedServer(CalcService, hostname="127.0.0.1", port=p.port)
    thread = threading.Thread(target=server.start, daemon=True)
    thread.start()
    pipe.send(("ready", None))
    expect(pipe, "stop", 300, "rpyc server")
    server.close()


def rpyc_client(pipe: Pipe, p: Params) -> None:
    import rpyc

    expect(pipe, "go", 60, "rpyc client")
    conn = rpyc.connect("127.0.0.1", p.port)
    try:
        root = conn.root
        bump = rpyc.async_(root.bump)

        def oneway() -> None:
            pending = [bump() for _ in range(p.oneway)]
            for result in pending:
                result.wait()

        result = _blocking_rates(root.add, oneway, root.count, p, "RPyC async calls")
    finally:
        conn.close()

    def caller() -> None:
        own = rpyc.connect("127.0.0.1", p.port)  # one connection per thread, RPyC's threaded-client way
        try:
            _calls(own.root.add, p.calls // p.concurrency)
        finally:
            own.close()

    result["concurrent_per_s"] = _threaded_rate(caller, p)
    pipe.send(("result", result))


# -- streaming ------------------------------------------------------------------------------------------


def stream_server(pipe: Pipe, p: Params) -> None:
    from slipstream.network import Connection, Server

    async def main() -> None:
        server_config, _ = _configs(p, temp_directory=p.spill)
        done = asyncio.Event()
        arrived: dict[str, Any] = {}
        async with Server(server_config) as server:

            @server.on_message(Path)
            def on_file(connection: Connection, path: Path) -> None:
                arrived.update(at=time.time(), size=path.stat().st_size)
                done.set()

            await server.bind(p.port)
            pipe.send(("ready", None))
            await asyncio.wait_for(done.wait(), 600)
            pipe.send(("arrived", {**arrived, "server_peak_mib": _peak_mib()}))
            await _wait_stop(pipe, 60)

    asyncio.run(main())


def stream_client(pipe: Pipe, p: Params) -> None:
    from slipstream.network import Client

    async def main() -> None:
        expect(pipe, "go", 60, "stream client")
        _, client_config = _configs(p)
        async with Client(client_config) as client:
            connection = await client.connect("127.0.0.1", p.port, timeout=30)
            started = time.time()
            await connection.send(Path(p.file))
            pipe.send(("sent", {"started": started}))
            while not pipe.poll(0):  # keep the connection (and an invoker driver) running until told
                await asyncio.sleep(0.01)
            pipe.send(("memory", _peak_mib()))

    asyncio.run(main())


# -- runs -----------------------------------------------------------------------------------------------


def _pair(name: str, server: Any, client: Any, p: Params) -> dict[str, Any]:
    with Children() as children:
        s = children.start(f"{name}-server", server, p)
        ready = s.expect("ready", 60)
        c = children.start(f"{name}-client", client, p)
        c.send("go", ready)
        result: dict[str, Any] = c.expect("result", 600)
        s.send("stop")
        if name.startswith("slipstream"):
            result["server_peak_mib"] = s.expect("memory", 30)
        return result


def run_rmi(p: Params) -> dict[str, Any]:
    results: dict[str, Any] = {}
    missing = blocking_api_missing()
    if missing is not None:
        results["slipstream-blocking"] = missing
        print(missing, flush=True)
    apis = {"slipstream": (slip_server, slip_client)}
    if missing is None:
        apis["slipstream-blocking"] = (slip_server_sync, slip_client_sync)
    for api, (server, client) in apis.items():
        for transport in ("ipc", "udp"):
            q = replace(p, transport=transport, port=_free_port(), directory=_dir())
            try:
                results[f"{api}-{transport}"] = _pair(f"{api}-{transport}", server, client, q)
            finally:
                for suffix in ("", "-client"):
                    shutil.rmtree(q.directory + suffix, ignore_errors=True)
            print(api, transport, json.dumps(results[f"{api}-{transport}"]), flush=True)
    results["pyro5"] = _pair("pyro5", pyro_server, pyro_client, replace(p, transport="tcp", port=_free_port()))
    print("pyro5", json.dumps(results["pyro5"]), flush=True)
    results["rpyc"] = _pair("rpyc", rpyc_server, rpyc_client, replace(p, transport="tcp", port=_free_port()))
    print("rpyc", json.dumps(results["rpyc"]), flush=True)
    return results


def run_streaming(p: Params) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="slipstream-bench-stream-") as scratch:
        source = Path(scratch) / "source.bin"
        block = os.urandom(1 << 20)
        with source.open("wb") as out:
            for _ in range(p.file_bytes // len(block)):
                out.write(block)
        spill = Path(scratch) / "spill"
        spill.mkdir()
        for transport in ("ipc", "udp"):
            q = replace(p, transport=transport, port=_free_port(), directory=_dir(), file=str(source), spill=str(spill))
            try:
                with Children() as children:
                    s = children.start(f"stream-{transport}-server", stream_server, q)
                    s.expect("ready", 60)
                    c = children.start(f"stream-{transport}-client", stream_client, q)
                    c.send("go")
                    started = c.expect("sent", 120)["started"]
                    arrived = s.expect("arrived", 600)
                    c.send("stop")
                    client_peak = c.expect("memory", 30)
                    s.send("stop")
                seconds = arrived["at"] - started
                results[f"slipstream-{transport}"] = {
                    "bytes": arrived["size"], "seconds": seconds, "mb_per_s": arrived["size"] / seconds / 1e6,
                    "server_peak_mib": arrived["server_peak_mib"], "client_peak_mib": client_peak,
                }  # fmt: skip
            finally:
                for suffix in ("", "-client"):
                    shutil.rmtree(q.directory + suffix, ignore_errors=True)
                for leftover in spill.iterdir():  # a received file's private directory, or a nameless file
                    shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
            print("stream", transport, json.dumps(results[f"slipstream-{transport}"]), flush=True)
    return results


PEERS = {"pyro5": "Pyro5", "rpyc": "RPyC"}


def comparisons(rmi: dict[str, Any], concurrency: int) -> list[Comparison]:
    """Every slipstream-against-peer rate of an RMI run (none if only streaming ran)."""
    measures = {
        "awaited_per_s": "awaited calls one at a time",
        "concurrent_per_s": f"awaited calls, {concurrency} callers at once",
        "oneway_per_s": "fire-and-forget calls",
    }
    rows = []
    for api, title in (("slipstream", "asyncio"), ("slipstream-blocking", "blocking")):
        for transport in ("ipc", "udp"):
            ours = rmi.get(f"{api}-{transport}")
            if not isinstance(ours, dict):  # not run (only streaming, or no blocking API)
                continue
            for key, what in measures.items():
                if key not in ours:  # the blocking rows are calls one at a time only
                    continue
                rows += [
                    Comparison(
                        f"{transport}.{title}.{key.removesuffix('_per_s')}_vs_{peer}",
                        f"{transport.upper()} {title}: {what}",
                        "throughput", "calls/s", ours[key], name, rmi[peer][key],
                    )
                    for peer, name in PEERS.items()
                ]  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks the suite works")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", choices=("rmi", "streaming"), help="run one half")
    args = parser.parse_args(argv)
    p = Params("udp", 0, "")
    if args.quick:
        p = replace(p, calls=300, oneway=2000, file_bytes=8 << 20)
    machine = corun.QUICK if args.quick else {}
    results: dict[str, Any] = {
        "machine": {"cpu_count": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
        "machine-before": corun.measure(**machine),
        "params": {"calls": p.calls, "oneway": p.oneway, "file_bytes": p.file_bytes},
    }
    print(corun.describe(results["machine-before"]), flush=True)
    results["rmi"] = run_rmi(p) if args.only != "streaming" else {}
    results["streaming"] = run_streaming(p) if args.only != "rmi" else {}
    results["machine-after"] = corun.measure(**machine)
    print(corun.describe(results["machine-after"]), flush=True)
    rows = comparisons(results["rmi"], p.concurrency)
    results["ratios"] = report.ratios(rows)
    results["comparisons"] = [asdict(row) for row in rows]
    text = json.dumps(results, indent=2)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    if rows:
        print()
        print(report.comparison_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
