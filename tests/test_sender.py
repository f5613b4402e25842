"""NetworkPublicationSender: the sending rules of reference sections 1 and 2, one test per rule."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.logbuffer import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    NOT_CONNECTED,
    BufferClaim,
    ExclusiveAppender,
    LogBuffers,
    compute_log_length,
)
from slipstream.protocol import NetworkPublicationSender, SenderConfig, SenderState
from slipstream.wire.constants import (
    EOS_FLAG,
    RTTM_REPLY_FLAG,
    SM_EOS_FLAG,
    SM_SEND_SETUP_FLAG,
    TERM_MIN_LENGTH,
    UNFRAGMENTED,
)
from slipstream.wire.frames import (
    DataFrame,
    ErrorFrame,
    Frame,
    Nak,
    PadFrame,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_datagram,
)
from slipstream.wire.positions import compute_term_id

TERM = TERM_MIN_LENGTH
BITS = TERM.bit_length() - 1
SESSION, STREAM, INITIAL = 7, 1001, 100
MS = 1_000_000
S = 1_000_000_000


def make_sender(
    config: SenderConfig | None = None, *, term_id: int = INITIAL, term_offset: int = 0, mtu: int = 1408
) -> tuple[NetworkPublicationSender, ExclusiveAppender]:
    log = LogBuffers(bytearray(compute_log_length(TERM)), TERM)
    log.initialize(
        initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM, mtu=mtu, term_id=term_id, term_offset=term_offset
    )
    return NetworkPublicationSender(log, config), ExclusiveAppender(log)


def sm(
    position: int = 0, window: int = TERM // 2, *, flags: int = 0, receiver_id: int = 1, session: int = SESSION
) -> bytes:
    term_id = compute_term_id(position, BITS, INITIAL)
    return StatusMessage(session, STREAM, term_id, position & (TERM - 1), window, receiver_id, None, flags).encode()


def nak(position: int, length: int) -> bytes:
    return Nak(SESSION, STREAM, compute_term_id(position, BITS, INITIAL), position & (TERM - 1), length).encode()


def frames_of(datagrams: list[bytes]) -> list[Frame]:
    return [frame for d in datagrams for frame in decode_datagram(d)]


def publish(app: ExclusiveAppender, payload: bytes, limit: int = 1 << 40) -> int:
    result = app.append(payload, limit)
    if result == ADMIN_ACTION:
        result = app.append(payload, limit)
    return result


def connect(sender: NetworkPublicationSender, now: int = 0, window: int = TERM // 2) -> None:
    sender.poll(now)  # SETUP
    sender.on_datagram(sm(sender.sender_position, window), now)


def drain(sender: NetworkPublicationSender, now: int, polls: int = 50) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(polls):
        out += sender.poll(now)
    return out


# -- connection establishment (2.2) -----------------------------------------------------------------


def test_sender_sends_only_setup_until_first_status_message() -> None:
    sender, app = make_sender()
    publish(app, b"x" * 100)  # data in the log must wait for a receiver
    sent = [(t, d) for t in range(0, 350 * MS + 1, MS) for d in sender.poll(t)]
    assert [t for t, _ in sent] == [0, 101 * MS, 202 * MS, 303 * MS]
    for _, datagram in sent:
        assert decode_datagram(datagram) == [SetupFrame(0, SESSION, STREAM, INITIAL, INITIAL, TERM, 1408, 0, 0)]
    assert sender.setups_sent == 4
    assert sender.heartbeats_sent == 0 and sender.bytes_sent == 0


def test_setup_announces_the_sender_position_of_a_log_starting_mid_term() -> None:
    sender, _ = make_sender(term_id=INITIAL + 2, term_offset=1024)
    assert sender.sender_position == 2 * TERM + 1024
    assert decode_datagram(sender.poll(0)[0]) == [SetupFrame(1024, SESSION, STREAM, INITIAL, INITIAL + 2, TERM, 1408)]


def test_offer_is_not_connected_until_first_status_message() -> None:
    sender, app = make_sender()
    sender.poll(0)
    assert not sender.is_connected and not sender.log.is_connected
    assert app.append(b"hello", sender.publisher_limit()) == NOT_CONNECTED
    sender.on_datagram(sm(0, 4096), MS)
    assert sender.is_connected and sender.log.is_connected and sender.has_initial_connection
    assert sender.publisher_limit() == TERM // 2  # sender position + term window
    assert app.append(b"hello", sender.publisher_limit()) > 0


def test_status_message_stops_setup_and_sets_sender_limit_forward_only() -> None:
    sender, _ = make_sender()
    sender.poll(0)
    sender.on_datagram(sm(0, 8192), MS)
    assert sender.sender_limit == 8192
    sender.on_datagram(sm(0, 1024), 2 * MS)  # a smaller edge never pulls the limit back
    assert sender.sender_limit == 8192
    assert not [d for t in range(2 * MS, 500 * MS, 10 * MS) for d in sender.poll(t) if len(d) == 40]


def test_send_setup_flag_elicits_setup_at_current_position() -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"a" * 200)
    drain(sender, MS)
    assert sender.sender_position == 256
    sender.on_datagram(sm(0, 0, flags=SM_SEND_SETUP_FLAG, receiver_id=99), 150 * MS)
    setups = [f for f in frames_of(sender.poll(150 * MS)) if isinstance(f, SetupFrame)]
    assert setups == [SetupFrame(256, SESSION, STREAM, INITIAL, INITIAL, TERM, 1408)]
    assert not [f for f in frames_of(drain(sender, 300 * MS)) if isinstance(f, SetupFrame)]


def test_send_setup_request_does_not_count_as_receiver_liveness() -> None:
    sender, _ = make_sender()
    sender.on_datagram(sm(0, 0, flags=SM_SEND_SETUP_FLAG), 0)
    assert not sender.is_connected and not sender.has_initial_connection


# -- steady state (2.3) -----------------------------------------------------------------------------


def test_sender_sends_data_only_up_to_flow_control_limit() -> None:
    sender, app = make_sender()
    connect(sender, window=4096)
    for _ in range(20):
        publish(app, b"d" * 1000)  # 1056 bytes per frame
    data = [f for f in frames_of(drain(sender, MS)) if isinstance(f, DataFrame) and not f.is_heartbeat]
    assert len(data) == 3 and sender.sender_position == 3 * 1056 <= sender.sender_limit == 4096
    assert sender.flow_control_limits == 1  # counted once per stall, not once per poll
    sender.on_datagram(sm(3 * 1056, 4096), 2 * MS)
    data = [f for f in frames_of(drain(sender, 2 * MS)) if isinstance(f, DataFrame)]
    assert [f.term_offset for f in data] == [3 * 1056, 4 * 1056, 5 * 1056]  # 3168 + 4096 = 7264 >= 6336


def test_sender_batches_consecutive_frames_into_datagrams_of_at_most_mtu() -> None:
    sender, app = make_sender()
    connect(sender)
    for i in range(50):
        publish(app, bytes([i]) * 100)  # 160 bytes per frame: 8 fit in a 1408-byte MTU
    first = sender.poll(MS)
    assert [len(d) for d in first] == [1280] * 4  # four datagrams per duty cycle
    rest = drain(sender, MS)
    assert all(len(d) <= 1408 for d in rest)
    frames = frames_of(first + rest)
    assert [f.payload for f in frames if isinstance(f, DataFrame)] == [bytes([i]) * 100 for i in range(50)]
    assert [f.term_offset for f in frames if isinstance(f, DataFrame)] == [160 * i for i in range(50)]
    assert sender.bytes_sent == 50 * 160


def test_term_end_pad_sends_only_its_header() -> None:
    sender, app = make_sender(term_offset=TERM - 1024)
    connect(sender)
    assert publish(app, b"p" * 2000) > 0  # does not fit: the term is padded and the message rotates
    datagrams = drain(sender, MS)
    assert len(datagrams[0]) == 32
    assert decode_datagram(datagrams[0]) == [PadFrame(TERM - 1024, SESSION, STREAM, INITIAL, 1024)]
    rest = frames_of(datagrams[1:])
    assert {(f.term_id, f.term_offset) for f in rest if isinstance(f, DataFrame)} == {
        (INITIAL + 1, 0),
        (INITIAL + 1, 1408),
    }
    assert sender.sender_position == TERM + 1408 + 672


def test_heartbeat_after_100ms_idle_carries_sender_position() -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"h" * 10)
    sender.poll(0)  # heartbeat due at once after connection, then data
    sent_at = [t for t in range(MS, 400 * MS, MS) for d in sender.poll(t) if len(d) == 32]
    assert sent_at == [101 * MS, 202 * MS, 303 * MS]
    beat = decode_datagram(sender.poll(404 * MS)[0])[0]
    assert beat == DataFrame.heartbeat(64, SESSION, STREAM, INITIAL)
    assert isinstance(beat, DataFrame) and beat.flags == UNFRAGMENTED


# -- loss and retransmit (2.4) ----------------------------------------------------------------------


def test_nak_is_answered_immediately_from_the_log() -> None:
    sender, app = make_sender()
    connect(sender)
    for i in range(10):
        publish(app, bytes([i]) * 500)  # 544 bytes per frame, two per datagram
    original = drain(sender, MS)
    sender.on_datagram(nak(1088, 1088), 2 * MS)
    resent = sender.poll(2 * MS)
    assert resent == [original[1]]
    assert sender.naks_received == 1 and sender.retransmits_sent == 1 and sender.retransmitted_bytes == 1088


def test_overlapping_nak_is_ignored_during_retransmit_linger() -> None:
    sender, app = make_sender()
    connect(sender)
    for i in range(10):
        publish(app, bytes([i]) * 500)
    drain(sender, MS)
    sender.on_datagram(nak(1088, 1088), 2 * MS)
    assert len(sender.poll(2 * MS)) == 1
    sender.on_datagram(nak(1088, 1088), 5 * MS)
    sender.on_datagram(nak(1088 + 544, 544), 6 * MS)  # starts inside the lingering action
    assert sender.poll(6 * MS) == [] and sender.naks_ignored == 2
    sender.poll(12 * MS + 1)  # linger (10 ms) over
    sender.on_datagram(nak(1088, 1088), 13 * MS)
    assert len(sender.poll(13 * MS)) == 1 and sender.retransmits_sent == 2


def test_each_nak_is_answered_as_it_arrives_and_one_that_does_not_overlap_takes_over_the_action() -> None:
    sender, app = make_sender()
    connect(sender)
    for i in range(10):
        publish(app, bytes([i]) * 500)
    original = drain(sender, MS)
    sender.on_datagram(nak(0, 1088), 2 * MS)
    sender.on_datagram(nak(4352, 1088), 2 * MS)  # takes over the single unicast action, as in C
    assert sender.poll(2 * MS) == [original[0], original[4]]  # both answered: C resends on arrival
    sender.on_datagram(nak(4352, 1088), 3 * MS)  # overlaps the lingering action: ignored
    sender.on_datagram(nak(0, 1088), 3 * MS)  # the first range again: no longer the action's, resent
    assert sender.poll(3 * MS) == [original[0]] and sender.naks_ignored == 1


def test_retransmit_length_is_clamped_to_receiver_window_multiple() -> None:
    sender, app = make_sender(SenderConfig(receiver_window=256, max_retransmit_datagrams_per_poll=100))
    connect(sender)
    for i in range(40):
        publish(app, bytes([i]) * 500)
    drain(sender, MS)
    sender.on_datagram(nak(0, 40 * 544), 2 * MS)
    resent = sender.poll(2 * MS)
    # 256 x 16 = 4096 bytes asked at most: the 7 whole frames (544 bytes each) that fit in it
    assert sum(len(d) for d in resent) == 7 * 544 == sender.retransmitted_bytes


def test_long_retransmission_is_spread_over_polls() -> None:
    sender, app = make_sender(SenderConfig(max_retransmit_datagrams_per_poll=2))
    connect(sender)
    for i in range(20):
        publish(app, bytes([i]) * 500)
    original = drain(sender, MS)
    sender.on_datagram(nak(0, 10 * 1088), 2 * MS)  # two datagrams made on arrival, the rest two per poll
    resent = [sender.poll(2 * MS) for _ in range(6)]
    assert [len(batch) for batch in resent] == [4, 2, 2, 2, 0, 0]
    assert [d for batch in resent for d in batch] == original[:10]
    assert sender.retransmits_sent == 1


def test_nak_outside_resend_window_is_not_retransmitted() -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"w" * 500)
    drain(sender, MS)
    sender.on_datagram(nak(544, 544), 2 * MS)  # at the sender position: never sent
    sender.on_datagram(nak(TERM * 3, 544), 2 * MS)  # far ahead
    assert sender.poll(2 * MS) == []
    assert sender.naks_outside_window == 2 and sender.retransmits_sent == 0


def test_invalid_naks_are_dropped_and_counted() -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"w" * 500)
    drain(sender, MS)
    bad = [
        Nak(SESSION, STREAM, INITIAL, 16, 32),  # not 32-aligned
        Nak(SESSION, STREAM, INITIAL, -32, 32),
        Nak(SESSION, STREAM, INITIAL, TERM, 32),
        Nak(SESSION, STREAM, INITIAL, 0, -1),
        Nak(SESSION, STREAM, INITIAL, TERM - 64, 96),  # runs past the term end
        Nak(SESSION, STREAM, INITIAL, 0, 2**31 - 1),
    ]
    for frame in bad:
        sender.on_datagram(frame.encode(), 2 * MS)
    assert sender.invalid_packets == len(bad) and sender.naks_received == 0
    assert sender.poll(2 * MS) == []


# -- status message and RTTM validation --------------------------------------------------------------


def test_invalid_status_messages_are_dropped_and_counted() -> None:
    sender, _ = make_sender()
    sender.poll(0)
    bad = [
        StatusMessage(SESSION, STREAM, INITIAL, 16, 4096, 1),  # offset not aligned
        StatusMessage(SESSION, STREAM, INITIAL, TERM, 4096, 1),
        StatusMessage(SESSION, STREAM, INITIAL, -32, 4096, 1),
        StatusMessage(SESSION, STREAM, INITIAL, 0, TERM // 2 + 1, 1),  # window above term/2
        StatusMessage(SESSION, STREAM, INITIAL, 0, -1, 1),
    ]
    for frame in bad:
        sender.on_datagram(frame.encode(), MS)
    assert sender.invalid_packets == len(bad)
    assert not sender.is_connected and sender.sender_limit == 0


def test_status_message_more_than_half_a_term_from_sender_position_is_rejected() -> None:
    sender, _ = make_sender()
    sender.on_datagram(sm(TERM // 2 + 32, 4096), MS)
    sender.on_datagram(sm(5 * TERM, 4096), MS)
    sender.on_datagram(StatusMessage(SESSION, STREAM, INITIAL - 1, 0, 4096, 1).encode(), MS)
    assert sender.status_messages_rejected == 3 and sender.sender_limit == 0 and not sender.is_connected
    sender.on_datagram(sm(TERM // 2, 4096), MS)
    assert sender.sender_limit == TERM // 2 + 4096


def test_status_message_for_another_session_is_ignored() -> None:
    sender, _ = make_sender()
    sender.on_datagram(sm(0, 4096, session=SESSION + 1), MS)
    assert not sender.is_connected and sender.ignored_packets == 1


def test_rttm_with_reply_flag_is_echoed() -> None:
    sender, _ = make_sender()
    connect(sender)
    sender.on_datagram(RttMeasurement(SESSION, STREAM, 123456789, 55, 42, RTTM_REPLY_FLAG).encode(), MS)
    sender.on_datagram(RttMeasurement(SESSION, STREAM, 1, 2, 42, 0).encode(), MS)  # a reply: nothing to do
    replies = [f for f in frames_of(sender.poll(MS)) if isinstance(f, RttMeasurement)]
    assert replies == [RttMeasurement(SESSION, STREAM, 123456789, 0, 42, 0)]


# -- liveness, end of stream, linger (2.3.4, 2.5) ---------------------------------------------------


def test_receiver_liveness_expires_after_publication_connection_timeout() -> None:
    sender, app = make_sender()
    connect(sender)
    sender.poll(4999 * MS)
    assert sender.is_connected
    sender.poll(5 * S)
    assert not sender.is_connected and not sender.log.is_connected
    assert sender.publisher_limit() == sender.sender_position
    assert app.append(b"late", sender.publisher_limit()) == NOT_CONNECTED


def test_full_window_with_connected_receiver_is_back_pressure() -> None:
    sender, app = make_sender()
    connect(sender)
    while (result := app.append(b"f" * 1000, sender.publisher_limit())) > 0 or result == ADMIN_ACTION:
        pass
    assert result == BACK_PRESSURED


def test_error_frame_drops_the_receiver_from_liveness() -> None:
    sender, _ = make_sender()
    connect(sender)
    sender.on_datagram(ErrorFrame(SESSION, STREAM, 1, 13, "image rejected").encode(), MS)
    assert not sender.is_connected and sender.errors_received == 1
    assert sender.last_error == "code 13: image rejected"


def test_close_sends_eos_heartbeat_at_final_position_and_linger_ends_on_eos_status_message() -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"e" * 100)
    drain(sender, MS)
    sender.close()
    assert sender.poll(2 * MS) == [] and sender.state is SenderState.LINGER and sender.is_end_of_stream
    assert sender.poll_due(2 * MS)  # the end-of-stream heartbeat goes at once, not a heartbeat period later
    beats = [f for f in frames_of(sender.poll(2 * MS)) if isinstance(f, DataFrame)]
    assert beats == [DataFrame.heartbeat(160, SESSION, STREAM, INITIAL, eos=True)]
    assert beats[0].flags == UNFRAGMENTED | EOS_FLAG
    sender.on_datagram(sm(0, 0, flags=SM_SEND_SETUP_FLAG), 50 * MS)  # no SETUP once at end of stream
    sender.on_datagram(sm(160, 4096, flags=SM_EOS_FLAG), 50 * MS)
    assert sender.poll(50 * MS) == [] and sender.is_done
    assert sender.poll(300 * MS) == []


def test_linger_ends_after_linger_timeout_without_eos_status_message() -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"e" * 100)
    drain(sender, MS)
    sender.close()
    sender.poll(2 * MS)
    sender.on_datagram(sm(160, 4096), 3 * S)  # a live receiver that never sends EOS
    sender.poll(5 * S + 2 * MS)
    assert sender.state is SenderState.LINGER
    sender.poll(5 * S + 2 * MS + 1)
    assert sender.is_done


def test_group_setup_carries_group_flag_and_one_eos_status_message_does_not_end_linger() -> None:
    sender, _ = make_sender(SenderConfig(group=True))
    assert decode_datagram(sender.poll(0)[0]) == [SetupFrame(0, SESSION, STREAM, INITIAL, INITIAL, TERM, 1408, 0, 0x40)]
    sender.on_datagram(sm(0, 4096, receiver_id=1), MS)
    sender.on_datagram(sm(0, 4096, receiver_id=2), MS)
    sender.close()
    sender.poll(2 * MS)
    sender.on_datagram(sm(0, 4096, receiver_id=1, flags=SM_EOS_FLAG), 3 * MS)
    sender.poll(4 * MS)
    assert sender.state is SenderState.LINGER and sender.is_connected  # receiver 2 is still there


def test_draining_waits_for_window_then_sends_the_rest_before_eos() -> None:
    sender, app = make_sender()
    connect(sender, window=1024)
    for _ in range(4):
        publish(app, b"q" * 480)  # 512 bytes each
    sender.close()
    drain(sender, MS)
    assert sender.state is SenderState.DRAINING and sender.sender_position == 1024
    sender.on_datagram(sm(1024, 1024), 2 * MS)
    drain(sender, 2 * MS)
    assert sender.state is SenderState.LINGER and sender.sender_position == 2048 and sender.is_end_of_stream


def test_draining_without_receivers_lingers_without_eos() -> None:
    sender, app = make_sender()
    publish(app, b"x" * 100)
    sender.close()
    sender.poll(0)
    assert sender.state is SenderState.LINGER and not sender.is_end_of_stream
    sender.poll(5 * S + 1)
    assert sender.is_done


# -- hostile input ----------------------------------------------------------------------------------


def test_garbage_truncated_and_wrong_version_datagrams_are_counted_not_raised() -> None:
    sender, _ = make_sender()
    good = sm(0, 4096)
    wrong_version = bytearray(good)
    wrong_version[4] = 1
    for datagram in (b"", b"\x00", good[:20], bytes(wrong_version), b"\xff" * 64, struct.pack("<iBBH", -5, 0, 0, 3)):
        sender.on_datagram(datagram, 0)
    assert sender.invalid_packets == 6 and not sender.is_connected
    sender.on_datagram(SetupFrame(0, SESSION, STREAM, 1, 1, TERM, 1408).encode(), 0)  # wrong direction
    assert sender.ignored_packets == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=20), st.integers(0, 10 * S))
def test_random_datagrams_never_raise_and_poll_stays_bounded(datagrams: list[bytes], now: int) -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"z" * 3000)
    for datagram in datagrams:
        sender.on_datagram(datagram, now)
    assert len(sender.poll(now)) <= sender.max_datagrams_per_poll


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["sm", "nak", "rttm"]),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 255),
)
def test_well_formed_control_frames_with_any_values_never_raise(kind: str, a: int, b: int, c: int, flags: int) -> None:
    sender, app = make_sender()
    connect(sender)
    publish(app, b"z" * 3000)
    drain(sender, MS)
    if kind == "sm":
        frame: Frame = StatusMessage(SESSION, STREAM, a, b, c, a, None, flags)
    elif kind == "nak":
        frame = Nak(SESSION, STREAM, a, b, c)
    else:
        frame = RttMeasurement(SESSION, STREAM, a, b, c, flags)
    for _ in range(40):
        sender.on_datagram(frame.encode(), 2 * MS)
    assert len(sender.poll(2 * MS)) <= sender.max_datagrams_per_poll
    assert sender.sender_limit >= 0


def test_rttm_flood_is_bounded_per_poll() -> None:
    sender, _ = make_sender()
    probe = RttMeasurement(SESSION, STREAM, 1, 0, 2, RTTM_REPLY_FLAG).encode()
    for _ in range(10_000):
        sender.on_datagram(probe, 0)
    assert len(sender.poll(0)) <= sender.max_datagrams_per_poll
    assert sender.rttm_replies_sent == 16


def test_many_receiver_ids_are_tracked_in_bounded_memory() -> None:
    sender, _ = make_sender()
    for receiver_id in range(10_000):
        sender.on_datagram(sm(0, 4096, receiver_id=receiver_id), receiver_id)
    assert len(sender._receivers) <= sender.config.max_tracked_receivers
    assert sender.is_connected


# -- batching -----------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 20)), min_size=1, max_size=3),
    claimed=st.none() | st.integers(0, 60),
    window=st.integers(0, TERM // 2),
    budget=st.integers(1, 64),
    mtu=st.sampled_from([1408, 4096, 8192]),
)
def test_a_backlog_of_equal_messages_is_cut_into_datagrams_as_the_frame_scan_cuts_it(
    runs: list[tuple[int, int]], claimed: int | None, window: int, budget: int, mtu: int
) -> None:
    """The equal-frames shortcut of ``poll`` must send exactly what scanning frame by frame sends,
    whatever the backlog holds: runs of sizes (fragmented or not), an uncommitted claim, a window
    or a send budget cutting it anywhere."""
    senders = []
    for shortcut in (True, False):
        sender, app = make_sender(SenderConfig(max_messages_per_send=budget), mtu=mtu)
        if not shortcut:
            sender._send_equal_run = lambda *args: 0  # type: ignore[method-assign]
        connect(sender, window=window)
        index = 0
        for size, count in runs:
            for _ in range(count):
                if index == claimed:
                    app.claim(min(size, app.max_payload_length), 1 << 40, BufferClaim())
                else:
                    publish(app, bytes([index % 251]) * size)
                index += 1
        senders.append(sender)
    fast, walk = senders
    for now in (MS, 2 * MS, 3 * MS):
        assert fast.poll(now) == walk.poll(now)
        assert fast.sender_position == walk.sender_position


def test_idle_heartbeats_back_off_when_configured_and_new_data_restarts_them() -> None:
    """With ``idle_heartbeat_max_ns`` the first heartbeat after data still comes 100 ms later (it
    reveals a lost tail); the next ones come a cap apart. New data starts over."""
    sender, app = make_sender(SenderConfig(idle_heartbeat_max_ns=400 * MS))
    connect(sender)
    publish(app, b"h" * 10)
    sender.poll(0)
    sent_at = [t for t in range(MS, 1600 * MS, MS) for d in sender.poll(t) if len(d) == 32]
    assert sent_at == [101 * MS, 502 * MS, 903 * MS, 1304 * MS]
    publish(app, b"x" * 10)
    assert [len(d) for d in sender.poll(1600 * MS)] == [64]  # the data
    sent_at = [t for t in range(1601 * MS, 2200 * MS, MS) for d in sender.poll(t) if len(d) == 32]
    assert sent_at == [1701 * MS, 2102 * MS]
    with pytest.raises(ValueError, match="idle_heartbeat_max_ns"):
        SenderConfig(idle_heartbeat_max_ns=50 * MS).validate()


def test_a_new_dynamic_mdc_destination_asking_for_setup_gets_its_own_at_once() -> None:
    """Not up to 100 ms later with the next periodic SETUP (a client's connect waited that twice)."""
    sender, _ = make_sender(SenderConfig(control_mode="dynamic"))
    assert sender.poll_batches(0) == []  # the first SETUP: no destination yet
    first, second = ("10.0.0.2", 40001), ("10.0.0.3", 40002)
    register = StatusMessage(0, 0, 0, 0, 0, 9, None, SM_SEND_SETUP_FLAG).encode()  # Aeron's session-less form
    sender.on_datagram(register, 5 * MS, first)
    batches = sender.poll_batches(5 * MS)
    assert [(to, [type(f) for d in datagrams for f in decode_datagram(d)]) for datagrams, to in batches] == [
        (first, [SetupFrame])
    ]
    sender.on_datagram(register, 6 * MS, first)  # known now: it waits for the periodic SETUP
    assert sender.poll_batches(6 * MS) == []
    sender.on_datagram(register, 7 * MS, second)
    assert [to for _, to in sender.poll_batches(7 * MS)] == [second]
    assert [sorted(to for _, to in sender.poll_batches(101 * MS))] == [sorted([first, second])]  # periodic, to all
    unicast, _ = make_sender()
    unicast.poll(0)
    unicast.on_datagram(register, 5 * MS, first)
    assert unicast.poll_batches(5 * MS) == []
