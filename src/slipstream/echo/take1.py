"""Echo, take 1: the guide's first, deliberately naive client and server.

The client sends ``HELLO <port>`` and then a random unsigned 32-bit number per interval; the server
opens a publication back to the client's source address at that port and echoes every message.
It works on an open network and fails behind NAT: the server's datagrams to the announced port are
unsolicited as far as the client's router knows, so they are dropped there. Take 2 fixes that.

What both takes share (channel strings, sending with retries, waiting, pacing) is in ``common``.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ..client import (
    BackoffIdleStrategy,
    DriverError,
    ExclusivePublication,
    FragmentAssembler,
    Header,
    Image,
    Subscription,
)
from ..driver.config import DriverConfig
from .common import (
    POLL_PAUSE_S,
    ClientPacing,
    ContextOwner,
    EchoError,
    SendError,
    channel,
    host_of,
    join_host_port,
    open_context,
    send_text,
    wait_for,
)
from .messages import ECHO_STREAM_ID, MessageError, decode, format_hello_port, parse_hello_port

__all__ = ["EchoClient", "EchoError", "EchoServer", "SendError", "channel", "host_of", "join_host_port"]

log = logging.getLogger("slipstream.echo.take1")

# -- server -----------------------------------------------------------------------------------------


class _State(Enum):
    INITIAL = "initial"
    CONNECTED = "connected"


@dataclass(slots=True)
class _ServerClient:
    """Per-client state of the take 1 server: waiting for HELLO, then echoing."""

    session_id: int
    source_identity: str
    state: _State = _State.INITIAL
    publication: ExclusivePublication | None = None

    def close(self) -> None:
        if self.publication is not None:
            self.publication.close()
            self.publication = None


class EchoServer(ContextOwner):
    """Take 1 server: one subscription at ``local_address:local_port``; a publication per client.

    Image callbacks arrive on the client library's thread; they only queue events, and ``run``
    handles them, so the client table is touched by one thread.
    """

    def __init__(
        self,
        directory: str | Path | None,
        local_address: str,
        local_port: int,
        *,
        driver_config: DriverConfig | None = None,
    ) -> None:
        self.local_address = local_address
        self.local_port = local_port
        self.context = open_context(directory, driver_config)
        self.clients: dict[int, _ServerClient] = {}
        self._events: queue.SimpleQueue[tuple[bool, Image]] = queue.SimpleQueue()
        self.subscription: Subscription | None = None

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set."""
        uri = channel(endpoint=join_host_port(self.local_address, self.local_port), reliable=True)
        log.debug("subscription URI: %s", uri)
        sub = self.subscription = self.context.add_subscription(
            uri,
            ECHO_STREAM_ID,
            on_available_image=lambda image: self._events.put((True, image)),
            on_unavailable_image=lambda image: self._events.put((False, image)),
        )
        log.info("echo server (take 1) listening on %s stream %#x", uri, ECHO_STREAM_ID)
        assembler = FragmentAssembler(self._on_message)
        idle = BackoffIdleStrategy(max_sleep_s=0.002)
        while not stop.is_set():
            work = self._drain_events()
            work += sub.poll(assembler, 10)
            idle.idle(work)

    def _drain_events(self) -> int:
        count = 0
        while count < 1000:  # bounded: the rest wait for the next duty cycle
            try:
                available, image = self._events.get_nowait()
            except queue.Empty:
                break
            count += 1
            if available:
                log.debug("onClientConnected: %s", image.source_identity)
                self.clients.setdefault(image.session_id, _ServerClient(image.session_id, image.source_identity))
            else:
                log.debug("onClientDisconnected: %s", image.source_identity)
                client = self.clients.pop(image.session_id, None)
                if client is not None:
                    client.close()
        return count

    def _on_message(self, payload: memoryview, header: Header) -> None:
        session_id = header.session_id
        client = self.clients.get(session_id)
        if client is None:  # its image arrived, but the callback's event is still queued
            image = self.subscription.image_by_session_id(session_id) if self.subscription else None
            if image is None:
                log.warning("received message from unknown client: %d", session_id)
                return
            client = self.clients[session_id] = _ServerClient(session_id, image.source_identity)
        text = decode(payload)
        if text is None:
            log.warning("[%d] client sent a message that is not UTF-8", session_id)
            return
        log.debug("receive [0x%08x]: %s", session_id & 0xFFFFFFFF, text)
        if client.state is _State.INITIAL:
            self._on_hello(client, text)
            return
        assert client.publication is not None
        try:
            send_text(client.publication, text, logger=log)
        except SendError as exc:
            log.error("[%d] %s", session_id, exc)

    def _on_hello(self, client: _ServerClient, text: str) -> None:
        """Open the publication back to the client: its source address, the port it named."""
        try:
            port = parse_hello_port(text)
        except MessageError as exc:
            log.warning("client sent malformed HELLO message: %s", exc)
            return
        host = host_of(client.source_identity)
        if host is None:
            log.warning("[%d] cannot parse the source identity %r", client.session_id, client.source_identity)
            return
        uri = channel(endpoint=join_host_port(host, port), reliable=True)
        try:
            client.publication = self.context.add_exclusive_publication(uri, ECHO_STREAM_ID)
        except DriverError as exc:
            log.warning("[%d] cannot open %s: %s", client.session_id, uri, exc)
            return
        log.debug("[%d] publication URI: %s (session %d)", client.session_id, uri, client.publication.session_id)
        client.state = _State.CONNECTED

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        super().close()


