"""Issue 11: the client API checks its arguments, survives refused commands, and reports driver loss
to every subscription, image and awaiting coroutine."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import traceback
from pathlib import Path

import pytest

import slipstream
from slipstream import (
    ChannelUriError,
    Context,
    DriverConfig,
    DriverLostError,
    DriverUnavailableError,
    MediaDriver,
    SlipstreamError,
    offer_async,
    poll_async,
)
from slipstream.files import commands as cmd
from slipstream.files.directory import LOCK_FILE, SOCKET_FILE
from slipstream.wire.uri import ChannelUri, UnsupportedChannelError, check_supported


@pytest.mark.parametrize("stream_id", ["abc", 1.5, None, True])
def test_a_wrong_type_stream_id_is_refused_at_the_call_and_the_context_lives_on(driver, stream_id: object) -> None:  # type: ignore[no-untyped-def]
    with Context(driver.directory, driver="external") as ctx:
        with pytest.raises(TypeError, match="stream_id must be an int") as info:
            ctx.add_subscription("aeron:ipc", stream_id)  # type: ignore[arg-type]
        assert isinstance(info.value, SlipstreamError)
        with pytest.raises(TypeError, match="stream_id"):
            ctx.add_exclusive_publication("aeron:ipc", stream_id)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="channel must be a channel URI string"):
            ctx.add_publication(b"aeron:ipc", 1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="32 bits"):
            ctx.add_subscription("aeron:ipc", 2**40)
        with pytest.raises(TypeError, match="on_available_image must be callable"):
            ctx.add_subscription("aeron:ipc", 1, on_available_image=42)  # type: ignore[arg-type]
        assert ctx.driver_error is None
        with ctx.add_subscription("aeron:ipc", 7) as sub, ctx.add_publication("aeron:ipc", 7) as pub:
            deadline = time.monotonic() + 5
            while pub.offer(b"still alive") < 0:
                assert time.monotonic() < deadline
                time.sleep(0.001)
            got: list[bytes] = []
            while not got:
                assert time.monotonic() < deadline
                sub.poll(lambda payload, header: got.append(bytes(payload)), 1)
            assert got == [b"still alive"]


def _raw_client(directory: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(str(directory / SOCKET_FILE))
    sock.sendall(cmd.encode(cmd.Hello(0, os.getpid())))
    return sock


def _read(sock: socket.socket, decoder: cmd.Decoder[cmd.DriverMessage]) -> cmd.DriverMessage:
    while True:
        messages = decoder.feed(sock.recv(65536))
        if messages:
            assert len(messages) == 1
            return messages[0]


def test_the_driver_answers_a_mistyped_command_with_an_error_and_keeps_the_client(driver) -> None:  # type: ignore[no-untyped-def]
    """A client that bypasses the API's checks (another version, another language) loses one command only."""
    import msgspec

    sock = _raw_client(driver.directory)
    decoder = cmd.driver_decoder()
    welcome = _read(sock, decoder)
    assert isinstance(welcome, cmd.Welcome)
    correlation_id = (welcome.client_id << 32) | 1
    body = msgspec.msgpack.encode(
        {"type": "AddSubscription", "correlation_id": correlation_id, "channel": "aeron:ipc", "stream_id": "abc"}
    )
    sock.sendall(len(body).to_bytes(4, "little") + body)
    answer = _read(sock, decoder)
    assert isinstance(answer, cmd.ErrorResponse) and answer.correlation_id == correlation_id
    assert answer.code == "INVALID_COMMAND" and "stream_id" in answer.message
    good = (welcome.client_id << 32) | 2
    sock.sendall(cmd.encode(cmd.AddSubscription(good, "aeron:ipc", 5)))
    ready = _read(sock, decoder)
    assert isinstance(ready, cmd.SubscriptionReady) and ready.correlation_id == good
    sock.close()


def test_the_driver_refuses_unsupported_channel_features_from_a_client_that_skips_the_check(driver) -> None:  # type: ignore[no-untyped-def]
    sock = _raw_client(driver.directory)
    decoder = cmd.driver_decoder()
    welcome = _read(sock, decoder)
    assert isinstance(welcome, cmd.Welcome)
    for n, (channel, parameter) in enumerate(
        [("aeron:ipc?term-lenght=64k", "term-length"), ("aeron:udp?endpoint=224.0.1.1:40456", "multicast")], 1
    ):
        correlation_id = (welcome.client_id << 32) | n
        sock.sendall(cmd.encode(cmd.AddSubscription(correlation_id, channel, 5)))
        answer = _read(sock, decoder)
        assert isinstance(answer, cmd.ErrorResponse) and answer.correlation_id == correlation_id
        assert answer.code == "UNSUPPORTED_CHANNEL" and parameter in answer.message
    sock.close()


