"""Public test helpers: a manual clock, an in-memory lossy datagram network, and netns test hosts.

They let protocol code (which takes ``now_ns`` and bytes) be exercised under loss, reordering,
duplication and long timeouts deterministically and fast. This package sits at the bottom of the
layer stack: it knows nothing of slipstream's wire format. :mod:`.netns` builds real hosts (network
namespaces with nftables loss and NAT) for tests that must hit the kernel; it needs root.
"""

from .clock import ManualClock
from .connection import ConnectionPair, HandshakePair
from .netns import (
    DropRule,
    Link,
    Namespace,
    NamespaceCommandError,
    NatTopology,
    NetnsUnavailableError,
    UdpDropRule,
    drop_random,
    drop_random_udp,
    link,
    python_command,
    remove_stale_namespaces,
    require_netns,
)
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
    "ConnectionPair",
    "Datagram",
    "DatagramHandler",
    "DropRule",
    "HandshakePair",
    "InMemoryNetwork",
    "Link",
    "LinkConditions",
    "ManualClock",
    "Namespace",
    "NamespaceCommandError",
    "NatTopology",
    "NetnsUnavailableError",
    "NetworkEndpoint",
    "NetworkStats",
    "UdpDropRule",
    "drop_random",
    "drop_random_udp",
    "link",
    "python_command",
    "remove_stale_namespaces",
    "require_netns",
]
