"""The server's connection table, in memory: real ``ClientAccepted`` events from a handshake pair (its
server machine is the table's allocator), a manual clock, and the table's events and verdicts."""

from __future__ import annotations

import msgspec

from slipstream.client.allocation import IdAllocator
from slipstream.network.buffered import BufferedSessions, Hold
from slipstream.network.events import (
    ClientAccepted,
    ConnectionReleased,
    ConnectionStarted,
    OpeningFailed,
    PortReassigned,
    SessionEnded,
    StartTimedOut,
)
from slipstream.network.table import PORT_ATTEMPTS, ConnectionState, ConnectionTable
from slipstream.testing import HandshakePair

S = 1_000_000_000
STARTING_NS = 3 * S
RELEASE_NS = S
BUFFERED_NS = 10 * S

OPENING, STARTING, UP = ConnectionState.OPENING, ConnectionState.STARTING, ConnectionState.UP
LINGERING, RELEASED = ConnectionState.LINGERING, ConnectionState.RELEASED


def accept(pair: HandshakePair, *sources: int, address: str | None = None) -> list[ClientAccepted]:
    """Real handshakes of new clients (``sources``), with the events of those the server accepted."""
    for source in sources:
        pair.add_client(source, address=None if address is None else (address, 40000 + source))
    pair.pump()
    return [event for event in pair.server.take_events() if isinstance(event, ClientAccepted)]


def same_client(pair: HandshakePair, times: int) -> list[ClientAccepted]:
    """``times`` accepted handshakes of one client (its key), as if it came back each time."""
    first, *rest = accept(pair, *range(1, times + 1))
    return [first, *(msgspec.structs.replace(again, remote_public_key=first.remote_public_key) for again in rest)]


def table_for(pair: HandshakePair, sessions: BufferedSessions[object] | None = None) -> ConnectionTable:
    return ConnectionTable(
        allocations=pair.server, starting_timeout_ns=STARTING_NS, release_delay_ns=RELEASE_NS, sessions=sessions
    )


def buffered(pair: HandshakePair, capacity: int = 100) -> tuple[ConnectionTable, int]:
    """A table with buffered sessions, and now."""
    return table_for(pair, BufferedSessions(timeout_ns=BUFFERED_NS, capacity=capacity)), pair.clock.now_ns()


def bring_up(table: ConnectionTable, accepted: ClientAccepted, now_ns: int) -> list[object]:
    """OPENING, STARTING, UP at once; the events of the start."""
    assert table.open(accepted, now_ns)
    assert table.opened(accepted.connection_id, now_ns)
    assert table.started(accepted.connection_id, now_ns)
    return list(table.take_events())


def lose(table: ConnectionTable, connection_id: int, now_ns: int) -> None:
    """The connection is lost; its buffered session waits for the peer."""
    assert table.ended(connection_id, now_ns, lost=True)


def one_lost(pair: HandshakePair, times: int) -> tuple[ConnectionTable, int, list[ClientAccepted]]:
    """A buffered table (and when) in which the first of ``times`` connections of one client was up and
    is lost."""
    accepted = same_client(pair, times)
    table, now = buffered(pair)
    bring_up(table, accepted[0], now)
    lose(table, accepted[0].connection_id, now)
    return table, now, accepted


def test_a_connection_goes_opening_starting_up_lingering_and_its_ids_go_back_after_the_release_delay() -> None:
    pair = HandshakePair()
    (accepted,) = accept(pair, 1)
    clock, table, cid = pair.clock, table_for(pair), accepted.connection_id
    assert table.open(accepted, clock.now_ns())
    assert table.state(cid) is OPENING and table.deadline_ns is None and table.take_events() == []
    assert table.opened(cid, clock.now_ns())
    assert table.state(cid) is STARTING and table.deadline_ns == clock.now_ns() + STARTING_NS
    clock.advance(S)
    assert table.started(cid, clock.now_ns())
    assert table.state(cid) is UP and table.deadline_ns is None
    assert table.take_events() == [ConnectionStarted(cid)]
    assert not table.ended(cid, clock.now_ns(), lost=False)  # no buffered sessions: on_disconnect is due now
    assert table.state(cid) is LINGERING and table.deadline_ns is None  # its streams are still closing
    table.handle_timer(clock.advance(60 * S))
    assert cid in pair.server.connections and table.take_events() == []
    assert table.streams_closed(cid, clock.now_ns())
    closed_ns = clock.now_ns()
    assert table.deadline_ns == closed_ns + RELEASE_NS
    table.handle_timer(closed_ns + RELEASE_NS - 1)
    assert cid in pair.server.connections and table.state(cid) is LINGERING and table.take_events() == []
    table.handle_timer(closed_ns + RELEASE_NS)
    assert table.take_events() == [ConnectionReleased(cid)]
    assert table.state(cid) is RELEASED and len(table) == 0 and table.deadline_ns is None
    assert cid not in pair.server.connections and pair.server.ids_in_use() == frozenset()


