"""Buffered sessions, sans-I/O: messages for a disconnected peer wait (bounded) for its return.

A session is keyed by the peer's public key (the seed's rule: the same client, whatever its address).
While its connection is down, what the application sends to that peer is queued, up to ``capacity``
messages (and ``max_bytes`` when a size function is given); when the same key connects again within
``timeout_ns`` the queue is handed back in order, to be sent first on the new connection. After the
timeout the session expires: :class:`SessionExpired` carries every message that was not delivered (the
application's ``on_disconnect`` fires then). A message that does not fit is refused at once with
:class:`BufferOverflowed`, so nothing is ever dropped silently.

Whether a connection is buffered at all is the server's per-connection rule, ``(address, tag) ->
bool``: on by default, and with rules, on when any rule says so (:meth:`BufferedSessions.wants_buffering`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, Generic, TypeVar

from .events import BufferedEvent, BufferOverflowed, SessionExpired, SessionResumed

__all__ = [
    "DEFAULT_BUFFERED_TIMEOUT_NS",
    "DEFAULT_CAPACITY",
    "BufferOverflowed",
    "BufferedEvent",
    "BufferedSessions",
    "Hold",
    "SessionExpired",
    "SessionResumed",
]

T = TypeVar("T")

DEFAULT_BUFFERED_TIMEOUT_NS: Final = 120_000_000_000
"""The seed's ``bufferedConnectionTimeoutSeconds``: 120 s."""
DEFAULT_CAPACITY: Final = 10_000
"""Messages queued per peer by default."""


class Hold(Enum):
    """What became of a message sent to a connection that has closed."""

    QUEUED = "queued until the peer reconnects (buffered session)"
    FULL = "the buffered session's queue is full"
    CLOSED = "closed"
    """No buffered session waits for the peer: the message cannot go anywhere."""
    RECONNECTING = "reconnecting"
    """A client is connecting to the same server again: ``send`` waits for the new connection."""




@dataclass(slots=True)
class _Session(Generic[T]):
    connected: bool = True
    buffered: bool = True
    expires_ns: int = 0
    queue: deque[T] = field(default_factory=deque)
    queued_bytes: int = 0


