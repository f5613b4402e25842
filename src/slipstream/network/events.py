"""Events the network layer's sans-I/O machines hand to their adapters.

Pure data (ids and values, never live objects), past-tense names, as aioquic's and h11's events: a
machine says what happened; the adapter decides what to run. One module for every machine, so the
vocabulary stays in one place.

Each is a frozen ``msgspec.Struct`` (immutable, compared and printed by value, as a frozen dataclass) because
a machine makes one for every message it receives: a Struct is built in about 0.1 us, a frozen dataclass
(which sets each field through ``object.__setattr__``) in about 0.6 us.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Generic, TypeVar

import msgspec

from .frames import FrameKind

T = TypeVar("T")

__all__ = [
    "ClientAccepted",
    "Closed",
    "Event",
    "HandshakeCompleted",
    "HandshakeTimedOut",
    "KeepaliveSent",
    "MessageDecodeFailed",
    "MessageReceived",
    "PingAcknowledged",
    "PingTimedOut",
    "Rejected",
    "RmiCallCompleted",
    "RmiCallFailed",
    "RmiEvent",
    "RmiFailure",
    "RmiObjectReceived",
    "RmiOnewayFailed",
    "RmiRequestReceived",
    "BufferOverflowed",
    "BufferedEvent",
    "SessionExpired",
    "SessionResumed",
    "StreamCompleted",
    "StreamEvent",
    "StreamFailed",
    "StreamFailure",
    "StreamProgressed",
    "StreamSent",
    "StreamStarted",
    "SyncCompleted",
    "SyncFailed",
    "SyncTimedOut",
]


class HandshakeCompleted(msgspec.Struct, frozen=True):
    """Client side: the server proved its identity and allocated a connection.

    Ids and ports are the server's allocation; keys are the record layer's (this side's send and
    receive keys)."""

    connection_id: int
    server_session_id: int
    client_session_id: int
    server_stream_id: int
    client_stream_id: int
    control_port: int
    remote_public_key: bytes
    send_key: bytes
    receive_key: bytes
    handshake_hash: bytes
    connection_expiry_ns: int
    key_changed: bool = False
    """The server's key differed from the pinned one and ``allow_key_change`` accepted it."""


class ClientAccepted(msgspec.Struct, frozen=True):
    """Server side: a client finished the handshake and was given ids (and a port for UDP)."""

    connection_id: int
    pending_key: tuple[int, int]
    address: str | None
    port: int | None
    tag: str
    server_session_id: int
    client_session_id: int
    server_stream_id: int
    client_stream_id: int
    control_port: int
    remote_public_key: bytes
    send_key: bytes
    receive_key: bytes
    plaintext: bool = False
    resume: int = 0
    """The client's delivery session (0: the client keeps none): a server resumes its own for it."""


class Rejected(msgspec.Struct, frozen=True):
    """A handshake refused. On the client: the server's reason (or a local one, such as a changed
    key); on the server: what it answered (the client gets the same code)."""

    reason: int
    message: str
    address: str | None = None
    tag: str = ""
    """The tag the client gave (server side; empty when refused before it was read, or on a client)."""


class HandshakeTimedOut(msgspec.Struct, frozen=True):
    """Client side: nothing useful came back within the timeout."""

    waited_s: float


class MessageReceived(msgspec.Struct, frozen=True):
    """A decoded application message (``sync_id`` > 0 when the sender waits for it to be handled).

    ``stream_id`` > 0 when it arrived as a stream: a file (``message`` is the temporary copy's
    ``Path``) or a message too large for one record; the adapter calls
    ``ConnectionMachine.release_stream(stream_id)`` once the listeners are done with it."""

    message: object
    sync_id: int = 0
    stream_id: int = 0


class MessageDecodeFailed(msgspec.Struct, frozen=True):
    """A frame whose message did not decode: counted and reported; the connection goes on."""

    reason: str


class SyncCompleted(msgspec.Struct, frozen=True):
    """The remote's listeners handled the message sent with ``send_sync``; or (``acknowledged`` False) a
    streamed one left whole and no acknowledgement came within the timeout after its last byte: it can
    no longer be taken back, so it is not a failure."""

    sync_id: int
    acknowledged: bool = True


class SyncTimedOut(msgspec.Struct, frozen=True):
    """No acknowledgement for a ``send_sync`` within its timeout; a streamed message or file (``stream_id``)
    made no progress for that long and was cancelled, so the receiver never delivers it."""

    sync_id: int
    stream_id: int = 0


class SyncFailed(msgspec.Struct, frozen=True):
    """The stream carrying a ``send_sync`` message or file failed: the receiver refused it (``detail`` names
    its limit), the file could not be read, or the connection was lost (``failure``)."""

    sync_id: int
    stream_id: int
    failure: StreamFailure
    detail: str


