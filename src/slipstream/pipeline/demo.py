"""``slipstream pipeline demo``: record a real run, report on it with Spark, then the live abuse-list loop.

1. A real transport run with recording on: typed messages over IPC and UDP through an embedded
   driver, captured (typed columns) into Parquet segments, plus the driver's counters, loss report
   and error log. Connection events come from a :data:`ConnectionSource`.
2. ``pipeline report`` over that recording: the tables and the HTML report, whose path is printed.
3. The loop: a streaming query keeps the abuse list up to date and publishes it on a slipstream
   stream; a subscriber refuses listed addresses through its admission callback.

INTEGRATION NOTE (``make demo``, issue 13 item 5). The network layer (servers, clients, handshakes)
is not in this tree yet, so the default :func:`synthetic_connections` records the connection
events and per-connection statistics *through the public recording API* with made-up values, and
labels them ``tag="synthetic-..."``. The integrator replaces it with a ConnectionSource that runs a
real ``Server`` and several ``Client`` s (some refused on purpose: IP filter, connection limits)
with recording on (``network`` calls ``Recorder.record(handshake_rejected(...))`` etc.), and makes
the abuse-loop's server use ``AbuseListSubscriber.admit`` as its admission callback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ..client import BACK_PRESSURED, Context
from ..driver.config import DriverConfig
from ..telemetry import (
    ConnectionStats,
    DriverSampler,
    Recorder,
    RecorderConfig,
    StreamCapture,
    connected,
    disconnected,
    handshake_accepted,
    handshake_rejected,
    msgspec_decoder,
)
from .options import DEFAULT_ABUSE_THRESHOLD, ReportOptions

IPC_STREAM = 1001
UDP_STREAM = 1002
ABUSE_STREAM = 1003
LIVE_OFFENDER = "198.51.100.7"


class Quote(msgspec.Struct, tag=True):
    """A demo message type: captured with its fields as typed columns (``typed.Quote``)."""

    symbol: str
    bid: float
    ask: float
    sequence: int


class Chat(msgspec.Struct, tag=True):
    """A second demo message type (``typed.Chat``)."""

    sender: str
    text: str


@dataclass
class RunSummary:
    """What the recorded run did, counted by the demo itself (the report must agree)."""

    messages: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    connections: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


ConnectionSource = Callable[[Recorder, RunSummary], None]
"""Records connection events and stats into the recorder and counts them in the summary."""


def say(text: str) -> None:
    """Print a line of the tour at once (it runs for a while)."""
    print(text, flush=True)


def synthetic_connections(recorder: Recorder, summary: RunSummary, clients: int = 5) -> None:
    """Stand-in until the network layer lands: connection events and stats recorded through the public
    API (``tag="synthetic-..."``), including refused handshakes from a few addresses."""
    now = time.time_ns()
    for i in range(clients):
        address = f"127.0.0.1:{40000 + i}"
        tag = f"synthetic-client-{i}"
        start = now + i * 1_000_000
        recorder.record(handshake_accepted(start, connection_id=100 + i, address=address, tag=tag))
        recorder.record(connected(start + 200_000, connection_id=100 + i, address=address, tag=tag))
        for tick in range(1, 6):
            recorder.record(
                ConnectionStats(
                    start + tick * 200_000_000, 100 + i, address, tag, tick * 100 * (i + 1), tick * 100 * (i + 1),
                    tick * 3200 * (i + 1), tick * 3200 * (i + 1), rtt_ns=30_000 + 5_000 * tick + 1_000 * i,
                )
            )  # fmt: skip
        recorder.record(disconnected(start + 1_100_000_000, connection_id=100 + i, address=address, cause="closed",
                                     tag=tag))  # fmt: skip
        summary.connections += 1
    for offender, reason, attempts in (
        ("203.0.113.5:50000", "ip_filter", 8),
        ("203.0.113.9:50001", "too_many_connections", 6),
        ("192.0.2.44:50002", "bad_key", 2),
    ):
        for attempt in range(attempts):
            recorder.record(handshake_rejected(now + attempt, address=offender, reason=reason, tag="synthetic"))
        summary.rejected[offender] = attempts


def _udp_channel() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"aeron:udp?endpoint=127.0.0.1:{port}"


def record_run(
    recording: Path, *, messages: int = 20_000, connections: ConnectionSource = synthetic_connections
) -> RunSummary:
    """A real IPC + UDP run through an embedded driver, recorded into ``recording``."""
    summary = RunSummary()
    driver_dir = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"slipstream-pdemo-{os.getpid()}"
    encoder = msgspec.msgpack.Encoder()
    config = RecorderConfig(flush_interval_s=0.2, segment_max_age_s=2.0)
    try:
        with Recorder(recording, writer_id="demo", config=config) as recorder, Context(
            driver_dir, driver="embedded", driver_config=DriverConfig(directory=driver_dir, ipc_term_length=1 << 22)
        ) as context:
            decoder = msgspec_decoder(Quote, Chat)
            channels = {"aeron:ipc": IPC_STREAM, _udp_channel(): UDP_STREAM}
            captures = [StreamCapture(context, ch, sid, recorder, decoder=decoder) for ch, sid in channels.items()]
            sampler = DriverSampler(recorder, driver_dir, interval_s=0.5).start()
            deadline = time.monotonic() + 120
            for (channel, stream_id), capture in zip(channels.items(), captures, strict=True):
                publication = context.add_publication(channel, stream_id)
                while not publication.is_connected:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{channel}: no subscriber connected")
                    time.sleep(0.005)
                sent_bytes = 0
                for i in range(messages):
                    if i % 10 == 9:
                        payload = encoder.encode(Chat(f"user{i % 7}", f"message {i}"))
                    else:
                        payload = encoder.encode(Quote("SLIP", 100 + i % 50 / 10, 100.1 + i % 50 / 10, i))
                    while (result := publication.offer(payload)) < 0:
                        if result != BACK_PRESSURED or time.monotonic() > deadline:
                            raise RuntimeError(f"{channel}: offer failed ({result})")
                        capture.poll()
                    sent_bytes += len(payload)
                    if i % 64 == 0:
                        capture.poll()
                while capture.messages < messages:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{channel}: captured {capture.messages} of {messages}")
                    if capture.poll() == 0:
                        capture.convert()
                        time.sleep(0.0005)
                summary.messages[channel] = messages
                summary.bytes[channel] = sent_bytes
                publication.close()
                say(f"  {channel} stream {stream_id}: sent and captured {messages} typed messages ({sent_bytes} bytes)")
            connections(recorder, summary)
            sampler.stop()
            for capture in captures:
                capture.close()
    finally:
        shutil.rmtree(driver_dir, ignore_errors=True)
    return summary


def abuse_loop(output: Path, recording: Path, *, master: str | None, threshold: int, timeout_s: float = 120.0) -> bool:
    """Start the streaming abuse-list query, add a new offender live, and show a subscriber refusing it."""
    from ..telemetry.abuse import AbuseListSubscriber
    from .live import start_abuse_list_query
    from .session import spark_session

    spark = spark_session(master)
    driver_dir = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"slipstream-pdemo-loop-{os.getpid()}"
    checkpoint = output / "checkpoints" / "abuse-list"
    shutil.rmtree(checkpoint, ignore_errors=True)
    try:
        with Context(driver_dir, driver="embedded") as context:
            listed = AbuseListSubscriber(
                context,
                "aeron:ipc",
                ABUSE_STREAM,
                on_listed=lambda e: say(f"  server: {e.address} is now on the abuse list ({e.reasons})"),
            ).start()
            query = start_abuse_list_query(
                spark, recording, channel="aeron:ipc", stream_id=ABUSE_STREAM, checkpoint=checkpoint,
                driver_dir=driver_dir, threshold=threshold, trigger_s=1.0,
            )  # fmt: skip
            try:
                say(f"  streaming query {query.id} is running; recording {threshold} refused handshakes from "
                    f"{LIVE_OFFENDER} now")  # fmt: skip
                live = RecorderConfig(flush_interval_s=0.2, segment_max_age_s=0.5)
                with Recorder(recording, writer_id="live", config=live) as recorder:
                    for attempt in range(threshold):
                        recorder.record(
                            handshake_rejected(time.time_ns(), address=f"{LIVE_OFFENDER}:{41000 + attempt}",
                                               reason="ip_filter", tag="live")
                        )  # fmt: skip
                deadline = time.monotonic() + timeout_s
                while listed.admit(f"{LIVE_OFFENDER}:41000"):
                    if time.monotonic() > deadline:
                        say("  the abuse list did not arrive in time")
                        return False
                    time.sleep(0.1)
                for address in (f"{LIVE_OFFENDER}:41000", "127.0.0.1:40001"):
                    verdict = "admitted" if listed.admit(address) else "REFUSED (abuse list)"
                    say(f"  server: connection from {address}: {verdict}")
                return True
            finally:
                query.stop()
                listed.close()
    finally:
        shutil.rmtree(driver_dir, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``pipeline demo`` options."""
    parser.add_argument("--output", type=Path, default=None, metavar="DIR", help="default ./slipstream-demo-<time>")
    parser.add_argument("--messages", type=int, default=20_000, help="typed messages per stream (default 20000)")
    parser.add_argument("--master", default=None, metavar="URL", help="Spark master (default local[*])")
    parser.add_argument("--abuse-threshold", type=int, default=DEFAULT_ABUSE_THRESHOLD, metavar="N")
    parser.add_argument("--no-loop", action="store_true", help="skip the live abuse-list loop")


