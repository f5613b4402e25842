"""The client-command adapter: bytes from clients' sockets in, commands out, responses queued.

Aeron's ``ClientCommandAdapter`` reads the to-driver ring buffer; here each client (a process, or a
context in one) has a Unix stream socket to the driver. This module accepts those connections,
answers the ``Hello`` handshake, decodes commands and queues the driver's messages per client,
flushing what each socket takes. It decides nothing about publications or subscriptions: the
conductor takes the commands (``take_commands``) and the clients that went away (``take_closed``)
and acts on them. Bad bytes from a client are data: the client is closed and the reason recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from ..files import aeron_commands as aeron
from ..files import commands as cmd
from ..files.broadcast import BroadcastTransmitter
from ..files.ringbuffer import ManyToOneRingBuffer, RingBufferCorruptError
from ..logbuffer.fastpath import ATOMICS
from .poller import SocketPoller

__all__ = ["AERON_CLIENTS_REFUSED", "AeronClientRefusal", "ClientCommandAdapter", "ClientSession"]

log = logging.getLogger("slipstream.driver")

_RECV_CHUNK = 64 * 1024
_MAX_OUTBOX = 4 * 1024 * 1024


@dataclass(slots=True, eq=False)
class ClientSession:
    """One connected client process (or context) as the driver sees it."""

    sock: socket.socket
    decoder: cmd.Decoder[cmd.ClientMessage]
    last_seen_ns: int
    client_id: int = 0
    pid: int = 0
    outbox: bytearray = field(default_factory=bytearray)
    publications: set[int] = field(default_factory=set)
    subscriptions: set[int] = field(default_factory=set)
    counters: dict[int, int] = field(default_factory=dict)
    """The client's own counters (``AddCounter``): registration id -> counter id."""
    closed: bool = False


