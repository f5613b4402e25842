"""Image budgets of a subscribed stream (issue 29, item 1): each limit at its exact boundary, in the
sans-I/O endpoint and through a real driver; session-specific streams; rejecting an image; the network
layer's rule for handshake images that hold no handshake."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slipstream import Context, DriverConfig
from slipstream.network.listening import HandshakeImages
from slipstream.protocol import ImageLimits, ImageReleased, ImageRemoved, ReceiveEndpoint
from slipstream.wire.constants import ERROR_CODE_IMAGE_REJECTED, SM_SEND_SETUP_FLAG, TERM_MIN_LENGTH
from slipstream.wire.frames import DataFrame, ErrorFrame, SetupFrame, StatusMessage, decode_datagram
from slipstream.wire.uri import ChannelUri, ChannelUriError

STREAM, OTHER_STREAM = 5, 6
A1, A2, B = ("10.0.0.1", 4000), ("10.0.0.1", 4001), ("10.0.0.2", 4000)
MS = 1_000_000


def setup(session: int, *, term_length: int = TERM_MIN_LENGTH, stream: int = STREAM) -> bytes:
    return SetupFrame(0, session, stream, 0, 0, term_length, 1408, 0).encode()


def endpoint(limits: ImageLimits | None = None, sessions: list[int] | None = None) -> ReceiveEndpoint:
    ep = ReceiveEndpoint(receiver_id=77, rng=random.Random(1))
    ep.add_subscription(STREAM, limits=limits, sessions=sessions)
    ep.add_subscription(OTHER_STREAM)
    return ep


def test_max_term_length_accepts_the_limit_and_refuses_the_next_term() -> None:
    ep = endpoint(ImageLimits(max_term_length=128 * 1024))
    ep.on_datagram(setup(1, term_length=128 * 1024), 0, A1)
    ep.on_datagram(setup(2, term_length=256 * 1024), 0, A1)
    assert [image.session_id for image in ep.images] == [1]
    assert ep.setups_rejected == ep.setups_over_budget == 1
    assert ep.last_error is not None and "max-term-length 131072" in ep.last_error
    ep.on_datagram(setup(3, term_length=64 * 1024 * 1024, stream=OTHER_STREAM), 0, A1)  # another stream: no budget
    assert len(ep.images) == 2


def test_max_images_counts_the_stream_images_until_their_logs_are_released() -> None:
    ep = endpoint(ImageLimits(max_images=3))
    for session in range(4):
        ep.on_datagram(setup(session), 0, A1 if session % 2 else B)
    assert len(ep.images) == 3 and ep.setups_over_budget == 1
    ep.on_datagram(setup(9, stream=OTHER_STREAM), 0, A1)  # other streams are not charged
    assert len(ep.images) == 4
    image = next(image for image in ep.images if image.session_id == 0)
    assert ep.reject_image(image.image_id, "go")
    now = 0
    ep.on_datagram(setup(10), now, A1)  # the rejected image drains: its log is still mapped, still charged
    assert ep.setups_over_budget == 2
    while not any(isinstance(e, ImageReleased) for e in ep.take_events()):
        now += 10 * MS
        ep.poll(now)
    ep.on_datagram(setup(10), now, A1)  # its log released: room again
    assert 10 in {image.session_id for image in ep.images}


def test_max_images_per_source_counts_the_address_not_the_port() -> None:
    ep = endpoint(ImageLimits(max_images_per_source=2))
    ep.on_datagram(setup(1), 0, A1)
    ep.on_datagram(setup(2), 0, A2)  # the same host from another port: at the limit, accepted
    ep.on_datagram(setup(3), 0, A2)  # one over
    ep.on_datagram(setup(4), 0, B)  # another host has its own allowance
    assert sorted(image.session_id for image in ep.images) == [1, 2, 4]
    assert ep.setups_over_budget == 1
    assert ep.last_error is not None and "max-images-per-source 2" in ep.last_error


def test_a_session_specific_stream_makes_images_and_setup_requests_only_for_its_sessions() -> None:
    ep = endpoint(sessions=[7])
    ep.on_datagram(setup(8), 0, A1)
    stranger = DataFrame(0, 8, STREAM, 0, payload=b"x" * 32).encode()
    ep.on_datagram(stranger, 0, A1)
    assert ep.images == [] and ep.poll(0) == [] and ep.no_interest_packets == 2
    ep.on_datagram(DataFrame(0, 7, STREAM, 0, payload=b"x" * 32).encode(), 0, A1)
    assert [decode_datagram(data)[0] for data, _ in ep.poll(0)] == [
        StatusMessage(7, STREAM, 0, 0, 0, 77, None, SM_SEND_SETUP_FLAG)
    ]
    ep.on_datagram(setup(7), 0, A1)
    assert [image.session_id for image in ep.images] == [7]
    ep.add_subscription(STREAM)  # a subscription for any session joined: any session again
    ep.on_datagram(setup(8), 0, A1)
    assert len(ep.images) == 2


def test_rejecting_an_image_sends_err_to_its_sender_and_removes_it() -> None:
    ep = endpoint()
    ep.on_datagram(setup(3), 0, A1)
    (image,) = ep.images
    assert ep.reject_image(image.image_id, "no handshake")
    out = [(decode_datagram(data)[0], to) for data, to in ep.poll(0)]
    assert (ErrorFrame(3, STREAM, 77, ERROR_CODE_IMAGE_REJECTED, "no handshake"), A1) in out
    assert not ep.reject_image(image.image_id, "again")  # already going
    assert not ep.reject_image(12345, "unknown")
    now, removed = 0, []
    while not removed:
        now += 10 * MS
        ep.poll(now)
        removed = [e for e in ep.take_events() if isinstance(e, ImageRemoved)]
    assert removed[0].reason == "rejected" and ep.images_rejected == 1
    assert now <= 1_100 * MS  # after the drain linger (5 status-message periods), not the 10 s liveness timeout


def test_limits_are_validated_and_parsed_from_the_uri() -> None:
    uri = ChannelUri.parse("aeron:udp?endpoint=127.0.0.1:1|max-term-length=64k|max-images=3|max-images-per-source=1")
    assert (uri.max_term_length, uri.max_images, uri.max_images_per_source) == (65536, 3, 1)
    for bad in ("max-images=0", "max-images-per-source=-1", "max-term-length=100k"):
        with pytest.raises(ChannelUriError):
            ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:1|{bad}")
    with pytest.raises(ValueError, match="max_images"):
        ImageLimits(max_images=0).validate()
    assert ImageLimits(max_images=2).widest(ImageLimits(max_images=5, max_term_length=65536)) == ImageLimits(
        None, 5, None
    )
    assert ImageLimits(max_images=2).widest(None) is None


def test_handshake_images_rejects_an_unheld_session_once_at_the_end_of_its_grace() -> None:
    watch = HandshakeImages(timeout_ns=400 * MS)  # looks every 100 ms, grace 300 ms
    assert watch.check([1, 2], held=[2], now_ns=0) == []
    assert watch.deadline_ns == 100 * MS
    assert watch.check([1, 2], held=[], now_ns=299 * MS) == []  # 2 unheld only since now
    assert watch.check([1, 2], held=[], now_ns=300 * MS) == [1]
    assert watch.check([1, 2], held=[], now_ns=600 * MS) == [2]
    assert watch.check([1, 2], held=[], now_ns=2_000 * MS) == []  # told already, still draining
    assert watch.check([1], held=[1], now_ns=2_100 * MS) == []
    assert watch.rejected == 2


# -- through a real driver ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def system_counter(ctx: Context, label: str) -> int:
    return next(c.value for c in ctx.counters() if c.label == label)


def test_a_driver_holds_a_subscription_budget_against_forged_setups(driver_dir: Path) -> None:
    port = free_port()
    with Context(driver_dir, driver_config=DriverConfig(timer_interval_ns=10_000_000)) as ctx:
        channel = f"aeron:udp?endpoint=127.0.0.1:{port}|max-term-length=64k|max-images=2|max-images-per-source=2"
        subscription = ctx.add_subscription(channel, STREAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as forger:
            forger.sendto(setup(1, term_length=128 * 1024), ("127.0.0.1", port))
            for session in (2, 3, 4):
                forger.sendto(setup(session, term_length=64 * 1024), ("127.0.0.1", port))
            wait_for(lambda: system_counter(ctx, "SETUPs refused") == 2)
        assert sorted(image.session_id for image in subscription.images) == [2, 3]
        images = list((driver_dir / "images").glob("*.logbuffer"))
        assert len(images) == 2


def test_session_id_subscription_and_reject_image_through_a_real_driver(driver_dir: Path) -> None:
    port = free_port()
    config = DriverConfig(udp_term_length=65536, timer_interval_ns=10_000_000)
    with Context(driver_dir, driver_config=config) as ctx:
        mine = ctx.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=11", STREAM)
        wanted = ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=11", STREAM)
        stranger = ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=12", STREAM)
        wait_for(lambda: wanted.is_connected)
        time.sleep(0.3)  # the stranger's SETUPs had time to make an image, if they could
        assert [image.session_id for image in mine.images] == [11] and not stranger.is_connected
        (image,) = mine.images
        errors_before = system_counter(ctx, "Error Frames received")
        ctx.reject_image(image, "not you")
        wait_for(lambda: system_counter(ctx, "Images rejected") == 1)
        wait_for(lambda: system_counter(ctx, "Error Frames received") > errors_before)
        # The image went; its publisher, still sending, is imaged anew once the old one is released.
        wait_for(lambda: all(other.correlation_id != image.correlation_id for other in mine.images))
