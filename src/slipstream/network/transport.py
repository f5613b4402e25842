"""The transport under the network layer, as its adapters share it: driver contexts shared per process,
channel URIs, and :class:`Link`, which drives a machine over a publication and a subscription.

Every server and client of a process that names the same driver directory shares one
:class:`~slipstream.Context` (counted references, in a :class:`SharedContexts`), as Aeron shares one media
driver per host: an embedded driver is not started per client, and closing one client never stops the
driver another still uses. Only the public transport API is used here, and no event loop: the asyncio
adapter (``aio/``) and a blocking one drive the same links.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import ChannelUri, Context, DriverConfig
from ..client import (
    ADMIN_ACTION,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    DriverError,
    DriverLostError,
    ExclusivePublication,
    FragmentAssembler,
    Header,
    Subscription,
)
from ..files.directory import default_directory
from ..wire.constants import MTU_DEFAULT
from ..wire.positions import max_message_length
from .config import LOCALHOST_ALIASES, WILDCARD_ADDRESSES, ClientConfig, ServerConfig
from .errors import ClientError
from .events import HandshakeCompleted
from .tuning import endpoint_driver_config, warn_if_ignored

__all__ = [
    "DRAIN_STEP_S",
    "input_pending",
    "BUSY_CADENCE_NS",
    "HANDSHAKE_IPC_REPLY_STREAM",
    "HANDSHAKE_IPC_STREAM",
    "HANDSHAKE_POLL_LIMIT",
    "HANDSHAKE_STREAM",
    "IPC_MTU",
    "connection_ipc_channel",
    "HandshakeMachine",
    "Link",
    "SharedContexts",
    "addresses_of",
    "client_streams",
    "close_quietly",
    "earliest",
    "handshake_cycle",
    "host_port",
    "ipc_channel",
    "listen_host",
    "parse_source",
    "resolve_host",
    "shared_contexts",
    "udp_channel",
]

log = logging.getLogger("slipstream.network")

HANDSHAKE_STREAM = 0x5EED_0000
"""Stream id of every server's UDP handshake channel (outside the 1-65533 the server allocates)."""
HANDSHAKE_CLIENT_TERM_LENGTH = 64 * 1024
"""Term length of a client's UDP handshake publication, and the largest a server's handshake endpoint
accepts in a SETUP: a handshake is a few hundred bytes, and a stranger's SETUP costs the server's driver
one image log of three such terms (196 KiB of shared memory at most)."""
HANDSHAKE_CLIENT_MTU = MTU_DEFAULT
"""The MTU of that publication, named in its channel rather than left to the driver: a driver configured for
larger datagrams (jumbo frames, 9 KiB) would refuse a publication whose MTU exceeds its terms' largest message."""
HANDSHAKE_IMAGES = 160
"""Images a server's UDP handshake endpoint holds at once (draining ones included; a closed one gives
its log back about a second after its end of stream): with the term length above, a flood of forged
SETUPs costs its driver at most 160 x 196 KiB = 30.6 MiB of shared memory."""
HANDSHAKE_IMAGES_PER_ADDRESS = 128
"""Of those, images from one source address: one flooding host leaves room for the others."""
HANDSHAKE_IPC_STREAM = 0x5EED_0000 + 0x10000
"""Base stream id of IPC handshakes: + the server's UDP port (0 for ``bind_ipc``), so several servers
on one driver each have their own."""
HANDSHAKE_IPC_REPLY_STREAM = 0x5EED_0000 + 0x20000
"""Base stream id of IPC handshake answers (+ port, as above)."""


@dataclass(slots=True)
class _Shared:
    context: Context
    references: int
    next_invoke_s: float = 0.0
    """The monotonic time before which ``invoke`` skips the driver's duty cycle (invoker mode)."""


INVOKE_GAP_S = 2e-4
"""Coroutines waiting on one invoker-mode context share its duty cycles: at most one per this gap."""


