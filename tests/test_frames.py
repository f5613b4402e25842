"""Tests for the Aeron frame codec: byte-exact vectors from the wire reference, then properties."""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slipstream.wire import constants as c
from slipstream.wire.errors import FrameError
from slipstream.wire.frames import (
    DATA_HEADER,
    ERR_HEADER,
    FRAME_HEADER,
    NAK,
    RSP_SETUP,
    RTTM,
    SETUP,
    SM,
    SM_WITH_GROUP_TAG,
    BytesLike,
    DataFrame,
    ErrorFrame,
    Frame,
    Nak,
    PadFrame,
    ResponseSetup,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_datagram,
    decode_frame,
    frame_length,
    frame_type,
)

# Byte builders independent of the module's struct objects, so the vectors check the layout itself.


def i32(value: int) -> bytes:
    return value.to_bytes(4, "little", signed=True)


def i64(value: int) -> bytes:
    return value.to_bytes(8, "little", signed=True)


def u16(value: int) -> bytes:
    return value.to_bytes(2, "little")


def header(length: int, flags: int, ftype: int, version: int = 0) -> bytes:
    return i32(length) + bytes([version, flags]) + u16(ftype)


def data_bytes(
    term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
    payload: bytes = b"",
    *,
    flags: int = 0xC0,
    length: int | None = None,
    ftype: int = 0x01,
) -> bytes:
    """A DATA/PAD frame as sent: header, payload, zero fill to 32-byte alignment."""
    if length is None:
        length = 32 + len(payload)
    raw = header(length, flags, ftype) + i32(term_offset) + i32(session_id) + i32(stream_id)
    raw += i32(term_id) + i64(0) + payload
    return raw + bytes(-len(raw) % 32)


SESSION = 84968302
STREAM = 1001
TERM = -1234567


# -- layout vectors ---------------------------------------------------------------------------------


def test_struct_sizes_match_reference_lengths() -> None:
    assert FRAME_HEADER.size == 8
    assert DATA_HEADER.size == 32
    assert SETUP.size == 40
    assert SM.size == 36
    assert SM_WITH_GROUP_TAG.size == 44
    assert NAK.size == 28
    assert RTTM.size == 40
    assert ERR_HEADER.size == 40
    assert RSP_SETUP.size == 20


def test_data_14_byte_payload_gives_frame_length_46_and_64_byte_datagram() -> None:
    payload = b"Hello World! 0"
    assert len(payload) == 14
    frame = DataFrame(term_offset=320, session_id=SESSION, stream_id=STREAM, term_id=TERM, payload=payload)
    expected = (
        b"\x2e\x00\x00\x00"  # frame_length 46
        + b"\x00"  # version
        + b"\xc0"  # flags BEGIN|END
        + b"\x01\x00"  # type DATA
        + i32(320)
        + i32(SESSION)
        + i32(STREAM)
        + i32(TERM)
        + bytes(8)  # reserved_value
        + payload
        + bytes(18)  # zero fill to 64
    )
    encoded = frame.encode()
    assert encoded == expected
    assert len(encoded) == 64
    assert frame.frame_length == 46
    assert frame_length(encoded) == 46
    assert frame_type(encoded) == c.HDR_TYPE_DATA
    assert decode_frame(encoded) == (frame, 64)
    assert decode_datagram(encoded) == [frame]


@pytest.mark.parametrize(
    ("eos", "revoked", "flags"),
    [(False, False, 0xC0), (True, False, 0xE0), (False, True, 0xF0), (True, True, 0xF0)],
)
def test_heartbeat_forms(eos: bool, revoked: bool, flags: int) -> None:
    frame = DataFrame.heartbeat(4096, SESSION, STREAM, TERM, eos=eos, revoked=revoked)
    expected = header(0, flags, 0x01) + i32(4096) + i32(SESSION) + i32(STREAM) + i32(TERM) + bytes(8)
    assert frame.encode() == expected
    assert len(expected) == 32
    assert frame.is_heartbeat
    assert frame.frame_length == 0
    assert decode_datagram(expected) == [frame]
    assert decode_frame(expected) == (frame, 32)


