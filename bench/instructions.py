"""Instructions, not seconds: the network layer's work per message round trip, counted by callgrind.

    python -m bench.instructions [--rounds N] [--json PATH]

On this shared VM one run's round trip moves 1.5-5x with the host's phase (``bench/README.md``), more than most
changes to the code do. ``valgrind --tool=callgrind`` counts the instructions a workload executes instead, the
same figure within about 0.4 % whatever else the machine is doing, so a change to the per-message path can be
measured on any day. What it cannot see: waits, wake-ups and cache misses (what a cold path costs), nor
anything in another process.

The workload is two connection machines (``slipstream.testing.ConnectionPair``: real record layer, real
serialization, no I/O), each round trip a typed message sealed alone, opened, and its events taken, there and back,
as a blocking or asyncio round trip does it (the message ``bench.network`` times). ``message`` has no delivery
sessions; ``sequenced`` gives both sides one (a server's default: sequence numbers, acknowledgements, retained
records). ``call`` is a remote call one at a time instead: ``add(2, 3)`` on an object the other machine hosts, run
as an adapter runs it, and its result. Each runs twice under callgrind, after ``WARMUP`` round trips, with 0 and
with ``--rounds`` round trips more: the difference, divided by the rounds, is the round trip's alone (the
interpreter's start and the imports cancel out).

Needs valgrind (Debian's ``valgrind``); without it, says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .network import Quote

WORKLOADS = ("message", "sequenced", "call")
WARMUP = 200
"""Round trips before the counted ones (both runs make them)."""
ROUND_TRIP_NS = 30_000
"""The machines' clock moves this much per round trip (timers such as acknowledgements fire as they would)."""
RUN_TIMEOUT_S = 900
"""One run under callgrind (about 50x slower than native; the imports dominate)."""
_COLLECTED = re.compile(r"Collected : (\d+)")


class ICalc(Protocol):
    def add(self, a: int, b: int) -> int: ...


class Calc:
    def add(self, a: int, b: int) -> int:
        return a + b


def round_trips(workload: str, count: int) -> int:
    """``count`` round trips of ``workload`` after ``WARMUP`` (see the module's docstring); the messages back."""
    step = round_trip(workload)
    back = sum(step() for _ in range(WARMUP + count))
    if back != WARMUP + count:
        what = "calls completed" if workload == "call" else "replies came back"
        raise RuntimeError(f"{back} of {WARMUP + count} {what}")
    return back


def round_trip(workload: str) -> Callable[[], int]:
    """A fresh pair of machines, and a function running one round trip of ``workload`` between them per call
    (the clock moved ``ROUND_TRIP_NS``): how many replies (or completed calls) it brought back, 1."""
    from slipstream.network.connection import ConnectionMachine
    from slipstream.network.delivery import Delivery
    from slipstream.network.events import MessageReceived
    from slipstream.testing import ConnectionPair

    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, not {workload!r}")
    if workload == "call":
        return _call()
    pair = ConnectionPair(types=[Quote], delivery=(Delivery(), Delivery()) if workload == "sequenced" else None)
    a, b = pair.a, pair.b
    quote = Quote(1, 0.5, "ACME")
    now = pair.clock.now_ns()

    def carry(sender: ConnectionMachine, receiver: ConnectionMachine, message: object) -> None:
        """``message`` from ``sender`` to ``receiver`` as an adapter sends it: sealed alone when nothing waits
        before it (an acknowledgement may), else appended and flushed with what waits."""
        for machine in (sender, receiver):  # (timers: acknowledgements due, as a poller runs them)
            deadline = machine.deadline_ns
            if deadline is not None and now >= deadline:
                machine.handle_timer(now)
        record = sender.seal_lone(message, now)
        if record is not None:
            receiver.receive(record, now)
            return
        sender.send(message)
        for sealed in sender.messages_to_send(now):
            receiver.receive(sealed, now)

    def step() -> int:
        nonlocal now
        now += ROUND_TRIP_NS
        carry(a, b, quote)
        for event in b.take_events():
            if isinstance(event, MessageReceived):
                carry(b, a, event.message)
        return sum(isinstance(event, MessageReceived) for event in a.take_events())

    return step


def _call() -> Callable[[], int]:
    """``round_trip`` for remote calls: the call sealed and offered, the request opened and its invocation run
    (as an adapter runs it), the result sealed back and opened."""
    from slipstream.network.events import RmiCallCompleted, RmiRequestReceived
    from slipstream.network.rmi import RemoteRef, RmiRegistry
    from slipstream.testing import ConnectionPair

    pair = ConnectionPair(rmi=(RmiRegistry([ICalc]), RmiRegistry([(ICalc, Calc)])))
    a, b = pair.a, pair.b
    assert b.rmi is not None
    ref = RemoteRef(0, b.rmi.endpoint.objects.save(Calc()))
    now = pair.clock.now_ns()

    def step() -> int:
        nonlocal now
        now += ROUND_TRIP_NS
        a.call(ref, "add", [2, 3], now, timeout_ns=1_000_000_000)
        for record in a.messages_to_send(now):
            b.receive(record, now)
        for event in b.take_events():
            if isinstance(event, RmiRequestReceived):
                b.complete_invocation(event.invocation_id, b.invocation(event.invocation_id).call())
        for record in b.messages_to_send(now):
            a.receive(record, now)
        return sum(isinstance(event, RmiCallCompleted) and event.value == 5 for event in a.take_events())

    return step


def collected(workload: str, count: int, valgrind: str) -> int:
    """Instructions callgrind counted for one run of ``round_trips(workload, count)`` in a fresh interpreter."""
    command = [
        valgrind,
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "bench.instructions",
    ]
    command += ["--run", workload, "--rounds", str(count)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=Path(__file__).parent.parent
    )
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1))


def measure(rounds: int, valgrind: str) -> dict[str, Any]:
    """Instructions per round trip of each workload (see the module's docstring)."""
    results: dict[str, Any] = {}
    for workload in WORKLOADS:
        base = collected(workload, 0, valgrind)
        total = collected(workload, rounds, valgrind)
        results[workload] = {
            "rounds": rounds,
            "instructions_base": base,
            "instructions_total": total,
            "instructions_per_round_trip": (total - base) / rounds,
        }
        print(f"{workload:10s} {results[workload]['instructions_per_round_trip']:12,.0f} instructions per round trip")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000, help="round trips counted per workload (default 2000)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--run", choices=WORKLOADS, help=argparse.SUPPRESS)  # (one run, inside callgrind)
    args = parser.parse_args(argv)
    if args.run is not None:  # (0 rounds: the run whose count is subtracted)
        round_trips(args.run, args.rounds)
        return 0
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("bench.instructions: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": sys.version.split()[0],
        **measure(args.rounds, valgrind),
    }
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
