"""Plain messages delivered exactly once and in order across a lost connection and its successor
(``network.delivery``), in memory: connection pairs lost at random points with records in flight, then
rebuilt with the same two ``Delivery`` sessions; acknowledgements, retention bounds, resumption rules, the
wire with and without delivery."""

from __future__ import annotations

import os
import random

import msgspec
import pytest

from slipstream.network.connection import ConnectionMachine
from slipstream.network.delivery import Delivery, wire_number
from slipstream.network.events import Closed, MessageReceived
from slipstream.network.frames import FRAME_OVERHEAD, FrameKind, decode_frames
from slipstream.network.serialization import Serialization
from slipstream.network.session import PlainRecords
from slipstream.testing import ConnectionPair, LinkConditions
from slipstream.testing.connection import CLIENT
from slipstream.testing.network import Datagram

IN_FLIGHT = LinkConditions(delay_ns=1_000_000)
"""Every record spends 1 ms on the wire, so a connection lost at a random instant has records in flight."""


class Note(msgspec.Struct):
    n: int


def pair_with(
    delivery: tuple[Delivery | None, Delivery | None], *, batch_limit: int = 1376 - 24, temp_dir: str | None = None
) -> ConnectionPair:
    """A pair whose records spend 1 ms on the wire (``temp_dir``: with streaming)."""
    return ConnectionPair(
        types=[Note],
        conditions=IN_FLIGHT,
        delivery=delivery,
        batch_limit=batch_limit,
        streams=temp_dir is not None,
        temp_dir=temp_dir,
    )


def notes(events: list[object]) -> list[int]:
    return [e.message.n for e in events if isinstance(e, MessageReceived) and isinstance(e.message, Note)]


def lose(pair: ConnectionPair) -> None:
    """A dead driver: both machines learn the peer is gone, whatever was in flight never arrives."""
    pair.a.lost("the driver died")
    pair.b.lost("the driver died")


def send_note(pair: ConnectionPair, side: int, note: Note, lone: bool) -> bool:
    """``send``, or with ``lone`` the adapters' path for a lone message: sealed alone and put on the wire at once
    when nothing waits before it (``seal_lone``), else ``send``. Whether it went alone."""
    machine = pair.a if side == 0 else pair.b
    record = machine.seal_lone(note, pair.clock.now_ns()) if lone else None
    if record is None:
        machine.send(note)
        return False
    pair.inject("b" if side == 0 else "a", bytes(record))
    return True


@pytest.mark.parametrize("lone", [False, True], ids=["batched", "lone"])
def test_messages_survive_random_connection_losses_exactly_once_in_order_both_ways(lone: bool) -> None:
    total = 10_000
    rng = random.Random(2801)
    sessions = (Delivery(), Delivery())
    got_a: list[int] = []
    got_b: list[int] = []
    sent = [0, 0]
    pairs = 1
    alone = 0
    pair = pair_with(sessions)
    while sent[0] < total or sent[1] < total:
        for _ in range(rng.randint(1, 400)):
            side = rng.randrange(2)
            machine = pair.a if side == 0 else pair.b
            if sent[side] < total and not machine.retained_full:
                alone += send_note(pair, side, Note(sent[side]), lone and rng.random() < 0.7)
                sent[side] += 1
        pair.pump(duration_ns=rng.randint(0, 3_000_000), drain=False)
        if rng.random() < 0.4:
            lose(pair)
            got_a += notes(pair.events_a)
            got_b += notes(pair.events_b)
            pair = pair_with(sessions)
            pairs += 1
    pair.pump(duration_ns=50_000_000)
    got_a += notes(pair.events_a)
    got_b += notes(pair.events_b)
    print(f"{pairs} connections; duplicates dropped: {[s.duplicates_dropped for s in sessions]}")
    assert pairs > 20
    assert (alone > 100) == lone  # (the first message after each pump goes alone, if lone is on)
    assert got_b == list(range(total))
    assert got_a == list(range(total))
    assert sessions[0].duplicates_dropped + sessions[1].duplicates_dropped > 0, "replays met messages already had"
    assert all(s.unacknowledged == 0 and s.retained_bytes == 0 for s in sessions)


def test_a_replay_of_what_the_peer_delivered_is_dropped_and_counted_and_trimmed() -> None:
    sender, receiver = Delivery(), Delivery()
    pair = pair_with((sender, receiver))
    for i in range(100):
        pair.a.send(Note(i))
    pair.pump()  # delivered, but the acknowledgement waits for its timer: the connection dies first
    assert notes(pair.events_b) == list(range(100))
    assert sender.unacknowledged == 100 and receiver.delivered == 100
    lose(pair)
    pair = pair_with((sender, receiver))
    pair.a.send(Note(100))
    pair.pump()
    assert notes(pair.events_b) == [100]
    assert receiver.duplicates_dropped == 100
    assert sender.messages_replayed == 100
    assert sender.unacknowledged == 1  # the RESUME trimmed the 100; the new one waits for its ack


