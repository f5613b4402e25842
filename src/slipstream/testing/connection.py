"""In-memory pairs of the network layer's sans-I/O machines: a handshake pair and a connection
pair over :class:`InMemoryNetwork`, with a ``pump`` that moves what each side has to send and fires
deadlines on the :class:`ManualClock` (h11's ``ConnectionPair``, aioquic's ``client_and_server``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ..client.allocation import IdAllocator, PortAllocator
from ..network.connection import ConnectionMachine
from ..network.delivery import Delivery
from ..network.events import Event
from ..network.handshake import AdmissionCheck, ClientHandshake, ServerHandshake
from ..network.noise import generate_keypair
from ..network.rmi import ObjectTable, RemoteCalls, RmiEndpoint, RmiRegistry, StreamsChannel
from ..network.serialization import Serialization
from ..network.session import RecordLayer
from ..network.streaming import Streams
from .clock import ManualClock
from .network import InMemoryNetwork, LinkConditions

__all__ = ["CLIENT", "SERVER", "ConnectionPair", "HandshakePair", "admit_all", "machine_pair"]

CLIENT = ("10.0.0.2", 40000)
SERVER = ("10.0.0.1", 20000)


def admit_all(
    address: str | None, tag: str, public_key: bytes | None, current_total: int, current_for_address: int
) -> tuple[int, str] | None:
    """An admission check that admits everyone."""
    return None


def _deliver(machine: ConnectionMachine, data: bytes, source: Hashable, now_ns: int) -> None:
    """What the in-memory network hands a machine (whether its record layer kept it is in its stats)."""
    machine.receive(data, now_ns)


class HandshakePair:
    """A server handshake machine and any number of client machines on one lossy network.

    Clients are keyed by their transport source id (the image session id on the real transport)."""

    def __init__(
        self,
        *,
        app_id: str = "test",
        server_types: Sequence[type] = (),
        client_types: Sequence[type] = (),
        conditions: LinkConditions | None = None,
        seed: int = 0,
        admission: AdmissionCheck = admit_all,
        timeout_ns: int = 5_000_000_000,
        max_pending: int = 64,
        handshakes_per_second: float = 1e6,
    ) -> None:
        self.clock = ManualClock(1_000_000_000)
        self.network = InMemoryNetwork(self.clock, seed=seed, conditions=conditions)
        self.app_id = app_id
        self.server_key = generate_keypair()
        self.server_serialization = Serialization(server_types)
        self.client_serialization = Serialization(client_types)
        self.timeout_ns = timeout_ns
        self.server = ServerHandshake(
            app_id=app_id,
            static_private=self.server_key[0],
            description=self.server_serialization.description(),
            describe_difference=self.server_serialization.first_difference,
            admission=admission,
            sessions=IdAllocator(1, 65534),
            streams=IdAllocator(1, 65533),
            ports=PortAllocator(30000, 100),
            timeout_ns=timeout_ns,
            connection_expiry_ns=4_000_000_000,
            max_pending=max_pending,
            handshakes_per_second=handshakes_per_second,
            now_ns=self.clock.now_ns(),
        )
        self.clients: dict[int, ClientHandshake] = {}
        self._addresses: dict[int, tuple[str, int]] = {}
        self.network.bind(SERVER, self._server_receives)

    def add_client(
        self,
        source: int,
        *,
        address: tuple[str, int] | None = None,
        pinned_key: bytes | None = None,
        allow_key_change: bool = False,
        app_id: str | None = None,
        tag: str = "",
        start: bool = True,
        timeout_ns: int | None = None,
        static_private: bytes | None = None,
        plaintext_ipc: bool = False,
    ) -> ClientHandshake:
        """A client with transport source id ``source`` at ``address`` (default ``10.0.0.2:40000+source``);
        it gives up after ``timeout_ns`` (default: the server's handshake timeout). Its static key is
        ``static_private`` (default: a fresh one)."""
        where = address or (CLIENT[0], CLIENT[1] + source)
        client = ClientHandshake(
            app_id=app_id or self.app_id,
            tag=tag,
            static_private=static_private or generate_keypair()[0],
            plaintext_ipc=plaintext_ipc,
            description=self.client_serialization.description(),
            describe_difference=self.client_serialization.first_difference,
            pinned_key=pinned_key,
            allow_key_change=allow_key_change,
            now_ns=self.clock.now_ns(),
            timeout_ns=self.timeout_ns if timeout_ns is None else timeout_ns,
        )
        self.clients[source] = client
        self._addresses[source] = where

        def deliver(data: bytes, source: Any, now_ns: int) -> None:
            client.receive(data, now_ns)

        self.network.bind(where, deliver)
        if start:
            client.start(self.clock.now_ns())
        return client

    def _server_receives(self, data: bytes, source: Any, now_ns: int) -> None:
        for sid, where in self._addresses.items():
            if where == source:
                self.server.receive(data, source=sid, address=where[0], port=where[1], now_ns=now_ns)
                return
        # an unknown sender (a test injecting packets): use its port as its source id
        self.server.receive(data, source=int(source[1]), address=str(source[0]), port=int(source[1]), now_ns=now_ns)

    def _flush(self) -> int:
        moved = 0
        for source, client in self.clients.items():
            for packet in client.messages_to_send():
                self.network.send(self._addresses[source], SERVER, packet)
                moved += 1
        for packet in self.server.messages_to_send():
            for where in self._addresses.values():  # the server's answers are broadcast (MDC)
                self.network.send(SERVER, where, packet)
            moved += 1
        return moved

    def pump(self, *, until: Callable[[], bool] | None = None, max_ns: int = 60_000_000_000) -> int:
        """Move packets and fire deadlines until nothing is left to do (or ``until()``); returns the
        number of steps. Time jumps to the next delivery or deadline, so long timeouts cost nothing."""
        end = self.clock.now_ns() + max_ns
        steps = 0
        while self.clock.now_ns() <= end:
            steps += 1
            self._flush()
            self.network.deliver_due()
            now = self.clock.now_ns()
            machines: list[ClientHandshake | ServerHandshake] = [*self.clients.values(), self.server]
            for machine in machines:
                deadline = machine.deadline_ns
                if deadline is not None and now >= deadline:
                    machine.handle_timer(now)
            self._flush()
            if until is not None and until():
                return steps
            times = [t for t in (self.network.next_delivery_ns(),) if t is not None]
            times += [d for m in machines if (d := m.deadline_ns) is not None]
            if not times:
                return steps
            self.clock.advance_to(max(min(times), now + 1) if min(times) <= now else min(times))
        return steps


def machine_pair(
    serialization: Serialization,
    now_ns: int,
    *,
    expiry_ns: int,
    batch_limit: int = 1376 - 24,
    replay_window: int = 4096,
    rmi: tuple[RmiRegistry, RmiRegistry] | None = None,
    global_objects: ObjectTable | None = None,
    streams: bool = False,
    temp_dir: str | None = None,
    delivery: tuple[Delivery | None, Delivery | None] | None = None,
) -> tuple[ConnectionMachine, ConnectionMachine]:
    """Two connection machines with matching keys (client, server), as the adapters make them: with
    ``rmi`` (the client's and the server's registries; ``global_objects`` the server's) or ``streams``,
    each streams large messages and files (``temp_dir``) and carries remote objects; with ``delivery``
    (the client's and the server's sessions, kept across pairs) plain messages survive a lost pair."""
    key_ab, key_ba = os.urandom(32), os.urandom(32)
    machines = []
    for send, receive, index in ((key_ab, key_ba, 0), (key_ba, key_ab, 1)):
        side_streams = Streams(chunk_payload=16 * 1024, temp_dir=temp_dir) if rmi is not None or streams else None
        calls = None
        if rmi is not None:
            assert side_streams is not None
            endpoint = RmiEndpoint(
                rmi[index], global_objects=global_objects if index else None, files=StreamsChannel(side_streams)
            )
            calls = RemoteCalls(endpoint, side_streams)
        machines.append(
            ConnectionMachine(
                records=RecordLayer(send, receive, replay_window=replay_window),
                serialization=serialization,
                now_ns=now_ns,
                expiry_ns=expiry_ns,
                batch_limit=batch_limit,
                streams=side_streams,
                rmi=calls,
                delivery=delivery[index] if delivery is not None else None,
            )
        )
    return machines[0], machines[1]


class ConnectionPair:
    """Two connection machines with matching keys on one lossy network: ``a`` (client) and ``b``.

    With ``rmi`` (the client's and the server's registries; ``global_objects`` the server's) both carry
    remote objects and stream large messages and files; ``streams`` alone gives streaming. ``delivery``
    gives each side a :class:`~slipstream.network.delivery.Delivery` (either may be None): to resume after a
    lost pair, lose both machines (``lost``) and build a new pair with the same two."""

    def __init__(
        self,
        *,
        types: Sequence[type] = (),
        conditions: LinkConditions | None = None,
        seed: int = 0,
        expiry_ns: int = 4_000_000_000,
        batch_limit: int = 1376 - 24,
        replay_window: int = 4096,
        rmi: tuple[RmiRegistry, RmiRegistry] | None = None,
        global_objects: ObjectTable | None = None,
        streams: bool = False,
        temp_dir: str | None = None,
        delivery: tuple[Delivery | None, Delivery | None] | None = None,
    ) -> None:
        self.clock = ManualClock(1_000_000_000)
        self.network = InMemoryNetwork(self.clock, seed=seed, conditions=conditions)
        self.serialization = Serialization(types)
        self.a, self.b = machine_pair(
            self.serialization,
            self.clock.now_ns(),
            expiry_ns=expiry_ns,
            batch_limit=batch_limit,
            replay_window=replay_window,
            rmi=rmi,
            global_objects=global_objects,
            streams=streams,
            temp_dir=temp_dir,
            delivery=delivery,
        )
        self.events_a: list[Event] = []
        self.events_b: list[Event] = []
        self.wire: list[tuple[str, bytes]] = []
        """Every record put on the network, as (``"a"`` or ``"b"``, bytes): for tamper/replay tests."""
        self.network.bind(CLIENT, functools.partial(_deliver, self.a))
        self.network.bind(SERVER, functools.partial(_deliver, self.b))

    def _flush(self) -> int:
        now = self.clock.now_ns()
        moved = 0
        for record in self.a.messages_to_send(now):
            self.wire.append(("a", bytes(record)))
            self.network.send(CLIENT, SERVER, record)
            moved += 1
        for record in self.b.messages_to_send(now):
            self.wire.append(("b", bytes(record)))
            self.network.send(SERVER, CLIENT, record)
            moved += 1
        self.events_a.extend(self.a.take_events())
        self.events_b.extend(self.b.take_events())
        return moved

    def inject(self, to: str, record: bytes) -> None:
        """Put ``record`` on the wire towards ``"a"`` or ``"b"`` (as an attacker would)."""
        if to == "b":
            self.network.send(CLIENT, SERVER, record)
        else:
            self.network.send(SERVER, CLIENT, record)

    def pump(self, *, duration_ns: int = 0, max_steps: int = 100_000, drain: bool = True) -> None:
        """Deliver everything in flight, and run the clock ``duration_ns`` forward firing deadlines; without
        ``drain``, stop at the end of ``duration_ns`` with what is due later still in flight (to lose it)."""
        end = self.clock.now_ns() + duration_ns
        for _ in range(max_steps):
            self._flush()
            self.network.deliver_due()
            now = self.clock.now_ns()
            for machine in (self.a, self.b):
                deadline = machine.deadline_ns
                if deadline is not None and now >= deadline:
                    machine.handle_timer(now)
            self._flush()
            times = [t for t in (self.network.next_delivery_ns(),) if t is not None and (drain or t <= end)]
            times += [d for m in (self.a, self.b) if (d := m.deadline_ns) is not None and d <= end]
            if not times:
                if now < end:
                    self.clock.advance_to(end)
                    continue
                return
            self.clock.advance_to(max(min(times), now + 1) if min(times) <= now else min(times))
        raise RuntimeError("pump did not settle")