def test_empty_message_is_not_a_heartbeat() -> None:
    frame = DataFrame(0, SESSION, STREAM, TERM)
    encoded = frame.encode()
    assert encoded == data_bytes(0, SESSION, STREAM, TERM)
    assert frame_length(encoded) == 32
    (decoded,) = decode_datagram(encoded)
    assert isinstance(decoded, DataFrame)
    assert not decoded.is_heartbeat
    assert decoded == frame


def test_reserved_value_and_flags_are_carried() -> None:
    frame = DataFrame(64, 1, 2, 3, b"x", flags=c.BEGIN_FLAG, reserved_value=-(2**63))
    encoded = frame.encode()
    assert encoded[5] == 0x80
    assert encoded[24:32] == i64(-(2**63))
    assert decode_frame(encoded) == (frame, 64)


def test_setup_layout() -> None:
    frame = SetupFrame(
        term_offset=1024,
        session_id=SESSION,
        stream_id=STREAM,
        initial_term_id=TERM,
        active_term_id=TERM + 2,
        term_length=16 * 1024 * 1024,
        mtu=1408,
        ttl=0,
        flags=c.SETUP_GROUP_FLAG,
    )
    expected = (
        header(40, 0x40, 0x05)
        + i32(1024)
        + i32(SESSION)
        + i32(STREAM)
        + i32(TERM)
        + i32(TERM + 2)
        + i32(16 * 1024 * 1024)
        + i32(1408)
        + i32(0)
    )
    assert frame.encode() == expected
    assert decode_frame(expected) == (frame, 40)
    assert decode_datagram(expected) == [frame]


def test_status_message_receiver_id_at_offset_28() -> None:
    receiver_id = 0x0102030405060708
    frame = StatusMessage(SESSION, STREAM, TERM, 2048, 128 * 1024, receiver_id)
    encoded = frame.encode()
    assert len(encoded) == 36
    assert encoded == (
        header(36, 0, 0x03) + i32(SESSION) + i32(STREAM) + i32(TERM) + i32(2048) + i32(128 * 1024) + i64(receiver_id)
    )
    assert encoded[28:36] == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    assert decode_datagram(encoded) == [frame]


def test_status_message_with_group_tag_is_44_bytes() -> None:
    frame = StatusMessage(SESSION, STREAM, TERM, 0, 65536, -5, group_tag=-7, flags=c.SM_EOS_FLAG)
    encoded = frame.encode()
    assert len(encoded) == 44
    assert encoded[:8] == header(44, 0x40, 0x03)
    assert encoded[28:36] == i64(-5)
    assert encoded[36:44] == i64(-7)
    assert decode_frame(encoded) == (frame, 44)


def test_setup_elicitation_status_message() -> None:
    """The SM a late joiner sends to ask for SETUP: flags 0x80, position and window zero."""
    frame = StatusMessage(SESSION, STREAM, 0, 0, 0, 99, flags=c.SM_SEND_SETUP_FLAG)
    assert frame.encode() == header(36, 0x80, 0x03) + i32(SESSION) + i32(STREAM) + bytes(12) + i64(99)


def test_nak_layout() -> None:
    frame = Nak(SESSION, STREAM, TERM, 4096, 1408)
    expected = header(28, 0, 0x02) + i32(SESSION) + i32(STREAM) + i32(TERM) + i32(4096) + i32(1408)
    assert frame.encode() == expected
    assert decode_datagram(expected) == [frame]


def test_rttm_layout() -> None:
    frame = RttMeasurement(SESSION, STREAM, 123456789012, -1, 77, flags=c.RTTM_REPLY_FLAG)
    expected = header(40, 0x80, 0x06) + i32(SESSION) + i32(STREAM) + i64(123456789012) + i64(-1) + i64(77)
    assert frame.encode() == expected
    assert decode_datagram(expected) == [frame]


def test_err_layout() -> None:
    frame = ErrorFrame(SESSION, STREAM, 77, c.ERROR_CODE_IMAGE_REJECTED, "rejected")
    expected = header(48, 0, 0x04) + i32(SESSION) + i32(STREAM) + i64(77) + i64(0) + i32(13) + i32(8) + b"rejected"
    assert frame.encode() == expected
    assert decode_datagram(expected) == [frame]


