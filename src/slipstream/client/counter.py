"""A client's own counter in the driver's counters file (Aeron's ``Counter``).

The driver allocates it (``Context.add_counter``) with the client's label, type id and key, so anything
that reads the counters file sees it beside the driver's own: ``slipstream stat``, ``Context.counters``.
The client writes the value straight into shared memory; the driver frees the counter when the client
closes it, closes its context, or goes away.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Counter"]


class Counter:
    """One counter; its value is written by one thread of this process (``set``, ``increment``)."""

    __slots__ = ("_index", "_on_close", "_values", "counter_id", "label", "registration_id", "type_id")

    def __init__(
        self,
        *,
        counter_id: int,
        registration_id: int,
        type_id: int,
        label: str,
        values: memoryview,
        index: int,
        on_close: Callable[[Counter], None],
    ) -> None:
        self.counter_id = counter_id
        """The id readers of the counters file know it by."""
        self.registration_id = registration_id
        self.type_id = type_id
        self.label = label
        self._values: memoryview | None = values
        self._index = index
        self._on_close = on_close

    @property
    def value(self) -> int:
        """The counter's current value, as readers of the counters file see it."""
        return int(self._live()[self._index])

    def set(self, value: int) -> None:
        """Store ``value`` (a signed 64-bit integer)."""
        self._live()[self._index] = value

    def increment(self, delta: int = 1) -> int:
        """Add ``delta`` and return the new value (one writer: not atomic across threads)."""
        values = self._live()
        value = values[self._index] + delta
        values[self._index] = value
        return int(value)

    @property
    def is_closed(self) -> bool:
        """True once closed (or its context closed): the value can no longer be read or written."""
        return self._values is None

    def close(self) -> None:
        """Free the counter in the driver (idempotent); its value can no longer be read or written here."""
        if self._values is not None:
            self._values = None
            self._on_close(self)

    def _release(self) -> None:
        """The context closed: the driver frees the counter with the client."""
        self._values = None

    def _live(self) -> memoryview:
        values = self._values
        if values is None:
            raise ValueError(f"counter {self.counter_id} ({self.label!r}) is closed")
        return values

    def __repr__(self) -> str:
        state = "closed" if self._values is None else f"value={self.value}"
        return f"Counter(id={self.counter_id}, type_id={self.type_id}, label={self.label!r}, {state})"
