"""Sans-I/O encode/decode of Aeron wire frames (DATA, PAD, SETUP, SM, NAK, RTTM, ERR, RSP_SETUP).

The codec does no I/O and keeps no state, so the driver, tests and tools share one definition of the
wire format. Decoding treats every datagram as hostile: it raises only :class:`FrameError`, never
reads outside the buffer and never sizes an allocation from a length the peer wrote. Checks that
need context the codec lacks (term length, receiver window, MTU) are left to the driver.

Frame objects are for the control path and tests; hot paths can use the precompiled ``struct``
objects (``DATA_HEADER`` ...) and the :func:`frame_type` / :func:`frame_length` helpers directly.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, fields
from typing import Final, NamedTuple, TypeAlias

from .constants import (
    CURRENT_VERSION,
    DATA_HEADER_LENGTH,
    EOS_FLAG,
    ERR_GROUP_TAG_FLAG,
    ERR_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    FRAME_LENGTH_OFFSET,
    HDR_TYPE_DATA,
    HDR_TYPE_ERR,
    HDR_TYPE_NAK,
    HDR_TYPE_PAD,
    HDR_TYPE_RSP_SETUP,
    HDR_TYPE_RTTM,
    HDR_TYPE_SETUP,
    HDR_TYPE_SM,
    HEADER_LENGTH,
    MAX_ERROR_MESSAGE_LENGTH,
    NAK_LENGTH,
    REVOKED_FLAG,
    RSP_SETUP_LENGTH,
    RTTM_LENGTH,
    SETUP_LENGTH,
    SM_LENGTH,
    SM_WITH_GROUP_TAG_LENGTH,
    TYPE_OFFSET,
    UNFRAGMENTED,
)
from .errors import FrameError
from .positions import align

__all__ = [
    "BytesLike",
    "DataScan",
    "Frame",
    "FRAME_HEADER",
    "DATA_HEADER",
    "SETUP",
    "SM",
    "SM_WITH_GROUP_TAG",
    "NAK",
    "RTTM",
    "ERR_HEADER",
    "RSP_SETUP",
    "DataFrame",
    "PadFrame",
    "SetupFrame",
    "StatusMessage",
    "Nak",
    "RttMeasurement",
    "ErrorFrame",
    "ResponseSetup",
    "frame_type",
    "frame_length",
    "decode_frame",
    "decode_datagram",
    "scan_data_datagram",
    "scan_equal_frames",
]

BytesLike: TypeAlias = bytes | bytearray | memoryview

# Whole-frame layouts, all little-endian and unpadded (8-byte fields may sit at 4-byte offsets).
# Every one starts with the common header: frame_length i32, version u8, flags u8, type u16.
FRAME_HEADER: Final = struct.Struct("<iBBH")
DATA_HEADER: Final = struct.Struct("<iBBHiiiiq")
"""DATA/PAD: term_offset, session_id, stream_id, term_id, reserved_value."""
SETUP: Final = struct.Struct("<iBBHiiiiiiii")
"""term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu, ttl."""
SM: Final = struct.Struct("<iBBHiiiiiq")
"""session_id, stream_id, consumption_term_id, consumption_term_offset, receiver_window, receiver_id."""
SM_WITH_GROUP_TAG: Final = struct.Struct("<iBBHiiiiiqq")
"""As ``SM``, then group_tag (frame_length 44)."""
NAK: Final = struct.Struct("<iBBHiiiii")
"""session_id, stream_id, term_id, term_offset, length."""
RTTM: Final = struct.Struct("<iBBHiiqqq")
"""session_id, stream_id, echo_timestamp, reception_delta, receiver_id."""
ERR_HEADER: Final = struct.Struct("<iBBHiiqqii")
"""session_id, stream_id, receiver_id, group_tag, error_code, error_length; ASCII text follows."""
RSP_SETUP: Final = struct.Struct("<iBBHiii")
"""session_id, stream_id, response_session_id."""

# Bodies after the common header, so decoding does not parse the header twice.
_DATA_BODY: Final = struct.Struct("<iiiiq")
_SETUP_BODY: Final = struct.Struct("<iiiiiiii")
_SM_BODY: Final = struct.Struct("<iiiiiq")
_NAK_BODY: Final = struct.Struct("<iiiii")
_RTTM_BODY: Final = struct.Struct("<iiqqq")
_ERR_BODY: Final = struct.Struct("<iiqqii")
_RSP_SETUP_BODY: Final = struct.Struct("<iii")
_I32: Final = struct.Struct("<i")
_I64: Final = struct.Struct("<q")
_U16: Final = struct.Struct("<H")

assert DATA_HEADER.size == DATA_HEADER_LENGTH
assert SETUP.size == SETUP_LENGTH
assert SM.size == SM_LENGTH
assert SM_WITH_GROUP_TAG.size == SM_WITH_GROUP_TAG_LENGTH
assert NAK.size == NAK_LENGTH
assert RTTM.size == RTTM_LENGTH
assert ERR_HEADER.size == ERR_HEADER_LENGTH
assert RSP_SETUP.size == RSP_SETUP_LENGTH
assert FRAME_HEADER.size == HEADER_LENGTH

_ZEROS: Final = bytes(FRAME_ALIGNMENT)
_ALIGN_MASK: Final = FRAME_ALIGNMENT - 1


@dataclass(slots=True, frozen=True)
class DataFrame:
    """A DATA frame carrying ``payload``, or a heartbeat (``is_heartbeat``: frame_length 0, no payload).

    A heartbeat needs its own marker because an empty message (frame_length 32) also has no payload.
    """

    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    payload: bytes = b""
    flags: int = UNFRAGMENTED
    reserved_value: int = 0
    is_heartbeat: bool = False

    @classmethod
    def heartbeat(
        cls,
        term_offset: int,
        session_id: int,
        stream_id: int,
        term_id: int,
        *,
        eos: bool = False,
        revoked: bool = False,
    ) -> DataFrame:
        """Heartbeat at the sender position: flags 0xC0, 0xE0 with EOS, 0xF0 when revoked."""
        flags = UNFRAGMENTED
        if eos or revoked:
            flags |= EOS_FLAG
        if revoked:
            flags |= REVOKED_FLAG
        return cls(term_offset, session_id, stream_id, term_id, b"", flags, 0, True)

    @property
    def frame_length(self) -> int:
        """The wire ``frame_length``: 0 for a heartbeat, else 32 + payload length (unaligned)."""
        return 0 if self.is_heartbeat else DATA_HEADER_LENGTH + len(self.payload)

    def encode(self) -> bytes:
        """The frame zero-filled to 32-byte alignment, as it is sent (a heartbeat is 32 bytes)."""
        payload = self.payload
        if self.is_heartbeat:
            if payload:
                raise FrameError("a heartbeat carries no payload")
            length = 0
        else:
            length = DATA_HEADER_LENGTH + len(payload)
        header = _pack(
            self,
            DATA_HEADER,
            length,
            CURRENT_VERSION,
            self.flags,
            HDR_TYPE_DATA,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.reserved_value,
        )
        if not payload:
            return header
        return b"".join((header, payload, _ZEROS[: -length & _ALIGN_MASK]))


@dataclass(slots=True, frozen=True)
class PadFrame:
    """PAD: ``frame_length`` bytes of the term carry no message (receivers skip them).

    At a term end ``frame_length`` covers the rest of the term but only the 32-byte header is sent.
    """

    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    frame_length: int
    flags: int = UNFRAGMENTED
    reserved_value: int = 0

    def encode(self) -> bytes:
        """Only the 32-byte header: the padded bytes themselves are never sent."""
        if isinstance(self.frame_length, int) and self.frame_length < DATA_HEADER_LENGTH:
            raise FrameError(f"PAD frame_length must be >= {DATA_HEADER_LENGTH}: {self.frame_length}")
        return _pack(
            self,
            DATA_HEADER,
            self.frame_length,
            CURRENT_VERSION,
            self.flags,
            HDR_TYPE_PAD,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.reserved_value,
        )


@dataclass(slots=True, frozen=True)
class SetupFrame:
    """SETUP: announces a stream so a receiver can create an image at (active_term_id, term_offset)."""

    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu: int
    ttl: int = 0
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            SETUP,
            SETUP_LENGTH,
            CURRENT_VERSION,
            self.flags,
            HDR_TYPE_SETUP,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            self.active_term_id,
            self.term_length,
            self.mtu,
            self.ttl,
        )


@dataclass(slots=True, frozen=True)
class StatusMessage:
    """SM: the receiver's consumption position and window; 44 bytes when ``group_tag`` is set."""

    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int
    group_tag: int | None = None
    flags: int = 0

    def encode(self) -> bytes:
        if self.group_tag is None:
            return _pack(
                self,
                SM,
                SM_LENGTH,
                CURRENT_VERSION,
                self.flags,
                HDR_TYPE_SM,
                self.session_id,
                self.stream_id,
                self.consumption_term_id,
                self.consumption_term_offset,
                self.receiver_window,
                self.receiver_id,
            )
        return _pack(
            self,
            SM_WITH_GROUP_TAG,
            SM_WITH_GROUP_TAG_LENGTH,
            CURRENT_VERSION,
            self.flags,
            HDR_TYPE_SM,
            self.session_id,
            self.stream_id,
            self.consumption_term_id,
            self.consumption_term_offset,
            self.receiver_window,
            self.receiver_id,
            self.group_tag,
        )


