"""Dynamic multi-destination-cast in the machines: destinations learned from status messages and
expired, registration at the control address, all under seeded loss (``slipstream.testing``)."""

from __future__ import annotations

import random
import struct
import zlib

from slipstream.protocol import DestinationAdded, DestinationRemoved, SenderConfig
from slipstream.testing import PUBLICATION_ADDRESS, SUBSCRIPTION_ADDRESS, Datagram, LinkConditions, TransportPair
from slipstream.wire.constants import SM_SEND_SETUP_FLAG
from slipstream.wire.frames import StatusMessage, decode_datagram

MS = 1_000_000
S = 1_000_000_000
SECOND_SUBSCRIPTION = ("10.0.0.3", 20122)
MDC = SenderConfig(control_mode="dynamic", group=True)
TERM = 256 * 1024
"""The sender limit follows the fastest receiver (max flow control, as Aeron's MDC default): terms
large enough that a lagging receiver's NAKs stay within the resend window for these transfers."""


def messages(count: int, seed: int) -> list[bytes]:
    """Messages carrying their sequence number and a CRC of their body, some of them fragmented."""
    rng = random.Random(seed)
    out = []
    for sequence in range(count):
        body = rng.randbytes(rng.randint(0, 2000))
        out.append(struct.pack("<II", sequence, zlib.crc32(body)) + body)
    return out


def lossy(loss: float) -> LinkConditions:
    return LinkConditions(loss=loss, duplicate=0.05, reorder=0.1, delay_ns=50_000, jitter_ns=30_000)


def is_registration(datagram: Datagram) -> bool:
    frame = decode_datagram(datagram.data)[0]
    return isinstance(frame, StatusMessage) and frame.session_id == 0 and bool(frame.flags & SM_SEND_SETUP_FLAG)


def both_joined(pair: TransportPair) -> None:
    """Run until every subscription has its image. A registration is answered with a SETUP of its own
    at once, at the sender's position then: one that joins after data flowed starts there (as in
    Aeron), so these tests let both join before anything is offered."""
    pair.run_until(lambda: all(sub.subscriber is not None for sub in pair.subscriptions), 5 * S)


def test_dynamic_mdc_delivers_every_byte_to_every_registered_subscription_under_loss() -> None:
    pair = TransportPair(seed=61, sender_config=MDC, term_length=TERM, data_link=lossy(0.1), control_link=lossy(0.1))
    second = pair.add_subscription(SECOND_SUBSCRIPTION, control=PUBLICATION_ADDRESS, seed=62)
    both_joined(pair)
    sent = messages(100, seed=61)
    pair.offer(sent)
    pair.run_until(lambda: pair.received() == sent and second.received() == sent, 30 * S)
    assert set(pair.sender.destinations) == {SUBSCRIPTION_ADDRESS, SECOND_SUBSCRIPTION}
    added = [e.destination for e in pair.publication.events if isinstance(e, DestinationAdded)]
    assert sorted(added) == sorted([SUBSCRIPTION_ADDRESS, SECOND_SUBSCRIPTION])
    assert pair.net.stats.dropped > 0 and pair.sender.retransmits_sent > 0
    # Images answer the control address, where the data comes from.
    assert all(sub.subscriber is not None for sub in pair.subscriptions)
    assert {sub.subscriber.image.control_address for sub in pair.subscriptions if sub.subscriber} == {
        PUBLICATION_ADDRESS
    }


def test_a_silent_destination_expires_and_the_others_keep_receiving() -> None:
    config = SenderConfig(control_mode="dynamic", group=True, destination_timeout_ns=2 * S)
    pair = TransportPair(
        seed=63, sender_config=config, term_length=TERM, data_link=lossy(0.05), control_link=lossy(0.05)
    )
    second = pair.add_subscription(SECOND_SUBSCRIPTION, control=PUBLICATION_ADDRESS, seed=64)
    both_joined(pair)
    first = messages(40, seed=63)
    pair.offer(first)
    pair.run_until(lambda: pair.received() == first and second.received() == first, 10 * S)
    pair.publication.events.clear()
    second.running = False  # its driver died: no more registrations or status messages
    pair.net.unbind(SECOND_SUBSCRIPTION)
    gone = pair.now
    pair.run_until(lambda: SECOND_SUBSCRIPTION not in pair.sender.destinations, 4 * S)
    # Its last status message or registration left at most 200 ms before; expiry is checked as the sender sends.
    assert config.destination_timeout_ns - 200 * MS < pair.now - gone < config.destination_timeout_ns + 200 * MS
    removed = [e for e in pair.publication.events if isinstance(e, DestinationRemoved)]
    assert [e.destination for e in removed] == [SECOND_SUBSCRIPTION]
    later = messages(40, seed=65)
    pair.offer(later)
    pair.run_until(lambda: pair.received() == first + later, 10 * S)
    assert list(pair.sender.destinations) == [SUBSCRIPTION_ADDRESS]


def test_registration_is_retried_until_it_gets_through() -> None:
    pair = TransportPair(seed=66, sender_config=MDC)
    dropped: list[Datagram] = []

    def drop_first_registrations(datagram: Datagram) -> bool:
        if len(dropped) < 3 and datagram.destination == PUBLICATION_ADDRESS and is_registration(datagram):
            dropped.append(datagram)
            return True
        return False

    pair.net.add_filter(drop_first_registrations)
    start = pair.now
    pair.offer([b"after the third registration"])
    pair.run_until(lambda: pair.received() == [b"after the third registration"], 6 * S)
    assert len(dropped) == 3
    assert 3 * S <= pair.now - start < 3 * S + 300 * MS  # one registration a second, the fourth gets through


def test_fresh_sends_go_to_every_destination_at_once_and_deliver_every_byte_under_loss() -> None:
    """An invoker-mode driver's ``send_now`` on dynamic MDC (a server's stream to a client):
    ``poll_fresh_batches`` gives what was just appended for every destination, and with fresh sends
    after each append every byte still arrives once, in order, at both (``poll_due`` checked honest
    at every poll)."""
    pair = TransportPair(seed=67, sender_config=MDC, term_length=TERM, data_link=lossy(0.1), control_link=lossy(0.1))
    second = pair.add_subscription(SECOND_SUBSCRIPTION, control=PUBLICATION_ADDRESS, seed=68)
    assert pair.sender.poll_fresh_batches(pair.now) is None  # nobody registered yet: SETUPs first
    both_joined(pair)
    pair.offer([b"z" * 100])
    pair.publication.publish()
    batches = pair.sender.poll_fresh_batches(pair.now)
    assert batches is not None
    assert sorted(destination for _, destination in batches) == sorted([SUBSCRIPTION_ADDRESS, SECOND_SUBSCRIPTION])
    assert all(len(datagrams) == 1 and b"z" * 100 in bytes(datagrams[0]) for datagrams, _ in batches)
    pair.publication.send_fresh = True
    sent = messages(100, seed=67)
    pair.offer(sent)
    pair.run_until(lambda: pair.received()[1:] == sent and second.received()[1:] == sent, 30 * S)
    assert pair.publication.fresh_sent > 0 and pair.sender.retransmits_sent > 0
