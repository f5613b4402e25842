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

from ..client import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, Context, FragmentAssembler, Header, Image
from ..client.errors import DriverError


def register(commands: Any) -> None:
    pub: argparse.ArgumentParser = commands.add_parser("publish", help="offer numbered messages on a channel")
    _common(pub)
    pub.add_argument("--count", type=int, default=10, help="messages to send (default 10)")
    pub.add_argument("--interval", type=float, default=0.0, help="seconds between messages (default 0)")
    pub.add_argument("--message", default="Hello World! {n}", help="text; {n} is the message number")
    pub.add_argument("--linger", type=float, default=0.0, help="seconds to stay open after the last message")
    pub.set_defaults(run=run_publish)
    sub: argparse.ArgumentParser = commands.add_parser("subscribe", help="print messages received on a channel")
    _common(sub)
    sub.add_argument("--count", type=int, default=0, help="stop after this many messages (default: no limit)")
    sub.set_defaults(run=run_subscribe)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--channel", default="aeron:udp?endpoint=localhost:20121", help="channel URI")
    parser.add_argument("--stream", type=int, default=1001, help="stream id (default 1001)")
    parser.add_argument("--dir", type=Path, default=None, help="driver directory")
    parser.add_argument("--timeout", type=float, default=30.0, help="give up after this many seconds")


def run_publish(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    try:
        with Context(args.dir) as ctx:
            pub = ctx.add_exclusive_publication(args.channel, args.stream)
            print(f"publishing on {args.channel} stream {args.stream} session {pub.session_id}", flush=True)
            for n in range(args.count):
                message = args.message.format(n=n).encode()
                while (result := pub.offer(message)) < 0:
                    if result not in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION) or time.monotonic() > deadline:
                        print(f"offer failed: {result}", file=sys.stderr)
                        return 1
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
    return 0 if args.count <= 0 or received >= args.count else 1