def test_a_start_that_times_out_gives_the_ids_back_only_after_the_release_delay() -> None:
    pair = HandshakePair()
    (accepted,) = accept(pair, 1)
    table, cid, start = table_for(pair), accepted.connection_id, pair.clock.now_ns()
    table.open(accepted, start)
    table.opened(cid, start)
    table.handle_timer(start + STARTING_NS - 1)
    assert table.state(cid) is STARTING and table.take_events() == []
    table.handle_timer(start + STARTING_NS)
    assert table.take_events() == [StartTimedOut(cid)]
    assert table.state(cid) is LINGERING and table.admitted == 0
    assert not table.started(cid, start + STARTING_NS)  # the client came up too late: nothing changes
    assert table.deadline_ns == start + STARTING_NS + RELEASE_NS
    table.handle_timer(start + STARTING_NS + RELEASE_NS - 1)
    assert cid in pair.server.connections and table.take_events() == []
    table.handle_timer(start + STARTING_NS + RELEASE_NS)
    assert table.take_events() == [ConnectionReleased(cid)] and cid not in pair.server.connections


def test_a_refused_port_is_retried_on_new_ports_up_to_the_limit_then_the_connection_is_given_up() -> None:
    pair = HandshakePair()
    (accepted,) = accept(pair, 1)
    table, cid, now = table_for(pair), accepted.connection_id, pair.clock.now_ns()
    ports = pair.server.ports
    assert ports is not None
    table.open(accepted, now)
    tried = [accepted.control_port]
    for _ in range(PORT_ATTEMPTS - 1):
        assert table.open_failed(cid, "address in use", now, publication=True)
        (event,) = table.take_events()
        assert event == PortReassigned(cid, tried[-1], event.port, "address in use")
        assert event.port not in tried and ports.in_use == {event.port}  # the refused port went back
        assert table.state(cid) is OPENING and table.admitted == 1
        tried.append(event.port)
    assert table.open_failed(cid, "address in use", now, publication=True)
    assert table.take_events() == [OpeningFailed(cid, "address in use"), ConnectionReleased(cid)]
    assert len(tried) == PORT_ATTEMPTS == 5
    assert table.state(cid) is RELEASED and table.admitted == 0
    assert cid not in pair.server.connections and ports.in_use == frozenset()  # at once: no client heard of it


def test_a_refused_subscription_an_ipc_publication_or_no_port_left_gives_up_at_once() -> None:
    pair = HandshakePair()
    subscription, ipc, starved = accept(pair, 1, 2, 3)
    table, now = table_for(pair), pair.clock.now_ns()
    ipc = msgspec.structs.replace(ipc, control_port=0)  # IPC: no port to change
    for accepted, publication in ((subscription, False), (ipc, True), (starved, True)):
        table.open(accepted, now)
        if accepted is starved:
            assert pair.server.ports is not None
            pair.server.ports.allocate(pair.server.ports.available)  # every other port is taken
        assert table.open_failed(accepted.connection_id, "refused", now, publication=publication)
        cid = accepted.connection_id
        assert table.take_events() == [OpeningFailed(cid, "refused"), ConnectionReleased(cid)]
        assert cid not in pair.server.connections


