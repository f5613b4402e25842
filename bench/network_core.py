"""``python -m bench.network_core``: per-operation costs of the network layer's sans-I/O core.

In-process microbenchmarks (best CPU time of several repeats, microseconds per operation) of what every typed
message pays: msgspec encode/decode of a small Struct (an int, a float, a short string), the frame
codec, and the record layer's seal/open (one ChaCha20-Poly1305 call each) for 100 B and 1 KiB
records, plus whole send and receive paths with 100 messages batched per record (send: two-step and
``Serialization.encode_frame_into``, the fused path; receive: frames then decode, and the fused
``Serialization.decode_record``). ``--json PATH``
writes the figures. Runs in a few seconds; speed targets live in the issues, not in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import timeit
from collections.abc import Callable

import msgspec

from slipstream.network.frames import FrameKind, decode_frames, encode_frame_into
from slipstream.network.serialization import Serialization
from slipstream.network.session import RecordLayer


class Small(msgspec.Struct):
    """The issue's benchmark message."""

    number: int
    ratio: float
    name: str


def _per_op_us(function: Callable[[], object], number: int, repeat: int = 5) -> float:
    """Best CPU time (process time: on a shared, loaded machine wall time mostly measures the others)."""
    return min(timeit.repeat(function, number=number, repeat=repeat, timer=time.process_time)) / number * 1e6


def measure(scale: float = 1.0) -> dict[str, float]:
    """Every figure, in microseconds per operation (per message for the batched paths)."""
    n = max(100, int(100_000 * scale))
    serialization = Serialization([Small])
    message = Small(12345, 3.25, "hello")
    payload = serialization.encode(message)
    out: dict[str, float] = {}
    out["serialization.encode"] = _per_op_us(lambda: serialization.encode(message), n)
    out["serialization.decode"] = _per_op_us(lambda: serialization.decode(payload), n)

    batch_of_100 = bytearray()
    for _ in range(100):
        encode_frame_into(batch_of_100, FrameKind.MESSAGE, 0, payload)
    record_plaintext = bytes(batch_of_100)

    def encode_100_frames() -> None:
        buf = bytearray()
        for _ in range(100):
            encode_frame_into(buf, FrameKind.MESSAGE, 0, payload)

    out["frames.encode"] = _per_op_us(encode_100_frames, max(10, n // 100)) / 100
    out["frames.decode"] = _per_op_us(lambda: decode_frames(record_plaintext), max(10, n // 100)) / 100

    a_to_b, b_to_a = os.urandom(32), os.urandom(32)
    sender = RecordLayer(a_to_b, b_to_a)
    receiver = RecordLayer(b_to_a, a_to_b, replay_window=1 << 20)
    for size in (100, 1024):
        plaintext = bytes(size)
        out[f"session.seal.{size}B"] = _per_op_us(lambda p=plaintext: sender.seal(p), n)  # type: ignore[misc]
        records = iter([sender.seal(plaintext) for _ in range(n * 5)])
        out[f"session.open.{size}B"] = _per_op_us(lambda r=records: receiver.open(next(r)), n)  # type: ignore[misc]

    def send_100() -> bytes:
        buf = bytearray()
        for _ in range(100):
            encode_frame_into(buf, FrameKind.MESSAGE, 0, serialization.encode(message))
        return sender.seal(buf)

    out["path.send.batch100"] = _per_op_us(send_100, max(10, n // 100)) / 100

    def send_100_fused() -> bytes:
        buf = bytearray()
        for _ in range(100):
            serialization.encode_frame_into(buf, FrameKind.MESSAGE, 0, message)
        return sender.seal(buf)

    out["path.send.batch100.fused"] = _per_op_us(send_100_fused, max(10, n // 100)) / 100
    sealed = iter([send_100() for _ in range(max(10, n // 100) * 5)])

    def receive_100() -> None:
        for frame in decode_frames(receiver.open(next(sealed))):
            serialization.decode(frame.payload)

    out["path.receive.batch100"] = _per_op_us(receive_100, max(10, n // 100)) / 100
    sealed = iter([send_100() for _ in range(max(10, n // 100) * 5)])

    def receive_100_fused() -> None:
        serialization.decode_record(receiver.open(next(sealed)))

    out["path.receive.batch100.fused"] = _per_op_us(receive_100_fused, max(10, n // 100)) / 100
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table; write JSON if asked."""
    parser = argparse.ArgumentParser(prog="python -m bench.network_core", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks it works, measures little")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    figures = measure(0.01 if args.quick else 1.0)
    for name, value in figures.items():
        print(f"{name:28s} {value:8.3f} us")
    send, receive = figures["path.send.batch100.fused"], figures["path.receive.batch100.fused"]
    print(f"{'messages/s, one core each':28s} send {1e6 / send:,.0f}  receive {1e6 / receive:,.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