def test_acknowledgements_hold_retention_bounded_under_a_one_way_flood() -> None:
    sender = Delivery()
    pair = pair_with((sender, Delivery()))
    peak = 0
    for round_ in range(200):
        for i in range(250):
            pair.a.send(Note(round_ * 250 + i))
        pair.pump(duration_ns=1_000_000)
        peak = max(peak, sender.retained_bytes)
    pair.pump(duration_ns=20_000_000)
    assert notes(pair.events_b) == list(range(50_000))
    assert peak < 200_000, "at most about one ack period (10 ms) of traffic is retained"
    assert sender.retained_bytes == 0 and sender.unacknowledged == 0
    acks = [record for side, record in pair.wire if side == "b"]
    assert len(acks) <= 30, "acknowledged on a timer, not a record per message or per batch"


def test_retained_full_is_reported_then_cleared_and_nothing_is_dropped() -> None:
    by_count = Delivery(max_retained_messages=50)
    pair = pair_with((by_count, Delivery()))
    for i in range(49):
        pair.a.send(Note(i))
    assert not pair.a.retained_full
    pair.a.send(Note(49))
    assert pair.a.retained_full
    for i in range(50, 60):  # the adapter holds send back; the machine still takes what it is given
        pair.a.send(Note(i))
    pair.pump()
    assert pair.a.retained_full, "delivered, not yet acknowledged"
    pair.pump(duration_ns=20_000_000)
    assert not pair.a.retained_full
    assert notes(pair.events_b) == list(range(60))

    by_bytes = Delivery(max_retained_bytes=2_000)
    pair = pair_with((by_bytes, Delivery()))
    i = 0
    while not pair.a.retained_full:
        pair.a.send(Note(i))
        i += 1
        pair.pump(duration_ns=0, drain=False)  # sealed and retained, the acknowledgement not yet due
    assert by_bytes.retained_bytes >= 2_000
    pair.pump(duration_ns=20_000_000)
    assert not pair.a.retained_full and by_bytes.retained_bytes == 0
    assert notes(pair.events_b) == list(range(i))


def test_a_peer_with_a_new_session_id_is_counted_afresh() -> None:
    mine, theirs = Delivery(), Delivery()
    pair = pair_with((mine, theirs))
    for i in range(30):
        pair.b.send(Note(i))
    pair.pump(duration_ns=20_000_000)
    assert mine.delivered == 30
    for i in range(5):  # to the old process, never acknowledged: it dies with them in flight
        pair.a.send(Note(i))
    pair.pump(duration_ns=0, drain=False)
    lose(pair)
    restarted = Delivery()
    pair = pair_with((mine, restarted))
    for i in range(3):
        pair.b.send(Note(i))
    pair.pump(duration_ns=20_000_000)
    assert notes(pair.events_a) == [0, 1, 2], "numbers 1-3 again: a new process, not duplicates"
    assert mine.peer_session_id == restarted.session_id and mine.delivered == 3
    assert notes(pair.events_b) == [0, 1, 2, 3, 4], "what the old process never acknowledged goes to the new"
    assert mine.unacknowledged == 0 and mine.duplicates_dropped == 0


def test_a_peer_without_delivery_turns_ours_off_for_that_connection() -> None:
    mine = Delivery(max_retained_messages=100)
    pair = pair_with((mine, None))
    for i in range(500):
        pair.a.send(Note(i))
        pair.b.send(Note(i))
        if i % 50 == 0:
            pair.pump(duration_ns=0, drain=False)
    pair.pump(duration_ns=20_000_000)
    assert notes(pair.events_b) == list(range(500))
    assert notes(pair.events_a) == list(range(500))
    assert not mine.sequencing and mine.retained_bytes == 0 and mine.unacknowledged == 0
    assert not pair.a.retained_full, "an old peer never acknowledges: it must not hold our sends forever"
    assert pair.b.stats.frame_errors == 0, "a peer that knows the kinds ignores RESUME"
    sent = mine.sent
    pair.a.send(Note(500))
    assert mine.sent == sent, "nothing more is numbered on this connection"

    lose(pair)  # the next connection tries again
    other = Delivery()
    pair = pair_with((mine, other))
    pair.a.send(Note(0))
    pair.pump(duration_ns=20_000_000)
    assert mine.sequencing and mine.peer_heard and other.delivered == mine.sent


