"""``Connection`` for asyncio: :class:`~..connected.ConnectionBase` waiting with asyncio futures and events.

Plain listeners run inline on the receive path (the fastest way: no task per message); coroutine
listeners are scheduled as tasks so they never block it. A message nobody listens for is reported to
``on_error`` (MessageDispatchError), never dropped silently.

Each connection also carries ``rmi`` (remote objects: :class:`~.rmi.RmiSession`), and streams
large messages and files (``await connection.send(Path(...))``): progress is in ``transfers``, a
stream that fails is reported to ``on_error`` on both sides as a StreamingError.

The server or client that runs a connection (its :class:`ConnectionOwner`) drives it through a small
public surface: :meth:`Connection.poll` (one duty cycle), :meth:`Connection.next_deadline_ns`,
:meth:`Connection.flush`, :meth:`Connection.close_now`, :meth:`Connection.hand_over` (a buffered
session's successor), :meth:`Connection.release_transport`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..buffered import Hold
from ..connected import BACKLOG_LIMIT, DRIVER_LOST, ConnectionBase, Flag
from ..errors import ConnectionClosedError, SendTimeout
from ..results import Ping
from .rmi import RmiSession

__all__ = ["BACKLOG_LIMIT", "DRIVER_LOST", "Connection"]

_SEAL_FLUSH = 8
"""Records sealed within one loop step after which ``send`` offers them at once."""


def _event(flag: Flag) -> asyncio.Event:
    assert isinstance(flag, asyncio.Event)
    return flag


class Connection(ConnectionBase[RmiSession]):
    """One connection between a server and a client; the same ``id`` on both sides. Made by servers and
    clients, never directly; a subclass named in the config (``connection_class``) overrides the hooks."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        super().__init__(**kwargs)

    def _flag(self) -> Flag:
        return asyncio.Event()

    def _rmi_kind(self) -> type[RmiSession]:
        return RmiSession

    # -- public -----------------------------------------------------------------------------------

    async def send(self, message: object) -> None:
        """Send ``message``, waiting out back-pressure up to ``send_timeout``; raises
        ConnectionClosedError, SendTimeout, UnregisteredTypeError. With a buffered session waiting for
        the peer, the message is queued for its return instead (UndeliveredError if the queue is full)."""
        if self._successor is not None:
            return await self._successor.send(message)
        verdict = self._hold_closed(message)
        if verdict is not None:  # closed (a Hold member's read costs more than this check on Python 3.11)
            if verdict is Hold.QUEUED:
                return
            if verdict is Hold.RECONNECTING:
                return await (await self._successor_within(self.send_timeout)).send(message)
        if self._full():
            await self._wait_room()
        self._send(message)

    async def send_sync(self, message: object, timeout: float | None = None) -> None:
        """Send ``message`` and wait until the remote's listeners have handled it (a buffered session's
        successor carries it; a closed connection raises ConnectionClosedError). ``timeout`` (default
        ``send_timeout``) bounds the wait for the acknowledgement; for a large message or a file it counts
        from the transfer's last progress: a stalled transfer is cancelled (the peer never gets it) and
        raises SendSyncTimeout; once every byte left it is not taken back, and the call returns even if no
        acknowledgement comes within ``timeout`` after that. A refusal (StreamRefused, naming the peer's
        limit) or a failed transfer (StreamingError) raises as soon as it is known."""
        if self._successor is not None:
            return await self._successor.send_sync(message, timeout)
        if self._full():
            await self._wait_room()
        future: asyncio.Future[None] = self._loop.create_future()
        self._start_sync(message, timeout, future)
        await future

    async def ping(self, timeout: float | None = None) -> Ping:
        """Round trip to the peer and back (raises PingTimeout, ConnectionClosedError)."""
        if self._successor is not None:
            return await self._successor.ping(timeout)
        future: asyncio.Future[Ping] = self._loop.create_future()
        self._start_ping(timeout, future)
        return await future

    async def close(self) -> None:
        """Close gracefully: the peer hears CLOSE at once; ``on_disconnect`` runs on both sides."""
        self.close_now("closed by the application")
        await _event(self._closed_event).wait()

    async def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until the connection has ended (True) or ``timeout`` seconds passed (False)."""
        try:
            await asyncio.wait_for(_event(self._closed_event).wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- for the owner ----------------------------------------------------------------------------

    async def _successor_within(self, seconds: float) -> Connection:
        """The connection that takes over, once there is one (SendTimeout after ``seconds``)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_event(self._handed_over).wait(), seconds)
        if self._successor is not None:
            return self._successor
        raise self._no_successor(seconds)

    def track(self, task: asyncio.Task[Any]) -> None:
        """An async listener of this connection runs as ``task``: it counts against ``max_pending_calls``."""
        self._work.started()
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._work.finished()
        self._dispatch_held()

    async def release_transport(self, close_timeout: float, grace_s: float) -> None:
        """Once the last records (the CLOSE frame) were handed to the transport, and ``grace_s`` more for
        the driver to send them, close the streams and remove temporary files not yet released."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + close_timeout
        while self._link.outbox and loop.time() < deadline:
            self.flush()
            await asyncio.sleep(0.005)
        await asyncio.sleep(grace_s)
        self._link.close()
        self._machine.shutdown()

    # -- sending internals ------------------------------------------------------------------------

    async def _wait_room(self) -> None:
        deadline = self._loop.time() + self.send_timeout
        room = _event(self._room)
        while self._full():
            if self._machine.closed:
                raise ConnectionClosedError("the connection is closed")
            room.clear()
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise SendTimeout(f"connection {self.id}: the transport took nothing for {self.send_timeout:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), remaining)

    def _send(self, message: object) -> None:
        """The first message since our last poll is sealed alone and offered at once (see :meth:`_after_append`)."""
        message = self.outgoing(message)
        if self._flush_scheduled or not self._offer_alone(message):
            self._machine.send(message)
            self._after_append()
            return
        self._owner.wake()
        self._flush_scheduled = True  # (what follows before our next poll shares records)
        if self._udp:
            self._owner.send_now(self._link.publication)

    def _after_append(self) -> None:
        self._owner.wake()
        if not self._flush_scheduled:
            # The first message since our last poll leaves at once (a lone request or reply does not wait
            # a turn of the loop); the ones that follow share records and go with the next poll, which the
            # wake above brings within a turn of the loop (no callback of our own: one per send cost more).
            self._flush_scheduled = True
            self._flush_out()
        elif self._machine.sealed_count >= _SEAL_FLUSH:
            self.flush()  # the driver sends these with the next flush_out or cycle, in larger batches

    def poll(self, now_ns: int, *, timers: bool = True) -> int:
        """One duty cycle (see :meth:`~..connected.ConnectionBase.poll`); what was sent since the last one
        goes out with it (over UDP the invoker-mode driver's cycle, which follows, sends it), and the next
        send leaves alone again."""
        self._flush_scheduled = False
        return super().poll(now_ns, timers=timers)

    def _flush_out(self) -> None:
        """Flush what the application sent, and over UDP have an invoker-mode driver send it at once:
        its next duty cycle comes a turn of the event loop later (about 30 us per message here)."""
        if self.flush() and self._udp:
            self._owner.send_now(self._link.publication)