class ClientCommandAdapter:
    """Clients' connections: accept, read and decode commands, queue and flush the driver's messages."""

    def __init__(
        self,
        listener: socket.socket,
        poller: SocketPoller[ClientSession | str | None],
        client_liveness_timeout_ns: int,
    ) -> None:
        self.listener = listener
        self._poller = poller
        self._liveness_timeout_ns = client_liveness_timeout_ns
        listener.setblocking(False)
        poller.register(listener.fileno(), None)
        self.clients: dict[int, ClientSession] = {}
        """Clients past the handshake, by client id."""
        self._next_client_id = 1
        self._commands: list[tuple[ClientSession, cmd.ClientMessage]] = []
        self._closed: list[tuple[ClientSession, str]] = []
        self.errors: list[str] = []
        """Clients' protocol errors for the driver's error log (the conductor takes them)."""
        self._unflushed: set[ClientSession] = set()
        """Clients with driver messages their socket did not take yet."""

    # -- input --------------------------------------------------------------------------------------

    def on_readable(self, what: ClientSession | None, now_ns: int) -> int:
        """The listener (``None``) or a client's socket is readable: accept, or read and decode."""
        return self._accept(now_ns) if what is None else self._read(what, now_ns)

    def _accept(self, now_ns: int) -> int:
        accepted = 0
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return accepted
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                return accepted
            sock.setblocking(False)
            client = ClientSession(sock, cmd.client_decoder(), now_ns)
            self._poller.register(sock.fileno(), client)
            accepted += 1

    def _read(self, client: ClientSession, now_ns: int) -> int:
        try:
            data = client.sock.recv(_RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            data = b""
        if not data:
            self.close(client, "connection closed")
            return 1
        client.last_seen_ns = now_ns
        try:
            messages = client.decoder.feed(data)
        except cmd.CommandError as exc:
            self.errors.append(f"client pid {client.pid} sent an invalid command: {exc}")
            self.close(client, f"protocol error: {exc}")
            return 1
        for message in messages:
            if client.closed:
                break
            if client.client_id == 0:
                self._hello(client, message)
            else:
                self._commands.append((client, message))
        return 1

    def _hello(self, client: ClientSession, message: cmd.ClientMessage) -> None:
        """A client's first message must be a compatible ``Hello``; the answer gives it its client id."""
        if not isinstance(message, cmd.Hello) or message.version != cmd.PROTOCOL_VERSION:
            self.close(client, "first message was not a compatible Hello")
            return
        client.client_id = self._next_client_id
        self._next_client_id += 1
        client.pid = message.pid
        self.clients[client.client_id] = client
        self.send(client, cmd.Welcome(os.getpid(), self._liveness_timeout_ns, client.client_id))

    @property
    def pending(self) -> bool:
        """Whether commands, closed clients or errors wait for the conductor (an idle cycle checks only this)."""
        return bool(self._commands or self._closed or self.errors)

    @property
    def has_closed(self) -> bool:
        """Whether ``take_closed`` would return any."""
        return bool(self._closed)

    def take_commands(self, limit: int | None = None) -> list[tuple[ClientSession, cmd.ClientMessage]]:
        """Commands decoded and not yet taken, in arrival order (a client's ``Hello`` excluded); at
        most ``limit`` (the rest wait for the next call)."""
        if limit is None or len(self._commands) <= limit:
            commands, self._commands = self._commands, []
            return commands
        commands = self._commands[:limit]
        del self._commands[:limit]
        return commands

    def take_closed(self) -> list[tuple[ClientSession, str]]:
        """Clients closed since the last call and why: the conductor releases what they held."""
        closed, self._closed = self._closed, []
        return closed

    # -- output -------------------------------------------------------------------------------------

    def send(self, client: ClientSession, message: cmd.DriverMessage) -> None:
        """Queue a message to a client and send what its socket takes now; a client that stopped
        reading (more than 4 MiB queued) is closed."""
        if client.closed:
            return
        client.outbox += cmd.encode(message)
        self._flush(client)
        if len(client.outbox) > _MAX_OUTBOX:
            self.close(client, "client does not read the driver's messages")

    def flush(self) -> None:
        """Send what was queued for clients whose sockets were full."""
        if self._unflushed:
            for client in list(self._unflushed):
                self._flush(client)

    def _flush(self, client: ClientSession) -> None:
        try:
            sent = client.sock.send(client.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            client.outbox.clear()
            sent = 0
        del client.outbox[:sent]
        if client.outbox and not client.closed:
            self._unflushed.add(client)
        else:
            self._unflushed.discard(client)

    # -- lifecycle ----------------------------------------------------------------------------------

    def timed_out(self, now_ns: int) -> list[ClientSession]:
        """Clients that sent nothing (not even a keep-alive) for the client liveness timeout."""
        timeout = self._liveness_timeout_ns
        return [client for client in self.clients.values() if now_ns - client.last_seen_ns > timeout]

    def close(self, client: ClientSession, reason: str) -> None:
        """Close a client's connection; it is reported once by ``take_closed``."""
        if client.closed:
            return
        client.closed = True
        self._unflushed.discard(client)
        if client.client_id:
            log.info("client %d (pid %d) removed: %s", client.client_id, client.pid, reason)
        self.clients.pop(client.client_id, None)
        with contextlib.suppress(OSError, ValueError):
            self._poller.unregister(client.sock.fileno())
        with contextlib.suppress(OSError):
            client.sock.close()
        self._closed.append((client, reason))

    def close_all(self, reason: str) -> None:
        """Close every connection, welcomed or not (the driver is closing)."""
        for client in list(self.clients.values()):
            self.close(client, reason)
        for what in list(self._poller.watched.values()):
            if isinstance(what, ClientSession):
                self.close(what, reason)


AERON_CLIENTS_REFUSED = (
    "an Aeron client wrote a command into this slipstream driver's CnC ring buffer: a slipstream driver serves "
    "slipstream's clients only (on its socket); run Aeron's media driver (aeronmd) for Aeron's clients"
)


class AeronClientRefusal:
    """Aeron's clients find a live driver in a slipstream directory (its CnC file is Aeron's, for Aeron's
    tools) and write their commands into its to-driver ring buffer. Each command is answered on the
    broadcast buffer with Aeron's ON_ERROR saying what this driver is, so such a client fails at once
    with the reason instead of timing out. Without the C extension (no compare-and-set on shared
    memory) nothing is read: those clients time out."""

    def __init__(self, to_driver: memoryview, to_clients: memoryview, record_error: Callable[[str, int], None]) -> None:
        self._ring = ManyToOneRingBuffer(to_driver) if ATOMICS is not None else None
        self._answers = BroadcastTransmitter(to_clients) if ATOMICS is not None else None
        self._record_error = record_error
        self._refused = 0

    def poll(self) -> int:
        """Answer the commands written since the last call (each refusal goes to the error log); how many
        there were. A ring buffer someone corrupted is reported once and no longer read: any local
        process can write into it, and that must not stop the driver."""
        if self._ring is None:
            return 0
        self._refused = 0
        try:
            self._ring.read(self._refuse, 16)
        except RingBufferCorruptError as exc:
            self._ring = None
            self._record_error(f"the CnC's to-driver ring buffer is corrupt and is no longer read: {exc}", 1)
        if self._refused:
            self._record_error(AERON_CLIENTS_REFUSED, self._refused)
        return self._refused

    def _refuse(self, type_id: int, payload: memoryview) -> None:
        self._refused += 1
        correlation_id = aeron.command_correlation_id(type_id, payload)
        if correlation_id is not None and self._answers is not None:
            answer = aeron.encode_error_response(correlation_id, aeron.GENERIC_ERROR, AERON_CLIENTS_REFUSED)
            self._answers.transmit(*answer)
