"""Log buffer: layout, append, fragmentation, padding and rotation, reading, corruption."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slipstream.logbuffer import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    BufferClaim,
    ExclusiveAppender,
    Header,
    LogBufferError,
    LogBuffers,
    compute_log_length,
    read_term,
    scan_term,
    unblock,
)
from slipstream.wire.constants import HDR_TYPE_PAD, TERM_MIN_LENGTH
from slipstream.wire.positions import pack_tail

TERM = TERM_MIN_LENGTH
BIG = 1 << 62


def make_log(initial_term_id: int = 7, mtu: int = 1408, connected: bool = True) -> LogBuffers:
    log = LogBuffers(bytearray(compute_log_length(TERM)), TERM)
    log.initialize(initial_term_id=initial_term_id, session_id=42, stream_id=1001, mtu=mtu)
    log.is_connected = connected
    return log


class Reader:
    """Reads a log from position 0 across terms, reassembling nothing: collects raw fragments."""

    def __init__(self, log: LogBuffers) -> None:
        self.log = log
        self.position = 0
        self.header = Header(log.initial_term_id, log.bits)
        self.fragments: list[tuple[bytes, int, int]] = []

    def _on(self, payload: memoryview, header: Header) -> None:
        self.fragments.append((bytes(payload), header.flags, header.session_id))

    def poll(self, limit: int = 1_000_000) -> int:
        total = 0
        while True:
            index = (self.position >> self.log.bits) % 3
            offset = self.position & (self.log.term_length - 1)
            n, nxt, intact = read_term(
                self.log.terms[index], self.log.terms_i32[index], offset, self._on, limit, self.header
            )
            assert intact
            total += n
            if nxt == offset:
                return total
            self.position += nxt - offset


def offer(app: ExclusiveAppender, payload: bytes) -> int:
    while True:
        result = app.append(payload, BIG)
        if result != ADMIN_ACTION:
            return result


def test_layout_matches_reference() -> None:
    log = make_log(initial_term_id=7)
    assert compute_log_length(TERM) == 3 * TERM + 4096
    assert log.raw_tail(0) == pack_tail(7, 0)
    assert log.raw_tail(1) == pack_tail(7 + 1 - 3, 0)
    assert log.raw_tail(2) == pack_tail(7 + 2 - 3, 0)
    assert log.default_header()[5] == 0xC0 and log.default_header()[6] == 1
    assert struct.unpack_from("<iii", log.default_header(), 12) == (42, 1001, 7)
    again = LogBuffers(log._buffer)  # term length found from the metadata
    assert again.term_length == TERM and again.initial_term_id == 7 and again.session_id == 42
    again.validate()


def test_unfragmented_frame_bytes() -> None:
    log = make_log()
    app = ExclusiveAppender(log)
    assert app.append(b"x" * 14, BIG) == 64  # frame_length 46, aligned to 64
    frame = bytes(log.terms[0][:64])
    assert struct.unpack_from("<iBBHiiii", frame) == (46, 0, 0xC0, 1, 0, 42, 1001, 7)
    assert frame[32:46] == b"x" * 14 and frame[46:64] == bytes(18)
    assert log.producer_position() == 64


def test_fragmentation_flags_and_reassembly_order() -> None:
    log = make_log(mtu=128)  # max payload 96
    app = ExclusiveAppender(log)
    message = bytes(range(250))
    assert offer(app, message) > 0
    reader = Reader(log)
    reader.poll()
    assert [f[1] for f in reader.fragments] == [0x80, 0x00, 0x40]
    assert b"".join(f[0] for f in reader.fragments) == message


def test_rotation_pads_term_end_and_zeroes_reused_partition() -> None:
    log = make_log()
    app = ExclusiveAppender(log)
    reader = Reader(log)
    rng = random.Random(1)
    sent = []
    admin = 0
    for i in range(20_000):
        payload = rng.randbytes(rng.randint(0, 3000))
        # The publication window: at most half a term ahead of the reader.
        while (result := app.append(payload, reader.position + TERM // 2)) in (ADMIN_ACTION, BACK_PRESSURED):
            if result == ADMIN_ACTION:
                admin += 1
            else:
                reader.poll()
        assert result > 0
        sent.append(payload)
        if i % 50 == 0:
            reader.poll()
    reader.poll()
    assert admin > 3  # several rotations, so partitions were reused
    # Reassemble fragments.
    messages, partial = [], b""
    for data, flags, _ in reader.fragments:
        partial += data
        if flags & 0x40:
            messages.append(partial)
            partial = b""
    assert messages == sent
    assert reader.position == log.producer_position() == app.position
    # Entering a term whose partition held older data: it is already clean, so a reader that
    # finishes the previous term (even without a pad) finds zeros there, not frames three terms old.
    while (result := app.append(b"x" * 100, reader.position + TERM // 2)) != ADMIN_ACTION:
        if result == BACK_PRESSURED:
            reader.poll()
    assert log.active_term_count >= 3
    assert not any(log.terms[log.active_term_count % 3])


def test_back_pressure_codes() -> None:
    log = make_log(connected=False)
    app = ExclusiveAppender(log)
    assert app.append(b"a", 0) == NOT_CONNECTED
    log.is_connected = True
    assert app.append(b"a", 0) == BACK_PRESSURED
    with pytest.raises(ValueError, match="maximum message length"):
        app.append(bytes(TERM // 8 + 1), BIG)


def test_max_position_exceeded() -> None:
    log = LogBuffers(bytearray(compute_log_length(TERM)), TERM)
    last_term = 7 + (1 << 31) - 1  # wraps: the final term a log can hold
    from slipstream.wire.positions import wrap_i32

    log.initialize(
        initial_term_id=7, term_id=wrap_i32(last_term), term_offset=TERM - 64, session_id=1, stream_id=1, mtu=1408
    )
    log.is_connected = True
    app = ExclusiveAppender(log)
    assert app.append(b"x" * 100, BIG) == MAX_POSITION_EXCEEDED
    assert app.append(b"x", app.position) == MAX_POSITION_EXCEEDED


def test_try_claim_commit_and_abort() -> None:
    log = make_log()
    app = ExclusiveAppender(log)
    claim = BufferClaim()
    assert app.claim(5, BIG, claim) == 64
    claim.buffer[:] = b"hello"
    reader = Reader(log)
    assert reader.poll() == 0  # not committed yet: the reader waits
    claim.commit()
    assert app.claim(3, BIG, claim) == 128
    claim.abort()
    app.append(b"after", BIG)
    reader.poll()
    assert [f[0] for f in reader.fragments] == [b"hello", b"after"]
    with pytest.raises(RuntimeError):
        claim.commit()
    with pytest.raises(ValueError):
        app.claim(2000, BIG, claim)


def test_unblock_pads_a_claim_its_writer_abandoned() -> None:
    log = make_log()
    app = ExclusiveAppender(log)
    app.append(b"before", BIG)
    claim = BufferClaim()
    stuck = app.position
    assert app.claim(100, BIG, claim) > stuck  # the writer dies here: never committed
    app.append(b"after", BIG)
    reader = Reader(log)
    reader.poll()
    assert [f[0] for f in reader.fragments] == [b"before"]  # stopped at the claim
    assert not unblock(log, 0)  # a committed frame is left alone
    assert unblock(log, stuck)
    assert not unblock(log, stuck)  # once is enough: it is padding now
    reader.poll()
    assert [f[0] for f in reader.fragments] == [b"before", b"after"]


def test_scan_term_blocks_and_padding() -> None:
    log = make_log()
    app = ExclusiveAppender(log)
    for _ in range(10):
        app.append(bytes(100), BIG)  # 160-byte frames
    term = log.terms[0]
    assert scan_term(term, log.terms_i32[0], 0, 1408) == (1280, 0)
    assert scan_term(term, log.terms_i32[0], 1280, 1408) == (320, 0)
    # Fill to the end so a pad is written.
    while app.append(bytes(1000), BIG) != ADMIN_ACTION:
        pass
    pad_offset = app.position - TERM if app.position >= TERM else None
    assert pad_offset == 0  # rotated to term 1
    off = 0
    while True:
        available, padding = scan_term(term, log.terms_i32[0], off, 1408)
        if padding:
            assert term[off + available - 32 + 6] == HDR_TYPE_PAD
            assert off + available + padding == TERM
            break
        assert available > 0
        off += available


@pytest.mark.parametrize(
    "corruption",
    [
        lambda t: struct.pack_into("<i", t, 0, 10),  # shorter than a header
        lambda t: struct.pack_into("<i", t, 0, 1 << 30),  # past the term
        lambda t: struct.pack_into("<H", t, 6, 0x99),  # unknown type
    ],
)
def test_corrupted_log_does_not_crash_reader(corruption) -> None:  # type: ignore[no-untyped-def]
    log = make_log()
    app = ExclusiveAppender(log)
    app.append(b"abc", BIG)
    corruption(log.terms[0])
    header = Header(log.initial_term_id, log.bits)
    assert read_term(log.terms[0], log.terms_i32[0], 0, lambda p, h: None, 10, header) == (0, 0, False)


def test_random_garbage_log_never_raises() -> None:
    rng = random.Random(5)
    header = Header(0, 16)
    for _ in range(200):
        term = memoryview(bytearray(rng.randbytes(4096)))
        offset = 0
        for _ in range(50):
            _, nxt, intact = read_term(term, term.cast("i"), offset, lambda p, h: (bytes(p), h.position), 100, header)
            if not intact or nxt == offset or nxt >= len(term):
                break
            offset = nxt
        scan_term(term, term.cast("i"), rng.randrange(0, 4096, 32), 1408)


def test_foreign_buffer_rejected() -> None:
    with pytest.raises(LogBufferError):
        LogBuffers(bytearray(1000))
    with pytest.raises(LogBufferError):
        LogBuffers(bytearray(compute_log_length(TERM)))  # no metadata written
    log = make_log()
    reader_view = LogBuffers(memoryview(bytes(log._buffer)))  # read-only is fine for readers
    with pytest.raises(TypeError):
        reader_view.is_connected = False


def _messy_log(
    sizes: list[int],
    equal: bool,
    claimed: int | None,
    pad_at: int | None,
    flips: list[tuple[int, int]],
    start: int,
    payload: Callable[[int], bytes],
) -> tuple[LogBuffers, int]:
    """A term of messages of ``sizes`` (all of the first size if ``equal``), one of them claimed and
    never committed (its length stays negative), one turned into a PAD frame and some bytes
    overwritten; with the offset of message ``start`` (or the last) to read or scan from."""
    log = make_log()
    app = ExclusiveAppender(log)
    offsets = []
    for i, size in enumerate(sizes if not equal else [sizes[0]] * len(sizes)):
        offsets.append(app.position)
        if i == claimed:
            app.claim(min(size, 1000), BIG, BufferClaim())
        else:
            app.append(payload(size), BIG)
    term = log.terms[0]
    if pad_at is not None and pad_at < len(offsets):
        struct.pack_into("<H", term, offsets[pad_at] + 6, HDR_TYPE_PAD)
    for index, value in flips:
        term[index] = value
    return log, offsets[min(start, len(offsets) - 1)]


def _scan_term_walk(term: memoryview, term_i32: memoryview, offset: int, max_length: int) -> tuple[int, int]:
    """``scan_term`` frame by frame, as written before its equal-frames shortcut: the reference."""
    available = padding = 0
    while offset + available < len(term):
        frame_offset = offset + available
        frame_length = term_i32[frame_offset >> 2]
        if frame_length <= 0 or frame_length > len(term) - frame_offset:
            break
        aligned = (frame_length + 31) & -32
        if term[frame_offset + 6] == HDR_TYPE_PAD:
            padding, aligned = aligned - 32, 32
        if available + aligned > max_length:
            padding = 0
            break
        available += aligned
        if padding:
            break
    return available, padding


@settings(max_examples=300, deadline=None)
@example(sizes=[100] * 10, equal=True, claimed=None, pad_at=3, flips=[], start=0, max_length=1408)
@example(sizes=[100] * 10, equal=True, claimed=4, pad_at=None, flips=[], start=0, max_length=1408)
@example(sizes=[100] * 10, equal=True, claimed=None, pad_at=None, flips=[(640, 99)], start=0, max_length=1408)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    equal=st.booleans(),
    claimed=st.none() | st.integers(0, 40),
    pad_at=st.none() | st.integers(0, 40),
    flips=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=2),
    start=st.integers(0, 20),
    max_length=st.sampled_from([0, 32, 64, 96, 500, 1408, 4096]),
)
def test_scan_term_agrees_with_the_frame_walk(
    sizes: list[int],
    equal: bool,
    claimed: int | None,
    pad_at: int | None,
    flips: list[tuple[int, int]],
    start: int,
    max_length: int,
) -> None:
    """Runs of equal frames take a shortcut; whatever the log holds (uncommitted claims, a PAD frame,
    corrupt bytes), the answer is the frame walk's."""
    log, offset = _messy_log(sizes, equal, claimed, pad_at, flips, start, bytes)
    term = log.terms[0]
    assert scan_term(term, log.terms_i32[0], offset, max_length) == _scan_term_walk(
        term, log.terms_i32[0], offset, max_length
    )


