"""An in-memory datagram network with seeded loss, duplication, reordering and delay.

Protocol state machines are tested against this instead of real sockets so that hostile network
conditions are reproducible: the same seed gives the same drops in the same places, and time is a
:class:`~slipstream.testing.clock.ManualClock`, so a 10-second timeout costs nothing to test.
Nothing here knows the wire format; it moves opaque ``bytes`` between hashable addresses.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

from ..wire.address import Address
from .clock import ManualClock

__all__ = [
    "Address",
    "Datagram",
    "DatagramHandler",
    "InMemoryNetwork",
    "LinkConditions",
    "NetworkEndpoint",
    "NetworkStats",
]

DatagramHandler: TypeAlias = Callable[[bytes, Address, int], None]
"""Called as ``handler(data, source, now_ns)`` when a datagram reaches a bound address."""


@dataclass(slots=True)
class LinkConditions:
    """What happens to datagrams on one direction of a link. Probabilities are in [0, 1]."""

    loss: float = 0.0
    duplicate: float = 0.0
    """Probability that a datagram that got through is delivered a second time."""
    reorder: float = 0.0
    """Probability that a datagram is held back by ``reorder_delay_ns`` so later ones overtake it."""
    delay_ns: int = 0
    jitter_ns: int = 0
    """Each copy gets a uniform extra delay in [0, jitter_ns] (this also reorders when large)."""
    reorder_delay_ns: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1]: {value}")
        for name in ("delay_ns", "jitter_ns", "reorder_delay_ns"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative: {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Datagram:
    """One datagram in flight (or just delivered)."""

    source: Address
    destination: Address
    data: bytes
    sent_at_ns: int
    deliver_at_ns: int


@dataclass(slots=True)
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    """Lost to the link's loss probability."""
    filtered: int = 0
    """Dropped by a filter installed with :meth:`InMemoryNetwork.add_filter`."""
    duplicated: int = 0
    reordered: int = 0
    undeliverable: int = 0
    """Reached an address nobody is bound to (like ICMP port unreachable, silently)."""
    overflowed: int = 0
    """Dropped because too many datagrams were in flight (like a full socket buffer)."""


class NetworkEndpoint:
    """A bound address: sends into the network and collects what arrives unless a handler takes it."""

    __slots__ = ("_inbox", "address", "handler", "network")

    def __init__(self, network: InMemoryNetwork, address: Address, handler: DatagramHandler | None) -> None:
        self.network = network
        self.address = address
        self.handler = handler
        self._inbox: list[tuple[bytes, Address]] = []

    def send(self, data: bytes | bytearray | memoryview, destination: Address) -> None:
        self.network.send(self.address, destination, data)

    def receive(self) -> list[tuple[bytes, Address]]:
        """Take every datagram delivered here so far (when no handler is set), oldest first."""
        inbox, self._inbox = self._inbox, []
        return inbox

    def _deliver(self, data: bytes, source: Address, now_ns: int) -> None:
        if self.handler is None:
            self._inbox.append((data, source))
        else:
            self.handler(data, source, now_ns)


@dataclass(order=True, slots=True)
class _Scheduled:
    deliver_at_ns: int
    seq: int
    datagram: Datagram = field(compare=False)


