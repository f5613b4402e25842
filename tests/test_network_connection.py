"""The connection machine in memory: batching, typed messages, send_sync, ping, keepalive and
expiry, CLOSE, and what happens to tampered, replayed and reordered records."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.errors import ConnectionClosedError, MessageTooLarge, UnregisteredTypeError
from slipstream.network.events import (
    Closed,
    KeepaliveSent,
    MessageDecodeFailed,
    MessageReceived,
    PingAcknowledged,
    PingTimedOut,
    RmiCallCompleted,
    RmiCallFailed,
    RmiFailure,
    RmiRequestReceived,
    SyncCompleted,
    SyncTimedOut,
)
from slipstream.network.rmi import RemoteRef, RmiRegistry
from slipstream.testing import ConnectionPair, LinkConditions


class Quote(msgspec.Struct):
    id: int
    price: float
    symbol: str


class Unregistered(msgspec.Struct):
    x: int


def received(events: list[object]) -> list[object]:
    return [e.message for e in events if isinstance(e, MessageReceived)]


def test_messages_share_records_and_arrive_in_order() -> None:
    pair = ConnectionPair(types=[Quote])
    for i in range(100):
        pair.a.send(Quote(i, i * 0.5, "ABC"))
    pair.pump()
    assert received(pair.events_b) == [Quote(i, i * 0.5, "ABC") for i in range(100)]
    records = [r for side, r in pair.wire if side == "a"]
    assert 2 <= len(records) <= 6  # ~30 B per message: many frames per sealed record
    assert all(len(r) <= 1376 for r in records)
    assert all(b"ABC" not in r for r in records)  # encrypted on the wire


def test_builtins_travel_without_registration_and_unregistered_types_fail_at_send() -> None:
    pair = ConnectionPair()
    for value in (None, True, 7, 2.5, "text", b"bytes", [1, 2], {"k": 1}):
        pair.a.send(value)
    pair.pump()
    assert received(pair.events_b) == [None, True, 7, 2.5, "text", b"bytes", [1, 2], {"k": 1}]
    with pytest.raises(UnregisteredTypeError, match="Unregistered"):
        pair.a.send(Unregistered(1))


def test_message_too_large_for_one_record() -> None:
    pair = ConnectionPair()
    with pytest.raises(MessageTooLarge):
        pair.a.send(b"x" * 70_000)


def test_a_lone_message_is_sealed_at_once_only_when_nothing_waits_before_it(tmp_path: Path) -> None:
    pair = ConnectionPair(types=[Quote], streams=True, temp_dir=str(tmp_path))
    now = pair.clock.now_ns()
    record = pair.a.seal_lone(Quote(1, 0.5, "LONE"), now)
    assert record is not None and pair.a.stats.records_sent == 1 and not pair.a.has_pending
    pair.inject("b", bytes(record))
    pair.a.send(Quote(2, 0.5, "BATCH"))  # a frame waits in the batch now: the next one may not overtake it
    assert pair.a.seal_lone(Quote(3, 0.5, "LATE"), now) is None
    pair.a.send(Quote(3, 0.5, "LATE"))
    pair.pump()
    assert [q.id for q in received(pair.events_b)] == [1, 2, 3]  # type: ignore[attr-defined]
    for refused in (tmp_path / "a-file", b"x" * 70_000, Unregistered(1), object()):  # a file, a stream, unknown
        assert pair.a.seal_lone(refused, now) is None
    assert not pair.a.has_pending  # nothing was done for them
    with pytest.raises(UnregisteredTypeError):
        pair.a.send(Unregistered(1))  # (send says why)
    pair.a.close("done")
    assert pair.a.seal_lone(Quote(4, 0.5, "CLOSED"), now) is None


def test_send_sync_completes_after_the_peer_acknowledges() -> None:
    pair = ConnectionPair(types=[Quote])
    sync_id = pair.a.send_sync(Quote(1, 1.0, "S"), pair.clock.now_ns(), 1_000_000_000)
    pair.pump()
    (event,) = [e for e in pair.events_b if isinstance(e, MessageReceived)]
    assert event.sync_id == sync_id
    pair.b.acknowledge_sync(event.sync_id)  # what the adapter does after the listeners ran
    pair.pump()
    assert SyncCompleted(sync_id) in pair.events_a


def test_send_sync_times_out_without_acknowledgement() -> None:
    pair = ConnectionPair(types=[Quote])
    sync_id = pair.a.send_sync(Quote(1, 1.0, "S"), pair.clock.now_ns(), 500_000_000)
    pair.pump(duration_ns=600_000_000)
    assert SyncTimedOut(sync_id) in pair.events_a


def test_hundred_pings() -> None:
    pair = ConnectionPair(conditions=LinkConditions(delay_ns=2_000_000))
    ids = [pair.a.ping(pair.clock.now_ns(), 1_000_000_000) for _ in range(100)]
    pair.pump()
    acks = [e for e in pair.events_a if isinstance(e, PingAcknowledged)]
    assert sorted(e.ping_id for e in acks) == sorted(ids)
    assert all(e.round_trip_ns == 4_000_000 and e.outbound_ns == 2_000_000 for e in acks)


def test_ping_times_out_when_the_peer_is_gone() -> None:
    pair = ConnectionPair(conditions=LinkConditions(loss=1.0))
    ping_id = pair.a.ping(pair.clock.now_ns(), 1_000_000_000)
    pair.pump(duration_ns=1_100_000_000)
    assert PingTimedOut(ping_id) in pair.events_a


def test_keepalives_keep_a_quiet_connection_up() -> None:
    pair = ConnectionPair(expiry_ns=4_000_000_000)
    pair.pump(duration_ns=30_000_000_000)
    assert not any(isinstance(e, Closed) for e in pair.events_a + pair.events_b)
    assert sum(isinstance(e, KeepaliveSent) for e in pair.events_a) >= 7


def test_records_carrying_only_a_keepalive_are_counted_as_liveness() -> None:
    """Adapters do not count them as work (an idle pair's poller keeps its long pauses); records
    with anything else in them are work as before."""
    pair = ConnectionPair(types=[Quote], expiry_ns=4_000_000_000)
    pair.pump(duration_ns=3_500_000_000)  # quiet: each side sends keepalives, and receives the other's
    sent_a = sum(isinstance(e, KeepaliveSent) for e in pair.events_a)
    sent_b = sum(isinstance(e, KeepaliveSent) for e in pair.events_b)
    assert sent_a >= 3 and sent_b >= 3
    assert pair.a.liveness_records == sent_a + sent_b
    assert pair.b.liveness_records == sent_a + sent_b
    before = pair.b.liveness_records
    pair.a.send(Quote(1, 1.0, "Q"))
    pair.a.ping(pair.clock.now_ns(), 1_000_000_000)
    pair.pump(duration_ns=10_000_000)
    assert received(pair.events_b) == [Quote(1, 1.0, "Q")]
    assert pair.b.liveness_records == before


def test_a_silent_peer_expires_and_a_short_blip_does_not() -> None:
    pair = ConnectionPair(expiry_ns=4_000_000_000)
    drop_all = pair.network.add_filter(lambda d: True)
    pair.pump(duration_ns=2_500_000_000)  # a blip shorter than the expiry
    pair.network.remove_filter(drop_all)
    pair.pump(duration_ns=10_000_000_000)
    assert not any(isinstance(e, Closed) for e in pair.events_a + pair.events_b)
    pair.network.add_filter(lambda d: True)  # the peer vanishes
    start = pair.clock.now_ns()
    pair.pump(duration_ns=6_000_000_000)
    closed = [e for e in pair.events_a if isinstance(e, Closed)]
    assert closed == [Closed(by_peer=False, expired=True, reason=closed[0].reason)]
    assert pair.a.closed and pair.b.closed
    assert pair.clock.now_ns() - start >= 4_000_000_000


def test_a_lost_transport_closes_at_once_as_an_expiry_and_sends_nothing() -> None:
    pair = ConnectionPair(expiry_ns=4_000_000_000)
    pair.a.lost("the peer's stream ended")
    pair.a.lost("again")
    assert pair.a.messages_to_send(pair.clock.now_ns()) == []
    assert [e for e in pair.a.take_events() if isinstance(e, Closed)] == [
        Closed(by_peer=False, expired=True, reason="the peer's stream ended")
    ]
    assert pair.a.deadline_ns is None
    with pytest.raises(ConnectionClosedError):
        pair.a.send(1)


def test_close_reaches_the_peer_once() -> None:
    pair = ConnectionPair()
    pair.a.close("bye")
    pair.a.close("again")
    pair.pump()
    assert [e for e in pair.events_a if isinstance(e, Closed)] == [Closed(False, False, "bye")]
    assert [e for e in pair.events_b if isinstance(e, Closed)] == [Closed(True, False, "bye")]
    with pytest.raises(ConnectionClosedError):
        pair.a.send(1)
    with pytest.raises(ConnectionClosedError):
        pair.b.ping(pair.clock.now_ns(), 1)


def test_tampered_replayed_and_forged_records_are_dropped_and_counted() -> None:
    pair = ConnectionPair(types=[Quote])
    pair.a.send(Quote(1, 1.0, "A"))
    pair.pump()
    record = next(r for side, r in pair.wire if side == "a")
    pair.inject("b", record)  # replayed
    tampered = bytearray(record)
    tampered[-1] ^= 1
    tampered[:8] = (5).to_bytes(8, "big")  # an unseen counter, so the tag check is what refuses it
    pair.inject("b", bytes(tampered))
    pair.inject("b", b"\x00" * 3)  # malformed
    forged = (10**6).to_bytes(8, "big") + bytes(40)
    pair.inject("b", forged)
    pair.pump()
    assert received(pair.events_b) == [Quote(1, 1.0, "A")]
    records = pair.b.records
    assert records.rejected_replayed == 1  # type: ignore[attr-defined]
    assert records.rejected_tampered == 2  # type: ignore[attr-defined]
    assert records.rejected_malformed == 1  # type: ignore[attr-defined]
    assert pair.b.stats.records_dropped == 4


@pytest.mark.parametrize("seed", range(4))
def test_unreliable_stream_under_loss_and_reordering_never_duplicates(seed: int) -> None:
    conditions = LinkConditions(loss=0.1, duplicate=0.2, reorder=0.3, jitter_ns=3_000_000)
    pair = ConnectionPair(conditions=conditions, seed=seed, batch_limit=200)
    for i in range(500):
        pair.a.send(i)
        if i % 10 == 9:
            pair.pump()
    pair.pump()
    got = received(pair.events_b)
    assert len(got) == len(set(got)) and 300 <= len(got) < 500
    assert set(got) <= set(range(500))


def test_a_message_that_does_not_decode_is_reported_and_the_connection_goes_on() -> None:
    pair = ConnectionPair(types=[Quote])
    pair.b.serialization = ConnectionPair(types=[]).serialization
    pair.a.send(Quote(1, 1.0, "A"))
    pair.a.send("plain")
    pair.pump()
    assert [type(e) for e in pair.events_b if not isinstance(e, KeepaliveSent)] == [
        MessageDecodeFailed,
        MessageReceived,
    ]
    assert pair.b.stats.decode_errors == 1 and not pair.b.closed


_FUZZ = ConnectionPair(types=[Quote])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_hostile_records_never_raise(data: bytes) -> None:
    before = _FUZZ.b.stats.records_dropped + _FUZZ.b.stats.frame_errors
    _FUZZ.b.receive(data, _FUZZ.clock.now_ns())
    assert _FUZZ.b.stats.records_dropped + _FUZZ.b.stats.frame_errors == before + 1
    assert not _FUZZ.b.take_events()


# -- remote objects composed into the machine (issue 27) --------------------------------------------------


class ICalc(Protocol):
    def add(self, a: int, b: int) -> int: ...

    def size_of(self, file: Path) -> int: ...

    def export(self, size: int) -> Path: ...


class Calc:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.seen: list[Path] = []

    def add(self, a: int, b: int) -> int:
        return a + b

    def size_of(self, file: Path) -> int:
        self.seen.append(file)
        return len(file.read_bytes())

    def export(self, size: int) -> Path:
        path = self.tmp / f"export-{size}.bin"
        path.write_bytes(b"x" * size)
        return path


def rmi_pair(tmp: Path, **kwargs: Any) -> tuple[ConnectionPair, RemoteRef, Calc]:
    client, server = RmiRegistry([ICalc]), RmiRegistry([(ICalc, Calc)])
    spill = tmp / "spill"
    spill.mkdir(exist_ok=True)
    pair = ConnectionPair(rmi=(client, server), temp_dir=str(spill), **kwargs)
    calc = Calc(tmp)
    assert pair.b.rmi is not None
    ref = RemoteRef(0, pair.b.rmi.endpoint.objects.save(calc))
    return pair, ref, calc


def serve(pair: ConnectionPair, *, answer: bool = True) -> int:
    """Run the host calls the server's machine handed out (as an adapter does); the number run."""
    ran = 0
    for event in list(pair.events_b):
        if isinstance(event, RmiRequestReceived):
            pair.events_b.remove(event)
            if answer:
                pair.b.complete_invocation(event.invocation_id, pair.b.invocation(event.invocation_id).call())
            ran += 1
    return ran


def outcome(pair: ConnectionPair, call_id: int) -> RmiCallCompleted | RmiCallFailed:
    (found,) = [e for e in pair.events_a if isinstance(e, (RmiCallCompleted, RmiCallFailed)) and e.call_id == call_id]
    return found


def test_remote_calls_run_inside_the_connection_machine_with_its_one_deadline(tmp_path: Path) -> None:
    pair, ref, _ = rmi_pair(tmp_path)
    call_id = pair.a.call(ref, "add", [2, 3], pair.clock.now_ns(), timeout_ns=1_000_000_000)
    assert pair.a.deadline_ns == pair.clock.now_ns() + 1_000_000_000  # the call's timeout is the machine's
    pair.pump()
    assert serve(pair) == 1
    pair.pump()
    done = outcome(pair, call_id)
    assert isinstance(done, RmiCallCompleted) and done.value == 5
    # a call nobody answers times out on the manual clock, at its deadline exactly
    late = pair.a.call(ref, "add", [1, 1], pair.clock.now_ns(), timeout_ns=500_000_000)
    due = pair.a.deadline_ns
    pair.pump()
    assert serve(pair, answer=False) == 1 and due is not None
    pair.pump(duration_ns=due - pair.clock.now_ns())
    failed = outcome(pair, late)
    assert isinstance(failed, RmiCallFailed) and failed.failure == RmiFailure.TIMED_OUT
    assert pair.a.rmi is not None and pair.a.rmi.endpoint.in_flight == 0


def test_calls_and_messages_keep_their_order_on_the_wire(tmp_path: Path) -> None:
    pair, ref, _ = rmi_pair(tmp_path)
    pair.a.send("before")
    call_id = pair.a.call(ref, "add", [1, 2], pair.clock.now_ns())
    pair.a.send("after")
    pair.pump()
    kinds = [type(e).__name__ for e in pair.events_b if isinstance(e, (MessageReceived, RmiRequestReceived))]
    assert kinds == ["MessageReceived", "RmiRequestReceived", "MessageReceived"]
    serve(pair)
    pair.pump()
    assert isinstance(outcome(pair, call_id), RmiCallCompleted)


def test_path_arguments_and_results_travel_as_files_through_the_machine(tmp_path: Path) -> None:
    pair, ref, calc = rmi_pair(tmp_path)
    source = tmp_path / "argument.bin"
    source.write_bytes(b"y" * 100_000)  # several chunks
    call_id = pair.a.call(ref, "size_of", [source], pair.clock.now_ns(), timeout_ns=0)
    pair.pump()
    assert serve(pair) == 1  # handed out only once the file arrived whole
    pair.pump()
    done = outcome(pair, call_id)
    assert isinstance(done, RmiCallCompleted) and done.value == 100_000
    (copy,) = calc.seen
    assert copy != source and not copy.exists()  # a temporary copy, removed once the call completed
    assert not any(isinstance(e, MessageReceived) for e in pair.events_b)  # never a message
    # a Path result: the caller gets its own copy, which it keeps
    call_id = pair.a.call(ref, "export", [70_000], pair.clock.now_ns(), timeout_ns=0)
    pair.pump()
    serve(pair)
    pair.pump()
    result = outcome(pair, call_id)
    assert isinstance(result, RmiCallCompleted) and isinstance(result.value, Path)
    assert result.value.read_bytes() == b"x" * 70_000
    pair.a.shutdown()
    assert result.value.exists()  # the caller owns it, even after the connection is gone


def test_an_abandoned_calls_result_file_is_removed_when_it_arrives(tmp_path: Path) -> None:
    pair, ref, _ = rmi_pair(tmp_path)
    call_id = pair.a.call(ref, "export", [50_000], pair.clock.now_ns(), timeout_ns=0)
    pair.pump()
    pair.a.abandon_call(call_id)  # the caller went away before the response
    serve(pair)
    pair.pump()
    assert not [e for e in pair.events_a if getattr(e, "call_id", None) == call_id]
    assert os.listdir(tmp_path / "spill") == []  # the result's copy was removed on arrival


@dataclasses.dataclass
class Attachment:
    """A registered message type that is also os.PathLike: sent, it streams the file it names."""

    where: str

    def __fspath__(self) -> str:
        return self.where


def test_a_registered_type_that_is_path_like_still_travels_as_a_file(tmp_path: Path) -> None:
    """``Serialization.plain_types`` (the send path's fast check) leaves out registered types that are os.PathLike."""
    pair = ConnectionPair(types=[Quote, Attachment], streams=True, temp_dir=str(tmp_path))
    assert Quote in pair.serialization.plain_types and bytes in pair.serialization.plain_types
    assert Attachment not in pair.serialization.plain_types
    source = tmp_path / "sent" / "data.bin"
    source.parent.mkdir()
    source.write_bytes(b"x" * 100)
    pair.a.send(Attachment(str(source)))
    pair.a.send(Quote(1, 0.5, "A"))
    pair.pump()
    got = received(pair.events_b)
    assert Quote(1, 0.5, "A") in got
    (copy,) = [m for m in got if isinstance(m, Path)]
    assert copy.read_bytes() == b"x" * 100
