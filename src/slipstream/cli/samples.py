"""``slipstream publish`` and ``slipstream subscribe``: the basic publisher and subscriber samples.

Handy to try a channel by hand, and to talk to other Aeron implementations: they print what they
send and receive, one line per message, and stop by themselves (count or time limit).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..client import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    NOT_CONNECTED,
    Context,
    FragmentAssembler,
    Header,
    Image,
    result_name,
)
from ..client.errors import DriverError
from ..files.directory import default_directory


def register(commands: Any) -> None:
    """Add ``publish`` and ``subscribe`` to the command parsers."""
    pub: argparse.ArgumentParser = commands.add_parser(
        "publish",
        help="offer numbered messages on a channel",
        description="Offer --count numbered text messages on --channel/--stream, one line per message sent. "
        "Waits (up to --timeout) for a subscriber; attaches to the driver in --dir or starts an embedded one. "
        "Exit status: 0 all sent, 1 an offer failed or timed out, 2 bad arguments or no driver.",
    )
    _common(pub)
    pub.add_argument("--count", type=int, default=10, help="messages to send")
    pub.add_argument("--interval", type=float, default=0.0, help="seconds between messages")
    pub.add_argument("--message", default="Hello World! {n}", help="text; {n} is the message number")
    pub.add_argument("--linger", type=float, default=0.0, help="seconds to stay open after the last message")
    pub.set_defaults(run=run_publish)
    sub: argparse.ArgumentParser = commands.add_parser(
        "subscribe",
        help="print messages received on a channel",
        description="Print each message received on --channel/--stream, and images as publishers come and go, "
        "until --count messages arrived or --timeout passed. "
        "Exit status: 0 done, 1 timed out before --count messages, 2 bad arguments or no driver.",
    )
    _common(sub)
    sub.add_argument("--count", type=int, default=0, help="stop after this many messages (0: no limit)")
    sub.set_defaults(run=run_subscribe)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--channel", default="aeron:udp?endpoint=localhost:20121", help="channel URI")
    parser.add_argument("--stream", type=int, default=1001, help="stream id")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="driver directory: attach to its driver, or start an embedded one there "
        f"(default: {default_directory()})",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="give up after this many seconds")


def _check(args: argparse.Namespace, command: str, *, count_min: int) -> str | None:
    if args.count < count_min:
        return f"--count must be at least {count_min}: {args.count}"
    if not args.timeout > 0 or args.timeout == float("inf"):
        return f"--timeout must be a positive number of seconds: {args.timeout}"
    for name in ("interval", "linger"):
        value = getattr(args, name, 0.0)
        if not 0 <= value < float("inf"):
            return f"--{name} must be a non-negative number of seconds: {value}"
    return None


def run_publish(args: argparse.Namespace) -> int:
    """Offer the messages; say when it waits for a subscriber, and name the result of a failed offer."""
    problem = _check(args, "publish", count_min=0)
    if problem is not None:
        print(f"slipstream publish: {problem}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    try:
        with Context(args.dir) as ctx:
            pub = ctx.add_exclusive_publication(args.channel, args.stream)
            print(f"publishing on {args.channel} stream {args.stream} session {pub.session_id}", flush=True)
            waiting_said = False
            for n in range(args.count):
                message = args.message.format(n=n).encode()
                while (result := pub.offer(message)) < 0:
                    if result not in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION) or time.monotonic() > deadline:
                        late = " (timed out)" if result in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION) else ""
                        print(f"slipstream publish: offer failed: {result_name(result)}{late}", file=sys.stderr)
                        return 1
                    if result == NOT_CONNECTED and not waiting_said:
                        print(f"waiting for a subscriber (up to {args.timeout:g} s)", flush=True)
                        waiting_said = True
                    time.sleep(0.001 if result != ADMIN_ACTION else 0)
                print(f"sent {message.decode(errors='replace')}", flush=True)
                if args.interval:
                    time.sleep(args.interval)
            time.sleep(args.linger)
    except (DriverError, ValueError) as exc:
        print(f"slipstream publish: {exc}", file=sys.stderr)
        return 2
    return 0


def run_subscribe(args: argparse.Namespace) -> int:
    """Print what arrives until ``--count`` messages or ``--timeout``; a timeout short of the count says so."""
    problem = _check(args, "subscribe", count_min=0)
    if problem is not None:
        print(f"slipstream subscribe: {problem}", file=sys.stderr)
        return 2
    received = 0

    def on_message(payload: memoryview, header: Header) -> None:
        nonlocal received
        received += 1
        text = bytes(payload).decode(errors="replace")
        print(f"message from session {header.session_id}: {text}", flush=True)

    def on_image(image: Image) -> None:
        print(f"image available: session {image.session_id} from {image.source_identity}", flush=True)

    def on_gone(image: Image) -> None:
        print(f"image unavailable: session {image.session_id} at position {image.position}", flush=True)

    deadline = time.monotonic() + args.timeout
    try:
        with Context(args.dir) as ctx:
            sub = ctx.add_subscription(
                args.channel, args.stream, on_available_image=on_image, on_unavailable_image=on_gone
            )
            print(f"subscribed to {args.channel} stream {args.stream}", flush=True)
            handler = FragmentAssembler(on_message)
            while time.monotonic() < deadline and (args.count <= 0 or received < args.count):
                if sub.poll(handler, 10) == 0:
                    time.sleep(0.0005)
    except (DriverError, ValueError) as exc:
        print(f"slipstream subscribe: {exc}", file=sys.stderr)
        return 2
    if args.count <= 0 or received >= args.count:
        return 0
    print(
        f"slipstream subscribe: timed out after {args.timeout:g} s with {received} of {args.count} messages",
        file=sys.stderr,
    )
    return 1
