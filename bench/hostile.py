"""Issue 29's flood targets: what an unauthenticated flood costs a server, and what it costs a legitimate client.

    python -m bench.hostile [--sessions N] [--json PATH]

A real server (``tests/hostile_peer.py``, embedded driver) is flooded on its handshake port from
127.0.0.2 (loopback; the legitimate client comes from 127.0.0.1) with forged SETUPs for
``--sessions`` distinct sessions (default 1,000) asking for 64 MiB terms, then the same sessions asking
for the 64 KiB the port accepts, each followed by a DATA frame carrying a forged HELLO (an image that
spends its pages). Measured: growth of the server driver directory's allocated bytes (``/dev/shm``)
and of the server's RSS and open files at the flood's peak and after ``handshake_timeout``, the
driver's ``SETUPs refused`` and ``Images rejected`` counters, and a legitimate client's connect-and-echo
time unloaded, during the flood and after it. Target: at most 32 MiB of ``/dev/shm`` during the flood.
Then the HELLO flood: 10,000 forged HELLOs for the target's app id (each worth a Diffie-Hellman to the
server) from 100 sessions, while a legitimate client connects and exchanges a message; five rounds with
and five without. Target: the median during the flood within 2x the median without.
Writes ``bench/results/hostile-flood-<date>.json`` unless ``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from slipstream.files import observe
from slipstream.network.handshake.packets import hello_head
from slipstream.network.transport import HANDSHAKE_STREAM
from slipstream.wire.frames import DataFrame, SetupFrame

from .report import machine_info

APP_ID = "hostile"
"""The target's app id (``tests/hostile_peer.py``)."""
HELLOS = 10_000
HELLO_SESSIONS = 100
"""The HELLO flood: ``HELLOS`` forged HELLOs, spread over this many sessions from one address (within
the handshake port's per-address budget, so every HELLO reaches the handshake machine)."""

SHM_TARGET_BYTES = 32 * 1024 * 1024
FLOOD_SOURCES = ("127.0.0.2",)
"""Where the forged datagrams come from: a loopback address other than the legitimate client's (a flood
from several addresses can fill the port's total budget, which keeps new handshakes out, not memory)."""


def forged_hello() -> bytes:
    """A HELLO as a stranger makes one, for the target's own app id (so the server gets as far as its
    Diffie-Hellman): this protocol version, a random nonce, no tag, a random ephemeral key."""
    return hello_head(int.from_bytes(os.urandom(8), "big"), APP_ID.encode(), b"", 0) + os.urandom(32)


def flood(port: int, sessions: int, term_length: int, *, with_hello: bool, seconds: float = 20.0) -> int:
    """Send forged SETUPs (term ``term_length``) for ``sessions`` distinct sessions to the handshake stream
    on 127.0.0.1:``port``, spread over ``FLOOD_SOURCES``, each (``with_hello``) followed by a DATA frame
    carrying a forged HELLO; bounded by ``seconds``. The datagrams sent."""
    sockets = []
    for host in FLOOD_SOURCES:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        sockets.append(sock)
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        for n in range(sessions):
            if time.monotonic() > deadline:
                break
            session = 0x4000_0000 + n
            sock = sockets[n % len(sockets)]
            sock.sendto(
                SetupFrame(0, session, HANDSHAKE_STREAM, 0, 0, term_length, 1408, 0).encode(), ("127.0.0.1", port)
            )
            sent += 1
            if with_hello:
                data = DataFrame(0, session, HANDSHAKE_STREAM, 0, payload=forged_hello()).encode()
                sock.sendto(data, ("127.0.0.1", port))
                sent += 1
            if n % 50 == 49:
                time.sleep(0.002)  # a burst the size of a socket buffer, not a lossy firehose
    finally:
        for sock in sockets:
            sock.close()
    return sent


def hello_flood(port: int, hellos: int = HELLOS, sessions: int = HELLO_SESSIONS, seconds: float = 30.0) -> int:
    """``hellos`` forged HELLOs to the handshake stream on 127.0.0.1:``port`` from ``FLOOD_SOURCES[0]``: a
    SETUP (64 KiB terms) for each of ``sessions`` sessions, then DATA frames one after another in each
    session's term, round robin; bounded by ``seconds``. The HELLOs sent."""
    target = ("127.0.0.1", port)
    first = 0x5000_0000 + int.from_bytes(os.urandom(2), "big") * sessions
    offsets = [0] * sessions
    sent = 0
    deadline = time.monotonic() + seconds
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((FLOOD_SOURCES[0], 0))
        for n in range(sessions):
            sock.sendto(SetupFrame(0, first + n, HANDSHAKE_STREAM, 0, 0, 64 * 1024, 1408, 0).encode(), target)
        time.sleep(0.2)  # the images are made
        while sent < hellos and time.monotonic() < deadline:
            n = sent % sessions
            frame = DataFrame(offsets[n], first + n, HANDSHAKE_STREAM, 0, payload=forged_hello()).encode()
            if offsets[n] + len(frame) > 64 * 1024:
                break  # a term is full: enough for one flood
            sock.sendto(frame, target)
            offsets[n] += (len(frame) + 31) // 32 * 32
            sent += 1
            if sent % 100 == 0:
                time.sleep(0.001)  # a socket buffer's worth at a time
    return sent