class InMemoryNetwork:
    """Datagrams between bound addresses, delivered when the manual clock reaches their time.

    Call :meth:`deliver_due` after advancing the clock. Datagrams due at the same instant arrive in
    the order they were sent, unless the link reorders or jitters them.
    """

    def __init__(
        self,
        clock: ManualClock,
        *,
        seed: int = 0,
        conditions: LinkConditions | None = None,
        max_in_flight: int = 1_000_000,
    ) -> None:
        if max_in_flight <= 0:
            raise ValueError(f"max_in_flight must be positive: {max_in_flight}")
        self.clock = clock
        self.rng = random.Random(seed)
        self.default_conditions = conditions if conditions is not None else LinkConditions()
        self.max_in_flight = max_in_flight
        self.stats = NetworkStats()
        self._links: dict[tuple[Address, Address], LinkConditions] = {}
        self._endpoints: dict[Address, NetworkEndpoint] = {}
        self._filters: list[Callable[[Datagram], bool]] = []
        self._queue: list[_Scheduled] = []
        self._seq = 0

    # -- topology -------------------------------------------------------------------------------

    def bind(self, address: Address, handler: DatagramHandler | None = None) -> NetworkEndpoint:
        if address in self._endpoints:
            raise ValueError(f"address already bound: {address!r}")
        endpoint = NetworkEndpoint(self, address, handler)
        self._endpoints[address] = endpoint
        return endpoint

    def unbind(self, address: Address) -> None:
        """Stop delivering to ``address``; datagrams still in flight to it become undeliverable."""
        self._endpoints.pop(address, None)

    def set_link(self, source: Address, destination: Address, conditions: LinkConditions) -> None:
        """Conditions for datagrams from ``source`` to ``destination`` (one direction only)."""
        self._links[(source, destination)] = conditions

    def conditions(self, source: Address, destination: Address) -> LinkConditions:
        return self._links.get((source, destination), self.default_conditions)

    def add_filter(self, predicate: Callable[[Datagram], bool]) -> Callable[[Datagram], bool]:
        """Drop every datagram for which ``predicate`` returns True (checked when sent): targeted loss."""
        self._filters.append(predicate)
        return predicate

    def remove_filter(self, predicate: Callable[[Datagram], bool]) -> None:
        self._filters.remove(predicate)

    # -- traffic --------------------------------------------------------------------------------

    def send(self, source: Address, destination: Address, data: bytes | bytearray | memoryview) -> None:
        """Put a datagram on the wire; the link decides whether, when and how often it arrives."""
        now = self.clock.now_ns()
        payload = bytes(data)
        self.stats.sent += 1
        link = self.conditions(source, destination)
        probe = Datagram(source, destination, payload, now, now)
        for predicate in self._filters:
            if predicate(probe):
                self.stats.filtered += 1
                return
        rng = self.rng
        if link.loss and rng.random() < link.loss:
            self.stats.dropped += 1
            return
        copies = 2 if link.duplicate and rng.random() < link.duplicate else 1
        if copies == 2:
            self.stats.duplicated += 1
        for _ in range(copies):
            delay = link.delay_ns
            if link.jitter_ns:
                delay += rng.randint(0, link.jitter_ns)
            if link.reorder and rng.random() < link.reorder:
                delay += link.reorder_delay_ns
                self.stats.reordered += 1
            self._schedule(Datagram(source, destination, payload, now, now + delay))

    def _schedule(self, datagram: Datagram) -> None:
        if len(self._queue) >= self.max_in_flight:
            self.stats.overflowed += 1
            return
        self._seq += 1
        heapq.heappush(self._queue, _Scheduled(datagram.deliver_at_ns, self._seq, datagram))

    def deliver_due(self) -> list[Datagram]:
        """Deliver every datagram due by now and return them in delivery order.

        Datagrams sent by handlers during this call are not delivered in it, even with zero delay,
        so two endpoints answering each other cannot loop forever within one call.
        """
        now = self.clock.now_ns()
        last_seq = self._seq
        queue = self._queue
        held: list[_Scheduled] = []
        delivered: list[Datagram] = []
        while queue and queue[0].deliver_at_ns <= now:
            item = heapq.heappop(queue)
            if item.seq > last_seq:
                held.append(item)
                continue
            datagram = item.datagram
            endpoint = self._endpoints.get(datagram.destination)
            if endpoint is None:
                self.stats.undeliverable += 1
                continue
            self.stats.delivered += 1
            delivered.append(datagram)
            endpoint._deliver(datagram.data, datagram.source, now)
        for item in held:
            heapq.heappush(queue, item)
        return delivered

    def next_delivery_ns(self) -> int | None:
        """When the next datagram in flight is due, or None if nothing is in flight."""
        return self._queue[0].deliver_at_ns if self._queue else None

    @property
    def in_flight(self) -> int:
        return len(self._queue)