def test_err_group_tag_sets_flag_0x08() -> None:
    frame = ErrorFrame(SESSION, STREAM, 77, 13, "no", group_tag=42)
    encoded = frame.encode()
    assert encoded[5] == 0x08
    assert encoded[24:32] == i64(42)
    assert decode_frame(encoded) == (frame, 42)
    # Without the flag the group_tag field is ignored.
    untagged = encoded[:5] + b"\x00" + encoded[6:]
    decoded, _ = decode_frame(untagged)
    assert isinstance(decoded, ErrorFrame)
    assert decoded.group_tag is None


def test_err_as_sent_by_the_c_receiver() -> None:
    """The C receiver sends frame_length 40 + 1023 whatever the text length; the tail is junk."""
    raw = (
        header(1063, 0, 0x04)
        + i32(SESSION)
        + i32(STREAM)
        + i64(5)
        + i64(0)
        + i32(13)
        + i32(5)
        + b"nope!"
        + b"\xaa" * 1018
    )
    assert len(raw) == 1063
    frame, used = decode_frame(raw)
    assert used == 1063
    assert frame == ErrorFrame(SESSION, STREAM, 5, 13, "nope!")


def test_err_non_ascii_text_is_replaced_not_rejected() -> None:
    raw = header(42, 0, 0x04) + i32(1) + i32(2) + i64(3) + i64(0) + i32(13) + i32(2) + b"\xff\x41"
    (frame,) = decode_datagram(raw)
    assert isinstance(frame, ErrorFrame)
    assert frame.error_text == "\ufffdA"


def test_rsp_setup_layout() -> None:
    frame = ResponseSetup(SESSION, STREAM, -3)
    expected = header(20, 0, 0x0B) + i32(SESSION) + i32(STREAM) + i32(-3)
    assert frame.encode() == expected
    assert decode_datagram(expected) == [frame]


def test_term_end_pad_alone() -> None:
    """Only the 32-byte header is sent; frame_length covers the rest of the term."""
    frame = PadFrame(65536 - 4096, SESSION, STREAM, TERM, 4096)
    encoded = frame.encode()
    assert encoded == data_bytes(65536 - 4096, SESSION, STREAM, TERM, length=4096, ftype=0x00)
    assert len(encoded) == 32
    assert frame_length(encoded) == 4096
    assert decode_frame(encoded) == (frame, 32)
    assert decode_datagram(encoded) == [frame]


def test_term_end_pad_after_data() -> None:
    raw = data_bytes(65536 - 128, SESSION, STREAM, TERM, b"Hello World! 0")
    raw += data_bytes(65536 - 64, SESSION, STREAM, TERM, length=64, ftype=0x00)
    assert len(raw) == 96
    assert decode_datagram(raw) == [
        DataFrame(65536 - 128, SESSION, STREAM, TERM, b"Hello World! 0"),
        PadFrame(65536 - 64, SESSION, STREAM, TERM, 64),
    ]


def test_pad_sent_in_full_occupies_its_aligned_length() -> None:
    raw = data_bytes(0, SESSION, STREAM, TERM, length=40, ftype=0x00)  # header only ...
    raw += bytes(32)  # ... plus its body
    raw += data_bytes(64, SESSION, STREAM, TERM, b"abc")
    assert decode_frame(raw) == (PadFrame(0, SESSION, STREAM, TERM, 40), 64)
    assert decode_datagram(raw) == [
        PadFrame(0, SESSION, STREAM, TERM, 40),
        DataFrame(64, SESSION, STREAM, TERM, b"abc"),
    ]


def test_multi_frame_datagram() -> None:
    raw = data_bytes(0, SESSION, STREAM, TERM, b"a" * 14, flags=0x80)
    raw += data_bytes(64, SESSION, STREAM, TERM, b"b" * 32, flags=0x00)
    raw += data_bytes(128, SESSION, STREAM, TERM, b"", flags=0x40)
    assert decode_datagram(raw) == [
        DataFrame(0, SESSION, STREAM, TERM, b"a" * 14, flags=0x80),
        DataFrame(64, SESSION, STREAM, TERM, b"b" * 32, flags=0x00),
        DataFrame(128, SESSION, STREAM, TERM, b"", flags=0x40),
    ]
    assert decode_frame(raw, 64) == (DataFrame(64, SESSION, STREAM, TERM, b"b" * 32, flags=0x00), 64)


