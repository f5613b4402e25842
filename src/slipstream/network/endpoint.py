"""What a server or client is before any event loop: its config's registrations (messages, remote
interfaces), its identity and settings store, its listeners, its error limiter and counters, and how a
connection's machine is put together (sized to its publication, with streams and remote objects). The
asyncio adapter's ``Endpoint`` builds on it; so would a blocking one."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..client import Context, Counter, DriverError, ExclusivePublication
from ..files.counters import NETWORK_ERRORS_TYPE_ID, NETWORK_RECORDS_DROPPED_TYPE_ID
from .buffered import Hold
from .config import ClientConfig, ServerConfig
from .connection import ConnectionMachine
from .delivery import ACK_ROOM, Delivery
from .driverstats import DriverStats, read_driver_stats
from .errors import UndeliveredError
from .events import Closed
from .frames import FRAME_OVERHEAD
from .limits import SpillQuota, Workload
from .listeners import Listeners
from .registrations import Registrations
from .reporting import ErrorLimiter
from .rmi import ObjectTable, RemoteCalls, RmiEndpoint, RmiRegistry, StreamsChannel
from .serialization import Serialization
from .session import RECORD_OVERHEAD, Records
from .store import AppSettings, SettingsStore
from .streamfiles import StreamFiles
from .streaming import Streams

__all__ = ["ONE_FRAME_CHUNKS_FROM", "ConnectionOwner", "EndpointCore", "Polled"]

ONE_FRAME_CHUNKS_FROM = 16 * 1024
"""A frame payload (the MTU less the header) from which a stream's chunks are cut to fit one frame."""

log = logging.getLogger("slipstream.network")

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", contravariant=True)


class ConnectionOwner(Protocol[C]):
    """What an adapter's connection (``C``) asks of the server or client that runs it."""

    listeners: Listeners

    def wake(self) -> None:
        """Run the next duty cycle now (the application handed over something to send)."""

    def send_now(self, publication: ExclusivePublication) -> None:
        """Have an invoker-mode driver send what ``publication`` was just given."""

    def dispatch(self, connection: C, message: object, sync_id: int, stream_id: int) -> None:
        """Run the message listeners for ``message`` (then acknowledge ``sync_id``, release ``stream_id``)."""

    def report_error(self, connection: C | None, error: BaseException) -> None:
        """Tell the ``on_error`` listeners."""

    def connection_ended(self, connection: C, event: Closed) -> None:
        """The connection closed (called once): release it, run ``on_disconnect`` when due."""

    def record_dropped(self, connection: C) -> None:
        """A record that did not open (tampered, replayed, forged) was dropped."""

    def round_trip(self, connection: C, round_trip_ns: int) -> None:
        """A ping's round trip completed."""

    def hold(self, connection: C, message: object) -> Hold:
        """A message for a closed connection: queued for a buffered session's peer, or not."""


class Polled(Protocol):
    """What the poller asks of a server or client."""

    @property
    def context(self) -> Context | None:
        """The driver context it uses (None before the first bind or connect)."""

    def duty_cycle(self, now_ns: int) -> int:
        """One duty cycle; the work done."""

    def poll_connections(self, now_ns: int) -> int:
        """Only the connections' part of the duty cycle (what arrived, their output; their timers wait for
        the next :meth:`duty_cycle`); the work done. A poller whose watch saw a frame arrive runs this: the
        reply leaves before the chores."""

    def next_deadline_ns(self, now_ns: int) -> int | None:
        """When the next duty cycle is due if nothing arrives."""

    def report_error(self, connection: None, error: BaseException) -> None:
        """Tell the ``on_error`` listeners."""


