"""Buffered sessions: queues for disconnected peers, delivered in order or reported when they expire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.buffered import (
    BufferedSessions,
    BufferOverflowed,
    SessionExpired,
    SessionResumed,
)

KEY = b"k" * 32
OTHER = b"o" * 32
S = 1_000_000_000


def test_1000_messages_sent_while_disconnected_arrive_in_order_after_reconnect() -> None:
    sessions: BufferedSessions[str] = BufferedSessions(timeout_ns=120 * S)
    assert sessions.connected(KEY, 0) == []
    assert sessions.disconnected(KEY, 1 * S)
    assert sessions.is_waiting(KEY)
    assert sessions.deadline_ns == 121 * S
    for i in range(1000):
        assert sessions.enqueue(KEY, f"message {i}")
    assert sessions.queued(KEY) == 1000
    sessions.handle_timer(60 * S)
    assert sessions.take_events() == []
    delivered = sessions.connected(KEY, 100 * S)
    assert delivered == [f"message {i}" for i in range(1000)]
    assert sessions.take_events() == [SessionResumed(KEY, 1000)]
    assert sessions.queued(KEY) == 0 and not sessions.is_waiting(KEY)
    assert sessions.deadline_ns is None
    assert not sessions.enqueue(KEY, "connected: send it normally")


def test_a_session_that_expires_reports_what_it_dropped() -> None:
    sessions: BufferedSessions[str] = BufferedSessions(timeout_ns=10 * S)
    sessions.connected(KEY, 0)
    sessions.disconnected(KEY, 0)
    sessions.enqueue(KEY, "a")
    sessions.enqueue(KEY, "b")
    sessions.handle_timer(10 * S - 1)
    assert sessions.take_events() == []
    sessions.handle_timer(10 * S)
    assert sessions.take_events() == [SessionExpired(KEY, ("a", "b"))]
    assert len(sessions) == 0 and sessions.deadline_ns is None
    assert not sessions.enqueue(KEY, "c")  # no session: the caller reports the failed send
    assert sessions.connected(KEY, 11 * S) == []  # a fresh session, nothing resumed
    assert sessions.take_events() == []


def test_a_late_reconnect_before_the_timer_ran_still_expires_the_old_session() -> None:
    sessions: BufferedSessions[int] = BufferedSessions(timeout_ns=S)
    sessions.connected(KEY, 0)
    sessions.disconnected(KEY, 0)
    sessions.enqueue(KEY, 1)
    assert sessions.connected(KEY, 2 * S) == []
    assert sessions.take_events() == [SessionExpired(KEY, (1,))]


def test_overflow_is_reported_never_silent() -> None:
    sessions: BufferedSessions[bytes] = BufferedSessions(capacity=3, max_bytes=10, size_of=len)
    sessions.connected(KEY, 0)
    sessions.disconnected(KEY, 0)
    assert sessions.enqueue(KEY, b"1234")
    assert sessions.enqueue(KEY, b"5678")
    assert not sessions.enqueue(KEY, b"too big")
    assert sessions.enqueue(KEY, b"9")
    assert not sessions.enqueue(KEY, b"0")
    events = sessions.take_events()
    assert [(e.message, e.queued) for e in events if isinstance(e, BufferOverflowed)] == [(b"too big", 2), (b"0", 3)]
    assert "10 bytes" in events[0].reason and "3 messages" in events[1].reason  # type: ignore[union-attr]
    assert sessions.connected(KEY, 1) == [b"1234", b"5678", b"9"]


def test_rules_decide_per_connection_and_unbuffered_sessions_end_at_once() -> None:
    assert BufferedSessions[str]().wants_buffering("10.0.0.1", "")  # on by default
    ruled: BufferedSessions[str] = BufferedSessions(rules=[lambda address, tag: tag == "durable"])
    assert ruled.wants_buffering(None, "durable")
    assert not ruled.wants_buffering("10.0.0.1", "other")
    ruled.connected(KEY, 0, buffered=ruled.wants_buffering("10.0.0.1", "other"))
    assert not ruled.disconnected(KEY, 0)  # not buffered: on_disconnect now
    assert not ruled.enqueue(KEY, "x") and len(ruled) == 0
    assert not ruled.disconnected(OTHER, 0)  # unknown peer


def test_sessions_are_per_key_and_close_reports_every_waiting_queue() -> None:
    sessions: BufferedSessions[str] = BufferedSessions(timeout_ns=5 * S)
    sessions.connected(KEY, 0)
    sessions.connected(OTHER, 0)
    sessions.disconnected(KEY, 0)
    sessions.disconnected(OTHER, 2 * S)
    assert sessions.disconnected(OTHER, 3 * S)  # repeated: still waiting, the deadline is unchanged
    sessions.enqueue(KEY, "for k")
    sessions.enqueue(OTHER, "for o")
    assert sessions.deadline_ns == 5 * S
    sessions.handle_timer(5 * S)
    assert sessions.take_events() == [SessionExpired(KEY, ("for k",))]
    assert sessions.deadline_ns == 7 * S
    sessions.close()
    assert sessions.take_events() == [SessionExpired(OTHER, ("for o",))]
    assert len(sessions) == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout_ns"):
        BufferedSessions(timeout_ns=0)
    with pytest.raises(ValueError, match="capacity"):
        BufferedSessions(capacity=-1)
    with pytest.raises(ValueError, match="size_of"):
        BufferedSessions(max_bytes=10)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["connect", "disconnect", "send", "tick"]), st.sampled_from([KEY, OTHER])),
        max_size=60,
    )
)
def test_every_message_is_delivered_or_reported_exactly_once(ops: list[tuple[str, bytes]]) -> None:
    sessions: BufferedSessions[int] = BufferedSessions(timeout_ns=10, capacity=5)
    now = 0
    accepted: list[int] = []
    accounted: list[int] = []
    for counter, (op, key) in enumerate(ops):
        now += 3
        if op == "connect":
            accounted += sessions.connected(key, now)
        elif op == "disconnect":
            sessions.disconnected(key, now)
        elif op == "send":
            if sessions.enqueue(key, counter):
                accepted.append(counter)
        else:
            sessions.handle_timer(now)
        for event in sessions.take_events():
            if isinstance(event, SessionExpired):
                accounted += event.undelivered
            elif isinstance(event, BufferOverflowed):
                assert event.message == counter and counter not in accepted
    sessions.close()
    for event in sessions.take_events():
        assert isinstance(event, SessionExpired)
        accounted += event.undelivered
    assert sorted(accounted) == accepted
