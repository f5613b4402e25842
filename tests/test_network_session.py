"""The record layer: round trips, reordering within the window, replays, forgeries and bad lengths."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network import session
from slipstream.network.errors import NetworkError, RecordMalformed, RecordRejected, RecordReplayed, RecordTampered
from slipstream.network.session import RECORD_OVERHEAD, RecordLayer


def pair(window: int = 4096) -> tuple[RecordLayer, RecordLayer]:
    a_to_b, b_to_a = os.urandom(32), os.urandom(32)
    return RecordLayer(a_to_b, b_to_a, replay_window=window), RecordLayer(b_to_a, a_to_b, replay_window=window)


def test_round_trip_both_ways() -> None:
    a, b = pair()
    for text in (b"", b"x", bytes(range(256)) * 40):
        record = a.seal(text)
        assert len(record) == len(text) + RECORD_OVERHEAD
        assert b.open(record) == text
        assert a.open(b.seal(bytearray(text))) == text
    assert b.open(memoryview(a.seal(memoryview(b"view")))) == b"view"
    assert a.records_sealed == b.records_opened == 4 and a.records_opened == b.records_sealed == 3


def test_large_records_are_sealed_in_place_and_opened_from_a_view() -> None:
    """From 4 KiB a record is encrypted into its own buffer (no second copy) and a record is opened
    from a view (of the log) without copying it first: the same bytes on the wire, the same checks."""
    a, b = pair()
    for size in (4095, 4096, 70_000):
        text = os.urandom(size)
        record = a.seal(memoryview(text))
        assert len(record) == size + RECORD_OVERHEAD
        shared = bytearray(b"\xff" * 5 + bytes(record) + b"\xff" * 5)  # a record inside a larger buffer
        shared[5 + 8 + size // 2] ^= 1
        with pytest.raises(RecordTampered):
            b.open(memoryview(shared)[5:-5])
        shared[5 + 8 + size // 2] ^= 1
        assert b.open(memoryview(shared)[5:-5]) == text


def test_both_sealing_paths_make_the_same_record(monkeypatch: pytest.MonkeyPatch) -> None:
    key, text = os.urandom(32), os.urandom(5000)
    in_place = RecordLayer(key, os.urandom(32)).seal(text)
    monkeypatch.setattr(session, "_SEAL_INTO_FROM", 1 << 30)  # everything through the concatenation
    concatenated = RecordLayer(key, os.urandom(32)).seal(text)
    assert isinstance(in_place, bytearray) and isinstance(concatenated, bytes)
    assert bytes(in_place) == concatenated


def test_counters_are_big_endian_and_never_repeat() -> None:
    a, _ = pair()
    records = [a.seal(b"same") for _ in range(5)]
    assert [int.from_bytes(r[:8], "big") for r in records] == [0, 1, 2, 3, 4]
    assert len({r[8:] for r in records}) == 5  # a new nonce each time, so a new ciphertext
    assert a.send_counter == 5


def test_reordering_within_the_window_is_accepted_once() -> None:
    a, b = pair(window=64)
    records = [a.seal(i.to_bytes(2, "big")) for i in range(200)]
    order = list(range(200))
    rng = random.Random(7)
    for start in range(0, 200, 32):  # shuffle inside blocks narrower than the window
        block = order[start : start + 32]
        rng.shuffle(block)
        order[start : start + 32] = block
    for i in order:
        assert b.open(records[i]) == i.to_bytes(2, "big")
    for i in rng.sample(range(200), 20):
        with pytest.raises(RecordReplayed):
            b.open(records[i])
    assert b.records_opened == 200 and b.rejected_replayed == 20


def test_replay_refused() -> None:
    a, b = pair()
    record = a.seal(b"once")
    assert b.open(record) == b"once"
    with pytest.raises(RecordReplayed, match="already"):
        b.open(record)
    assert b.rejected_replayed == 1 and b.records_opened == 1


def test_too_old_refused_but_late_within_window_accepted() -> None:
    a, b = pair(window=16)
    records = [a.seal(b"%d" % i) for i in range(40)]
    b.open(records[39])
    assert b.open(records[24]) == b"24"  # 39 - 24 = 15 < 16
    with pytest.raises(RecordReplayed, match="older"):
        b.open(records[23])
    with pytest.raises(RecordReplayed):
        b.open(records[0])
    assert b.rejected_replayed == 2


def test_tampering_refused_and_does_not_mark_the_counter() -> None:
    a, b = pair()
    record = bytearray(a.seal(b"payload"))
    for position in (0, 7, 8, len(record) - 1):  # counter, ciphertext, tag
        forged = bytearray(record)
        forged[position] ^= 0x01
        with pytest.raises(RecordTampered):
            b.open(bytes(forged))
    assert b.open(bytes(record)) == b"payload"  # the real one still gets through
    c, _ = pair()
    c.seal(b"skip counter 0, which b has accepted")
    with pytest.raises(RecordTampered):
        b.open(c.seal(b"other key"))
    assert b.rejected_tampered == 5 and b.records_opened == 1


def test_malformed_lengths_refused() -> None:
    layer = RecordLayer(bytes(32), bytes(32), max_record=100)
    for size in (0, 1, 8, RECORD_OVERHEAD - 1, 101, 5000):
        with pytest.raises(RecordMalformed):
            layer.open(bytes(size))
    assert layer.rejected_malformed == 6 and layer.rejected == 6 and layer.records_opened == 0


def test_own_records_do_not_open_as_received() -> None:
    a, _ = pair()
    with pytest.raises(RecordTampered):
        a.open(a.seal(b"reflected"))  # the directions have different keys


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_random_bytes_only_raise_record_rejected(data: bytes) -> None:
    _, b = pair()
    with pytest.raises(RecordRejected):
        b.open(data)
    assert b.rejected == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        RecordLayer(b"short", bytes(32))
    with pytest.raises(ValueError, match="replay_window"):
        RecordLayer(bytes(32), bytes(32), replay_window=0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(0, 119), max_size=300))
def test_window_matches_a_model(window: int, arrivals: list[int]) -> None:
    """Any arrival order (duplicates included) is accepted exactly as a set-and-highest model says."""
    a, b = pair(window)
    records = [a.seal(i.to_bytes(1, "big")) for i in range(120)]
    seen: set[int] = set()
    highest = -1
    for i in arrivals:
        fresh = i not in seen and i > highest - window
        if fresh:
            assert b.open(records[i]) == i.to_bytes(1, "big")
            seen.add(i)
            highest = max(highest, i)
        else:
            with pytest.raises(RecordReplayed):
                b.open(records[i])
    assert b.records_opened == len(seen) and b.rejected_replayed == len(arrivals) - len(seen)


def test_counter_never_wraps() -> None:
    a, b = pair()
    a._send_counter = 2**64 - 2  # as if 2**64 - 2 records had been sealed
    last = a.seal(b"last")
    assert b.open(last) == b"last"
    with pytest.raises(NetworkError, match="exhausted"):
        a.seal(b"one too many")
    assert a.records_sealed == 1 and a.send_counter == 2**64 - 1


def test_noise_keys_records_frames_and_messages_end_to_end() -> None:
    """The core pieces composed as a connection uses them: XX handshake, split keys, sealed batches."""
    import msgspec

    from slipstream.network.frames import FrameKind
    from slipstream.network.noise import HandshakeState, generate_keypair
    from slipstream.network.serialization import Serialization

    class Tick(msgspec.Struct):
        number: int
        ratio: float
        name: str

    client = HandshakeState(initiator=True, static_private=generate_keypair()[0])
    server = HandshakeState(initiator=False, static_private=generate_keypair()[0])
    server.read_message(client.write_message())
    client.read_message(server.write_message())
    server.read_message(client.write_message())
    (c_send, c_receive), (s_send, s_receive) = client.split(), server.split()
    client_records = RecordLayer(c_send.key, c_receive.key)
    server_records = RecordLayer(s_send.key, s_receive.key)
    serialization = Serialization([Tick])
    batch = bytearray()
    for i in range(1000):
        serialization.encode_frame_into(batch, FrameKind.MESSAGE, 0, Tick(i, i / 2, "t"))
    serialization.encode_frame_into(batch, FrameKind.SYNC_REQUEST, 77, "sync")
    record = client_records.seal(batch)
    assert bytes(batch[:64]) not in record and len(record) == len(batch) + RECORD_OVERHEAD
    received = serialization.decode_record(server_records.open(record))
    assert [value for _, _, value in received[:-1]] == [Tick(i, i / 2, "t") for i in range(1000)]
    assert received[-1] == (FrameKind.SYNC_REQUEST, 77, "sync")
    answer = server_records.seal(b"")
    assert client_records.open(answer) == b""
