"""What the handshake compares: the registered message types and, when there are any, the RMI interfaces.

Both sides must agree on both lists (a peer with other types or other interfaces would decode or call
the wrong thing). Without RMI registrations the description is exactly the message types' (so a side
that uses no RMI speaks as before); with them it is the msgpack pair ``[messages, rmi]`` of the two
descriptions, told apart from the plain form by its element types.
"""

from __future__ import annotations

import msgspec

from .rmi import RmiRegistry
from .serialization import Serialization

__all__ = ["Registrations"]


class Registrations:
    """The description a side sends in its handshake, and the first difference from a peer's."""

    def __init__(self, serialization: Serialization, rmi: RmiRegistry) -> None:
        self.serialization = serialization
        self.rmi = rmi
        self.has_rmi = bool(rmi.interfaces or rmi.exceptions)
        messages = serialization.description()
        self._description = msgspec.msgpack.encode([messages, rmi.description()]) if self.has_rmi else messages

    def description(self) -> bytes:
        """The bytes to send."""
        return self._description

    def first_difference(self, remote: bytes) -> str | None:
        """None when the peer registers the same; else text naming the first difference."""
        if remote == self._description:
            return None
        remote_messages, remote_rmi = _split(remote)
        difference = self.serialization.first_difference(remote_messages)
        if difference is not None:
            return difference
        if remote_rmi is None:
            return "RMI interfaces are registered here but none on the remote" if self.has_rmi else None
        if not self.has_rmi:
            return "the remote registers RMI interfaces but none are registered here"
        return self.rmi.first_difference(remote_rmi)


def _split(description: bytes) -> tuple[bytes, bytes | None]:
    """(message types, RMI or None) of a peer's description."""
    try:
        value = msgspec.msgpack.decode(description)
    except msgspec.DecodeError:
        return description, None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(part, bytes) for part in value):
        return value[0], value[1]
    return description, None