class SharedContexts:
    """This process's driver contexts by (directory, driver mode), started on first use and closed with
    their last reference (a ``unique_directory`` one is never shared). Thread-safe: endpoints on several
    event loops or threads may share one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared: dict[tuple[str, str], _Shared] = {}
        self._unique = itertools.count()

    def acquire(
        self, directory: str | os.PathLike[str] | None, driver: str, driver_config: DriverConfig | None = None
    ) -> Context:
        """The context for ``directory`` (started on first use; released by count). A driver started here runs
        ``driver_config`` combined with the network layer's settings; one already running is checked against
        it (see ``tuning``: a warning names what it runs otherwise)."""
        unique = driver_config is not None and driver_config.unique_directory
        if directory is None:
            directory = driver_config.directory if driver_config is not None else default_directory()
        key = (f"{os.fspath(directory)}\0{next(self._unique)}" if unique else os.fspath(directory), driver)
        with self._lock:
            entry = self._shared.get(key)
            if entry is not None:
                entry.references += 1
                context = entry.context
            else:
                context = Context(
                    Path(directory),
                    driver="embedded" if driver == "invoker" else driver,  # type: ignore[arg-type]
                    driver_config=endpoint_driver_config(driver_config, driver=driver),
                )
                self._shared[key] = _Shared(context, 1)
        if entry is not None or not context.is_embedded:
            warn_if_ignored(driver_config, context.directory, driver=driver)
        return context

    def acquire_for(self, config: ClientConfig | ServerConfig) -> Context:
        """:meth:`acquire` as an endpoint's config names its driver."""
        return self.acquire(config.driver_directory, config.driver, config.driver_config)

    def is_last(self, context: Context) -> bool:
        """Whether releasing ``context`` now would close it."""
        with self._lock:
            return any(entry.context is context and entry.references == 1 for entry in self._shared.values())

    def release(self, context: Context) -> None:
        """Drop one reference; the last closes the context (and its embedded driver)."""
        with self._lock:
            for key, entry in list(self._shared.items()):
                if entry.context is context:
                    if entry.references > 1:
                        entry.references -= 1
                        return
                    del self._shared[key]
                    break
            else:
                return
        context.close()

    def invoke(self, context: Context) -> int:
        """Run an invoker-mode driver's duty cycle unless one ran within ``INVOKE_GAP_S``, or within as
        long as the last one took (many clients connecting at once in one process would otherwise each
        run the same driver over and over, and a driver with many streams, whose cycle takes long, would
        leave the application no time to answer what it brings)."""
        if not context.is_invoker:
            return 0
        now = time.monotonic()
        with self._lock:
            entry = next((e for e in self._shared.values() if e.context is context), None)
        if entry is not None and now < entry.next_invoke_s:
            return 0
        work = context.invoke()
        end = time.monotonic()
        if entry is not None:
            entry.next_invoke_s = end + max(INVOKE_GAP_S - (end - now), end - now)
        return work


shared_contexts = SharedContexts()
"""The process's one table of shared driver contexts."""


