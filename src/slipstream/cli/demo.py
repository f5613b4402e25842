"""``slipstream demo``: two processes exchanging messages over shared memory, with what was measured.

The parent starts an embedded media driver, publishes a burst of small messages plus some larger
ones that are fragmented and reassembled, then measures round trips. A child process (the same
command with ``--role peer``) subscribes, checks every byte, reports, and answers pings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from ..client import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    Context,
    ExclusivePublication,
    FragmentAssembler,
    Header,
    Subscription,
    result_name,
)

DATA_STREAM = 1001
REPLY_STREAM = 1002
CHANNEL = "aeron:ipc"
TIMEOUT_S = 60.0


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser("demo", help="two-process shared-memory demo")
    parser.add_argument("--messages", type=int, default=200_000, help="small messages to send (default 200000)")
    parser.add_argument("--size", type=int, default=32, help="bytes per small message (default 32)")
    parser.add_argument("--large", type=int, default=100, help="10 KB messages to send (fragmented)")
    parser.add_argument("--pings", type=int, default=10_000, help="round trips to measure (default 10000)")
    parser.add_argument("--dir", type=Path, default=None, help="driver directory (default: a fresh one)")
    parser.add_argument("--role", choices=["main", "peer"], default="main", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.messages < 1 or args.size < 9 or args.large < 0 or args.pings < 1:
        print("slipstream demo: need --messages >= 1, --size >= 9, --large >= 0, --pings >= 1", file=sys.stderr)
        return 2
    if args.role == "peer":
        return _peer(args.dir)
    own_dir = args.dir is None
    directory = args.dir or Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"slipstream-demo-{os.getpid()}"
    try:
        return _main(args, directory)
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _offer(publication: ExclusivePublication, message: bytes | bytearray | memoryview) -> int:
    """Offer until accepted; returns how often it was back-pressured."""
    back_pressured = 0
    deadline = time.monotonic() + TIMEOUT_S
    while (result := publication.offer(message)) < 0:
        if result == BACK_PRESSURED:
            back_pressured += 1
        elif result != ADMIN_ACTION:
            raise RuntimeError(f"offer failed: {result_name(result)}")
        if back_pressured & 0xFFF == 0xFFF and time.monotonic() > deadline:
            raise TimeoutError("publisher stayed back-pressured")
    return back_pressured


def _receive_one(subscription: Subscription) -> bytes:
    got: list[bytes] = []
    handler = FragmentAssembler(lambda payload, header: got.append(bytes(payload)))
    deadline = time.monotonic() + TIMEOUT_S
    while not got:
        if subscription.poll(handler, 1) == 0 and time.monotonic() > deadline:
            raise TimeoutError("no reply from the peer")
    return got[0]


def _main(args: argparse.Namespace, directory: Path) -> int:
    print("slipstream demo: two processes, one embedded media driver, shared memory (aeron:ipc)")
    with Context(directory) as ctx:
        print(f"  driver directory {directory} (embedded driver: {ctx.is_embedded})")
        data = ctx.add_exclusive_publication(CHANNEL, DATA_STREAM)
        replies = ctx.add_subscription(CHANNEL, REPLY_STREAM)
        peer = subprocess.Popen([sys.executable, "-m", "slipstream", "demo", "--role", "peer", "--dir", str(directory)])
        try:
            _wait(lambda: data.is_connected and replies.is_connected, "the peer process to subscribe")
            return _exchange(args, data, replies)
        finally:
            try:
                peer.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.wait()


def _exchange(args: argparse.Namespace, data: ExclusivePublication, replies: Subscription) -> int:
    filler = bytes(range(256)) * (args.size // 256 + 1)
    small = bytearray(b"D" + filler[: args.size - 1])
    large = bytearray(b"D" + (filler * 40)[:9_999])
    crc = 0
    back_pressured = 0
    started = time.perf_counter()
    for i in range(args.messages):
        small[1:9] = i.to_bytes(8, "little")
        back_pressured += _offer(data, small)
        crc = zlib.crc32(small, crc)
    for i in range(args.large):
        large[1:9] = i.to_bytes(8, "little")
        back_pressured += _offer(data, large)
        crc = zlib.crc32(large, crc)
    _offer(data, b"E" + json.dumps({"count": args.messages + args.large, "crc": crc}).encode())
    report = json.loads(_receive_one(replies)[1:])
    elapsed = report["elapsed_s"]
    total = args.messages + args.large
    total_bytes = args.messages * args.size + args.large * len(large)
    print(
        f"  sent     {args.messages:,} messages of {args.size} B and {args.large:,} of {len(large):,} B (fragmented) "
        f"in {time.perf_counter() - started:.2f} s; back-pressured {back_pressured:,} times"
    )
    verdict = "ok" if report["crc"] == crc and report["received"] == total else "MISMATCH"
    print(
        f"  received {report['received']:,} messages in {elapsed:.2f} s: {total / elapsed:,.0f} msgs/s, "
        f"{total_bytes / elapsed / 1e6:.1f} MB/s; checksum {verdict} (crc32 {crc:#010x})"
    )
    rtts = _ping(data, replies, args.pings)
    print(
        f"  ping     {len(rtts):,} round trips (busy-spin): p50 {_pct(rtts, 50):.1f} us, p99 {_pct(rtts, 99):.1f} us, "
        f"p99.9 {_pct(rtts, 99.9):.1f} us"
    )
    _offer(data, b"Q")
    return 0 if verdict == "ok" else 1


def _ping(data: ExclusivePublication, replies: Subscription, count: int) -> list[float]:
    rtts: list[float] = []
    got = [False]

    def on_pong(payload: memoryview, header: Header) -> None:
        got[0] = True

    message = bytearray(b"P" + bytes(31))
    for i in range(count + 1000):
        got[0] = False
        sent = time.perf_counter_ns()
        _offer(data, message)
        deadline = time.monotonic() + TIMEOUT_S
        while not got[0]:
            if replies.poll(on_pong, 1) == 0 and time.monotonic() > deadline:
                raise TimeoutError("pong lost")
        if i >= 1000:  # the first thousand warm up
            rtts.append((time.perf_counter_ns() - sent) / 1000)
    return rtts


def _pct(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def _peer(directory: Path | None) -> int:
    """The child: count and checksum data, report, then answer pings until told to quit."""
    with Context(directory, driver="external") as ctx:
        data = ctx.add_subscription(CHANNEL, DATA_STREAM)
        replies = ctx.add_exclusive_publication(CHANNEL, REPLY_STREAM)
        state: dict[str, Any] = {"received": 0, "crc": 0, "first": None, "quit": False}

        def on_message(payload: memoryview, header: Header) -> None:
            kind = payload[0]
            if kind == 0x44:  # D
                if state["first"] is None:
                    state["first"] = time.perf_counter()
                state["received"] += 1
                state["crc"] = zlib.crc32(payload, state["crc"])
            elif kind == 0x45:  # E
                elapsed = time.perf_counter() - (state["first"] or time.perf_counter())
                report = {"received": state["received"], "crc": state["crc"], "elapsed_s": max(elapsed, 1e-9)}
                _offer(replies, b"R" + json.dumps(report).encode())
            elif kind == 0x50:  # P
                _offer(replies, payload)
            elif kind == 0x51:  # Q
                state["quit"] = True

        handler = FragmentAssembler(on_message)
        deadline = time.monotonic() + 10 * TIMEOUT_S
        while not state["quit"] and time.monotonic() < deadline:
            data.poll(handler, 64)
    return 0
