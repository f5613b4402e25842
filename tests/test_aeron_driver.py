"""slipstream clients on the reference Aeron media driver (``aeronmd``), through Aeron's CnC file.

A ``Context(directory, driver="external")`` on an ``aeronmd`` directory sends its commands into the
CnC's ring buffer and reads answers on its broadcast buffer; the log buffers it maps are aeronmd's.
Checked here with Aeron's own C clients on the same driver: publications and subscriptions over IPC
and UDP both ways, image callbacks, a client SIGKILLed while attached (the driver times it out), the
driver's refusals as slipstream's exceptions, and slipstream's network layer (a server and a client)
running unchanged on aeronmd. Skipped unless ``SLIPSTREAM_AERON_C_DIR`` names an Aeron C build.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream import Context, FragmentAssembler
from slipstream.client.errors import DriverUnavailableError, RegistrationError
from slipstream.files.cnc import CncFile
from slipstream.logbuffer.fastpath import ATOMICS
from slipstream.network import Client, Connection, Server
from tests.test_aeron_interop import (
    BINARIES,
    ENV_VAR,
    MESSAGE_LINE,
    aeron_process,
    running_aeronmd,
    udp_channel,
    wait_until,
)

pytestmark = [
    pytest.mark.skipif(BINARIES is None, reason=f"needs a reference Aeron C build: set {ENV_VAR} to its directory"),
    pytest.mark.timeout(120),
]
needs_atomics = pytest.mark.skipif(ATOMICS is None, reason="aeronmd's ring buffer needs the C fast path's atomics")
STREAM_ID = 1101


@pytest.fixture
def aeron_dir() -> Iterator[Path]:
    with running_aeronmd() as (directory, _):
        yield directory


def offer_all(pub: object, messages: list[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    for message in messages:
        while pub.offer(message) < 0:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, f"offers refused for {timeout_s} s"
            time.sleep(0.0005)


def poll_until(sub: object, count: int, timeout_s: float = 20.0) -> list[bytes]:
    received: list[bytes] = []
    assembler = FragmentAssembler(lambda payload, header: received.append(bytes(payload)))
    deadline = time.monotonic() + timeout_s
    while len(received) < count:
        assert time.monotonic() < deadline, f"{len(received)} of {count} messages within {timeout_s} s"
        if sub.poll(assembler, 64) == 0:  # type: ignore[attr-defined]
            time.sleep(0.0002)
    return received


@needs_atomics
@pytest.mark.parametrize("transport", ["ipc", "udp"])
def test_slipstream_publication_and_subscription_on_aeronmd(aeron_dir: Path, transport: str) -> None:
    """Both ends slipstream, the driver Aeron's: every message, fragmented ones too, in order."""
    channel = "aeron:ipc" if transport == "ipc" else udp_channel()
    messages = [f"message {i}".encode() * (1 + i % 7) for i in range(2000)]
    messages[500:500] = [bytes(range(256)) * 40]  # 10 KiB: fragments
    with Context(aeron_dir, driver="external") as ctx:
        sub = ctx.add_subscription(channel, STREAM_ID)
        pub = ctx.add_publication(channel, STREAM_ID)
        wait_until(lambda: pub.is_connected and sub.image_count == 1, 10.0, "publication and subscription connected")
        offer_all(pub, messages)
        assert poll_until(sub, len(messages)) == messages
        assert sub.images[0].session_id == pub.session_id


@needs_atomics
@pytest.mark.parametrize("transport", ["ipc", "udp"])
def test_aeron_c_subscriber_reads_a_slipstream_publication_on_aeronmd(aeron_dir: Path, transport: str) -> None:
    """slipstream appends into aeronmd's log; Aeron's basic_subscriber reads it through the same driver."""
    assert BINARIES is not None
    channel = "aeron:ipc" if transport == "ipc" else udp_channel()
    messages = [f"from slipstream {i}".encode() for i in range(300)]
    argv = [str(BINARIES / "basic_subscriber"), "-p", str(aeron_dir), "-c", channel, "-s", str(STREAM_ID)]
    with aeron_process(argv, dict(os.environ)) as sub, Context(aeron_dir, driver="external") as ctx:
        sub.wait_for(lambda line: line.startswith("Subscription channel status"))
        pub = ctx.add_exclusive_publication(channel, STREAM_ID)
        wait_until(lambda: pub.is_connected, 10.0, "Aeron's subscriber connected")
        offer_all(pub, messages)
        lines = sub.wait_for(lambda line: line.startswith("Message to stream"), len(messages), timeout_s=20.0)
    parsed = [MESSAGE_LINE.match(line) for line in lines]
    assert [m.group(4).encode() for m in parsed if m] == messages


