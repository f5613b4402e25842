"""``slipstream pipeline demo`` (what ``make demo`` runs): record a real run, report on it with Spark,
then the live abuse-list loop.

1. A real run with recording on, through embedded drivers: typed messages over IPC and UDP captured
   (typed columns) into Parquet segments with the driver's counters, loss report and error log; then
   a :class:`~slipstream.network.Server` and clients over UDP and IPC exchanging typed messages, with
   a few clients refused on purpose, the server recording handshakes, connections and statistics
   (:mod:`slipstream.pipeline.connections`).
2. ``pipeline report`` over that recording: the tables and the HTML report, whose path is printed.
3. The loop: a streaming query keeps the abuse list up to date from the recording and publishes it
   on a slipstream stream; a running server's admission filter consults it, so once an intruder's
   refused handshakes put its host on the list, a regular client from that host is refused too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import msgspec

from ..client import BACK_PRESSURED, Context
from ..driver.config import DriverConfig
from ..telemetry import DriverSampler, Recorder, RecorderConfig, StreamCapture, msgspec_decoder
from ..wire.uri import udp_channel
from .connections import NetworkSummary, free_port_pair, record_connections, refuse_listed
from .options import ReportOptions
from .run import add_abuse_threshold, add_window, generate_report

IPC_STREAM = 1001
UDP_STREAM = 1002
ABUSE_STREAM = 1003
NETWORK_CLIENTS = 4
"""Clients of the recorded server (half over UDP, half over IPC)."""
DEMO_WINDOW_S = 2
"""The demo's report window: the run lasts seconds, so per-minute windows would draw single points."""
INTRUDERS = 3
"""Handshakes the recorded server refuses by tag over UDP, from 127.0.0.1 (and one more over IPC)."""


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
    network: NetworkSummary = field(default_factory=NetworkSummary)

    @property
    def connections(self) -> int:
        """Connections the recorded server accepted."""
        return len(self.network.sessions)

    @property
    def rejected(self) -> dict[str, int]:
        """Refused handshakes per host (``ipc`` for IPC)."""
        return {host: sum(reasons.values()) for host, reasons in self.network.rejected.items()}


def say(text: str) -> None:
    """Print a line of the tour at once (it runs for a while)."""
    print(text, flush=True)


def demo_message(i: int) -> Quote | Chat:
    """The i-th message of a demo stream: nine quotes, then a chat line."""
    if i % 10 == 9:
        return Chat(f"user{i % 7}", f"message {i}")
    return Quote("SLIP", 100 + i % 50 / 10, 100.1 + i % 50 / 10, i)


def _driver_dir(name: str) -> Path:
    return Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"slipstream-pdemo-{name}-{os.getpid()}"


def record_run(
    recording: Path, *, messages: int = 20_000, clients: int = NETWORK_CLIENTS, per_client: int = 500
) -> RunSummary:
    """A real IPC + UDP stream capture, then a recorded server with clients, into ``recording``."""
    summary = RunSummary()
    driver_dir = _driver_dir("streams")
    encoder = msgspec.msgpack.Encoder()
    config = RecorderConfig(flush_interval_s=0.2, segment_max_age_s=2.0)
    try:
        with (
            Recorder(recording, writer_id="demo", config=config) as recorder,
            Context(
                driver_dir, driver="embedded", driver_config=DriverConfig(directory=driver_dir, ipc_term_length=1 << 22)
            ) as context,
        ):
            decoder = msgspec_decoder(Quote, Chat)
            channels = {"aeron:ipc": IPC_STREAM, udp_channel(f"127.0.0.1:{free_port_pair()}"): UDP_STREAM}
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
                    payload = encoder.encode(demo_message(i))
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
            sampler.stop()
            for capture in captures:
                capture.close()
    finally:
        shutil.rmtree(driver_dir, ignore_errors=True)
    network_dir = _driver_dir("network")
    try:
        summary.network = record_connections(
            recording, network_dir, (Quote, Chat), demo_message, clients=clients, per_client=per_client,
            intruders=INTRUDERS, say=say,
        )  # fmt: skip
    finally:
        shutil.rmtree(network_dir, ignore_errors=True)
    return summary


