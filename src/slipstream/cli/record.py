"""``slipstream record``: capture any stream (and the driver's counters) into a recording directory.

An Aeron-Archive-like capture: one more subscriber on ``--channel``/``--stream`` whose messages
become rows of the ``captured`` kind, written as Parquet segments under ``--output``. It runs until
Ctrl-C / SIGTERM or ``--duration`` and finalizes its segments on the way out; a SIGKILL loses at most
one flush interval, and the next recorder (or ``pipeline report``) finalizes what was flushed.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from ..client import Context
from ..errors import DriverError
from ..files.directory import default_directory
from ..telemetry import (
    Decoder,
    DriverSampler,
    Recorder,
    RecorderConfig,
    StreamCapture,
    TelemetryError,
    default_writer_id,
)


def register(commands: Any) -> None:
    """Add ``record`` to the command line."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "record",
        help="capture a stream into Parquet segments",
        description="Capture every message of a stream (and, with --counters, the driver's counters, loss "
        "report and error log) into a recording directory that `slipstream pipeline report` reads.",
    )
    parser.add_argument("--channel", required=True, help="channel URI, e.g. aeron:ipc or aeron:udp?endpoint=...")
    parser.add_argument("--stream", type=int, required=True, metavar="ID", help="stream id")
    parser.add_argument("--output", type=Path, required=True, metavar="DIR", help="recording directory")
    parser.add_argument("--dir", type=Path, default=None, help=f"driver directory (default {default_directory()})")
    parser.add_argument("--duration", type=float, default=None, metavar="S", help="stop after this many seconds")
    parser.add_argument("--flush-interval", type=float, default=1.0, metavar="S", help="seconds (default 1)")
    parser.add_argument("--segment-age", type=float, default=60.0, metavar="S", help="roll segments this often")
    parser.add_argument("--counters", action="store_true", help="also sample the driver's files every second")
    parser.add_argument("--writer-id", default=None, help="writer directory name (default capture-<host>-<pid>)")
    parser.add_argument(
        "--decoder",
        default=None,
        metavar="MODULE:NAME",
        help="a callable bytes -> message|None that types payloads (e.g. made by telemetry.msgspec_decoder)",
    )
    parser.set_defaults(run=run)


def _load_decoder(spec: str) -> Decoder:
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"--decoder: expected MODULE:NAME, got {spec!r}")
    decoder: Decoder = getattr(importlib.import_module(module_name), name)
    return decoder


def run(args: argparse.Namespace) -> int:
    """Capture until a signal or ``--duration``; exit code 2 on bad options."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        decoder = _load_decoder(args.decoder) if args.decoder else None
        config = RecorderConfig(flush_interval_s=args.flush_interval, segment_max_age_s=args.segment_age)
        recorder = Recorder(args.output, writer_id=args.writer_id or default_writer_id("capture"), config=config)
    except (ValueError, ImportError, AttributeError, TelemetryError) as exc:
        print(f"slipstream record: {exc}", file=sys.stderr)
        return 2
    try:
        with Context(args.dir) as context:
            capture = StreamCapture(context, args.channel, args.stream, recorder, decoder=decoder)
            sampler = DriverSampler(recorder, context.directory).start() if args.counters else None
            print(
                f"recording {args.channel} stream {args.stream} into {recorder.writer_dir} (Ctrl-C to stop)",
                flush=True,
            )
            if args.duration is not None:
                threading.Timer(args.duration, stop.set).start()
            started = time.monotonic()
            capture.run(stop)
            if sampler is not None:
                sampler.stop()
            capture.close()
    except DriverError as exc:
        print(f"slipstream record: {exc}", file=sys.stderr)
        recorder.close()
        return 2
    recorder.close()
    elapsed = time.monotonic() - started
    print(
        f"recorded {capture.messages} messages ({capture.bytes} bytes) in {elapsed:.1f} s; "
        f"dropped {capture.dropped}; {recorder.segments_finalized} segments in {recorder.writer_dir}; "
        f"cpu {time.process_time():.1f} s",
        flush=True,
    )
    return 0
