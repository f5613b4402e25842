"""A connection's outstanding requests, sans-I/O: ``send_sync`` messages waiting for their acknowledgement
and pings waiting for their pong, under one pool of request ids (1-65535, reused) and one deadline.

A ``send_sync`` whose message travels as a stream (a large message, a file) is timed from the stream's last
progress, not from its start: a 400 MB file that keeps moving never times out, one that stalls for the
timeout is cancelled (:meth:`Requests.expire` names the stream to abort, so the receiver never delivers
it) and a refusal or failure of the stream fails the request at once (:class:`SyncFailed`). Once the
stream has left whole it can no longer be taken back: time running out after that completes the request
unacknowledged instead of failing it (the receiver has the message; its listener is slow).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import (
    ConnectionClosedError,
    MaxMessageSizeExceeded,
    SendSyncTimeout,
    SpillQuotaExceeded,
    StreamingError,
    StreamRefused,
)
from .events import (
    Event,
    PingTimedOut,
    StreamFailed,
    StreamFailure,
    StreamProgressed,
    StreamSent,
    SyncCompleted,
    SyncFailed,
    SyncTimedOut,
)

__all__ = ["MAX_OUTSTANDING", "Requests", "stream_error", "sync_error"]

MAX_OUTSTANDING = 65535
"""Request ids are 16 bits on the wire: at most this many syncs and pings wait at once per connection."""
_CANCELLED = 0
"""A stream's sync in :attr:`Requests._streams` once the sync timed out and the stream is being aborted."""


@dataclass(slots=True)
class _Sync:
    deadline_ns: int
    timeout_ns: int
    stream_id: int = 0
    """The stream carrying the message (0: it went in one record)."""
    whole: bool = False
    """Its stream's last byte left: cancelling is no longer possible."""


class Requests:
    """Outstanding ``send_sync`` and ping requests of one connection (see the module's docstring)."""

    def __init__(self) -> None:
        self._last_id = 0
        self._syncs: dict[int, _Sync] = {}
        self._streams: dict[int, int] = {}
        """Stream id -> the sync it carries."""
        self._pings: dict[int, tuple[int, int]] = {}
        """Ping id -> (sent at, timeout deadline)."""

    @property
    def deadline_ns(self) -> int | None:
        """The earliest timeout (None when nothing is outstanding)."""
        if not self._syncs and not self._pings:
            return None
        return min([s.deadline_ns for s in self._syncs.values()] + [when for _, when in self._pings.values()])

    def next_id(self) -> int:
        """A request id (1-65535) not outstanding; OverflowError when all are."""
        if len(self._syncs) + len(self._pings) >= MAX_OUTSTANDING:
            raise OverflowError(f"too many outstanding requests ({MAX_OUTSTANDING})")
        while True:
            self._last_id = self._last_id % MAX_OUTSTANDING + 1
            if self._last_id not in self._syncs and self._last_id not in self._pings:
                return self._last_id

    def sync(self, sync_id: int, now_ns: int, timeout_ns: int, stream_id: int = 0) -> None:
        """A ``send_sync`` went out under ``sync_id`` (its message in ``stream_id``'s stream, if not 0)."""
        self._syncs[sync_id] = _Sync(now_ns + timeout_ns, timeout_ns, stream_id)
        if stream_id:
            self._streams[stream_id] = sync_id

    def ping(self, ping_id: int, now_ns: int, timeout_ns: int) -> None:
        self._pings[ping_id] = (now_ns, now_ns + timeout_ns)

    def acknowledged(self, sync_id: int) -> SyncCompleted | None:
        """The peer's SYNC_ACK: the event, or None for a request no longer outstanding."""
        sync = self._syncs.pop(sync_id, None)
        if sync is None:
            return None
        self._streams.pop(sync.stream_id, None)
        return SyncCompleted(sync_id)

    def ponged(self, ping_id: int) -> int | None:
        """The peer's PONG: when the ping left, or None for a ping no longer outstanding."""
        sent = self._pings.pop(ping_id, None)
        return None if sent is None else sent[0]

    def carries(self, stream_id: int) -> bool:
        """Whether ``stream_id`` carries a ``send_sync`` message (its events go through :meth:`stream_event`)."""
        return stream_id in self._streams

    def stream_event(self, event: StreamProgressed | StreamSent | StreamFailed, now_ns: int) -> list[Event]:
        """The events to emit for an outgoing event of a stream that :meth:`carries` a sync: progress
        restarts the sync's timeout; a failure becomes the sync's (:class:`SyncFailed`), or nothing when
        the stream was cancelled because the sync timed out (that was said already)."""
        sync_id = self._streams[event.stream_id]
        if isinstance(event, StreamFailed):
            del self._streams[event.stream_id]
            if sync_id == _CANCELLED:
                return []
            del self._syncs[sync_id]
            return [SyncFailed(sync_id, event.stream_id, event.failure, event.detail)]
        if sync_id != _CANCELLED:
            sync = self._syncs[sync_id]
            sync.deadline_ns = now_ns + sync.timeout_ns
            sync.whole = isinstance(event, StreamSent)
        return [event]

    def expire(self, now_ns: int) -> tuple[list[Event], list[int]]:
        """Requests past their deadline: their events, and the streams to cancel (stalled syncs)."""
        events: list[Event] = []
        cancel: list[int] = []
        for sync_id, sync in list(self._syncs.items()):
            if now_ns < sync.deadline_ns:
                continue
            del self._syncs[sync_id]
            if sync.whole:
                self._streams.pop(sync.stream_id, None)
                events.append(SyncCompleted(sync_id, acknowledged=False))
                continue
            events.append(SyncTimedOut(sync_id, sync.stream_id))
            if sync.stream_id:
                self._streams[sync.stream_id] = _CANCELLED  # its abort's failure is not said again
                cancel.append(sync.stream_id)
        for ping_id, (_, when) in list(self._pings.items()):
            if now_ns >= when:
                del self._pings[ping_id]
                events.append(PingTimedOut(ping_id))
        return events, cancel

    def clear(self) -> None:
        """The connection closed: nothing is outstanding any more (the adapter fails what waited)."""
        self._syncs.clear()
        self._streams.clear()
        self._pings.clear()


def sync_error(event: SyncCompleted | SyncTimedOut | SyncFailed, where: str) -> Exception | None:
    """What ``send_sync`` raises for ``event`` (None: it returns); ``where`` names the connection."""
    if isinstance(event, SyncTimedOut):
        stalled = "its transfer made no progress in time and was cancelled" if event.stream_id else ""
        return SendSyncTimeout(f"{where}: {stalled or 'no acknowledgement in time'}")
    if isinstance(event, SyncFailed):
        what = f"{where}: send_sync's stream failed ({event.failure.name.lower()}): {event.detail}"
        if event.failure is StreamFailure.CONNECTION_LOST:
            return ConnectionClosedError(what)
        return stream_error(event.failure, what)
    return None


_REFUSALS = {
    StreamFailure.MESSAGE_TOO_LARGE: MaxMessageSizeExceeded,
    StreamFailure.OVER_QUOTA: SpillQuotaExceeded,
    StreamFailure.REFUSED: StreamRefused,
    StreamFailure.TOO_LARGE: StreamRefused,
    StreamFailure.TOO_MANY: StreamRefused,
}


def stream_error(failure: StreamFailure, text: str) -> StreamingError:
    """The error a stream that failed for ``failure`` is reported as (on either side): the limit it met,
    when a limit refused it."""
    return _REFUSALS.get(failure, StreamingError)(text)