class EndpointCore:
    """Base of every adapter's Server and Client: listener decorators, registrations, identity."""

    _role = "endpoint"

    def __init__(self, config: ServerConfig | ClientConfig) -> None:
        self.config = config
        self.listeners = Listeners()
        self.serialization = Serialization(config.messages)
        self.rmi_registry = RmiRegistry(config.interfaces, messages=self.serialization, exceptions=config.exceptions)
        """The RMI interfaces (and this side's implementations) and exception types of the config."""
        self.registrations = Registrations(self.serialization, self.rmi_registry)
        """What the handshake compares with the peer's: message types and RMI interfaces."""
        path = config.store_path(self._role)
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.store = SettingsStore(path)
        """The settings store: this endpoint's identity, pinned server keys and ``settings``."""
        self.private_key, self.public_key = self.store.identity(claim=self._role == "client")  # (see ..store)
        self.settings: AppSettings = self.store.app
        """The application's own settings, kept in the settings store's file beside the identity and
        pins but apart from them: ``server.settings.set("theme", "dark")``, ``.get``, ``.delete``, ``.keys``."""
        self.records_dropped = 0
        """Records this endpoint's connections dropped, unopened: tampered, replayed, forged or malformed
        (each connection's ``stats`` splits its own by reason). Also a counter in the driver's counters
        file while the endpoint holds a driver, which ``slipstream stat`` shows as ``net records dropped``."""
        self.spill_quota = SpillQuota(config.spill_quota) if isinstance(config, ServerConfig) else None
        """Disk for incoming streams, shared by every connection of a server (a client: unbounded)."""
        self.errors = 0
        """Errors this endpoint met (messages nobody listens for or that failed to decode, listeners that
        failed...), whether ``on_error`` heard them or they were counted as repeats; also the ``net errors``
        counter in the driver's counters file while the endpoint holds a driver."""
        self._limiter = ErrorLimiter()
        self._counters: dict[int, Counter] = {}
        self._context: Context | None = None

    @property
    def context(self) -> Context | None:
        """The driver context this endpoint holds (None before the first bind or connect, after close)."""
        return self._context

    def driver_stats(self) -> DriverStats:
        """A snapshot of the media driver this endpoint holds (embedded, invoker or external): counters,
        per-stream backlog, distinct errors, loss report, pid and version, read from the driver's files
        as ``slipstream stat`` reads them (a few milliseconds: safe on the event loop).

        Raises ``DriverNotAttachedError`` before the first bind or connect, after close, and after the
        driver was lost (until a recovering endpoint holds one again)."""
        return read_driver_stats(self._context, f"{self._role} {self.config.app_id}")

    @property
    def errors_suppressed(self) -> int:
        """Errors counted instead of reported to ``on_error``: repeats of one kind from one source
        (``on_error`` hears the first, then an ErrorsSuppressed with the count)."""
        return self._limiter.suppressed

    def admit_error(self, source: int | None, error: BaseException, now_ns: int) -> bool:
        """Count ``error`` (from connection ``source``, None: the endpoint); whether ``on_error`` hears it
        now (the first of its kind from its source in a while, and passed by ``config.error_filter``) or it
        is counted only."""
        self.errors += 1
        self._set_counter(NETWORK_ERRORS_TYPE_ID, self.errors)
        return self._passes_filter(error) and self._limiter.admit(source, error, now_ns)

    def _passes_filter(self, error: BaseException) -> bool:
        """``config.error_filter``'s verdict; a filter that fails lets the error through (and is logged)."""
        keep = self.config.error_filter
        if keep is None:
            return True
        try:
            return bool(keep(error))
        except Exception:
            log.exception("error_filter failed on %r", error)
            return True

    # -- listener decorators ----------------------------------------------------------------------

    def on_init(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` before ``on_connect``, for per-connection set-up."""
        self.listeners.init.append(listener)
        return listener

    def on_connect(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` when a connection is up."""
        self.listeners.connect.append(listener)
        return listener

    def on_disconnect(self, listener: F) -> F:
        """Decorator: ``listener(connection)`` once per connection when it ends."""
        self.listeners.disconnect.append(listener)
        return listener

    def on_error(self, listener: F) -> F:
        """Decorator: ``listener(connection_or_None, exception)`` for listener failures, messages
        nobody listens for, and messages that failed to decode."""
        self.listeners.error.append(listener)
        return listener

    def on_message(self, kind: type) -> Callable[[F], F]:
        """Decorator: ``listener(connection, message)`` for messages of ``kind`` (and subclasses)."""

        def register(listener: F) -> F:
            self.listeners.add_message(kind, listener)
            return listener

        return register

    # -- a connection's machine -------------------------------------------------------------------

    def _new_machine(
        self,
        records: Records,
        expiry_ns: int,
        publication: ExclusivePublication,
        files: StreamFiles,
        global_objects: ObjectTable | None,
        delivery: Delivery | None = None,
    ) -> ConnectionMachine:
        """A connection's machine sized to its publication, streaming large messages and files (their I/O
        through ``files``) and carrying remote objects (the server passes its global objects)."""
        config = self.config
        now_ns = time.monotonic_ns()
        max_record = publication.max_message_length
        overhead = RECORD_OVERHEAD + (ACK_ROOM if delivery is not None else 0)  # (room for a piggybacked ack)
        chunk_record = max_record - overhead
        if publication.max_payload_length >= ONE_FRAME_CHUNKS_FROM:
            # A chunk's record fits one frame of the log (IPC: 64 KiB): read in place on the other side,
            # where a fragmented record would first be copied together by the assembler.
            chunk_record = min(chunk_record, publication.max_payload_length - overhead)
        streams = Streams(
            files=files,
            chunk_payload=chunk_record - FRAME_OVERHEAD,
            spill_threshold=config.spill_threshold,
            max_stream_size=config.max_stream_size,
            max_message_size=config.max_message_size,
            quota=self.spill_quota,
            temp_dir=None if config.temp_directory is None else os.fspath(config.temp_directory),
        )
        rmi = RmiEndpoint(
            self.rmi_registry,
            global_objects=global_objects,
            files=StreamsChannel(streams),
            tracebacks=config.rmi_tracebacks,
        )
        return ConnectionMachine(
            records=records,
            serialization=self.serialization,
            now_ns=now_ns,
            expiry_ns=expiry_ns,
            batch_limit=publication.max_payload_length - RECORD_OVERHEAD,
            max_record=max_record,
            wall_offset_ns=time.time_ns() - now_ns,
            streams=streams,
            rmi=RemoteCalls(rmi, streams, Workload(config.max_pending_calls)),
            delivery=delivery,
        )

    def _undelivered(
        self, where: str, delivery: Delivery | None, queued: tuple[object, ...] = ()
    ) -> UndeliveredError | None:
        """What a session that ended for good never delivered (its unacknowledged messages, oldest first,
        then ``queued``), as the error to report; None when everything arrived."""
        messages = (*(() if delivery is None else delivery.end(self.serialization)), *queued)
        if not messages:
            return None
        return UndeliveredError(f"{where}: {len(messages)} messages were not delivered", messages)

    # -- the endpoint's counters in the driver's counters file ------------------------------------

    def _add_counters(self, context: Context) -> None:
        """The ``records_dropped`` and ``errors`` counters in the driver's counters file (a context may be
        shared: each endpoint has its own, keyed by its public key). Not having them never stops the endpoint."""
        where = f"{self._role} {self.config.app_id} pid {os.getpid()} {self.public_key[:4].hex()}"
        for type_id, name, value in (
            (NETWORK_RECORDS_DROPPED_TYPE_ID, "net records dropped", self.records_dropped),
            (NETWORK_ERRORS_TYPE_ID, "net errors", self.errors),
        ):
            try:
                counter = context.add_counter(type_id, f"{name}: {where}", self.public_key)
            except DriverError as exc:
                log.warning("no %s counter in %s: %s", name, context.directory, exc)
                continue
            counter.set(value)
            self._counters[type_id] = counter

    def _close_counters(self) -> None:
        counters, self._counters = self._counters, {}
        for counter in counters.values():
            counter.close()

    def _set_counter(self, type_id: int, value: int) -> None:
        counter = self._counters.get(type_id)
        if counter is not None:
            counter.set(value)

    def record_dropped(self, connection: object) -> None:
        """A connection dropped a record it could not open (counted in its stats too)."""
        self.records_dropped += 1
        self._set_counter(NETWORK_RECORDS_DROPPED_TYPE_ID, self.records_dropped)
