"""The server's table of connections, sans-I/O: each accepted client from the streams the driver adds
for it to its ids going back to the allocators, and the buffered sessions that carry a lost peer's
messages over to its return.

Rules of this module (read these first):

1. A connection id enters at :meth:`ConnectionTable.open` (the handshake's ``ClientAccepted``: its ids,
   streams and port are allocated) and leaves when they go back through ``allocations`` (the
   handshake machine that allocated them). Between, it moves so::

       OPENING  --opened-->          STARTING   (deadline: the starting timeout)
       OPENING  --open_failed-->     OPENING on another port (PortReassigned), or released (OpeningFailed)
       STARTING --started-->         UP         (ConnectionStarted)
       STARTING --deadline-->        LINGERING  (StartTimedOut; deadline: the release delay)
       STARTING, UP --ended-->       LINGERING  (no deadline until streams_closed)
       LINGERING --streams_closed--> LINGERING  (deadline: the release delay)
       LINGERING --deadline-->       released   (ConnectionReleased)
       OPENING, STARTING --cancel--> released;  any --close--> released

   An input in a state that does not take it changes nothing and returns False: the adapter's late
   calls (after a timeout, or after ``close``) are normal.
2. Ports: a publication the driver refused over UDP is asked for again on another control port (the
   refused one is most likely held by another program), ``port_attempts`` ports in all; then, or for
   any other refusal, the connection is given up and its ids go back at once (no client heard of it).
3. The ids and port of a connection whose streams existed go back ``release_delay_ns`` after its
   streams closed (or its start timed out), never sooner: packets for the old owner, still in flight,
   must not reach a new one.
4. Admission counts the connections OPENING, STARTING and UP, in total and per address; LINGERING
   ones hold ids but count no more.
5. Buffered sessions (``sessions``, keyed by the peer's public key): an UP connection that is lost (not
   closed) leaves its peer's session waiting, and what is sent to it meanwhile is held (:meth:`hold`).
   When the key starts a connection again in time, ``ConnectionStarted`` names the lost one it resumes
   and carries the queue, to send first; the lost one's ``on_disconnect`` is due then. A session that
   expires, is closed, or whose connection id is handed out again ends with ``SessionEnded`` and
   what was never delivered; its ``on_disconnect`` is due then. One session waits per key. A key that
   starts a connection while its earlier one is still UP (a restarted client, before its old connection
   was seen lost) moves its session to the new one: the old one's end, lost or closed, leaves that session
   alone, and :meth:`ConnectionTable.successor` names the connection that carries it now.
6. One ``deadline_ns`` (starting timeouts, release delays, session expiries), :meth:`handle_timer` at
   or after it; pure-data events (:data:`~.events.TableEvent`) from :meth:`take_events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol

from .buffered import BufferedSessions, Hold, SessionExpired
from .events import (
    ClientAccepted,
    ConnectionReleased,
    ConnectionStarted,
    OpeningFailed,
    PortReassigned,
    SessionEnded,
    StartTimedOut,
    TableEvent,
)

__all__ = ["PORT_ATTEMPTS", "RELEASE_DELAY_NS", "Allocations", "ConnectionState", "ConnectionTable"]

PORT_ATTEMPTS: Final = 5
"""Control ports tried for one connection when the driver cannot bind one (another socket holds it)."""
RELEASE_DELAY_NS: Final = 1_000_000_000
"""Ids and ports of a closed connection return to the pools this long after its streams closed."""


class Allocations(Protocol):
    """Where connections' ids and ports come from (a :class:`~.handshake.ServerHandshake` is one)."""

    def reallocate_port(self, connection_id: int) -> int | None:
        """Another control port for the connection (the old one goes back); None when none is left."""
        ...

    def release(self, connection_id: int) -> bool:
        """Give the connection's ids and port back; False if unknown."""
        ...


class ConnectionState(Enum):
    """Where a connection id is in its life (rule 1)."""

    OPENING = "the driver is adding its publication and subscription"
    STARTING = "its streams exist; waiting for the client's stream and for ours to reach it"
    UP = "up"
    LINGERING = "ended; its ids wait for its streams to close and the release delay"
    RELEASED = "nothing is held for it"


_ADMITTED: Final = frozenset({ConnectionState.OPENING, ConnectionState.STARTING, ConnectionState.UP})


@dataclass(slots=True)
class _Entry:
    address: str | None
    tag: str
    key: bytes
    port: int
    """The control port the publication is asked for (0 over IPC)."""
    state: ConnectionState = ConnectionState.RELEASED
    ports_tried: int = 1


