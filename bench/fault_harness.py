"""The fault scenarios of issue 28, shared by the fault suite (``tests/test_network_faults.py``) and its
benchmark (``bench/faults.py``): a server and a client, each a process of its own
(``tests/fault_peer.py``), notes flowing both ways at a steady rate before, during and after one fault,
then every note accounted for from the peers' journals (:class:`~tests.fault_peer.Ledger`).

The faults: SIGKILL of a standalone driver (the server's or the client's) and its restart; SIGSTOP of
the server process (embedded driver) and SIGCONT; SIGKILL of a client and a fresh process with its
key; a partition between two network namespaces (every packet dropped, then none); random loss while
an endpoint recovers. Each scenario reports when its fault ended and how long it took from then until
notes made after it arrived, in each direction. Every wait is bounded, and whatever happens every
process, driver directory and namespace made here is gone when a scenario returns; the journals and logs
stay (in a ``faults-*`` temporary directory) when it failed, or with ``SLIPSTREAM_FAULTS_KEEP=1``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fault_peer import JournalTail, Ledger, LineProcess, PeerProcess

__all__ = [
    "Outcome",
    "Rig",
    "Settings",
    "client_replaced",
    "driver_restart",
    "loss_during_recovery",
    "partition",
    "pause",
]

NS_PORT = 9000
"""The server's port inside the namespaces (they are fresh: every port is free)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """What every scenario shares. Endpoint settings are the library's defaults unless said here."""

    rate: float = 200.0
    """Notes per second in each direction."""
    before_s: float = 2.0
    """Steady traffic before the fault."""
    after_s: float = 2.0
    """Steady traffic after notes flow again."""
    recovery_timeout_s: float = 60.0
    """How long to wait for notes to flow again before giving up (the outcome then says None)."""
    drain_timeout_s: float = 20.0
    expiry_s: float = 4.0
    send_timeout_s: float = 5.0
    reconnect_max_delay_s: float = 5.0


@dataclass
class Outcome:
    """What one scenario did: the account, when its fault ended, and how long recovery took."""

    name: str
    ledger: Ledger
    fault_end: float
    recovery_s: dict[str, float | None]
    """Stream -> seconds from the fault's end until its first note made after it arrived (None: never);
    streams whose sender was killed are left out."""
    notes: dict[str, float] = field(default_factory=dict)
    """Timings of the fault itself (how long the driver was down, the pause, ...)."""
    duration_s: float = 0.0

    @property
    def recovered_s(self) -> float | None:
        """When notes flowed again in every direction (None: some never did)."""
        values = list(self.recovery_s.values())
        return None if not values or None in values else max(v for v in values if v is not None)

    @property
    def on_error_calls(self) -> int:
        """The most ``on_error`` calls any one process had."""
        return max((len(calls) for calls in self.ledger.errors.values()), default=0)

    @property
    def damaged(self) -> int:
        """Notes lost in silence, duplicated, reordered, invented or reported wrongly."""
        return sum(
            len(s.lost) + len(s.duplicates) + len(s.reordered) + len(s.unexpected) + len(s.falsely_reported)
            for s in self.ledger.streams.values()
        )

    def summary(self) -> str:
        recovery = ", ".join(f"{s} {_seconds(v)}" for s, v in sorted(self.recovery_s.items()))
        timings = ", ".join(f"{k} {v:.2f} s" for k, v in self.notes.items())
        return (
            f"== {self.name} ({self.duration_s:.1f} s): recovered in {_seconds(self.recovered_s)} "
            f"after the fault's end ({recovery}); {timings}\n{self.ledger.summary()}"
        )


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _free_port_block(count: int = 10) -> int:
    """A port with ``count - 1`` free ports after it (the server's control and connection ports)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("0.0.0.0", 0))
            base: int = probe.getsockname()[1]
        if base + count > 65000:
            continue
        held = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                held.append(sock)
                sock.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no block of free UDP ports")


class NftRule:
    """An nftables table of our own in one namespace, removed to undo it."""

    def __init__(self, namespace: Any, stem: str, chains: str) -> None:
        self.namespace = namespace
        self.table = namespace.new_table_name(stem)
        namespace.nft(f"table inet {self.table} {{\n{chains}\n}}\n")

    def remove(self) -> None:
        self.namespace.nft(f"delete table inet {self.table}\n")


def drop_arriving(namespace: Any, interface: str, percent: int = 100) -> NftRule:
    """Drop ``percent`` % of the packets (all of them at 100, else UDP) arriving on ``interface``: a sender
    sees nothing wrong, as across a real partition."""
    match = "" if percent >= 100 else f"meta l4proto udp numgen random mod 100 < {percent} "
    chain = (
        "chain input {\n type filter hook input priority filter; policy accept;\n"
        f' iifname "{interface}" {match}counter drop\n}}'
    )
    return NftRule(namespace, "slip_faults", chain)


class Rig:
    """One scenario's processes, directories and (``namespaces``) two namespaces joined by a veth pair,
    the server in one and the clients in the other; all of it gone on exit."""

    def __init__(self, name: str, settings: Settings, *, namespaces: bool = False) -> None:
        self.name = name
        self.settings = settings
        self.scratch = Path(tempfile.mkdtemp(prefix=f"faults-{name}-"))
        self.processes: list[LineProcess] = []
        self.peers: list[PeerProcess] = []
        self.server: PeerProcess | None = None
        self.names: dict[PeerProcess, str] = {}
        """Each client process's name (its tag, and its key in the rig's store)."""
        self._directories: list[Path] = []
        self._exits = contextlib.ExitStack()
        self._namespaces = namespaces
        self.server_ns: Any = None
        self.client_ns: Any = None
        self.interfaces: tuple[str, str] = ("", "")
        self.host = "127.0.0.1"
        self.port = 0
        self.t0 = time.monotonic()

    def __enter__(self) -> Rig:
        try:
            if self._namespaces:
                from slipstream.testing import Namespace, link

                self.server_ns = self._exits.enter_context(Namespace("fserver"))
                self.client_ns = self._exits.enter_context(Namespace("fclient"))
                joined = link(self.server_ns, self.client_ns, "10.99.28.0/30")
                self.interfaces = (joined.a_interface, joined.b_interface)
                self.host, self.port = str(joined.a_address), NS_PORT
            else:
                self.port = _free_port_block()
        except BaseException:
            self._exits.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for process in self.processes:
                process.stop()
        finally:
            self._exits.close()  # the namespaces, and anything still running in them
            for directory in self._directories:
                shutil.rmtree(directory, ignore_errors=True)
            if exc[0] is None and not os.environ.get("SLIPSTREAM_FAULTS_KEEP"):
                shutil.rmtree(self.scratch, ignore_errors=True)

    # -- processes ------------------------------------------------------------------------------------

    def driver_directory(self, label: str) -> Path:
        path = Path("/dev/shm") / f"slipstream-faults-{uuid.uuid4().hex[:10]}-{label}"
        self._directories.append(path)
        return path

    def start_driver(self, directory: Path, namespace: Any = None) -> LineProcess:
        """A standalone driver (``slipstream driver``) on ``directory``; returns once it runs."""
        argv = [sys.executable, "-m", "slipstream", "driver", "--dir", str(directory)]
        driver = LineProcess(f"driver {directory.name}", argv, self.scratch / f"{directory.name}.log", namespace)
        self.processes.append(driver)
        driver.expect("media", 30)
        return driver

    def _peer(self, role: str, name: str, namespace: Any, *options: str) -> PeerProcess:
        s = self.settings
        count = sum(1 for p in self.peers if p.journal.stem.startswith(name))
        label = f"{name}-{count + 1}" if count else name
        peer = PeerProcess(
            role, self.scratch / f"{label}.jsonl", self.scratch / f"{label}.log",
            "--port", str(self.port), "--rate", str(s.rate), "--expiry", str(s.expiry_s),
            "--send-timeout", str(s.send_timeout_s), *options, namespace=namespace,
        )  # fmt: skip
        self.processes.append(peer)
        self.peers.append(peer)
        return peer

    def start_server(self, directory: Path | None = None, *, driver: str = "embedded") -> PeerProcess:
        directory = directory or self.driver_directory("server")
        listen = self.host if self._namespaces else "*"
        self.server = self._peer(
            "server", "server", self.server_ns, "--dir", str(directory), "--driver", driver, "--listen", listen,
            "--store", str(self.scratch / "server.db"),
        )  # fmt: skip
        self.server.expect("ready", 30)
        return self.server

    def start_client(
        self, name: str = "c1", directory: Path | None = None, *, driver: str = "embedded", wait: bool = True
    ) -> PeerProcess:
        """A client whose identity key lives in the rig's store for ``name`` (a second process of the same
        name is the same client to the server)."""
        directory = directory or self.driver_directory(name)
        client = self._peer(
            "client", name, self.client_ns, "--dir", str(directory), "--driver", driver, "--host", self.host,
            "--name", name, "--store", str(self.scratch / f"{name}.db"),
            "--reconnect-max-delay", str(self.settings.reconnect_max_delay_s),
        )  # fmt: skip
        self.names[client] = name
        if wait:
            client.expect("ready", 40)
        return client

    def drop_arriving(self, percent: int) -> list[NftRule]:
        """``drop_arriving`` on both ends of the link between the namespaces."""
        ends = ((self.server_ns, self.interfaces[0]), (self.client_ns, self.interfaces[1]))
        return [drop_arriving(namespace, interface, percent) for namespace, interface in ends]

    def live_clients(self) -> list[PeerProcess]:
        return [p for p in self.peers if p.role == "client" and not p.killed]

    # -- traffic --------------------------------------------------------------------------------------

    def wait_flowing(self, since: float, timeout: float) -> bool:
        """Until a note made at or after ``since`` arrived in every direction between the server and each
        live client (False after ``timeout``)."""
        assert self.server is not None
        tails = {p.journal: JournalTail(p.journal) for p in [self.server, *self.live_clients()]}
        wanted = [
            pair
            for client in self.live_clients()
            for pair in ((self.server.journal, client.stream), (client.journal, f"server>{self.names[client]}"))
        ]
        deadline = time.monotonic() + timeout
        while True:
            for tail in tails.values():
                tail.poll()
            waiting = []
            for journal, stream in wanted:
                if not any(r["s"] == stream and r["t"] >= since for r in tails[journal].received):
                    waiting.append(stream)
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def finish(self) -> Ledger:
        """Stop sending, let what is in flight arrive, close the clients then the server (cleanly), and
        read the account."""
        assert self.server is not None
        live = [*self.live_clients(), self.server]
        for peer in live:
            peer.command("quiet")
        for peer in live:
            peer.expect("quiet", self.settings.send_timeout_s + 10)
        self._drain(live)
        for peer in live:
            peer.close(self.settings.drain_timeout_s + 10)
        return Ledger.read(self.peers)

    def _drain(self, live: list[PeerProcess]) -> None:
        """Until every note sent between live peers arrived, or nothing more arrives for 2 s (bounded)."""
        deadline = time.monotonic() + self.settings.drain_timeout_s
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            ledger = Ledger.read(live)
            settled = all(not (s.lost or s.died_with_sender) for s in ledger.streams.values())
            received = sum(len(s.received) for s in ledger.streams.values())
            if settled:
                return
            if received != last:
                last, quiet_since = received, time.monotonic()
            elif time.monotonic() - quiet_since > 2.0:
                return
            time.sleep(0.25)


# -- scenarios --------------------------------------------------------------------------------------------


Fault = Callable[[Rig], tuple[float, dict[str, float]]]
"""Does the fault to a running rig; returns when it ended (``time.monotonic``) and its own timings."""


def _scenario(name: str, settings: Settings, rig: Rig, start: Callable[[Rig], None], fault: Fault) -> Outcome:
    started = time.monotonic()
    with rig:
        start(rig)
        if not rig.wait_flowing(rig.t0, 30):
            raise AssertionError(f"{name}: notes never flowed before the fault\n{_tails(rig)}")
        time.sleep(settings.before_s)
        fault_end, notes = fault(rig)
        if rig.wait_flowing(fault_end, settings.recovery_timeout_s):
            time.sleep(settings.after_s)
        ledger = rig.finish()
    recovery = {s: a.recovery(fault_end) for s, a in ledger.streams.items() if not a.sender_killed}
    return Outcome(name, ledger, fault_end, recovery, notes, time.monotonic() - started)


def _tails(rig: Rig) -> str:
    return "\n".join(f"--- {p.name}\n{p.tail()}" for p in rig.processes)


def driver_restart(settings: Settings, side: str, down_s: float = 0.0) -> Outcome:
    """SIGKILL of the standalone driver of the server (``side="server"``) or of the client, restarted on the
    same directory ``down_s`` after it died (0: at once, as a supervisor would). The fault ends when the
    new driver runs."""
    rig = Rig(f"driver-{side}", settings)
    directory = rig.driver_directory(f"{side}-standalone")
    drivers: list[LineProcess] = []

    def start(rig: Rig) -> None:
        drivers.append(rig.start_driver(directory))
        if side == "server":
            rig.start_server(directory, driver="external")
            rig.start_client()
        else:
            rig.start_server()
            rig.start_client(directory=directory, driver="external")

    def fault(rig: Rig) -> tuple[float, dict[str, float]]:
        killed = time.monotonic()
        drivers[0].kill()
        time.sleep(down_s)
        drivers.append(rig.start_driver(directory))
        end = time.monotonic()
        return end, {"driver down": end - killed}

    return _scenario(f"SIGKILL and restart of the {side}'s standalone driver", settings, rig, start, fault)


def pause(settings: Settings, seconds: float) -> Outcome:
    """SIGSTOP of the server process (its driver embedded) for ``seconds``, then SIGCONT (the fault's end)."""
    rig = Rig(f"pause-{seconds:g}", settings)

    def start(rig: Rig) -> None:
        rig.start_server()
        rig.start_client()

    def fault(rig: Rig) -> tuple[float, dict[str, float]]:
        assert rig.server is not None
        rig.server.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(seconds)
        rig.server.signal(signal.SIGCONT)
        end = time.monotonic()
        return end, {"stopped": end - stopped}

    return _scenario(f"SIGSTOP of the server for {seconds:g} s", settings, rig, start, fault)


def client_replaced(settings: Settings, delay_s: float) -> Outcome:
    """SIGKILL of the client process, and ``delay_s`` later a fresh process with the same key (its store):
    the fault ends when the new process starts."""
    rig = Rig("client-replaced", settings)

    def start(rig: Rig) -> None:
        rig.start_server()
        rig.start_client()

    def fault(rig: Rig) -> tuple[float, dict[str, float]]:
        killed = time.monotonic()
        rig.live_clients()[0].kill()
        time.sleep(delay_s)
        end = time.monotonic()
        client = rig.start_client(wait=False)
        client.expect("ready", 40)
        return end, {"killed to restart": end - killed, "new client ready": time.monotonic() - end}

    return _scenario(f"SIGKILL of the client, same key back after {delay_s:g} s", settings, rig, start, fault)


def partition(settings: Settings, seconds: float) -> Outcome:
    """Every packet between the server's and the client's namespaces dropped for ``seconds``, then none
    (the fault ends when the rules go)."""
    rig = Rig(f"partition-{seconds:g}", settings, namespaces=True)

    def start(rig: Rig) -> None:
        rig.start_server()
        rig.start_client()

    def fault(rig: Rig) -> tuple[float, dict[str, float]]:
        rules = rig.drop_arriving(100)
        cut = time.monotonic()
        time.sleep(seconds)
        for rule in rules:
            rule.remove()
        end = time.monotonic()
        return end, {"partitioned": end - cut}

    return _scenario(f"partition of {seconds:g} s", settings, rig, start, fault)


def loss_during_recovery(settings: Settings, percent: int, lossy_after_s: float = 3.0) -> Outcome:
    """``percent`` % of the UDP packets arriving in either namespace dropped from before the server's
    standalone driver is SIGKILLed and restarted until ``lossy_after_s`` after notes flow again."""
    rig = Rig(f"loss-{percent}", settings, namespaces=True)
    directory = rig.driver_directory("server-standalone")
    drivers: list[LineProcess] = []
    rules: list[NftRule] = []

    def start(rig: Rig) -> None:
        drivers.append(rig.start_driver(directory, rig.server_ns))
        rig.start_server(directory, driver="external")
        rig.start_client()

    def fault(rig: Rig) -> tuple[float, dict[str, float]]:
        rules.extend(rig.drop_arriving(percent))
        time.sleep(1.0)  # lossy before the fault too
        killed = time.monotonic()
        drivers[0].kill()
        drivers.append(rig.start_driver(directory, rig.server_ns))
        end = time.monotonic()
        flowing = rig.wait_flowing(end, settings.recovery_timeout_s)
        time.sleep(lossy_after_s if flowing else 0)
        for rule in rules:
            rule.remove()
        return end, {"driver down": end - killed, "lossy after the fault": time.monotonic() - end}

    return _scenario(f"{percent} % loss while the server's driver restarts", settings, rig, start, fault)