def run(args: argparse.Namespace) -> int:
    """Run the three steps; exit code 0 when the loop refused the new offender."""
    from .run import generate_report

    output: Path = args.output or Path.cwd() / time.strftime("slipstream-demo-%Y%m%d-%H%M%S")
    recording = output / "recording"
    if recording.exists():
        shutil.rmtree(recording)
    started = time.monotonic()
    say(f"1/3 recording a real run into {recording}")
    summary = record_run(recording, messages=args.messages)
    rejected = sum(summary.rejected.values())
    say(f"  {summary.connections} connections and {rejected} refused handshakes recorded (synthetic until the "
        "network layer is wired in; see slipstream.pipeline.demo)")  # fmt: skip
    say("2/3 Spark report")
    outcome = generate_report(recording, output / "report", master=args.master,
                              options=ReportOptions(abuse_threshold=args.abuse_threshold))  # fmt: skip
    say(f"  report: {outcome.html}")
    say(f"  Spark {outcome.master}: start-up {outcome.startup_s:.1f} s, jobs {outcome.jobs_s:.1f} s")
    ok = True
    if not args.no_loop:
        say("3/3 live abuse-list loop")
        ok = abuse_loop(output, recording, master=args.master, threshold=args.abuse_threshold)
    say(f"done in {time.monotonic() - started:.0f} s; report: {outcome.html}")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
