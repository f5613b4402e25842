"""Who may connect: the server's admission policy, sans-I/O (the seed's rules plus key allowlists).

A handshake asks :meth:`AdmissionPolicy.check` once it knows the client's address, tag and static key;
the answer is None (admit) or a :class:`RejectReason` the server sends back, which the client raises as
the matching ``ClientRejected`` subclass. IP rules are CIDR *allow* rules (none means everyone); an IPC
client (address None) is never IP-filtered. The id and port allocators live a floor lower, in
:mod:`slipstream.client.allocation`, shared with the echo example; they are re-exported here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Sequence
from enum import IntEnum

from ..client.allocation import AddressCounter, AllocationError, IdAllocator, PortAllocator

__all__ = [
    "AddressCounter",
    "AdmissionPolicy",
    "AllocationError",
    "IdAllocator",
    "IpFilterRule",
    "PortAllocator",
    "RejectReason",
]

_MESSAGES = {
    1: "the server is full",
    2: "too many connections from this address",
    3: "the server does not permit this connection",
    4: "the registered message types differ",
    5: "the client tag is too long or not valid text",
    6: "the client's key is not allowed",
    7: "the handshake failed",
    8: "the server no longer holds this handshake",
}


class RejectReason(IntEnum):
    """Why a server refused a client (sent on the wire as this number)."""

    SERVER_FULL = 1
    TOO_MANY_FOR_ADDRESS = 2
    NOT_PERMITTED = 3
    REGISTRATION_MISMATCH = 4
    BAD_TAG = 5
    KEY_NOT_ALLOWED = 6
    HANDSHAKE_FAILED = 7
    HANDSHAKE_EXPIRED = 8
    """Not a refusal: the server lost this half-open handshake (it expired, was evicted, or the
    server restarted it from a late HELLO), so the client starts over with a fresh HELLO. On the wire
    it is the handshake's EXPIRED packet, not a REJECT."""

    @property
    def message(self) -> str:
        """Human text for the reason, as the client's exception shows it."""
        return _MESSAGES[int(self)]


class IpFilterRule:
    """One CIDR allow rule (``"10.0.0.0/8"``, ``"192.168.1.7"``, ``"fd00::/8"``); a bare address is /32 or /128.

    An address of the other family never matches; neither does text that is not an IP address.
    """

    __slots__ = ("network",)

    def __init__(self, network: str) -> None:
        try:
            self.network: ipaddress.IPv4Network | ipaddress.IPv6Network = ipaddress.ip_network(network, strict=False)
        except ValueError as exc:
            raise ValueError(f"IP filter rule {network!r} is not a CIDR network: {exc}") from None

    def matches(self, address: str) -> bool:
        """Whether ``address`` (text, with an optional IPv6 zone ``%eth0``) lies in this network."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None and self.network.version == 4:
            ip = ip.ipv4_mapped  # a dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d
        return ip.version == self.network.version and ip in self.network

    def __repr__(self) -> str:
        return f"IpFilterRule({str(self.network)!r})"


class AdmissionPolicy:
    """The server's limits and filters, checked in a fixed order: tag, IP rules, filter callback, key
    allowlist, then the total and per-address limits (so a refused client never counts against them).

    ``max_connections_per_address`` 0 means ``max_clients``; it never limits loopback clients (as the
    seed's: they are this host's own processes, which ``max_clients`` still bounds). ``allowed_keys`` None
    admits any key.
    ``filter_callback(address, tag)`` returning false (or raising) refuses with NOT_PERMITTED.
    """

    def __init__(
        self,
        max_clients: int = 256,
        max_connections_per_address: int = 0,
        rules: Sequence[IpFilterRule] = (),
        filter_callback: Callable[[str | None, str], bool] | None = None,
        allowed_keys: Collection[bytes] | None = None,
        max_tag_length: int = 32,
    ) -> None:
        if max_clients < 1:
            raise ValueError(f"max_clients must be at least 1, not {max_clients}")
        if max_connections_per_address < 0:
            raise ValueError(f"max_connections_per_address must not be negative, not {max_connections_per_address}")
        if max_tag_length < 0:
            raise ValueError(f"max_tag_length must not be negative, not {max_tag_length}")
        self.max_clients = max_clients
        self.max_connections_per_address = max_connections_per_address or max_clients
        self.rules = tuple(rules)
        self.filter_callback = filter_callback
        self.allowed_keys = frozenset(bytes(key) for key in allowed_keys) if allowed_keys is not None else None
        self.max_tag_length = max_tag_length
        self.callback_errors = 0
        """Filter callbacks that raised (each refused the client)."""

    def check(
        self, address: str | None, tag: str, public_key: bytes, current_total: int, current_for_address: int
    ) -> RejectReason | None:
        """None to admit, or why not. ``current_*`` count live (and half-open, if the caller counts them)
        connections, not including this one."""
        if len(tag) > self.max_tag_length or not tag.isprintable():
            return RejectReason.BAD_TAG
        if address is not None and self.rules and not any(rule.matches(address) for rule in self.rules):
            return RejectReason.NOT_PERMITTED
        if self.filter_callback is not None:
            try:
                allowed = bool(self.filter_callback(address, tag))
            except Exception:  # a user's callback must not take the server down; refuse instead
                self.callback_errors += 1
                allowed = False
            if not allowed:
                return RejectReason.NOT_PERMITTED
        if self.allowed_keys is not None and bytes(public_key) not in self.allowed_keys:
            return RejectReason.KEY_NOT_ALLOWED
        if current_total >= self.max_clients:
            return RejectReason.SERVER_FULL
        if address is not None and current_for_address >= self.max_connections_per_address and not _loopback(address):
            return RejectReason.TOO_MANY_FOR_ADDRESS
        return None


def _loopback(address: str) -> bool:
    """Whether ``address`` is a loopback one (an IPv4 loopback seen by a dual-stack socket included)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