# -- client -----------------------------------------------------------------------------------------


class EchoClient(ContextOwner):
    """Take 1 client: a subscription at ``local_address:local_port`` for the echoes, a publication to
    the server, ``HELLO <local_port>``, then a random number per ``interval_s``.

    ``count`` > 0 stops after that many numbers and their echoes (or ``timeout_s`` of waiting for
    them); 0 runs until stopped, as the guide's client does.
    """

    def __init__(
        self,
        directory: str | Path | None,
        local_address: str,
        local_port: int,
        remote_address: str,
        remote_port: int,
        *,
        count: int = 0,
        interval_s: float = 1.0,
        timeout_s: float = 10.0,
        driver_config: DriverConfig | None = None,
    ) -> None:
        self.pacing = ClientPacing(count, interval_s, timeout_s)
        self.local_address = local_address
        self.local_port = local_port
        self.remote_address = remote_address
        self.remote_port = remote_port
        self.timeout_s = timeout_s
        self.context = open_context(directory, driver_config)
        self._random = random.SystemRandom()

    @property
    def received(self) -> int:
        """Responses received so far."""
        return self.pacing.received

    def run(self, stop: threading.Event) -> None:
        """Talk to the server; raises EchoError when it cannot (or, with ``count``, echoes are missing)."""
        sub_uri = channel(endpoint=join_host_port(self.local_address, self.local_port), reliable=True)
        log.debug("subscription URI: %s", sub_uri)
        sub = self.context.add_subscription(sub_uri, ECHO_STREAM_ID)
        pub_uri = channel(endpoint=join_host_port(self.remote_address, self.remote_port), reliable=True)
        log.debug("publication URI: %s", pub_uri)
        pub = self.context.add_exclusive_publication(pub_uri, ECHO_STREAM_ID)
        if not wait_for(lambda: pub.is_connected, self.timeout_s, stop):
            raise EchoError(f"no server answered at {pub_uri} within {self.timeout_s:g} s")
        send_text(pub, format_hello_port(self.local_port), logger=log)
        assembler = FragmentAssembler(self._on_response)
        pacing = self.pacing
        while not stop.is_set():
            now = time.monotonic()
            if pacing.due(now):
                number = str(self._random.getrandbits(32))
                try:
                    send_text(pub, number, logger=log)
                except SendError as exc:
                    log.error("%s", exc)  # the guide's take 1 logs and carries on
                    pacing.on_sent(None, now)
                else:
                    pacing.on_sent(number, now)
            if sub.poll(assembler, 10) == 0:
                time.sleep(POLL_PAUSE_S)
            if pacing.finished():
                return
            overdue = pacing.overdue(time.monotonic())
            if overdue is not None:
                raise EchoError(overdue)

    def _on_response(self, payload: memoryview, header: Header) -> None:
        text = decode(payload)
        if text is None:
            log.warning("response that is not UTF-8 ignored")
            return
        log.debug("response: %s", text)
        self.pacing.on_answer(text)