class PingAcknowledged(msgspec.Struct, frozen=True):
    """A ping's round trip, as the seed's ``Ping``: times in nanoseconds.

    ``outbound_ns`` = pong time - ping time, ``inbound_ns`` = finish - pong time (each includes the
    difference of the two clocks' wall time, as in the seed), ``round_trip_ns`` on this side's clock."""

    ping_id: int
    round_trip_ns: int
    outbound_ns: int
    inbound_ns: int


class PingTimedOut(msgspec.Struct, frozen=True):
    """No pong within the ping's timeout."""

    ping_id: int


class KeepaliveSent(msgspec.Struct, frozen=True):
    """The connection was quiet, so it told the peer it is alive (for tests and stats)."""


class Closed(msgspec.Struct, frozen=True):
    """The connection ended: ``by_peer`` for a CLOSE frame, ``expired`` when the peer went silent
    longer than the connection expiry or its stream ended without a CLOSE (the peer is lost), else
    closed locally. Emitted exactly once."""

    by_peer: bool
    expired: bool
    reason: str = ""


# -- remote objects ---------------------------------------------------------------------------------


class RmiFailure(IntEnum):
    """Why a call failed."""

    EXCEPTION = 1
    """The remote method raised."""
    MISSING = 2
    """No object under that id on the remote."""
    REFUSED = 3
    """The remote refused the request as malformed."""
    TIMED_OUT = 4
    CLOSED = 5
    """The connection closed with the call in flight."""
    BAD_RESPONSE = 6
    """The response did not decode as the method's result type."""
    FILE_FAILED = 7
    """A ``Path`` result's file did not arrive (its stream failed or did not match the response)."""
    BUSY = 8
    """The remote runs ``max_pending_calls`` calls and listener tasks for this connection already."""


class RmiCallCompleted(msgspec.Struct, frozen=True):
    """A call's response arrived. ``value`` is the result: a :class:`~.rmi.RemoteRef` for an object
    the peer hosts (the adapter makes it a proxy), this side's own object when the peer handed one
    back, a ``pathlib.Path`` for a file result once its file arrived whole, or for a create the new
    object's RemoteRef."""

    call_id: int
    value: object


class RmiCallFailed(msgspec.Struct, frozen=True):
    """A call failed; :func:`~.rmi.exception_from` turns this into the exception the caller should see."""

    call_id: int
    failure: RmiFailure
    method: str
    type_name: str = ""
    message: str = ""
    traceback_text: str = ""
    args: tuple[object, ...] | None = None
    object_id: int = 0
    is_global: bool = False


class RmiOnewayFailed(msgspec.Struct, frozen=True):
    """A fire-and-forget call this side hosted raised (nobody waits for it: report it to on_error)."""

    object_id: int
    method: str
    type_name: str
    message: str
    traceback_text: str


class RmiObjectReceived(msgspec.Struct, frozen=True):
    """The peer sent a remote object as a message: ``value`` is our own object when it names one we
    host, else a :class:`~.rmi.RemoteRef` of the peer's (the adapter makes it a proxy). Dispatched
    as a message."""

    value: object


class RmiRequestReceived(msgspec.Struct, frozen=True):
    """A vetted call for an object this side hosts is ready to run (its file arguments, if any, have
    arrived): the adapter takes it with ``ConnectionMachine.invocation(invocation_id)``, runs it, and
    answers with ``complete_invocation`` or ``fail_invocation``."""

    invocation_id: int
    object_id: int
    method: str


RmiEvent = RmiCallCompleted | RmiCallFailed | RmiOnewayFailed | RmiObjectReceived
"""What the RMI endpoint itself emits."""


# -- streams (large messages and files) -------------------------------------------------------------


class StreamFailure(IntEnum):
    """Why a stream failed."""

    SENDER_ABORTED = 1
    """The sender gave up (closed, file changed or unreadable)."""
    REFUSED = 2
    """The receiver refused it (too large, too many, idle, bad data) and told the sender."""
    CONNECTION_LOST = 3
    CHUNK_MISSING = 4
    """A chunk arrived at an offset other than the next expected one."""
    CHECKSUM_MISMATCH = 5
    SIZE_MISMATCH = 6
    TOO_LARGE = 7
    TOO_MANY = 8
    TIMED_OUT = 9
    """No chunk for the idle timeout."""
    SPILL_FAILED = 10
    """The temporary file could not be written (or the disk fell too far behind)."""
    MESSAGE_TOO_LARGE = 11
    """A message (not a file) announced above the receiver's ``max_message_size``; refused to both sides."""
    OVER_QUOTA = 12
    """The receiving server's ``spill_quota`` (disk for incoming streams) had no room; refused to both sides."""


class StreamStarted(msgspec.Struct, frozen=True):
    """A stream began: an incoming one was announced and accepted, or an outgoing one's first frame left
    (``kind``/``request_id``: the frame it carries; ``name``: a file's name)."""

    stream_id: int
    total: int
    is_file: bool
    name: str
    kind: int = FrameKind.MESSAGE
    request_id: int = 0
    incoming: bool = True


