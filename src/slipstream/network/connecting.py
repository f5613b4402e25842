"""What a client's ``connect`` decides before any I/O, whichever adapter runs it: how long it may wait
(the seed's 0 waits forever), and whether the host named is this one (automatic IPC)."""

from __future__ import annotations

import contextlib
import ipaddress
import math
import socket

from .config import LOCALHOST_ALIASES

__all__ = ["FOREVER_NS", "connect_window", "is_local_host", "ns_until"]

FOREVER_NS = 2**62
"""A handshake timeout that never comes (a connect that waits forever)."""


def connect_window(timeout: float | None) -> float:
    """A connect's timeout in seconds, ``math.inf`` for forever (0 or None, as the seed's 0); ValueError
    when negative or not a number."""
    if timeout is None or timeout == 0:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be positive, or 0 or None to wait forever: {timeout!r}")
    return float(timeout)


def ns_until(deadline: float, now: float) -> int:
    """Nanoseconds from ``now`` to ``deadline`` (monotonic seconds; inf: FOREVER_NS), at least 1."""
    if math.isinf(deadline):
        return FOREVER_NS
    return max(1, int((deadline - now) * 1e9))


def is_local_host(host: str) -> bool:
    """Loopback names and literals, and this host's own addresses (a name is resolved): candidates for
    automatic IPC, as the seed's are."""
    if host in LOCALHOST_ALIASES or host.startswith("127."):
        return True
    try:
        addresses = {ipaddress.ip_address(host.split("%", 1)[0])}
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
        except OSError:
            return False
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}
    return any(_is_own(address) for address in addresses)


def _is_own(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is one of this host's: only then can a socket bind it."""
    if address.is_loopback:
        return True
    if address.is_multicast or address.is_unspecified or address.is_link_local:
        return False  # (a link-local address names no host without its zone)
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.bind((str(address), 0))
        return True
    return False
