"""Sender and receiver state machines talking over the in-memory network, under loss and time travel.

Each test runs a publication (``NetworkPublicationSender`` over a log an ``ExclusiveAppender`` fills)
against a subscription endpoint (``ReceiveEndpoint``), both driven by one manual clock; a subscriber
reads the image log and reassembles messages: ``slipstream.testing.TransportPair``. Every run is
seeded, so failures reproduce exactly.
"""

from __future__ import annotations

import random
import struct
import zlib

import pytest

from slipstream.logbuffer import BACK_PRESSURED, NOT_CONNECTED
from slipstream.protocol import (
    GapFilled,
    ImageCreated,
    ImageEndOfStream,
    ImageReleased,
    ImageRemoved,
    ImageState,
    LossDetected,
    ReceiverConfig,
)
from slipstream.testing import (
    PUBLICATION_ADDRESS,
    SUBSCRIPTION_ADDRESS,
    Datagram,
    InMemoryNetwork,
    LinkConditions,
    ManualClock,
    TransportPair,
    checked_poll,
)
from slipstream.wire.constants import TERM_MIN_LENGTH
from slipstream.wire.frames import DataFrame, Nak, SetupFrame, StatusMessage

TERM = TERM_MIN_LENGTH
PUB = PUBLICATION_ADDRESS
SUB = SUBSCRIPTION_ADDRESS
SESSION, STREAM, INITIAL = 0x1234, 1001, -5  # the initial term id wraps through zero on the way
US = 1_000
MS = 1_000_000
S = 1_000_000_000


def make_messages(count: int, seed: int, max_length: int = 4000) -> list[bytes]:
    """Messages carrying their sequence number and a CRC of their body, many of them fragmented."""
    rng = random.Random(seed)
    messages = []
    for sequence in range(count):
        body = rng.randbytes(rng.randint(0, max_length))
        messages.append(struct.pack("<II", sequence, zlib.crc32(body)) + body)
    return messages


def intact(message: bytes) -> bool:
    return len(message) >= 8 and struct.unpack_from("<I", message, 4)[0] == zlib.crc32(message[8:])


Sim = TransportPair
"""One publication and one subscription endpoint on a seeded lossy network, stepped by hand; every
poll goes through ``checked_poll``, so each scenario also checks ``poll_due``."""


def lossy(loss: float) -> LinkConditions:
    return LinkConditions(
        loss=loss, duplicate=0.05, reorder=0.1, delay_ns=50 * US, jitter_ns=30 * US, reorder_delay_ns=400 * US
    )


# -- reliable delivery ------------------------------------------------------------------------------


def test_every_byte_delivered_once_in_order_across_term_rollover_without_loss() -> None:
    sim = Sim()
    messages = make_messages(300, seed=1)  # about 10 terms of 64 KiB, most messages fragmented
    sim.offer(messages)
    sim.run_until(lambda: len(sim.received()) == len(messages), 5 * S)
    assert sim.received() == messages
    assert sim.sender.retransmits_sent == 0 and sim.sender.naks_received == 0
    assert sim.sender.setups_sent == 1


@pytest.mark.parametrize(("loss", "seed"), [(0.05, 11), (0.05, 31), (0.20, 12), (0.20, 32), (0.20, 33)])
def test_nak_retransmit_delivers_every_byte_once_in_order_under_loss_reordering_and_duplication(
    loss: float, seed: int
) -> None:
    sim = Sim(seed=seed, data_link=lossy(loss), control_link=lossy(loss))
    messages = make_messages(250, seed=seed)
    sim.offer(messages)
    sim.run_until(lambda: len(sim.received()) == len(messages), 30 * S)
    assert sim.received() == messages and all(intact(m) for m in sim.received())
    assert sim.subscriber is not None and sim.subscriber.discarded == 0
    image = sim.subscriber.image
    assert sim.net.stats.dropped > 0 and sim.net.stats.duplicated > 0 and sim.net.stats.reordered > 0
    assert image.naks_sent > 0 and sim.sender.retransmits_sent > 0 and image.loss_observations > 0
    assert image.bytes_lost > 0 and sim.events_of(LossDetected)
    assert sim.sender.invalid_packets == 0 and sim.endpoint.invalid_packets == 0


