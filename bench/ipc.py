"""slipstream side of the benchmarks: a standalone driver, publisher/subscriber and ping/pong workers.

The workers take their channel as a parameter: the IPC suite (``run_suite`` at the end) runs them on
``aeron:ipc``, the UDP suite (``bench.udp``) on ``aeron:udp`` channels through the same standalone
driver. Each worker is a function run in its own "spawn" process (see ``bench.Children``), so the
measured loops share the GIL with nothing but the client's keep-alive thread, which sleeps in ``recv``.
The parent paces them over a pipe: ``ready`` (endpoints connected) -> ``go`` -> ``result`` -> ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from slipstream import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    NOT_CONNECTED,
    BusySpinIdleStrategy,
    Context,
    DriverConfig,
    ExclusivePublication,
    FragmentAssembler,
    Header,
    Image,
    MediaDriver,
    Subscription,
    YieldingIdleStrategy,
    fast_path_active,
    result_name,
)

from . import BenchError, Children, expect, stop_requested
from .report import (
    Plan,
    SuiteResult,
    latency_rows,
    progress,
    refusals_note,
    size_label,
    throughput_row,
    zmq_spread_note,
)

CHANNEL = "aeron:ipc"
CONNECT_TIMEOUT_S = 15.0
"""Time allowed for spawning, importing, attaching to the driver and seeing the other side."""
THROUGHPUT_FRAGMENT_LIMIT = 256
"""Fragments per poll in the throughput subscriber: batching as a throughput-minded user would."""
LATENCY_FRAGMENT_LIMIT = 10
IDLE_TIMEOUT_S = 3.0
"""A throughput receiver that saw nothing for this long stops: the rest is not coming."""

PollAsync = Callable[..., Coroutine[Any, Any, int]]


def _find_poll_async() -> PollAsync | None:
    """The client's asyncio helper if this version of slipstream has one (it is being written)."""
    try:
        from slipstream.client import aio
    except ImportError:
        return None
    helper = getattr(aio, "poll_async", None)
    return helper if callable(helper) else None


POLL_ASYNC = _find_poll_async()
ASYNC_WAIT = (
    "client.aio.poll_async" if POLL_ASYNC is not None else "bench-side asyncio poll loop (no client aio helper)"
)
"""How the asyncio pong side waits; shown in the row name so results say what was measured."""


def _noop(payload: memoryview, header: Header) -> None:
    return None


def _idler(wait: str) -> Callable[[int], None]:
    """The idle call of a worker's wait mode: ``spin`` never gives the core up, ``yield`` does."""
    if wait not in ("spin", "yield"):
        raise ValueError(f"unknown wait mode {wait!r}")
    return YieldingIdleStrategy().idle if wait == "yield" else BusySpinIdleStrategy().idle


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used, read from /proc: how we see what the driver costs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_connected(
    deadline: float,
    publication: ExclusivePublication | None = None,
    subscription: Subscription | None = None,
    invoke: Callable[[], int] | None = None,
) -> None:
    while (publication is not None and not publication.is_connected) or (
        subscription is not None and not subscription.is_connected
    ):
        if time.monotonic() > deadline:
            raise BenchError(f"not connected after {CONNECT_TIMEOUT_S} s: {publication!r} {subscription!r}")
        if invoke is not None:
            invoke()
        time.sleep(0.001)


def _image_state(image: Image) -> dict[str, Any]:
    """What a subscriber's image looked like at the end: evidence when a run stalls."""
    return {
        "session_id": image.session_id,
        "position": image.position,
        "join_position": image.join_position,
        "is_corrupt": image.is_corrupt,
        "is_closed": image.is_closed,
    }


# -- standalone driver ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriverParams:
    directory: str
    idle_strategy: str = "backoff"
    """The driver's default. Over UDP the driver is on the data path, so this shapes the figures."""
    profile_path: str | None = None
    """Run the driver under cProfile and dump its statistics here (``--profile-driver``)."""
    udp_gso: bool = True
    """The driver's ``udp_gso`` (the loss suite also measures with it off)."""


