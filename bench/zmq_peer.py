"""pyzmq side of the IPC benchmarks: PUSH/PULL throughput and REQ/REP ping-pong over ``ipc://``.

These are the patterns a pyzmq user reaches for first, with default high-water marks. The workers
mirror the slipstream ones in ``bench.ipc`` (same pacing, same counts, same clocks), so the only
difference measured is the transport. Sockets get send/receive timeouts so no call blocks forever.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import zmq
import zmq.asyncio

from . import BenchError, Children, expect, stop_requested

CONNECT_TIMEOUT_S = 15.0
POLL_TIMEOUT_MS = 200
"""Socket timeout: short enough to check the run's deadline often, long enough to cost nothing."""
IDLE_TIMEOUT_S = 3.0
"""A receiver that saw nothing for this long stops: the rest is not coming."""


@dataclass(frozen=True, slots=True)
class ThroughputParams:
    endpoint: str
    size: int
    count: int
    time_limit_s: float


def push_worker(conn: Connection, p: ThroughputParams) -> None:
    """Sends ``count`` messages; a full queue blocks ``send`` (that is zmq's back-pressure)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDTIMEO, POLL_TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(p.endpoint)
        conn.send(("ready", None))
        expect(conn, "go", CONNECT_TIMEOUT_S, "push")
        send = sock.send
        message = bytes(p.size)
        count = p.count
        sent = send_timeouts = 0
        start = time.perf_counter()
        deadline = start + p.time_limit_s
        while sent < count:
            try:
                send(message, copy=True)
            except zmq.Again:
                send_timeouts += 1
                if time.perf_counter() > deadline:
                    break
                continue
            sent += 1
        elapsed = time.perf_counter() - start
        conn.send(
            (
                "result",
                {"sent": sent, "elapsed_s": elapsed, "send_timeouts": send_timeouts, "cpu_s": time.process_time()},
            )
        )
        expect(conn, "close", p.time_limit_s + CONNECT_TIMEOUT_S, "push")
    finally:
        sock.close()
        ctx.term()


def pull_worker(conn: Connection, p: ThroughputParams) -> None:
    """Binds, then counts messages from the first to the last, like the slipstream subscriber."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVTIMEO, POLL_TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(p.endpoint)
        conn.send(("ready", None))
        recv = sock.recv
        count = p.count
        deadline = time.perf_counter() + CONNECT_TIMEOUT_S + p.time_limit_s
        while True:
            try:
                recv(copy=True)
                break
            except zmq.Again:
                if time.perf_counter() > deadline:
                    raise BenchError("pull: no message arrived") from None
        received = 1
        start = time.perf_counter()
        deadline = start + p.time_limit_s
        idle_since = 0.0
        while received < count:
            try:
                recv(copy=True)
            except zmq.Again:
                now = time.perf_counter()
                if not idle_since:
                    idle_since = now - POLL_TIMEOUT_MS / 1000  # recv waited that long already
                if now - idle_since > IDLE_TIMEOUT_S or now > deadline:
                    break
                continue
            received += 1
            idle_since = 0.0
        end = idle_since if received < count and idle_since else time.perf_counter()
        conn.send(
            (
                "result",
                {
                    "received": received,
                    "measured": received - 1,
                    "elapsed_s": end - start,
                    "timed_out": received < count,
                    "cpu_s": time.process_time(),
                },
            )
        )
        expect(conn, "close", CONNECT_TIMEOUT_S, "pull")
    finally:
        sock.close()
        ctx.term()


def run_throughput(endpoint: str, size: int, count: int, time_limit_s: float) -> dict[str, Any]:
    params = ThroughputParams(endpoint, size, count, time_limit_s)
    with Children() as children:
        pull = children.start("zmq-pull", pull_worker, params)
        pull.expect("ready", CONNECT_TIMEOUT_S)
        push = children.start("zmq-push", push_worker, params)
        push.expect("ready", CONNECT_TIMEOUT_S)
        push.send("go")
        wait = time_limit_s + CONNECT_TIMEOUT_S
        push_result = push.expect("result", wait)
        pull_result = pull.expect("result", wait)
        push.send("close")
        pull.send("close")
        push.finish()
        pull.finish()
    if pull_result["measured"] <= 0 or pull_result["elapsed_s"] <= 0:
        raise BenchError(f"zmq throughput run measured nothing: {pull_result}")
    msgs_per_s = pull_result["measured"] / pull_result["elapsed_s"]
    return {
        "params": asdict(params),
        "msgs_per_s": msgs_per_s,
        "mb_per_s": msgs_per_s * size / 1e6,
        "push": push_result,
        "pull": pull_result,
    }


