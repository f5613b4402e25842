"""The record layer and the record codec in C (``network/_records.c``) against their Python references:
the same records, plaintexts, counters, frames, values and errors, on good input and on what a hostile
peer sends. Skipped when the extension is not built, unless SLIPSTREAM_REQUIRE_EXTENSIONS=1 (``make
test``): then a missing build fails here. ``make asan`` runs this file against a sanitized build."""

from __future__ import annotations

import os
import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.errors import (
    FrameError,
    MessageDecodeError,
    NetworkError,
    RecordMalformed,
    RecordRejected,
    RecordReplayed,
    RecordTampered,
)
from slipstream.network.frames import FRAME_OVERHEAD, FrameKind, encode_frame_into
from slipstream.network.serialization import Serialization
from slipstream.network.session import RECORD_OVERHEAD, RECORDS_C, PyRecordLayer, RecordLayer
from tests.extension import require_extension

require_extension(RECORDS_C, "the C record layer (slipstream.network._records)")


class Quote(msgspec.Struct):
    id: int
    price: float
    symbol: str


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


def layers(
    window: int = 64, max_record: int = 1 << 20
) -> tuple[RecordLayer, PyRecordLayer, RecordLayer, PyRecordLayer]:
    """A sealer and an opener of each implementation over the same keys."""
    a_to_b, b_to_a = os.urandom(32), os.urandom(32)
    return (
        RecordLayer(a_to_b, b_to_a, replay_window=window, max_record=max_record),
        PyRecordLayer(a_to_b, b_to_a, replay_window=window, max_record=max_record),
        RecordLayer(b_to_a, a_to_b, replay_window=window, max_record=max_record),
        PyRecordLayer(b_to_a, a_to_b, replay_window=window, max_record=max_record),
    )


def counts(layer: RecordLayer | PyRecordLayer) -> tuple[int, ...]:
    return (
        layer.send_counter,
        layer.records_sealed,
        layer.records_opened,
        layer.rejected_malformed,
        layer.rejected_tampered,
        layer.rejected_replayed,
        layer.rejected,
    )


def outcome(layer: RecordLayer | PyRecordLayer, record: bytes | bytearray | memoryview) -> object:
    try:
        return layer.open(record)
    except RecordRejected as exc:
        return (type(exc), str(exc))


def test_the_c_class_is_the_one_connections_use() -> None:
    assert issubclass(RecordLayer, RECORDS_C.RecordCore)
    assert RecordLayer is not PyRecordLayer