def test_driver_loss_closes_subscriptions_and_wakes_awaiting_coroutines(driver_dir: Path) -> None:
    config = DriverConfig(directory=driver_dir, ipc_term_length=1 << 16)
    media_driver = MediaDriver(config).launch_embedded()
    try:
        ctx = Context(driver_dir, driver="external")
        sub = ctx.add_subscription("aeron:ipc", 9)
        pub = ctx.add_exclusive_publication("aeron:ipc", 9)
        other = ctx.add_subscription("aeron:ipc", 10)
        deadline = time.monotonic() + 5
        while not sub.images:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        image = sub.images[0]
        while pub.offer(b"x" * 1000) > 0:  # fill the window: offer_async then waits on back-pressure
            pass

        async def scenario() -> tuple[BaseException | None, BaseException | None, float]:
            polling = asyncio.ensure_future(poll_async(other, lambda p, h: None))
            offering = asyncio.ensure_future(offer_async(pub, b"y" * 1000))
            await asyncio.sleep(0.05)
            assert not polling.done() and not offering.done()
            lost_at = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, media_driver.close)
            done, _ = await asyncio.wait({polling, offering}, timeout=5)
            assert done == {polling, offering}
            return polling.exception(), offering.exception(), time.monotonic() - lost_at

        poll_error, offer_error, took = asyncio.run(scenario())
        assert isinstance(poll_error, DriverLostError) and isinstance(offer_error, DriverLostError)
        assert took < 3
        assert sub.is_closed and other.is_closed and image.is_closed and not sub.images
        assert isinstance(sub.driver_error, DriverLostError)
        with pytest.raises(DriverLostError):
            sub.poll(lambda p, h: None)
        ctx.close()
    finally:
        media_driver.close()


def test_a_stored_driver_error_is_raised_fresh_each_time(driver_dir: Path) -> None:
    media_driver = MediaDriver(DriverConfig(directory=driver_dir, ipc_term_length=1 << 16)).launch_embedded()
    lost = threading.Event()
    ctx = Context(driver_dir, driver="external", on_driver_lost=lambda error: lost.set())
    media_driver.close()
    assert lost.wait(5)
    assert "went away" in str(ctx.driver_error)
    errors = []
    for _ in range(3):
        try:
            ctx.add_subscription("aeron:ipc", 1)
        except DriverLostError as exc:
            errors.append(exc)
    assert len({id(e) for e in errors}) == 3
    assert len(traceback.format_tb(errors[2].__traceback__)) == len(traceback.format_tb(errors[0].__traceback__))
    ctx.close()


def test_exceptions_share_one_root_and_are_exported() -> None:
    for name in ("ChannelUriError", "ConfigFileError", "CncError", "DriverError", "DriverLostError",
                 "DriverUnavailableError", "DriverAlreadyRunningError", "DriverDirectoryError",
                 "RegistrationError", "UnsupportedChannelError", "DriverConfigError", "InvalidArgumentError"):
        assert issubclass(getattr(slipstream, name), SlipstreamError), name
    assert issubclass(slipstream.ChannelUriError, ValueError)
    assert issubclass(slipstream.DriverConfigError, ValueError)


def test_channel_errors_from_add_are_channel_uri_errors(driver) -> None:  # type: ignore[no-untyped-def]
    with Context(driver.directory, driver="external") as ctx:
        with pytest.raises(ChannelUriError, match="term-length"):
            ctx.add_publication("aeron:ipc?term-length=3", 1)
        with pytest.raises(ChannelUriError, match="did you mean 'term-length'"):
            ctx.add_publication("aeron:ipc?term-lenght=64k", 1)
        with pytest.raises(UnsupportedChannelError, match="multicast"):
            ctx.add_subscription("aeron:udp?endpoint=224.0.1.1:40456", 1)
        with pytest.raises(UnsupportedChannelError, match="'cc'"):
            ctx.add_publication("aeron:udp?endpoint=localhost:40456|cc=cubic", 1)
        for fc in ("min", "tagged,g:1"):
            with pytest.raises(UnsupportedChannelError, match="'fc'"):
                ctx.add_publication(f"aeron:udp?endpoint=localhost:40456|fc={fc}", 1)
        assert ctx.driver_error is None


