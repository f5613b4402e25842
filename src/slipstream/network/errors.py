"""Exceptions of the network layer, one base (:class:`NetworkError`) for everything it raises.

Core (crypto, codecs, policy) errors come first; the client-facing errors follow at the end of the file.
Record and frame errors describe what a *peer* sent: callers count and drop them, they never escape a
receive path.
"""

from __future__ import annotations

from ..client.allocation import AllocationError
from ..errors import DriverError

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
    "SettingsLimitError",
    "SettingsStoreError",
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


class SettingsStoreError(NetworkError):
    """The settings store cannot be opened or holds invalid data (the message names the file)."""


class SettingsLimitError(SettingsStoreError, ValueError):
    """An application setting over the store's bounds: a key too long, a value too large, too many keys
    (the message gives the limit). Nothing was written."""


# -- client-facing errors (the "app" helper's part) ------------------------------------------------


class ClientError(NetworkError):
    """Something a client cannot do (not connected, bad target, closed while connecting)."""


class ClientClosedError(ClientError):
    """The client was closed: it connects no more (make a new one)."""


class ClientRejected(ClientError):
    """The server refused this client; the message carries the server's reason."""


class ServerFull(ClientRejected):
    """The server has ``max_clients`` connections already."""


class TooManyConnectionsForAddress(ClientRejected):
    """The server's per-address limit is reached for this client's IP address."""


class ConnectionNotPermitted(ClientRejected):
    """An IP filter, the filter callback, the key allowlist or the tag rules refused this client."""


class RegistrationMismatch(ClientRejected):
    """The two sides registered different message types (the message names the first difference),
    or a different application id."""


class ServerKeyChanged(ClientRejected):
    """The server's public key differs from the one pinned for its address: a man in the middle,
    or a reinstalled server (then remove the pin, or set ``allow_key_change``)."""


class ConnectTimeout(ClientError, TimeoutError):
    """No connection within the timeout; the message names the address and the seconds waited."""


class ConnectionClosedError(NetworkError):
    """The connection is closed: nothing can be sent on it."""


class MessageTooLarge(NetworkError, ValueError):
    """A message larger than the largest record (streaming of large messages comes later)."""


class SendTimeout(NetworkError, TimeoutError):
    """The transport took nothing for ``send_timeout`` seconds (back-pressure that did not clear)."""


class PingTimeout(NetworkError, TimeoutError):
    """No pong within the ping's timeout."""


class SendSyncTimeout(NetworkError, TimeoutError):
    """The remote did not acknowledge a ``send_sync`` message within its timeout."""


class ReceiveTimeout(NetworkError, TimeoutError):
    """No message for ``receive`` (the blocking API) within its timeout."""


class InboxFull(NetworkError):
    """A blocking wait for an answer on a connection whose inbox is full: it reads nothing (answers
    included) until ``receive`` takes what waits there."""


class BlockingListenerError(NetworkError, RuntimeError):
    """A listener of the blocking API waited for an answer: it runs inside the cycle that would take the
    answer in, so it must send without waiting (``send_nowait``) or leave the waiting to another thread."""


class MessageDispatchError(NetworkError):
    """A message arrived that no ``on_message`` listener takes (reported to ``on_error``)."""


class ServerError(NetworkError):
    """A server cannot do what was asked (bound twice, IPC disabled...)."""


class DriverNotAttachedError(NetworkError, DriverError):
    """The endpoint holds no media driver to report on (``driver_stats``): not bound or connected yet,
    closed, or its driver was lost (a recovering endpoint holds one again once it is back)."""


class UndeliveredError(NetworkError):
    """Messages that will never be delivered: a buffered session's queue was full (raised by ``send``); the
    session expired before the peer came back, or the peer closed the connection while they were on their way
    (reported to ``on_error`` with the connection). ``messages`` holds them, oldest first, so the application
    can act."""

    def __init__(self, message: str, messages: tuple[object, ...]) -> None:
        super().__init__(message)
        self.messages = messages


__all__ += [
    "BlockingListenerError",
    "InboxFull",
    "ReceiveTimeout",
    "ClientClosedError",
    "ClientError",
    "ClientRejected",
    "ConnectTimeout",
    "ConnectionClosedError",
    "ConnectionNotPermitted",
    "DriverNotAttachedError",
    "MessageDispatchError",
    "MessageTooLarge",
    "PingTimeout",
    "RegistrationMismatch",
    "SendSyncTimeout",
    "SendTimeout",
    "ServerError",
    "ServerFull",
    "ServerKeyChanged",
    "TooManyConnectionsForAddress",
    "UndeliveredError",
]


# -- remote objects ---------------------------------------------------------------------------------


class RmiError(NetworkError):
    """Base of the remote-object errors."""


class InterfaceError(RmiError, TypeError):
    """An interface, implementation or call that does not fit the registered interfaces."""


class ObjectIdInUse(RmiError, ValueError):
    """``save(obj, id)`` with an id another object holds (or out of 1-65535)."""


class RemoteError(RmiError):
    """The remote method raised an exception whose type is not registered on this side."""

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text


class RemoteObjectMissing(RmiError, LookupError):
    """The remote side has no object under the proxy's id (never saved, deleted, or another scope)."""

    def __init__(self, object_id: int, is_global: bool) -> None:
        scope = "global" if is_global else "connection-scoped"
        super().__init__(f"remote object {object_id} ({scope}) does not exist")
        self.object_id = object_id
        self.is_global = is_global


class RmiRequestRefused(RmiError):
    """The remote refused the call: ``reason`` is ``"busy"`` when it already runs its ``max_pending_calls``
    for this connection (nothing was run or queued: retry later), ``"malformed"`` for an unknown method,
    bad arguments or an interface not served."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


class RmiCallTimeout(RmiError, TimeoutError):
    """No response within the proxy's timeout; the message names the method."""


class RmiConnectionClosed(RmiError, ConnectionClosedError):
    """The connection closed before the call's response arrived (or before the call was made)."""


__all__ += [
    "InterfaceError",
    "ObjectIdInUse",
    "RemoteError",
    "RemoteObjectMissing",
    "RmiCallTimeout",
    "RmiConnectionClosed",
    "RmiError",
    "RmiRequestRefused",
]


class StreamingError(NetworkError):
    """A stream cannot be sent (closed, file unreadable, bad arguments), or it failed on its way."""


class StreamRefused(StreamingError):
    """The receiver refused a large message or file: larger than its ``max_stream_size``, more streams at
    once than its ``max_incoming``, idle past its timeout, or its disk failed (the message says which and
    names the limit). Raised by ``send_sync`` as soon as the refusal arrives."""


class MaxMessageSizeExceeded(StreamRefused):
    """A large message (or remote call, or response) announced above the receiver's ``max_message_size``:
    refused before anything was allocated, reported on both sides. Send a ``Path`` (files are not decoded
    in memory) or raise the receiver's limit."""


class SpillQuotaExceeded(StreamRefused):
    """An incoming stream did not fit the receiving server's ``spill_quota`` (disk for incoming streams over
    all its connections): refused, reported on both sides. Retry once earlier streams were handled."""


__all__ += ["MaxMessageSizeExceeded", "SpillQuotaExceeded", "StreamRefused", "StreamingError"]


class ErrorsSuppressed(NetworkError):
    """Repeats of an error that were counted, not reported, so that a flood reaches ``on_error`` as the
    first occurrence and then this count (``count`` errors of type ``type_name``, the last ``last``)."""

    def __init__(self, message: str, type_name: str, count: int, last: str) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.count = count
        self.last = last


__all__ += ["ErrorsSuppressed"]
