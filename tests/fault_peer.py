"""Peers for the fault suite and benchmark (issue 28): a server or a client in a process of its own that
sends numbered notes at a steady rate and keeps an exact account, in a journal that survives SIGKILL,
of what it sent, what it received, what ``send`` refused and what ``on_error`` said was not delivered.

    python tests/fault_peer.py server --dir D --port P --journal J [--driver MODE] [--listen ADDR] ...
    python tests/fault_peer.py client --dir D --host H --port P --name NAME --store S --journal J ...

Each direction is a stream of ``Note(stream, n, t)``: ``n`` counts from 1 without gaps on its sender's
side (a refused send keeps its number), ``t`` is when the note was made (``time.monotonic``, one clock
for every process of the host, namespaces included). A client's stream is ``NAME:PID`` (a new process
numbers afresh); the server sends one stream per client, ``server>NAME`` (NAME: the client's tag),
always through the ``Connection`` it got first for that name: a connection that took over its session
(the client came back) is reached through it.

Commands on stdin, a line each: ``report`` (prints ``report <json>``), ``quiet`` (stops sending, then
prints ``quiet``), ``close`` (quiet, close the endpoint, print the last report and ``closed``, exit 0).
End of input and SIGTERM close too. stdout says ``ready`` once bound or connected. The journal (JSON
lines, each written at once) is the account: :class:`Ledger` reads it. :class:`PeerProcess` runs a peer
(in a network namespace if asked) with every wait bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

PEER = str(Path(__file__).resolve())
APP_ID = "faults"


class Note(msgspec.Struct):
    """The ``n``-th note of ``stream``, made at ``t`` (``time.monotonic``)."""

    stream: str
    n: int
    t: float


# -- the peer ----------------------------------------------------------------------------------------------


class Journal:
    """What happened, a JSON line each, written with one ``write`` to an O_APPEND file: what a SIGKILL
    interrupts is at most the line being made."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, **fields: Any) -> None:
        os.write(self._fd, json.dumps({"k": kind, **fields}, separators=(",", ":")).encode() + b"\n")

    def close(self) -> None:
        os.close(self._fd)


class Account:
    """The peer's account: the journal, and the counts ``report`` prints."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)
        self.errors: list[str] = []

    def sent(self, note: Note) -> None:
        self.counts[note.stream]["sent"] += 1
        self.journal.write("S", s=note.stream, n=note.n, t=note.t, r=time.monotonic())

    def refused(self, note: Note, error: BaseException) -> None:
        self.counts[note.stream]["refused"] += 1
        self.journal.write("X", s=note.stream, n=note.n, t=note.t, r=time.monotonic(), e=_describe(error))

    def received(self, note: Note) -> None:
        self.counts[note.stream]["received"] += 1
        self.journal.write("R", s=note.stream, n=note.n, t=note.t, r=time.monotonic())

    def error(self, error: BaseException) -> None:
        from slipstream.network import UndeliveredError

        now = time.monotonic()
        self.errors.append(_describe(error))
        self.journal.write("E", e=type(error).__name__, m=str(error)[:300], r=now)
        if isinstance(error, UndeliveredError):
            for message in error.messages:
                if isinstance(message, Note):
                    self.counts[message.stream]["undelivered"] += 1
                    self.journal.write("U", s=message.stream, n=message.n, t=message.t, r=now)
                else:
                    self.journal.write("U?", m=repr(message)[:200], r=now)

    def report(self) -> dict[str, Any]:
        return {"streams": {s: dict(c) for s, c in self.counts.items()}, "errors": list(self.errors)}


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:200]}"


class Sender:
    """Notes of one stream at ``rate`` per second through one connection, each awaited (``send``); behind
    schedule (a send waited), it goes on from now rather than catching up in a burst."""

    def __init__(self, account: Account, stream: str, connection: Any, rate: float) -> None:
        self.account = account
        self.stream = stream
        self.connection = connection
        self.period = 1.0 / rate
        self.n = 0
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        from slipstream.network import NetworkError

        due = time.monotonic()
        while True:
            due += self.period
            now = time.monotonic()
            if due < now - self.period:
                due = now
            await asyncio.sleep(max(0.0, due - now))
            self.n += 1
            note = Note(self.stream, self.n, time.monotonic())
            try:
                await self.connection.send(note)
            except (NetworkError, TimeoutError) as exc:
                self.account.refused(note, exc)
            else:
                self.account.sent(note)

    async def stop(self) -> None:
        """Stop after the send under way (it may wait up to the send timeout)."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _commands() -> asyncio.Queue[str]:
    """stdin lines, read on a thread; end of input and SIGTERM become ``close``."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.strip())
        loop.call_soon_threadsafe(lines.put_nowait, "close")

    threading.Thread(target=read, daemon=True).start()
    loop.add_signal_handler(signal.SIGTERM, lambda: lines.put_nowait("close"))
    return lines


async def _serve(account: Account, senders: list[Sender]) -> None:
    """Answer the test's commands until ``close``."""
    lines = await _commands()
    quiet = False
    while True:
        command = await lines.get()
        if command == "report":
            print("report", json.dumps(account.report()), flush=True)
        elif command in ("quiet", "close"):
            if not quiet:
                quiet = True
                await asyncio.gather(*(sender.stop() for sender in senders))
            if command == "close":
                return
            print("quiet", flush=True)