def test_lingering_ids_cannot_be_handed_out_again_until_released() -> None:
    pair = HandshakePair()
    pair.server.sessions = IdAllocator(1, 2)  # room for one connection's two session ids
    (first,) = accept(pair, 1)
    table, clock = table_for(pair), pair.clock
    bring_up(table, first, clock.now_ns())
    table.ended(first.connection_id, clock.now_ns(), lost=False)
    table.streams_closed(first.connection_id, clock.now_ns())
    assert accept(pair, 2) == []  # lingering: its ids are still held, so the next client is refused
    table.handle_timer(table.deadline_ns or 0)
    assert table.take_events() == [ConnectionReleased(first.connection_id)]
    (second,) = accept(pair, 3)
    assert {second.server_session_id, second.client_session_id} == {1, 2}  # released: handed out again


def test_admission_counts_opening_starting_and_up_in_total_and_per_address() -> None:
    pair = HandshakePair()
    near = accept(pair, 1, 2)
    (far,) = accept(pair, 3, address="10.9.9.9")
    near_address = near[0].address
    assert near_address is not None and near_address == near[1].address != far.address
    table, now = table_for(pair), pair.clock.now_ns()
    for accepted in (*near, far):
        table.open(accepted, now)
    assert table.admitted == 3 and table.admitted_from(near_address) == 2 and table.admitted_from("10.9.9.9") == 1
    assert table.admitted_from("192.0.2.1") == 0
    table.opened(near[0].connection_id, now)
    assert table.admitted == 3
    table.started(near[0].connection_id, now)
    assert table.admitted == 3 and table.admitted_from(near_address) == 2  # up counts as much as opening
    table.open_failed(near[1].connection_id, "refused", now, publication=False)
    assert table.admitted == 2 and table.admitted_from(near_address) == 1
    table.opened(far.connection_id, now)
    table.handle_timer(now + STARTING_NS)  # timed out: lingering, no longer counted
    assert table.admitted == 1 and table.admitted_from("10.9.9.9") == 0
    table.ended(near[0].connection_id, now, lost=False)
    assert table.admitted == 0 and table.admitted_from(near_address) == 0
    assert len(table) == 2  # both lingering ones still hold their ids


def test_a_lost_peers_messages_wait_within_capacity_and_go_first_when_its_key_returns() -> None:
    pair = HandshakePair()
    lost, back = same_client(pair, 2)
    table, _ = buffered(pair, capacity=3)
    clock = pair.clock
    assert bring_up(table, lost, clock.now_ns()) == [ConnectionStarted(lost.connection_id)]
    assert table.hold(lost.connection_id, "up") is Hold.CLOSED  # nothing waits while it is up
    lost_at = clock.now_ns()
    lose(table, lost.connection_id, lost_at)
    verdicts = [table.hold(lost.connection_id, f"m{n}") for n in range(4)]
    assert verdicts == [Hold.QUEUED, Hold.QUEUED, Hold.QUEUED, Hold.FULL]  # capacity 3: the 4th is refused
    assert table.hold(back.connection_id, "another id") is Hold.CLOSED
    assert table.deadline_ns == lost_at + BUFFERED_NS
    clock.advance_to(lost_at + BUFFERED_NS - 1)  # the last moment the session is alive
    assert bring_up(table, back, clock.now_ns()) == [
        ConnectionStarted(back.connection_id, resumes=lost.connection_id, queued=("m0", "m1", "m2"))
    ]
    assert table.hold(lost.connection_id, "late") is Hold.CLOSED  # resumed: nothing waits for it any more
    table.handle_timer(lost_at + BUFFERED_NS)
    assert table.take_events() == []  # the resumed session does not expire (its on_disconnect was due once)


def test_a_resumed_session_can_be_lost_and_resumed_again() -> None:
    pair = HandshakePair()
    table, now, (first, second, third) = one_lost(pair, 3)
    table.hold(first.connection_id, "m0")
    assert bring_up(table, second, now + S) == [ConnectionStarted(second.connection_id, first.connection_id, ("m0",))]
    lose(table, second.connection_id, now + 2 * S)  # the successor is lost in turn: the session waits again
    assert table.hold(second.connection_id, "m1") is Hold.QUEUED
    assert bring_up(table, third, now + 3 * S) == [
        ConnectionStarted(third.connection_id, second.connection_id, ("m1",))
    ]