def test_decode_accepts_bytearray_and_memoryviews() -> None:
    raw = data_bytes(0, SESSION, STREAM, TERM, b"Hello World! 0")
    expected = [DataFrame(0, SESSION, STREAM, TERM, b"Hello World! 0")]
    assert decode_datagram(bytearray(raw)) == expected
    assert decode_datagram(memoryview(raw)) == expected
    words = array.array("i")
    words.frombytes(raw)
    assert decode_datagram(memoryview(words)) == expected  # itemsize 4
    doubled = bytes(b for byte in raw for b in (byte, 0xEE))
    assert decode_datagram(memoryview(doubled)[::2]) == expected  # not contiguous
    # A view never exposes the bytes behind it.
    bigger = bytearray(raw + data_bytes(64, SESSION, STREAM, TERM, b"more"))
    assert decode_datagram(memoryview(bigger)[:64]) == expected


# -- rejections -------------------------------------------------------------------------------------

GOOD_DATA = data_bytes(0, SESSION, STREAM, TERM, b"Hello World! 0")
GOOD_SM = StatusMessage(SESSION, STREAM, TERM, 0, 65536, 1).encode()


def _err(length: int, error_length: int, text: bytes) -> bytes:
    return header(length, 0, 0x04) + i32(1) + i32(2) + i64(3) + i64(0) + i32(13) + i32(error_length) + text


BAD_DATAGRAMS: dict[str, bytes] = {
    "empty": b"",
    "shorter than common header": GOOD_SM[:7],
    "version 1": GOOD_SM[:4] + b"\x01" + GOOD_SM[5:],
    "negative frame_length": i32(-36) + GOOD_SM[4:],
    "DATA datagram below 32": GOOD_DATA[:16],
    "DATA datagram not a multiple of 32": GOOD_DATA[:46],
    "DATA frame_length below header": i32(20) + GOOD_DATA[4:],
    "DATA frame beyond datagram": i32(80) + GOOD_DATA[4:],
    "DATA frame_length huge": i32(2**31 - 1) + GOOD_DATA[4:32],
    "PAD frame_length below header": data_bytes(0, 1, 2, 3, length=0, ftype=0x00),
    "trailing zero bytes": GOOD_DATA + bytes(32),
    "discontinuous term_offset": GOOD_DATA + data_bytes(96, SESSION, STREAM, TERM, b"x"),
    "other session": GOOD_DATA + data_bytes(64, SESSION + 1, STREAM, TERM, b"x"),
    "other stream": GOOD_DATA + data_bytes(64, SESSION, STREAM + 1, TERM, b"x"),
    "other term": GOOD_DATA + data_bytes(64, SESSION, STREAM, TERM + 1, b"x"),
    "heartbeat then data": DataFrame.heartbeat(0, SESSION, STREAM, TERM).encode()
    + data_bytes(0, SESSION, STREAM, TERM, b"x"),
    "data then heartbeat": GOOD_DATA + DataFrame.heartbeat(64, SESSION, STREAM, TERM).encode(),
    "term-end PAD not last": data_bytes(0, SESSION, STREAM, TERM, length=4096, ftype=0x00)
    + data_bytes(32, SESSION, STREAM, TERM, b"x"),
    "control frame inside DATA datagram": GOOD_DATA + Nak(1, 2, 3, 4, 5).encode() + bytes(4),
    "SM frame_length 40": header(40, 0, 0x03) + GOOD_SM[8:] + i32(0),
    "SM frame_length 44 in 36 bytes": i32(44) + GOOD_SM[4:],
    "SM truncated": GOOD_SM[:35],
    "NAK frame_length 0": header(0, 0, 0x02) + Nak(1, 2, 3, 4, 5).encode()[8:],
    "NAK frame_length beyond datagram": header(32, 0, 0x02) + Nak(1, 2, 3, 4, 5).encode()[8:],
    "SETUP truncated": SetupFrame(0, 1, 2, 3, 3, 65536, 1408).encode()[:39],
    "RTTM truncated": RttMeasurement(1, 2, 3, 4, 5).encode()[:32],
    "RSP_SETUP truncated": ResponseSetup(1, 2, 3).encode()[:16],
    "ERR error_length 1024": _err(1064, 1024, b"a" * 1024),
    "ERR error_length beyond frame_length": _err(45, 6, b"abcde"),
    "ERR negative error_length": _err(40, -1, b""),
    "ERR error_length huge": _err(40, 2**31 - 1, b""),
    "type RES": header(32, 0, 0x07) + bytes(24),
    "type ATS": header(32, 0, 0x09) + bytes(24),
    "type 0x0C": header(32, 0, 0x0C) + bytes(24),
    "type EXT": header(32, 0, 0xFFFF) + bytes(24),
}