@dataclass(slots=True, frozen=True)
class Nak:
    """NAK: asks the sender to retransmit ``length`` bytes at (term_id, term_offset)."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            NAK,
            NAK_LENGTH,
            CURRENT_VERSION,
            self.flags,
            HDR_TYPE_NAK,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.term_offset,
            self.length,
        )


@dataclass(slots=True, frozen=True)
class RttMeasurement:
    """RTTM: round-trip probe; flag 0x80 (REPLY) asks the peer to echo it."""

    session_id: int
    stream_id: int
    echo_timestamp: int
    reception_delta: int
    receiver_id: int
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            RTTM,
            RTTM_LENGTH,
            CURRENT_VERSION,
            self.flags,
            HDR_TYPE_RTTM,
            self.session_id,
            self.stream_id,
            self.echo_timestamp,
            self.reception_delta,
            self.receiver_id,
        )


@dataclass(slots=True, frozen=True)
class ErrorFrame:
    """ERR: a receiver tells the sender it rejected an image (e.g. code 13, IMAGE_REJECTED).

    The group-tag flag (0x08) is carried by ``group_tag is not None``, never by ``flags``, so a frame
    cannot contradict itself. Text is ASCII; on decode, non-ASCII bytes become U+FFFD.
    """

    session_id: int
    stream_id: int
    receiver_id: int
    error_code: int
    error_text: str = ""
    group_tag: int | None = None
    flags: int = 0

    def encode(self) -> bytes:
        """40-byte header plus the text, with frame_length = 40 + error_length."""
        flags = self.flags
        if isinstance(flags, int) and flags & ERR_GROUP_TAG_FLAG:
            raise FrameError("ERR flags must not contain 0x08; set group_tag instead")
        try:
            text = self.error_text.encode("ascii")
        except UnicodeEncodeError:
            raise FrameError("ERR error_text must be ASCII") from None
        if len(text) > MAX_ERROR_MESSAGE_LENGTH:
            raise FrameError(f"ERR error_text longer than {MAX_ERROR_MESSAGE_LENGTH} bytes: {len(text)}")
        group_tag = self.group_tag
        if group_tag is None:
            group_tag = 0
        else:
            flags |= ERR_GROUP_TAG_FLAG
        header = _pack(
            self,
            ERR_HEADER,
            ERR_HEADER_LENGTH + len(text),
            CURRENT_VERSION,
            flags,
            HDR_TYPE_ERR,
            self.session_id,
            self.stream_id,
            self.receiver_id,
            group_tag,
            self.error_code,
            len(text),
        )
        return header + text


@dataclass(slots=True, frozen=True)
class ResponseSetup:
    """RSP_SETUP: tells a response-channel publication which session to respond to."""

    session_id: int
    stream_id: int
    response_session_id: int
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            RSP_SETUP,
            RSP_SETUP_LENGTH,
            CURRENT_VERSION,
            self.flags,
            HDR_TYPE_RSP_SETUP,
            self.session_id,
            self.stream_id,
            self.response_session_id,
        )


Frame: TypeAlias = DataFrame | PadFrame | SetupFrame | StatusMessage | Nak | RttMeasurement | ErrorFrame | ResponseSetup

_I32_RANGE: Final = (-(1 << 31), (1 << 31) - 1)
_I64_RANGE: Final = (-(1 << 63), (1 << 63) - 1)
_FIELD_RANGES: Final[dict[str, tuple[int, int]]] = {
    "flags": (0, 0xFF),
    "reserved_value": _I64_RANGE,
    "receiver_id": _I64_RANGE,
    "group_tag": _I64_RANGE,
    "echo_timestamp": _I64_RANGE,
    "reception_delta": _I64_RANGE,
}


def _pack(frame: Frame, layout: struct.Struct, *values: object) -> bytes:
    """Pack a frame's fields; values ``struct`` refuses become a FrameError naming the bad field."""
    try:
        return layout.pack(*values)
    except struct.error:
        raise _encode_error(frame) from None