def driver_worker(conn: Connection, params: DriverParams) -> None:
    """A standalone media driver; SIGTERM stops it cleanly (``run`` returns and releases the directory).

    A watchdog thread, asleep in ``recv`` (so it never takes the GIL from the driver), also stops it
    when the parent's end of the pipe closes: a killed benchmark leaves no driver behind.
    """
    config = DriverConfig(directory=Path(params.directory), idle_strategy=params.idle_strategy, udp_gso=params.udp_gso)
    driver = MediaDriver(config).start()
    signal.signal(signal.SIGTERM, lambda signum, frame: driver.stop())

    def watchdog() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                conn.recv()
        driver.stop()

    threading.Thread(target=watchdog, name="parent-watchdog", daemon=True).start()
    conn.send(("ready", os.getpid()))
    if params.profile_path is None:
        driver.run()
    else:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(driver.run)
        profiler.dump_stats(params.profile_path)
    conn.send(("result", {"cpu_s": time.process_time()}))


# -- throughput -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputParams:
    directory: str
    stream_id: int
    size: int
    count: int
    time_limit_s: float
    embedded: bool = False
    """The publisher process hosts the driver (on a thread) instead of attaching to a standalone one."""
    channel: str = CHANNEL
    assemble: bool = False
    """Count whole messages through a FragmentAssembler: needed once messages exceed one frame."""
    wait: str = "spin"
    """How both sides wait on a refused offer or an empty poll: ``spin`` or ``yield`` (sched_yield)."""
    invoker: bool = False
    """Each side embeds its own invoker-mode driver (``<directory>-pub``, ``<directory>-sub``) and runs
    it from its own loop instead of waiting: two processes, no driver thread or process."""
    pure: bool = False
    """Both clients run the pure-Python log path (SLIPSTREAM_NO_EXTENSIONS=1 in their environment)."""
    block: bool = False
    """The subscriber takes runs of frames with ``block_poll`` and counts them per block (no Python per message)."""
    drain: bool = False
    """The subscriber starts only once the publisher has offered everything: it drains a backlog (the
    ``count`` messages must fit the publication window, half the channel's term)."""


PUBLISHER_INVOKE_EVERY = 1024
"""An invoker-mode publisher runs its driver after this many accepted offers (and on every refusal)."""


def _invoker_context(directory: str) -> Context:
    config = DriverConfig(directory=Path(directory), threading_mode="invoker")
    return Context(directory, driver="embedded", driver_config=config)


def publisher_worker(conn: Connection, p: ThroughputParams) -> None:
    """Offers ``count`` messages as fast as the log takes them, retrying refusals and counting them."""
    mode: Literal["embedded", "external"] = "embedded" if p.embedded else "external"
    with _invoker_context(f"{p.directory}-pub") if p.invoker else Context(p.directory, driver=mode) as ctx:
        pub = ctx.add_exclusive_publication(p.channel, p.stream_id)
        invoke = ctx.invoke if p.invoker else None
        _wait_connected(time.monotonic() + CONNECT_TIMEOUT_S, publication=pub, invoke=invoke)
        conn.send(("ready", None))
        _await_parent(conn, "go", "publisher", invoke)
        offer, idle = pub.offer, _idler(p.wait) if invoke is None else (lambda work: invoke() and None)
        every = PUBLISHER_INVOKE_EVERY - 1 if invoke is not None else -1
        message = bytes(p.size)
        count = p.count
        sent = back_pressured = back_pressured_messages = admin_actions = not_connected = 0
        start = time.perf_counter()
        deadline = start + p.time_limit_s
        timed_out = False
        while sent < count:
            result = offer(message)
            if result > 0:
                sent += 1
                if sent & every == 0:
                    idle(0)  # an invoker-mode driver sends what was offered; a no-op otherwise
                continue
            # Refused: retry this message until the log takes it, counting every refusal by kind.
            if result == BACK_PRESSURED:
                back_pressured_messages += 1
            while result < 0:
                if result == BACK_PRESSURED:
                    back_pressured += 1
                elif result == ADMIN_ACTION:
                    admin_actions += 1
                elif result == NOT_CONNECTED:
                    not_connected += 1
                else:
                    raise BenchError(f"offer failed: {result_name(result)}")
                if time.perf_counter() > deadline:
                    timed_out = True
                    break
                idle(0)
                result = offer(message)
            if timed_out:
                break
            sent += 1
        elapsed = time.perf_counter() - start
        conn.send(
            (
                "result",
                {
                    "sent": sent,
                    "elapsed_s": elapsed,
                    "back_pressured": back_pressured,
                    "back_pressured_messages": back_pressured_messages,
                    "admin_actions": admin_actions,
                    "not_connected": not_connected,
                    "timed_out": sent < count,
                    "cpu_s": time.process_time(),
                    "position": pub.position,
                    "position_limit": pub.position_limit,
                    "fast_path": fast_path_active(),
                },
            )
        )
        # Keep the publication (and an embedded driver) up until the subscriber has everything.
        _await_parent(conn, "close", "publisher", invoke, p.time_limit_s + CONNECT_TIMEOUT_S)


