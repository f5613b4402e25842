"""The C fast path against the pure-Python reference: same log bytes, positions, results and fragments.

Both implementations are driven with the same inputs (random message sizes, term rollovers, aborted
claims, back pressure, corrupt and truncated frames, hostile lengths, runs of equal frames) and must
agree exactly. Skipped when the extension is not built, unless SLIPSTREAM_REQUIRE_EXTENSIONS=1 (``make
test``, ``make asan`` and the wheel tests set it, so a silently missing build fails there).
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slipstream.client.assembler import FragmentAssembler, PyFragmentAssembler
from slipstream.client.image import Image, PyImage
from slipstream.logbuffer import (
    BufferClaim,
    Header,
    LogBuffers,
    PyExclusiveAppender,
    block_frames,
    compute_log_length,
    fast_path_active,
    py_is_equal_run,
    py_read_term,
    py_scan_block,
    py_scan_term,
)
from slipstream.logbuffer.fastpath import FAST
from slipstream.wire.constants import HDR_TYPE_PAD, TERM_MIN_LENGTH
from tests.extension import require_extension

require_extension(FAST, "the C fast path")

from slipstream.logbuffer.appender import FastExclusiveAppender  # noqa: E402  (exists only with the extension)

TERM = TERM_MIN_LENGTH
BIG = 1 << 62
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_log(term_id: int = 7, term_offset: int = 0, mtu: int = 1408) -> LogBuffers:
    log = LogBuffers(bytearray(compute_log_length(TERM)), TERM)
    log.initialize(initial_term_id=7, term_id=term_id, term_offset=term_offset, session_id=42, stream_id=1001, mtu=mtu)
    log.is_connected = True
    return log


def payload_of(size: int, salt: int) -> bytes:
    return bytes((i * 7 + salt) & 0xFF for i in range(size))


# ---- appender -------------------------------------------------------------------------------------

Op = tuple[str, int, int]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 5000), st.integers(-(1 << 63), (1 << 63) - 1)),
        st.tuples(st.just("offer_small"), st.integers(0, 200), st.integers(0, 3)),
        st.tuples(st.just("offer_view"), st.integers(0, 3000), st.integers(0, 3)),
        st.tuples(st.just("claim_commit"), st.integers(0, 1376), st.integers(0, 1)),
        st.tuples(st.just("claim_abort"), st.integers(0, 1376), st.integers(0, 1)),
        st.tuples(st.just("limit"), st.integers(0, 6 * TERM), st.integers(0, 0)),
        st.tuples(st.just("too_big"), st.integers(TERM // 8 + 1, TERM // 8 + 100), st.integers(0, 0)),
    ),
    max_size=120,
)


def run_appender(cls: type[Any], script: list[Op], start_offset: int) -> tuple[list[object], bytes, int]:
    log = make_log(term_offset=start_offset)
    app = cls(log)
    limit = BIG
    results: list[object] = []
    for n, (op, size, extra) in enumerate(script):
        try:
            if op == "limit":
                limit = app.position + size // 2
                results.append(None)
            elif op in ("offer", "offer_small", "too_big"):
                results.append(app.append(payload_of(size, n), limit, extra if op == "offer" else 0))
            elif op == "offer_view":
                data = bytearray(payload_of(size + 3, n))
                results.append(app.append(memoryview(data)[3:] if extra else data, limit))
            else:
                claim = BufferClaim()
                result = app.claim(size, limit, claim)
                results.append(result)
                if result > 0:
                    claim.buffer[:] = payload_of(size, n)
                    if extra:
                        claim.reserved_value = n
                    claim.commit() if op == "claim_commit" else claim.abort()
        except ValueError as exc:
            results.append(("ValueError", str(exc)))
        results.append(app.position)
    return results, bytes(log._buffer), app.position


@SETTINGS
@given(ops, st.sampled_from([0, TERM - 4096, TERM - 64, TERM - 1472]))
def test_appender_matches_reference(script: list[Op], start_offset: int) -> None:
    """Same results, positions, and every byte of the log (terms, tails, metadata) after any script."""
    assert run_appender(FastExclusiveAppender, script, start_offset) == run_appender(
        PyExclusiveAppender, script, start_offset
    )


def test_appender_rolls_over_many_terms() -> None:
    """Long enough to reuse every partition (cleaning ahead included) several times."""
    script: list[Op] = [("offer", (i * 37) % 3000, i) for i in range(3000)]
    fast = run_appender(FastExclusiveAppender, script, 0)
    assert fast == run_appender(PyExclusiveAppender, script, 0)
    assert fast[2] > 5 * TERM


def test_offer_through_a_driver_limit_and_doorbell() -> None:
    """The limit read from a counter view, CLOSED after close(), and the doorbell rung when parked."""
    outcomes = []
    for cls in (PyExclusiveAppender, FastExclusiveAppender):
        log = make_log()
        limit = memoryview(bytearray(32)).cast("q")
        parked = memoryview(bytearray(16)).cast("q")
        rings: list[int] = []
        app = cls(log, (limit, 2), (parked, 1, functools.partial(rings.append, 1)))
        row = [app.offer(b"x" * 10)]  # limit 0: back pressured
        limit[2] = 1 << 20
        row += [app.offer(b"y" * 100), len(rings)]
        parked[1] = 1
        row += [app.offer(b"z" * 3000, 5), len(rings)]
        app.close()
        row += [app.offer(b"w"), bytes(log._buffer) == bytes(log._buffer), bytes(log.terms[0][:4096])]
        outcomes.append(row)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][2] == 0 and outcomes[0][4] == 1


def outcome(call: Any) -> object:
    """What a call gives: its result, or the type and message of what it raised."""
    try:
        return call()
    except Exception as exc:  # the comparison is the point
        return (type(exc).__name__, str(exc))


WRONG_OFFERS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    ((), {}),
    ((b"x", 0, 1), {}),
    ((b"x", 0, 1, 2), {}),
    ((b"x", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9), {}),
    ((b"x",), {"bogus": 1}),
    ((b"x", 0), {"reserved_value": 1}),
    ((), {"payload": b"kw", "reserved_value": 5}),
]
WRONG_CLAIMS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    ((), {}),
    ((0,), {}),
    ((0, 1), {}),
    ((0, 1, 2, 3), {}),
    ((0, 1, 2, 3, 4, 5, 6, 7, 8, 9), {}),
    ((0, 1), {"claim": None, "bogus": 2}),
]


@pytest.mark.parametrize("args, kwargs", WRONG_OFFERS)
def test_offer_with_wrong_arguments_behaves_as_the_reference(args: tuple[object, ...], kwargs: dict[str, Any]) -> None:
    """Too many or too few arguments, or keywords: the C method hands them to the Python one as given, so
    the same TypeError (or, for valid keywords, the same append). Before, more than three arguments were
    read past a four-slot array (a crash)."""
    outcomes = []
    for cls in (FastExclusiveAppender, PyExclusiveAppender):
        log = make_log()
        app = cls(log)
        app.append(b"first", BIG)
        outcomes.append((outcome(functools.partial(app.offer, *args, **kwargs)), app.position, bytes(log._buffer)))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("args, kwargs", WRONG_CLAIMS)
def test_claim_with_wrong_arguments_behaves_as_the_reference(args: tuple[object, ...], kwargs: dict[str, Any]) -> None:
    outcomes = []
    for cls in (FastExclusiveAppender, PyExclusiveAppender):
        log = make_log()
        app = cls(log)
        outcomes.append((outcome(functools.partial(app.claim, *args, **kwargs)), app.position, bytes(log._buffer)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0][0] == "TypeError"  # type: ignore[index]


def test_publication_offer_with_too_many_arguments_raises() -> None:
    """``Publication.offer`` is the C method itself: a wrong call raises the reference's TypeError."""
    from slipstream.client.publication import ExclusivePublication

    mapping = mmap.mmap(-1, compute_log_length(TERM))
    LogBuffers(memoryview(mapping), TERM).initialize(
        initial_term_id=7, term_id=7, term_offset=0, session_id=42, stream_id=1001, mtu=1408
    )
    limit = memoryview(bytearray(8)).cast("q")
    limit[0] = BIG
    pub = ExclusivePublication(
        channel="aeron:udp?endpoint=127.0.0.1:9",
        stream_id=1001,
        session_id=42,
        registration_id=1,
        mapping=mapping,
        limit_values=limit,
        limit_index=0,
        on_close=lambda _: None,
    )
    with pytest.raises(TypeError, match="takes from 2 to 3 positional arguments but 5 were given"):
        pub.offer(b"message", 0, 0, 0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes from 2 to 3 positional arguments but 12 were given"):
        pub.offer(b"message", *range(10))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        pub.offer()  # type: ignore[call-arg]
    assert pub.offer(b"message") > 0


class MovingClaim(BufferClaim):
    """A claim whose ``_wrap`` (Python, called from the C claim) changes the appender under it."""

    __slots__ = ("app", "change")

    def __init__(self, app: Any, change: str) -> None:
        super().__init__()
        self.app = app
        self.change = change

    def _wrap(self, term: memoryview, term_i32: memoryview, offset: int, frame_length: int) -> None:
        super()._wrap(term, term_i32, offset, frame_length)
        if self.change == "index":
            self.app._active_index = 1 << 60  # far past the tail counters
        elif self.change == "negative":
            self.app._active_index = -(1 << 60)
        elif self.change == "tail":
            self.app._tail_i64 = memoryview(bytearray(24)).cast("q")  # another view: the store goes there
        elif self.change == "append":
            self.app.append(b"inside the claim", BIG)


@pytest.mark.parametrize("change", ["index", "negative", "tail", "append"])
def test_claim_reads_the_appender_again_after_wrap(change: str) -> None:
    """``_wrap`` runs Python between the C claim's checks and its tail store: the store uses the tail view
    and index as they are after it, as ``_py_claim`` does (an index moved out of range raises the
    reference's IndexError instead of writing outside the tail counters)."""
    outcomes = []
    for cls in (FastExclusiveAppender, PyExclusiveAppender):
        log = make_log()
        app = cls(log)
        app.append(b"before", BIG)
        claim = MovingClaim(app, change)
        result = outcome(functools.partial(app.claim, 40, BIG, claim))
        tail = bytes(app._tail_i64)
        outcomes.append((result, app._term_offset, tail, bytes(log._buffer)))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("change", ["term", "tail"])
def test_offer_reads_the_appender_again_after_clean_ahead(change: str) -> None:
    """An offer that crosses the check offset calls ``_clean_ahead`` (Python) first; what it changes is
    read again, and an attribute it removed sends the offer to the Python path (its AttributeError),
    not to a NULL buffer."""

    outcomes = []
    for base in (FastExclusiveAppender, PyExclusiveAppender):

        class Meddling(base):  # type: ignore[valid-type,misc]
            def _clean_ahead(self, resulting: int) -> None:
                super()._clean_ahead(resulting)
                delattr(self, "_term" if change == "term" else "_tail_i64")

        log = make_log(term_offset=TERM - 4096)
        app = Meddling(log)
        app._check_offset = app._term_offset  # the next offer crosses it
        outcomes.append((outcome(functools.partial(app.append, b"y" * 100, BIG)), bytes(log._buffer)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0][0] == "AttributeError"  # type: ignore[index]


# ---- reader ---------------------------------------------------------------------------------------

corruptions = st.lists(
    st.tuples(
        st.sampled_from(["length", "type", "byte", "negative", "pad", "zero"]),
        st.integers(0, 60),
        st.integers(-(1 << 31), (1 << 31) - 1),
    ),
    max_size=4,
)


def messy_term(sizes: list[int], equal: bool, damage: list[tuple[str, int, int]]) -> tuple[memoryview, list[int]]:
    """A term of frames (all one size if ``equal``), then damaged: hostile lengths, unknown types, flipped
    bytes, uncommitted claims, pads, zeroed frames."""
    log = make_log()
    app = PyExclusiveAppender(log)
    offsets = []
    for i, size in enumerate([sizes[0]] * len(sizes) if equal else sizes):
        offsets.append(app.position)
        app.append(payload_of(size, i), BIG)
    term = log.terms[0]
    for kind, which, value in damage:
        at = offsets[which % len(offsets)]
        if kind == "length":
            struct.pack_into("<i", term, at, value)
        elif kind == "type":
            struct.pack_into("<H", term, at + 6, value & 0xFFFF)
        elif kind == "byte":
            term[(at + (value & 63)) % TERM] = value & 0xFF
        elif kind == "negative":
            struct.pack_into("<i", term, at, -abs(value) or -1)
        elif kind == "pad":
            struct.pack_into("<H", term, at + 6, HDR_TYPE_PAD)
        else:
            term[at : at + 32] = bytes(32)
    return term, offsets


class Recorder:
    """Records what a handler is given (copies: the views are valid only during the call)."""

    def __init__(self, raise_at: int | None = None) -> None:
        self.seen: list[tuple[bytes, int, bool, str, int]] = []
        self.raise_at = raise_at

    def __call__(self, view: memoryview, header: Header) -> None:
        self.seen.append((bytes(view), header.offset, view.readonly, view.format, header.frame_length))
        if self.raise_at is not None and len(self.seen) == self.raise_at:
            raise KeyError("handler failed")


def read_both(
    term: memoryview, offset: int, limit: int, raise_at: int | None
) -> list[tuple[object, list[tuple[bytes, int, bool, str, int]], int]]:
    out = []
    for reader in (py_read_term, FAST.read_term):
        header = Header(7, TERM.bit_length() - 1)
        recorder = Recorder(raise_at)
        try:
            result: object = reader(term, term.cast("i"), offset, recorder, limit, header)
        except KeyError as exc:
            result = ("KeyError", str(exc))
        out.append((result, recorder.seen, header.offset))
    return out


sizes_st = st.lists(st.integers(0, 1376), min_size=1, max_size=40)


@SETTINGS
@given(sizes_st, st.booleans(), corruptions, st.integers(0, 45), st.integers(1, 60), st.none() | st.integers(1, 40))
def test_read_term_matches_reference(
    sizes: list[int], equal: bool, damage: list[tuple[str, int, int]], start: int, limit: int, raise_at: int | None
) -> None:
    term, offsets = messy_term(sizes, equal, damage)
    offset = offsets[start % len(offsets)]
    reference, fast = read_both(term, offset, limit, raise_at)
    assert fast == reference


def test_read_term_at_the_end_and_over_a_bytearray() -> None:
    """A frame claiming the rest of the term and more; a term that is not a memoryview (slice path)."""
    term, _ = messy_term([100], False, [])
    struct.pack_into("<i", term, TERM - 32, 64)
    struct.pack_into("<H", term, TERM - 26, 1)
    assert read_both(term, TERM - 32, 10, None)[0] == read_both(term, TERM - 32, 10, None)[1]
    raw = bytearray(term)
    seen: list[bytes] = []
    result = FAST.read_term(raw, memoryview(raw).cast("i"), 0, lambda v, h: seen.append(bytes(v)), 10, Header(7, 16))
    assert result == (1, 160, True) and seen == [payload_of(100, 0)]


@SETTINGS
@given(sizes_st, st.booleans(), corruptions, st.integers(0, 45), st.integers(0, 70000))
def test_scan_block_matches_reference(
    sizes: list[int], equal: bool, damage: list[tuple[str, int, int]], start: int, max_length: int
) -> None:
    term, offsets = messy_term(sizes, equal, damage)
    offset = offsets[start % len(offsets)]
    ints = term.cast("i")
    assert FAST.scan_block(term, ints, offset, max_length) == py_scan_block(term, ints, offset, max_length)


@SETTINGS
@given(sizes_st, st.booleans(), corruptions, st.integers(0, 45), st.integers(0, 70000))
def test_scan_term_matches_reference(
    sizes: list[int], equal: bool, damage: list[tuple[str, int, int]], start: int, max_length: int
) -> None:
    """The sender's cut of the log into datagrams (the reference takes its run shortcut, C walks)."""
    term, offsets = messy_term(sizes, equal, damage)
    offset = offsets[start % len(offsets)]
    ints = term.cast("i")
    assert FAST.scan_term(term, ints, offset, max_length) == py_scan_term(term, ints, offset, max_length)
    assert FAST.scan_term(term, ints, TERM, max_length) == py_scan_term(term, ints, TERM, max_length)


# Values whose products and sums overflow int64, near and past its ends, and past the term.
HOSTILE = [2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 32, 2**63 - 1, 2**63, 2**64 + 5, 2**70]
hostile_st = st.sampled_from(HOSTILE) | st.integers(0, 2**72)


@SETTINGS
@given(
    sizes_st,
    st.booleans(),
    corruptions,
    st.integers(0, 45),
    st.integers(-40, 1500) | hostile_st,
    st.integers(-1, 50) | hostile_st,
    st.none() | st.integers(TERM - 4096, TERM + 64) | hostile_st,
)
def test_is_equal_run_matches_reference(
    sizes: list[int],
    equal: bool,
    damage: list[tuple[str, int, int]],
    start: int,
    frame_length: int,
    count: int,
    hostile_offset: int | None,
) -> None:
    """Hostile offsets, frame lengths and counts included (``offset + count * aligned`` beyond int64):
    never a read outside the term, and the reference's answer (non-negative offsets: the reference
    would count a negative one from the end, and the sender never passes one)."""
    term, offsets = messy_term(sizes, equal, damage)
    offset = offsets[start % len(offsets)] if hostile_offset is None else hostile_offset
    length = frame_length if frame_length > 0 else sizes[0] + 32
    assert FAST.is_equal_run(term, offset, length, count) == py_is_equal_run(term, offset, length, count)


@pytest.mark.parametrize("offset", [2**63 - 1, 2**63 - 32, 2**62, 4096, 4064, 2**64])
@pytest.mark.parametrize("count", [1, 2, 2**58, 2**62, 2**63 - 1])
def test_is_equal_run_with_overflowing_offsets_and_counts(offset: int, count: int) -> None:
    """``offset + count * aligned`` wrapped around int64 to a small number: it passed the bounds check
    and the frames were read far outside the buffer (a crash)."""
    term = memoryview(bytearray(4096))
    assert FAST.is_equal_run(term, offset, 32, count) is False
    assert py_is_equal_run(term, offset, 32, count) is False


def test_scan_block_takes_whole_frames_and_skips_a_leading_pad() -> None:
    term, offsets = messy_term([40] * 10, True, [])
    ints = term.cast("i")
    for scan in (py_scan_block, FAST.scan_block):
        assert scan(term, ints, 0, 10_000) == (offsets[-1] + 96, offsets[-1] + 96, True)
        assert scan(term, ints, 0, 200) == (192, 192, True)  # whole frames only
        assert scan(term, ints, 0, 1) == (96, 96, True)  # but at least one
    block = term[0:192]
    assert block_frames(block) == [(32, 40), (128, 40)]
    struct.pack_into("<H", term, 6, HDR_TYPE_PAD)
    for scan in (py_scan_block, FAST.scan_block):
        assert scan(term, ints, 0, 10_000) == (0, 96, True)


# ---- assembler ------------------------------------------------------------------------------------

# A frame: (session id, flags bits, payload size, pad before it). Flags are drawn from all four
# begin/end combinations, so the terms hold whole messages, fragments in order, and orphans, gaps and
# interleaved sessions that the reference drops.
frames_st = st.lists(
    st.tuples(
        st.sampled_from([5, 6, -9]), st.sampled_from([0x80, 0x00, 0x40, 0xC0]), st.integers(0, 300), st.booleans()
    ),
    min_size=1,
    max_size=60,
)


def fragment_term(frames: list[tuple[int, int, int, bool]]) -> memoryview:
    """Frames written as a log holds them (a pad before a frame breaks the offset chain)."""
    term = memoryview(bytearray(TERM))
    offset = 0
    for i, (session_id, flags, size, pad) in enumerate(frames):
        if pad:
            struct.pack_into("<iBBHiiiiq", term, offset, 64, 0, 0, HDR_TYPE_PAD, offset, session_id, 1, 7, 0)
            offset += 64
        struct.pack_into("<iBBHiiiiq", term, offset, 32 + size, 0, flags, 1, offset, session_id, 1, 7, i)
        term[offset + 32 : offset + 32 + size] = payload_of(size, i)
        offset += (32 + size + 31) & -32
    return term


def assemble_all(
    term: memoryview, make: Any, reader: Any, limits: list[int], raise_at: int | None
) -> tuple[list[tuple[bytes, int, bool, str, int]], list[object]]:
    """Poll the term as ``Image.poll`` does (a raising handler consumes its frame) with one assembler."""
    recorder = Recorder(raise_at)
    assembler = make(recorder)
    header = Header(7, TERM.bit_length() - 1)
    offset, results = 0, []
    for limit in limits:
        try:
            result: object = reader(term, term.cast("i"), offset, assembler, limit, header)
            offset = result[1]  # type: ignore[index]
        except KeyError as exc:
            result = ("KeyError", str(exc), header.offset)
            offset = header.offset + ((header.frame_length + 31) & -32)
        results.append(result)
    return recorder.seen, results


@SETTINGS
@given(frames_st, st.lists(st.integers(1, 30), min_size=1, max_size=8), st.none() | st.integers(1, 10))
def test_assembler_matches_reference(
    frames: list[tuple[int, int, int, bool]], limits: list[int], raise_at: int | None
) -> None:
    """The C assembler, inline in ``read_term`` and called from the Python reader, against the reference."""
    term = fragment_term(frames)
    reference = assemble_all(term, PyFragmentAssembler, py_read_term, limits, raise_at)
    assert assemble_all(term, FragmentAssembler, FAST.read_term, limits, raise_at) == reference
    assert assemble_all(term, FragmentAssembler, py_read_term, limits, raise_at) == reference


@pytest.mark.parametrize("make, reader", [(PyFragmentAssembler, py_read_term), (FragmentAssembler, FAST.read_term)])
def test_assembler_reassembles_a_fragmented_log_and_a_kept_view_keeps_its_bytes(make: Any, reader: Any) -> None:
    """Messages cut by the appender at MTU 1408 come out whole; a handler that keeps a slice of its view
    keeps its message (the assembler moves on to a fresh buffer); ``free_session_buffer`` drops a
    partial message."""
    log = make_log(mtu=1408)
    app = PyExclusiveAppender(log)
    sizes = [5000, 10, 1376, 1377, 8192, 3]
    messages = [payload_of(size, i) for i, size in enumerate(sizes)]
    for message in messages:
        app.append(message, BIG)
    term, header = log.terms[0], Header(7, TERM.bit_length() - 1)
    kept: list[memoryview] = []
    fragments, offset, intact = reader(term, term.cast("i"), 0, make(lambda v, h: kept.append(v[:])), 1000, header)
    assert (fragments, offset, intact) == (4 + 1 + 1 + 2 + 6 + 1, app.position, True)
    assert [bytes(view) for view in kept] == messages
    got: list[bytes] = []
    assembler = make(lambda view, header: got.append(bytes(view)))
    reader(term, term.cast("i"), 0, assembler, 2, header)  # the first two fragments of 5000 bytes
    assembler.free_session_buffer(42)
    reader(term, term.cast("i"), offset_after(term, 2), assembler, 1000, header)
    assert got == messages[1:]


@pytest.mark.parametrize("make, reader", [(PyFragmentAssembler, py_read_term), (FragmentAssembler, FAST.read_term)])
def test_assembler_handler_may_use_its_assembler(make: Any, reader: Any) -> None:
    """A handler that frees its session and feeds the assembler other sessions (so its partial messages
    move in memory) while its message is delivered: later messages still come out whole (under
    ``make asan`` this also checks no freed state is touched)."""
    log = make_log(mtu=1408)
    app = PyExclusiveAppender(log)
    messages = [payload_of(3000 + i, i) for i in range(4)]
    for message in messages:
        app.append(message, BIG)
    term, header = log.terms[0], Header(7, TERM.bit_length() - 1)
    got: list[bytes] = []
    other = fragment_term([(100 + i, 0x80, 10, False) for i in range(40)])  # 40 begun messages

    def handler(view: memoryview, h: Header) -> None:
        got.append(bytes(view))
        assembler.free_session_buffer(42)
        reader(other, other.cast("i"), 0, assembler, 100, Header(7, TERM.bit_length() - 1))

    assembler = make(handler)
    reader(term, term.cast("i"), 0, assembler, 1000, header)
    assert got == messages


def offset_after(term: memoryview, frames: int) -> int:
    offset = 0
    for _ in range(frames):
        offset += (struct.unpack_from("<i", term, offset)[0] + 31) & -32
    return offset


# ---- image poll -----------------------------------------------------------------------------------


def make_image(cls: Any, mapping: mmap.mmap, values: memoryview, join_position: int) -> Any:
    """An image of class ``cls`` (C or pure) of session 42, stream 1001 over ``mapping``, publishing its
    position into ``values[2]``."""
    return cls(
        subscription_registration_id=1,
        correlation_id=2,
        session_id=42,
        stream_id=1001,
        source_identity="test",
        mapping=mapping,
        position_values=values,
        position_index=2,
        join_position=join_position,
    )


def poll_image(cls: Any, raw: bytes, start: int, limits: list[int], raise_at: int | None) -> list[object]:
    """Poll an image of class ``cls`` over a copy of ``raw`` (a whole log) from ``start``: what the handler
    got, each poll's result (or error) and the position, the published counter and the image's flags."""
    mapping = mmap.mmap(-1, len(raw))
    mapping[:] = raw
    values = memoryview(bytearray(32)).cast("q")
    image = make_image(cls, mapping, values, start)
    recorder = Recorder(raise_at)
    out: list[object] = []
    for limit in limits:
        try:
            result: object = image.poll(recorder, limit)
        except KeyError as exc:
            result = ("KeyError", str(exc))
        out.append((result, image.position, values[2], image.is_corrupt, image.is_closed, image.has_frame()))
    out.append(recorder.seen)
    return out


@SETTINGS
@given(
    sizes_st,
    st.booleans(),
    corruptions,
    st.integers(0, 45),
    st.lists(st.integers(1, 30), min_size=1, max_size=6),
    st.none() | st.integers(1, 40),
)
def test_image_poll_matches_reference(
    sizes: list[int],
    equal: bool,
    damage: list[tuple[str, int, int]],
    start: int,
    limits: list[int],
    raise_at: int | None,
) -> None:
    """``Image.poll`` in C against ``PyImage.poll``: fragments, positions (and the counter the publisher
    reads), a raising handler's frame consumed, a corrupt frame closing the image."""
    term, offsets = messy_term(sizes, equal, damage)
    raw = bytes(term.obj)  # type: ignore[arg-type]  # the whole log the term is a slice of
    begin = offsets[start % len(offsets)]
    assert poll_image(Image, raw, begin, limits, raise_at) == poll_image(PyImage, raw, begin, limits, raise_at)


PollOp = tuple[str, int, int]
poll_ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 3000), st.integers(1, 12)),  # size, how many
        st.tuples(st.just("claim_abort"), st.integers(0, 1376), st.integers(1, 3)),  # a PAD in the term
        st.tuples(st.just("poll"), st.integers(1, 40), st.integers(0, 0)),
    ),
    min_size=1,
    max_size=60,
)


