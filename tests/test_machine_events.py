"""The machines' contract with their adapters: pure-data events through ``take_events()`` and a
public ``deadline_ns`` that agrees with ``poll_due`` (run over ``slipstream.testing.TransportPair``)."""

from __future__ import annotations

import dataclasses

from slipstream.protocol import (
    ImageCreated,
    ImageReleased,
    ImageRemoved,
    PublicationConnected,
    PublicationDisconnected,
    PublicationEndOfStreamSent,
    PublicationErrorReceived,
    PublicationFinished,
    ReceiverConfig,
)
from slipstream.testing import SUBSCRIPTION_ADDRESS, TransportPair
from slipstream.wire.frames import ErrorFrame

MS = 1_000_000
S = 1_000_000_000


def test_the_sender_reports_its_lifecycle_as_data() -> None:
    pair = TransportPair()
    pair.offer([b"one", b"two"])
    pair.close_when_published = True
    pair.run_until(lambda: pair.sender.is_done, 4 * S)
    kinds = [type(e) for e in pair.publication.events]
    assert kinds == [PublicationConnected, PublicationEndOfStreamSent, PublicationDisconnected, PublicationFinished]
    eos = pair.publication.events[1]
    assert isinstance(eos, PublicationEndOfStreamSent) and eos.position == pair.sender.sender_position
    assert all(e.session_id == 0x1234 and e.stream_id == 1001 for e in pair.publication.events)


def test_an_error_frame_is_reported_once_with_its_text() -> None:
    pair = TransportPair()
    pair.offer([b"hello"])
    pair.run_until(lambda: pair.received() == [b"hello"], S)
    error = ErrorFrame(0x1234, 1001, pair.endpoint.receiver_id, 13, "image rejected")
    pair.net.send(SUBSCRIPTION_ADDRESS, pair.publication.address, error.encode())
    pair.run_for(5 * MS)
    errors = [e for e in pair.publication.events if isinstance(e, PublicationErrorReceived)]
    assert errors == [PublicationErrorReceived(0x1234, 1001, pair.endpoint.receiver_id, 13, "image rejected")]


def test_image_events_carry_ids_and_values_only() -> None:
    pair = TransportPair(receiver_config=ReceiverConfig(image_liveness_timeout_ns=S))  # a short linger
    pair.offer([b"x" * 100] * 10)
    pair.close_when_published = True
    pair.run_until(lambda: bool(pair.events_of(ImageReleased)), 5 * S)
    (created,) = pair.events_of(ImageCreated)
    (removed,) = pair.events_of(ImageRemoved)
    (released,) = pair.events_of(ImageReleased)
    assert created.image_id == removed.image_id == released.image_id
    assert pair.endpoint.image_by_id(released.image_id) is None  # gone once released
    for event in pair.events:
        for value in dataclasses.astuple(event):
            assert isinstance(value, (int, str, tuple)), f"{type(event).__name__} carries {value!r}"


def test_deadline_ns_agrees_with_poll_due() -> None:
    pair = TransportPair(seed=3)
    pair.offer([bytes(500)] * 200)
    checked = 0
    for _ in range(3000):
        pair.step()
        now = pair.now
        endpoint = pair.endpoint
        assert endpoint.poll_due(now) == (now >= endpoint.deadline_ns)
        if now >= pair.sender.deadline_ns:
            assert pair.sender.poll_due(now)  # an append may make it due earlier, never later
        checked += 1
    assert checked == 3000 and len(pair.received()) == 200
