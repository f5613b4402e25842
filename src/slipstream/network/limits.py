"""What an admitted peer may make us hold, and what happens at each bound (sans-I/O; issue 29, item 2).

- ``max_message_size``: bytes of one large message (or remote call, or response) decoded in memory. A
  stream announcing more, unless it is a file (a ``Path`` is never decoded), is refused at its
  STREAM_START, before anything is allocated, and both sides hear :class:`~.errors.MaxMessageSizeExceeded`.
  Decoding multiplies size (a msgpack list of small ints takes 8 bytes of pointers per wire byte), so this
  bounds decoded memory where ``max_stream_size`` (files included) bounds only what crosses the wire.
- ``spill_quota`` (:class:`SpillQuota`, one per server): bytes of incoming streams on disk at once, over
  every connection. A stream reserves its announced size when it goes to a file and gives it back when the
  file is removed or handed to the application; one that does not fit is refused to both sides
  (:class:`~.errors.SpillQuotaExceeded`).
- ``max_pending_calls`` (:class:`Workload`, one per connection): remote calls and listeners running as
  tasks (``async def``; a plain one runs inline and is done before the next record is read). A call of an
  ``async def`` method is counted as the machine takes it in, before the adapter runs it, so the calls
  one record carries cannot run past the limit. A call beyond it is refused unrun, at once
  (``RmiRequestRefused``, ``reason == "busy"``: the caller may retry); a fire-and-forget call, which
  nothing answers, is reported on this side. A plain message cannot be refused (nothing answers it
  either) and is never dropped: it is held, and the adapter stops reading the connection until a task
  ends, so the sender is held back by the transport's flow control (its ``send`` waits, then raises
  SendTimeout). What is held is bounded by one poll of the transport. The adapter also holds a
  connection's messages while its ``on_init`` runs (:meth:`Workload.pause`), with the same bound.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from .events import MessageReceived, StreamFailure

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_PENDING_CALLS",
    "DEFAULT_SPILL_QUOTA",
    "SpillQuota",
    "Workload",
    "stream_refusal",
]

DEFAULT_MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024
DEFAULT_MAX_PENDING_CALLS: Final = 1024
DEFAULT_SPILL_QUOTA: Final = 1024**3
MIN_MAX_MESSAGE_SIZE: Final = 64 * 1024
"""``max_message_size`` is at least a record: a message that fits one record is never streamed, so no
smaller limit could be held without a check on every frame."""


def stream_refusal(
    total: int, is_file: bool, live: int, *, max_stream_size: int, max_message_size: int | None, max_incoming: int
) -> tuple[StreamFailure, str] | None:
    """Why an announced stream is refused before anything is allocated (None: it may start)."""
    if total > max_stream_size:
        return StreamFailure.TOO_LARGE, f"announced {total} bytes exceed its max_stream_size ({max_stream_size})"
    if not is_file and max_message_size is not None and total > max_message_size:
        detail = f"a message of {total} bytes exceeds its max_message_size ({max_message_size}): send a file"
        return StreamFailure.MESSAGE_TOO_LARGE, detail
    if live >= max_incoming:
        return StreamFailure.TOO_MANY, f"already {live} incoming streams"
    return None


class SpillQuota:
    """Bytes of incoming streams on disk, shared by every connection of a server (one event loop: no lock)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"spill_quota must not be negative: {limit}")
        self.limit = limit
        self.used = 0
        self.refused = 0
        """Streams refused for want of quota."""

    def reserve(self, size: int) -> bool:
        """Take ``size`` bytes of the quota; False (counted) when they do not fit."""
        if self.used + size > self.limit:
            self.refused += 1
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used = max(0, self.used - size)


class Workload:
    """One connection's async remote calls and listener tasks, against ``limit``, and the messages held while
    it is full (see the module). The adapter counts its tasks with :meth:`started` and :meth:`finished`."""

    def __init__(self, limit: int = DEFAULT_MAX_PENDING_CALLS) -> None:
        if limit < 1:
            raise ValueError(f"max_pending_calls must be at least 1: {limit}")
        self.limit = limit
        self.tasks = 0
        self.refused = 0
        """Remote calls refused as busy."""
        self._held: deque[object] = deque()
        self._paused = False

    @property
    def full(self) -> bool:
        return self.tasks >= self.limit

    @property
    def holding(self) -> bool:
        """Events wait: the adapter reads no more from the connection meanwhile."""
        return bool(self._held)

    def admit(self, event: object, ordered: bool) -> bool:
        """Whether to dispatch ``event`` now; False: it is held. A message is held when the work is full
        (or paused); an ``ordered`` event (a call, a call's outcome, an object) when others wait before it
        or while paused. Anything else (stream progress, pings, the close) goes on."""
        if not (self._held or self._paused):  # the common case: nothing waits
            if self.tasks < self.limit or type(event) is not MessageReceived:
                return True
        elif not ordered and type(event) is not MessageReceived:
            return True
        self._held.append(event)
        return False

    def release(self) -> object | None:
        """The next held event to dispatch now (None: none, paused, or a message while still full; a held call
        was admitted when it arrived, so it goes on whatever the work)."""
        held = self._held
        if held and not self._paused and (type(held[0]) is not MessageReceived or not self.full):
            return held.popleft()
        return None

    def started(self) -> None:
        """A remote call or a listener began running as a task."""
        self.tasks += 1

    def finished(self, _task: object = None) -> None:
        """One of those ended (usable as a task's done callback)."""
        self.tasks -= 1

    def pause(self) -> None:
        """Hold messages and ordered events until :meth:`resume` (whatever the work)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
