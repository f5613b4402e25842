"""The C datagram functions against the pure-Python reference: same scans of (GRO batches of) DATA
datagrams, same bytes copied into a term, for well-formed and hostile input alike."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slipstream.logbuffer.fastpath import FAST
from slipstream.wire.frames import DataScan, scan_equal_frames
from tests.extension import require_extension

require_extension(FAST, "the C fast path")

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER = struct.Struct("<iBBHiiiiq")


def frames(
    count: int, length: int, term_offset: int, session: int = 5, stream: int = 9, term_id: int = 3
) -> bytearray:
    """``count`` DATA frames of ``length`` bytes at consecutive aligned offsets: one datagram or a GRO batch."""
    aligned = (length + 31) & -32
    out = bytearray(count * aligned)
    for i in range(count):
        offset = ((term_offset + i * aligned + (1 << 31)) % (1 << 32)) - (1 << 31)  # wraps: hostile near the top
        HEADER.pack_into(out, i * aligned, length, 0, 0xC0, 1, offset, session, stream, term_id, i)
        out[i * aligned + 32 : i * aligned + length] = bytes((i + j) & 0xFF for j in range(length - 32))
    return out


mutation = st.tuples(st.integers(0, 10_000), st.integers(0, 255))


@SETTINGS
@given(
    st.integers(1, 12),
    st.integers(0, 1500),
    st.integers(-(1 << 31), (1 << 31) - 1).map(lambda v: v & ~31),
    st.lists(mutation, max_size=3),
    st.integers(0, 64),
    st.sampled_from(["bytes", "bytearray", "memoryview", "memoryview-i"]),
)
def test_scan_equal_frames_matches_reference(
    count: int, payload: int, term_offset: int, flips: list[tuple[int, int]], cut: int, kind: str
) -> None:
    data = frames(count, 32 + payload, term_offset)
    for at, value in flips:
        if data:
            data[at % len(data)] = value
    if cut:
        data = data[: max(0, len(data) - cut)]
    wrapped: bytes | bytearray | memoryview
    if kind == "bytes":
        wrapped = bytes(data)
    elif kind == "bytearray":
        wrapped = data
    elif kind == "memoryview":
        wrapped = memoryview(data)
    else:
        wrapped = memoryview(data).cast("i") if len(data) % 4 == 0 else memoryview(data)
    fast = FAST.scan_equal_frames(wrapped, DataScan)
    assert fast == scan_equal_frames(wrapped)
    assert fast is None or type(fast) is DataScan


def test_scan_equal_frames_refuses_what_is_not_one_run() -> None:
    good = frames(4, 100, 4096)
    assert FAST.scan_equal_frames(bytes(good), DataScan) == scan_equal_frames(bytes(good)) is not None
    noncontiguous = memoryview(bytes(good) * 2)[::2]
    assert FAST.scan_equal_frames(noncontiguous, DataScan) is None  # the Python walk decides
    for hostile in (b"", b"\x00" * 31, struct.pack("<i", 1 << 30) + bytes(60), struct.pack("<i", -64) + bytes(60)):
        assert FAST.scan_equal_frames(hostile, DataScan) == scan_equal_frames(hostile)
    with pytest.raises(TypeError):
        FAST.scan_equal_frames(bytes(good), dict)


def python_insert(term: memoryview, term_offset: int, data: bytes, first: int) -> bool:
    """The reference: image.on_data's copy, as the pure-Python receiver does it."""
    term_i32 = term.cast("i")
    inserted = term_i32[term_offset >> 2] == 0
    if inserted:
        term[term_offset + 4 : term_offset + len(data)] = data[4:]
        term_i32[term_offset >> 2] = first
    return inserted


@SETTINGS
@given(st.integers(0, 60).map(lambda v: v * 32), st.integers(1, 6), st.integers(0, 400), st.booleans())
def test_insert_datagram_matches_reference(slot: int, count: int, payload: int, filled: bool) -> None:
    term_length = 64 * 1024
    data = bytes(frames(count, 32 + payload, slot))
    if slot + len(data) > term_length:
        return
    terms = [memoryview(bytearray(term_length)) for _ in range(2)]
    if filled:
        for term in terms:
            term[slot : slot + 4] = struct.pack("<i", 96)
    results = [
        python_insert(terms[0], slot, data, 32 + payload),
        FAST.insert_datagram(terms[1], slot, data, 32 + payload),
    ]
    assert results[0] == results[1] == (not filled)
    assert bytes(terms[0]) == bytes(terms[1])


def test_insert_datagram_never_writes_outside_the_term() -> None:
    term = memoryview(bytearray(4096))
    data = bytes(frames(2, 100, 0))
    for offset in (-32, 4096 - 64, 4096, 1 << 40, 2):
        with pytest.raises((ValueError, OverflowError)):
            FAST.insert_datagram(term, offset, data, 100)
    with pytest.raises(ValueError):
        FAST.insert_datagram(term, 0, b"ab", 100)
    assert bytes(term) == bytes(4096)
    with pytest.raises(BufferError):
        FAST.insert_datagram(memoryview(bytes(4096)), 0, data, 100)  # read-only term