class TermRecorder(Recorder):
    """Records the term too: a fragment's (term_id, offset) is its place in the stream."""

    def __call__(self, view: memoryview, header: Header) -> None:
        self.seen.append((bytes(view), header.offset, view.readonly, view.format, header.frame_length))
        self.terms.append(header.term_id)
        if self.raise_at is not None and len(self.seen) == self.raise_at:
            raise KeyError("handler failed")

    def __init__(self, raise_at: int | None) -> None:
        super().__init__(raise_at)
        self.terms: list[int] = []


def poll_across_terms(cls: Any, script: list[PollOp], start_offset: int, raise_at: int | None) -> list[object]:
    """An appender writes a shared log while an image of class ``cls`` polls it, the appender held to one
    term ahead of the image (a publication limit), so the stream rolls over several terms: padding at
    each term's end, aborted claims, fragmented messages. What the handler got, each poll's result and
    the positions and counters after it, the appender's results."""
    mapping = mmap.mmap(-1, compute_log_length(TERM))
    log = LogBuffers(memoryview(mapping), TERM)
    log.initialize(initial_term_id=7, term_id=7, term_offset=start_offset, session_id=42, stream_id=1001, mtu=1408)
    log.is_connected = True
    app = PyExclusiveAppender(log)
    values = memoryview(bytearray(32)).cast("q")
    image = make_image(cls, mapping, values, app.position)
    recorder = TermRecorder(raise_at)
    out: list[object] = []
    for n, (op, size, extra) in enumerate(script):
        limit = image.position + TERM  # the publication window: never laps the image
        if op == "offer":
            out.append([app.append(payload_of(size, n + i), limit) for i in range(extra)])
        elif op == "claim_abort":
            for _ in range(extra):
                claim = BufferClaim()
                result = app.claim(size, limit, claim)
                if result > 0:
                    claim.abort()
                out.append(result)
        else:
            try:
                polled: object = image.poll(recorder, size)
            except KeyError as exc:
                polled = ("KeyError", str(exc))
            out.append((polled, image.position, values[2], image.is_corrupt, image.is_closed))
        out.append(image.has_frame())  # (what a spinning poller asks between cycles)
    while image.position < app.position and not image.is_closed:  # drain what is left
        before = image.position
        with contextlib.suppress(KeyError):
            image.poll(recorder, 50)
        out.append((image.position, values[2]))
        if image.position == before:
            break
    out += [recorder.seen, recorder.terms, app.position, image.position]
    return out


