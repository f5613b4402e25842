"""Datagram addresses: what the machines, the in-memory network and the driver's sockets call a peer.

One definition for every floor: the sans-I/O machines and the in-memory network take any hashable
name (tests use ``("10.0.0.1", 40001)``), the driver's sockets use Python's socket address tuples.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeAlias

__all__ = ["Address", "SocketAddress", "host_of"]

Address: TypeAlias = Hashable
"""Where a datagram came from or goes to: the driver uses socket addresses, tests any hashable."""

SocketAddress: TypeAlias = tuple[str, int] | tuple[str, int, int, int]
"""An IPv4 ``(host, port)`` or IPv6 ``(host, port, flowinfo, scope_id)`` socket address."""


def host_of(address: Address) -> Hashable:
    """The host part of an address (its port dropped): a socket address's first item, else the whole name."""
    return address[0] if isinstance(address, tuple) and address else address
