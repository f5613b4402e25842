"""``slipstream driver``: a standalone media driver that client processes attach to by directory."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from ..driver.config import MAX_DURATION_NS, DriverConfig
from ..driver.config_file import format_config, load_config
from ..driver.media_driver import MediaDriver
from ..errors import DriverError
from ..files.directory import default_directory
from ..wire.uri import ChannelUriError, parse_size


def register(commands: Any) -> None:
    """Add ``driver`` to the command parsers. Option defaults are None (a config file's value stands
    unless an option is given), so their help shows DriverConfig's defaults."""
    defaults = DriverConfig()
    parser: argparse.ArgumentParser = commands.add_parser(
        "driver",
        help="run a standalone media driver",
        description="Run a standalone media driver. Settings come from the defaults, then --config FILE, "
        "then the options below; --print-config shows the result.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings file: TOML if it ends in .toml, else Java-style properties (key=value); "
        "keys are the names --print-config shows, or Aeron's (aeron.dir, aeron.mtu.length, ...) "
        "(default: none, every setting at its default)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print every setting's effective value (as TOML) and exit"
    )
    parser.add_argument("--dir", type=Path, default=None, help=f"driver directory (default: {default_directory()})")
    parser.add_argument(
        "--ipc-term-length",
        default=None,
        help=f"IPC term length, e.g. 64m (default: {defaults.ipc_term_length >> 20}m)",
    )
    parser.add_argument(
        "--client-liveness-timeout",
        type=float,
        default=None,
        help=f"seconds before a silent client is dropped (default: {defaults.client_liveness_timeout_ns / 1e9:g})",
    )
    parser.add_argument(
        "--idle", default=None, help=f"idle strategy: spin, yield, backoff or sleep (default: {defaults.idle_strategy})"
    )
    parser.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="DIR",
        help="record the driver's counters, loss report and error log into DIR (Parquet segments); "
        "the config file's record_directory (default: no recording)",
    )
    parser.add_argument(
        "--record-interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds between samples; the config file's record_interval "
        f"(default: {defaults.record_interval_ns / 1e9:g})",
    )
    parser.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> DriverConfig:
    """Build and validate a driver configuration: defaults, then the file, then the options (which win);
    errors name the option or the file's key."""
    config = load_config(args.config) if args.config is not None else DriverConfig()
    if args.dir is not None:
        config.directory = args.dir
    if args.ipc_term_length is not None:
        try:
            config.ipc_term_length = parse_size(args.ipc_term_length, "ipc-term-length")
        except ChannelUriError as exc:
            raise ValueError(f"--ipc-term-length: {exc}") from None
    if args.client_liveness_timeout is not None:
        config.client_liveness_timeout_ns = _seconds_ns("--client-liveness-timeout", args.client_liveness_timeout)
    if args.idle is not None:
        config.idle_strategy = args.idle
    if args.record is not None:
        config.record_directory = args.record
    if args.record_interval is not None:
        config.record_interval_ns = _seconds_ns("--record-interval", args.record_interval)
    # What None stands for here, so --print-config shows what this driver will do.
    config.dir_delete_on_shutdown = config.deletes_directory(embedded=False)
    config.validate()
    return config


def _seconds_ns(option: str, seconds: float) -> int:
    """An option given in seconds, as the nanoseconds DriverConfig keeps; out of range names the option."""
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_DURATION_NS / 1e9:
        raise ValueError(f"{option} must be a number of seconds in (0, {MAX_DURATION_NS // 10**9}]: {seconds}")
    return int(seconds * 1e9)


def run(args: argparse.Namespace) -> int:
    """Run a standalone driver until SIGINT/SIGTERM; bad settings exit 2 with one line."""
    try:
        config = config_from_args(args)
        if args.print_config:
            print(format_config(config))
            return 0
        driver = MediaDriver(config).start()
    except (ValueError, DriverError) as exc:
        print(f"slipstream driver: {exc}", file=sys.stderr)
        return 2

    def stop(signum: int, frame: FrameType | None) -> None:
        driver.stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"media driver running in {driver.directory} (Ctrl-C to stop)", flush=True)
    if config.record_directory is None:
        driver.run()
    else:
        from ..telemetry import DriverSampler, Recorder, TelemetryError

        try:
            recorder = Recorder(config.record_directory, writer_id=f"driver-{os.getpid()}")
            sampler = DriverSampler(recorder, driver.directory, interval_s=config.record_interval_ns / 1e9).start()
        except (TelemetryError, ValueError, ImportError) as exc:
            driver.stop()
            print(f"slipstream driver: recording into {config.record_directory}: {exc}", file=sys.stderr)
            return 2
        print(f"recording counters, loss report and errors into {recorder.directory}", flush=True)
        try:
            driver.run()
        finally:
            sampler.stop()
            recorder.close()
    return 0
