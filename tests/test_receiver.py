"""ReceiveEndpoint and PublicationImageReceiver: the receiving rules of reference sections 1 and 2."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slipstream.logbuffer import Header, LogBuffers, read_term
from slipstream.protocol import (
    GapFilled,
    ImageCreated,
    ImageEndOfStream,
    ImageParams,
    ImageReleased,
    ImageRemoved,
    ImageState,
    LossDetected,
    Outgoing,
    PublicationImageReceiver,
    ReceiveEndpoint,
    ReceiverConfig,
    default_log_factory,
)
from slipstream.wire.constants import (
    EOS_FLAG,
    HDR_TYPE_PAD,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SM_EOS_FLAG,
    SM_SEND_SETUP_FLAG,
    TERM_MAX_LENGTH,
    TERM_MIN_LENGTH,
)
from slipstream.wire.frames import (
    DataFrame,
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
SRC = ("10.0.0.1", 40000)
RECEIVER_ID = 4242
WINDOW = TERM // 2  # min(128 KiB, term / 2)
US = 1_000
MS = 1_000_000
S = 1_000_000_000


def make_endpoint(config: ReceiverConfig | None = None, *, reliable: bool = True, **kwargs: Any) -> ReceiveEndpoint:
    endpoint = ReceiveEndpoint(config, receiver_id=RECEIVER_ID, rng=random.Random(1), **kwargs)
    endpoint.add_subscription(STREAM, reliable=reliable)
    return endpoint


def setup(
    *,
    term_offset: int = 0,
    active: int = INITIAL,
    initial: int = INITIAL,
    term_length: int = TERM,
    mtu: int = 1408,
    session: int = SESSION,
    stream: int = STREAM,
    flags: int = 0,
) -> bytes:
    return SetupFrame(term_offset, session, stream, initial, active, term_length, mtu, 0, flags).encode()


def data(position: int, payload: bytes, *, session: int = SESSION, flags: int = 0xC0) -> bytes:
    term_id = compute_term_id(position, BITS, INITIAL)
    return DataFrame(position & (TERM - 1), session, STREAM, term_id, payload, flags).encode()


def heartbeat(position: int, *, eos: bool = False, session: int = SESSION) -> bytes:
    term_id = compute_term_id(position, BITS, INITIAL)
    return DataFrame.heartbeat(position & (TERM - 1), session, STREAM, term_id, eos=eos).encode()


def join(endpoint: ReceiveEndpoint, now: int = 0, **setup_args: Any) -> PublicationImageReceiver:
    endpoint.on_datagram(setup(**setup_args), now, SRC)
    endpoint.poll(now)
    image = endpoint.image(SESSION, STREAM)
    assert image is not None
    return image


def decoded(out: list[Outgoing]) -> list[tuple[Frame, object]]:
    return [(frame, destination) for datagram, destination in out for frame in decode_datagram(datagram)]


def status_messages(out: list[Outgoing]) -> list[StatusMessage]:
    return [frame for frame, _ in decoded(out) if isinstance(frame, StatusMessage)]


def naks(out: list[Outgoing]) -> list[Nak]:
    return [frame for frame, _ in decoded(out) if isinstance(frame, Nak)]


def frames_in(log: LogBuffers, position: int, end: int) -> list[tuple[int, bytes]]:
    """(position, payload) of every DATA frame a subscriber would read in [position, end)."""
    got: list[tuple[int, bytes]] = []
    header = Header(log.initial_term_id, log.bits)

    def on(payload: memoryview, h: Header) -> None:
        got.append((h.position - ((h.frame_length + 31) & -32), bytes(payload)))

    while position < end:
        index, offset = (position >> log.bits) % 3, position & (log.term_length - 1)
        _, next_offset, intact = read_term(log.terms[index], log.terms_i32[index], offset, on, 1000, header)
        assert intact
        if next_offset == offset:
            break
        position += next_offset - offset
    return got


def fill(endpoint: ReceiveEndpoint, start: int, end: int, now: int = 0, size: int = 992) -> None:
    """Deliver frames of ``size`` payload bytes (1024 bytes each by default) covering [start, end)."""
    for position in range(start, end, size + 32):
        endpoint.on_datagram(data(position, bytes([position // 1024 % 256]) * size), now, SRC)


# -- image creation (2.2) ---------------------------------------------------------------------------


def test_setup_for_subscribed_stream_creates_image_and_sends_status_message_immediately() -> None:
    endpoint = make_endpoint()
    endpoint.on_datagram(setup(term_offset=1024, active=INITIAL + 1), 5 * MS, SRC)
    out = endpoint.poll(5 * MS)
    assert decoded(out) == [(StatusMessage(SESSION, STREAM, INITIAL + 1, 1024, WINDOW, RECEIVER_ID), SRC)]
    (event,) = endpoint.take_events()
    assert isinstance(event, ImageCreated)
    assert (event.session_id, event.stream_id, event.source, event.join_position) == (SESSION, STREAM, SRC, TERM + 1024)
    image = endpoint.image_by_id(event.image_id)
    log = image.log
    assert (log.initial_term_id, log.session_id, log.stream_id, log.mtu) == (INITIAL, SESSION, STREAM, 1408)
    assert endpoint.images == [image] and endpoint.images_created == 1


def test_setup_for_known_session_creates_no_second_image() -> None:
    endpoint = make_endpoint()
    join(endpoint)
    endpoint.on_datagram(setup(), MS, SRC)
    assert len(endpoint.images) == 1 and endpoint.take_events()[1:] == []


def test_setup_for_unsubscribed_stream_is_ignored() -> None:
    endpoint = make_endpoint()
    endpoint.on_datagram(setup(stream=STREAM + 1), 0, SRC)
    assert endpoint.poll(0) == [] and endpoint.images == [] and endpoint.no_interest_packets == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"term_length": 3 * 32768},
        {"term_length": TERM // 2},
        {"term_length": -TERM},
        {"term_offset": 16},
        {"term_offset": TERM},
        {"term_offset": -32},
        {"mtu": 1400},
        {"mtu": 65536},
        {"mtu": 32},
        {"mtu": 0},
        {"mtu": -1408},
        {"mtu": 65504},  # a legal MTU, but above this image's receiver window (32 KiB)
        {"active": INITIAL - 1},
    ],
)
def test_invalid_setup_is_dropped_and_counted(bad: dict[str, int]) -> None:
    calls: list[ImageParams] = []

    def factory(params: ImageParams) -> LogBuffers:
        calls.append(params)
        return default_log_factory(params)

    endpoint = make_endpoint(log_factory=factory)
    endpoint.on_datagram(setup(**bad), 0, SRC)
    assert endpoint.invalid_packets == 1 and endpoint.images == [] and calls == []
    assert endpoint.poll(0) == [] and endpoint.last_error is not None


def test_setup_above_local_term_length_limit_is_refused_without_allocating() -> None:
    calls: list[ImageParams] = []

    def factory(params: ImageParams) -> LogBuffers:
        calls.append(params)
        raise AssertionError("must not allocate")

    endpoint = make_endpoint(log_factory=factory)
    endpoint.on_datagram(setup(term_length=TERM_MAX_LENGTH), 0, SRC)  # valid on the wire: 1 GiB terms
    assert endpoint.setups_rejected == 1 and endpoint.invalid_packets == 0 and calls == []


def test_max_images_bounds_the_sessions_of_an_endpoint() -> None:
    endpoint = make_endpoint(ReceiverConfig(max_images=3))
    for session in range(5):
        endpoint.on_datagram(setup(session=session), 0, SRC)
    assert len(endpoint.images) == 3 and endpoint.setups_rejected == 2


def test_failing_log_factory_refuses_the_setup() -> None:
    def factory(params: ImageParams) -> LogBuffers:
        raise OSError("no space left on device")

    endpoint = make_endpoint(log_factory=factory)
    endpoint.on_datagram(setup(), 0, SRC)
    assert endpoint.images == [] and endpoint.setups_rejected == 1
    assert endpoint.last_error is not None and "no space" in endpoint.last_error


# -- late joiners (2.2.4) ---------------------------------------------------------------------------


def test_data_for_unknown_session_elicits_setup_at_most_once_per_second() -> None:
    endpoint = make_endpoint()
    endpoint.on_datagram(data(4096, b"x" * 10, session=99), 0, SRC)
    request = StatusMessage(99, STREAM, 0, 0, 0, RECEIVER_ID, None, SM_SEND_SETUP_FLAG)
    assert decoded(endpoint.poll(0)) == [(request, SRC)]
    endpoint.on_datagram(heartbeat(4096, session=99), 500 * MS, SRC)
    assert endpoint.poll(500 * MS) == []
    endpoint.on_datagram(heartbeat(4096, session=99), S, SRC)
    assert decoded(endpoint.poll(S)) == [(request, SRC)]
    assert endpoint.setup_requests_sent == 2 and endpoint.images == []
    endpoint.on_datagram(setup(session=99, term_offset=4096), S + MS, SRC)
    assert endpoint.image(99, STREAM) is not None


def test_end_of_stream_heartbeat_of_unknown_session_elicits_nothing() -> None:
    endpoint = make_endpoint()
    endpoint.on_datagram(heartbeat(4096, eos=True, session=99), 0, SRC)
    assert endpoint.poll(0) == [] and endpoint.setup_requests_sent == 0


def test_many_unknown_sessions_are_asked_for_setup_in_bounded_memory() -> None:
    endpoint = make_endpoint(ReceiverConfig(max_pending_setups=16, max_outbound=8))
    for session in range(1000):
        endpoint.on_datagram(heartbeat(0, session=session), 0, SRC)
    assert len(endpoint._pending_setups) == 16 and endpoint.setup_requests_suppressed == 984
    assert len(endpoint.poll(0)) == 8 and endpoint.outbound_overflows == 8


# -- data, flow control, loss (2.3, 2.4) ------------------------------------------------------------


def test_data_is_written_at_its_term_offset_and_a_filled_slot_is_left_alone() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.on_datagram(data(160, b"b" * 50), MS, SRC)  # out of order
    endpoint.on_datagram(data(0, b"a" * 100), MS, SRC)
    endpoint.on_datagram(data(0, b"a" * 100), MS, SRC)  # duplicate
    endpoint.on_datagram(data(0, b"Z" * 100), MS, SRC)  # same slot, other bytes: ignored
    endpoint.poll(MS)
    assert frames_in(image.log, 0, 256) == [(0, b"a" * 100), (160, b"b" * 50)]
    assert image.rebuild_position == image.high_water_mark == 256


def test_batched_datagram_with_term_end_pad_fills_the_rest_of_the_term() -> None:
    endpoint = make_endpoint()
    image = join(endpoint, term_offset=TERM - 1024)
    frames = DataFrame(TERM - 1024, SESSION, STREAM, INITIAL, b"t" * 100).encode()
    frames += PadFrame(TERM - 864, SESSION, STREAM, INITIAL, 864).encode()
    endpoint.on_datagram(frames, MS, SRC)
    endpoint.on_datagram(data(TERM, b"next term"), MS, SRC)
    endpoint.poll(MS)
    assert image.rebuild_position == TERM + 64
    assert frames_in(image.log, TERM - 1024, TERM + 64) == [(TERM - 1024, b"t" * 100), (TERM, b"next term")]


def test_data_below_last_status_message_position_is_an_under_run() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    fill(endpoint, 0, 16384)
    image.on_consumption(16384)
    assert [sm.consumption_term_offset for sm in status_messages(endpoint.poll(MS))] == [16384]
    endpoint.on_datagram(data(0, b"old"), 2 * MS, SRC)
    assert image.flow_control_under_runs == 1 and image.last_sm_position == 16384


def test_data_beyond_half_a_term_past_last_status_message_is_an_over_run() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.on_datagram(data(TERM // 2 - 64, b"x" * 32), MS, SRC)  # ends exactly at the threshold
    endpoint.on_datagram(data(TERM // 2, b"y"), MS, SRC)
    assert image.flow_control_over_runs == 1 and image.high_water_mark == TERM // 2


def test_heartbeat_raises_high_water_mark_so_tail_loss_is_naked() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.on_datagram(data(0, b"a" * 100), MS, SRC)  # the frame at 160 is lost
    endpoint.on_datagram(heartbeat(320), 100 * MS, SRC)
    assert image.high_water_mark == 320 and image.heartbeats_received == 1
    endpoint.poll(100 * MS)
    assert naks(endpoint.poll(100 * MS + US)) == [Nak(SESSION, STREAM, INITIAL, 160, 160)]


def test_nak_is_sent_after_the_nak_delay_and_retried_while_the_gap_persists() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.on_datagram(data(0, b"a" * 100), 0, SRC)
    endpoint.on_datagram(data(480, b"c" * 100), 0, SRC)  # gap [160, 480)
    times = [t for t in range(0, 250 * US, US) for _ in naks(endpoint.poll(t))]
    assert times == [1 * US, 101 * US, 201 * US]
    (nak,) = naks(endpoint.poll(301 * US))
    assert (nak.term_id, nak.term_offset, nak.length) == (INITIAL, 160, 320)
    assert decoded([(nak.encode(), SRC)])[0][1] == SRC
    endpoint.on_datagram(data(160, b"b" * 288), 302 * US, SRC)  # the retransmission fills [160, 480)
    assert naks(endpoint.poll(302 * US)) == [] and naks(endpoint.poll(10 * MS)) == []
    assert image.rebuild_position == 640 and image.naks_sent == 4


def test_every_gap_up_to_the_high_water_mark_is_naked_with_its_own_timer() -> None:
    endpoint = make_endpoint(ReceiverConfig(max_gaps_naked=2))
    image = join(endpoint)
    endpoint.take_events()
    for position in (0, 320, 640, 960):  # gaps [160, 320), [480, 640) and [800, 960)
        endpoint.on_datagram(data(position, b"x" * 100), 0, SRC)
    endpoint.poll(0)
    first = [(n.term_offset, n.length) for n in naks(endpoint.poll(US))]
    assert first == [(160, 160), (480, 160)]  # at most max_gaps_naked at once, in stream order
    endpoint.on_datagram(data(160, b"y" * 100), 50 * US, SRC)  # the first retransmission arrives
    assert naks(endpoint.poll(50 * US)) == []  # the third gap's timer starts: its NAK after the delay
    again = [(n.term_offset, n.length) for n in naks(endpoint.poll(101 * US))]
    assert again == [(480, 160), (800, 160)]  # the second gap's retry; the third gap's first NAK
    losses = [e for e in endpoint.take_events() if isinstance(e, LossDetected)]
    assert [(e.term_offset, e.bytes_lost) for e in losses] == [(160, 160), (480, 160), (800, 160)]
    assert image.bytes_lost == 480 and image.rebuild_position == 480


def test_nak_timing_is_configurable() -> None:
    endpoint = make_endpoint(ReceiverConfig(nak_delay_ns=5 * US, nak_retry_delay_ns=20 * US))
    join(endpoint)
    endpoint.on_datagram(data(160, b"b" * 100), 0, SRC)  # gap [0, 160)
    times = [t for t in range(0, 50 * US, US) for _ in naks(endpoint.poll(t))]
    assert times == [5 * US, 25 * US, 45 * US]


def test_group_setup_uses_randomised_nak_backoff_up_to_10ms() -> None:
    endpoint = make_endpoint()
    join(endpoint, flags=SETUP_GROUP_FLAG)
    endpoint.on_datagram(data(160, b"b" * 100), 0, SRC)
    first = next(t for t in range(0, 20 * MS, 10 * US) if naks(endpoint.poll(t)))
    assert 0 < first <= 10 * MS + 10 * US


def test_loss_report_counts_each_gap_once_across_nak_retries() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.take_events()
    endpoint.on_datagram(data(160, b"b" * 100), 0, SRC)  # gap [0, 160)
    for t in range(0, MS, 10 * US):
        endpoint.poll(t)
    losses = [e for e in endpoint.take_events() if isinstance(e, LossDetected)]
    assert losses == [LossDetected(SESSION, STREAM, INITIAL, 0, 160, 160, 10 * US)]
    assert image.loss_observations == 1 and image.bytes_lost == 160 and image.naks_sent > 5
    endpoint.on_datagram(data(0, b"a" * 100), MS, SRC)
    endpoint.on_datagram(data(640, b"d" * 100), MS, SRC)  # a new gap [320, 640)
    for t in range(MS, 2 * MS, 10 * US):
        endpoint.poll(t)
    assert image.loss_observations == 2 and image.bytes_lost == 160 + 320


# -- status messages (2.3.3) ------------------------------------------------------------------------


def test_status_message_position_is_lazy_until_consumption_moves_a_quarter_window() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    fill(endpoint, 0, 16384)
    image.on_consumption(320)
    assert status_messages(endpoint.poll(MS)) == []
    image.on_consumption(WINDOW // 4)
    assert status_messages(endpoint.poll(MS)) == []
    image.on_consumption(WINDOW // 4 + 32)
    (sm,) = status_messages(endpoint.poll(MS))
    assert (sm.consumption_term_id, sm.consumption_term_offset, sm.receiver_window) == (INITIAL, 8224, WINDOW)


def test_status_message_at_least_every_200ms() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    fill(endpoint, 0, 4096)
    image.on_consumption(320)  # lazy: stays at 0
    times = [t for t in range(0, 650 * MS, MS) for _ in status_messages(endpoint.poll(t))]
    assert times == [201 * MS, 402 * MS, 603 * MS]
    assert {sm.consumption_term_offset for sm in status_messages(endpoint.poll(S))} == {0}


def test_consumption_input_cannot_claim_data_not_received() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    fill(endpoint, 0, 1024)
    image.on_consumption(TERM * 5)
    assert image.consumption_position == 1024
    image.on_consumption(0)
    assert image.consumption_position == 1024


def test_status_messages_stop_when_the_sender_is_silent_for_5_seconds() -> None:
    endpoint = make_endpoint()
    join(endpoint)
    assert status_messages(endpoint.poll(4900 * MS))
    assert status_messages(endpoint.poll(5 * S)) == []


# -- unreliable mode (2.4.5) ------------------------------------------------------------------------


def test_unreliable_image_pads_gaps_instead_of_naking_and_reports_them() -> None:
    endpoint = make_endpoint(reliable=False)
    image = join(endpoint)
    endpoint.take_events()
    endpoint.on_datagram(data(0, b"a" * 100), 0, SRC)
    endpoint.on_datagram(data(320, b"c" * 100), 0, SRC)  # [160, 320) lost
    out = endpoint.poll(0) + endpoint.poll(US)
    assert naks(out) == []
    events = endpoint.take_events()
    assert GapFilled(SESSION, STREAM, 160, 160) in events
    assert any(isinstance(e, LossDetected) for e in events)
    assert image.rebuild_position == 480 and image.loss_gap_fills == 1
    assert image.log.terms[0][160 + 6] == HDR_TYPE_PAD
    assert frames_in(image.log, 0, 480) == [(0, b"a" * 100), (320, b"c" * 100)]
    endpoint.on_datagram(data(160, b"late" * 10), 2 * US, SRC)  # too late: the slot is taken
    assert frames_in(image.log, 0, 480) == [(0, b"a" * 100), (320, b"c" * 100)]


def test_unreliable_gap_fill_waits_for_the_loss_window() -> None:
    endpoint = make_endpoint(ReceiverConfig(gap_fill_delay_ns=5 * MS), reliable=False)
    image = join(endpoint)
    endpoint.on_datagram(data(0, b"a" * 100), 0, SRC)
    endpoint.on_datagram(data(320, b"c" * 100), 0, SRC)
    endpoint.poll(0)
    endpoint.poll(4 * MS)
    endpoint.on_datagram(data(160, b"b" * 100), 4 * MS, SRC)  # reordered, but within the window
    endpoint.poll(4 * MS)
    assert image.loss_gap_fills == 0 and image.rebuild_position == 480
    assert [p for p, _ in frames_in(image.log, 0, 480)] == [0, 160, 320]


# -- end of stream, liveness, linger (2.5) ----------------------------------------------------------


def test_end_of_stream_drains_image_with_eos_status_messages_then_removes_it_after_linger() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.take_events()
    endpoint.on_datagram(data(160, b"b" * 100), MS, SRC)  # [0, 160) missing
    endpoint.on_datagram(heartbeat(320, eos=True), MS, SRC)
    assert endpoint.take_events() == [ImageEndOfStream(SESSION, STREAM, 320)]
    assert image.log.end_of_stream_position == 320
    endpoint.poll(MS)
    assert image.state is ImageState.ACTIVE  # not everything has arrived yet
    endpoint.on_datagram(data(0, b"a" * 100), 2 * MS, SRC)
    endpoint.poll(2 * MS)
    assert image.state is ImageState.DRAINING
    sms = status_messages(endpoint.poll(2 * MS))  # at once: it ends the sender's linger
    assert sms and all(sm.flags == SM_EOS_FLAG for sm in sms)
    endpoint.poll(1100 * MS)
    assert image.state is ImageState.DRAINING  # subscribers have not consumed up to rcv-pos
    image.on_consumption(320)
    endpoint.poll(1101 * MS)
    assert image.state is ImageState.LINGER and endpoint.images == []
    assert endpoint.take_events() == [ImageRemoved(SESSION, STREAM, "end_of_stream", image.image_id)]
    assert endpoint.poll(1500 * MS) == []
    endpoint.poll(12 * S)
    assert endpoint.take_events() == [ImageReleased(SESSION, STREAM, image.image_id)]
    endpoint.on_datagram(setup(term_offset=320), 12 * S, SRC)  # no cool-down after a clean end
    assert endpoint.image(SESSION, STREAM) is not None


def test_image_liveness_timeout_removes_image_and_cools_down_its_session() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.on_datagram(heartbeat(0), 9 * S, SRC)  # heartbeats keep an image alive
    endpoint.poll(19 * S)
    assert image.state is ImageState.ACTIVE
    endpoint.poll(19 * S + 1)
    assert image.state is ImageState.DRAINING and image.removal_reason == "liveness_timeout"
    endpoint.poll(20 * S + 2)
    assert image.state is ImageState.LINGER
    assert next(e for e in endpoint.take_events() if isinstance(e, ImageRemoved)).reason == "liveness_timeout"
    endpoint.on_datagram(data(0, b"again"), 21 * S, SRC)
    endpoint.on_datagram(setup(), 21 * S, SRC)
    assert endpoint.poll(21 * S) == [] and endpoint.images == []  # cool-down: ignored
    endpoint.poll(31 * S)
    assert image.state is ImageState.DONE
    endpoint.on_datagram(data(0, b"again"), 31 * S, SRC)
    assert [sm.flags for sm in status_messages(endpoint.poll(31 * S))] == [SM_SEND_SETUP_FLAG]


def test_removing_the_subscription_drains_and_removes_its_images() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.remove_subscription(STREAM)
    endpoint.poll(MS)
    assert image.state is ImageState.DRAINING
    endpoint.poll(1100 * MS)
    assert image.state is ImageState.DONE and endpoint.images == []
    reasons = [e.reason for e in endpoint.take_events() if isinstance(e, ImageRemoved)]
    assert reasons == ["unsubscribed"]


# -- RTTM and hostile input -------------------------------------------------------------------------


def test_rttm_with_reply_flag_is_answered_by_receiver() -> None:
    endpoint = make_endpoint()
    join(endpoint)
    endpoint.on_datagram(RttMeasurement(SESSION, STREAM, 777, 5, 1, RTTM_REPLY_FLAG).encode(), MS, SRC)
    endpoint.on_datagram(RttMeasurement(SESSION + 1, STREAM, 777, 5, 1, RTTM_REPLY_FLAG).encode(), MS, SRC)
    replies = [f for f, _ in decoded(endpoint.poll(MS)) if isinstance(f, RttMeasurement)]
    assert replies == [RttMeasurement(SESSION, STREAM, 777, 0, RECEIVER_ID, 0)]
    assert endpoint.ignored_packets == 1


def test_malformed_datagrams_are_counted_not_raised() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    good = data(0, b"x" * 100)
    wrong_version = bytearray(good)
    wrong_version[4] = 1
    two_sessions = good + data(160, b"y", session=SESSION + 1)
    for datagram in (b"", good[:31], good + b"\x00" * 8, bytes(wrong_version), b"\x00" * 6 + b"\x09\x00", two_sessions):
        endpoint.on_datagram(datagram, MS, SRC)
    assert endpoint.invalid_packets == 6
    beyond_term = DataFrame(TERM, SESSION, STREAM, INITIAL, b"x").encode()
    misaligned = DataFrame(16, SESSION, STREAM, INITIAL, b"x").encode()
    crossing = DataFrame(TERM - 32, SESSION, STREAM, INITIAL, b"x" * 100).encode()
    for datagram in (beyond_term, misaligned, crossing):
        endpoint.on_datagram(datagram, MS, SRC)
    assert endpoint.invalid_packets == 9
    endpoint.on_datagram(DataFrame(0, SESSION, STREAM, INITIAL - 1, b"old").encode(), MS, SRC)
    assert image.flow_control_under_runs == 1
    endpoint.on_datagram(Nak(SESSION, STREAM, INITIAL, 0, 32).encode(), MS, SRC)  # a sender's input
    assert endpoint.ignored_packets == 1
    assert image.high_water_mark == 0 and frames_in(image.log, 0, TERM) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=20))
def test_random_datagrams_never_raise_at_receiver(datagrams: list[bytes]) -> None:
    endpoint = make_endpoint()
    join(endpoint)
    for datagram in datagrams:
        endpoint.on_datagram(datagram, MS, SRC)
    endpoint.poll(MS)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 255),
    st.binary(max_size=64),
    st.booleans(),
)
def test_data_with_any_header_values_never_raises(
    term_id: int, offset: int, flags: int, payload: bytes, pad: bool
) -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    if pad:
        datagram = PadFrame(offset, SESSION, STREAM, term_id, max(32, abs(offset) % (2 * TERM)), flags).encode()
    else:
        datagram = DataFrame(offset, SESSION, STREAM, term_id, payload, flags).encode()
    endpoint.on_datagram(datagram, MS, SRC)
    endpoint.poll(MS)
    assert 0 <= image.high_water_mark <= TERM // 2


@settings(max_examples=200, deadline=None)
@given(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
)
def test_setup_with_any_values_never_raises_or_overallocates(
    offset: int, initial: int, active: int, term_length: int, mtu: int
) -> None:
    sizes: list[int] = []

    def factory(params: ImageParams) -> LogBuffers:
        sizes.append(params.term_length)
        return default_log_factory(params)

    endpoint = make_endpoint(ReceiverConfig(max_term_length=TERM * 4), log_factory=factory)
    frame = SetupFrame(offset, SESSION, STREAM, initial, active, term_length, mtu)
    endpoint.on_datagram(frame.encode(), 0, SRC)
    endpoint.poll(0)
    assert all(size <= TERM * 4 for size in sizes)
    assert endpoint.invalid_packets + endpoint.setups_rejected + len(endpoint.images) == 1


def test_eos_flag_on_data_of_known_session_is_only_data() -> None:
    endpoint = make_endpoint()
    image = join(endpoint)
    endpoint.on_datagram(data(0, b"x", flags=0xC0 | EOS_FLAG), MS, SRC)
    endpoint.poll(MS)
    assert not image.is_end_of_stream and image.rebuild_position == 64


# -- GRO batches ------------------------------------------------------------------------------------


def _log_bytes(log: LogBuffers) -> bytes:
    return b"".join(bytes(term) for term in log.terms)


@settings(max_examples=150, deadline=None)
@given(
    frame_payload=st.sampled_from([0, 32, 100, 992, 1376]),
    per_datagram=st.integers(1, 6),
    datagrams=st.integers(2, 30),
    last_frames=st.integers(1, 6),
    dropped=st.sets(st.integers(0, 29), max_size=3),
    corrupt=st.none() | st.tuples(st.integers(0, 29), st.integers(0, 1500), st.integers(0, 255)),
    replay=st.booleans(),
    batch=st.integers(2, 12),
)
@example(  # the first frame's length, corrupted, spans the whole batch: no run (each datagram is invalid alone)
    frame_payload=0, per_datagram=2, datagrams=5, last_frames=1, dropped=set(), corrupt=(0, 1, 1), replay=False, batch=5
)
def test_a_batch_of_datagrams_lands_as_they_would_one_by_one(
    frame_payload: int,
    per_datagram: int,
    datagrams: int,
    last_frames: int,
    dropped: set[int],
    corrupt: tuple[int, int, int] | None,
    replay: bool,
    batch: int,
) -> None:
    """``on_datagrams`` (a GRO batch) takes a run in one go only where that changes nothing: the
    image's log, positions, counters and what it sends next are those of feeding each datagram alone,
    whatever was lost, corrupted or received before."""
    aligned = (frame_payload + 32 + 31) & -32
    per_datagram = max(1, min(per_datagram, 1408 // aligned))
    wire: list[bytes] = []
    position = 0
    for number in range(datagrams):
        frames = b""
        for _ in range(min(per_datagram, last_frames) if number == datagrams - 1 else per_datagram):
            frame = data(position, bytes([position // 32 % 251]) * frame_payload)
            frames += frame + bytes(aligned - len(frame))
            position += aligned
        wire.append(frames)
    if corrupt is not None and corrupt[0] < len(wire):
        index, offset, value = corrupt
        damaged = bytearray(wire[index])
        damaged[offset % len(damaged)] = value
        wire[index] = bytes(damaged)
    sent = [d for i, d in enumerate(wire) if i not in dropped]
    if replay:
        sent = sent[: len(sent) // 2] + sent  # the first half arrives twice (a retransmission)
    one_by_one, batched = make_endpoint(), make_endpoint()
    images = [join(one_by_one), join(batched)]
    for datagram in sent:
        one_by_one.on_datagram(datagram, MS, SRC)
    start = 0
    while start < len(sent):
        run = [sent[start]]
        # As GRO coalesces: datagrams of one size, the last of a batch possibly shorter.
        while len(run) < batch and start + len(run) < len(sent) and len(run[-1]) == len(run[0]):
            if len(sent[start + len(run)]) > len(run[0]):
                break
            run.append(sent[start + len(run)])
        batched.on_datagrams(b"".join(run), len(run[0]), MS, SRC)
        start += len(run)
    a, b = images
    assert _log_bytes(a.log) == _log_bytes(b.log)
    assert (a.high_water_mark, a.rebuild_position) == (b.high_water_mark, b.rebuild_position)
    assert (a.datagrams_received, a.bytes_received) == (b.datagrams_received, b.bytes_received)
    assert one_by_one.invalid_packets == batched.invalid_packets
    assert decoded(one_by_one.poll(2 * MS)) == decoded(batched.poll(2 * MS))


@settings(max_examples=100, deadline=None)
@given(
    full=st.integers(1, 46),
    tail_payload=st.integers(0, 1375),
    start=st.integers(0, 3),
    corrupt=st.none() | st.tuples(st.integers(0, 46), st.integers(0, 1407), st.integers(0, 255)),
    known_session=st.booleans(),
)
def test_a_batch_ending_in_a_shorter_datagram_lands_as_one_by_one(
    full: int, tail_payload: int, start: int, corrupt: tuple[int, int, int] | None, known_session: bool
) -> None:
    """The bulk shape: one-frame datagrams of a full MTU, then the message's shorter last fragment (GSO
    sends it in the same call, GRO delivers it in the same batch): the equal ones go in as a run, the
    short one after it, and the result is that of feeding each alone, corrupt bytes and all."""
    session = SESSION if known_session else SESSION + 1
    wire = [data((start + i) * 1408, bytes([i]) * 1376, session=session) for i in range(full)]
    wire.append(data((start + full) * 1408, b"t" * tail_payload, session=session))
    if corrupt is not None and corrupt[0] < len(wire):
        index, offset, value = corrupt
        damaged = bytearray(wire[index])
        damaged[offset % len(damaged)] = value
        wire[index] = bytes(damaged)
    one_by_one, batched = make_endpoint(), make_endpoint()
    images = [join(one_by_one), join(batched)]
    lead = [data(i * 1408, bytes([200 + i]) * 1376) for i in range(start)]  # the stream so far, in order
    for endpoint in (one_by_one, batched):
        for datagram in lead:
            endpoint.on_datagram(datagram, MS, SRC)
    for datagram in wire:
        one_by_one.on_datagram(datagram, MS, SRC)
    batched.on_datagrams(b"".join(wire), 1408, MS, SRC)
    a, b = images
    assert _log_bytes(a.log) == _log_bytes(b.log)
    assert (a.high_water_mark, a.rebuild_position) == (b.high_water_mark, b.rebuild_position)
    assert (a.datagrams_received, a.bytes_received) == (b.datagrams_received, b.bytes_received)
    assert (one_by_one.invalid_packets, one_by_one.no_interest_packets) == (
        batched.invalid_packets,
        batched.no_interest_packets,
    )
    assert decoded(one_by_one.poll(2 * MS)) == decoded(batched.poll(2 * MS))


def test_idle_status_messages_back_off_when_configured_and_consumption_restarts_them() -> None:
    """With ``idle_sm_max_ns`` timed status messages come that far apart while the position stays put
    (the first after a move still 200 ms later); a status message that moves the position brings the
    200 ms period back."""
    endpoint = make_endpoint(ReceiverConfig(idle_sm_max_ns=800 * MS))
    image = join(endpoint)
    fill(endpoint, 0, 16384)
    times: list[int] = []
    for t in range(MS, 2600 * MS, MS):
        if t % (100 * MS) == 0:
            endpoint.on_datagram(heartbeat(16384), t, SRC)  # the sender is alive
        times += [t for _ in status_messages(endpoint.poll(t))]
    assert times == [201 * MS, 1002 * MS, 1803 * MS]
    image.on_consumption(WINDOW // 4 + 32)  # a quarter window consumed: a status message at once
    times = []
    for t in range(2601 * MS, 3300 * MS, MS):
        if t % (100 * MS) == 0:
            endpoint.on_datagram(heartbeat(16384), t, SRC)
        times += [t for _ in status_messages(endpoint.poll(t))]
    assert times == [2601 * MS, 2802 * MS]
    with pytest.raises(ValueError, match="idle_sm_max_ns"):
        ReceiverConfig(idle_sm_max_ns=100 * MS).validate()