@pytest.mark.parametrize("raw", list(BAD_DATAGRAMS.values()), ids=list(BAD_DATAGRAMS))
def test_invalid_datagrams_raise_frame_error(raw: bytes) -> None:
    with pytest.raises(FrameError):
        decode_datagram(raw)


def test_frame_error_is_a_value_error() -> None:
    assert issubclass(FrameError, ValueError)


def test_decode_frame_offset_bounds() -> None:
    with pytest.raises(FrameError):
        decode_frame(GOOD_DATA, -1)
    with pytest.raises(FrameError):
        decode_frame(GOOD_DATA, 65)
    with pytest.raises(FrameError):
        decode_frame(GOOD_DATA, 64)
    with pytest.raises(FrameError):
        decode_frame(GOOD_DATA, 60)


def test_helpers_reject_short_buffers_and_negative_offsets() -> None:
    assert frame_type(GOOD_SM) == c.HDR_TYPE_SM
    assert frame_length(GOOD_SM) == 36
    assert frame_type(b"\x00" * 8 + GOOD_SM, 8) == c.HDR_TYPE_SM
    for helper in (frame_type, frame_length):
        with pytest.raises(FrameError):
            helper(b"\x00" * 3)
        with pytest.raises(FrameError):
            helper(GOOD_SM, 33)
        with pytest.raises(FrameError):
            helper(GOOD_SM, -8)


BAD_FRAMES: dict[str, tuple[Any, str]] = {
    "term_offset i32 overflow": (DataFrame(2**31, 1, 2, 3), "term_offset"),
    "session_id i32 underflow": (DataFrame(0, -(2**31) - 1, 2, 3), "session_id"),
    "flags above u8": (DataFrame(0, 1, 2, 3, flags=256), "flags"),
    "negative flags": (Nak(1, 2, 3, 4, 5, flags=-1), "flags"),
    "reserved_value i64 overflow": (DataFrame(0, 1, 2, 3, reserved_value=2**63), "reserved_value"),
    "heartbeat with payload": (DataFrame(0, 1, 2, 3, b"x", is_heartbeat=True), "heartbeat"),
    "non-int field": (SetupFrame(0, 1, 2, 3, 3, 65536, 1.5), "mtu"),  # type: ignore[arg-type]
    "PAD shorter than header": (PadFrame(0, 1, 2, 3, 31), "frame_length"),
    "PAD frame_length overflow": (PadFrame(0, 1, 2, 3, 2**31), "frame_length"),
    "SETUP mtu overflow": (SetupFrame(0, 1, 2, 3, 3, 65536, 2**31), "mtu"),
    "SM receiver_id overflow": (StatusMessage(1, 2, 3, 4, 5, 2**63), "receiver_id"),
    "SM group_tag underflow": (StatusMessage(1, 2, 3, 4, 5, 6, group_tag=-(2**63) - 1), "group_tag"),
    "NAK length overflow": (Nak(1, 2, 3, 4, 2**32), "length"),
    "RTTM echo_timestamp overflow": (RttMeasurement(1, 2, 2**64, 0, 0), "echo_timestamp"),
    "ERR text too long": (ErrorFrame(1, 2, 3, 13, "a" * 1024), "1023"),
    "ERR text not ASCII": (ErrorFrame(1, 2, 3, 13, "caf\u00e9"), "ASCII"),
    "ERR group flag in flags": (ErrorFrame(1, 2, 3, 13, flags=0x08), "group_tag"),
    "ERR error_code overflow": (ErrorFrame(1, 2, 3, 2**31), "error_code"),
    "RSP_SETUP flags": (ResponseSetup(1, 2, 3, flags=300), "flags"),
}


