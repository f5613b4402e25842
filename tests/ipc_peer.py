"""A publisher or subscriber process for the cross-process IPC tests.

Messages are derived from a seed, so the subscriber can check every byte without the two processes
sharing anything but the stream: message ``i`` is a slice of a seeded random pool whose length is
skewed towards small messages but reaches several MTUs (fragmented and reassembled).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib

from slipstream import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    NOT_CONNECTED,
    Context,
    FragmentAssembler,
    Header,
    result_name,
)

POOL_SIZE = 1 << 20
MAX_SIZE = 6000


def plan(seed: int, count: int) -> tuple[bytes, list[tuple[int, int]]]:
    rng = random.Random(seed)
    pool = rng.randbytes(POOL_SIZE + MAX_SIZE)
    return pool, [((i * 7919) % POOL_SIZE, 1 + int(rng.random() ** 8 * MAX_SIZE)) for i in range(count)]


def publish(args: argparse.Namespace) -> dict[str, object]:
    pool, messages = plan(args.seed, args.count)
    view = memoryview(pool)
    back_pressured = 0
    crc = 0
    deadline = time.monotonic() + args.timeout
    dropped: list[str] = []
    with Context(args.dir, driver="external") as ctx:
        pubs = {channel: ctx.add_exclusive_publication(channel, args.stream) for channel in args.channel}
        while not all(pub.is_connected for pub in pubs.values()):
            if time.monotonic() > deadline:
                return {"error": "no subscriber connected"}
            time.sleep(0.001)
        print("started", flush=True)
        for i, (offset, size) in enumerate(messages):
            message = view[offset : offset + size]
            for channel, pub in list(pubs.items()):
                while (result := pub.offer(message)) < 0:
                    if result == BACK_PRESSURED:
                        back_pressured += 1
                    elif result == NOT_CONNECTED and args.tolerate_disconnect:
                        dropped.append(channel)  # its subscriber went away: carry on with the others
                        del pubs[channel]
                        break
                    elif result not in (ADMIN_ACTION, NOT_CONNECTED):
                        return {"error": f"offer {i} failed: {result_name(result)}"}
                    if back_pressured & 0x3FF == 0 and time.monotonic() > deadline:
                        return {"error": f"timed out at message {i}", "back_pressured": back_pressured}
            crc = zlib.crc32(message, crc)
        position = max((pub.position for pub in pubs.values()), default=0)
    return {
        "sent": len(messages),
        "crc": crc,
        "back_pressured": back_pressured,
        "position": position,
        "dropped": dropped,
    }


def subscribe(args: argparse.Namespace) -> dict[str, object]:
    pool, messages = plan(args.seed, args.count)
    view = memoryview(pool)
    state = {"received": 0, "crc": 0, "errors": 0}
    expected = iter(messages)

    def on_message(payload: memoryview, header: Header) -> None:
        offset, size = next(expected)
        if payload != view[offset : offset + size]:
            state["errors"] += 1
        state["crc"] = zlib.crc32(payload, state["crc"])
        state["received"] += 1

    handler = FragmentAssembler(on_message)
    deadline = time.monotonic() + args.timeout
    with Context(args.dir, driver="external") as ctx:
        sub = ctx.add_subscription(args.channel[0], args.stream)
        print("ready", flush=True)
        stall_at = args.stall_after if args.stall_after >= 0 else None
        end_of_stream = False
        while state["received"] < args.count and time.monotonic() < deadline:
            if stall_at is not None and state["received"] >= stall_at:
                print("stalled", flush=True)
                time.sleep(args.timeout)  # hold the publisher back until killed
            if args.slow and state["received"] % 1000 == 0:
                time.sleep(0.002)
            if sub.poll(handler, 1 if args.slow else 64) == 0:
                images = sub.images
                if images and images[0].is_end_of_stream:
                    end_of_stream = True
                    break
        if args.expect_eos:
            while not end_of_stream and time.monotonic() < deadline:
                images = sub.images
                end_of_stream = not images or images[0].is_end_of_stream
                time.sleep(0.001)
    return {**state, "end_of_stream": end_of_stream}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["publish", "subscribe"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--channel", action="append", help="repeat to publish every message on several channels")
    parser.add_argument("--stream", type=int, default=1001)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--slow", action="store_true")
    parser.add_argument("--stall-after", type=int, default=-1)
    parser.add_argument("--expect-eos", action="store_true")
    parser.add_argument("--tolerate-disconnect", action="store_true")
    args = parser.parse_args()
    args.channel = args.channel or ["aeron:ipc"]
    result = publish(args) if args.role == "publish" else subscribe(args)
    result["pid"] = os.getpid()
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
