"""``slipstream echo server|client --take 1|2``: the echo programs of "Aeron For The Working Programmer".

The guide's positional arguments become options with the guide's names (``--directory``,
``--local-address``, ``--local-initial-data-port`` ...), some with a shorter alias; ports default to
the guide's examples. The directory is required, as in the guide: a take 2 server and client sharing
one driver would both publish the duologue's session id on the echo stream, which the driver refuses.
Output is the guide's: a log line per step and per message, on stderr.
Exit status: 0 done, 1 the echo failed (rejected, timed out, server gone), 2 bad arguments or no driver.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from ..client import DriverError
from ..echo import messages, take1, take2
from ..echo.common import EchoError

_TAKE1_SERVER = ("local_port",)
_TAKE2_SERVER = (
    "local_initial_data_port",
    "local_initial_control_port",
    "local_clients_base_port",
    "client_count",
    "max_connections_per_address",
    "duologue_expiry",
    "reserved_session_id_low",
    "reserved_session_id_high",
)
_TAKE1_CLIENT = ("local_address", "local_port", "remote_port")
_TAKE2_CLIENT = ("remote_data_port", "remote_control_port", "reserved_session_id_low", "reserved_session_id_high")
_DEFAULTS: dict[str, dict[str, Any]] = {
    "server1": {"local_port": 9000},
    "server2": {
        "local_initial_data_port": 9000,
        "local_initial_control_port": 9001,
        "local_clients_base_port": 9010,
        "client_count": 4,
        "max_connections_per_address": 3,
        "duologue_expiry": 10.0,
        "reserved_session_id_low": messages.RESERVED_SESSION_ID_LOW,
        "reserved_session_id_high": messages.RESERVED_SESSION_ID_HIGH,
    },
    "client1": {"local_port": 8000, "remote_port": 9000},
    "client2": {
        "remote_data_port": 9000,
        "remote_control_port": 9001,
        "reserved_session_id_low": messages.RESERVED_SESSION_ID_LOW,
        "reserved_session_id_high": messages.RESERVED_SESSION_ID_HIGH,
    },
}


def register(commands: Any) -> None:
    """Add ``echo server`` and ``echo client`` to the command parsers."""
    echo: argparse.ArgumentParser = commands.add_parser(
        "echo",
        help="the guide's echo server and client (take 1: naive, take 2: through NAT)",
        description="The echo protocol of the Aeron guide, as its server and its client. Take 1 is the naive "
        "version: the server publishes back to a port the client announces, which fails behind NAT. Take 2 "
        "works through NAT: clients meet the server on an all-clients channel (dynamic MDC), then each moves "
        "to a duologue of its own, with limits and expiry.",
    )
    roles = echo.add_subparsers(dest="role", required=True, metavar="ROLE", help="server or client")

    server: argparse.ArgumentParser = roles.add_parser(
        "server",
        help="run an echo server",
        description="Run an echo server: every message a client sends comes back to it. Options marked take 1 "
        "or take 2 apply to that version only.",
    )
    _common(server)
    server.add_argument("--local-address", required=True, help="address to bind, e.g. 5.6.7.8")
    server.add_argument("--local-port", type=int, help="take 1: the port clients send to (default: 9000)")
    server.add_argument("--local-initial-data-port", "--data-port", type=int,
                        help="take 2: all-clients data port (default: 9000)")
    server.add_argument("--local-initial-control-port", "--control-port", type=int,
                        help="take 2: all-clients MDC control port (default: 9001)")
    server.add_argument("--local-clients-base-port", "--base-port", type=int,
                        help="take 2: duologue ports are [base, base + 2 * client-count) (default: 9010)")
    server.add_argument("--client-count", "--max-clients", type=int, help="take 2: most duologues at once (default: 4)")
    server.add_argument("--max-connections-per-address", "--per-ip-limit", type=int,
                        help="take 2: most duologues one IP address may own (default: 3)")
    server.add_argument("--duologue-expiry", "--expiry", type=float,
                        help="take 2: seconds before a duologue nobody is connected to is deleted (default: 10)")
    _session_range(server)
    server.add_argument("--duration", type=float, default=None,
                        help="stop after this many seconds (default: run until interrupted)")
    server.set_defaults(run=run_server)

    client: argparse.ArgumentParser = roles.add_parser(
        "client",
        help="run an echo client",
        description="Run an echo client: send random numbers to an echo server, one per interval, and log "
        "each echo. "
        "Options marked take 1 or take 2 apply to that version only.",
    )
    _common(client)
    client.add_argument("--local-address", help="take 1: address to receive echoes on (no default: take 1 needs it)")
    client.add_argument("--local-port", type=int, help="take 1: port to receive echoes on (default: 8000)")
    client.add_argument("--remote-address", required=True, help="the server's address")
    client.add_argument("--remote-port", type=int, help="take 1: the server's port (default: 9000)")
    client.add_argument("--remote-data-port", "--data-port", type=int,
                        help="take 2: the server's all-clients data port (default: 9000)")
    client.add_argument("--remote-control-port", "--control-port", type=int,
                        help="take 2: the server's all-clients control port (default: 9001)")
    _session_range(client)
    client.add_argument("--count", type=int, default=0,
                        help="stop after this many messages and their echoes (0: run until interrupted)")
    client.add_argument("--interval", type=float, default=1.0, help="seconds between messages")
    client.add_argument("--timeout", type=float, default=10.0, help="seconds any one wait may take")
    client.set_defaults(run=run_client)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--take", type=int, choices=(1, 2), required=True, help="which version of the guide's echo")
    parser.add_argument("--directory", "--dir", type=Path, required=True,
                        help="media driver directory: attach to its driver, or start one there. Give the "
                             "server and each client their own, as the guide does")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="debug",
                        help="echo log level; debug is the guide's output")


def _session_range(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reserved-session-id-low", type=int,
                        help="take 2: low end of the session ids the driver leaves to duologues (default: 1)")
    parser.add_argument("--reserved-session-id-high", type=int,
                        help="take 2: high end of that range (default: 2147483647)")


def _settle(args: argparse.Namespace, role: str) -> str | None:
    """Reject the other take's options, fill in this take's defaults; an error message or None."""
    mine, other = {
        "server": (_TAKE1_SERVER, _TAKE2_SERVER),
        "client": (_TAKE1_CLIENT, _TAKE2_CLIENT),
    }[role]
    if args.take == 2:
        mine, other = other, mine
    stray = [name for name in other if name not in mine and getattr(args, name) is not None]
    if stray:
        flags = ", ".join("--" + name.replace("_", "-") for name in stray)
        return f"{flags}: not an option of take {args.take}"
    for name, value in _DEFAULTS[f"{role}{args.take}"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if role == "client" and args.take == 1 and args.local_address is None:
        return "take 1 needs --local-address (where the server sends the echoes)"
    return None


def _configure_logging(level: str) -> None:
    """The guide's output: every step and message logged, with time and thread."""
    logger = logging.getLogger("slipstream.echo")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s"))
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def _stop_on_signals(stop: threading.Event) -> list[int]:
    """Set ``stop`` on SIGINT/SIGTERM; the returned list receives the signal numbers, so the command can
    tell a stop it was asked for from a failure."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return received


def run_server(args: argparse.Namespace) -> int:
    """Run an echo server until SIGINT/SIGTERM or ``--duration``."""
    problem = _settle(args, "server")
    if problem is not None:
        print(f"slipstream echo server: {problem}", file=sys.stderr)
        return 2
    _configure_logging(args.log_level)
    stop = threading.Event()
    _stop_on_signals(stop)
    if args.duration is not None:
        timer = threading.Timer(args.duration, stop.set)
        timer.daemon = True
        timer.start()
    try:
        if args.take == 1:
            with take1.EchoServer(args.directory, args.local_address, args.local_port) as server1:
                server1.run(stop)
        else:
            configuration = take2.EchoServerConfiguration(
                directory=args.directory,
                local_address=args.local_address,
                local_initial_port=args.local_initial_data_port,
                local_initial_control_port=args.local_initial_control_port,
                local_clients_base_port=args.local_clients_base_port,
                client_maximum_count=args.client_count,
                maximum_connections_per_address=args.max_connections_per_address,
                duologue_expiry_s=args.duologue_expiry,
                reserved_session_id_low=args.reserved_session_id_low,
                reserved_session_id_high=args.reserved_session_id_high,
            )
            with take2.EchoServer(configuration) as server2:
                server2.run(stop)
    except (DriverError, ValueError) as exc:
        print(f"slipstream echo server: {exc}", file=sys.stderr)
        return 2
    return 0


def run_client(args: argparse.Namespace) -> int:
    """Run an echo client; a signal stops it with a message and status 128 + signal."""
    problem = _settle(args, "client")
    if problem is not None:
        print(f"slipstream echo client: {problem}", file=sys.stderr)
        return 2
    _configure_logging(args.log_level)
    stop = threading.Event()
    signals = _stop_on_signals(stop)
    log = logging.getLogger(f"slipstream.echo.take{args.take}")
    try:
        if args.take == 1:
            with take1.EchoClient(
                args.directory,
                args.local_address,
                args.local_port,
                args.remote_address,
                args.remote_port,
                count=args.count,
                interval_s=args.interval,
                timeout_s=args.timeout,
            ) as client1:
                client1.run(stop)
        else:
            with take2.EchoClient(
                args.directory,
                args.remote_address,
                args.remote_data_port,
                args.remote_control_port,
                count=args.count,
                interval_s=args.interval,
                timeout_s=args.timeout,
                reserved_session_id_low=args.reserved_session_id_low,
                reserved_session_id_high=args.reserved_session_id_high,
            ) as client2:
                client2.run(stop)
        if signals:
            print(f"slipstream echo client: stopped by {signal.Signals(signals[0]).name}", file=sys.stderr)
            return 128 + signals[0]
    except EchoError as exc:
        if signals:  # the waits end early on a signal: that is the reason, not a timeout
            name = signal.Signals(signals[0]).name
            print(f"slipstream echo client: stopped by {name} before the echo finished", file=sys.stderr)
            return 128 + signals[0]
        log.error("%s", exc)
        return 1
    except (DriverError, ValueError) as exc:
        print(f"slipstream echo client: {exc}", file=sys.stderr)
        return 2
    return 0
