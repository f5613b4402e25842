"""Listener lists of servers, clients and connections: message listeners by type, looked up along the
MRO (most specific type first) and cached. Pure bookkeeping, shared by every adapter: the adapter
decides how a listener runs (inline, as a task, on a thread)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ConnectionListener", "ErrorListener", "Listeners", "MessageListener"]

ConnectionListener = Callable[[Any], Any]
"""``listener(connection)``; may return an awaitable (asyncio) or not."""
MessageListener = Callable[[Any, Any], Any]
"""``listener(connection, message)``."""
ErrorListener = Callable[[Any, BaseException], Any]
"""``listener(connection_or_None, exception)``."""


class Listeners:
    """Listener lists with decorators' bookkeeping; message listeners by type."""

    def __init__(self) -> None:
        self.init: list[ConnectionListener] = []
        self.connect: list[ConnectionListener] = []
        self.disconnect: list[ConnectionListener] = []
        self.error: list[ErrorListener] = []
        self._messages: dict[type, list[MessageListener]] = {}
        self._cache: dict[type, tuple[MessageListener, ...]] = {}

    def add_message(self, kind: type, listener: MessageListener) -> None:
        """Call ``listener`` for messages of ``kind`` and its subclasses."""
        if not isinstance(kind, type):
            raise TypeError(f"on_message needs a type: {kind!r}")
        self._messages.setdefault(kind, []).append(listener)
        self._cache.clear()

    @property
    def has_messages(self) -> bool:
        """Whether any message listener is registered."""
        return bool(self._messages)

    def exactly(self, kind: type) -> tuple[MessageListener, ...]:
        """The listeners registered for ``kind`` itself (not its bases)."""
        return tuple(self._messages.get(kind, ()))

    def for_type(self, kind: type) -> tuple[MessageListener, ...]:
        """The listeners for a message of type ``kind``, most specific type first."""
        found = self._cache.get(kind)
        if found is None:
            found = tuple(listener for base in kind.__mro__ for listener in self._messages.get(base, ()))
            self._cache[kind] = found
        return found

    def for_type_with(self, kind: type, outer: Listeners) -> tuple[MessageListener, ...]:
        """``for_type`` over this set (a connection's) and ``outer`` (its server's or client's) together:
        most specific type first across both; for one type, this set's listeners before ``outer``'s."""
        if not self._messages:
            return outer.for_type(kind)
        own = self._messages
        return tuple(listener for base in kind.__mro__ for listener in (*own.get(base, ()), *outer.exactly(base)))

    def clear(self) -> None:
        """Forget every listener."""
        for items in (self.init, self.connect, self.disconnect, self.error):
            items.clear()
        self._messages.clear()
        self._cache.clear()
