"""``Connection`` for blocking code: :class:`~..connected.ConnectionBase` whose waits run the poller's
cycles in the waiting thread (see :mod:`.poller`), and an inbox that :meth:`Connection.receive` reads.

Messages a listener takes go to it, on the thread that cycles (plain functions only: the blocking API
runs no coroutines). A message no listener takes waits in the connection's inbox for ``receive``; with
:data:`INBOX_LIMIT` messages waiting, the connection stops reading (the transport's flow control holds
the peer back: nothing is dropped). What the application sends leaves at once, from its own thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..buffered import Hold
from ..connected import BACKLOG_LIMIT, DRIVER_LOST, ConnectionBase, Flag
from ..errors import ConnectionClosedError, InboxFull, ReceiveTimeout, SendTimeout
from ..results import Ping
from .poller import Outcome, PollerLock, PollThread, Signal
from .rmi import RmiSession

__all__ = ["BACKLOG_LIMIT", "DRIVER_LOST", "INBOX_LIMIT", "Connection"]

INBOX_LIMIT = 1024
"""Messages no listener took that may wait for ``receive``; beyond, the connection stops reading."""
_BURST_GAP_NS = 10_000
"""An append this soon after the previous one returned is part of a burst (a loop of sends), not a lone
message (a request waits for its answer longer than this)."""
_BURST_FLUSH_NS = 50_000
"""In a burst, what was appended is offered once this long passed since the last offer."""
_BATCH = 8
"""Records sealed in a burst after which they are offered at once."""
_SAFETY_S = 5.0
"""How long past a machine's own timeout a wait goes on before it gives up (the machine's timer, run by
the cycles, normally ends it first)."""


def _event(flag: Flag) -> threading.Event:
    assert isinstance(flag, threading.Event)
    return flag


class Connection(ConnectionBase[RmiSession]):
    """One connection between a server and a client, for blocking code; the same ``id`` on both sides.
    Made by servers and clients, never directly; a subclass named in the config (``connection_class``)
    overrides the hooks. Every method may be called from any thread."""

    def __init__(self, **kwargs: Any) -> None:
        owner = kwargs["owner"]
        self._lock: PollerLock = owner.lock
        self._raw_lock = self._lock.raw
        self._drive = owner.drive
        self._poller: PollThread = owner.poller
        self._note_application = owner.poller.note_application
        self._inbox: deque[object] = deque()
        self._arrived = Signal()
        self._appended_ns = 0
        self._flushed_ns = 0
        self._kick = owner.poller.kick
        super().__init__(**kwargs)

    def _flag(self) -> Flag:
        return threading.Event()

    def _rmi_kind(self) -> type[RmiSession]:
        return RmiSession

    def _rmi_options(self) -> dict[str, Any]:
        return {"wait": self._outcome, "lock": self._lock}

    # -- public -----------------------------------------------------------------------------------

    def send_nowait(self, message: object) -> bool:
        """Hand ``message`` to the connection without waiting; False (and ``last_refusal``) when it
        is closed or back-pressured, or queued for a buffered session's return."""
        raw = self._raw_lock
        if not raw.acquire(blocking=False):  # (``with self._lock``, in C when nobody holds it: a hot path)
            self._lock.acquire_waiting()
        try:
            return super().send_nowait(message)
        finally:
            raw.release()

    def send(self, message: object) -> None:
        """Send ``message``, waiting out back-pressure up to ``send_timeout``; raises
        ConnectionClosedError, SendTimeout, UnregisteredTypeError. With a buffered session waiting for
        the peer, the message is queued for its return instead (UndeliveredError if the queue is full)."""
        raw = self._raw_lock
        if not raw.acquire(blocking=False):  # (``with self._lock`` in C, as in send_nowait; released before any
            self._lock.acquire_waiting()  # wait: the cycles that end it need the lock)
        try:
            successor, verdict = self._successor, None
            if successor is None:
                verdict = self._hold_closed(message)
                if verdict is None:  # open: no Hold member read (on Python 3.11 that costs a __getattr__ hook)
                    if not self._full():
                        self._send(message)
                        return
                elif verdict is Hold.QUEUED:
                    return
                elif verdict is not Hold.RECONNECTING and not self._full():
                    self._send(message)
                    return
        finally:
            raw.release()
        if successor is not None:
            return successor.send(message)
        if verdict is Hold.RECONNECTING:
            return self._successor_within(self.send_timeout).send(message)
        self._wait_room()
        with self._lock:
            self._send(message)

    def send_sync(self, message: object, timeout: float | None = None) -> None:
        """Send ``message`` and wait until the remote's listeners have handled it (or it reached the
        peer's inbox, for ``receive``); as the asyncio ``send_sync``: raises SendSyncTimeout,
        ConnectionClosedError, StreamRefused, StreamingError, and InboxFull when this side's inbox is
        full (the acknowledgement could not be read)."""
        if self._successor is not None:
            return self._successor.send_sync(message, timeout)
        if self._full():
            self._wait_room()
        outcome: Outcome[None] = Outcome()
        with self._lock:
            self._start_sync(message, timeout, outcome)
        self._outcome(outcome)

    def ping(self, timeout: float | None = None) -> Ping:
        """Round trip to the peer and back (raises PingTimeout, ConnectionClosedError)."""
        if self._successor is not None:
            return self._successor.ping(timeout)
        outcome: Outcome[Ping] = Outcome()
        with self._lock:
            self._start_ping(timeout, outcome)
        result: Ping = self._outcome(outcome)
        return result

    def receive(self, timeout: float | None = None) -> object:
        """The next message no listener took, waiting up to ``timeout`` seconds (None: forever) while
        the calling thread runs the cycles; raises ReceiveTimeout, or ConnectionClosedError once the
        connection ended and its inbox is empty (a connection that took over this one's session, a
        reconnect's or a resumed buffered session's, is read from then on)."""
        if self._successor is not None and not self._inbox:
            return self._successor.receive(timeout)
        deadline_ns = None if timeout is None else time.monotonic_ns() + int(timeout * 1e9)
        self._drive(lambda: bool(self._inbox) or self._machine.closed, self._arrived.wait, deadline_ns)
        with self._lock:
            if self._inbox:
                message = self._inbox.popleft()
                if not self._inbox:
                    self._arrived.clear()
                return message
        if self._successor is not None:
            return self._successor.receive(
                None if deadline_ns is None else max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9)
            )
        if self._machine.closed:
            raise ConnectionClosedError(f"connection {self.id} is closed")
        raise ReceiveTimeout(f"connection {self.id}: no message within {timeout:g} s")

    def close(self) -> None:
        """Close gracefully: the peer hears CLOSE at once; ``on_disconnect`` runs on both sides. Waits until it
        has ended, except in a listener (the thread that cycles: it ends as the cycles go on)."""
        with self._lock:
            self.close_now("closed by the application")
        if self._poller.cycling:
            return
        closed = _event(self._closed_event)
        self._drive(closed.is_set, closed.wait, time.monotonic_ns() + int((self.send_timeout + _SAFETY_S) * 1e9))

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until the connection has ended (True) or ``timeout`` seconds passed (False)."""
        closed = _event(self._closed_event)
        deadline_ns = None if timeout is None else time.monotonic_ns() + int(timeout * 1e9)
        return bool(self._drive(closed.is_set, closed.wait, deadline_ns))

    # -- for the owner ----------------------------------------------------------------------------

    def keep(self, message: object) -> bool:
        """A message no listener took: into the inbox for ``receive`` (not a file: its temporary copy
        goes once the listeners are done, so it is reported as undispatched instead)."""
        if isinstance(message, Path):
            return False
        self._inbox.append(message)
        self._arrived.set()
        return True

    def release_step(self, deadline_ns: int, now_ns: int) -> bool:
        """One step of releasing the streams of a finished connection: True once its last records were
        handed to the transport (or ``deadline_ns`` passed); then :meth:`release_now`, after a grace."""
        if self._link.outbox and now_ns < deadline_ns:
            self.flush()
            return False
        return True

    def release_now(self) -> None:
        """Close the streams and remove temporary files not yet released."""
        self._link.close()
        self._machine.shutdown()

    def flush(self) -> int:
        self._flushed_ns = time.monotonic_ns()
        return super().flush()

    def _reading_paused(self) -> bool:
        return len(self._inbox) >= INBOX_LIMIT

    # -- internals ----------------------------------------------------------------------------------

    def _outcome(self, outcome: Outcome[Any]) -> Any:
        """Run the cycles until ``outcome`` is in (the machine's timers end every wait), then its result;
        InboxFull if the inbox fills meanwhile (then the answer could not be read)."""
        self._drive(lambda: outcome.done() or self._reading_paused(), outcome.wait, None)
        if not outcome.done():
            raise InboxFull(
                f"connection {self.id}: {len(self._inbox)} messages wait for receive(), and nothing more is "
                "read (the answer included) until they are taken"
            )
        return outcome.result()

    def _successor_within(self, seconds: float) -> Connection:
        """The connection that takes over, once there is one (SendTimeout after ``seconds``)."""
        handed = _event(self._handed_over)
        self._drive(handed.is_set, handed.wait, time.monotonic_ns() + int(seconds * 1e9))
        if self._successor is not None:
            return self._successor
        raise self._no_successor(seconds)

    def _wait_room(self) -> None:
        deadline_ns = time.monotonic_ns() + int(self.send_timeout * 1e9)
        if not self._drive(lambda: not self._full() or self._machine.closed, _event(self._room).wait, deadline_ns):
            raise SendTimeout(f"connection {self.id}: the transport took nothing for {self.send_timeout:g} s")
        if self._machine.closed:
            raise ConnectionClosedError("the connection is closed")

    def _send(self, message: object) -> None:
        """A message outside a burst (see :meth:`_after_append`) is sealed alone and offered at once."""
        message = self.outgoing(message)
        self._note_application()
        now_ns = time.monotonic_ns()
        burst = self._in_burst(now_ns)
        if not burst and self._offer_alone(message):
            self._flushed_ns = now_ns
            if self._udp:
                self._owner.send_now(self._link.publication)
        else:
            self._machine.send(message)
            self._flush_or_kick(burst)
        self._appended_ns = time.monotonic_ns()  # (after the offer: the gap is the application's own)

    def _after_append(self) -> None:
        """What the application appended leaves now, from its own thread (over UDP an invoker-mode driver
        sends it at once), unless it comes right after the last append: a burst shares records, offered
        every :data:`_BURST_FLUSH_NS`, and its tail goes with the poll thread's next cycle (within a
        millisecond; it is woken if it is in a longer pause)."""
        self._note_application()
        self._flush_or_kick(self._in_burst(time.monotonic_ns()))
        self._appended_ns = time.monotonic_ns()

    def _in_burst(self, now_ns: int) -> bool:
        """Whether an append at ``now_ns`` comes right after the last one (a loop of sends)."""
        return now_ns - self._appended_ns < _BURST_GAP_NS and now_ns - self._flushed_ns < _BURST_FLUSH_NS

    def _flush_or_kick(self, burst: bool) -> None:
        """In a burst, leave what was appended for the next offer (or the poll thread); else offer it now."""
        if burst and self._machine.sealed_count < _BATCH:
            self._kick(long_only=True)
        elif self.flush() and self._udp:
            self._owner.send_now(self._link.publication)
