"""Multi-destination-cast: dynamic (subscribers register at the control port) and manual destinations."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slipstream import Context, DriverConfig, RegistrationError

from .test_udp import free_port, offer, wait_for


@pytest.fixture
def ctx(driver_dir: Path):  # type: ignore[no-untyped-def]
    with Context(driver_dir, driver_config=DriverConfig(udp_term_length=1 << 20)) as context:
        yield context


def destinations(ctx: Context, registration_id: int) -> int:
    driver = ctx._embedded
    assert driver is not None and driver._conductor is not None
    return len(driver._conductor.network_publications[registration_id].destinations)


def test_dynamic_mdc_sends_to_every_registered_subscriber(ctx: Context) -> None:
    control = f"127.0.0.1:{free_port()}"
    pub = ctx.add_exclusive_publication(
        f"aeron:udp?endpoint=127.0.0.1:{free_port()}|control={control}|control-mode=dynamic", 20
    )
    explicit = ctx.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:{free_port()}|control={control}|control-mode=dynamic", 20
    )
    ephemeral = ctx.add_subscription(f"aeron:udp?control={control}|control-mode=dynamic", 20)
    wait_for(lambda: pub.is_connected and explicit.image_count == 1 and ephemeral.image_count == 1)
    assert destinations(ctx, pub.registration_id) == 2
    assert explicit.images[0].source_identity == control  # data comes from the control port
    got: dict[str, list[bytes]] = {"explicit": [], "ephemeral": []}
    for i in range(200):
        offer(pub, b"m%d" % i)
    for name, sub in (("explicit", explicit), ("ephemeral", ephemeral)):
        wait_for(lambda sub=sub, name=name: sub.poll(lambda b, h: got[name].append(bytes(b)), 100) == 0
                 and len(got[name]) == 200)
    assert got["explicit"] == got["ephemeral"] == [b"m%d" % i for i in range(200)]


def test_dynamic_destination_dropped_after_its_status_messages_stop(ctx: Context) -> None:
    control = f"127.0.0.1:{free_port()}"
    pub = ctx.add_exclusive_publication(f"aeron:udp?control={control}|control-mode=dynamic", 21)
    sub = ctx.add_subscription(f"aeron:udp?control={control}|control-mode=dynamic", 21)
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    sub.close()
    started = time.monotonic()
    wait_for(lambda: destinations(ctx, pub.registration_id) == 0, timeout=10)
    assert 4 <= time.monotonic() - started <= 8  # the reference's 5 s destination timeout


def test_manual_mdc_destinations(ctx: Context) -> None:
    port = free_port()
    pub = ctx.add_exclusive_publication("aeron:udp?control-mode=manual", 22)
    sub = ctx.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 22)
    assert not pub.is_connected  # no destination yet
    pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
    wait_for(lambda: pub.is_connected and sub.image_count == 1)
    offer(pub, b"to a manual destination")
    got: list[bytes] = []
    wait_for(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) > 0)
    assert got == [b"to a manual destination"]
    pub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
    assert destinations(ctx, pub.registration_id) == 0
    with pytest.raises(RegistrationError, match="UNKNOWN_DESTINATION"):
        pub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
    with pytest.raises(RegistrationError, match="INVALID_CHANNEL"):
        pub.add_destination("aeron:udp?control=127.0.0.1:1")


def test_destinations_only_in_manual_mode(ctx: Context) -> None:
    pub = ctx.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{free_port()}", 23)
    with pytest.raises(RegistrationError, match="control-mode=manual"):
        pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{free_port()}")
