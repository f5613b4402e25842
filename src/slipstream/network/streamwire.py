"""What streams say: the STREAM_* frames on the wire, and the failures and events a stream machine reports.

A payload too large for one transport message (any frame: a MESSAGE, a SYNC_REQUEST, an RMI request
or response) or the contents of a file travel as:

- ``STREAM_START`` (request id = stream id): ``flags u8 | inner kind u8 | inner request id u32 |
  total size u64`` + the file's name (UTF-8, at most 255 bytes; files only);
- ``STREAM_CHUNK`` (request id = stream id): ``offset u64`` + data, in order, no gaps;
- ``STREAM_END`` (request id = stream id): ``status u8`` then, for FINISHED, ``total u64 | SHA-256``;
  for ABORTED (the sender gave up) or REFUSED (the *receiver* refuses the stream, sent back to the
  sender under the sender's stream id) a UTF-8 reason.

Kept apart from :mod:`.streaming` (the machine) so that module stays one idea and under the size rule;
everything here is re-exported from there.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from .errors import NetworkError
from .frames import FrameKind

__all__ = [
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


def end_frame(status: End, reason: str) -> bytes:
    """An ABORTED or REFUSED end's payload (the reason cut to ``MAX_REASON`` bytes)."""
    return bytes((status,)) + reason.encode("utf-8", "replace")[:MAX_REASON]


def finished_frame(total: int, digest: bytes) -> bytes:
    return bytes((End.FINISHED,)) + FINISHED_BODY.pack(total, digest)


def reason_of(payload: bytes) -> str:
    """The reason of an ABORTED or REFUSED end (bounded, never raises)."""
    return bytes(payload[1 : 1 + MAX_REASON]).decode("utf-8", "replace")


class StreamingError(NetworkError):
    """A stream cannot be sent (closed, file unreadable, bad arguments)."""


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


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """An incoming stream was announced and accepted (``kind``/``request_id``: the frame it carries)."""

    stream_id: int
    total: int
    is_file: bool
    name: str
    kind: int = FrameKind.MESSAGE
    request_id: int = 0


@dataclass(frozen=True, slots=True)
class StreamProgressed:
    """Bytes so far of a stream (incoming or outgoing), every ``progress_step`` bytes and at the end."""

    stream_id: int
    done: int
    total: int
    incoming: bool


@dataclass(frozen=True, slots=True)
class StreamCompleted:
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


@dataclass(frozen=True, slots=True)
class StreamSent:
    """An outgoing stream's last frame was handed out."""

    stream_id: int
    size: int
    sha256: bytes


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """A stream failed; its resources (buffers, temporary file, open file) are already freed (or, with a
    threaded provider, their removal queued behind the file's pending writes)."""

    stream_id: int
    failure: StreamFailure
    detail: str
    incoming: bool


@dataclass(slots=True)
class StreamStats:
    """Counters of one connection's streams (bad frames are counted, never raised)."""

    streams_sent: int = 0
    streams_received: int = 0
    streams_failed: int = 0
    malformed_frames: int = 0
    unknown_stream_frames: int = 0
    spilled_streams: int = 0


StreamEvent = StreamStarted | StreamProgressed | StreamCompleted | StreamSent | StreamFailed
OutFrame = tuple[int, int, bytes | bytearray]