def host_port(host: str, port: int) -> str:
    """``host:port`` for a channel URI; IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def udp_channel(**params: str | int | bool | None) -> str:
    """A validated ``aeron:udp`` URI (``control_mode`` is written ``control-mode`` and so on)."""
    clean = {name.replace("_", "-"): value for name, value in params.items() if value is not None}
    return str(ChannelUri("udp", clean))


IPC_MTU = 65504
"""MTU of a connection's IPC streams: nothing travels over a network, so records up to 64 KiB are one
frame (fewer fragments to write and reassemble; small messages still share a record). Less with the
smallest terms: see :func:`connection_ipc_channel`."""


def connection_ipc_channel(session_id: int, term_length: int) -> str:
    """A connection's IPC publication: its session, terms of ``term_length``, and :data:`IPC_MTU`, or a term's
    largest message when that is less (8 KiB for 64 KiB terms). A log takes no message above that, so a frame
    must not be longer either (Aeron's driver refuses such a publication, and so does ours)."""
    return ipc_channel(
        session_id=session_id, term_length=term_length, mtu=min(IPC_MTU, max_message_length(term_length))
    )


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


def resolve_host(host: str, *, ipv4: bool, ipv6: bool) -> str:
    """The address to connect to for ``host`` (a localhost alias, a literal, or a name looked up in the
    enabled family); ClientError when it cannot be, or is of a disabled family."""
    if host in LOCALHOST_ALIASES:
        if host == "::1" or (ipv6 and not ipv4):
            return "::1"
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        family = socket.AF_INET6 if ipv6 and not ipv4 else socket.AF_INET
        try:
            infos = socket.getaddrinfo(host, None, family, socket.SOCK_DGRAM)
        except OSError as exc:
            raise ClientError(f"cannot resolve {host!r}: {exc}") from None
        return str(infos[0][4][0])
    if address.version == 4 and not ipv4:
        raise ClientError(f"{host} is IPv4 but enable_ipv4 is False")
    if address.version == 6 and not ipv6:
        raise ClientError(f"{host} is IPv6 but enable_ipv6 is False")
    return host


def addresses_of(host: str, *, ipv4: bool, ipv6: bool) -> set[str]:
    """Every address ``host`` (as given to ``connect``) may stand for: a localhost alias is both loopbacks,
    a name also what it resolves to (when it does)."""
    if host in LOCALHOST_ALIASES:
        return {host, "127.0.0.1", "::1"}
    try:
        return {host, resolve_host(host, ipv4=ipv4, ipv6=ipv6)}
    except ClientError:
        return {host}


def client_streams(
    config: ClientConfig, done: HandshakeCompleted, host: str | None, port: int
) -> tuple[tuple[str, int], tuple[str, int]]:
    """A client connection's subscription and publication, ``(channel, stream id)`` each, as the server
    allocated them: over UDP the server's dynamic-MDC stream from its control port (reached from
    ``config.port`` when set) and ours to its port; over IPC (``host`` None) the two IPC streams."""
    if host is None:
        ipc = connection_ipc_channel(done.client_session_id, config.ipc_term_length)
        return (ipc_channel(session_id=done.server_session_id), done.server_stream_id), (ipc, done.client_stream_id)
    local = None if config.port is None else host_port("::" if ":" in host else "0.0.0.0", config.port)
    control = host_port(host, done.control_port)
    subscription = udp_channel(
        endpoint=local, control=control, control_mode="dynamic", session_id=done.server_session_id,
        reliable=None if config.reliable else False,
    )  # fmt: skip
    publication = udp_channel(
        endpoint=host_port(host, port), session_id=done.client_session_id, term_length=config.term_length,
        mtu=config.network_mtu, linger="500ms",
    )  # fmt: skip
    return (subscription, done.server_stream_id), (publication, done.client_stream_id)


def handshake_listen_channel(host: str, port: int) -> str:
    """A server's UDP handshake subscription: the port anyone may reach, so its images are budgeted."""
    return udp_channel(
        endpoint=host_port(host, port), max_term_length=HANDSHAKE_CLIENT_TERM_LENGTH,
        max_images=HANDSHAKE_IMAGES, max_images_per_source=HANDSHAKE_IMAGES_PER_ADDRESS,
    )  # fmt: skip


def handshake_channels(host: str, port: int, control_port: int) -> tuple[str, str]:
    """A connecting client's handshake subscription (the server's broadcast answers, from its control
    port) and publication (small terms: all the server's handshake endpoint accepts)."""
    answers = udp_channel(control=host_port(host, control_port), control_mode="dynamic")
    return answers, udp_channel(
        endpoint=host_port(host, port), term_length=HANDSHAKE_CLIENT_TERM_LENGTH, mtu=HANDSHAKE_CLIENT_MTU
    )


HANDSHAKE_POLL_LIMIT = 256
"""Handshake packets a client or a server link takes per cycle; its handshake timers (retransmission,
expiry) run only once fewer were waiting, so a packet already in the log is never treated as missing."""

BUSY_CADENCE_NS = 1_000_000
"""How soon a connection with output waiting (back-pressure) wants its next duty cycle."""
DRAIN_STEP_S = 5e-4
"""The pause between the steps of draining a driver that goes with the last endpoint (either adapter)."""


def earliest(deadlines: Iterable[int | None], start: int | None) -> int | None:
    """The smallest of ``start`` and ``deadlines``, ignoring None (no timer running)."""
    best = start
    for deadline in deadlines:
        if deadline is not None and (best is None or deadline < best):
            best = deadline
    return best


def close_quietly(*items: ExclusivePublication | Subscription) -> None:
    """Close transport streams, logging (not raising) what the driver refuses: used on paths that
    must go on (a connection ending, a server closing)."""
    for item in items:
        try:
            item.close()
        except DriverLostError:
            pass  # the driver that held it is gone: there is nothing left to close
        except DriverError as exc:
            log.warning("closing %r: %s", item, exc)


class Link:
    """A machine's transport: a subscription it polls and a publication it offers to, with an outbox that
    keeps, in order, what the publication refuses for now (back-pressure) until the next :meth:`send`.

    ``on_fragment`` receives each whole message; ``poll_limit`` bounds the fragments taken per
    :meth:`poll`; ``outbox_limit`` (None: unbounded) drops the oldest beyond it, for channels whose
    peers retry (handshakes)."""

    def __init__(
        self,
        publication: ExclusivePublication,
        subscription: Subscription,
        on_fragment: Callable[[memoryview, Header], None],
        *,
        poll_limit: int,
        outbox_limit: int | None = None,
    ) -> None:
        self.publication = publication
        self.subscription = subscription
        self.poll_limit = poll_limit
        self._assembler = FragmentAssembler(on_fragment)
        self.outbox: deque[bytes | bytearray] = deque(maxlen=outbox_limit)
        """What waits for room in the publication, oldest first."""
        self.back_pressured = False
        """The last :meth:`send` left something in the outbox because the publication was full."""

    def __len__(self) -> int:
        return len(self.outbox)

    def poll(self) -> int:
        """Take up to ``poll_limit`` fragments in; the number taken."""
        return self.subscription.poll(self._assembler, self.poll_limit)

    def send(self, packets: Iterable[bytes | bytearray] = ()) -> int:
        """Queue ``packets`` behind what waits and offer in order; the number the publication took. A
        closed publication (or one past its maximum position) drops what waits: nothing can take it."""
        outbox = self.outbox
        outbox.extend(packets)
        offered = 0
        self.back_pressured = False
        publication = self.publication
        while outbox:
            result = publication.offer(outbox[0])
            if result >= 0:
                outbox.popleft()
                offered += 1
            elif result == ADMIN_ACTION:
                continue
            elif result in (CLOSED, MAX_POSITION_EXCEEDED):
                outbox.clear()
            else:
                self.back_pressured = True
                break
        return offered

    def send_one(self, packet: bytes | bytearray) -> int:
        """:meth:`send` for one packet (a lone record): offered straight away when nothing waits before it."""
        if not self.outbox and self.publication.offer(packet) >= 0:
            self.back_pressured = False
            return 1
        return self.send((packet,))  # (refused: offered again there, and queued or dropped as it says)

    def close(self) -> None:
        """Close both streams (see :func:`close_quietly`)."""
        close_quietly(self.publication, self.subscription)


class HandshakeMachine(Protocol):
    """The handshake machines as :func:`handshake_cycle` drives them."""

    @property
    def deadline_ns(self) -> int | None: ...

    def handle_timer(self, now_ns: int) -> None: ...

    def messages_to_send(self) -> list[bytes]: ...


def handshake_cycle(link: Link, machine: HandshakeMachine, now_ns: int) -> int:
    """One duty cycle of a handshake machine (a server's link or a connecting client): packets in, then
    its timers, then its answers out; the work done. Timers run only once the input is drained: answers
    to every client share the channel, so under load the packet that keeps a handshake alive (or the
    answer a client waits for) may be waiting in the log behind others."""
    work = link.poll()
    deadline = machine.deadline_ns
    if deadline is not None and now_ns >= deadline and work < link.poll_limit:
        machine.handle_timer(now_ns)
    return work + link.send(machine.messages_to_send())


def input_pending(fds: Sequence[int]) -> bool:
    """Whether any of ``fds`` is readable right now (a zero-timeout poll): input a duty cycle left unread."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