class BufferedSessions(Generic[T]):
    """Every peer's session: connected, or disconnected with a bounded queue and an expiry deadline."""

    def __init__(
        self,
        *,
        timeout_ns: int = DEFAULT_BUFFERED_TIMEOUT_NS,
        capacity: int = DEFAULT_CAPACITY,
        max_bytes: int | None = None,
        size_of: Callable[[T], int] | None = None,
        rules: Sequence[Callable[[str | None, str], bool]] = (),
    ) -> None:
        if timeout_ns <= 0:
            raise ValueError(f"timeout_ns must be positive: {timeout_ns}")
        if capacity < 0:
            raise ValueError(f"capacity must not be negative: {capacity}")
        if max_bytes is not None and (max_bytes < 0 or size_of is None):
            raise ValueError("max_bytes must be non-negative and needs size_of")
        self.timeout_ns = timeout_ns
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.size_of = size_of
        self.rules = tuple(rules)
        self._sessions: dict[bytes, _Session[T]] = {}
        self._expiries: list[tuple[int, bytes]] = []
        self._events: list[BufferedEvent[T]] = []

    def wants_buffering(self, address: str | None, tag: str) -> bool:
        """The server's per-connection rule: on without rules, else on when any rule returns True."""
        return not self.rules or any(rule(address, tag) for rule in self.rules)

    def take_events(self) -> list[BufferedEvent[T]]:
        """Events since the last call."""
        events, self._events = self._events, []
        return events

    @property
    def deadline_ns(self) -> int | None:
        """When the next disconnected session expires."""
        heap = self._expiries
        while heap:
            when, key = heap[0]
            session = self._sessions.get(key)
            if session is not None and not session.connected and session.expires_ns == when:
                return when
            heapq.heappop(heap)
        return None

    def connected(self, key: bytes, now_ns: int, *, buffered: bool = True) -> list[T]:
        """The peer ``key`` has a (new) connection; returns its queued messages, oldest first, to send
        before anything else (empty for a new session). ``buffered`` is the rule's verdict for it."""
        session = self._sessions.get(key)
        if session is not None and not session.connected and now_ns < session.expires_ns:
            messages = list(session.queue)
            session.queue.clear()
            session.queued_bytes = 0
            session.connected = True
            session.buffered = buffered
            self._events.append(SessionResumed(key, len(messages)))
            return messages
        if session is not None and not session.connected:
            self._expire(key, session)  # past its deadline but not yet timed out: expire it first
        self._sessions[key] = _Session(connected=True, buffered=buffered)
        return []

    def disconnected(self, key: bytes, now_ns: int) -> bool:
        """The peer's connection dropped. True: the session waits for it (report ``on_disconnect`` on
        :class:`SessionExpired`); False: it is not buffered and is forgotten now."""
        session = self._sessions.get(key)
        if session is None or not session.connected:
            return session is not None
        if not session.buffered:
            del self._sessions[key]
            return False
        session.connected = False
        session.expires_ns = now_ns + self.timeout_ns
        heapq.heappush(self._expiries, (session.expires_ns, key))
        return True

    def ended(self, key: bytes) -> None:
        """The peer's connection ended deliberately (a close, not a loss): its session ends with it."""
        session = self._sessions.get(key)
        if session is not None and session.connected:
            del self._sessions[key]

    def is_waiting(self, key: bytes) -> bool:
        """Whether messages for ``key`` are being queued (its session is disconnected and alive)."""
        session = self._sessions.get(key)
        return session is not None and not session.connected

    def enqueue(self, key: bytes, message: T) -> bool:
        """Queue ``message`` for the disconnected peer ``key``. False when there is no waiting session
        (send it as usual, or report it) or it did not fit (:class:`BufferOverflowed` says so)."""
        session = self._sessions.get(key)
        if session is None or session.connected:
            return False
        if len(session.queue) >= self.capacity:
            self._events.append(
                BufferOverflowed(key, message, len(session.queue), f"the queue holds {self.capacity} messages")
            )
            return False
        size = 0
        if self.size_of is not None:
            size = self.size_of(message)
            if self.max_bytes is not None and session.queued_bytes + size > self.max_bytes:
                self._events.append(
                    BufferOverflowed(key, message, len(session.queue), f"the queue holds {self.max_bytes} bytes")
                )
                return False
        session.queue.append(message)
        session.queued_bytes += size
        return True

    def queued(self, key: bytes) -> int:
        """Messages waiting for ``key``."""
        session = self._sessions.get(key)
        return len(session.queue) if session is not None else 0

    def __len__(self) -> int:
        return len(self._sessions)

    def handle_timer(self, now_ns: int) -> None:
        """Expire every disconnected session past its deadline, reporting what it held."""
        heap = self._expiries
        while heap and heap[0][0] <= now_ns:
            when, key = heapq.heappop(heap)
            session = self._sessions.get(key)
            if session is not None and not session.connected and session.expires_ns == when:
                self._expire(key, session)

    def expire(self, key: bytes) -> None:
        """End ``key``'s disconnected session now, reporting what it held (its owner cannot wait
        for it any longer); a connected or unknown session is left alone."""
        session = self._sessions.get(key)
        if session is not None and not session.connected:
            self._expire(key, session)

    def _expire(self, key: bytes, session: _Session[T]) -> None:
        del self._sessions[key]
        self._events.append(SessionExpired(key, tuple(session.queue)))

    def close(self) -> None:
        """End every disconnected session now (the server is closing), reporting what each held;
        connected sessions are forgotten (their connections report their own close)."""
        for key, session in list(self._sessions.items()):
            if session.connected:
                del self._sessions[key]
            else:
                self._expire(key, session)
        self._expiries.clear()
