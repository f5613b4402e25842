"""The driver's side of a UDP publication: its log, its sender state machine and its socket.

The sans-I/O ``NetworkPublicationSender`` decides what goes on the wire; this adapter only moves
datagrams between it and a non-blocking socket, and turns its flow-control state into the
publisher limit the application's ``offer`` reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import cast

from ..files.counters import CountersManager
from ..protocol.lifecycle import ACTIVE, DONE, DRAINING
from ..protocol.sender import NetworkPublicationSender
from ..wire.address import SocketAddress
from .ipc_publication import DriverPublication, PublicationState
from .udp_channel import UdpSocket

_RECV_BUDGET = 64


@dataclass(slots=True, eq=False)
class NetworkPublication(DriverPublication):
    sender: NetworkPublicationSender
    sock: UdpSocket
    state: PublicationState = ACTIVE
    control_mode: str | None = None
    """None for unicast (connected socket); "dynamic" or "manual" for multi-destination-cast."""
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
            sender.on_datagram(data, now_ns, source)
            work += 1
        if not sender.poll_due(now_ns):
            return work
        sent = sender.datagrams_sent
        batches = sender.poll_batches(now_ns)
        self.update_limit(counters)
        for datagrams, destination in batches:
            self.sock.send(datagrams, cast(SocketAddress | None, destination))
        return work + sender.datagrams_sent - sent

    def send_fresh(self, now_ns: int, counters: CountersManager) -> int:
        """Send what the application just appended (the sender's ``poll_fresh``) and move its limit on,
        or run ``do_work`` without input when the sender owes something else first; the datagrams sent."""
        sender = self.sender
        sent = sender.datagrams_sent
        batches = sender.poll_fresh_batches(now_ns)
        if batches is None:
            return self.do_work(now_ns, False, counters)
        self.update_limit(counters)
        for datagrams, destination in batches:
            self.sock.send(datagrams, cast(SocketAddress | None, destination))
        return sender.datagrams_sent - sent

    @property
    def destinations(self) -> dict[Hashable, int]:
        """MDC destinations (kept by the sender) -> time of their last status message."""
        return self.sender.destinations

    def add_destination(self, address: SocketAddress) -> None:
        """Manual MDC: a destination that stays until removed."""
        self.sender.add_destination(address)

    def remove_destination(self, address: SocketAddress) -> bool:
        return self.sender.remove_destination(address)

    def update_limit(self, counters: CountersManager) -> int:
        limit = self.sender.publisher_limit()
        if self.state is not ACTIVE:
            limit = min(limit, self.log.producer_position())
        if limit != self._published_limit:  # the driver is the counter's only writer
            counters.set(self.limit_counter_id, limit)
            self._published_limit = limit
        return 0

    def start_draining(self, now_ns: int) -> None:
        if self.state is ACTIVE:
            self.state = DRAINING
            self.sender.close()

    def close(self) -> None:
        self.state = DONE
        with contextlib.suppress(OSError):
            self.sock.close()
        self.release_log()
