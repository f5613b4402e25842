"""Exceptions of the network layer, one base (:class:`NetworkError`) for everything it raises.

Core (crypto, codecs, policy) errors come first; the client-facing errors follow at the end of the file.
Record and frame errors describe what a *peer* sent: callers count and drop them, they never escape a
receive path.
"""

from __future__ import annotations

from ..client.allocation import AllocationError

__all__ = [
    "AllocationError",
    "FrameError",
    "MessageDecodeError",
    "NetworkError",
    "NoiseError",
    "RecordMalformed",
    "RecordRejected",
    "RecordReplayed",
    "RecordTampered",
    "SerializationError",
    "UnregisteredTypeError",
]


class NetworkError(Exception):
    """Base of every error the network layer raises (``AllocationError`` lives a floor lower)."""


class NoiseError(NetworkError):
    """A Noise handshake message was malformed, failed authentication, or came out of turn."""


class RecordRejected(NetworkError):
    """A session record was refused; the subclass says why (each is counted separately)."""


class RecordMalformed(RecordRejected):
    """A record too short or too long to be one (no counter, no tag, over the size limit)."""


class RecordTampered(RecordRejected):
    """A record whose AEAD tag does not verify: altered, forged, or sealed under another key."""


class RecordReplayed(RecordRejected):
    """A record whose counter was already accepted, or is too old for the replay window."""


class FrameError(NetworkError, ValueError):
    """Bytes inside a record that are not a well-formed sequence of connection frames."""


class SerializationError(NetworkError):
    """Base of the message (de)serialization errors."""


class UnregisteredTypeError(SerializationError, TypeError):
    """A message whose type is not registered (and not a builtin), so it cannot be sent."""


class MessageDecodeError(SerializationError):
    """A message payload that does not decode to a registered type (unknown id or bad body)."""