@pytest.mark.parametrize("size", [0, 1, 41, 4095, 4096, 70_000])
def test_both_seal_the_same_records_and_open_each_others(size: int) -> None:
    c_seal, py_seal, c_open, py_open = layers()
    text = os.urandom(size)
    for form in (text, bytearray(text), memoryview(text)):
        record, reference = c_seal.seal(form), py_seal.seal(form)
        assert type(record) is type(reference) and record == reference
        assert len(record) == size + RECORD_OVERHEAD
        assert c_open.open(record) == py_open.open(reference) == text
        shared = bytearray(b"\xff" * 3 + bytes(record) + b"\xff" * 3)  # opened from a view inside a larger buffer
        assert outcome(c_open, memoryview(shared)[3:-3]) == outcome(py_open, memoryview(shared)[3:-3])
    assert counts(c_seal) == counts(py_seal) and counts(c_open) == counts(py_open)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("seal"), st.binary(max_size=64)),
            st.tuples(st.just("replay"), st.integers(0, 1000)),
            st.tuples(st.just("flip"), st.integers(0, 1000), st.integers(0, 10_000)),
            st.tuples(st.just("cut"), st.integers(0, 1000), st.integers(0, 30)),
            st.tuples(st.just("counter"), st.integers(0, 1000), st.integers(0, 2**64 - 1)),
            st.tuples(st.just("junk"), st.binary(max_size=80)),
        ),
        max_size=60,
    ),
    st.integers(1, 16),
)
def test_a_hostile_sequence_gets_the_same_answers_and_counts(steps: list[tuple[object, ...]], window: int) -> None:
    """Records sealed, replayed, reordered, flipped, cut, given other counters, or junk: the C layer and
    the reference accept and refuse the same ones, with the same errors and counts."""
    c_seal, py_seal, c_open, py_open = layers(window=window, max_record=80)
    sealed: list[bytes] = []
    for step in steps:
        kind = step[0]
        if kind == "seal":
            record = c_seal.seal(step[1])  # type: ignore[arg-type]
            assert record == py_seal.seal(step[1])  # type: ignore[arg-type]
            sealed.append(bytes(record))
            candidate = bytes(record)
        elif not sealed:
            continue
        elif kind == "replay":
            candidate = sealed[int(step[1]) % len(sealed)]  # type: ignore[call-overload]
        elif kind == "flip":
            record = bytearray(sealed[int(step[1]) % len(sealed)])  # type: ignore[call-overload]
            record[int(step[2]) % len(record)] ^= 1  # type: ignore[call-overload]
            candidate = bytes(record)
        elif kind == "cut":
            record = sealed[int(step[1]) % len(sealed)]  # type: ignore[call-overload]
            candidate = record[: max(0, len(record) - int(step[2]))]  # type: ignore[call-overload]
        elif kind == "counter":
            record = sealed[int(step[1]) % len(sealed)]  # type: ignore[call-overload]
            candidate = struct.pack(">Q", step[2]) + record[8:]
        else:
            candidate = step[1]  # type: ignore[assignment]
        assert outcome(c_open, candidate) == outcome(py_open, candidate)
        assert counts(c_open) == counts(py_open)


def test_bounds_and_keys_are_checked_as_the_reference_does() -> None:
    for cls in (RecordLayer, PyRecordLayer):
        with pytest.raises(ValueError, match="32 bytes"):
            cls(b"short", bytes(32))
        with pytest.raises(ValueError, match="replay_window"):
            cls(bytes(32), bytes(32), replay_window=0)
        with pytest.raises(ValueError, match="max_record"):
            cls(bytes(32), bytes(32), max_record=RECORD_OVERHEAD - 1)
        layer = cls(bytes(32), bytes(32), max_record=100)
        with pytest.raises(RecordMalformed, match="a record of 101 bytes"):
            layer.open(bytes(101))
        with pytest.raises(RecordMalformed, match="past the last one"):
            layer.open(b"\xff" * 8 + bytes(40))  # counter 2**64 - 1: no sealer gets there


def test_the_last_counter_is_sealed_once_then_the_session_is_exhausted() -> None:
    c_seal, py_seal, c_open, py_open = layers()
    for layer in (c_seal, py_seal):
        layer._send_counter = 2**64 - 2
    last = c_seal.seal(b"last")
    assert last == py_seal.seal(b"last")
    assert c_open.open(last) == py_open.open(last) == b"last"
    for layer in (c_seal, py_seal):
        with pytest.raises(NetworkError, match="exhausted"):
            layer.seal(b"more")
        assert layer.send_counter == 2**64 - 1


def test_a_tampered_record_is_reported_without_the_tag_errors_context() -> None:
    c_seal, _, c_open, _ = layers()
    record = bytearray(c_seal.seal(b"hello"))
    record[-1] ^= 1
    with pytest.raises(RecordTampered, match="record 0 failed authentication") as caught:
        c_open.open(record)
    assert caught.value.__cause__ is None
    again = bytes(c_seal.seal(b"next"))
    assert c_open.open(again) == b"next"  # a forgery does not poison the window
    with pytest.raises(RecordReplayed, match="record 1 was already received"):
        c_open.open(again)


