"""Public test helpers: a manual clock and an in-memory lossy datagram network.

They let protocol code (which takes ``now_ns`` and bytes) be exercised under loss, reordering,
duplication and long timeouts deterministically and fast. This package sits at the bottom of the
layer stack: it knows nothing of slipstream's wire format.
"""

from .clock import ManualClock
from .network import (
    Address,
    Datagram,
    DatagramHandler,
    InMemoryNetwork,
    LinkConditions,
    NetworkEndpoint,
    NetworkStats,
)

__all__ = [
    "Address",
    "Datagram",
    "DatagramHandler",
    "InMemoryNetwork",
    "LinkConditions",
    "ManualClock",
    "NetworkEndpoint",
    "NetworkStats",
]
