"""What streams say: the STREAM_* frames on the wire, and the failures and events a stream machine reports.

A payload too large for one transport message (any frame: a MESSAGE, a SYNC_REQUEST, an RMI request
or response) or the contents of a file travel as:

- ``STREAM_START`` (request id = stream id): ``flags u8 | inner kind u8 | inner request id u32 |
  total size u64`` + the file's name (UTF-8, at most 255 bytes; files only);
- ``STREAM_CHUNK`` (request id = stream id): ``offset u64`` + data, in order, no gaps;
- ``STREAM_END`` (request id = stream id): ``status u8`` then, for FINISHED, ``total u64 | SHA-256``;
  for ABORTED (the sender gave up) or REFUSED (the *receiver* refuses the stream, sent back to the
  sender under the sender's stream id) a UTF-8 reason.

Kept apart from :mod:`.streaming` (the machine) so that module stays one idea and under the size rule,
with the records the machine keeps of each stream (pure data); everything here is re-exported from
there, with the stream events (in :mod:`.events`, beside every other machine's) and
:class:`StreamingError` (in :mod:`.errors`).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Final, Protocol

from .errors import StreamingError
from .events import (
    StreamCompleted,
    StreamEvent,
    StreamFailed,
    StreamFailure,
    StreamProgressed,
    StreamSent,
    StreamStarted,
)

if TYPE_CHECKING:
    from .streamfiles import SourceReader, SpillWriter

__all__ = [
    "Hasher",
    "IncomingStream",
    "OutgoingStream",
    "StreamCompleted",
    "StreamEvent",
    "StreamFailed",
    "StreamFailure",
    "StreamProgressed",
    "StreamSent",
    "StreamStarted",
    "StreamStats",
    "StreamingError",
]

START: Final = struct.Struct(">BBIQ")
OFFSET: Final = struct.Struct(">Q")
FINISHED_BODY: Final = struct.Struct(">Q32s")
FLAG_FILE: Final = 0x01
MAX_NAME: Final = 255
MAX_REASON: Final = 200


class End(IntEnum):
    FINISHED = 0
    ABORTED = 1
    REFUSED = 2
    REFUSED_MESSAGE_SIZE = 3
    """REFUSED for the receiver's ``max_message_size`` (so the sender can say which limit)."""
    REFUSED_QUOTA = 4
    """REFUSED for the receiving server's ``spill_quota``."""


REFUSALS: Final[dict[int, StreamFailure]] = {
    End.REFUSED: StreamFailure.REFUSED,
    End.REFUSED_MESSAGE_SIZE: StreamFailure.MESSAGE_TOO_LARGE,
    End.REFUSED_QUOTA: StreamFailure.OVER_QUOTA,
}
"""How the sender of a stream reports each refusal it hears."""


def refusal_end(failure: StreamFailure) -> End:
    """The end a receiver sends back for a stream it refuses because of ``failure``."""
    if failure is StreamFailure.MESSAGE_TOO_LARGE:
        return End.REFUSED_MESSAGE_SIZE
    return End.REFUSED_QUOTA if failure is StreamFailure.OVER_QUOTA else End.REFUSED


def end_frame(status: End, reason: str) -> bytes:
    """An ABORTED or REFUSED end's payload (the reason cut to ``MAX_REASON`` bytes)."""
    return bytes((status,)) + reason.encode("utf-8", "replace")[:MAX_REASON]


def finished_frame(total: int, digest: bytes) -> bytes:
    return bytes((End.FINISHED,)) + FINISHED_BODY.pack(total, digest)


def reason_of(payload: bytes) -> str:
    """The reason of an ABORTED or REFUSED end (bounded, never raises)."""
    return bytes(payload[1 : 1 + MAX_REASON]).decode("utf-8", "replace")


@dataclass(slots=True)
class StreamStats:
    """Counters of one connection's streams (bad frames are counted, never raised)."""

    streams_sent: int = 0
    streams_received: int = 0
    streams_failed: int = 0
    malformed_frames: int = 0
    unknown_stream_frames: int = 0
    spilled_streams: int = 0


OutFrame = tuple[int, int, bytes | bytearray]


class Hasher(Protocol):
    """A running SHA-256 (``hashlib.sha256()``), as a stream's checksum uses it."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def digest(self) -> bytes: ...


# -- the machine's records of its streams -----------------------------------------------------------


@dataclass(slots=True)
class OutgoingStream:
    """What the stream machine keeps of a stream it sends."""

    stream_id: int
    kind: int
    request_id: int
    total: int
    data: memoryview | None
    source: SourceReader | None
    name: str
    announce: bool = True
    """Whether the name goes on the wire (the receiver's copy keeps it)."""
    offset: int = 0
    started: bool = False
    next_progress: int = 0
    hasher: Hasher = field(default_factory=hashlib.sha256)


@dataclass(slots=True)
class IncomingStream:
    """What the stream machine keeps of a stream it receives."""

    stream_id: int
    kind: int
    request_id: int
    total: int
    is_file: bool
    name: str
    last_ns: int
    received: int = 0
    next_progress: int = 0
    buffer: bytearray | None = None
    spill: SpillWriter | None = None
    reserved: int = 0
    """Bytes of the server's spill quota its file holds."""
    hasher: Hasher = field(default_factory=hashlib.sha256)
    digest: bytes = b""
    """Set by a checked end; the stream then waits for its file to be written and closed."""
