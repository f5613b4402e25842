"""The target of the hostile-peer suite (issue 29): a real server in a process of its own, which the tests
attack from outside and measure from outside, and a legitimate client that must still get through.

    python tests/hostile_peer.py --dir D --port P --store S --spill T [--config JSON] [--driver MODE]

The server registers :class:`Chat` (echoed back), :class:`Numbers` (a message that is large when
decoded), :class:`Bounded` (listened for, but a negative ``n`` fails to decode), :class:`Unheard` (listened for
by nobody) and hosts :class:`ICalc`
as global object 1 (``add``, ``sleep``, ``fail``, ``upload``). ``--config`` adds ``ServerConfig``
fields (a JSON object), so a test can set the limit it attacks; ``--log-errors`` leaves out the
``on_error`` listener, so errors go to the log (stderr: the target's log file). stdout says ``ready``
once bound. Commands on stdin, a line each: ``measure`` prints ``measure <json>`` (see
:func:`measure`), ``close`` closes the server and prints ``closed``; end of input closes too.

:class:`HostileTarget` runs it from a test with every wait bounded; :meth:`HostileTarget.measure` reads
what the server costs (resident memory, the driver directory's shared memory, open files, the spill
directory's disk, asyncio tasks, the errors ``on_error`` heard) and :func:`legitimate_exchange` connects
a fresh, well-behaved client and exchanges a message, which every attack must leave possible.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Protocol

import msgspec

if __package__:
    from .fault_peer import LineProcess
else:  # run as a script: the tests' modules are not a package then
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fault_peer import LineProcess

TARGET = str(Path(__file__).resolve())
APP_ID = "hostile"
CALC_ID = 1
"""The global object id of the hosted :class:`Calc`."""


class Chat(msgspec.Struct):
    text: str


class Numbers(msgspec.Struct):
    """Small on the wire per element, large once decoded: the decode-explosion attack's message."""

    values: list[int]


class Bounded(msgspec.Struct):
    """Encodes whatever ``n`` is, decodes only ``n >= 0``: a message that fails to decode on arrival."""

    n: Annotated[int, msgspec.Meta(ge=0)]


class Unheard(msgspec.Struct):
    """Registered, and nobody listens for it: each one is an undispatched message."""

    n: int


class ICalc(Protocol):
    def add(self, a: int, b: int) -> int: ...

    async def sleep(self, seconds: float) -> None: ...

    def fail(self, text: str) -> None: ...

    def upload(self, data: Path) -> int: ...


class Calc:
    def add(self, a: int, b: int) -> int:
        return a + b

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(min(seconds, 30.0))

    def fail(self, text: str) -> None:
        raise ValueError(text)

    def upload(self, data: Path) -> int:
        return data.stat().st_size


def common(**extra: Any) -> dict[str, Any]:
    """What the target and a legitimate client agree on."""
    messages = [Chat, Numbers, Bounded, Unheard]
    return {"app_id": APP_ID, "messages": messages, "enable_ipc": False, "enable_ipv6": False, **extra}


# -- the target --------------------------------------------------------------------------------------------


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes allocated (not apparent) under ``path``: what tmpfs or a disk really gave its files."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


HANDSHAKE_COUNTS = ("hellos", "rate_limited", "evicted", "rejected", "accepted")
"""The handshake machines' counters :func:`measure` sums up (``ServerStats``)."""


def measure(driver_dir: str, spill_dir: str, errors: Counter[str], server: Any) -> dict[str, Any]:
    """What this process costs now: ``rss_bytes`` (resident), ``shm_bytes`` (allocated under the driver
    directory), ``fds`` (open files), ``spill_bytes`` (allocated under the spill directory), ``tasks``
    (asyncio tasks), ``errors`` (what ``on_error`` heard, by type), ``errors_met`` and ``errors_suppressed``
    (the server's own counts: every error, and those counted instead of told), ``handshakes`` (the
    handshake machines' counters, summed over the server's handshake channels)."""
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {
        "rss_bytes": rss,
        "shm_bytes": tree_bytes(driver_dir),
        "fds": len(os.listdir("/proc/self/fd")),
        "spill_bytes": tree_bytes(spill_dir),
        "tasks": len(asyncio.all_tasks()),
        "errors": dict(errors),
        "errors_met": server.errors,
        "errors_suppressed": server.errors_suppressed,
        "handshakes": {k: sum(getattr(s, k) for s in server.handshake_stats) for k in HANDSHAKE_COUNTS},
    }