@pytest.mark.parametrize(("loss", "seed"), [(0.0, 61), (0.2, 62)])
def test_fresh_sends_deliver_every_byte_once_in_order_and_keep_poll_due_honest(loss: float, seed: int) -> None:
    """An invoker-mode driver's ``send_now``: ``poll_fresh`` right after each append, then the duty
    cycle's ``poll``. The stream arrives whole, and every poll that ``poll_due`` called unnecessary
    still sends and changes nothing (``checked_poll``)."""
    link = lossy(loss) if loss else None
    sim = Sim(seed=seed, data_link=link, control_link=link)
    sim.publication.send_fresh = True
    messages = make_messages(250, seed=seed)
    sim.offer(messages)
    sim.run_until(lambda: len(sim.received()) == len(messages), 30 * S)
    assert sim.received() == messages
    assert sim.publication.fresh_sent > 0 and (sim.sender.retransmits_sent > 0) == (loss > 0)


def test_poll_fresh_declines_until_the_receiver_answered_setup() -> None:
    """Before the receiver answered SETUP only ``poll`` knows what goes first: ``poll_fresh`` returns
    None. Once connected it returns the new data alone, and ``poll_due`` stays honest after it."""
    sim = Sim()
    sim.offer([b"x" * 100])
    sim.publication.publish()
    assert sim.sender.poll_fresh(sim.now) is None  # no receiver yet: SETUP first
    sim.run_until(lambda: len(sim.received()) == 1, 1 * S)
    sim.offer([b"y" * 100])
    sim.publication.publish()
    fresh = sim.sender.poll_fresh(sim.now)
    assert fresh is not None and len(fresh) == 1 and b"y" * 100 in bytes(fresh[0])
    checked_poll(sim.sender, sim.now)  # not due: sends and changes nothing


def test_term_ids_wrap_through_the_i32_range_under_loss() -> None:
    sim = Sim(seed=41, data_link=lossy(0.1), control_link=lossy(0.1), initial_term_id=2**31 - 3)
    messages = make_messages(250, seed=41)  # about 8 terms: term ids go 2**31 - 3 ... -2**31 + 4
    sim.offer(messages)
    sim.run_until(lambda: len(sim.received()) == len(messages), 30 * S)
    assert sim.received() == messages
    assert sim.sender.sender_position > 5 * TERM and sim.sender.retransmits_sent > 0


@pytest.mark.parametrize("fresh", [False, True])
def test_tail_loss_is_recovered_after_the_next_heartbeat(fresh: bool) -> None:
    sim = Sim()
    sim.publication.send_fresh = fresh  # poll_fresh must leave the heartbeat timer as poll would
    dropped: list[Datagram] = []

    def drop_last_message_once(datagram: Datagram) -> bool:
        if not dropped and datagram.source == PUB and last in datagram.data:
            dropped.append(datagram)
            return True
        return False

    messages = make_messages(5, seed=3, max_length=200)
    last = messages[-1]
    sim.net.add_filter(drop_last_message_once)
    sim.offer(messages)
    start = sim.now
    sim.run_until(lambda: len(sim.received()) == len(messages), 2 * S)
    assert dropped and sim.received() == messages
    assert 100 * MS < sim.now - start < 150 * MS  # the heartbeat after 100 ms idle exposes the loss
    assert sim.sender.heartbeats_sent == 1 and sim.sender.retransmits_sent == 1