@needs_atomics
@pytest.mark.parametrize("transport", ["ipc", "udp"])
def test_slipstream_subscription_reads_an_aeron_c_publisher_with_image_callbacks(
    aeron_dir: Path, transport: str
) -> None:
    """Aeron's streaming_publisher on aeronmd, a slipstream subscription on the same driver: every
    message, and the image callbacks when the publisher comes and when it goes."""
    assert BINARIES is not None
    channel = "aeron:ipc" if transport == "ipc" else udp_channel()
    count = 5000
    events: list[tuple[str, int]] = []
    with Context(aeron_dir, driver="external") as ctx:
        sub = ctx.add_subscription(
            channel,
            STREAM_ID,
            on_available_image=lambda image: events.append(("available", image.session_id)),
            on_unavailable_image=lambda image: events.append(("unavailable", image.session_id)),
        )
        argv = [
            str(BINARIES / "streaming_publisher"),
            *("-p", str(aeron_dir), "-c", channel, "-s", str(STREAM_ID), "-L", "64", "-m", str(count)),
        ]
        with aeron_process(argv, dict(os.environ)) as pub:
            received = poll_until(sub, count, timeout_s=30.0)
            assert pub.proc.wait(10.0) == 0, pub.lines[-5:]
        wait_until(lambda: len(events) >= 2, 15.0, "the image went away after the publisher closed")
    assert [struct.unpack_from("<Q", m)[0] for m in received] == list(range(count))
    assert [kind for kind, _ in events] == ["available", "unavailable"]
    assert events[0][1] == events[1][1]


@needs_atomics
def test_the_driver_refusal_is_a_registration_error(aeron_dir: Path) -> None:
    """What aeronmd refuses comes back as slipstream's ``RegistrationError`` with Aeron's code and text;
    the context goes on working."""
    with Context(aeron_dir, driver="external") as ctx:
        blocker = udp_channel()
        ctx.add_subscription(blocker, STREAM_ID)
        with pytest.raises(RegistrationError) as refused:
            ctx.add_subscription(blocker + "|reliable=false", STREAM_ID)  # same stream, clashing reliability
        assert refused.value.code and str(refused.value)
        pub = ctx.add_publication("aeron:ipc", STREAM_ID + 1)
        assert pub.session_id is not None


def test_external_context_on_a_stopped_aeronmd_is_refused() -> None:
    """A stopped aeronmd leaves its cnc.dat (and a heartbeat it cleared): attaching fails at once, saying so."""
    with running_aeronmd("-Daeron.dir.delete.on.shutdown=false") as (directory, driver):
        driver.stop()
        assert (directory / "cnc.dat").is_file()
        started = time.monotonic()
        with pytest.raises(DriverUnavailableError, match=r"Aeron media driver .* is not running"):
            Context(directory, driver="external", driver_timeout_s=5.0)
        assert time.monotonic() - started < 1.0


CHILD = textwrap.dedent(
    """
    import sys, time
    from slipstream import Context
    ctx = Context(sys.argv[1], driver="external")
    pub = ctx.add_exclusive_publication("aeron:ipc", 1201)
    print(ctx.client_id, pub.registration_id, flush=True)
    time.sleep(60)
    """
)


def client_counters(directory: Path) -> dict[str, int]:
    cnc = CncFile.open(directory)
    try:
        return {info.label: info.value for info in cnc.counters_reader()}
    finally:
        cnc.close()