async def serve(args: argparse.Namespace) -> None:
    from slipstream.network import Connection, Server, ServerConfig

    extra = json.loads(args.config)
    config = ServerConfig(
        **common(**extra), interfaces=[(ICalc, Calc)], settings_store=args.store, driver_directory=args.dir,
        driver=args.driver, temp_directory=args.spill,
    )  # fmt: skip
    errors: Counter[str] = Counter()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), lambda: lines.put_nowait(sys.stdin.readline() or None))
    async with Server(config) as server:
        if not args.log_errors:
            server.on_error(lambda connection, error: errors.update([type(error).__name__]))

        @server.on_message(Chat)
        async def echo(connection: Connection, message: Chat) -> None:
            await connection.send(Chat(f"echo {message.text}"))

        server.on_message(Numbers)(lambda connection, message: None)
        server.on_message(Bounded)(lambda connection, message: None)
        server.rmi.save(Calc(), CALC_ID)
        await server.bind(args.port)
        print("ready", flush=True)
        while (line := await lines.get()) is not None and line.strip() != "close":
            if line.strip() == "measure":
                print("measure", json.dumps(measure(args.dir, args.spill, errors, server)), flush=True)
        loop.remove_reader(sys.stdin.fileno())
    print("closed", flush=True)


def main() -> None:
    from slipstream.testing import run_async

    parser = argparse.ArgumentParser(description="the hostile-peer suite's target server (see the module)")
    parser.add_argument("--dir", required=True, help="driver directory")
    parser.add_argument("--driver", default="embedded", choices=("embedded", "external", "invoker", "auto"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", required=True, help="settings store (keeps the server's key)")
    parser.add_argument("--spill", required=True, help="temp_directory: where received streams spill")
    parser.add_argument("--config", default="{}", help="more ServerConfig fields, a JSON object")
    parser.add_argument("--log-errors", action="store_true", help="no on_error listener: errors are logged")
    parser.add_argument("--lifetime", type=float, default=600.0, help="seconds before it gives up")
    args = parser.parse_args()
    run_async(serve(args), args.lifetime)


# -- from a test ---------------------------------------------------------------------------------------------


class HostileTarget(LineProcess):
    """The target server in its own process, in ``workdir`` (its driver directory, store, spill directory
    and log live there); ``config``: more ``ServerConfig`` fields; ``flags`` (``"--log-errors"``) and
    ``options`` (``driver="invoker"``) go to its command line. A context manager: closed (or killed,
    if it does not close within its bound) on exit."""

    def __init__(
        self, workdir: Path, port: int, config: dict[str, Any] | None = None, *flags: str, **options: str
    ) -> None:
        self.port = port
        self.driver_dir = workdir / "driver"
        self.spill_dir = workdir / "spill"
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, TARGET, "--dir", str(self.driver_dir), "--port", str(port),
            "--store", str(workdir / "server.store"), "--spill", str(self.spill_dir),
            "--config", json.dumps(config or {}),
            *flags,
        ]  # fmt: skip
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", value]
        super().__init__("hostile-target", argv, workdir / "target.log")
        self.expect("ready", 60)

    def measure(self, timeout: float = 10.0) -> dict[str, Any]:
        """What the server costs now (see :func:`measure`)."""
        self.command("measure")
        result: dict[str, Any] = json.loads(self.expect("measure", timeout).split(" ", 1)[1])
        return result

    def close(self, timeout: float = 30.0) -> None:
        try:
            self.command("close")
            self.expect("closed", timeout)
            self.process.wait(10)
        except (OSError, AssertionError):
            self.kill()

    def __enter__(self) -> HostileTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.close()


async def legitimate_exchange(port: int, timeout: float = 20.0, **config: Any) -> float:
    """Seconds a fresh, well-behaved client takes to connect to the target on ``port`` and get one
    :class:`Chat` echoed; ``config``: more ``ClientConfig`` fields. Raises what went wrong."""
    from slipstream.network import Client, ClientConfig

    started = time.monotonic()
    replies: asyncio.Queue[Chat] = asyncio.Queue()
    with tempfile.TemporaryDirectory(prefix="slipstream-legit-") as scratch:
        client_config = ClientConfig(
            **common(**config), interfaces=[ICalc], settings_store=":memory:", driver_directory=scratch
        )
        async with Client(client_config) as client:
            client.on_message(Chat)(lambda connection, message: replies.put_nowait(message))
            connection = await client.connect("127.0.0.1", port, timeout=timeout)
            await connection.send(Chat("hello"))
            reply = await asyncio.wait_for(replies.get(), timeout)
            assert reply.text == "echo hello", reply
    return time.monotonic() - started


def growth(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """How much each measured size grew from ``before`` to ``after``."""
    return {key: after[key] - before[key] for key in ("rss_bytes", "shm_bytes", "fds", "spill_bytes", "tasks")}


def bounded_count(limit: int, seconds: float) -> Iterator[int]:
    """0, 1, ... until ``limit`` or until ``seconds`` have passed: every attack loop stops by itself."""
    deadline = time.monotonic() + seconds
    for n in range(limit):
        if time.monotonic() > deadline:
            return
        yield n


if __name__ == "__main__":
    main()
