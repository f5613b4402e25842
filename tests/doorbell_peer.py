"""A publisher process for the doorbell tests: it offers one message each time it reads ``go``.

It prints ``connected`` once a subscriber is attached and ``offered <position>`` after each offer, so
the test can park its subscriber first and let this process's offer be what rings it.
"""

from __future__ import annotations

import argparse
import sys
import time

from slipstream import Context


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--stream", type=int, default=1001)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    with Context(args.dir, driver="external") as ctx:
        pub = ctx.add_exclusive_publication(args.channel, args.stream)
        deadline = time.monotonic() + args.timeout
        while not pub.is_connected:
            if time.monotonic() > deadline:
                print("error: no subscriber", flush=True)
                return 1
            time.sleep(0.001)
        print("connected", flush=True)
        for count, line in enumerate(sys.stdin, 1):
            if line.strip() != "go":
                break
            message = count.to_bytes(8, "little") * 4
            while (result := pub.offer(message)) < 0:
                if time.monotonic() > deadline:
                    print(f"error: offer refused ({result})", flush=True)
                    return 1
                time.sleep(0.0001)
            print(f"offered {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
