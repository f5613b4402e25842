"""The shell take 1 and take 2 share: channel strings, sending with the guide's retries, bounded
waits, the context an endpoint owns, and a client's pacing (one message per interval, a bounded
record of what is unanswered, and when a counted run is done or overdue).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Self

from ..client import ADMIN_ACTION, Context, ExclusivePublication, result_name
from ..driver.config import DriverConfig
from ..wire.uri import ChannelUri, ChannelUriError, ParamValue, parse_endpoint

__all__ = [
    "POLL_PAUSE_S",
    "ClientPacing",
    "ContextOwner",
    "EchoError",
    "SendError",
    "channel",
    "host_of",
    "join_host_port",
    "open_context",
    "send_text",
    "wait_for",
]

POLL_PAUSE_S = 0.01
"""How long a client sleeps between polls; echo is about correctness, not latency."""


class EchoError(Exception):
    """A client cannot go on (timed out, rejected, lost the server); the message says why."""


class SendError(EchoError):
    """A message could not be offered after the allowed attempts (the code is in the message)."""


def join_host_port(host: str, port: int) -> str:
    """``host:port`` for a channel URI; IPv6 literals get brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_of(source_identity: str) -> str | None:
    """The address part of an image's ``source_identity`` (``host:port`` or ``[v6]:port``)."""
    try:
        return parse_endpoint(source_identity)[0]
    except ChannelUriError:
        return None


def channel(**params: ParamValue) -> str:
    """A validated ``aeron:udp`` channel; keyword ``control_mode`` is ``control-mode`` and so on."""
    return str(ChannelUri("udp", {name.replace("_", "-"): value for name, value in params.items()}))


def send_text(
    publication: ExclusivePublication, text: str, *, attempts: int = 5, pause_s: float = 0.1, logger: logging.Logger
) -> int:
    """Offer ``text`` as UTF-8, retrying ``attempts`` times ``pause_s`` apart (the guide's policy);
    returns the new position or raises SendError naming the last refusal."""
    data = text.encode()
    logger.debug("[%d] send: %s", publication.session_id, text)
    result = 0
    tries = 0
    while tries < attempts:
        try:
            result = publication.offer(data)
        except ValueError as exc:  # longer than the publication's maximum message length
            raise SendError(f"could not send: {exc}") from None
        if result >= 0:
            return result
        if result != ADMIN_ACTION:  # a term rotation: retry at once, it is not a refusal
            tries += 1
            if tries < attempts:
                time.sleep(pause_s)
    raise SendError(f"could not send: {result_name(result)}")


def wait_for(condition: Callable[[], bool], timeout_s: float, stop: threading.Event | None = None) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes or ``stop`` is set (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            return False
        time.sleep(POLL_PAUSE_S)
    return True


def open_context(directory: str | Path | None, driver_config: DriverConfig | None = None) -> Context:
    """Attach to the driver of ``directory`` or start one embedded (the guide's ``create``)."""
    return Context(directory, driver_config=driver_config)


class ContextOwner:
    """An echo server or client: it owns one Context, closed with it (``with`` closes it too)."""

    context: Context

    def close(self) -> None:
        """Close what this endpoint opened, then its context (subclasses close theirs first)."""
        self.context.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClientPacing:
    """One message per ``interval_s``; with ``count`` > 0, done after that many and their echoes,
    overdue when the last send is ``timeout_s`` old and echoes are still missing.

    The record of unanswered messages is bounded: a silent server must not make a client grow.
    """

    def __init__(self, count: int, interval_s: float, timeout_s: float) -> None:
        if count < 0 or interval_s < 0 or timeout_s <= 0:
            raise ValueError("need count >= 0, interval >= 0 and timeout > 0")
        self.count = count
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.sent = 0
        self.received = 0
        self.outstanding: deque[str] = deque(maxlen=1024)
        self._next_send = time.monotonic()
        self._last_send = self._next_send

    def due(self, now: float) -> bool:
        """Whether a message should go now (the interval passed and the count is not reached)."""
        return now >= self._next_send and (self.count == 0 or self.sent < self.count)

    def on_sent(self, text: str | None, now: float) -> None:
        """Record a send attempt at ``now``; ``text`` is None when the send failed (not awaited)."""
        if text is not None:
            self.outstanding.append(text)
            self.sent += 1
            self._last_send = now
        self._next_send = now + self.interval_s

    def on_answer(self, text: str) -> bool:
        """Count an answer; True when it echoes something still unanswered."""
        self.received += 1
        if text in self.outstanding:
            self.outstanding.remove(text)
            return True
        return False

    def finished(self) -> bool:
        """A counted run has sent everything and every echo came back (never for count 0)."""
        return self.count > 0 and self.sent >= self.count and not self.outstanding

    def overdue(self, now: float) -> str | None:
        """Why a counted run gave up waiting for its echoes, or None while it may still wait."""
        if self.count and self.sent >= self.count and self.outstanding and now - self._last_send > self.timeout_s:
            return f"no echo for {len(self.outstanding)} of {self.count} messages within {self.timeout_s:g} s"
        return None