def _encode_error(frame: Frame) -> FrameError:
    """Name the offending field; only called once ``struct`` has already refused the values."""
    for field in fields(frame):
        value = getattr(frame, field.name)
        if field.name in ("payload", "error_text", "is_heartbeat") or (field.name == "group_tag" and value is None):
            continue
        low, high = _FIELD_RANGES.get(field.name, _I32_RANGE)
        if not isinstance(value, int):
            return FrameError(f"{type(frame).__name__}.{field.name} must be an int: {value!r}")
        if not low <= value <= high:
            return FrameError(f"{type(frame).__name__}.{field.name} out of range [{low}, {high}]: {value}")
    return FrameError(f"{type(frame).__name__}: frame_length exceeds the i32 range")


# -- hot-path helpers -------------------------------------------------------------------------------


def frame_type(buf: BytesLike, offset: int = 0) -> int:
    """The u16 ``type`` of the frame at ``offset`` (no other validation)."""
    if offset < 0:
        raise FrameError(f"negative offset: {offset}")
    try:
        value: int = _U16.unpack_from(buf, offset + TYPE_OFFSET)[0]
    except struct.error:
        raise FrameError("buffer too short for a frame header") from None
    return value


def frame_length(buf: BytesLike, offset: int = 0) -> int:
    """The raw i32 ``frame_length`` of the frame at ``offset`` (no other validation)."""
    if offset < 0:
        raise FrameError(f"negative offset: {offset}")
    try:
        value: int = _I32.unpack_from(buf, offset + FRAME_LENGTH_OFFSET)[0]
    except struct.error:
        raise FrameError("buffer too short for a frame header") from None
    return value