class StreamProgressed(msgspec.Struct, frozen=True):
    """Bytes so far of a stream (incoming or outgoing), every ``progress_step`` bytes and at the end."""

    stream_id: int
    done: int
    total: int
    incoming: bool


class StreamCompleted(msgspec.Struct, frozen=True):
    """An incoming stream arrived whole and checked (size and SHA-256).

    ``payload`` holds it when it stayed in memory; otherwise ``path`` names the temporary file, which
    the receiver removes on :meth:`Streams.release` or close. The connection treats the payload as one
    frame of ``kind``/``request_id`` (a file is a message whose value is the path).
    """

    stream_id: int
    kind: int
    request_id: int
    size: int
    sha256: bytes
    payload: bytes | None
    path: str | None
    is_file: bool
    name: str


class StreamSent(msgspec.Struct, frozen=True):
    """An outgoing stream's last frame was handed out."""

    stream_id: int
    size: int
    sha256: bytes


class StreamFailed(msgspec.Struct, frozen=True):
    """A stream failed; its resources (buffers, temporary file, open file) are already freed (or, with a
    threaded provider, their removal queued behind the file's pending writes)."""

    stream_id: int
    failure: StreamFailure
    detail: str
    incoming: bool


StreamEvent = StreamStarted | StreamProgressed | StreamCompleted | StreamSent | StreamFailed

# -- buffered sessions (network.buffered) ------------------------------------------------------------


class BufferOverflowed(msgspec.Struct, Generic[T], frozen=True):
    """``message`` for the disconnected peer ``key`` did not fit its queue and was not queued."""

    key: bytes
    message: T
    queued: int
    reason: str


class SessionExpired(msgspec.Struct, Generic[T], frozen=True):
    """The peer did not come back in time (or the sessions were closed): these messages were never delivered."""

    key: bytes
    undelivered: tuple[T, ...]


class SessionResumed(msgspec.Struct, frozen=True):
    """The peer reconnected within the timeout; ``delivered`` queued messages were handed back."""

    key: bytes
    delivered: int


BufferedEvent = BufferOverflowed[T] | SessionExpired[T] | SessionResumed
"""What a server's buffered sessions report (``T``: the application's message type)."""


# -- the server's connection table (network.table) ---------------------------------------------------

__all__ += [
    "ConnectionReleased",
    "ConnectionStarted",
    "OpeningFailed",
    "PortReassigned",
    "SessionEnded",
    "StartTimedOut",
    "TableEvent",
]


class PortReassigned(msgspec.Struct, frozen=True):
    """The driver refused the connection's publication on ``refused_port`` (most likely another
    program holds that port): ask for it again on ``port``."""

    connection_id: int
    refused_port: int
    port: int
    reason: str


class OpeningFailed(msgspec.Struct, frozen=True):
    """The connection's streams could not be opened and the table gave up (its ids are released)."""

    connection_id: int
    reason: str


class StartTimedOut(msgspec.Struct, frozen=True):
    """The client's streams did not come up in time: close them (its ids go back after the release delay)."""

    connection_id: int


class ConnectionStarted(msgspec.Struct, frozen=True):
    """The connection is up (``on_init``, ``on_connect`` are due). ``resumes``: the lost connection
    whose buffered session continues here (its sends go to this one; its ``on_disconnect`` is due
    now); ``queued``: what waited for the peer, to send first, in order."""

    connection_id: int
    resumes: int | None = None
    queued: tuple[object, ...] = ()


class SessionEnded(msgspec.Struct, frozen=True):
    """A lost connection's buffered session ended without its peer (expired, the server closed, or
    its id went to a new connection): its ``on_disconnect`` is due; ``undelivered`` never left."""

    connection_id: int
    undelivered: tuple[object, ...] = ()


class ConnectionReleased(msgspec.Struct, frozen=True):
    """The connection's ids and port went back to the allocators: whatever is still held for it goes."""

    connection_id: int


TableEvent = PortReassigned | OpeningFailed | StartTimedOut | ConnectionStarted | SessionEnded | ConnectionReleased
"""What the server's connection table emits."""

Event = (
    HandshakeCompleted
    | ClientAccepted
    | Rejected
    | HandshakeTimedOut
    | MessageReceived
    | MessageDecodeFailed
    | SyncCompleted
    | SyncTimedOut
    | SyncFailed
    | PingAcknowledged
    | PingTimedOut
    | KeepaliveSent
    | Closed
    | RmiCallCompleted
    | RmiCallFailed
    | RmiOnewayFailed
    | RmiObjectReceived
    | RmiRequestReceived
    | StreamEvent
    | BufferedEvent[object]
    | TableEvent
)
"""Every event a network machine emits (one vocabulary: a machine's ``take_events`` returns a list of these)."""