def test_an_opened_view_is_not_kept_past_the_call() -> None:
    """The sealed part goes to the AEAD as a view of the record's buffer: after ``open`` the buffer can be
    resized (no view of it is left exported)."""
    c_seal, _, c_open, _ = layers()
    buffer = bytearray(c_seal.seal(b"payload"))
    assert c_open.open(buffer) == b"payload"
    buffer += b"more"  # BufferError if a view were still exported
    tampered = bytearray(c_seal.seal(b"payload"))
    tampered[10] ^= 1
    with pytest.raises(RecordTampered):
        c_open.open(tampered)
    tampered += b"more"


# -- the record codec -----------------------------------------------------------------------------------


def registry() -> Serialization:
    return Serialization([Quote, Point])


def comparable(items: list[tuple[FrameKind, int, object]]) -> list[tuple[object, ...]]:
    """Decode failures compared by type, text and the type of their cause."""
    out: list[tuple[object, ...]] = []
    for kind, request_id, value in items:
        if isinstance(value, MessageDecodeError):
            out.append((kind, request_id, "error", str(value), type(value.__cause__)))
        else:
            out.append((kind, request_id, type(value), value))
    return out


def decoded(s: Serialization, data: bytes, max_frames: int = 65536) -> object:
    try:
        return comparable(s.decode_record(data, max_frames=max_frames))
    except FrameError as exc:
        return ("FrameError", str(exc))


def reference(s: Serialization, data: bytes, max_frames: int = 65536) -> object:
    try:
        return comparable(s.py_decode_record(data, max_frames=max_frames))
    except FrameError as exc:
        return ("FrameError", str(exc))


values = st.one_of(
    st.builds(Quote, st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=20)),
    st.builds(Point, st.integers(-100, 100), st.integers(-100, 100)),
    st.none()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=10)
    | st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    st.binary(max_size=20),  # raw payloads: hostile ones for the message kinds
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(FrameKind)), st.integers(0, 2**32 - 1), values), max_size=8))
def test_records_of_frames_decode_alike(items: list[tuple[FrameKind, int, object]]) -> None:
    s = registry()
    buf = bytearray()
    for kind, request_id, value in items:
        if isinstance(value, bytes):
            encode_frame_into(buf, kind, request_id, value)
        else:
            reference_buf = bytearray(buf)
            size = s.encode_frame_into(buf, kind, request_id, value)
            assert size == s.py_encode_frame_into(reference_buf, kind, request_id, value)
            assert buf == reference_buf
    data = bytes(buf)
    assert decoded(s, data) == reference(s, data)
    for cut in (1, FRAME_OVERHEAD, len(data) // 2):  # a record cut short anywhere
        assert decoded(s, data[: len(data) - cut]) == reference(s, data[: len(data) - cut])
    assert decoded(s, data, max_frames=len(items) - 1) == reference(s, data, max_frames=len(items) - 1)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=120))
def test_random_bytes_decode_alike(data: bytes) -> None:
    s = registry()
    assert decoded(s, data) == reference(s, data)
    prefixed = bytes([FrameKind.MESSAGE]) + bytes(4) + struct.pack(">I", len(data)) + data  # inside a message frame
    assert decoded(s, prefixed) == reference(s, prefixed)


def test_type_ids_past_the_registry_and_truncated_ids_decode_alike() -> None:
    for s in (registry(), Serialization([Quote, Point, *(type(f"T{i}", (msgspec.Struct,), {}) for i in range(8))])):
        _ids_decode_alike(s)


def _ids_decode_alike(s: Serialization) -> None:
    """(With ten types, a one-byte frame's long id read on into the next frame names a registered type: the
    reference decodes an empty body with it, and so must C.)"""
    for body in (b"\x05\x90", b"\x7f\x90", b"\x80", b"\x80\x01\x90", b"\xff\xff\x90", b"\x00\xc1", b""):
        for tail in (b"", bytes([FrameKind.PING]) + bytes(8)):  # a one-byte long id followed by another frame
            data = bytes([FrameKind.MESSAGE]) + bytes(4) + struct.pack(">I", len(body)) + body + tail
            assert decoded(s, data) == reference(s, data)


