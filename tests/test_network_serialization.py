"""Typed messages: registered Structs and dataclasses, builtins, hostile bytes, registration comparison."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import pickle
import typing

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.errors import FrameError, MessageDecodeError, SerializationError, UnregisteredTypeError
from slipstream.network.frames import FRAME_OVERHEAD, FrameKind, decode_frames, encode_frame_into
from slipstream.network.serialization import Serialization


class Small(msgspec.Struct):
    number: int
    ratio: float
    name: str


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


class Shape(msgspec.Struct):
    points: list[Point]
    label: str | None = None


@dataclasses.dataclass
class Note:
    text: str
    tags: list[str]
    data: bytes = b""


class Derived(Small):
    extra: int = 0


class Plain:
    pass


def registry() -> Serialization:
    return Serialization([Small, Point, Shape, Note])


smalls = st.builds(
    Small,
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=50),
)
json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(smalls)
def test_struct_round_trip(message: Small) -> None:
    s = registry()
    assert s.decode(s.encode(message)) == message
    buf = bytearray(b"head")
    s.encode_into(message, buf)
    assert bytes(buf[4:]) == s.encode(message)
    assert s.decode(memoryview(bytes(buf))[4:]) == message


@settings(max_examples=200, deadline=None)
@given(json_like)
def test_builtins_round_trip_without_registration(value: object) -> None:
    s = Serialization()
    assert s.decode(s.encode(value)) == value


def test_nested_dataclass_and_tuple() -> None:
    s = registry()
    shape = Shape([Point(1, 2), Point(3, 4)], "tri")
    assert s.decode(s.encode(shape)) == shape
    note = Note("hi", ["a", "b"], b"\x00\xff")
    assert s.decode(s.encode(note)) == note
    assert s.decode(s.encode((1, "a"))) == [1, "a"]  # msgpack has no tuple: it comes back a list


def test_many_types_use_two_byte_ids() -> None:
    types = [msgspec.defstruct(f"T{i}", [("v", int)]) for i in range(300)]
    s = Serialization(types)
    last = types[-1](v=5)
    data = s.encode(last)
    assert data[0] & 0x80 and s.type_id(types[-1]) == 300
    assert s.decode(data) == last
    assert len(s.encode(types[0](v=1))) == 1 + len(msgspec.msgpack.encode(types[0](v=1)))


def test_unregistered_types_are_refused_by_name() -> None:
    s = registry()
    with pytest.raises(UnregisteredTypeError, match="Derived") as info:
        s.encode(Derived(1, 2.0, "x"))
    assert isinstance(info.value, TypeError) and isinstance(info.value, SerializationError)
    with pytest.raises(UnregisteredTypeError, match="Plain"):
        s.encode(Plain())
    with pytest.raises(UnregisteredTypeError, match="set"):
        s.encode({1, 2})
    with pytest.raises(UnregisteredTypeError):
        s.encode([Plain()])  # nested values msgpack cannot carry
    buf = bytearray(b"x")
    with pytest.raises(UnregisteredTypeError):
        s.encode_into([Plain()], buf)
    assert buf == b"x"


def test_registration_accepts_only_structs_and_dataclasses() -> None:
    with pytest.raises(TypeError, match="Plain"):
        Serialization([Plain])
    with pytest.raises(TypeError, match="not"):
        Serialization([Note(text="", tags=[])])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="twice"):
        Serialization([Small, Small])


def test_bad_bodies_raise_message_decode_error() -> None:
    s = registry()
    good = s.encode(Small(1, 2.0, "x"))
    cases = [
        b"",
        b"\x80",
        b"\x7f" + good[1:],  # unknown id
        b"\x02" + good[1:],  # a Small body under Point's id
        good[:-2],
        b"\x00\xdd\xff\xff\xff\xff",  # array claiming 4 G entries
        b"\x00" + b"\x91" * 100_000,  # nesting deeper than any recursion limit
        b"\x01" + msgspec.msgpack.encode({"number": "one", "ratio": 1.0, "name": "x"}),
        b"\x00" + pickle.dumps(Plain()),
    ]
    for data in cases:
        with pytest.raises(MessageDecodeError):
            s.decode(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=100))
def test_random_bytes_only_raise_message_decode_error(data: bytes) -> None:
    s = registry()
    with contextlib.suppress(MessageDecodeError):
        s.decode(data)


def test_description_and_fingerprint() -> None:
    a, b = registry(), registry()
    assert a.description() == b.description()
    assert a.fingerprint() == hashlib.sha256(a.description()).digest()
    assert a.first_difference(b.description()) is None
    assert Serialization([Small, Point]).fingerprint() != Serialization([Point, Small]).fingerprint()
    assert isinstance(msgspec.msgpack.decode(a.description()), list)


def test_first_difference_names_the_type() -> None:
    local = Serialization([Small, Point])
    assert "Derived" in (local.first_difference(Serialization([Small, Derived]).description()) or "")
    text = local.first_difference(Serialization([Small]).description()) or ""
    assert "Point" in text and "not on the remote" in text
    text = local.first_difference(Serialization([Small, Point, Note]).description()) or ""
    assert "Note" in text and "not here" in text
    other_point = msgspec.defstruct("Point", [("x", int), ("z", int)])
    text = local.first_difference(Serialization([Small, other_point]).description()) or ""
    assert "Point" in text and "z" in text
    assert local.first_difference(b"\xc1garbage") == "the remote's registration list is malformed"
    assert local.first_difference(msgspec.msgpack.encode([99, []])) is not None


def test_equivalent_annotations_describe_alike() -> None:
    """Optional[X] and X | None, typing.List and list, string and real annotations: one description."""

    @dataclasses.dataclass
    class Old:
        items: typing.List[Point]  # noqa: UP006
        maybe: typing.Optional[int]  # noqa: UP045
        pair: typing.Tuple[int, ...]  # noqa: UP006

    @dataclasses.dataclass
    class New:
        items: list[Point]
        maybe: int | None
        pair: tuple[int, ...]

    Old.__qualname__ = New.__qualname__ = "Same"
    assert Serialization([Old]).description() == Serialization([New]).description()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(smalls, json_like), max_size=10), st.integers(0, 2**32 - 1))
def test_fused_frame_encoding_matches_the_two_step_path(messages: list[object], request_id: int) -> None:
    s = registry()
    fused, two_step = bytearray(b"head"), bytearray(b"head")
    for message in messages:
        size = s.encode_frame_into(fused, FrameKind.SYNC_REQUEST, request_id, message)
        encode_frame_into(two_step, FrameKind.SYNC_REQUEST, request_id, s.encode(message))
        assert size == FRAME_OVERHEAD + len(s.encode(message))
    assert fused == two_step
    frames = decode_frames(bytes(fused[4:]))
    assert [s.decode(frame.payload) for frame in frames] == [s.decode(s.encode(m)) for m in messages]


def test_fused_frame_encoding_errors_leave_the_buffer() -> None:
    s = registry()
    buf = bytearray(b"keep")
    with pytest.raises(UnregisteredTypeError, match="Plain"):
        s.encode_frame_into(buf, FrameKind.MESSAGE, 0, Plain())
    with pytest.raises(UnregisteredTypeError):
        s.encode_frame_into(buf, FrameKind.MESSAGE, 0, [Plain()])
    with pytest.raises(FrameError):
        s.encode_frame_into(buf, FrameKind.MESSAGE, 2**32, Small(1, 1.0, "x"))
    with pytest.raises(FrameError, match="unknown frame kind 10"):
        s.encode_frame_into(buf, 10, 0, Small(1, 1.0, "x"))
    assert buf == b"keep"


def _expected(s: Serialization, data: bytes) -> list[tuple[FrameKind, int, object]]:
    out: list[tuple[FrameKind, int, object]] = []
    for frame in decode_frames(data):
        if frame.kind in (FrameKind.MESSAGE, FrameKind.SYNC_REQUEST):
            try:
                out.append((frame.kind, frame.request_id, s.decode(frame.payload)))
            except MessageDecodeError as exc:
                out.append((frame.kind, frame.request_id, str(exc)))
        else:
            out.append((frame.kind, frame.request_id, frame.payload))
    return out


def _comparable(items: list[tuple[FrameKind, int, object]]) -> list[tuple[FrameKind, int, object]]:
    return [(k, r, str(v) if isinstance(v, MessageDecodeError) else v) for k, r, v in items]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(FrameKind)),
            st.integers(0, 2**32 - 1),
            st.one_of(smalls, json_like, st.binary(max_size=20)),
        ),
        max_size=10,
    )
)
def test_decode_record_matches_frames_then_decode(items: list[tuple[FrameKind, int, object]]) -> None:
    s = registry()
    buf = bytearray()
    for kind, request_id, value in items:
        if isinstance(value, bytes):
            encode_frame_into(buf, kind, request_id, value)  # raw payloads: hostile ones for message kinds
        else:
            s.encode_frame_into(buf, kind, request_id, value)
    data = bytes(buf)
    assert _comparable(s.decode_record(data)) == _expected(s, data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_decode_record_on_random_bytes(data: bytes) -> None:
    s = registry()
    try:
        expected = _expected(s, data)
    except FrameError:
        with pytest.raises(FrameError):
            s.decode_record(data)
        return
    assert _comparable(s.decode_record(data)) == expected


def test_one_bad_message_does_not_cost_the_others() -> None:
    s = registry()
    buf = bytearray()
    s.encode_frame_into(buf, FrameKind.MESSAGE, 0, Small(1, 1.0, "a"))
    encode_frame_into(buf, FrameKind.MESSAGE, 0, b"\x01\x93garbage")
    encode_frame_into(buf, FrameKind.SYNC_REQUEST, 5, b"")
    encode_frame_into(buf, FrameKind.PING, 9, b"ping")
    s.encode_frame_into(buf, FrameKind.SYNC_REQUEST, 6, Point(1, 2))
    got = s.decode_record(bytes(buf))
    assert got[0] == (FrameKind.MESSAGE, 0, Small(1, 1.0, "a"))
    assert isinstance(got[1][2], MessageDecodeError) and "Small" in str(got[1][2])
    assert isinstance(got[2][2], MessageDecodeError) and got[2][1] == 5
    assert got[3] == (FrameKind.PING, 9, b"ping")
    assert got[4] == (FrameKind.SYNC_REQUEST, 6, Point(1, 2))
    with pytest.raises(FrameError, match="more than 4"):
        s.decode_record(bytes(buf), max_frames=4)