def test_a_session_that_expires_ends_with_what_was_not_delivered_and_the_key_then_starts_afresh() -> None:
    pair = HandshakePair()
    table, lost_at, (lost, back) = one_lost(pair, 2)
    assert [table.hold(lost.connection_id, m) for m in ("a", "b")] == [Hold.QUEUED, Hold.QUEUED]
    table.handle_timer(lost_at + BUFFERED_NS - 1)
    assert table.take_events() == []
    table.handle_timer(lost_at + BUFFERED_NS)
    assert table.take_events() == [SessionEnded(lost.connection_id, ("a", "b"))]  # on_disconnect due now
    assert table.hold(lost.connection_id, "c") is Hold.CLOSED and table.deadline_ns is None
    assert bring_up(table, back, lost_at + BUFFERED_NS) == [ConnectionStarted(back.connection_id)]


def test_a_key_returning_after_the_expiry_but_before_the_timer_ran_ends_the_old_session_first() -> None:
    pair = HandshakePair()
    table, lost_at, (lost, back) = one_lost(pair, 2)
    table.hold(lost.connection_id, "m0")
    assert bring_up(table, back, lost_at + BUFFERED_NS) == [
        SessionEnded(lost.connection_id, ("m0",)),
        ConnectionStarted(back.connection_id),
    ]


def test_only_a_lost_buffered_connection_that_was_up_leaves_a_session_waiting() -> None:
    pair = HandshakePair()
    closed, refused_by_rule, never_up, unbuffered = accept(pair, 1, 2, 3, 4)
    now = pair.clock.now_ns()
    rule_refuses = refused_by_rule.tag + "!"  # the rule buffers only that tag, which nobody has
    sessions: BufferedSessions[object] = BufferedSessions(rules=(lambda address, tag: tag == rule_refuses,))
    table = table_for(pair, sessions)
    table_off = table_for(pair)
    for accepted in (closed, refused_by_rule):
        bring_up(table, accepted, now)
    assert not table.ended(closed.connection_id, now, lost=False)  # closed deliberately: the session ends
    assert not table.ended(refused_by_rule.connection_id, now, lost=True)  # the rule said no
    table.open(never_up, now)
    table.opened(never_up.connection_id, now)
    assert not table.ended(never_up.connection_id, now, lost=True)  # it never was up
    bring_up(table_off, unbuffered, now)
    assert not table_off.ended(unbuffered.connection_id, now, lost=True)  # no buffered sessions at all
    for accepted in (closed, refused_by_rule, never_up):
        assert table.hold(accepted.connection_id, "x") is Hold.CLOSED
    assert table_off.hold(unbuffered.connection_id, "x") is Hold.CLOSED
    assert table.take_events() == [] and len(sessions) == 0


def test_one_session_per_key_goes_with_its_latest_connection_and_a_twin_that_never_came_up_does_not_end_it() -> None:
    """A key up twice at once (a restarted client, before its old connection was seen lost): the session is
    the later connection's; the earlier one's end, lost or closed, leaves it alone and names its successor
    (issue 28: the restarted client's session was marked waiting when its old connection expired)."""
    pair = HandshakePair()
    first, twin, half_up = same_client(pair, 3)
    table, now = buffered(pair)
    bring_up(table, first, now)
    bring_up(table, twin, now)  # the same client twice at once
    table.open(half_up, now)
    table.opened(half_up.connection_id, now)
    assert not table.ended(half_up.connection_id, now, lost=False)  # never up: the key's session is not its own
    assert not table.ended(first.connection_id, now, lost=True)  # the twin carries the session: nothing waits
    assert table.successor(first.connection_id) == twin.connection_id
    assert table.hold(first.connection_id, "x") is Hold.CLOSED
    lose(table, twin.connection_id, now)  # the key's latest connection lost: its session waits
    assert table.successor(first.connection_id) is None and table.successor(twin.connection_id) is None
    assert table.hold(twin.connection_id, "m0") is Hold.QUEUED
    table.handle_timer(now + BUFFERED_NS)
    assert table.take_events() == [SessionEnded(twin.connection_id, ("m0",))]


