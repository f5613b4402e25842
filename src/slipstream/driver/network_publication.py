"""The driver's side of a UDP publication: its log, its sender state machine and its socket.

The sans-I/O ``NetworkPublicationSender`` decides what goes on the wire; this adapter only moves
datagrams between it and a non-blocking socket, and turns its flow-control state into the
publisher limit the application's ``offer`` reads.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ..files.counters import CountersManager
from ..protocol.sender import NetworkPublicationSender
from ..wire.address import SocketAddress
from ..wire.constants import HDR_TYPE_SM, SM_LENGTH
from .ipc_publication import DriverPublication, PublicationState
from .udp_channel import UdpSocket

_RECV_BUDGET = 64
DESTINATION_TIMEOUT_NS = 5_000_000_000
"""A dynamic MDC destination that sent no status message for this long is dropped (as Aeron)."""


@dataclass(slots=True, eq=False)
class NetworkPublication(DriverPublication):
    sender: NetworkPublicationSender
    sock: UdpSocket
    state: PublicationState = PublicationState.ACTIVE
    control_mode: str | None = None
    """None for unicast (connected socket); "dynamic" or "manual" for multi-destination-cast."""
    destinations: dict[SocketAddress, int] = field(default_factory=dict)
    """MDC destinations -> time of their last status message (manual ones never expire)."""
    position_counters: dict[int, int] = field(default_factory=dict)
    """Type id -> counter id of the per-stream position counters the driver keeps current."""
    _published_limit: int | None = None
    """The last ``pub-lmt`` written, so an unchanged limit costs no counter write."""

    @property
    def short_sends(self) -> int:
        return self.sock.short_sends

    @property
    def send_errors(self) -> int:
        return self.sock.send_errors

    def do_work(self, now_ns: int, readable: bool, counters: CountersManager) -> int:
        """Take in control datagrams (SMs, NAKs, RTTMs) if the socket has any, then, unless the sender
        has nothing due, send what it wants sent and publish its new limit to the application."""
        work = 0
        sender = self.sender
        for data, source in self.sock.receive(_RECV_BUDGET) if readable else ():
            if self.control_mode == "dynamic" and len(data) >= SM_LENGTH and data[6] == HDR_TYPE_SM and not data[7]:
                # Any status message at the control port adds or refreshes its source as a destination:
                # the reply traffic a NAT lets through (reference 3.2, 3.5).
                self.destinations[source] = now_ns
            sender.on_datagram(data, now_ns, source)
            work += 1
        if not sender.poll_due(now_ns):
            return work
        datagrams = sender.poll(now_ns)
        self.update_limit(counters)
        if not datagrams:
            return work
        if self.control_mode is None:
            self.sock.send(datagrams)
        else:
            if self.control_mode == "dynamic":
                self._expire_destinations(now_ns)
            for destination in self.destinations:
                self.sock.send(datagrams, destination)
        return work + len(datagrams)

    def _expire_destinations(self, now_ns: int) -> None:
        expired = [d for d, seen in self.destinations.items() if now_ns - seen > DESTINATION_TIMEOUT_NS]
        for destination in expired:
            del self.destinations[destination]

    def add_destination(self, address: SocketAddress) -> None:
        """Manual MDC: a destination that stays until removed."""
        self.destinations[address] = 1 << 62

    def remove_destination(self, address: SocketAddress) -> bool:
        return self.destinations.pop(address, None) is not None

    def update_limit(self, counters: CountersManager) -> int:
        limit = self.sender.publisher_limit()
        if self.state is not PublicationState.ACTIVE:
            limit = min(limit, self.log.producer_position())
        if limit != self._published_limit:  # the driver is the counter's only writer
            counters.set(self.limit_counter_id, limit)
            self._published_limit = limit
        return 0

    def start_draining(self, now_ns: int) -> None:
        if self.state is PublicationState.ACTIVE:
            self.state = PublicationState.DRAINING
            self.sender.close()

    def close(self) -> None:
        self.state = PublicationState.DONE
        with contextlib.suppress(OSError):
            self.sock.close()
        self.release_log()