def test_numbers_wrap_past_2_32_across_a_loss() -> None:
    start = 2**32 - 40
    sessions = (Delivery(first_number=start), Delivery(first_number=start))
    pair = pair_with(sessions)
    for i in range(30):
        pair.a.send(Note(i))
        pair.b.send(Note(i))
    pair.pump(duration_ns=20_000_000)
    for i in range(30, 80):  # across the wrap, lost in flight
        pair.a.send(Note(i))
        pair.b.send(Note(i))
    pair.pump(duration_ns=0, drain=False)
    got_a, got_b = notes(pair.events_a), notes(pair.events_b)
    lose(pair)
    pair = pair_with(sessions)
    for i in range(80, 100):
        pair.a.send(Note(i))
        pair.b.send(Note(i))
    pair.pump(duration_ns=20_000_000)
    assert got_b + notes(pair.events_b) == list(range(100))
    assert got_a + notes(pair.events_a) == list(range(100))
    assert sessions[0].sent == start + 99 and sessions[0].next_wire == wire_number(start + 100) == 61
    assert all(s.unacknowledged == 0 for s in sessions)


def test_a_replay_across_the_wrap_is_recognised_as_duplicates() -> None:
    start = 2**32 - 10
    sender, receiver = Delivery(first_number=start), Delivery()
    pair = pair_with((sender, receiver))
    for i in range(20):  # wire numbers 2**32-10 .. 2**32-1, then 1 .. 10
        pair.a.send(Note(i))
    pair.pump()
    lose(pair)
    pair = pair_with((sender, receiver))
    pair.pump(duration_ns=20_000_000)
    assert notes(pair.events_b) == [] and receiver.duplicates_dropped == 20 and sender.unacknowledged == 0


def test_undelivered_messages_come_back_decoded_in_order_when_the_session_ends() -> None:
    sender = Delivery()
    pair = pair_with((sender, Delivery()))
    for i in range(10):
        pair.a.send(Note(i))
    pair.pump(duration_ns=20_000_000)  # delivered and acknowledged
    for i in range(10, 25):
        pair.a.send(Note(i))
        if i == 17:
            pair.a.send_sync(Note(-1), pair.clock.now_ns(), 1_000_000_000)  # not sequenced: not given back
    pair.pump(duration_ns=0, drain=False)  # in flight when the connection dies
    with pytest.raises(RuntimeError, match="close the connection"):
        sender.end(pair.serialization)
    lose(pair)
    assert sender.end(pair.serialization) == tuple(Note(i) for i in range(10, 25))
    assert sender.retained_bytes == 0
    with pytest.raises(RuntimeError):
        pair_with((sender, Delivery()))


def test_a_graceful_close_hears_the_peers_last_count_so_nothing_is_reported_undelivered() -> None:
    sender = Delivery()
    pair = pair_with((sender, Delivery()))
    for i in range(10):
        pair.a.send(Note(i))
    pair.a.close("done")
    pair.pump()
    assert notes(pair.events_b) == list(range(10))
    assert any(isinstance(e, Closed) and e.by_peer for e in pair.events_b)
    assert sender.unacknowledged == 0, "the peer's DELIVERED reached our closed machine and trimmed"
    assert sender.end(pair.serialization) == ()


def test_what_crosses_the_peer_s_close_is_exactly_what_it_left_unacknowledged() -> None:
    """The peer closes while our messages are on the wire: its CLOSE comes after its count of what it took, so
    what we still hold unacknowledged when it arrives is exactly what it dropped (the adapters report it)."""
    sender = Delivery()
    pair = ConnectionPair(types=[Note], conditions=IN_FLIGHT, delivery=(sender, Delivery()))
    pair.pump()
    for i in range(3):
        pair.a.send(Note(i))
    pair.pump()  # delivered
    for i in range(3, 8):
        pair.a.send(Note(i))
    pair.b.close("shutting down")  # at the same instant: the two cross on the wire
    pair.pump(duration_ns=50_000_000)
    assert [e for e in pair.events_a if isinstance(e, Closed)] == [Closed(True, False, "shutting down")]
    assert notes(pair.events_b) == [0, 1, 2]
    assert sender.end(pair.serialization) == tuple(Note(i) for i in range(3, 8))


def test_the_delivered_timer_fires_on_the_manual_clock() -> None:
    sender, receiver = Delivery(ack_delay_ns=10_000_000), Delivery()
    pair = ConnectionPair(types=[Note], delivery=(sender, receiver))
    pair.pump()
    records_before = len(pair.wire)
    pair.a.send(Note(1))
    pair.pump()
    now = pair.clock.now_ns()
    assert receiver.ack_due_ns == now + 10_000_000 and pair.b.deadline_ns == receiver.ack_due_ns
    pair.pump(duration_ns=9_000_000)
    assert sender.unacknowledged == 1
    pair.pump(duration_ns=2_000_000)
    assert sender.unacknowledged == 0 and receiver.ack_due_ns is None
    assert len(pair.wire) == records_before + 2, "the message, then one DELIVERED record"


