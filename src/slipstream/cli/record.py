"""``slipstream record``: capture any stream (and the driver's counters) into a recording directory.

An Aeron-Archive-like capture in two processes. This one is the hot side: one more subscriber on
``--channel``/``--stream`` that writes the term bytes to raw files (:class:`RawCapture`: no pyarrow,
no per-message work, sleeps sized to the publisher's window). A child process (this command again,
with ``--convert-raw``) runs at idle priority (``SCHED_IDLE``): it converts each rotated raw file into
rows of the ``captured`` kind (and ``typed.<Type>`` with ``--decoder``), written as Parquet segments
under ``--output`` by a :class:`Recorder`, and deletes the raw file once its rows are durable. On a busy
machine the conversion waits for idle CPU instead of taking it from the stream; when the raw backlog
passes half of its bound the child returns to normal priority, and at the bound the capture stops
reading (the publisher is slowed, nothing is lost).

It runs until Ctrl-C / SIGTERM or ``--duration``; then the child converts what is left, finalizes the
segments and reports. A SIGKILL of this process loses nothing read (the child converts the raw files
when its pipe closes); a SIGKILL of both leaves raw files that the next recorder on the same root (or
``pipeline report``) converts, and at most the last flush interval is lost on a power cut.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from ..client import Context
from ..errors import DriverError
from ..files.directory import default_directory
from ..telemetry.rawcapture import RAW_DIR, RawCapture, pending_bytes
from ..telemetry.segments import check_name, check_writer_id, journal_dir

_MAX_PENDING_BYTES = 1 << 30
"""Raw bytes waiting for conversion at which the capture stops reading (flow control; disk, not RAM)."""


def register(commands: Any) -> None:
    """Add ``record`` to the command line."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "record",
        help="capture a stream into Parquet segments",
        description="Capture every message of a stream (and, with --counters, the driver's counters, loss "
        "report and error log) into a recording directory that slipstream pipeline report reads.",
    )
    parser.add_argument("--channel", required=True, help="channel URI, e.g. aeron:ipc or aeron:udp?endpoint=...")
    parser.add_argument("--stream", type=int, required=True, metavar="ID", help="stream id")
    parser.add_argument("--output", type=Path, required=True, metavar="DIR", help="recording directory")
    parser.add_argument("--dir", type=Path, default=None, help=f"driver directory (default: {default_directory()})")
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="stop after this many seconds (default: run until interrupted)",
    )
    parser.add_argument(
        "--flush-interval", type=float, default=1.0, metavar="S", help="seconds between flushes of what was captured"
    )
    parser.add_argument(
        "--segment-age",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds after which a segment is finished and a new one begun",
    )
    parser.add_argument("--counters", action="store_true", help="also sample the driver's files every second")
    parser.add_argument(
        "--direct-io",
        action="store_true",
        help="write the raw capture with O_DIRECT (no page cache; each write waits for the disk)",
    )
    parser.add_argument(
        "--writer-id", default=None, help="writer id, in the segment file names (default: capture-<host>-<pid>)"
    )
    parser.add_argument(
        "--name",
        default=None,
        help="stable name the segments are partitioned by (host=NAME; default: the host name)",
    )
    parser.add_argument(
        "--decoder",
        default=None,
        metavar="MODULE:NAME",
        help="a callable bytes -> message|None that types payloads into typed.<Type> rows (e.g. made by "
        "telemetry.msgspec_decoder; default: none, captured rows only)",
    )
    parser.add_argument("--convert-raw", type=Path, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Capture until a signal or ``--duration``; exit code 2 on bad options."""
    if args.convert_raw is not None:
        return _run_converter(args)
    return _run_capture(args)


def _child_argv(args: argparse.Namespace, writer_id: str, raw_dir: Path) -> list[str]:
    argv = [sys.executable, "-m", "slipstream", "record", "--channel", args.channel, "--stream", str(args.stream),
            "--output", str(args.output), "--flush-interval", str(args.flush_interval), "--segment-age",
            str(args.segment_age), "--writer-id", writer_id, "--convert-raw", str(raw_dir)]  # fmt: skip
    if args.name:
        argv += ["--name", args.name]
    if args.dir is not None:
        argv += ["--dir", str(args.dir)]
    if args.counters:
        argv.append("--counters")
    if args.decoder:
        argv += ["--decoder", args.decoder]
    return argv


def _run_capture(args: argparse.Namespace) -> int:
    from ..telemetry.recorder import default_writer_id

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        writer_id = check_writer_id(args.writer_id) if args.writer_id else default_writer_id("capture")
        if args.name:
            check_name(args.name)
    except ValueError as exc:
        print(f"slipstream record: {exc}", file=sys.stderr)
        return 2
    raw_dir = journal_dir(args.output, writer_id) / RAW_DIR / "capture-0"
    started = time.monotonic()
    child = subprocess.Popen(_child_argv(args, writer_id, raw_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    if child.stdout.readline().strip() != b"ready":
        return child.wait() or 2
    capture: RawCapture | None = None
    try:
        with Context(args.dir) as context:
            stdin = child.stdin

            def on_rotate(seq: int) -> None:
                try:
                    stdin.write(b"r")
                    stdin.flush()
                except OSError:
                    stop.set()  # the converter is gone: stop rather than fill the disk unseen

            capture = RawCapture(
                context, args.channel, args.stream, raw_dir, max_pending_bytes=_MAX_PENDING_BYTES,
                flush_interval_s=args.flush_interval, direct_io=args.direct_io, decoder_spec=args.decoder,
                on_rotate=on_rotate,
            )  # fmt: skip
            print(
                f"recording {args.channel} stream {args.stream} into {args.output} as {writer_id} (Ctrl-C to stop)",
                flush=True,
            )
            if args.duration is not None:
                threading.Timer(args.duration, stop.set).start()
            polling_from = time.process_time()
            capture.run(stop)
            polling_cpu = time.process_time() - polling_from
            capture.close()
    except DriverError as exc:
        print(f"slipstream record: {exc}", file=sys.stderr)
        if capture is not None:
            capture.close()
        child.stdin.close()
        child.wait()
        return 2
    capture_cpu = time.process_time()
    child.stdin.close()  # the converter converts what is left, finalizes and reports
    line = child.stdout.readline()
    code = child.wait()
    if code != 0 or not line:
        print(f"slipstream record: the converter failed (exit {code}); raw files stay in {raw_dir}", file=sys.stderr)
        return 1
    summary = json.loads(line)
    elapsed = time.monotonic() - started
    children = os.times()
    conversion_cpu = children.children_user + children.children_system
    print(
        f"recorded {summary['messages']} messages ({summary['bytes']} bytes) in {elapsed:.1f} s; "
        f"dropped {summary['dropped']}; {summary['segments']} segments in {args.output}; "
        f"cpu {capture_cpu + conversion_cpu:.2f} s (capture {capture_cpu:.2f} s of which polling {polling_cpu:.3f} s, "
        f"conversion {conversion_cpu:.2f} s at idle priority)",
        flush=True,
    )
    return 0


def _lower_priority(idle: bool) -> None:
    """Every thread of this process to ``SCHED_IDLE`` (runs only on CPU nobody else wants), or back to
    normal. Each thread, because Linux schedules threads; a process is never left half-lowered, so no
    thread waits for the GIL held by a starved one. Unprivileged processes may do both."""
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
        except (OSError, AttributeError):
            if idle:
                os.nice(19)
            return


def _run_converter(args: argparse.Namespace) -> int:
    """The child: idle priority, a Recorder, a RawConverter on its flush hook, until stdin closes."""
    from ..telemetry import DriverSampler, Recorder, RecorderConfig, TelemetryError
    from ..telemetry.capture import RawConverter, load_decoder

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the capture decides when to stop: it closes our stdin
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _lower_priority(True)
    try:
        decoder = load_decoder(args.decoder) if args.decoder else None
        config = RecorderConfig(flush_interval_s=args.flush_interval, segment_max_age_s=args.segment_age)
        recorder = Recorder(args.output, writer_id=args.writer_id, config=config, name=args.name)
    except (ValueError, ImportError, AttributeError, TelemetryError) as exc:
        print(f"slipstream record: {exc}", file=sys.stderr)
        return 2
    converter = RawConverter(args.convert_raw, recorder, decoder=decoder)
    recorder.add_flush_hook(converter.flush_hook, after=converter.durable)
    sampler = DriverSampler(recorder, args.dir or default_directory()).start() if args.counters else None
    print("ready", flush=True)
    stdin = sys.stdin.fileno()
    idle = True
    while True:
        readable, _, _ = select.select([stdin], [], [], args.flush_interval)
        if readable:
            if not os.read(stdin, 4096):
                break  # the capture closed (or died): convert the rest, raw files still being written too
            recorder.request_flush()
        backlog = pending_bytes(args.convert_raw)
        if idle and backlog > _MAX_PENDING_BYTES // 2:
            idle = False  # falling behind a busy stream: take a fair share of CPU before the capture stalls
        elif not idle and backlog < _MAX_PENDING_BYTES // 4:
            idle = True
        else:
            continue
        _lower_priority(idle)
    if sampler is not None:
        sampler.stop()
    converter.convert(final=True)  # the file the capture was writing too, if it died before rotating it
    recorder.close()  # its last flush writes the rows; the converter's after-hook then deletes the raw files
    summary = {"messages": converter.messages, "bytes": converter.bytes, "dropped": converter.dropped,
               "segments": recorder.segments_finalized}  # fmt: skip
    print(json.dumps(summary), flush=True)
    return 0