def test_hostile_traffic_during_a_transfer_is_counted_and_harmless() -> None:
    sim = Sim(seed=51, data_link=lossy(0.05), control_link=lossy(0.05))
    rogue = ("10.6.6.6", 666)
    sim.net.bind(rogue)
    rng = random.Random(51)

    def attack() -> None:
        junk = [
            rng.randbytes(rng.randint(0, 100)),
            StatusMessage(SESSION, STREAM, INITIAL, 16, 4096, 9).encode(),  # misaligned
            StatusMessage(SESSION, STREAM, INITIAL, 0, TERM, 9).encode(),  # window above term/2
            Nak(SESSION, STREAM, INITIAL, TERM - 32, 64).encode(),  # past the term end
            SetupFrame(0, rng.getrandbits(31), STREAM, 0, 0, 3 << 20, 1408).encode(),  # not a power of 2
            SetupFrame(0, rng.getrandbits(31), STREAM, 0, 0, TERM, 1 << 20).encode(),  # absurd mtu
            DataFrame(16, SESSION, STREAM, INITIAL, b"bad").encode(),  # misaligned offset
            DataFrame(0, rng.getrandbits(31), STREAM, 0, b"who?").encode(),  # unknown session
        ]
        datagram = rng.choice(junk)
        sim.net.send(rogue, rng.choice([PUB, SUB]), datagram)

    messages = make_messages(150, seed=51)
    sim.offer(messages)
    while len(sim.received()) < len(messages):
        assert sim.now < 1_030 * S
        if rng.random() < 0.2:
            attack()
        sim.step()
    assert sim.received() == messages
    assert sim.sender.invalid_packets > 0 and sim.endpoint.invalid_packets > 0
    assert sim.endpoint.setup_requests_sent > 0 and sim.endpoint.images_created == 1
    assert len(sim.endpoint._pending_setups) <= sim.endpoint.config.max_pending_setups


# -- unreliable delivery ----------------------------------------------------------------------------


def test_unreliable_subscription_fills_gaps_and_keeps_delivering_in_order() -> None:
    sim = Sim(seed=21, data_link=LinkConditions(loss=0.1, delay_ns=50 * US), reliable=False)
    messages = make_messages(250, seed=21)
    sim.offer(messages)
    sim.close_when_published = True
    sim.run_until(lambda: bool(sim.events_of(ImageRemoved)), 10 * S)
    received = sim.received()
    assert 0 < len(received) < len(messages) and all(intact(m) for m in received)
    remaining = iter(messages)
    assert all(any(m == r for m in remaining) for r in received)  # in order, none twice
    fills = sim.events_of(GapFilled)
    assert fills and sim.subscriber is not None
    assert sim.subscriber.image.loss_gap_fills == len(fills) and sim.subscriber.image.naks_sent == 0
    assert sim.sender.naks_received == 0 and sim.sender.retransmits_sent == 0


def test_unreliable_loss_window_tolerates_reordering() -> None:
    config = ReceiverConfig(gap_fill_delay_ns=5 * MS)
    reorder = LinkConditions(reorder=0.2, delay_ns=50 * US, reorder_delay_ns=1 * MS)
    sim = Sim(seed=22, data_link=reorder, reliable=False, receiver_config=config)
    messages = make_messages(120, seed=22)
    sim.offer(messages)
    sim.run_until(lambda: len(sim.received()) == len(messages), 5 * S)
    assert sim.received() == messages and sim.net.stats.reordered > 0
    assert sim.subscriber is not None and sim.subscriber.image.loss_gap_fills == 0


# -- connection establishment and flow control ------------------------------------------------------


def test_publication_is_not_connected_until_the_receiver_answers_setup() -> None:
    sim = Sim()
    sim.net.unbind(SUB)  # nobody listens yet
    sim.offer([b"first"])
    sim.run_for(350 * MS)
    assert sim.last_offer_result == NOT_CONNECTED and sim.published == []
    assert sim.sender.setups_sent == 4 and sim.net.stats.undeliverable == 4
    sim.net.bind(SUB, lambda data, source, now: sim.endpoint.on_datagram(data, now, source))
    sim.run_until(lambda: sim.received() == [b"first"], 200 * MS)
    assert sim.sender.is_connected and sim.sender.setups_sent == 5


