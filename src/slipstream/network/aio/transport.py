"""The transport under the network layer: shared driver contexts, channel URIs, and the parked poller.

Every server and client of a process that names the same driver directory shares one
:class:`~slipstream.Context` (counted references), as Aeron shares one media driver per host: an
embedded driver is not started per client, and closing one client never stops the driver another
still uses. Only the public transport API (and its doorbells) is used here.
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from ... import ChannelUri, Context, DriverConfig
from ...client import Registration, registered
from ...files.doorbell import Doorbell, wait_any
from ..config import LOCALHOST_ALIASES, WILDCARD_ADDRESSES

__all__ = [
    "HANDSHAKE_IPC_REPLY_STREAM",
    "HANDSHAKE_IPC_STREAM",
    "HANDSHAKE_STREAM",
    "IdleBackoff",
    "acquire_context",
    "input_pending",
    "invoke",
    "ipc_channel",
    "parse_source",
    "registered_pair",
    "release_context",
    "udp_channel",
]

HANDSHAKE_STREAM = 0x5EED_0000
"""Stream id of every server's UDP handshake channel (outside the 1-65533 the server allocates)."""
HANDSHAKE_IPC_STREAM = 0x5EED_0000 + 0x10000
"""Base stream id of IPC handshakes: + the server's UDP port (0 for ``bind_ipc``), so several servers
on one driver each have their own."""
HANDSHAKE_IPC_REPLY_STREAM = 0x5EED_0000 + 0x20000
"""Base stream id of IPC handshake answers (+ port, as above)."""

IDLE_DATAGRAM_MAX_NS = 1_000_000_000
"""The longest period of an idle stream's heartbeats and status messages in drivers the network layer
starts (Aeron: 100 ms and 200 ms; see ``DriverConfig.idle_heartbeat_max_ns``)."""

_lock = threading.Lock()
_contexts: dict[tuple[str, str], tuple[Context, int]] = {}


def _key(directory: str | os.PathLike[str] | None, driver: str) -> tuple[str, str]:
    return (os.fspath(directory) if directory is not None else "", driver)


def acquire_context(directory: str | os.PathLike[str] | None, driver: str) -> Context:
    """This process's context for ``directory`` (started on first use; released by count)."""
    key = _key(directory, driver)
    with _lock:
        entry = _contexts.get(key)
        if entry is not None:
            _contexts[key] = (entry[0], entry[1] + 1)
            return entry[0]
        # The server allocates session ids 1..65535: keep a driver we start away from them.
        invoker = driver == "invoker"
        config = DriverConfig(
            reserved_session_id_low=-1,
            reserved_session_id_high=65535,
            threading_mode="invoker" if invoker else DriverConfig().threading_mode,
            # An idle connection's streams heartbeat and acknowledge less and less often (up to once a
            # second): each datagram costs both hosts a system call and wakes an idle peer.
            idle_heartbeat_max_ns=IDLE_DATAGRAM_MAX_NS,
            idle_status_message_max_ns=IDLE_DATAGRAM_MAX_NS,
        )
        context = Context(
            Path(directory) if directory is not None else None,
            driver="embedded" if invoker else driver,  # type: ignore[arg-type]
            driver_config=config,
        )
        _contexts[key] = (context, 1)
        return context


def release_context(context: Context) -> None:
    """Drop one reference; the last closes the context (and its embedded driver)."""
    with _lock:
        for key, (held, count) in list(_contexts.items()):
            if held is context:
                if count > 1:
                    _contexts[key] = (held, count - 1)
                    return
                del _contexts[key]
                _last_invoke.pop(id(context), None)
                break
        else:
            return
    context.close()


async def release_context_drained(context: Context) -> None:
    """``release_context``, but when this is the last reference to an embedded driver, the closed
    publications finish first while the event loop goes on (an await between steps): the synchronous
    drain in ``Context.close`` would stop every other endpoint of the loop for up to a second, a server
    in this process among them, which then could not even acknowledge our end of stream."""
    with _lock:
        last = any(held is context and count == 1 for held, count in _contexts.values())
    if last:
        for _ in context.drain_steps():
            context.invoke()
            await asyncio.sleep(DRAIN_STEP_S)
    release_context(context)


DRAIN_STEP_S = 5e-4
"""The pause between an asyncio drain's steps."""


_last_invoke: dict[int, float] = {}
"""Per invoker-mode context: the monotonic time before which ``invoke`` skips its duty cycle."""
INVOKE_GAP_S = 2e-4
"""Coroutines waiting on one invoker-mode context share its duty cycles: at most one per this gap."""