def _message_poller(sub: Subscription, limit: int, assemble: bool) -> Callable[[], int]:
    """A poll that returns whole messages taken. Without reassembly a fragment is a message, and the
    poll stays a C-level partial so the small-message loop pays nothing for this indirection."""
    if not assemble:
        return functools.partial(sub.poll, _noop, limit)
    taken = 0

    def count(payload: memoryview, header: Header) -> None:
        nonlocal taken
        taken += 1

    assembler, poll = FragmentAssembler(count), sub.poll

    def poll_messages() -> int:
        nonlocal taken
        taken = 0
        poll(assembler, limit)
        return taken

    return poll_messages


BLOCK_LENGTH_LIMIT = 1 << 16
DRAIN_CHANNEL = "aeron:ipc?term-length=32m"
"""The drain rows' channel: a 16 MiB publication window holds their whole backlog."""
DRAIN_MESSAGES = 200_000
"""Messages in a drain row's backlog (at most; fewer with --messages): 12.8 MiB of 32 B messages' frames."""
"""Bytes per block poll in the block throughput row: a consumer draining a backlog in batches."""


def _block_poller(sub: Subscription, size: int) -> Callable[[], int]:
    """A block poll that returns the messages taken: every frame has the benchmark's one size, so a block's
    length says how many it holds (what a consumer that takes messages in bulk would do)."""
    aligned = (size + 32 + 31) & -32
    taken = 0

    def on_block(block: memoryview, session_id: int, term_id: int) -> None:
        nonlocal taken
        taken += len(block) // aligned

    block_poll = sub.block_poll

    def poll() -> int:
        nonlocal taken
        taken = 0
        block_poll(on_block, BLOCK_LENGTH_LIMIT)
        return taken

    return poll


