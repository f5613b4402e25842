"""Connection frames: the typed units a session record's plaintext carries, many per record.

A record holds a run of frames, each ``kind (u8) | request_id (u32) | length (u32) | payload``, all
big-endian: 9 bytes of overhead, packed and unpacked by one precompiled struct. Batching many frames
into one record is what makes encryption cheap per message (as TLS records and QUIC packets do).

The decoder trusts nothing: every length is checked against the bytes actually left *before* a payload
is sliced, the number of frames is capped, unknown kinds are refused, and every problem is a
:class:`FrameError` (never an IndexError or struct.error escaping).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from enum import IntEnum
from typing import Final

import msgspec

from .errors import FrameError

__all__ = [
    "FRAME_HEADER",
    "FRAME_OVERHEAD",
    "MAX_REQUEST_ID",
    "Frame",
    "FrameKind",
    "decode_frames",
    "encode_frame_into",
    "encode_frames",
    "iter_frames",
]


class FrameKind(IntEnum):
    """What a frame carries: messages and their controls, then remote objects (16-17) and streams (18-20)."""

    MESSAGE = 1
    SYNC_REQUEST = 2
    SYNC_ACK = 3
    PING = 4
    PONG = 5
    CLOSE = 6
    KEEPALIVE = 7
    RMI_REQUEST = 16
    RMI_RESPONSE = 17
    STREAM_START = 18
    STREAM_CHUNK = 19
    STREAM_END = 20


FRAME_HEADER: Final = struct.Struct(">BII")
"""kind, request id, payload length."""
FRAME_OVERHEAD: Final = FRAME_HEADER.size
MAX_REQUEST_ID: Final = 0xFFFF_FFFF

_KINDS: Final[tuple[FrameKind | None, ...]] = tuple(
    FrameKind(value) if value in FrameKind._value2member_map_ else None for value in range(256)
)
"""Kind byte -> member (None: unknown), so decoding costs one tuple index, not an enum lookup."""


class Frame(msgspec.Struct, frozen=True, gc=False):
    """One decoded frame (immutable; a msgspec Struct because it is built several times faster than a
    frozen dataclass, and decoding builds one per message)."""

    kind: FrameKind
    request_id: int
    payload: bytes


def encode_frame_into(buf: bytearray, kind: int, request_id: int, payload: bytes | bytearray | memoryview) -> None:
    """Append one frame to ``buf`` (the batching path: no intermediate objects).

    ``kind`` must be a :class:`FrameKind` value and ``request_id`` fit in 32 bits; a bad value raises
    FrameError naming it (these are programming errors on the sending side, caught before the wire).
    """
    try:
        buf += FRAME_HEADER.pack(kind, request_id, len(payload))
    except struct.error:
        raise FrameError(
            f"frame kind {kind!r} must be 0..255 and request_id {request_id!r} 0..{MAX_REQUEST_ID}"
        ) from None
    if _KINDS[kind] is None:
        del buf[-FRAME_OVERHEAD:]
        raise FrameError(f"unknown frame kind {kind!r}")
    buf += payload


def encode_frames(frames: Iterable[Frame]) -> bytes:
    """The frames, in order, as one record plaintext."""
    buf = bytearray()
    for frame in frames:
        encode_frame_into(buf, frame.kind, frame.request_id, frame.payload)
    return bytes(buf)


def iter_frames(data: bytes | bytearray | memoryview, *, max_frames: int = 65536) -> Iterator[Frame]:
    """Frames of ``data`` one by one; raises FrameError at the first bad one (earlier ones were yielded).

    Prefer :func:`decode_frames` when a record must be accepted or refused as a whole.
    """
    view = data if isinstance(data, bytes) else bytes(data)  # one copy; payload slices are then plain bytes
    end = len(view)
    offset = 0
    count = 0
    unpack_from = FRAME_HEADER.unpack_from
    kinds = _KINDS
    while offset < end:
        if count >= max_frames:
            raise FrameError(f"more than {max_frames} frames in one record")
        if end - offset < FRAME_OVERHEAD:
            raise FrameError(f"truncated frame header: {end - offset} bytes left at offset {offset}")
        kind_byte, request_id, length = unpack_from(view, offset)
        kind = kinds[kind_byte]
        if kind is None:
            raise FrameError(f"unknown frame kind {kind_byte} at offset {offset}")
        start = offset + FRAME_OVERHEAD
        offset = start + length
        if offset > end:
            raise FrameError(
                f"frame length {length} at offset {start - FRAME_OVERHEAD} exceeds the {end - start} bytes left"
            )
        yield Frame(kind, request_id, view[start:offset])
        count += 1


def decode_frames(data: bytes | bytearray | memoryview, *, max_frames: int = 65536) -> list[Frame]:
    """Every frame of ``data`` (a record's plaintext), or FrameError if any part of it is malformed."""
    view = data if isinstance(data, bytes) else bytes(data)  # one copy; payload slices are then plain bytes
    end = len(view)
    offset = 0
    frames: list[Frame] = []
    append = frames.append
    unpack_from = FRAME_HEADER.unpack_from
    kinds = _KINDS
    while offset < end:
        if len(frames) >= max_frames:
            raise FrameError(f"more than {max_frames} frames in one record")
        if end - offset < FRAME_OVERHEAD:
            raise FrameError(f"truncated frame header: {end - offset} bytes left at offset {offset}")
        kind_byte, request_id, length = unpack_from(view, offset)
        kind = kinds[kind_byte]
        if kind is None:
            raise FrameError(f"unknown frame kind {kind_byte} at offset {offset}")
        start = offset + FRAME_OVERHEAD
        offset = start + length
        if offset > end:
            raise FrameError(
                f"frame length {length} at offset {start - FRAME_OVERHEAD} exceeds the {end - start} bytes left"
            )
        append(Frame(kind, request_id, view[start:offset]))
    return frames