# -- decoding ---------------------------------------------------------------------------------------


def _byte_view(buf: BytesLike) -> BytesLike:
    """Make ``len`` and slices count bytes, whatever the memoryview's format or shape."""
    if isinstance(buf, memoryview) and (buf.itemsize != 1 or buf.ndim != 1 or not buf.c_contiguous):
        return buf.cast("B") if buf.c_contiguous else memoryview(buf.tobytes())
    return buf


def _decode_data_or_pad(
    buf: BytesLike, offset: int, available: int, length: int, flags: int, ftype: int
) -> tuple[DataFrame | PadFrame, int]:
    if available < DATA_HEADER_LENGTH:
        raise FrameError(f"{available} bytes: shorter than the {DATA_HEADER_LENGTH}-byte DATA/PAD header")
    term_offset, session_id, stream_id, term_id, reserved = _DATA_BODY.unpack_from(buf, offset + HEADER_LENGTH)
    if ftype == HDR_TYPE_DATA:
        if length == 0:
            frame = DataFrame(term_offset, session_id, stream_id, term_id, b"", flags, reserved, True)
            return frame, DATA_HEADER_LENGTH
        if length < DATA_HEADER_LENGTH:
            raise FrameError(f"DATA frame_length {length} is shorter than its header")
        occupied = align(length)
        if occupied > available:
            raise FrameError(f"DATA frame occupies {occupied} bytes but only {available} remain")
        payload = bytes(buf[offset + DATA_HEADER_LENGTH : offset + length])
        return DataFrame(term_offset, session_id, stream_id, term_id, payload, flags, reserved), occupied
    if length < DATA_HEADER_LENGTH:
        raise FrameError(f"PAD frame_length {length} is shorter than its header")
    occupied = align(length)
    if occupied > available:
        occupied = DATA_HEADER_LENGTH  # term-end PAD: only the header is on the wire
    return PadFrame(term_offset, session_id, stream_id, term_id, length, flags, reserved), occupied