def test_late_joining_receiver_elicits_setup_and_joins_at_the_sender_position() -> None:
    sim = Sim()
    sim.offer(make_messages(50, seed=4))
    sim.run_until(lambda: len(sim.received()) == 50, 2 * S)
    setups_before = sim.sender.setups_sent
    # The subscriber restarts: a new endpoint with a new receiver id on the same address knows nothing.
    sim.endpoint = sim.new_endpoint()
    sim.subscriber = None
    later = make_messages(80, seed=5)
    sim.offer(later)
    sim.run_until(lambda: sim.subscriber is not None and len(sim.received()) > 10, 2 * S)
    assert sim.endpoint.setup_requests_sent == 1 and sim.sender.setups_sent == setups_before + 1
    created = sim.events_of(ImageCreated)
    assert len(created) == 2 and created[1].join_position > created[0].join_position
    sim.run_until(lambda: not sim.outbox and sim.sender.sender_position == sim.appender.position, 2 * S)
    sim.run_for(10 * MS)
    received = sim.received()
    assert received and received == later[len(later) - len(received) :]  # the tail, whole and in order


@pytest.mark.parametrize("fresh", [False, True])
def test_flow_control_window_bounds_the_sender_when_the_subscriber_stalls(fresh: bool) -> None:
    sim = Sim()
    sim.publication.send_fresh = fresh
    sim.consume = False
    sim.offer(make_messages(200, seed=6))
    sim.run_for(300 * MS)
    assert sim.subscriber is not None
    join = sim.subscriber.image.join_position
    window = sim.subscriber.image.receiver_window
    assert sim.sender.sender_limit == join + window
    assert join + window - 1408 < sim.sender.sender_position <= join + window
    assert sim.last_offer_result == BACK_PRESSURED and sim.sender.flow_control_limits >= 1
    # pub-lmt keeps the publisher within a term window of the sender (the last message may overhang)
    assert sim.appender.position <= sim.sender.publisher_limit() + sim.appender.max_message_length
    sim.consume = True
    sim.run_until(lambda: len(sim.received()) == 200, 5 * S)
    assert sim.received() == make_messages(200, seed=6)


# -- end of stream, linger, liveness ----------------------------------------------------------------


def test_end_of_stream_reaches_the_image_and_the_eos_status_message_ends_the_linger() -> None:
    sim = Sim()
    messages = make_messages(40, seed=7)
    sim.offer(messages)
    sim.close_when_published = True
    sim.run_until(lambda: sim.sender.is_done, 4 * S)  # well before the 5 s linger timeout
    final = sim.sender.sender_position
    assert sim.received() == messages
    assert sim.events_of(ImageEndOfStream) == [ImageEndOfStream(SESSION, STREAM, final)]
    assert sim.subscriber is not None and sim.subscriber.image.log.end_of_stream_position == final
    sim.run_until(lambda: bool(sim.events_of(ImageReleased)), 15 * S)
    removed = sim.events_of(ImageRemoved)
    assert [r.reason for r in removed] == ["end_of_stream"]
    assert sim.endpoint.images == []


def test_a_draining_image_is_removed_as_soon_as_its_slow_subscriber_catches_up() -> None:
    sim = Sim()
    messages = make_messages(30, seed=8, max_length=100)  # less than a quarter of the receiver window
    sim.consume = False
    sim.offer(messages)
    sim.close_when_published = True
    sim.run_until(lambda: bool(sim.events_of(ImageEndOfStream)), 4 * S)
    sim.run_for(2 * S)  # far beyond the EOS linger: the image still waits for its subscriber
    assert sim.subscriber is not None and sim.subscriber.image.state is ImageState.DRAINING
    assert not sim.events_of(ImageRemoved)
    sim.consume = True
    caught_up = sim.now
    sim.run_until(lambda: bool(sim.events_of(ImageRemoved)), S)
    assert sim.now - caught_up <= 2 * MS  # not at the next status message, 200 ms on
    assert sim.received() == messages