def _common(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "app_id": APP_ID,
        "messages": [Note],
        "driver_directory": args.dir,
        "driver": args.driver,
        "enable_ipc": False,
        "enable_ipv6": False,
        "connection_expiry": args.expiry,
        "send_timeout": args.send_timeout,
    }


async def server(args: argparse.Namespace) -> None:
    from slipstream.network import Connection, Server, ServerConfig

    account = Account(Journal(args.journal))
    account.journal.write("P", role="server", pid=os.getpid(), t=time.monotonic())
    config = ServerConfig(
        **_common(args), settings_store=args.store, listen_address=args.listen, max_clients=8,
        buffered_timeout=args.buffered_timeout,
    )  # fmt: skip
    senders: list[Sender] = []
    first: dict[str, Connection] = {}
    async with Server(config) as endpoint:
        endpoint.on_error(lambda connection, error: account.error(error))
        endpoint.on_message(Note)(lambda connection, note: account.received(note))

        @endpoint.on_connect
        def connected(connection: Connection) -> None:
            account.journal.write("C", c=connection.id, tag=connection.tag, r=time.monotonic())
            if connection.tag not in first:  # a client's later connections are reached through its first
                first[connection.tag] = connection
                senders.append(Sender(account, f"server>{connection.tag}", connection, args.rate))

        endpoint.on_disconnect(lambda c: account.journal.write("D", c=c.id, tag=c.tag, r=time.monotonic()))
        await endpoint.bind(args.port)
        print("ready", flush=True)
        await _serve(account, senders)
    _closed(account)


async def client(args: argparse.Namespace) -> None:
    from slipstream.network import Client, ClientConfig, Connection

    account = Account(Journal(args.journal))
    stream = f"{args.name}:{os.getpid()}"
    account.journal.write("P", role="client", name=args.name, stream=stream, pid=os.getpid(), t=time.monotonic())
    config = ClientConfig(
        **_common(args), settings_store=args.store, tag=args.name, reconnect_max_delay=args.reconnect_max_delay
    )
    async with Client(config) as endpoint:
        endpoint.on_error(lambda connection, error: account.error(error))
        endpoint.on_message(Note)(lambda connection, note: account.received(note))
        endpoint.on_connect(lambda c: account.journal.write("C", c=c.id, r=time.monotonic()))
        endpoint.on_disconnect(lambda c: account.journal.write("D", c=c.id, r=time.monotonic()))
        connection: Connection = await endpoint.connect(args.host, args.port, timeout=args.connect_timeout)
        print("ready", connection.id, flush=True)
        senders = [Sender(account, stream, connection, args.rate)]  # later connections through the first
        await _serve(account, senders)
    _closed(account)