@pytest.mark.parametrize(("frame", "hint"), list(BAD_FRAMES.values()), ids=list(BAD_FRAMES))
def test_encode_rejects_out_of_range_fields(frame: Any, hint: str) -> None:
    with pytest.raises(ValueError, match=hint) as info:
        frame.encode()
    assert isinstance(info.value, FrameError)


def test_err_text_of_1023_bytes_is_accepted() -> None:
    frame = ErrorFrame(1, 2, 3, 13, "z" * 1023)
    encoded = frame.encode()
    assert len(encoded) == 1063
    assert decode_datagram(encoded) == [frame]


# -- properties -------------------------------------------------------------------------------------

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
U8 = st.integers(0, 255)

data_frames = st.builds(DataFrame, I32, I32, I32, I32, st.binary(max_size=160), U8, I64)
heartbeats = st.builds(DataFrame, I32, I32, I32, I32, st.just(b""), U8, I64, is_heartbeat=st.just(True)) | st.builds(
    DataFrame.heartbeat, I32, I32, I32, I32, eos=st.booleans(), revoked=st.booleans()
)
pad_frames = st.builds(PadFrame, I32, I32, I32, I32, st.integers(32, 2**31 - 1), U8, I64)
setup_frames = st.builds(SetupFrame, I32, I32, I32, I32, I32, I32, I32, I32, U8)
status_messages = st.builds(StatusMessage, I32, I32, I32, I32, I32, I64, st.none() | I64, U8)
naks = st.builds(Nak, I32, I32, I32, I32, I32, U8)
rttms = st.builds(RttMeasurement, I32, I32, I64, I64, I64, U8)
error_frames = st.builds(
    ErrorFrame,
    I32,
    I32,
    I64,
    I32,
    st.text(st.characters(max_codepoint=127), max_size=1023),
    st.none() | I64,
    U8.map(lambda flags: flags & ~c.ERR_GROUP_TAG_FLAG),
)
response_setups = st.builds(ResponseSetup, I32, I32, I32, U8)

any_frame: st.SearchStrategy[Frame] = st.one_of(
    data_frames,
    heartbeats,
    pad_frames,
    setup_frames,
    status_messages,
    naks,
    rttms,
    error_frames,
    response_setups,
)


@st.composite
def data_datagrams(draw: st.DrawFn) -> tuple[list[Frame], bytes]:
    """Several contiguous frames of one term, optionally closed by a term-end PAD."""
    session_id, stream_id, term_id = draw(I32), draw(I32), draw(I32)
    term_offset = draw(st.integers(0, 2**30)) & ~31
    frames: list[Frame] = []
    for payload in draw(st.lists(st.binary(max_size=100), min_size=1, max_size=6)):
        frame = DataFrame(term_offset, session_id, stream_id, term_id, payload, draw(U8), draw(I64))
        frames.append(frame)
        term_offset += len(frame.encode())
    pad_length = draw(st.none() | st.integers(33, 2**24))
    if pad_length is not None:
        frames.append(PadFrame(term_offset, session_id, stream_id, term_id, pad_length, draw(U8)))
    return frames, b"".join(frame.encode() for frame in frames)


def outcome(decode: Callable[[BytesLike], object], raw: BytesLike) -> object:
    """The decoded value or the FrameError marker; any other exception fails the test."""
    try:
        return decode(raw)
    except FrameError:
        return FrameError


def check_decoded(frames: list[Frame]) -> None:
    """Whatever decodes must re-encode and decode to itself (ERR text may hold U+FFFD)."""
    for frame in frames:
        if isinstance(frame, ErrorFrame) and not frame.error_text.isascii():
            continue
        assert decode_frame(frame.encode())[0] == frame


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(any_frame)
def test_round_trip_every_type(frame: Frame) -> None:
    encoded = frame.encode()
    assert decode_frame(encoded) == (frame, len(encoded))
    assert decode_datagram(encoded) == [frame]
    assert frame_type(encoded) == encoded[6] | encoded[7] << 8


@FAST
@given(data_frames)
def test_data_encoding_is_aligned_and_zero_filled(frame: DataFrame) -> None:
    encoded = frame.encode()
    assert len(encoded) % 32 == 0
    assert len(encoded) - frame.frame_length < 32
    assert frame_length(encoded) == frame.frame_length
    assert encoded[frame.frame_length :] == bytes(len(encoded) - frame.frame_length)