def test_views_and_bytearrays_decode_as_bytes_do() -> None:
    s = registry()
    buf = bytearray()
    s.encode_frame_into(buf, FrameKind.MESSAGE, 7, Quote(1, 2.5, "ACME"))
    encode_frame_into(buf, FrameKind.PING, 3, b"ping")
    for form in (bytes(buf), buf, memoryview(buf)):
        assert s.decode_record(form) == [(FrameKind.MESSAGE, 7, Quote(1, 2.5, "ACME")), (FrameKind.PING, 3, b"ping")]


def test_frames_the_encoder_refuses_raise_the_references_errors_and_leave_the_buffer() -> None:
    s = registry()
    buf = bytearray(b"kept")
    with pytest.raises(Exception) as c_error:
        s.encode_frame_into(buf, FrameKind.MESSAGE, 0, object())
    assert buf == b"kept"
    with pytest.raises(Exception) as py_error:
        s.py_encode_frame_into(buf, FrameKind.MESSAGE, 0, object())
    assert type(c_error.value) is type(py_error.value) and str(c_error.value) == str(py_error.value)
    for kind, request_id in ((300, 0), (FrameKind.MESSAGE, 2**32), (FrameKind.MESSAGE, -1), (0, 0), (10, 0)):
        with pytest.raises(FrameError):
            s.encode_frame_into(buf, kind, request_id, Point(1, 2))
        assert buf == b"kept"
    with pytest.raises(Exception, match="cannot encode"):
        s.encode_frame_into(buf, FrameKind.MESSAGE, 0, Quote(2**70, 1.0, "x"))  # an int msgpack cannot hold
    assert buf == b"kept"


class Mutating(msgspec.Struct):
    """A message whose decoding empties its registry's decoder list (``__post_init__`` runs Python in the
    middle of a record's decoding)."""

    n: int

    def __post_init__(self) -> None:
        for registry in MUTATED:
            registry._decode_fns.clear()


MUTATED: list[Serialization] = []


def test_a_decoder_that_changes_the_decoders_is_survived_as_the_reference_does() -> None:
    outcomes = []
    for decode in ("decode_record", "py_decode_record"):
        s = Serialization([Mutating])
        MUTATED.clear()
        buf = bytearray()
        for n in range(3):
            s.encode_frame_into(buf, FrameKind.MESSAGE, n, Mutating(n))
        MUTATED.append(s)
        try:
            outcomes.append(comparable(getattr(s, decode)(bytes(buf))))
        finally:
            MUTATED.clear()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0][2:] == (Mutating, Mutating(0))
    assert outcomes[0][1][2] == outcomes[0][2][2] == "error"


def test_a_layer_is_initialised_once() -> None:
    """Its replay window is allocated once: a second ``__init__`` (which would free it under an ``open`` in
    progress in another thread) is refused, and the layer goes on as it was."""
    c_seal, _, c_open, _ = layers()
    record = c_seal.seal(b"first")
    with pytest.raises(RuntimeError, match="initialised once"):
        c_open.__init__(os.urandom(32), os.urandom(32))  # type: ignore[misc]
    assert c_open.open(record) == b"first"


@pytest.mark.parametrize("size", [10, 5000])
def test_a_plaintext_the_aead_refuses_raises_its_error_and_spends_the_counter(size: int) -> None:
    """Small and large (encrypted in place) alike: the AEAD's TypeError, the counter spent (a nonce is never
    reused), and the next record seals as the reference's does."""
    c_seal, py_seal, c_open, _ = layers()
    for layer in (c_seal, py_seal):
        with pytest.raises(TypeError):
            layer.seal([0] * size)  # type: ignore[arg-type]
    assert counts(c_seal) == counts(py_seal) and c_seal.send_counter == 1
    record = c_seal.seal(b"next")
    assert record == py_seal.seal(b"next") and c_open.open(record) == b"next"