def test_sender_loses_connection_five_seconds_after_the_receiver_vanishes() -> None:
    sim = Sim()
    sim.offer([b"hello"])
    sim.run_until(lambda: sim.received() == [b"hello"], S)
    sim.net.unbind(SUB)
    sim.receiver_running = False  # the subscribing driver died
    gone = sim.now
    sim.run_until(lambda: not sim.sender.is_connected, 6 * S)
    assert 4800 * MS < sim.now - gone < 5100 * MS  # its last SM left up to 200 ms before
    sim.offer([b"nobody"])
    sim.run_for(10 * MS)
    assert sim.last_offer_result == NOT_CONNECTED
    sim.sender.close()  # nobody to drain to: the sender lingers its full timeout, no EOS SM will end it
    closed = sim.now
    sim.run_until(lambda: sim.sender.is_done, 6 * S)
    assert sim.sender.config.linger_timeout_ns < sim.now - closed <= sim.sender.config.linger_timeout_ns + 2 * MS


def test_image_is_removed_ten_seconds_after_the_sender_vanishes() -> None:
    sim = Sim()
    sim.offer([b"hello"])
    sim.run_until(lambda: sim.received() == [b"hello"], S)
    sim.net.unbind(PUB)
    sim.sender_running = False  # the publishing driver died
    gone = sim.now
    sim.run_until(lambda: bool(sim.events_of(ImageRemoved)), 15 * S)
    assert [r.reason for r in sim.events_of(ImageRemoved)] == ["liveness_timeout"]
    assert 11 * S <= sim.now - gone < 11 * S + 300 * MS  # 10 s liveness, then 1 s draining


# -- the test network itself ------------------------------------------------------------------------


def test_in_memory_network_is_deterministic_for_a_seed() -> None:
    def run(seed: int) -> tuple[list[bytes], str]:
        sim = Sim(seed=seed, data_link=lossy(0.2), control_link=lossy(0.2))
        sim.offer(make_messages(30, seed=9))
        sim.run_for(50 * MS)
        return sim.received(), repr(sim.net.stats)

    assert run(5) == run(5)
    assert run(5)[1] != run(6)[1]


def test_in_memory_network_applies_delay_loss_duplication_and_reordering() -> None:
    clock = ManualClock()
    net = InMemoryNetwork(clock, seed=3)
    inbox = net.bind("b")
    net.bind("a")
    net.set_link("a", "b", LinkConditions(delay_ns=100))
    net.send("a", "b", b"one")
    net.send("a", "b", b"two")
    net.send("a", "nowhere", b"lost")
    assert net.deliver_due() == [] and net.next_delivery_ns() == 100
    clock.advance(100)
    assert [d.data for d in net.deliver_due()] == [b"one", b"two"]
    assert inbox.receive() == [(b"one", "a"), (b"two", "a")] and net.stats.undeliverable == 1
    net.set_link("a", "b", LinkConditions(loss=0.5, duplicate=0.5, reorder=0.5, reorder_delay_ns=1000))
    for i in range(1000):
        net.send("a", "b", i.to_bytes(2, "little"))
    clock.advance(2000)
    net.deliver_due()
    got = [int.from_bytes(data, "little") for data, _ in inbox.receive()]
    assert 400 < net.stats.dropped < 600 and net.stats.duplicated > 150 and net.stats.reordered > 150
    assert len(got) == 1000 - net.stats.dropped + net.stats.duplicated and got != sorted(got)
    with pytest.raises(ValueError):
        LinkConditions(loss=1.5)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_handlers_answering_each_other_do_not_loop_within_one_delivery() -> None:
    clock = ManualClock()
    net = InMemoryNetwork(clock)
    net.bind("ping", lambda data, source, now: net.send("ping", source, data))
    net.bind("pong", lambda data, source, now: net.send("pong", source, data))
    net.send("ping", "pong", b"ball")
    assert len(net.deliver_due()) == 1 and net.in_flight == 1