def abuse_loop(output: Path, recording: Path, *, master: str | None, threshold: int, timeout_s: float = 120.0) -> bool:
    """Start the streaming abuse-list query, then a server that consults the list: an intruder's refused
    handshakes list its host, and a regular client from that host is refused. True when it was."""
    from ..telemetry.abuse import AbuseListSubscriber
    from .live import start_abuse_list_query
    from .session import spark_session

    spark = spark_session(master)
    # The tour prints what the loop does; Spark's streaming notices (AQE off for streams, a trigger
    # falling behind on a busy machine) are not news to the person watching it.
    spark.sparkContext.setLogLevel("ERROR")
    driver_dir = _driver_dir("loop")
    checkpoint = output / "checkpoints" / "abuse-list"
    shutil.rmtree(checkpoint, ignore_errors=True)
    # The server hands out session ids 1..65534 itself: keep the driver's own away from them.
    driver_config = DriverConfig(directory=driver_dir, reserved_session_id_low=-1, reserved_session_id_high=65535)
    try:
        with Context(driver_dir, driver="embedded", driver_config=driver_config) as context:
            listed = AbuseListSubscriber(
                context,
                "aeron:ipc",
                ABUSE_STREAM,
                on_listed=lambda e: say(
                    f"  abuse list: {e.address} listed ({e.rejections} refusals in the last 10 min: {e.reasons}; "
                    f"expires in {max(0, e.expires_ns - time.time_ns()) / 1e9:.0f} s without more)"
                ),
            ).start()
            query = start_abuse_list_query(
                spark, recording, channel="aeron:ipc", stream_id=ABUSE_STREAM, checkpoint=checkpoint,
                driver_dir=driver_dir, threshold=threshold, trigger_s=1.0,
            )  # fmt: skip
            try:
                say(f"  streaming query {query.id} publishes hosts with {threshold}+ refused handshakes")
                say(f"  each batch a numbered snapshot, the latest kept in {driver_dir}/retained for late servers")
                return refuse_listed(
                    driver_dir, recording, (Quote, Chat), listed.admit, attempts=threshold, say=say,
                    timeout_s=timeout_s,
                )  # fmt: skip
            finally:
                if query.isActive:
                    query.processAllAvailable()  # let the batch in flight finish: a clean stop, no aborted write
                query.stop()
                listed.close()
    finally:
        shutil.rmtree(driver_dir, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``pipeline demo`` options."""
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the recording, tables and report go (default: ./slipstream-demo-<time>)",
    )
    parser.add_argument("--messages", type=int, default=20_000, help="typed messages per stream (default: %(default)s)")
    parser.add_argument(
        "--clients", type=int, default=NETWORK_CLIENTS, help="clients of the recorded server (default: %(default)s)"
    )
    parser.add_argument(
        "--per-client", type=int, default=500, metavar="N", help="messages each client sends (default: %(default)s)"
    )
    parser.add_argument(
        "--master", default=None, metavar="URL", help="Spark master (default: spark-submit's, else local[*])"
    )
    add_abuse_threshold(parser)
    add_window(parser, DEMO_WINDOW_S)
    parser.add_argument("--no-loop", action="store_true", help="skip the live abuse-list loop")


def run(args: argparse.Namespace) -> int:
    """Run the three steps; exit code 0 when the loop refused the new offender.

    A Spark session already running in this process is reused (``getOrCreate``): its master wins.
    """
    output: Path = args.output or Path.cwd() / time.strftime("slipstream-demo-%Y%m%d-%H%M%S")
    recording = output / "recording"
    if recording.exists():
        shutil.rmtree(recording)
    started = time.monotonic()
    say(f"1/3 recording a real run into {recording}")
    summary = record_run(recording, messages=args.messages, clients=args.clients, per_client=args.per_client)
    rejected = sum(summary.rejected.values())
    replied = sum(cast(int, session["replied"]) for session in summary.network.sessions.values())
    say(f"  the server recorded {summary.connections} connections (it sent {replied} messages back)")
    say(f"  and {rejected} refused handshakes")
    say("2/3 Spark report")
    options = ReportOptions(abuse_threshold=args.abuse_threshold, window_s=args.window)
    outcome = generate_report(recording, output / "report", master=args.master, options=options)
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