def _decode_setup(buf: BytesLike, offset: int, length: int, flags: int) -> Frame:
    (term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu, ttl) = (
        _SETUP_BODY.unpack_from(buf, offset + HEADER_LENGTH)
    )
    return SetupFrame(term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu, ttl, flags)


def _decode_sm(buf: BytesLike, offset: int, length: int, flags: int) -> Frame:
    if length == SM_LENGTH:
        group_tag: int | None = None
    elif length == SM_WITH_GROUP_TAG_LENGTH:
        group_tag = _I64.unpack_from(buf, offset + SM_LENGTH)[0]
    else:
        raise FrameError(f"SM frame_length must be {SM_LENGTH} or {SM_WITH_GROUP_TAG_LENGTH}: {length}")
    session_id, stream_id, term_id, term_offset, window, receiver_id = _SM_BODY.unpack_from(buf, offset + HEADER_LENGTH)
    return StatusMessage(session_id, stream_id, term_id, term_offset, window, receiver_id, group_tag, flags)


def _decode_nak(buf: BytesLike, offset: int, length: int, flags: int) -> Frame:
    session_id, stream_id, term_id, term_offset, nak_length = _NAK_BODY.unpack_from(buf, offset + HEADER_LENGTH)
    return Nak(session_id, stream_id, term_id, term_offset, nak_length, flags)


def _decode_rttm(buf: BytesLike, offset: int, length: int, flags: int) -> Frame:
    session_id, stream_id, echo, delta, receiver_id = _RTTM_BODY.unpack_from(buf, offset + HEADER_LENGTH)
    return RttMeasurement(session_id, stream_id, echo, delta, receiver_id, flags)


def _decode_err(buf: BytesLike, offset: int, length: int, flags: int) -> Frame:
    session_id, stream_id, receiver_id, group_tag, error_code, error_length = _ERR_BODY.unpack_from(
        buf, offset + HEADER_LENGTH
    )
    # The C receiver sends frame_length 40 + 1023 whatever the text length, so allow slack after it.
    if not 0 <= error_length <= min(MAX_ERROR_MESSAGE_LENGTH, length - ERR_HEADER_LENGTH):
        raise FrameError(f"ERR error_length {error_length} inconsistent with frame_length {length}")
    start = offset + ERR_HEADER_LENGTH
    text = bytes(buf[start : start + error_length]).decode("ascii", errors="replace")
    has_tag = flags & ERR_GROUP_TAG_FLAG
    return ErrorFrame(
        session_id,
        stream_id,
        receiver_id,
        error_code,
        text,
        group_tag if has_tag else None,
        flags & ~ERR_GROUP_TAG_FLAG,
    )


def _decode_rsp_setup(buf: BytesLike, offset: int, length: int, flags: int) -> Frame:
    session_id, stream_id, response_session_id = _RSP_SETUP_BODY.unpack_from(buf, offset + HEADER_LENGTH)
    return ResponseSetup(session_id, stream_id, response_session_id, flags)


_CONTROL: Final = {
    HDR_TYPE_SETUP: (SETUP_LENGTH, _decode_setup),
    HDR_TYPE_SM: (SM_LENGTH, _decode_sm),
    HDR_TYPE_NAK: (NAK_LENGTH, _decode_nak),
    HDR_TYPE_RTTM: (RTTM_LENGTH, _decode_rttm),
    HDR_TYPE_ERR: (ERR_HEADER_LENGTH, _decode_err),
    HDR_TYPE_RSP_SETUP: (RSP_SETUP_LENGTH, _decode_rsp_setup),
}


