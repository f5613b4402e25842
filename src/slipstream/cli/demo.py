"""``slipstream demo``: two processes exchanging messages over shared memory, with what was measured.

The parent starts an embedded media driver (or attaches to a standalone one given by ``--dir``),
publishes a burst of small messages plus some larger ones that are fragmented and reassembled, then
measures round trips. A child process (the same command with ``--role peer``) subscribes, checks
every byte, reports, and answers pings.

Nothing outlives the demo: the peer dies with its parent (``PR_SET_PDEATHSIG``, and a parent-pid
check besides), every wait is bounded, the peer backs off to sleeping when idle, and a demo
directory the demo made is removed on every exit path (normal end, error, Ctrl-C, SIGTERM; by the
peer if the parent was killed).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import FrameType
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
PEER_IDLE_EXIT_S = 60.0
"""A peer that heard nothing for this long gives up (its parent is gone or stuck)."""
PEER_EXIT_WAIT_S = 5.0
PROGRESS_EVERY_S = 2.0
LARGE_SIZE = 10_000
_PR_SET_PDEATHSIG = 1
_PARENT_DEATH_SIGNAL = signal.SIGUSR1
"""What the kernel sends the peer when the parent dies: its own signal, so the peer knows to clean up."""


def register(commands: Any) -> None:
    """Add ``demo`` to the command parsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="two-process shared-memory demo",
        description="Two processes exchange messages over shared memory (aeron:ipc) and print throughput, "
        "a checksum and round-trip latencies. Uses an embedded driver in a fresh directory (removed at the "
        "end), or the driver of --dir.",
    )
    parser.add_argument("--messages", type=int, default=200_000, help="small messages to send")
    parser.add_argument("--size", type=int, default=32, help="bytes per small message")
    parser.add_argument("--large", type=int, default=100, help="10 KB messages to send, each fragmented")
    parser.add_argument("--pings", type=int, default=10_000, help="round trips to measure")
    parser.add_argument(
        "--dir", type=Path, default=None, help="driver directory (default: a fresh one, removed at the end)"
    )
    parser.add_argument("--role", choices=["main", "peer"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--owned", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo (or, with ``--role peer``, its child)."""
    if args.messages < 1 or args.size < 9 or args.large < 0 or args.pings < 1:
        print("slipstream demo: need --messages >= 1, --size >= 9, --large >= 0, --pings >= 1", file=sys.stderr)
        return 2
    if args.role == "peer":
        return _peer(args.dir, owned=args.owned, parent=args.parent if args.parent is not None else os.getppid())
    own_dir = args.dir is None
    directory = args.dir or Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"slipstream-demo-{os.getpid()}"
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _main(args, directory, own_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so the peer is stopped and the directory removed."""
    raise SystemExit(128 + signum)


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to signal this process when its parent dies (Linux); the peer also polls its
    parent pid, for other systems and for the race where the parent died before this call."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, _PARENT_DEATH_SIGNAL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        raise SystemExit(1)


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


def _main(args: argparse.Namespace, directory: Path, own_dir: bool) -> int:
    with Context(directory) as ctx:
        kind = "an embedded media driver" if ctx.is_embedded else f"the standalone media driver (pid {ctx.driver_pid})"
        print(f"slipstream demo: two processes, {kind}, shared memory (aeron:ipc)")
        print(f"  driver directory {directory}")
        data = ctx.add_exclusive_publication(CHANNEL, DATA_STREAM)
        if args.size > data.max_message_length:
            print(
                f"slipstream demo: --size {args.size} exceeds the maximum message length {data.max_message_length}",
                file=sys.stderr,
            )
            return 2
        replies = ctx.add_subscription(CHANNEL, REPLY_STREAM)
        command = [sys.executable, "-m", "slipstream", "demo", "--role", "peer", "--dir", str(directory)]
        command += ["--parent", str(os.getpid())]
        peer = subprocess.Popen([*command, "--owned"] if own_dir else command)
        finished = False
        try:
            _wait(lambda: data.is_connected and replies.is_connected, "the peer process to subscribe")
            result = _exchange(args, data, replies)
            finished = True
            return result
        finally:
            _stop_peer(peer, finished)


def _stop_peer(peer: subprocess.Popen[bytes], finished: bool) -> None:
    """After a normal end the peer quits by itself; otherwise it is terminated at once. Waits are bounded."""
    if not finished and peer.poll() is None:
        peer.terminate()
    try:
        peer.wait(timeout=PEER_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        peer.kill()
        peer.wait(timeout=PEER_EXIT_WAIT_S)


def _exchange(args: argparse.Namespace, data: ExclusivePublication, replies: Subscription) -> int:
    filler = bytes(range(256)) * (max(args.size, LARGE_SIZE) // 256 + 1)
    small = bytearray(b"D" + filler[: args.size - 1])
    large = bytearray(b"D" + filler[: LARGE_SIZE - 1])
    crc = 0
    back_pressured = 0
    started = time.perf_counter()
    progress = _Progress("sent", args.messages + args.large)
    for i in range(args.messages):
        small[1:9] = i.to_bytes(8, "little")
        back_pressured += _offer(data, small)
        crc = zlib.crc32(small, crc)
        if i & 0x3FF == 0:
            progress.tick(i)
    for i in range(args.large):
        large[1:9] = i.to_bytes(8, "little")
        back_pressured += _offer(data, large)
        crc = zlib.crc32(large, crc)
        progress.tick(args.messages + i)
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
        f"  ping     {rtts.count:,} round trips (busy-spin): p50 {rtts.percentile(50):.1f} us, "
        f"p99 {rtts.percentile(99):.1f} us, p99.9 {rtts.percentile(99.9):.1f} us"
    )
    _offer(data, b"Q")
    return 0 if verdict == "ok" else 1


class _Progress:
    """A line every few seconds on long runs, so a big demo is visibly alive."""

    def __init__(self, what: str, total: int) -> None:
        self.what = what
        self.total = total
        self.next_s = time.monotonic() + PROGRESS_EVERY_S

    def tick(self, done: int) -> None:
        now = time.monotonic()
        if now >= self.next_s:
            self.next_s = now + PROGRESS_EVERY_S
            print(f"  ... {self.what} {done:,} of {self.total:,}", flush=True)


class Histogram:
    """Fixed memory for any number of samples: log-scaled buckets 1 % wide from 0.1 us to 100 s, so a
    percentile is exact to within 1 %. (A list of every round trip grew by hundreds of MB on long runs.)"""

    LOW_US = 0.1
    RATIO = 1.01

    def __init__(self, high_us: float = 100e6) -> None:
        self._log_ratio = math.log(self.RATIO)
        self._counts = [0] * (self._bucket(high_us) + 2)
        self.count = 0

    def _bucket(self, value_us: float) -> int:
        if value_us <= self.LOW_US:
            return 0
        return int(math.log(value_us / self.LOW_US) / self._log_ratio) + 1

    def record(self, value_us: float) -> None:
        """Count one sample (values beyond the range land in the last bucket)."""
        self._counts[min(self._bucket(value_us), len(self._counts) - 1)] += 1
        self.count += 1

    def percentile(self, pct: float) -> float:
        """The upper bound of the bucket holding the ``pct``-th percentile sample (0.0 when empty)."""
        if self.count == 0:
            return 0.0
        rank = min(self.count - 1, int(self.count * pct / 100))
        seen = 0
        for index, bucket_count in enumerate(self._counts):
            seen += bucket_count
            if seen > rank:
                return self.LOW_US * self.RATIO**index
        return self.LOW_US * self.RATIO ** (len(self._counts) - 1)


def _ping(data: ExclusivePublication, replies: Subscription, count: int) -> Histogram:
    rtts = Histogram()
    progress = _Progress("round trips", count)
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
            rtts.record((time.perf_counter_ns() - sent) / 1000)
            if i & 0x3FF == 0:
                progress.tick(i - 1000)
    return rtts


def _peer(directory: Path | None, *, owned: bool, parent: int) -> int:
    """The child: count and checksum data, report, then answer pings until told to quit. It ends with its
    parent (and then removes a directory the demo made), or after ``PEER_IDLE_EXIT_S`` without a message."""
    def remove_directory() -> None:
        if owned and directory is not None:
            shutil.rmtree(directory, ignore_errors=True)  # the parent died without cleaning up

    def on_parent_death(signum: int, frame: FrameType | None) -> None:
        remove_directory()
        os._exit(1)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # The parent stops the peer early (and removes the directory itself): leave at once, without a
        # polite close that would wait for the driver.
        os._exit(128 + signum)

    signal.signal(_PARENT_DEATH_SIGNAL, on_parent_death)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    try:
        _die_with_parent(parent)
        return _serve(directory, parent)
    finally:
        if os.getppid() != parent:
            remove_directory()


def _serve(directory: Path | None, parent: int) -> int:
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
        last_message = time.monotonic()
        idle = 0
        while not state["quit"]:
            if data.poll(handler, 64):  # raises DriverLostError if the parent's driver is gone
                idle = 0
                continue
            idle += 1
            if idle >= 0x10000:
                time.sleep(0.001)  # quiet for a while (~0.1 s of polls): stop busy-spinning
            if idle & 0x3FF == 0:  # every ~1000 empty polls (at most ~1 s): still wanted?
                now = time.monotonic()
                if os.getppid() != parent:
                    return 1
                if idle == 0x400:
                    last_message = now
                elif now - last_message > PEER_IDLE_EXIT_S:
                    print("slipstream demo peer: nothing heard for a minute; giving up", file=sys.stderr)
                    return 1
    return 0