def invoke(context: Context) -> int:
    """Run an invoker-mode driver's duty cycle unless one ran within ``INVOKE_GAP_S``, or within as
    long as the last one took (many clients connecting at once in one process would otherwise each
    run the same driver over and over, and a driver with many streams, whose cycle takes long, would
    leave the application no time to answer what it brings)."""
    if not context.is_invoker:
        return 0
    now = time.monotonic()
    key = id(context)
    if now < _last_invoke.get(key, 0.0):
        return 0
    work = context.invoke()
    end = time.monotonic()
    _last_invoke[key] = end + max(INVOKE_GAP_S - (end - now), end - now)
    return work


A = TypeVar("A")
B = TypeVar("B")


async def registered_pair(context: Context, first: Registration[A], second: Registration[B]) -> tuple[A, B]:
    """A connection's two streams, both commands sent before either is awaited (the driver answers
    them in one cycle), awaited while the event loop goes on: blocking ``add_*`` calls of many
    clients connecting at once would add up to seconds in one turn of the loop, long enough for the
    first connections to expire. If either fails or the caller is cancelled, neither stays."""

    def step() -> int:
        return invoke(context)

    try:
        return await registered(first, invoke=step), await registered(second, invoke=step)
    except BaseException:
        first.cancel()
        second.cancel()
        raise