@contextlib.contextmanager
def _client_environment(pure: bool) -> Iterator[None]:
    """Spawned clients inherit the environment they start with: SLIPSTREAM_NO_EXTENSIONS=1 makes them pure Python."""
    if not pure:
        yield
        return
    before = os.environ.get("SLIPSTREAM_NO_EXTENSIONS")
    os.environ["SLIPSTREAM_NO_EXTENSIONS"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["SLIPSTREAM_NO_EXTENSIONS"]
        else:
            os.environ["SLIPSTREAM_NO_EXTENSIONS"] = before


def subscriber_worker(conn: Connection, p: ThroughputParams) -> None:
    """Counts messages from first to last; the rate it sees is the benchmark's figure."""
    # Always attach: with an embedded driver the publisher's process hosts it, and attaching retries
    # until that driver's socket appears.
    with (
        _invoker_context(f"{p.directory}-sub")
        if p.invoker
        else Context(p.directory, driver="external", driver_timeout_s=CONNECT_TIMEOUT_S)
    ) as ctx:
        sub = ctx.add_subscription(p.channel, p.stream_id)
        conn.send(("ready", None))
        if p.drain:
            _await_parent(conn, "drain", "subscriber", ctx.invoke if p.invoker else None, p.time_limit_s)
        poll = _block_poller(sub, p.size) if p.block else _message_poller(sub, THROUGHPUT_FRAGMENT_LIMIT, p.assemble)
        if p.invoker:
            # The driver fills the image only inside invoke: run it before every poll.
            poll = functools.partial(_invoke_then_poll, ctx.invoke, poll)
        idle = _idler(p.wait)
        count = p.count
        deadline = time.perf_counter() + CONNECT_TIMEOUT_S + p.time_limit_s
        received = 0
        while received == 0:
            received = poll()
            if not received and time.perf_counter() > deadline:
                raise BenchError("subscriber: no message arrived")
        start = time.perf_counter()
        first = received
        deadline = start + p.time_limit_s
        idle_since = 0.0
        while received < count:
            got = poll()
            if got:
                received += got
                idle_since = 0.0
                continue
            now = time.perf_counter()
            if not idle_since:
                idle_since = now
            elif now - idle_since > IDLE_TIMEOUT_S or now > deadline:
                break
            idle(0)
        # If messages never came, the rate is over the time that data flowed, not the wait for more.
        end = idle_since if received < count and idle_since else time.perf_counter()
        conn.send(
            (
                "result",
                {
                    "received": received,
                    "measured": received - first,
                    "elapsed_s": end - start,
                    "timed_out": received < count,
                    "cpu_s": time.process_time(),
                    "images": [_image_state(image) for image in sub.images],
                    "fast_path": fast_path_active(),
                },
            )
        )
        _await_parent(conn, "close", "subscriber", ctx.invoke if p.invoker else None)


def _invoke_then_poll(invoke: Callable[[], int], poll: Callable[[], int]) -> int:
    invoke()
    return poll()


def run_throughput(
    directory: Path,
    stream_id: int,
    size: int,
    count: int,
    time_limit_s: float,
    *,
    driver_pid: int | None,
    channel: str = CHANNEL,
    assemble: bool = False,
    wait: str = "spin",
    invoker: bool = False,
    pure: bool = False,
    block: bool = False,
    drain: bool = False,
) -> dict[str, Any]:
    """One publisher process -> one subscriber process; ``driver_pid`` None means the publisher embeds it
    (or, with ``invoker``, that each side embeds its own and runs it from its loop). ``pure``: both clients
    run the pure-Python log path; ``block``: the subscriber block-polls."""
    params = ThroughputParams(
        str(directory),
        stream_id,
        size,
        count,
        time_limit_s,
        driver_pid is None,
        channel,
        assemble,
        wait,
        invoker,
        pure,
        block,
        drain,
    )
    with _client_environment(pure), Children() as children:
        sub = children.start("slipstream-subscriber", subscriber_worker, params)
        pub = children.start("slipstream-publisher", publisher_worker, params)
        sub.expect("ready", CONNECT_TIMEOUT_S)
        pub.expect("ready", CONNECT_TIMEOUT_S)
        driver_cpu = process_cpu_s(driver_pid) if driver_pid is not None else float("nan")
        driver_wall = time.perf_counter()
        pub.send("go")
        wait = time_limit_s + CONNECT_TIMEOUT_S
        pub_result = pub.expect("result", wait)
        if drain:
            sub.send("drain")
        sub_result = sub.expect("result", wait)
        if driver_pid is not None:
            driver_cpu = process_cpu_s(driver_pid) - driver_cpu
        driver_wall = time.perf_counter() - driver_wall
        # The subscriber goes first: with an embedded driver, the publisher's exit takes the driver along.
        sub.send("close")
        sub.finish()
        pub.send("close")
        pub.finish()
    if sub_result["measured"] <= 0 or sub_result["elapsed_s"] <= 0:
        raise BenchError(f"throughput run measured nothing: {sub_result}")
    msgs_per_s = sub_result["measured"] / sub_result["elapsed_s"]
    return {
        "params": asdict(params),
        "driver": "invoker mode, one per side"
        if invoker
        else ("embedded in publisher" if driver_pid is None else "standalone process"),
        "msgs_per_s": msgs_per_s,
        "mb_per_s": msgs_per_s * size / 1e6,
        "driver_cpu_s": driver_cpu,
        "driver_wall_s": driver_wall,
        "publisher": pub_result,
        "subscriber": sub_result,
    }


# -- latency --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyParams:
    directory: str
    ping_stream: int
    pong_stream: int
    size: int
    warmup: int
    samples: int
    time_limit_s: float
    pong_wait: str = "spin"
    """``spin`` (busy poll), ``yield`` (sched_yield when idle) or ``asyncio`` (waits in an event loop)."""
    ping_wait: str = "spin"
    """How the ping side waits for its pong: ``spin`` or ``yield``."""
    gap_s: float = 0.0
    """Pause between pings, long enough for an asyncio pong side to park in its back-off."""
    ping_channel: str = CHANNEL
    pong_channel: str = CHANNEL
    invoker: bool = False
    """Each side embeds its own driver in invoker mode (``<directory>-ping``, ``<directory>-pong``) and
    runs its duty cycle from the polling loop: no driver thread or process, two processes in all."""


def _latency_context(p: LatencyParams, side: str) -> Context:
    return _invoker_context(f"{p.directory}-{side}") if p.invoker else Context(p.directory, driver="external")


def _offer_until(
    offer: Callable[[memoryview | bytes], int],
    message: memoryview | bytes,
    deadline: float,
    invoke: Callable[[], int] | None = None,
) -> None:
    while (result := offer(message)) < 0:
        if invoke is not None:
            invoke()
        if result not in (BACK_PRESSURED, ADMIN_ACTION, NOT_CONNECTED):
            raise BenchError(f"offer failed: {result_name(result)}")
        if time.perf_counter() > deadline:
            raise BenchError(f"offer still refused at the deadline: {result_name(result)}")


def pinger_worker(conn: Connection, p: LatencyParams) -> None:
    """Sends a ping, busy-polls for its pong, records the round trip; warm-up rounds are not kept."""
    with _latency_context(p, "ping") as ctx:
        sub = ctx.add_subscription(p.pong_channel, p.pong_stream)
        pub = ctx.add_exclusive_publication(p.ping_channel, p.ping_stream)
        invoke = ctx.invoke if p.invoker else None
        send_now = ctx.send_now if p.invoker else None
        _wait_connected(time.monotonic() + CONNECT_TIMEOUT_S, pub, sub, invoke)
        conn.send(("ready", None))
        _await_parent(conn, "go", "pinger", invoke)
        offer, poll, clock, gap = pub.offer, sub.poll, time.perf_counter_ns, p.gap_s
        idle = _idler(p.ping_wait) if invoke is None else (lambda work: None)
        message = bytes(p.size)
        total = p.warmup + p.samples
        rtts: list[int] = []
        deadline = time.perf_counter() + p.time_limit_s
        deadline_ns = time.perf_counter_ns() + int(p.time_limit_s * 1e9)
        for i in range(total):
            if gap:
                time.sleep(gap)
            t0 = clock()
            if offer(message) < 0:
                _offer_until(offer, message, deadline, invoke)
            if send_now is not None:
                send_now(pub)  # the driver sends the ping now
            while not poll(_noop, 1):
                if clock() > deadline_ns:
                    break
                if invoke is not None:
                    invoke()
                idle(0)
            t1 = clock()
            if t1 > deadline_ns:
                break
            if i >= p.warmup:
                rtts.append(t1 - t0)
        conn.send(("result", {"rtt_ns": rtts, "timed_out": len(rtts) < p.samples}))
        _await_parent(conn, "close", "pinger", invoke)


def ponger_worker(conn: Connection, p: LatencyParams) -> None:
    """Echoes every ping from inside the fragment handler (zero copy until the offer)."""
    with _latency_context(p, "pong") as ctx:
        sub = ctx.add_subscription(p.ping_channel, p.ping_stream)
        pub = ctx.add_exclusive_publication(p.pong_channel, p.pong_stream)
        invoke = ctx.invoke if p.invoker else None
        _wait_connected(time.monotonic() + CONNECT_TIMEOUT_S, pub, sub, invoke)
        offer = pub.offer
        total = p.warmup + p.samples
        deadline = time.perf_counter() + CONNECT_TIMEOUT_S + p.time_limit_s

        def echo(payload: memoryview, header: Header) -> None:
            if offer(payload) < 0:
                _offer_until(offer, payload, deadline, invoke)
            if invoke is not None:
                ctx.send_now(pub)  # the pong leaves now, not at the next duty cycle

        conn.send(("ready", None))
        wall, cpu = time.perf_counter(), time.process_time()
        if p.pong_wait == "asyncio":
            echoed = asyncio.run(_pong_async(conn, sub, echo, total, deadline))
        else:
            echoed = _pong_spin(conn, sub, echo, total, deadline, yielding=p.pong_wait == "yield", invoke=invoke)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        conn.send(("result", {"echoed": echoed, "wait": p.pong_wait, "cpu_s": cpu, "wall_s": wall}))
        _await_parent(conn, "close", "ponger", invoke)


def _await_parent(
    conn: Connection,
    message: str,
    who: str,
    invoke: Callable[[], int] | None,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> None:
    """Wait for the parent's ``message``. With an invoker-mode driver, keep invoking it meanwhile: the
    other side still needs our data, status messages and replies."""
    if invoke is not None:
        deadline = time.monotonic() + timeout_s
        while not conn.poll(0.0002):
            invoke()
            if time.monotonic() > deadline:
                raise BenchError(f"{who}: no {message!r} from the parent within {timeout_s:.1f} s")
    expect(conn, message, timeout_s, who)


def _pong_spin(
    conn: Connection,
    sub: Subscription,
    echo: Callable[[memoryview, Header], None],
    total: int,
    deadline: float,
    *,
    yielding: bool,
    invoke: Callable[[], int] | None = None,
) -> int:
    poll, limit = sub.poll, LATENCY_FRAGMENT_LIMIT
    idle = _idler("yield" if yielding else "spin")
    echoed = idle_count = 0
    while echoed < total:
        if invoke is not None:
            invoke()  # sends the last echo, takes in the next ping
        got = poll(echo, limit)
        if got:
            echoed += got
            continue
        idle(0)
        idle_count += 1
        if idle_count & 0x3FFF == 0 and (time.perf_counter() > deadline or stop_requested(conn)):
            break
    return echoed


async def _pong_async(
    conn: Connection, sub: Subscription, echo: Callable[[memoryview, Header], None], total: int, deadline: float
) -> int:
    """Wait the way an asyncio application would: through the client's helper if there is one,
    else a loop of our own with the same shape (yield to the loop a few times, then back off)."""
    echoed = 0
    limit = LATENCY_FRAGMENT_LIMIT
    while echoed < total:
        remaining = deadline - time.perf_counter()
        if remaining <= 0 or stop_requested(conn):
            break
        timeout_s = min(remaining, 0.2)
        if POLL_ASYNC is not None:
            got = await POLL_ASYNC(sub, echo, limit, timeout_s=timeout_s)
        else:
            got = await _fallback_poll_async(sub, echo, limit, timeout_s)
        echoed += got
    return echoed


async def _fallback_poll_async(
    sub: Subscription, echo: Callable[[memoryview, Header], None], limit: int, timeout_s: float
) -> int:
    deadline = time.perf_counter() + timeout_s
    spins, sleep_s = 0, 5e-5
    while not (got := sub.poll(echo, limit)):
        if time.perf_counter() > deadline:
            return 0
        if spins < 20:
            spins += 1
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(sleep_s)
            sleep_s = min(sleep_s * 2, 1e-3)
    return got


def run_latency(
    directory: Path,
    ping_stream: int,
    size: int,
    warmup: int,
    samples: int,
    time_limit_s: float,
    *,
    pong_wait: str = "spin",
    ping_wait: str = "spin",
    gap_s: float = 0.0,
    driver_pid: int | None = None,
    ping_channel: str = CHANNEL,
    pong_channel: str = CHANNEL,
    invoker: bool = False,
) -> dict[str, Any]:
    """Ping-pong between two processes on two streams (and, over UDP, two channels); returns the kept
    round-trip samples."""
    params = LatencyParams(
        str(directory),
        ping_stream,
        ping_stream + 1,
        size,
        warmup,
        samples,
        time_limit_s,
        pong_wait,
        ping_wait,
        gap_s,
        ping_channel,
        pong_channel,
        invoker,
    )
    with Children() as children:
        ponger = children.start("slipstream-ponger", ponger_worker, params)
        pinger = children.start("slipstream-pinger", pinger_worker, params)
        ponger.expect("ready", CONNECT_TIMEOUT_S)
        pinger.expect("ready", CONNECT_TIMEOUT_S)
        driver_cpu = process_cpu_s(driver_pid) if driver_pid is not None else float("nan")
        pinger.send("go")
        wait = time_limit_s + CONNECT_TIMEOUT_S
        ping_result = pinger.expect("result", wait)
        if driver_pid is not None:
            driver_cpu = process_cpu_s(driver_pid) - driver_cpu
        if ping_result["timed_out"]:
            ponger.send("stop")
        pong_result = ponger.expect("result", wait)
        pinger.send("close")
        ponger.send("close")
        pinger.finish()
        ponger.finish()
    if not ping_result["rtt_ns"]:
        raise BenchError("latency run kept no samples")
    return {
        "params": asdict(params),
        "pong_wait_impl": {"asyncio": ASYNC_WAIT, "yield": "YieldingIdleStrategy"}.get(pong_wait, "busy spin"),
        "rtt_ns": ping_result["rtt_ns"],
        "timed_out": ping_result["timed_out"],
        "ponger": pong_result,
        "driver_cpu_s": driver_cpu,
    }


@contextlib.contextmanager
def standalone_driver(
    directory: Path, idle_strategy: str = "backoff", profile_path: Path | None = None, *, udp_gso: bool = True
) -> Any:
    """A media driver in its own process for the duration of the block; yields its pid."""
    params = DriverParams(str(directory), idle_strategy, None if profile_path is None else str(profile_path), udp_gso)
    with Children() as children:
        driver = children.start("slipstream-driver", driver_worker, params)
        pid = driver.expect("ready", CONNECT_TIMEOUT_S)
        try:
            yield pid
        finally:
            driver.process.terminate()  # SIGTERM: the driver's handler stops it cleanly
            with contextlib.suppress(BenchError):
                driver.expect("result", 10.0)
            driver.finish()


# -- the IPC suite --------------------------------------------------------------------------------


def run_suite(plan: Plan, shm: Path, zdir: Path, *, quick: bool, only: str | None) -> SuiteResult:
    """slipstream ``aeron:ipc`` vs pyzmq ``ipc://``: throughput (standalone and embedded driver) and
    latency in four waiting styles. ``shm`` is a fresh directory under /dev/shm, ``zdir`` one for sockets."""
    from . import zmq_peer

    result = SuiteResult()
    notes, raw = result.notes, result.raw
    do_throughput = only in (None, "throughput")
    do_latency = only in (None, "latency")
    latency_modes = (
        # key, slipstream pong wait, slipstream ping wait, pyzmq REP wait, gap between pings, samples
        ("spin", "spin", "spin", "blocking", 0.0, plan.samples),
        ("yield", "yield", "yield", None, 0.0, plan.samples),  # pyzmq: the blocking run stands in
        ("asyncio", "asyncio", "spin", "asyncio", 0.0, plan.samples),
        ("asyncio-parked", "asyncio", "spin", "asyncio", plan.parked_gap_s, plan.parked_samples),
    )

    def counts(gap: float, samples: int) -> tuple[int, int, int, float]:
        """Size, warm-up, samples and time limit of a latency run, the same for both contenders."""
        return plan.latency_size, plan.warmup if not gap else min(plan.warmup, 20), samples, plan.time_limit_s

    tp: dict[str, list[dict[str, Any]]] = {}
    stream = 1000
    driver_dir = shm / "driver"
    with standalone_driver(driver_dir) as driver_pid:
        idle_s = 0.3 if quick else 1.0
        idle_cpu = process_cpu_s(driver_pid)
        time.sleep(idle_s)
        idle_cpu = (process_cpu_s(driver_pid) - idle_cpu) / idle_s
        raw["driver_idle_cpu_fraction"] = idle_cpu
        notes.append(f"standalone driver, idle with no clients: {idle_cpu * 100:.0f}% of a core")
        if do_latency:
            for key, pong_wait, ping_wait, _, gap, samples in latency_modes:
                progress(f"ipc: slipstream latency, pong {key}")
                raw[f"slipstream.latency.{key}"] = run_latency(
                    driver_dir,
                    stream,
                    *counts(gap, samples),
                    pong_wait=pong_wait,
                    ping_wait=ping_wait,
                    gap_s=gap,
                    driver_pid=driver_pid,
                )
                stream += 10
    if do_latency:
        for key, _, _, rep_wait, gap, samples in latency_modes:
            if rep_wait is None:
                continue
            progress(f"ipc: pyzmq REQ/REP latency, REP {rep_wait}{' parked' if gap else ''}")
            raw[f"pyzmq.latency.{key}"] = zmq_peer.run_latency(
                f"ipc://{zdir}/rr-{key}.sock", *counts(gap, samples), rep_wait=rep_wait, gap_s=gap
            )
    # Throughput in rounds that interleave the contenders, so a noisy neighbour or a frequency
    # change hits both alike; each cell reports the median round.
    for round_no in range(plan.rounds if do_throughput else 0):
        tag = f"ipc round {round_no + 1}/{plan.rounds}"
        with standalone_driver(driver_dir) as driver_pid:
            for size in plan.sizes:
                progress(f"{tag}: slipstream throughput {size} B, standalone driver")
                tp.setdefault(f"slipstream.throughput.{size}B.standalone", []).append(
                    run_throughput(driver_dir, stream, size, plan.messages, plan.time_limit_s, driver_pid=driver_pid)
                )
                stream += 10
                progress(f"{tag}: slipstream throughput {size} B, standalone driver, pure-Python clients")
                tp.setdefault(f"slipstream.throughput.{size}B.pure", []).append(
                    run_throughput(
                        driver_dir, stream, size, plan.messages, plan.time_limit_s, driver_pid=driver_pid, pure=True
                    )
                )
                stream += 10
            size = plan.sizes[0]
            progress(f"{tag}: slipstream throughput {size} B, standalone driver, block poll")
            tp.setdefault(f"slipstream.throughput.{size}B.block", []).append(
                run_throughput(
                    driver_dir, stream, size, plan.messages, plan.time_limit_s, driver_pid=driver_pid, block=True
                )
            )
            stream += 10
            drain_count = min(plan.messages, DRAIN_MESSAGES)
            for kind in ("poll", "block"):
                progress(f"{tag}: slipstream drain of {drain_count} x {size} B, {kind}")
                tp.setdefault(f"slipstream.drain.{size}B.{kind}", []).append(
                    run_throughput(
                        driver_dir,
                        stream,
                        size,
                        drain_count,
                        plan.time_limit_s,
                        driver_pid=driver_pid,
                        channel=DRAIN_CHANNEL,
                        block=kind == "block",
                        drain=True,
                    )
                )
                stream += 10
        size = plan.sizes[0]
        progress(f"{tag}: slipstream throughput {size} B, driver embedded in the publisher")
        tp.setdefault(f"slipstream.throughput.{size}B.embedded", []).append(
            run_throughput(
                shm / f"embedded-{round_no}", stream, size, plan.messages, plan.time_limit_s, driver_pid=None
            )
        )
        stream += 10
        for size in plan.sizes:  # no slipstream driver runs during these
            progress(f"{tag}: pyzmq PUSH/PULL throughput {size} B")
            tp.setdefault(f"pyzmq.throughput.{size}B", []).append(
                zmq_peer.run_throughput(
                    f"ipc://{zdir}/tp-{size}-{round_no}.sock", size, plan.messages, plan.time_limit_s
                )
            )
    raw.update(tp)

    if do_throughput:
        for size in plan.sizes:
            zmq_runs = tp[f"pyzmq.throughput.{size}B"]
            wheres = {
                "standalone": f"standalone driver, {'C fast path' if fast_path_active() else 'pure Python'}",
                "pure": "standalone driver, pure-Python clients",
                "block": "standalone driver, block poll, counted per block",
                "embedded": "driver embedded in publisher",
            }
            for driver, where in wheres.items():
                runs = tp.get(f"slipstream.throughput.{size}B.{driver}")
                if not runs:
                    continue
                result.rows.append(
                    throughput_row(
                        f"throughput.{size}B.{driver}",
                        f"throughput {size_label(size)} ({where}) vs PUSH/PULL",
                        runs,
                        zmq_runs,
                        suite="ipc",
                    )
                )
                notes.append(refusals_note(f"throughput {size_label(size)} {driver}", runs))
            notes.append(zmq_spread_note(f"throughput {size_label(size)}", zmq_runs))
        size = plan.sizes[0]
        for kind, how in (("poll", "poll, a Python call per message"), ("block", "block poll, counted per block")):
            runs = tp.get(f"slipstream.drain.{size}B.{kind}")
            if runs:
                result.rows.append(
                    throughput_row(
                        f"drain.{size}B.{kind}",
                        f"backlog drain {size_label(size)} ({how}) vs PUSH/PULL throughput",
                        runs,
                        tp[f"pyzmq.throughput.{size}B"],
                        suite="ipc",
                    )
                )
    if do_latency:
        titles = {
            "spin": "busy-spin poll vs REQ/REP",
            "yield": "poll + sched_yield (YieldingIdleStrategy) vs REQ/REP",
            "asyncio": f"asyncio pong [{ASYNC_WAIT}] vs zmq.asyncio REP",
            "asyncio-parked": (
                f"asyncio pong parked, ping every {plan.parked_gap_s * 1e3:g} ms [{ASYNC_WAIT}] vs zmq.asyncio REP"
            ),
        }
        for key, title in titles.items():
            # a yielding pyzmq REQ/REP is the blocking one: it sleeps in the kernel either way
            slip, zmq = raw[f"slipstream.latency.{key}"], raw[f"pyzmq.latency.{'spin' if key == 'yield' else key}"]
            rows, note = latency_rows(
                f"latency.{plan.latency_size}B.{key}", title, slip, zmq, suite="ipc", size=plan.latency_size
            )
            result.rows.extend(rows)
            notes.append(f"latency {key}: {note}")
    return result
