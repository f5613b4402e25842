"""``Header``: a reusable view of the frame header a fragment handler is called with.

One instance per image is repointed at each frame instead of allocating per fragment; fields are
decoded only when asked for, which keeps the poll loop cheap.
"""

from __future__ import annotations

import struct
from typing import Final

from ..wire.constants import (
    BEGIN_FLAG,
    END_FLAG,
    FLAGS_OFFSET,
    RESERVED_VALUE_OFFSET,
    SESSION_ID_OFFSET,
    STREAM_ID_OFFSET,
    TERM_ID_OFFSET,
    TERM_OFFSET_OFFSET,
    TYPE_OFFSET,
)
from ..wire.positions import compute_position

_I32: Final = struct.Struct("<i")
_U16: Final = struct.Struct("<H")
_I64: Final = struct.Struct("<q")


class Header:
    """Header of the frame being delivered; valid only during the handler call."""

    __slots__ = ("bits", "buffer", "initial_term_id", "offset")

    def __init__(self, initial_term_id: int, bits: int) -> None:
        self.initial_term_id = initial_term_id
        self.bits = bits
        self.buffer: memoryview = memoryview(b"")
        self.offset = 0

    @property
    def frame_length(self) -> int:
        """Length of the current frame, header included."""
        return int(_I32.unpack_from(self.buffer, self.offset)[0])

    @property
    def flags(self) -> int:
        """The frame's flags byte (begin, end, end-of-stream bits)."""
        return int(self.buffer[self.offset + FLAGS_OFFSET])

    @property
    def is_begin(self) -> bool:
        """True on the first fragment of a message."""
        return bool(self.buffer[self.offset + FLAGS_OFFSET] & BEGIN_FLAG)

    @property
    def is_end(self) -> bool:
        """True on the last fragment of a message."""
        return bool(self.buffer[self.offset + FLAGS_OFFSET] & END_FLAG)

    @property
    def type(self) -> int:
        """The frame type (data or padding)."""
        return int(_U16.unpack_from(self.buffer, self.offset + TYPE_OFFSET)[0])

    @property
    def term_offset(self) -> int:
        """Offset of the frame in its term."""
        return int(_I32.unpack_from(self.buffer, self.offset + TERM_OFFSET_OFFSET)[0])

    @property
    def session_id(self) -> int:
        """Session id of the publisher that wrote the frame."""
        return int(_I32.unpack_from(self.buffer, self.offset + SESSION_ID_OFFSET)[0])

    @property
    def stream_id(self) -> int:
        """Stream id of the frame."""
        return int(_I32.unpack_from(self.buffer, self.offset + STREAM_ID_OFFSET)[0])

    @property
    def term_id(self) -> int:
        """Term id of the frame's term."""
        return int(_I32.unpack_from(self.buffer, self.offset + TERM_ID_OFFSET)[0])

    @property
    def reserved_value(self) -> int:
        """The 64-bit value the publisher passed to ``offer`` (e.g. a checksum or timestamp)."""
        return int(_I64.unpack_from(self.buffer, self.offset + RESERVED_VALUE_OFFSET)[0])

    @property
    def position(self) -> int:
        """Stream position just after this frame (aligned), as Aeron reports it."""
        end = self.offset + ((self.frame_length + 31) & -32)
        return compute_position(self.term_id, end, self.bits, self.initial_term_id)

    def __repr__(self) -> str:
        return (
            f"Header(session_id={self.session_id}, stream_id={self.stream_id}, term_id={self.term_id}, "
            f"term_offset={self.term_offset}, frame_length={self.frame_length}, flags={self.flags:#x})"
        )