@needs_atomics
def test_a_sigkilled_client_is_timed_out_by_aeronmd() -> None:
    """A slipstream process attached to aeronmd keeps its heartbeat counter fresh; SIGKILLed, it stops,
    and the driver times it out (its client liveness timeout here 2 s) and frees what it held."""
    with running_aeronmd("-Daeron.client.liveness.timeout=2000000000") as (directory, _):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src")),
        )
        try:
            assert child.stdout is not None
            client_id, registration_id = map(int, child.stdout.readline().split())
            time.sleep(3.0)  # past the liveness timeout: alive by its heartbeat
            labels = client_counters(directory)
            assert any(label.startswith(f"client-heartbeat: id={client_id}") for label in labels), labels
            timeouts_before = labels.get("Client liveness timeouts", 0)
            child.send_signal(signal.SIGKILL)
            child.wait(5.0)
            wait_until(
                lambda: not any(f"id={client_id}" in label for label in client_counters(directory)),
                15.0,
                "aeronmd freed the killed client's counters",
            )
            assert client_counters(directory).get("Client liveness timeouts", 0) == timeouts_before + 1
            assert registration_id > 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5.0)


@needs_atomics
def test_network_layer_runs_on_aeronmd(aeron_dir: Path) -> None:
    """slipstream.network unchanged on the reference driver: an encrypted server and client, over UDP
    and over IPC, typed messages both ways and a ping."""
    from tests.test_network_aio import Base, client_config, free_ports, run, server_config

    async def main() -> list[int]:
        got: list[int] = []
        port = free_ports(2)
        async with Server(server_config(aeron_dir, driver="external", enable_ipc=True)) as server:

            @server.on_message(Base)
            async def echo(connection: Connection, message: Base) -> None:
                await connection.send(Base(message.n * 10))

            await server.bind(port)
            for ipc in (False, True):
                async with Client(client_config(aeron_dir, driver="external", enable_ipc=ipc)) as client:
                    answers: asyncio.Queue[Base] = asyncio.Queue()
                    client.on_message(Base)(lambda connection, message, answers=answers: answers.put_nowait(message))
                    connection = await client.connect("127.0.0.1", port, timeout=10)  # IPC when both allow it
                    assert connection.is_ipc is ipc
                    await connection.send(Base(4 + ipc))
                    got.append((await asyncio.wait_for(answers.get(), 10)).n)
                    assert (await connection.ping(timeout=5)).round_trip < 1.0
        return got

    assert run(main()) == [40, 50]


def test_without_the_c_fast_path_a_context_on_aeronmd_says_why(aeron_dir: Path) -> None:
    """Pure Python cannot compare-and-set on shared memory: attaching to aeronmd then fails, naming the cause."""
    script = "import sys\nfrom slipstream import Context\nContext(sys.argv[1], driver='external')"
    env = dict(os.environ, SLIPSTREAM_NO_EXTENSIONS="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src"))
    done = subprocess.run([sys.executable, "-c", script, str(aeron_dir)], capture_output=True, text=True, env=env,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode != 0
    assert "AtomicsUnavailableError" in done.stderr and "C extension" in done.stderr, done.stderr[-2000:]


@needs_atomics
def test_own_counter_and_mdc_destinations_on_aeronmd(aeron_dir: Path) -> None:
    """``add_counter`` makes a counter aeronmd's readers see under its label, freed by ``close``; a manual
    MDC publication on aeronmd takes destinations added and removed, and a subscriber behind one gets data."""
    with Context(aeron_dir, driver="external") as ctx:
        counter = ctx.add_counter(1234, "slipstream on aeronmd", b"key!")
        counter.set(42)
        found = [c for c in ctx.counters() if c.label == "slipstream on aeronmd"]
        assert [(c.type_id, c.value, c.key[:4]) for c in found] == [(1234, 42, b"key!")]
        counter.close()
        wait_until(lambda: not any(c.label == "slipstream on aeronmd" for c in ctx.counters()), 5.0, "counter freed")

        destination = udp_channel()
        sub = ctx.add_subscription(destination, STREAM_ID)
        port = udp_channel().rsplit(":", 1)[1]
        pub = ctx.add_exclusive_publication(f"aeron:udp?control=127.0.0.1:{port}|control-mode=manual", STREAM_ID)
        pub.add_destination(destination)
        wait_until(lambda: pub.is_connected and sub.image_count == 1, 10.0, "the destination's subscriber connected")
        offer_all(pub, [b"to the destination"])
        assert poll_until(sub, 1) == [b"to the destination"]
        pub.remove_destination(destination)