@pytest.mark.parametrize(
    ("text", "parameter"),
    [
        ("aeron:udp?endpoint=224.0.1.1:40456", "endpoint"),
        ("aeron:udp?endpoint=[ff02::1]:40456", "endpoint"),
        ("aeron:udp?endpoint=localhost:1|cc=cubic", "cc"),
        ("aeron:udp?endpoint=localhost:1|fc=min", "fc"),
        ("aeron:ipc?term-lenght=64k", "term-lenght"),
        ("aeron:ipc?future-key=1", "future-key"),
    ],
)
def test_check_supported_names_the_parameter(text: str, parameter: str) -> None:
    with pytest.raises(UnsupportedChannelError) as info:
        check_supported(ChannelUri.parse(text))
    assert info.value.parameter == parameter


def test_check_supported_accepts_what_the_driver_does() -> None:
    for text in ("aeron:ipc", "aeron:udp?endpoint=localhost:1|fc=max|cc=static|term-length=64k",
                 "aeron:udp?control=127.0.0.1:1|control-mode=dynamic", "aeron:udp?control-mode=manual"):
        check_supported(ChannelUri.parse(text))


def test_driver_config_is_validated_at_construction_and_contradictions_refused(driver_dir: Path) -> None:
    with pytest.raises(ValueError, match="ipc_term_length"):
        DriverConfig(ipc_term_length=1000)
    with pytest.raises(ValueError, match="idle_strategy"):
        DriverConfig(idle_strategy="nap")
    with pytest.raises(ValueError, match="idle_heartbeat_max_ns"):
        DriverConfig(idle_heartbeat_max_ns=10_000_000)  # below the 100 ms heartbeat
    with pytest.raises(ValueError, match="idle_status_message_max_ns"):
        DriverConfig(idle_status_message_max_ns=6_000_000_000)  # past the sender's connection timeout
    with pytest.raises(slipstream.DriverConfigError, match="contradicts"):
        Context(driver_dir, driver_config=DriverConfig(directory=driver_dir / "other"))
    assert not driver_dir.exists()


def test_external_attach_to_a_dead_driver_fails_at_once(driver_dir: Path) -> None:
    driver_dir.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(driver_dir / SOCKET_FILE))  # a socket file left by a killed driver: nobody listens
    listener.close()
    (driver_dir / LOCK_FILE).write_text("999999999\n")
    started = time.monotonic()
    with pytest.raises(DriverUnavailableError, match="refuses connections"):
        Context(driver_dir, driver="external", driver_timeout_s=10)
    assert time.monotonic() - started < 2


def test_a_lost_embedded_driver_of_another_process_says_what_to_do(driver_dir: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, time; from slipstream import Context\n"
        f"ctx = Context({str(driver_dir)!r})\nprint('ready', flush=True)\nsys.stdin.readline()\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        lost = threading.Event()
        with Context(driver_dir, driver="external", on_driver_lost=lambda e: lost.set()) as ctx:
            assert not ctx.is_embedded
            owner.kill()
            assert lost.wait(5)
            message = str(ctx.driver_error)
            assert f"pid {owner.pid}" in message and "slipstream driver --dir" in message
            assert 'driver="external"' in message
    finally:
        owner.kill()
        owner.wait(5)


def test_a_config_file_may_name_a_duration_without_its_ns_suffix(tmp_path: Path) -> None:
    from slipstream.driver.config_file import field_for_key, load_config

    assert field_for_key("publication-linger") == "publication_linger_ns"
    path = tmp_path / "driver.toml"
    path.write_text('client_liveness_timeout = "3s"\n')
    assert load_config(path).client_liveness_timeout_ns == 3_000_000_000


def test_context_arguments_are_checked_with_the_right_builtin(driver_dir: Path) -> None:
    with pytest.raises(TypeError, match="driver_timeout_s"):
        Context(driver_dir, driver_timeout_s="5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="directory"):
        Context(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="driver_config"):
        Context(driver_dir, driver_config={"directory": driver_dir})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="driver must be"):
        Context(driver_dir, driver="bogus")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_driver_lost"):
        Context(driver_dir, on_driver_lost="print")  # type: ignore[arg-type]
    assert not driver_dir.exists()


def test_external_attach_after_a_killed_standalone_driver_fails_at_once(driver_dir: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "slipstream", "driver", "--dir", str(driver_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and "media driver running" in proc.stdout.readline()
    proc.kill()
    proc.wait(5)
    started = time.monotonic()
    with pytest.raises(DriverUnavailableError, match="refuses connections"):
        Context(driver_dir, driver="external", driver_timeout_s=10)
    assert time.monotonic() - started < 2