class ConnectionTable:
    """Every connection a server holds ids for: its state, deadline and buffered session (rules above)."""

    def __init__(
        self,
        *,
        allocations: Allocations,
        starting_timeout_ns: int,
        release_delay_ns: int = RELEASE_DELAY_NS,
        port_attempts: int = PORT_ATTEMPTS,
        sessions: BufferedSessions[object] | None = None,
    ) -> None:
        if starting_timeout_ns <= 0 or release_delay_ns < 0 or port_attempts < 1:
            raise ValueError("starting_timeout_ns > 0, release_delay_ns >= 0 and port_attempts >= 1 are needed")
        self.allocations = allocations
        self.starting_timeout_ns = starting_timeout_ns
        self.release_delay_ns = release_delay_ns
        self.port_attempts = port_attempts
        self.sessions = sessions
        """The buffered sessions (None: lost peers are not waited for)."""
        self._entries: dict[int, _Entry] = {}
        self._timers: dict[int, int] = {}
        """Connection id -> its deadline, for those STARTING or LINGERING with one (few: the ones in passing)."""
        self._admitted = 0
        self._per_address: dict[str, int] = {}
        self._waiting: dict[bytes, int] = {}
        """Peer key -> the lost connection its buffered session waits for."""
        self._waiting_key: dict[int, bytes] = {}
        self._holders: dict[bytes, int] = {}
        """Peer key -> the UP connection its buffered session belongs to (with sessions only)."""
        self._events: list[TableEvent] = []

    # -- outputs ------------------------------------------------------------------------------------

    def take_events(self) -> list[TableEvent]:
        """Events since the last call."""
        events, self._events = self._events, []
        return events

    @property
    def deadline_ns(self) -> int | None:
        """When :meth:`handle_timer` is next due."""
        due = min(self._timers.values(), default=None)
        session_due = None if self.sessions is None else self.sessions.deadline_ns
        if due is None or (session_due is not None and session_due < due):
            return session_due
        return due

    def state(self, connection_id: int) -> ConnectionState:
        """Where ``connection_id`` is (RELEASED when nothing is held for it)."""
        entry = self._entries.get(connection_id)
        return ConnectionState.RELEASED if entry is None else entry.state

    def ids(self, state: ConnectionState) -> list[int]:
        """The connection ids in ``state`` (RELEASED: none, they are not held)."""
        return [connection_id for connection_id, entry in self._entries.items() if entry.state is state]

    @property
    def admitted(self) -> int:
        """Connections that count against the limits: OPENING, STARTING or UP."""
        return self._admitted

    def admitted_from(self, address: str) -> int:
        """Those of :attr:`admitted` from ``address``."""
        return self._per_address.get(address, 0)

    def __len__(self) -> int:
        """Connection ids held (LINGERING ones included)."""
        return len(self._entries)

    # -- inputs -------------------------------------------------------------------------------------

    def open(self, accepted: ClientAccepted, now_ns: int) -> bool:
        """The handshake accepted a client: its streams are being asked of the driver (OPENING)."""
        connection_id = accepted.connection_id
        if connection_id in self._entries:
            return False
        key = self._waiting_key.get(connection_id)
        if key is not None and self.sessions is not None:
            # A lost connection's id goes to a new one: its session ends now, so that no message meant
            # for one peer can follow the id to another.
            self.sessions.expire(key)
            self._session_events()
        entry = _Entry(accepted.address, accepted.tag, accepted.remote_public_key, accepted.control_port)
        self._entries[connection_id] = entry
        self._move(connection_id, entry, ConnectionState.OPENING)
        return True

    def open_failed(self, connection_id: int, reason: str, now_ns: int, *, publication: bool) -> bool:
        """The driver refused the connection's publication (``publication``) or its subscription: a
        new control port (PortReassigned), or the connection given up (OpeningFailed, released)."""
        entry = self._entry(connection_id, ConnectionState.OPENING)
        if entry is None:
            return False
        if publication and entry.port and entry.ports_tried < self.port_attempts:
            port = self.allocations.reallocate_port(connection_id)
            if port is not None:
                self._events.append(PortReassigned(connection_id, entry.port, port, reason))
                entry.port = port
                entry.ports_tried += 1
                return True
        self._events.append(OpeningFailed(connection_id, reason))
        self._release(connection_id, entry)
        return True

    def opened(self, connection_id: int, now_ns: int) -> bool:
        """Both streams exist (and the client was told): STARTING, until the starting timeout."""
        entry = self._entry(connection_id, ConnectionState.OPENING)
        if entry is None:
            return False
        self._move(connection_id, entry, ConnectionState.STARTING, now_ns + self.starting_timeout_ns)
        return True

    def started(self, connection_id: int, now_ns: int) -> bool:
        """The client's stream reached us and ours reached it: UP (ConnectionStarted, with the session
        it resumes, if any)."""
        entry = self._entry(connection_id, ConnectionState.STARTING)
        if entry is None:
            return False
        self._move(connection_id, entry, ConnectionState.UP)
        resumes: int | None = None
        queued: tuple[object, ...] = ()
        sessions = self.sessions
        if sessions is not None:
            buffered = sessions.wants_buffering(entry.address, entry.tag)
            queued = tuple(sessions.connected(entry.key, now_ns, buffered=buffered))
            self._session_events()  # a session past its expiry whose timer has not run ends first
            resumes = self._waiting.pop(entry.key, None)
            if resumes is not None:
                del self._waiting_key[resumes]
            self._holders[entry.key] = connection_id
        self._events.append(ConnectionStarted(connection_id, resumes, queued))
        return True

    def ended(self, connection_id: int, now_ns: int, *, lost: bool) -> bool:
        """The connection closed (``lost``: its peer went silent or its stream ended without a CLOSE):
        LINGERING until :meth:`streams_closed`. True when a buffered session now waits for the peer
        (``on_disconnect`` comes later, with ConnectionStarted or SessionEnded); False: it is due now."""
        entry = self._entry(connection_id, ConnectionState.STARTING, ConnectionState.UP)
        if entry is None:
            return False
        was_up = entry.state is ConnectionState.UP
        self._move(connection_id, entry, ConnectionState.LINGERING)
        sessions = self.sessions
        if not was_up or sessions is None or self._holders.get(entry.key) != connection_id:
            return False  # (a later connection of its key holds the session now: it goes on there)
        del self._holders[entry.key]
        if not lost:
            sessions.ended(entry.key)  # only a lost peer is waited for; a deliberate close ends the session
            return False
        if entry.key in self._waiting or not sessions.disconnected(entry.key, now_ns):
            return False
        self._waiting[entry.key] = connection_id
        self._waiting_key[connection_id] = entry.key
        return True

    def successor(self, connection_id: int) -> int | None:
        """The UP connection that carries the buffered session of ``connection_id``'s peer, when it is a
        later one (what is sent to the earlier one belongs there)."""
        entry = self._entries.get(connection_id)
        holder = None if entry is None else self._holders.get(entry.key)
        return holder if holder != connection_id else None

    def streams_closed(self, connection_id: int, now_ns: int) -> bool:
        """The ended connection's streams are closed: its ids go back after the release delay."""
        entry = self._entry(connection_id, ConnectionState.LINGERING)
        if entry is None or connection_id in self._timers:
            return False
        self._move(connection_id, entry, ConnectionState.LINGERING, now_ns + self.release_delay_ns)
        return True

    def cancel(self, connection_id: int, now_ns: int) -> bool:
        """Give up on a connection OPENING or STARTING (the server closes): its ids go back now."""
        entry = self._entry(connection_id, ConnectionState.OPENING, ConnectionState.STARTING)
        if entry is None:
            return False
        self._release(connection_id, entry)
        return True

    def hold(self, connection_id: int, message: object) -> Hold:
        """A message sent to the ended connection ``connection_id``: queued for its peer's return,
        refused because that queue is full, or CLOSED (no session waits for the peer)."""
        key = self._waiting_key.get(connection_id)
        if key is None or self.sessions is None:
            return Hold.CLOSED
        if self.sessions.enqueue(key, message):
            return Hold.QUEUED
        self.sessions.take_events()  # its BufferOverflowed: the verdict tells the sender at once
        return Hold.FULL

    def handle_timer(self, now_ns: int) -> None:
        """Starts that timed out, ids due back, sessions that expired."""
        due = sorted((when, connection_id) for connection_id, when in self._timers.items() if when <= now_ns)
        for _, connection_id in due:
            entry = self._entries[connection_id]
            if entry.state is ConnectionState.STARTING:
                self._events.append(StartTimedOut(connection_id))
                self._move(connection_id, entry, ConnectionState.LINGERING, now_ns + self.release_delay_ns)
            else:
                self._release(connection_id, entry)
        if self.sessions is not None:
            self.sessions.handle_timer(now_ns)
            self._session_events()

    def close(self, now_ns: int) -> None:
        """The server closes: every waiting session ends (SessionEnded) and every id goes back now."""
        if self.sessions is not None:
            self.sessions.close()
            self._session_events()
        for connection_id, entry in list(self._entries.items()):
            self._release(connection_id, entry)

    # -- internals ----------------------------------------------------------------------------------

    def _entry(self, connection_id: int, *states: ConnectionState) -> _Entry | None:
        entry = self._entries.get(connection_id)
        return entry if entry is not None and entry.state in states else None

    def _move(self, connection_id: int, entry: _Entry, state: ConnectionState, deadline_ns: int | None = None) -> None:
        """Change state, keeping the admission counts (rule 4) and the timers."""
        change = (state in _ADMITTED) - (entry.state in _ADMITTED)
        if change:
            self._admitted += change
            if entry.address is not None:
                count = self._per_address.get(entry.address, 0) + change
                if count:
                    self._per_address[entry.address] = count
                else:
                    del self._per_address[entry.address]
        entry.state = state
        if deadline_ns is None:
            self._timers.pop(connection_id, None)
        else:
            self._timers[connection_id] = deadline_ns

    def _release(self, connection_id: int, entry: _Entry) -> None:
        if self._holders.get(entry.key) == connection_id:
            del self._holders[entry.key]
        self._move(connection_id, entry, ConnectionState.RELEASED)
        del self._entries[connection_id]
        self.allocations.release(connection_id)
        self._events.append(ConnectionReleased(connection_id))

    def _session_events(self) -> None:
        assert self.sessions is not None
        for event in self.sessions.take_events():
            if not isinstance(event, SessionExpired):
                continue  # BufferOverflowed: hold answered FULL already; SessionResumed: ConnectionStarted says so
            connection_id = self._waiting.pop(event.key, None)
            if connection_id is not None:
                del self._waiting_key[connection_id]
                self._events.append(SessionEnded(connection_id, event.undelivered))