@SETTINGS
@given(poll_ops, st.sampled_from([0, TERM - 4096, TERM - 1024, TERM - 96]), st.none() | st.integers(1, 200))
def test_image_poll_across_terms_matches_reference(
    script: list[PollOp], start_offset: int, raise_at: int | None
) -> None:
    """``Image.poll`` in C against ``PyImage.poll`` over a log the appender fills across term rollovers."""
    fast = poll_across_terms(Image, script, start_offset, raise_at)
    assert fast == poll_across_terms(PyImage, script, start_offset, raise_at)


def test_image_poll_reads_several_terms() -> None:
    """The property test's log does roll over: a fixed script crosses three term boundaries, and both
    images deliver every message in order with the positions the appender reached."""
    script: list[PollOp] = [("offer", 2900, 10), ("poll", 40, 0), ("claim_abort", 500, 2), ("poll", 40, 0)] * 10
    fast = poll_across_terms(Image, script, TERM - 4096, None)
    assert fast == poll_across_terms(PyImage, script, TERM - 4096, None)
    terms = fast[-3]
    assert isinstance(terms, list) and len(set(terms)) >= 4
    assert fast[-1] == fast[-2] > 3 * TERM


def test_type_stubs_cover_the_module() -> None:
    """Every name the extension exports is in ``_fastpath.pyi``, and the stub names nothing it lacks."""
    import ast
    from pathlib import Path

    assert FAST is not None
    stub = ast.parse((Path(__file__).parents[1] / "src/slipstream/logbuffer/_fastpath.pyi").read_text())
    declared = {n.name for n in stub.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    exported = {name for name in dir(FAST) if not name.startswith("_")}
    assert declared == exported


def test_fast_path_reported_and_disabled_by_environment() -> None:
    assert fast_path_active()
    code = "import slipstream; print(slipstream.fast_path_active())"
    env = {**os.environ, "SLIPSTREAM_NO_EXTENSIONS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    version = subprocess.run(
        [sys.executable, "-m", "slipstream", "--version"], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert "C extension" in version.stdout


# ---- atomics on shared memory (files/ringbuffer.py, files/broadcast.py) ----------------------------------


ATOMIC_WRITES = [
    ("compare_and_set_i64", 8, (0, 1)),
    ("get_and_add_i64", 8, (1,)),
    ("store_release_i64", 8, (5,)),
    ("store_release_i32", 4, (5,)),
]
ATOMIC_LOADS = [("load_acquire_i64", 8), ("load_acquire_i32", 4)]


@pytest.mark.parametrize(("name", "width", "rest"), ATOMIC_WRITES + [(n, w, ()) for n, w in ATOMIC_LOADS])
def test_atomics_check_bounds_and_alignment(name: str, width: int, rest: tuple[int, ...]) -> None:
    fn = getattr(FAST, name)
    with mmap.mmap(-1, 64) as mem:
        for offset in (-width, -1, 64 - width + 1, 64, 2**40, 2**70, -(2**70)):
            with pytest.raises(ValueError, match="outside the buffer"):
                fn(mem, offset, *rest)
        for offset in range(1, width):
            with pytest.raises(ValueError, match="aligned"):
                fn(mem, offset, *rest)
        view = memoryview(mem)
        for offset in (0, 8, 48):  # aligned in memory: the view's start, not only the offset, counts
            with pytest.raises(ValueError, match="aligned"):
                fn(view[1:], offset, *rest)
        fn(mem, 64 - width, *rest)
        with pytest.raises(TypeError):
            fn(mem)
        with pytest.raises(TypeError):
            fn(mem, "0", *rest)
        del view


@pytest.mark.parametrize(("name", "width", "rest"), ATOMIC_WRITES)
def test_atomic_writes_need_a_writable_buffer(name: str, width: int, rest: tuple[int, ...]) -> None:
    with mmap.mmap(-1, 64) as mem:
        readonly = memoryview(mem).toreadonly()
        with pytest.raises((TypeError, BufferError)):
            getattr(FAST, name)(readonly, 0, *rest)
        assert mem[:] == bytes(64)
        del readonly


def test_atomic_loads_read_a_readonly_buffer() -> None:
    with mmap.mmap(-1, 64) as mem:
        struct.pack_into("<qi", mem, 8, -(2**63), -7)
        readonly = memoryview(mem).toreadonly()
        assert FAST.load_acquire_i64(readonly, 8) == -(2**63)
        assert FAST.load_acquire_i32(readonly, 16) == -7
        del readonly


def test_atomic_values_out_of_range() -> None:
    with mmap.mmap(-1, 64) as mem:
        with pytest.raises(OverflowError):
            FAST.store_release_i32(mem, 0, 2**31)
        with pytest.raises(OverflowError):
            FAST.store_release_i64(mem, 0, 2**63)
        with pytest.raises(OverflowError):
            FAST.compare_and_set_i64(mem, 0, 0, -(2**63) - 1)
        assert mem[:] == bytes(64)


ATOMIC_OP = st.one_of(
    st.tuples(st.just("cas"), st.integers(0, 3), st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(-(2**63), 2**63 - 1), st.just(0)),
    st.tuples(st.just("store64"), st.integers(0, 3), st.integers(-(2**63), 2**63 - 1), st.just(0)),
    st.tuples(st.just("store32"), st.integers(0, 7), st.integers(-(2**31), 2**31 - 1), st.just(0)),
)


@SETTINGS
@given(st.lists(ATOMIC_OP, max_size=40))
def test_atomics_against_a_python_model(ops: list[tuple[str, int, int, int]]) -> None:
    """Each operation against plain struct arithmetic on a copy (get-and-add wraps as two's complement);
    the pure-Python acquire loads of fastpath.py read the same values as the C ones."""
    from slipstream.logbuffer import fastpath

    with mmap.mmap(-1, 32) as mem:
        model = bytearray(32)
        for op, index, a, b in ops:
            if op == "cas":
                current = struct.unpack_from("<q", model, index * 8)[0]
                swapped = current == a
                if swapped:
                    struct.pack_into("<q", model, index * 8, b)
                assert FAST.compare_and_set_i64(mem, index * 8, a, b) is swapped
            elif op == "add":
                current = struct.unpack_from("<q", model, index * 8)[0]
                total = (current + a + 2**63) % 2**64 - 2**63
                struct.pack_into("<q", model, index * 8, total)
                assert FAST.get_and_add_i64(mem, index * 8, a) == current
            elif op == "store64":
                struct.pack_into("<q", model, index * 8, a)
                FAST.store_release_i64(mem, index * 8, a)
            else:
                struct.pack_into("<i", model, index * 4, a)
                FAST.store_release_i32(mem, index * 4, a)
            assert mem[:] == model
        for index in range(4):
            assert FAST.load_acquire_i64(mem, index * 8) == fastpath._plain_load(mem, index * 8, 8)
        for index in range(8):
            assert FAST.load_acquire_i32(mem, index * 4) == fastpath._plain_load(mem, index * 4, 4)