def median_exchange(port: int, rounds: int, during: Any = None) -> list[float]:
    """``rounds`` legitimate connect-and-echo times, each while ``during()`` (if given) runs on a thread."""
    from tests.hostile_peer import legitimate_exchange

    async def once() -> float:
        if during is None:
            return await legitimate_exchange(port)
        flooding = asyncio.ensure_future(asyncio.to_thread(during))
        await asyncio.sleep(0.05)  # the flood is under way
        took = await legitimate_exchange(port)
        await flooding
        return took

    return [asyncio.run(once()) for _ in range(rounds)]


def run_hellos(rounds: int = 5) -> dict[str, Any]:
    """The 10,000-HELLO flood's target: a legitimate connect during it within 2x its unloaded time."""
    from tests.hostile_peer import HostileTarget
    from tests.test_network_aio import free_ports

    port = free_ports(8)
    with tempfile.TemporaryDirectory(prefix="slipstream-hostile-") as scratch, HostileTarget(Path(scratch), port) as t:
        median_exchange(port, 1)  # warm: the first connect pays for imports
        unloaded = median_exchange(port, rounds)
        sent: list[int] = []
        loaded = median_exchange(port, rounds, lambda: sent.append(hello_flood(port)))
        after = t.measure()
    ratio = statistics.median(loaded) / statistics.median(unloaded)
    return {
        "hellos_per_flood": sent,
        "legit_connect_echo_s": {"unloaded": [round(x, 3) for x in unloaded], "during": [round(x, 3) for x in loaded]},
        "ratio_of_medians": round(ratio, 2),
        "target_ratio": 2.0,
        "target_met": ratio <= 2.0,
        "server_errors": after["errors"],
        "server_handshakes": after["handshakes"],
    }


def driver_counters(driver_dir: Path) -> dict[str, int]:
    wanted = ("SETUPs refused", "Images rejected", "Invalid packets")
    return {c.label: c.value for c in observe.counters(driver_dir) if c.label in wanted}


def run(sessions: int, handshake_timeout: float = 3.0) -> dict[str, Any]:
    """The whole measurement against a fresh target; the figures as a dict."""
    from tests.hostile_peer import HostileTarget, growth, legitimate_exchange
    from tests.test_network_aio import free_ports

    port = free_ports(8)
    with tempfile.TemporaryDirectory(prefix="slipstream-hostile-") as scratch:
        workdir = Path(scratch)
        with HostileTarget(workdir, port, {"handshake_timeout": handshake_timeout}) as target:
            unloaded = asyncio.run(legitimate_exchange(port))
            time.sleep(handshake_timeout + 1.5)  # the legitimate client's handshake image is gone
            before = target.measure()
            started = time.monotonic()
            big = flood(port, sessions, 64 * 1024 * 1024, with_hello=False)
            small = flood(port, sessions, 64 * 1024, with_hello=True)
            flood_s = time.monotonic() - started

            async def during() -> tuple[float, dict[str, Any]]:
                exchange = asyncio.ensure_future(legitimate_exchange(port))
                peak = target.measure()
                while not exchange.done():  # keep forging while the legitimate client connects
                    await asyncio.to_thread(flood, port, 200, 64 * 1024, with_hello=True, seconds=1.0)
                    now = target.measure()
                    peak = {k: max(v, now[k]) if isinstance(v, int) else v for k, v in peak.items()}
                return await exchange, peak

            loaded, peak = asyncio.run(during())
            counters_peak = driver_counters(target.driver_dir)
            time.sleep(2 * handshake_timeout + 1.5)  # held HELLOs expire, then their images are rejected
            after = target.measure()
            after_exchange = asyncio.run(legitimate_exchange(port))
            counters = driver_counters(target.driver_dir)
    peak_growth, after_growth = growth(before, peak), growth(before, after)
    return {
        "sessions": sessions,
        "datagrams": {"setup_64MiB": big, "setup_64KiB_and_hello": small},
        "flood_s": round(flood_s, 3),
        "handshake_timeout_s": handshake_timeout,
        "before": {k: before[k] for k in ("rss_bytes", "shm_bytes", "fds")},
        "growth_peak": {k: peak_growth[k] for k in ("rss_bytes", "shm_bytes", "fds")},
        "growth_after": {k: after_growth[k] for k in ("rss_bytes", "shm_bytes", "fds")},
        "shm_peak_MiB": round(peak_growth["shm_bytes"] / 2**20, 2),
        "rss_peak_MiB": round(peak_growth["rss_bytes"] / 2**20, 2),
        "counters_at_peak": counters_peak,
        "counters_after": counters,
        "legit_connect_echo_s": {
            "unloaded": round(unloaded, 3),
            "during": round(loaded, 3),
            "after": round(after_exchange, 3),
        },
        "target_shm_bytes": SHM_TARGET_BYTES,
        "target_met": peak_growth["shm_bytes"] <= SHM_TARGET_BYTES,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = {"machine": machine_info(), "when": datetime.now().isoformat(timespec="seconds")}
    results |= run(args.sessions)
    results["hello_flood"] = run_hellos()
    text = json.dumps(results, indent=2) + "\n"
    path = args.json or Path(__file__).parent / "results" / f"hostile-flood-{datetime.now():%Y-%m-%d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)
    print(f"written to {path}")
    return 0 if results["target_met"] and results["hello_flood"]["target_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