@FAST
@given(data_datagrams())
def test_multi_frame_datagrams_round_trip(case: tuple[list[Frame], bytes]) -> None:
    frames, raw = case
    assert decode_datagram(raw) == frames


@FAST
@given(st.binary(max_size=160), st.data())
def test_random_bytes_decode_or_frame_error(raw: bytes, data: st.DataObject) -> None:
    result = outcome(decode_datagram, raw)
    if result is not FrameError:
        assert isinstance(result, list)
        check_decoded(result)
    offset = data.draw(st.integers(0, len(raw)))
    outcome(lambda buf: decode_frame(buf, offset), raw)


def _valid_encodings() -> st.SearchStrategy[bytes]:
    return any_frame.map(lambda frame: frame.encode()) | data_datagrams().map(lambda case: case[1])


@FAST
@given(_valid_encodings(), st.data())
def test_mutated_encodings_decode_or_frame_error(raw: bytes, data: st.DataObject) -> None:
    mutated = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        bit = data.draw(st.integers(0, len(mutated) * 8 - 1))
        mutated[bit // 8] ^= 1 << (bit % 8)
    cut = data.draw(st.integers(0, len(mutated)))
    tail = data.draw(st.binary(max_size=40))
    for candidate in (bytes(mutated), bytes(mutated[:cut]), bytes(mutated) + tail, raw[:cut]):
        result = outcome(decode_datagram, candidate)
        if result is not FrameError:
            assert isinstance(result, list)
            check_decoded(result)
        outcome(decode_frame, candidate)


@FAST
@given(_valid_encodings() | st.binary(max_size=120), st.data())
def test_decoding_never_reads_past_the_view(raw: bytes, data: st.DataObject) -> None:
    """Decoding a prefix view of a larger buffer behaves exactly like decoding the prefix bytes."""
    cut = data.draw(st.integers(0, len(raw)))
    junk = data.draw(st.binary(min_size=1, max_size=64))
    view = memoryview(raw + junk)[: len(raw)]
    assert outcome(decode_datagram, view) == outcome(decode_datagram, raw)
    prefix = memoryview(raw + junk)[:cut]
    assert outcome(decode_datagram, prefix) == outcome(decode_datagram, raw[:cut])


def _equal_frame_datagrams() -> st.SearchStrategy[bytes]:
    """Batches of DATA frames occupying the same aligned size: the receiver's fast path."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        payload = draw(st.integers(0, 200))
        count = draw(st.integers(1, 12))
        aligned = (32 + payload + 31) & ~31
        start = draw(st.integers(0, 1000)) * 32
        session, stream, term = draw(st.integers(-(2**31), 2**31 - 1)), draw(st.integers(1, 9)), draw(st.integers(0, 5))
        frames = []
        for index in range(count):
            size = draw(st.integers(max(0, aligned - 63), aligned - 32)) if index else payload  # same aligned size
            flags = draw(st.sampled_from([0x80, 0x40, 0xC0, 0]))
            frames.append(DataFrame(start + index * aligned, session, stream, term, b"p" * size, flags).encode())
            assert len(frames[-1]) == aligned
        return b"".join(frames)

    return build()


@FAST
@given(_equal_frame_datagrams(), st.data())
def test_fast_datagram_scan_agrees_with_the_frame_walk(raw: bytes, data: st.DataObject) -> None:
    """The receiver's shortcut for equal frames accepts exactly what the frame-by-frame rules accept."""
    from slipstream.wire.frames import DATA_HEADER as HEADER
    from slipstream.wire.frames import _walk_data_datagram, scan_data_datagram

    mutated = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 3))):
        bit = data.draw(st.integers(0, len(mutated) * 8 - 1))
        mutated[bit // 8] ^= 1 << (bit % 8)
    candidate = bytes(mutated)
    fields = HEADER.unpack_from(candidate)
    walked = outcome(lambda b: _walk_data_datagram(memoryview(b), len(b), fields[4], fields[5], fields[6], fields[7]),
                     candidate)
    assert outcome(scan_data_datagram, candidate) == walked