@dataclass(frozen=True, slots=True)
class LatencyParams:
    endpoint: str
    size: int
    warmup: int
    samples: int
    time_limit_s: float
    rep_wait: str = "blocking"
    """``blocking`` (plain REP) or ``asyncio`` (REP on ``zmq.asyncio``, the asyncio user's choice)."""
    gap_s: float = 0.0


def req_worker(conn: Connection, p: LatencyParams) -> None:
    """REQ side: send, block in recv for the reply, record the round trip."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, int(p.time_limit_s * 1000) + 1)
    sock.setsockopt(zmq.SNDTIMEO, int(p.time_limit_s * 1000) + 1)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(p.endpoint)
        # One untimed round trip so the connection is up before "ready", as slipstream's is.
        sock.send(b"hello")
        sock.recv()
        conn.send(("ready", None))
        expect(conn, "go", CONNECT_TIMEOUT_S, "req")
        send, recv, clock, gap = sock.send, sock.recv, time.perf_counter_ns, p.gap_s
        message = bytes(p.size)
        rtts: list[int] = []
        deadline_ns = time.perf_counter_ns() + int(p.time_limit_s * 1e9)
        try:
            for i in range(p.warmup + p.samples):
                if gap:
                    time.sleep(gap)
                t0 = clock()
                send(message, copy=True)
                recv(copy=True)
                t1 = clock()
                if t1 > deadline_ns:
                    break
                if i >= p.warmup:
                    rtts.append(t1 - t0)
        except zmq.Again:
            pass  # the REP side stopped answering; report what was measured
        conn.send(("result", {"rtt_ns": rtts, "timed_out": len(rtts) < p.samples}))
        expect(conn, "close", CONNECT_TIMEOUT_S, "req")
    finally:
        sock.close()
        ctx.term()


def rep_worker(conn: Connection, p: LatencyParams) -> None:
    """REP side: echo every request (plus the connection check) until done or out of time."""
    total = p.warmup + p.samples + 1
    wall, cpu = time.perf_counter(), time.process_time()
    echoed = asyncio.run(_rep_async(conn, p, total)) if p.rep_wait == "asyncio" else _rep_blocking(conn, p, total)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    conn.send(("result", {"echoed": echoed, "wait": p.rep_wait, "cpu_s": cpu, "wall_s": wall}))
    expect(conn, "close", CONNECT_TIMEOUT_S, "rep")


def _rep_blocking(conn: Connection, p: LatencyParams, total: int) -> int:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.RCVTIMEO, POLL_TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(p.endpoint)
        conn.send(("ready", None))
        recv, send = sock.recv, sock.send
        deadline = time.perf_counter() + CONNECT_TIMEOUT_S + p.time_limit_s
        echoed = 0
        while echoed < total:
            try:
                message = recv(copy=True)
            except zmq.Again:
                if time.perf_counter() > deadline or stop_requested(conn):
                    break
                continue
            send(message, copy=True)
            echoed += 1
        return echoed
    finally:
        sock.close()
        ctx.term()


async def _rep_async(conn: Connection, p: LatencyParams, total: int) -> int:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(p.endpoint)
        conn.send(("ready", None))
        deadline = time.perf_counter() + CONNECT_TIMEOUT_S + p.time_limit_s
        echoed = 0
        while echoed < total:
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or stop_requested(conn):
                break
            try:
                message = await asyncio.wait_for(sock.recv(copy=True), min(remaining, 0.2))
            except TimeoutError:
                continue
            await sock.send(message, copy=True)
            echoed += 1
        return echoed
    finally:
        sock.close()
        ctx.term()


def run_latency(
    endpoint: str,
    size: int,
    warmup: int,
    samples: int,
    time_limit_s: float,
    *,
    rep_wait: str = "blocking",
    gap_s: float = 0.0,
) -> dict[str, Any]:
    params = LatencyParams(endpoint, size, warmup, samples, time_limit_s, rep_wait, gap_s)
    with Children() as children:
        rep = children.start("zmq-rep", rep_worker, params)
        rep.expect("ready", CONNECT_TIMEOUT_S)
        req = children.start("zmq-req", req_worker, params)
        req.expect("ready", CONNECT_TIMEOUT_S)
        req.send("go")
        wait = time_limit_s + CONNECT_TIMEOUT_S
        req_result = req.expect("result", wait)
        if req_result["timed_out"]:
            rep.send("stop")
        req.send("close")
        req.finish()
        rep_result = rep.expect("result", wait)
        rep.send("close")
        rep.finish()
    if not req_result["rtt_ns"]:
        raise BenchError("zmq latency run kept no samples")
    return {
        "params": asdict(params),
        "rtt_ns": req_result["rtt_ns"],
        "timed_out": req_result["timed_out"],
        "rep": rep_result,
    }