def host_port(host: str, port: int) -> str:
    """``host:port`` for a channel URI; IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def udp_channel(**params: str | int | bool | None) -> str:
    """A validated ``aeron:udp`` URI (``control_mode`` is written ``control-mode`` and so on)."""
    clean = {name.replace("_", "-"): value for name, value in params.items() if value is not None}
    return str(ChannelUri("udp", clean))


IPC_MTU = 65504
"""MTU of a connection's IPC streams: nothing travels over a network, so records up to 64 KiB are one
frame (fewer fragments to write and reassemble; small messages still share a record)."""


def ipc_channel(**params: str | int | bool | None) -> str:
    """A validated ``aeron:ipc`` URI."""
    clean = {name.replace("_", "-"): value for name, value in params.items() if value is not None}
    return str(ChannelUri("ipc", clean))


def parse_source(source_identity: str) -> tuple[str | None, int | None]:
    """``(address, port)`` of an image's ``host:port`` / ``[v6]:port`` source; IPv4-mapped IPv6
    addresses are shown as IPv4 (a dual-stack socket reports IPv4 peers that way)."""
    text = source_identity.strip()
    host, _, port_text = text.rpartition(":")
    if not host:
        return None, None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:") :]
    try:
        port = int(port_text)
    except ValueError:
        port = None
    return host, port


def listen_host(address: str, *, ipv4: bool, ipv6: bool) -> str:
    """The host a server binds for ``address`` (the seed's wildcards and localhost aliases)."""
    if address in WILDCARD_ADDRESSES:
        return "::" if ipv6 else "0.0.0.0"
    if address in LOCALHOST_ALIASES:
        return "::1" if ipv6 and not ipv4 else "127.0.0.1" if address != "::1" else "::1"
    return address


def is_local_host(host: str) -> bool:
    """Loopback names and literals: candidates for automatic IPC."""
    return host in LOCALHOST_ALIASES or host.startswith("127.")


class IdleBackoff:
    """How an endpoint's poller waits when idle: yield for ``spin_s`` (at least ``spins`` times; every
    fourth yield also gives up the CPU, see :meth:`idle`), then pause from 50 us doubling to 1 ms, and
    after 20 ms without work pause up to 1 s, cut short by the poller to the next timer of its
    connections and of an invoker-mode driver's streams (heartbeats, status messages), or to 1 ms while
    such a driver has data in flight (each wake-up of an idle endpoint is a cold start that costs far
    more on a loaded machine than on an idle one). A pause is spent parked on the doorbells of the logs
    the poller reads (``park``: a writer rings, so a message is handled within microseconds, not after
    asyncio's millisecond-rounded sleep) or, when some image has no parking slot, asleep (``idle``, at
    most 100 ms). :meth:`kick` ends a pause at once: the application just sent something, and its
    answer should be polled for promptly."""

    def __init__(
        self,
        spins: int = 10,
        spin_s: float = 1e-3,
        nap_s: float = 2e-5,
        min_sleep_s: float = 5e-5,
        max_sleep_s: float = 1e-3,
        deep_sleep_s: float = 1.0,
        deep_after_s: float = 0.02,
    ) -> None:
        self.spins = spins
        self.spin_s = spin_s
        self.nap_s = nap_s
        self.min_sleep_s = min_sleep_s
        self.max_sleep_s = max_sleep_s
        self.deep_sleep_s = deep_sleep_s
        self.deep_after_s = deep_after_s
        self._count = 0
        self._sleep_s = min_sleep_s
        self._idle_since: float | None = None
        self._spin_until = 0.0
        self._waiter: asyncio.Future[bool | None] | None = None
        self.parked = False
        """True while waiting in ``park`` (on the doorbells)."""

    def reset(self) -> None:
        """Work was done: start over with the short waits."""
        self._count = 0
        self._sleep_s = self.min_sleep_s
        self._idle_since = None
        self._spin_until = 0.0

    def kick(self) -> None:
        """Reset the back-off and end a pause in progress."""
        self.reset()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def next_pause(self, now_s: float) -> float | None:
        """The pause the next wait takes (and the back-off moves on), or None while it only yields
        (``idle`` does that); ``now_s`` is the caller's monotonic time."""
        if self._count < self.spins or now_s < self._spin_until:
            return None
        if self._idle_since is None:
            self._idle_since = now_s
        if now_s - self._idle_since >= self.deep_after_s:
            return self.deep_sleep_s
        pause = self._sleep_s
        self._sleep_s = min(pause * 2, self.max_sleep_s)
        return pause

    async def park(self, doorbells: Sequence[Doorbell], pause_s: float, inputs: Sequence[int] = ()) -> str:
        """A pause of up to ``pause_s`` on ``doorbells`` and on the readable descriptors ``inputs`` (an
        invoker-mode driver's input: only our invoke takes it in, so nobody rings for it). Returns what
        ended it: ``"timeout"``, ``"rung"``, ``"input"`` or ``"kick"``.

        The caller has set its parked bytes and checked its images once more after that (the parking
        protocol)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool | None] = loop.create_future()
        self._waiter = waiter
        self.parked = True
        woke: list[int] = []

        def on_input(fd: int) -> None:
            woke.append(fd)
            _wake(waiter)

        for fd in inputs:
            loop.add_reader(fd, on_input, fd)
        try:
            result = await wait_any(doorbells, pause_s, waiter)
        finally:
            for fd in inputs:
                loop.remove_reader(fd)
            self.parked = False
            self._waiter = None
        if result is None:
            return "input" if woke else "kick"
        return "rung" if result else "timeout"

    async def idle(self, now_s: float, *, nap: bool = True) -> None:
        """Wait one step of the back-off without doorbells: yield, or sleep the next pause. ``nap``:
        an embedded driver thread shares our GIL, so spinning yields it some time; without one (an
        invoker-mode or standalone driver) a nap only delays the answer (Linux sleeps 50 us or more)."""
        pause = self.next_pause(now_s)
        if pause is not None:
            await self.sleep(pause)
            return
        # asyncio cannot sleep less than about a millisecond (its selector waits in milliseconds),
        # so right after work (or a kick) the poller only yields, for ``spin_s``: an answer that
        # follows closely is polled within microseconds, not a millisecond later.
        if self._count == 0:
            self._spin_until = now_s + self.spin_s
        self._count += 1
        if nap and self._count > self.spins:
            # A short blocking nap lets the driver's thread (an embedded driver shares our GIL)
            # move the data we are waiting for; a bare yield would keep the GIL from it.
            time.sleep(self.nap_s)
        elif not nap and not self._count & 3:
            # Every fourth spin, give the CPU to a process waiting for it: the peer we just sent to is
            # woken on our CPU (the kernel puts a wakee near its waker) and would otherwise wait out our
            # millisecond of spinning. A parked receiver's one-way latency: 2.1 -> 1.1 ms over IPC, 2.1
            # -> 1.3 ms over UDP (/tmp probe, 30 ms apart); yielding on every spin cost a busy UDP round
            # trip 8 %, every fourth spin nothing measurable.
            os.sched_yield()
        await asyncio.sleep(0)

    async def sleep(self, pause_s: float) -> None:
        """Sleep ``pause_s`` (a kick ends it): the pause of a poller that cannot park on doorbells."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool | None] = loop.create_future()
        self._waiter = waiter
        handle = loop.call_later(pause_s, _wake, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            self._waiter = None


HANDSHAKE_POLL_LIMIT = 256
"""Handshake packets a client or a server link takes per cycle; its handshake timers (retransmission,
expiry) run only once fewer were waiting, so a packet already in the log is never treated as missing."""

BUSY_CADENCE_NS = 1_000_000
"""How soon a connection with output waiting (back-pressure) wants its next duty cycle."""


def earliest(deadlines: Iterable[int | None], start: int | None) -> int | None:
    """The smallest of ``start`` and ``deadlines``, ignoring None (no timer running)."""
    best = start
    for deadline in deadlines:
        if deadline is not None and (best is None or deadline < best):
            best = deadline
    return best


def input_pending(fds: Sequence[int]) -> bool:
    """Whether any of ``fds`` is readable right now (a zero-timeout poll): input a duty cycle left unread."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _wake(waiter: asyncio.Future[bool | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