def test_a_twin_closed_deliberately_does_not_end_the_session_of_the_later_connection() -> None:
    pair = HandshakePair()
    first, twin = same_client(pair, 2)
    table, now = buffered(pair)
    bring_up(table, first, now)
    bring_up(table, twin, now)
    assert not table.ended(first.connection_id, now, lost=False)
    lose(table, twin.connection_id, now)  # the later connection's session was not ended by the close
    assert table.hold(twin.connection_id, "m0") is Hold.QUEUED


def test_a_waiting_sessions_connection_id_handed_out_again_ends_that_session() -> None:
    pair = HandshakePair()
    pair.server.sessions = IdAllocator(1, 2)  # the next connection gets the lost one's id
    (lost,) = accept(pair, 1)
    table, now = buffered(pair)
    bring_up(table, lost, now)
    lose(table, lost.connection_id, now)
    assert table.hold(lost.connection_id, "m0") is Hold.QUEUED
    table.streams_closed(lost.connection_id, now)
    table.handle_timer(now + RELEASE_NS)
    assert table.take_events() == [ConnectionReleased(lost.connection_id)]
    (other,) = accept(pair, 2)
    assert other.connection_id == lost.connection_id and other.remote_public_key != lost.remote_public_key
    table.open(other, pair.clock.now_ns())
    assert table.take_events() == [SessionEnded(lost.connection_id, ("m0",))]
    assert table.hold(lost.connection_id, "m1") is Hold.CLOSED  # never queued for the id's new peer


def test_inputs_in_a_state_that_does_not_take_them_change_nothing() -> None:
    pair = HandshakePair()
    first, second = accept(pair, 1, 2)
    table, now = table_for(pair), pair.clock.now_ns()
    cid = first.connection_id
    table.open(first, now)
    assert not table.open(first, now)
    assert not table.started(cid, now) and not table.streams_closed(cid, now)
    assert not table.ended(cid, now, lost=True) and table.state(cid) is OPENING
    table.opened(cid, now)
    assert not table.opened(cid, now) and not table.open_failed(cid, "late", now, publication=True)
    table.started(cid, now)
    assert not table.cancel(cid, now) and table.state(cid) is UP
    table.open(second, now)
    assert table.cancel(second.connection_id, now)  # the server closes: an opening one goes at once
    assert table.take_events() == [ConnectionStarted(cid), ConnectionReleased(second.connection_id)]
    assert second.connection_id not in pair.server.connections
    for call in (table.opened, table.started, table.streams_closed, table.cancel):
        assert not call(12345, now)  # unknown ids too
    assert table.take_events() == [] and table.state(cid) is UP


def test_close_ends_waiting_sessions_and_gives_every_id_back_at_once() -> None:
    pair = HandshakePair()
    table, now, (lost, opening, starting) = one_lost(pair, 3)
    table.hold(lost.connection_id, "m0")
    table.open(opening, now)
    table.open(starting, now)
    table.opened(starting.connection_id, now)
    table.close(now)
    assert table.take_events() == [
        SessionEnded(lost.connection_id, ("m0",)),
        *(ConnectionReleased(a.connection_id) for a in (lost, opening, starting)),
    ]
    assert pair.server.connections == {} and len(table) == 0 and table.deadline_ns is None
    assert table.hold(lost.connection_id, "m1") is Hold.CLOSED


def test_the_deadline_is_the_earliest_of_starts_releases_and_session_expiries() -> None:
    pair = HandshakePair()
    lost, starting, lingering = accept(pair, 1, 2, 3)
    table, now = buffered(pair)
    bring_up(table, lost, now)
    lose(table, lost.connection_id, now)
    assert table.deadline_ns == now + BUFFERED_NS
    table.open(starting, now)
    table.opened(starting.connection_id, now + S)
    assert table.deadline_ns == now + S + STARTING_NS
    bring_up(table, lingering, now)
    table.ended(lingering.connection_id, now, lost=False)
    table.streams_closed(lingering.connection_id, now)
    assert table.deadline_ns == now + RELEASE_NS
    table.handle_timer(now + RELEASE_NS)
    assert table.deadline_ns == now + S + STARTING_NS