def decode_frame(buf: BytesLike, offset: int = 0) -> tuple[Frame, int]:
    """Decode the frame at ``offset``; return it and the bytes it occupies in ``buf``.

    DATA/PAD occupy their aligned length (32 for a heartbeat, and for a term-end PAD whose
    frame_length runs past the buffer); control frames occupy their frame_length.
    Structural checks only: the datagram-level rules are in :func:`decode_datagram`.
    """
    buf = _byte_view(buf)
    end = len(buf)
    if not 0 <= offset <= end:
        raise FrameError(f"offset {offset} outside a buffer of {end} bytes")
    available = end - offset
    if available < HEADER_LENGTH:
        raise FrameError(f"{available} bytes: shorter than the {HEADER_LENGTH}-byte frame header")
    length, version, flags, ftype = FRAME_HEADER.unpack_from(buf, offset)
    if version != CURRENT_VERSION:
        raise FrameError(f"unsupported version {version}")
    if length < 0:
        raise FrameError(f"negative frame_length {length}")
    if ftype in (HDR_TYPE_DATA, HDR_TYPE_PAD):
        return _decode_data_or_pad(buf, offset, available, length, flags, ftype)
    entry = _CONTROL.get(ftype)
    if entry is None:
        raise FrameError(f"unsupported frame type {ftype:#06x}")
    header_length, decoder = entry
    if available < header_length:
        raise FrameError(f"{available} bytes: shorter than the {header_length}-byte type {ftype} header")
    if not header_length <= length <= available:
        raise FrameError(f"type {ftype} frame_length {length} outside [{header_length}, {available}]")
    return decoder(buf, offset, length, flags), length


