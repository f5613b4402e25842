"""Public test helpers: a manual clock, an in-memory lossy datagram network, the transport machines
paired over it, and netns test hosts.

They let protocol code (which takes ``now_ns`` and bytes) be exercised under loss, reordering,
duplication and long timeouts deterministically and fast. :mod:`.connection` pairs the network layer's
machines (handshakes; connections, with remote objects and streams), :mod:`.rmi` two RMI endpoints,
:mod:`.aio` a connection pair on a running event loop and a bounded ``asyncio.run``. :mod:`.network` moves opaque bytes;
:mod:`.transport` runs the real sender and receive-endpoint machines over it (:class:`TransportPair`,
unicast or dynamic MDC with several subscriptions). :mod:`.netns` builds real hosts (network
namespaces with nftables loss and NAT) for tests that must hit the kernel; it needs root.
This package may use any floor below ``cli``; no floor imports it.
"""

from ..wire.address import Address
from .aio import AsyncConnectionPair, async_test, run_async
from .clock import ManualClock
from .connection import ConnectionPair, HandshakePair, machine_pair
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
    Datagram,
    DatagramHandler,
    InMemoryNetwork,
    LinkConditions,
    NetworkEndpoint,
    NetworkStats,
)
from .rmi import RmiPair, deliver
from .transport import (
    PUBLICATION_ADDRESS,
    SUBSCRIPTION_ADDRESS,
    SimulatedPublication,
    SimulatedSubscription,
    Subscriber,
    TransportPair,
    checked_poll,
    machine_state,
)

__all__ = [
    "PUBLICATION_ADDRESS",
    "SUBSCRIPTION_ADDRESS",
    "Address",
    "AsyncConnectionPair",
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
    "RmiPair",
    "SimulatedPublication",
    "SimulatedSubscription",
    "Subscriber",
    "TransportPair",
    "UdpDropRule",
    "async_test",
    "deliver",
    "checked_poll",
    "drop_random",
    "drop_random_udp",
    "link",
    "machine_pair",
    "machine_state",
    "python_command",
    "remove_stale_namespaces",
    "require_netns",
    "run_async",
]