def test_an_acknowledgement_rides_on_a_batch_the_receiver_seals_anyway() -> None:
    sender = Delivery()
    pair = ConnectionPair(types=[Note], delivery=(sender, Delivery()))
    pair.pump()
    pair.a.send(Note(1))
    pair.pump()
    pair.b.send(Note(2))  # the reply carries the count: no timer needed
    pair.pump()
    assert sender.unacknowledged == 0 and pair.b.deadline_ns != pair.b.delivery.ack_due_ns  # type: ignore[union-attr]


def test_a_gap_closes_the_connection_as_lost_and_its_successor_fills_it() -> None:
    sessions = (Delivery(), Delivery())
    pair = pair_with(sessions, batch_limit=200)
    seen = 0

    def drop_second_data_record(datagram: Datagram) -> bool:
        nonlocal seen
        seen += datagram.source == CLIENT
        return datagram.source == CLIENT and seen == 3  # after a's RESUME and one data record

    pair.network.add_filter(drop_second_data_record)
    for i in range(30):
        pair.a.send(Note(i))
    pair.pump()
    closed = [e for e in pair.events_b if isinstance(e, Closed)]
    assert closed and closed[0].expired and "missing" in closed[0].reason
    got = notes(pair.events_b)
    assert got == list(range(len(got))) and 0 < len(got) < 30
    pair.a.lost("the peer closed")
    pair = pair_with(sessions)
    pair.pump(duration_ns=20_000_000)
    assert got + notes(pair.events_b) == list(range(30))


def test_streamed_messages_files_and_syncs_are_not_sequenced(tmp_path: object) -> None:
    sender = Delivery()
    pair = pair_with((sender, Delivery()), temp_dir=str(tmp_path))
    pair.a.send(Note(1))
    pair.a.send(os.urandom(200_000))  # a stream of chunks
    pair.a.send_sync(Note(2), pair.clock.now_ns(), 1_000_000_000)
    pair.a.send(Note(3))
    assert sender.sent == 2
    pair.pump(duration_ns=0, drain=False)
    lose(pair)
    pair = pair_with((sender, pair.b.delivery), temp_dir=str(tmp_path))
    pair.pump(duration_ns=20_000_000)
    assert notes(pair.events_b) == [1, 3], "only the plain messages are replayed"
    assert [e.message for e in pair.events_b if isinstance(e, MessageReceived)] == [Note(1), Note(3)]


def test_hostile_acknowledgements_are_refused() -> None:
    sender = Delivery()
    pair = pair_with((sender, Delivery()))
    for i in range(5):
        pair.a.send(Note(i))
    pair.pump()
    pair.b.send_frame(FrameKind.DELIVERED, 0, (10**6).to_bytes(8, "big"))  # more than was ever sent
    pair.b.send_frame(FrameKind.DELIVERED, 0, b"\x01")  # malformed
    pair.pump(duration_ns=20_000_000)
    assert sender.frames_refused == 2 and sender.acked == sender.sent == 5 and sender.retained_bytes == 0


# -- the wire ---------------------------------------------------------------------------------------------


def plain_machine(delivery: Delivery | None, serialization: Serialization) -> ConnectionMachine:
    return ConnectionMachine(
        records=PlainRecords(), serialization=serialization, now_ns=0, expiry_ns=10**10, delivery=delivery
    )


def test_without_delivery_the_wire_is_what_it_was() -> None:
    serialization = Serialization([Note])
    machine = plain_machine(None, serialization)
    assert machine.messages_to_send(0) == [], "no RESUME"
    for i in range(3):
        machine.send(Note(i))
    machine.send_sync(Note(9), 0, 10**9)
    expected = bytearray()
    for i in range(3):
        serialization.encode_frame_into(expected, FrameKind.MESSAGE, 0, Note(i))
    serialization.encode_frame_into(expected, FrameKind.SYNC_REQUEST, 1, Note(9))
    assert machine.messages_to_send(0) == [bytes(expected)]
    assert machine.batch_limit == 1376 - 24 and not machine.retained_full


def test_with_delivery_resume_goes_alone_first_then_numbered_messages() -> None:
    serialization = Serialization([Note])
    session = Delivery(session_id=7, first_number=5)
    machine = plain_machine(session, serialization)
    for i in range(3):
        machine.send(Note(i))
    resume, batch = (decode_frames(record) for record in machine.messages_to_send(0))
    assert [(f.kind, f.request_id) for f in resume] == [(FrameKind.RESUME, 0)]
    assert resume[0].payload == b"".join(n.to_bytes(8, "big") for n in (7, 0, 0, 5))
    assert [(f.kind, f.request_id) for f in batch] == [(FrameKind.MESSAGE, n) for n in (5, 6, 7)]
    assert machine.batch_limit == 1376 - 24 - (FRAME_OVERHEAD + 8), "room kept for a piggybacked DELIVERED"