class DataScan(NamedTuple):
    """A validated DATA/PAD datagram, without a Python object per frame: what a receiver needs to put
    the datagram into its term in one copy. ``term_length_used`` counts a term-end PAD in full."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    flags: int
    """Flags of the first frame."""
    is_heartbeat: bool
    first_frame_length: int
    term_length_used: int


@functools.lru_cache(maxsize=64)
def _equal_frames_structs(aligned: int, count: int) -> tuple[struct.Struct, struct.Struct]:
    """For ``count`` frames each occupying ``aligned`` bytes: frame_length, version, type, session_id,
    stream_id and term_id of every frame in one unpack, and their term offsets in another (flags,
    reserved values and payloads skipped). Two, so the first compares to one repeated tuple."""
    return (
        struct.Struct("<" + f"iBxH4xiii{aligned - 24}x" * count),
        struct.Struct("<" + f"8xi{aligned - 12}x" * count),
    )


def scan_equal_frames(data: BytesLike) -> DataScan | None:
    """``data`` as one run of DATA frames of a single length, of one stream and term, each starting
    where the previous one ends; None if it is anything else (never raises).

    Nearly all traffic has this shape: one frame filling a datagram (an MTU-sized fragment), a
    datagram of equal messages, or several such datagrams received back to back (a GRO batch,
    which then validates as one run). It is checked without a Python loop over frames.
    """
    buf = _byte_view(data)
    total = len(buf)
    if total < DATA_HEADER_LENGTH or total & _ALIGN_MASK:
        return None
    length, version, flags, ftype, term_offset, session_id, stream_id, term_id, _ = DATA_HEADER.unpack_from(buf)
    if ftype == HDR_TYPE_DATA and version == CURRENT_VERSION and length >= DATA_HEADER_LENGTH:
        aligned = (length + _ALIGN_MASK) & ~_ALIGN_MASK
        if aligned == total or (
            aligned < total
            and total % aligned == 0
            and _equal_frames(buf, length, aligned, total, term_offset, session_id, stream_id, term_id)
        ):
            return DataScan(session_id, stream_id, term_id, term_offset, flags, False, length, total)
    return None


def scan_data_datagram(data: BytesLike) -> DataScan:
    """Validate a DATA/PAD datagram with the receiver's rules (see :func:`decode_datagram`).

    The common shapes take :func:`scan_equal_frames`; anything else the frame-by-frame walk, which
    names the fault.
    """
    scan = scan_equal_frames(data)
    if scan is not None:
        return scan
    buf = _byte_view(data)
    total = len(buf)
    if total < DATA_HEADER_LENGTH or total & _ALIGN_MASK:
        raise FrameError(f"DATA/PAD datagram of {total} bytes is not a positive multiple of 32")
    _, _, _, _, term_offset, session_id, stream_id, term_id, _ = DATA_HEADER.unpack_from(buf)
    return _walk_data_datagram(buf, total, term_offset, session_id, stream_id, term_id)


def _equal_frames(
    buf: BytesLike,
    length: int,
    aligned: int,
    total: int,
    term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
) -> bool:
    """True if every frame is a DATA frame of ``length`` bytes of this stream and term, each starting
    where the previous one ends (frames of other lengths take the walk)."""
    count = total // aligned
    headers, offsets = _equal_frames_structs(aligned, count)
    return headers.unpack_from(buf) == (
        length,
        CURRENT_VERSION,
        HDR_TYPE_DATA,
        session_id,
        stream_id,
        term_id,
    ) * count and offsets.unpack_from(buf) == tuple(range(term_offset, term_offset + total, aligned))


def _walk_data_datagram(
    buf: BytesLike, total: int, term_offset: int, session_id: int, stream_id: int, term_id: int
) -> DataScan:
    first: tuple[int, int] | None = None
    used_in_term = 0
    offset = 0
    heartbeat = False
    while offset < total:
        length, version, flags, ftype = FRAME_HEADER.unpack_from(buf, offset)
        if version != CURRENT_VERSION:
            raise FrameError(f"unsupported version {version}")
        if length < 0:
            raise FrameError(f"negative frame_length {length}")
        if ftype != HDR_TYPE_DATA and ftype != HDR_TYPE_PAD:
            raise FrameError(f"frame type {ftype:#06x} inside a DATA/PAD datagram")
        if offset:
            f_offset, f_session, f_stream, f_term, _ = _DATA_BODY.unpack_from(buf, offset + HEADER_LENGTH)
            if f_session != session_id or f_stream != stream_id or f_term != term_id:
                raise FrameError("frames of one datagram must share session, stream and term")
            if f_offset != term_offset + used_in_term:
                raise FrameError(f"term_offset {f_offset} not continuous with the previous frame")
        else:
            first = (length, flags)
        occupied = (length + _ALIGN_MASK) & ~_ALIGN_MASK
        if ftype == HDR_TYPE_DATA:
            if length == 0:
                if total != DATA_HEADER_LENGTH:
                    raise FrameError("a heartbeat must be alone in a 32-byte datagram")
                heartbeat = True
                occupied = wire = DATA_HEADER_LENGTH
            elif length < DATA_HEADER_LENGTH:
                raise FrameError(f"DATA frame_length {length} is shorter than its header")
            elif occupied > total - offset:
                raise FrameError(f"DATA frame occupies {occupied} bytes but only {total - offset} remain")
            else:
                wire = occupied
        else:
            if length < DATA_HEADER_LENGTH:
                raise FrameError(f"PAD frame_length {length} is shorter than its header")
            wire = occupied
            if occupied > total - offset:
                wire = DATA_HEADER_LENGTH  # term-end PAD: only the header is on the wire
                if offset + wire != total:
                    raise FrameError("a term-end PAD must be the last frame of a datagram")
        used_in_term += occupied
        offset += wire
    assert first is not None
    return DataScan(session_id, stream_id, term_id, term_offset, first[1], heartbeat, first[0], used_in_term)


def decode_datagram(buf: BytesLike) -> list[Frame]:
    """Decode one received datagram, applying the receiver's validity rules.

    A control datagram yields its one frame (bytes after its frame_length are ignored, as the C
    driver does). A DATA/PAD datagram must be a multiple of 32 bytes of frames that are contiguous
    in the same term of the same session and stream, with no trailing bytes; a heartbeat must be
    alone in a 32-byte datagram and a term-end PAD must be the last frame.
    """
    buf = _byte_view(buf)
    total = len(buf)
    if total < HEADER_LENGTH:
        raise FrameError(f"datagram of {total} bytes is shorter than a frame header")
    ftype = _U16.unpack_from(buf, TYPE_OFFSET)[0]
    if ftype not in (HDR_TYPE_DATA, HDR_TYPE_PAD):
        return [decode_frame(buf, 0)[0]]
    scan_data_datagram(buf)  # the datagram's rules; then each frame, now known to be well formed
    frames: list[Frame] = []
    offset = 0
    while offset < total:
        length, _, flags, ftype = FRAME_HEADER.unpack_from(buf, offset)
        frame, wire = _decode_data_or_pad(buf, offset, total - offset, length, flags, ftype)
        frames.append(frame)
        offset += wire
    return frames