def _closed(account: Account) -> None:
    account.journal.write("Z", t=time.monotonic())
    account.journal.close()
    print("report", json.dumps(account.report()), flush=True)
    print("closed", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    from slipstream.testing import run_async

    parser = argparse.ArgumentParser(description="a fault-suite peer (see the module)")
    parser.add_argument("role", choices=("server", "client"))
    parser.add_argument("--dir", required=True, help="driver directory")
    parser.add_argument("--driver", default="embedded", choices=("embedded", "external", "invoker", "auto"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--listen", default="*")
    parser.add_argument("--name", default="c1", help="client: its tag and identity name")
    parser.add_argument("--store", default=":memory:", help="settings store (a file keeps the key)")
    parser.add_argument("--journal", required=True)
    parser.add_argument("--rate", type=float, default=200.0, help="notes per second per stream")
    parser.add_argument("--expiry", type=float, default=4.0, help="connection_expiry")
    parser.add_argument("--send-timeout", type=float, default=5.0)
    parser.add_argument("--buffered-timeout", type=float, default=120.0)
    parser.add_argument("--reconnect-max-delay", type=float, default=5.0)
    parser.add_argument("--connect-timeout", type=float, default=30.0)
    parser.add_argument("--lifetime", type=float, default=600.0, help="seconds before the peer gives up")
    args = parser.parse_args(argv)
    run_async((server if args.role == "server" else client)(args), args.lifetime)


# -- running a peer from a test ------------------------------------------------------------------------------


class PeerError(AssertionError):
    """A peer died, or did not say what it was expected to in time (the message has its log's tail)."""


class LineProcess:
    """A process (in ``namespace`` if given: a ``slipstream.testing.Namespace``) whose stdout is read on a
    thread, so that every wait has a bound; its stderr goes to ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, namespace: Any = None) -> None:
        self.name = name
        self.log = log
        self.killed = False
        """Ended by SIGKILL (``kill``): what it had in flight went with it."""
        self._log_file: IO[str] = log.open("a")
        streams: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": self._log_file}
        if namespace is not None:
            self.process = namespace.popen(list(argv), **streams)
        else:
            self.process = subprocess.Popen(list(argv), text=True, bufsize=1, **streams)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        pid: int = self.process.pid
        return pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def expect(self, word: str, timeout: float) -> str:
        """The next stdout line that starts with ``word`` (earlier lines are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerError(f"{self.name} ({self.pid}): no {word!r} within {timeout:g} s\n{self.tail()}")
            try:
                line = self._lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                code = self.process.wait(5)
                raise PeerError(f"{self.name} ({self.pid}) ended ({code}) before {word!r}\n{self.tail()}")
            if line.split(" ", 1)[0] == word:
                return line

    def command(self, text: str) -> None:
        """A line on its stdin (quietly nothing once it has gone)."""
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.write(text + "\n")
            self.process.stdin.flush()

    def signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, number)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        self.killed = True
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)

    def stop(self) -> None:
        """Whatever state it is in: gone when this returns (SIGCONT first, in case it was stopped)."""
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._log_file.close()


class PeerProcess(LineProcess):
    """A fault peer: ``role`` (server or client) with ``options`` (see :func:`main`), its journal at ``journal``."""

    def __init__(self, role: str, journal: Path, log: Path, *options: str, namespace: Any = None) -> None:
        self.role = role
        self.journal = journal
        argv = [sys.executable, PEER, role, "--journal", str(journal), *options]
        super().__init__(journal.stem, argv, log, namespace)

    @property
    def stream(self) -> str | None:
        """A client's stream (its journal's first line says it; None before that line is written)."""
        records, _ = read_journal(self.journal)
        return records[0].get("stream") if records else None

    def report(self, timeout: float = 10.0) -> dict[str, Any]:
        self.command("report")
        result: dict[str, Any] = json.loads(self.expect("report", timeout).split(" ", 1)[1])
        return result

    def quiet(self, timeout: float = 20.0) -> None:
        """Stop sending (after the send under way)."""
        self.command("quiet")
        self.expect("quiet", timeout)

    def close(self, timeout: float = 30.0) -> dict[str, Any]:
        """Close the endpoint cleanly; its last report."""
        self.command("close")
        report: dict[str, Any] = json.loads(self.expect("report", timeout).split(" ", 1)[1])
        self.expect("closed", 5)
        self.process.wait(10)
        return report


# -- the account, read back -----------------------------------------------------------------------------------


def read_journal(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of a journal from ``offset`` on, and the offset after them (a line cut short by
    SIGKILL, or still being written, is left for later or out)."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line], offset + end


class JournalTail:
    """Follows a journal as it grows: the first note of each stream received after a given time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.received: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        records, self._offset = read_journal(self.path, self._offset)
        self.received += [r for r in records if r["k"] == "R"]
        return records


@dataclass
class StreamAccount:
    """One direction of one stream, settled: every number its sender made is in exactly one of
    ``received``, ``undelivered`` (``on_error`` said so), ``refused`` (``send`` raised) or ``lost``."""

    stream: str
    sent: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    undelivered: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    reordered: list[tuple[int, int]] = field(default_factory=list)
    """(previous, next) pairs where a receiving process got a lower number after a higher one."""
    unexpected: list[int] = field(default_factory=list)
    """Received, but never sent (nor the note a killed sender was sending), or refused."""
    falsely_reported: list[int] = field(default_factory=list)
    """Reported undeliverable, yet received by a process that lived on."""
    unacknowledged_at_death: list[int] = field(default_factory=list)
    """Reported undeliverable, yet received by a process killed before it could say so (its sender cannot
    know: a receiver that dies takes its acknowledgements with it)."""
    lost: list[int] = field(default_factory=list)
    """Sent, and neither received nor reported: lost in silence."""
    died_with_sender: list[int] = field(default_factory=list)
    """Sent by a process killed with SIGKILL and never received: the tail it had in flight (nobody is left
    to report them); a gap below what was received is ``lost``."""
    sender_killed: bool = False
    received_by_killed: set[int] = field(default_factory=set)
    """Numbers received by a process later killed with SIGKILL."""
    refusals: Counter[str] = field(default_factory=Counter)
    """What ``send`` raised, by exception type."""
    times: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Number -> (made, received): the first receipt."""

    def settle(self) -> None:
        """Sort every number into its place (after all journals were read)."""
        sent, refused, undelivered = set(self.sent), set(self.refused), set(self.undelivered)
        received = set(self.received)
        in_flight = max(sent | refused, default=0) + 1  # the note a killed sender was sending when it died
        self.unexpected = sorted(
            n for n in received if n in refused or (n not in sent and not (self.sender_killed and n == in_flight))
        )
        self.falsely_reported = sorted(undelivered & received - self.received_by_killed)
        self.unacknowledged_at_death = sorted(undelivered & self.received_by_killed)
        missing = sorted(sent - received - undelivered)
        if self.sender_killed:
            top = max(received, default=0)
            self.died_with_sender = [n for n in missing if n > top]
            self.lost = [n for n in missing if n <= top]
        else:
            self.lost = missing

    @property
    def exact(self) -> bool:
        """Nothing lost in silence, duplicated, reordered, invented or reported wrongly."""
        return not (self.lost or self.duplicates or self.reordered or self.unexpected or self.falsely_reported)

    def recovery(self, after: float) -> float | None:
        """Seconds from ``after`` until the first note made at or after it was received (None: none was)."""
        made_after = [(made, got) for made, got in self.times.values() if made >= after]
        return min(got for _, got in made_after) - after if made_after else None

    def summary(self) -> str:
        parts = [f"sent {len(self.sent)}", f"received {len(self.received)}", f"undeliverable {len(self.undelivered)}"]
        if self.refused:
            parts.append(f"refused {len(self.refused)} ({', '.join(f'{k} {v}' for k, v in self.refusals.items())})")
        names = ("died_with_sender", "unacknowledged_at_death", "lost", "duplicates", "reordered", "unexpected")
        for name in (*names, "falsely_reported"):
            if getattr(self, name):
                parts.append(f"{name.replace('_', ' ')} {len(getattr(self, name))}")
        return f"{self.stream}: " + ", ".join(parts)


@dataclass
class Ledger:
    """Every stream's account, and what each process told ``on_error``, from the peers' journals."""

    streams: dict[str, StreamAccount]
    errors: dict[str, list[str]]
    """Journal name -> ``Type: text`` of each ``on_error`` call, in order."""

    @classmethod
    def read(cls, peers: Iterable[PeerProcess]) -> Ledger:
        streams: dict[str, StreamAccount] = {}
        errors: dict[str, list[str]] = {}

        def account(stream: str) -> StreamAccount:
            return streams.setdefault(stream, StreamAccount(stream))

        receipts: list[tuple[bool, list[dict[str, Any]]]] = []
        for peer in peers:
            records, _ = read_journal(peer.journal)
            errors[peer.journal.stem] = [f"{r['e']}: {r['m']}" for r in records if r["k"] == "E"]
            for record in records:
                kind = record["k"]
                if kind == "S":
                    account(record["s"]).sent.append(record["n"])
                elif kind == "X":
                    account(record["s"]).refused.append(record["n"])
                    account(record["s"]).refusals[record["e"].split(":", 1)[0]] += 1
                elif kind == "U":
                    account(record["s"]).undelivered.append(record["n"])
                if kind in ("S", "X"):
                    account(record["s"]).sender_killed = peer.killed
            receipts.append((peer.killed, [r for r in records if r["k"] == "R"]))
        for killed, received in receipts:
            last: dict[str, int] = {}
            for record in received:
                stream, n = record["s"], record["n"]
                entry = account(stream)
                if killed:
                    entry.received_by_killed.add(n)
                if n in entry.times:
                    entry.duplicates.append(n)
                else:
                    entry.times[n] = (record["t"], record["r"])
                    entry.received.append(n)
                if n < last.get(stream, 0):
                    entry.reordered.append((last[stream], n))
                last[stream] = max(n, last.get(stream, 0))
        for entry in streams.values():
            entry.settle()
        return cls(streams, errors)

    @property
    def exact(self) -> bool:
        return all(entry.exact for entry in self.streams.values())

    def summary(self) -> str:
        lines = [entry.summary() for entry in sorted(self.streams.values(), key=lambda e: e.stream)]
        lines += [f"on_error of {name}: {len(calls)} {calls}" for name, calls in sorted(self.errors.items())]
        return "\n".join(lines)


if __name__ == "__main__":
    main()
