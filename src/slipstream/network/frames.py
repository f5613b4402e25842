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
from typing import Final, cast

import msgspec

from .errors import FrameError

__all__ = [
    "FRAME_HEADER",
    "FRAME_OVERHEAD",
    "MAX_REQUEST_ID",
    "RMI_REQUEST",
    "RMI_RESPONSE",
    "Frame",
    "FrameKind",
    "decode_frames",
    "encode_frame_into",
    "encode_frames",
    "iter_frames",
    "walk_frames",
]


class FrameKind(IntEnum):
    """What a frame carries: messages and their controls (delivery's acknowledgement and resumption: 8-9),
    then remote objects (16-17) and streams (18-20)."""

    MESSAGE = 1
    SYNC_REQUEST = 2
    SYNC_ACK = 3
    PING = 4
    PONG = 5
    CLOSE = 6
    KEEPALIVE = 7
    DELIVERED = 8
    RESUME = 9
    RMI_REQUEST = 16
    RMI_RESPONSE = 17
    STREAM_START = 18
    STREAM_CHUNK = 19
    STREAM_END = 20


RMI_REQUEST, RMI_RESPONSE = FrameKind.RMI_REQUEST, FrameKind.RMI_RESPONSE
"""The members every remote call reads, as module names: on Python 3.11 reading an attribute of an Enum class goes
through its metaclass's ``__getattr__`` hook (about 80 ns, eight times a global's)."""

FRAME_HEADER: Final = struct.Struct(">BII")
"""kind, request id, payload length."""
FRAME_OVERHEAD: Final = FRAME_HEADER.size
MAX_REQUEST_ID: Final = 0xFFFF_FFFF

_KINDS: Final[tuple[FrameKind | None, ...]] = tuple(
    FrameKind(value) if value in FrameKind._value2member_map_ else None for value in range(256)
)
"""Kind byte -> member (None: unknown), so decoding costs one tuple index, not an enum lookup."""
_KIND_OF: Final = cast("tuple[FrameKind, ...]", _KINDS)
"""The same table typed for bytes :func:`walk_frames` accepted (none of which maps to None)."""
_IS_MESSAGE: Final = tuple(kind in (FrameKind.MESSAGE, FrameKind.SYNC_REQUEST) for kind in range(256))
"""Kind byte -> whether its payload is a message to decode (one tuple index per frame on the fast path)."""
_unpack_header_from: Final = FRAME_HEADER.unpack_from


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


def walk_frames(record: bytes, max_frames: int = 65536) -> list[tuple[int, int, int]]:
    """The ``(kind byte, request_id, payload length)`` of every frame of ``record``, or FrameError.

    The one bounded walk every decoder of records uses: each length is checked against the bytes left
    before anyone slices a payload, the count is capped at ``max_frames``, unknown kinds are refused.
    It returns the headers :mod:`struct` already built rather than frames so that a decoder (such as
    ``Serialization.decode_record``, the receive fast path) can build its own values in a second pass,
    keeping a running offset: payload *i* starts ``FRAME_OVERHEAD`` bytes after payload *i - 1* ends.
    """
    end = len(record)
    offset = 0
    length = 0
    headers: list[tuple[int, int, int]] = []
    kinds = _KINDS
    while offset < end:
        if len(headers) >= max_frames:
            raise FrameError(f"more than {max_frames} frames in one record")
        try:
            kind_byte, _, length = header = _unpack_header_from(record, offset)
        except struct.error:
            raise FrameError(f"truncated frame header: {end - offset} bytes left at offset {offset}") from None
        if kinds[kind_byte] is None:
            raise FrameError(f"unknown frame kind {kind_byte} at offset {offset}")
        offset += FRAME_OVERHEAD + length
        headers.append(header)
    if offset > end:  # only the last frame can overrun: the loop stops at the first that does
        start = offset - length
        raise FrameError(
            f"frame length {length} at offset {start - FRAME_OVERHEAD} exceeds the {end - start} bytes left"
        )
    return headers


def decode_frames(data: bytes | bytearray | memoryview, *, max_frames: int = 65536) -> list[Frame]:
    """Every frame of ``data`` (a record's plaintext), or FrameError if any part of it is malformed."""
    view = data if isinstance(data, bytes) else bytes(data)  # one copy; payload slices are then plain bytes
    kind_of = _KIND_OF
    frames: list[Frame] = []
    stop = 0
    for kind_byte, request_id, length in walk_frames(view, max_frames):
        start = stop + FRAME_OVERHEAD
        stop = start + length
        frames.append(Frame(kind_of[kind_byte], request_id, view[start:stop]))
    return frames


def iter_frames(data: bytes | bytearray | memoryview, *, max_frames: int = 65536) -> Iterator[Frame]:
    """The frames of ``data`` one by one, after the whole record was checked as :func:`decode_frames` does
    (a malformed record raises FrameError at the first ``next``, before any frame)."""
    yield from decode_frames(data, max_frames=max_frames)