def _read_term_walk(term: memoryview, term_i32: memoryview, offset: int, limit: int) -> tuple[list[int], int, bool]:
    """``read_term`` frame by frame, as written before its equal-frames shortcut: the reference.
    Returns the offsets of the frames delivered, the next offset and whether the log was intact."""
    delivered: list[int] = []
    while len(delivered) < limit and offset < len(term):
        frame_length = term_i32[offset >> 2]
        if frame_length <= 0:
            break
        if frame_length < 32 or frame_length > len(term) - offset:
            return delivered, offset, False
        frame_offset, offset = offset, offset + ((frame_length + 31) & -32)
        if term[frame_offset + 6] != 1:
            if term[frame_offset + 6] == HDR_TYPE_PAD and term[frame_offset + 7] == 0:
                continue
            return delivered, frame_offset, False
        delivered.append(frame_offset)
    return delivered, offset, True


@settings(max_examples=300, deadline=None)
@example(sizes=[100] * 10, equal=True, claimed=None, pad_at=3, flips=[], start=0, limit=256)
@example(sizes=[100] * 10, equal=True, claimed=6, pad_at=None, flips=[], start=0, limit=256)
@example(sizes=[100] * 10, equal=True, claimed=None, pad_at=None, flips=[(642, 7)], start=0, limit=5)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    equal=st.booleans(),
    claimed=st.none() | st.integers(0, 40),
    pad_at=st.none() | st.integers(0, 40),
    flips=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=2),
    start=st.integers(0, 20),
    limit=st.sampled_from([1, 2, 3, 10, 256]),
)
def test_read_term_agrees_with_the_frame_walk(
    sizes: list[int],
    equal: bool,
    claimed: int | None,
    pad_at: int | None,
    flips: list[tuple[int, int]],
    start: int,
    limit: int,
) -> None:
    """Runs of equal frames are checked in one unpack; whatever the log holds, the fragments handed
    out (which, with which payload and header) and the offset reached are the frame walk's."""

    def patterned(size: int) -> bytes:  # payload bytes that differ, so a misplaced slice shows
        return bytes(range(256))[: size % 256] + bytes(max(0, size - 256))

    log, offset = _messy_log(sizes, equal, claimed, pad_at, flips, start, patterned)
    term = log.terms[0]
    seen: list[tuple[int, bytes, int]] = []
    header = Header(log.initial_term_id, log.bits)
    count, next_offset, intact = read_term(
        term, log.terms_i32[0], offset, lambda p, h: seen.append((h.offset, bytes(p), h.frame_length)), limit, header
    )
    walked, walk_next, walk_intact = _read_term_walk(term, log.terms_i32[0], offset, limit)
    assert (count, next_offset, intact) == (len(walked), walk_next, walk_intact)
    assert [s[0] for s in seen] == walked
    assert all(payload == bytes(term[o + 32 : o + length]) for o, payload, length in seen)


@given(
    raw_tail=st.integers(-(2**63), 2**63 - 1),
    bits=st.integers(16, 30),
    initial_term_id=st.integers(-(2**31), 2**31 - 1),
)
@example(raw_tail=(0x7FFF_FFFF << 32) | 0xFFFF_FFFF, bits=16, initial_term_id=-(2**31))
@example(raw_tail=-1, bits=30, initial_term_id=5)
def test_the_one_frame_tail_position_is_the_composed_arithmetic(raw_tail: int, bits: int, initial_term_id: int) -> None:
    """``raw_tail_position`` (what the driver reads on every cycle that moved a limit) is the composition of
    ``tail_term_id``, ``tail_term_offset`` and ``compute_position`` for any raw tail, term ids wrapping included."""
    from slipstream.wire.positions import compute_position, raw_tail_position, tail_term_id, tail_term_offset

    term_length = 1 << bits
    composed = compute_position(tail_term_id(raw_tail), tail_term_offset(raw_tail, term_length), bits, initial_term_id)
    assert raw_tail_position(raw_tail, term_length, bits, initial_term_id) == composed
