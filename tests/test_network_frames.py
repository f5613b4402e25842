"""Connection frames: round trips, batching, and hostile bytes that may only ever raise FrameError."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.errors import FrameError
from slipstream.network.frames import (
    FRAME_OVERHEAD,
    Frame,
    FrameKind,
    decode_frames,
    encode_frame_into,
    encode_frames,
    iter_frames,
)

frames_st = st.builds(
    Frame,
    st.sampled_from(list(FrameKind)),
    st.integers(0, 2**32 - 1),
    st.binary(max_size=300),
)


def test_kind_values_are_the_contract() -> None:
    assert [int(k) for k in FrameKind] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 18, 19, 20]


def test_layout_is_kind_id_length_payload() -> None:
    buf = bytearray()
    encode_frame_into(buf, FrameKind.PING, 0x01020304, b"xyz")
    assert bytes(buf) == b"\x04\x01\x02\x03\x04\x00\x00\x00\x03xyz"
    assert FRAME_OVERHEAD == 9


@settings(max_examples=200, deadline=None)
@given(st.lists(frames_st, max_size=20))
def test_round_trip(frames: list[Frame]) -> None:
    data = encode_frames(frames)
    assert decode_frames(data) == frames
    assert list(iter_frames(data)) == frames
    assert decode_frames(bytearray(data)) == frames
    assert decode_frames(memoryview(data)) == frames
    for frame in decode_frames(data):
        assert type(frame.kind) is FrameKind and type(frame.payload) is bytes


@settings(max_examples=200, deadline=None)
@given(st.lists(frames_st, min_size=1, max_size=10), st.data())
def test_truncation_is_refused(frames: list[Frame], data: st.DataObject) -> None:
    encoded = encode_frames(frames)
    cut = data.draw(st.integers(1, len(encoded) - 1)) if len(encoded) > 1 else 0
    prefix = encoded[:cut]
    boundaries = set()
    offset = 0
    for frame in frames:
        boundaries.add(offset)
        offset += FRAME_OVERHEAD + len(frame.payload)
    if cut in boundaries:
        assert len(decode_frames(prefix)) <= len(frames)
    else:
        with pytest.raises(FrameError):
            decode_frames(prefix)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_frame_error(data: bytes) -> None:
    try:
        frames = decode_frames(data)
    except FrameError:
        return
    assert encode_frames(frames) == data  # anything accepted is exactly what it re-encodes to


@settings(max_examples=300, deadline=None)
@given(st.lists(frames_st, min_size=1, max_size=5), st.integers(0), st.integers(0, 255))
def test_flipped_bytes_only_raise_frame_error(frames: list[Frame], where: int, value: int) -> None:
    data = bytearray(encode_frames(frames))
    data[where % len(data)] = value
    with contextlib.suppress(FrameError):
        decode_frames(bytes(data))


def test_hostile_length_is_checked_before_allocating() -> None:
    header = struct.pack(">BII", FrameKind.MESSAGE, 0, 0xFFFF_FFFF)
    with pytest.raises(FrameError, match="exceeds"):
        decode_frames(header + b"abc")


def test_unknown_kind_and_short_header() -> None:
    with pytest.raises(FrameError, match="unknown frame kind 10"):
        decode_frames(b"\x0a" + bytes(8))
    with pytest.raises(FrameError, match="unknown frame kind 0"):
        decode_frames(bytes(9))
    with pytest.raises(FrameError, match="truncated"):
        decode_frames(b"\x01\x00\x00")


def test_frame_count_is_capped() -> None:
    data = encode_frames([Frame(FrameKind.KEEPALIVE, 0, b"")] * 11)
    assert len(decode_frames(data, max_frames=11)) == 11
    with pytest.raises(FrameError, match="more than 10"):
        decode_frames(data, max_frames=10)
    with pytest.raises(FrameError):
        list(iter_frames(data, max_frames=10))


def test_empty_record_has_no_frames() -> None:
    assert decode_frames(b"") == []


def test_bad_values_on_the_sending_side() -> None:
    buf = bytearray(b"keep")
    with pytest.raises(FrameError, match="request_id"):
        encode_frame_into(buf, FrameKind.MESSAGE, 2**32, b"")
    with pytest.raises(FrameError, match="request_id"):
        encode_frame_into(buf, FrameKind.MESSAGE, -1, b"")
    with pytest.raises(FrameError, match="unknown frame kind 10"):
        encode_frame_into(buf, 10, 0, b"")
    assert buf == b"keep"


def test_frames_are_immutable_values() -> None:
    frame = Frame(FrameKind.PONG, 7, b"p")
    assert frame == Frame(FrameKind.PONG, 7, b"p")
    assert hash(frame) == hash(Frame(FrameKind.PONG, 7, b"p"))
    with pytest.raises(AttributeError):
        frame.request_id = 8  # type: ignore[misc]
