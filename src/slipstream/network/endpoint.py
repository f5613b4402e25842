"""What a server or client is before any event loop: its config's registrations (messages, remote
interfaces), its identity and settings store, its listeners, its records-dropped counter, and how a
connection's machine is put together (sized to its publication, with streams and remote objects). The
asyncio adapter's ``Endpoint`` builds on it; so would a blocking one."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..client import Context, Counter, DriverError, ExclusivePublication
from ..files.counters import NETWORK_RECORDS_DROPPED_TYPE_ID
from .config import ClientConfig, ServerConfig
from .connection import ConnectionMachine
from .frames import FRAME_OVERHEAD
from .listeners import Listeners
from .registrations import Registrations
from .rmi import ObjectTable, RemoteCalls, RmiEndpoint, RmiRegistry, StreamsChannel
from .serialization import Serialization
from .session import RECORD_OVERHEAD, Records
from .store import SettingsStore
from .streamfiles import StreamFiles
from .streaming import Streams

__all__ = ["ONE_FRAME_CHUNKS_FROM", "EndpointCore"]

ONE_FRAME_CHUNKS_FROM = 16 * 1024
"""A frame payload (the MTU less the header) from which a stream's chunks are cut to fit one frame."""

log = logging.getLogger("slipstream.network")

F = TypeVar("F", bound=Callable[..., Any])


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
        self.private_key, self.public_key = self.store.identity()
        self.records_dropped = 0
        """Records this endpoint's connections dropped, unopened: tampered, replayed, forged or malformed
        (each connection's ``stats`` splits its own by reason). Also a counter in the driver's counters
        file while the endpoint holds a driver, which ``slipstream stat`` shows as ``net records dropped``."""
        self._dropped_counter: Counter | None = None

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
    ) -> ConnectionMachine:
        """A connection's machine sized to its publication, streaming large messages and files (their I/O
        through ``files``) and carrying remote objects (the server passes its global objects)."""
        config = self.config
        now_ns = time.monotonic_ns()
        max_record = publication.max_message_length
        chunk_record = max_record - RECORD_OVERHEAD
        if publication.max_payload_length >= ONE_FRAME_CHUNKS_FROM:
            # A chunk's record fits one frame of the log (IPC: 64 KiB): read in place on the other side,
            # where a fragmented record would first be copied together by the assembler.
            chunk_record = min(chunk_record, publication.max_payload_length - RECORD_OVERHEAD)
        streams = Streams(
            files=files,
            chunk_payload=chunk_record - FRAME_OVERHEAD,
            spill_threshold=config.spill_threshold,
            max_stream_size=config.max_stream_size,
            temp_dir=None if config.temp_directory is None else os.fspath(config.temp_directory),
        )
        rmi = RmiEndpoint(self.rmi_registry, global_objects=global_objects, files=StreamsChannel(streams))
        return ConnectionMachine(
            records=records,
            serialization=self.serialization,
            now_ns=now_ns,
            expiry_ns=expiry_ns,
            batch_limit=publication.max_payload_length - RECORD_OVERHEAD,
            max_record=max_record,
            wall_offset_ns=time.time_ns() - now_ns,
            streams=streams,
            rmi=RemoteCalls(rmi, streams),
        )

    # -- the records-dropped counter --------------------------------------------------------------

    def _add_dropped_counter(self, context: Context) -> None:
        """The ``records_dropped`` counter in the driver's counters file (a context may be shared: each
        endpoint has its own, keyed by its public key). Not having one never stops the endpoint."""
        label = f"net records dropped: {self._role} {self.config.app_id} pid {os.getpid()} {self.public_key[:4].hex()}"
        try:
            counter = context.add_counter(NETWORK_RECORDS_DROPPED_TYPE_ID, label, self.public_key)
        except DriverError as exc:
            log.warning("no records-dropped counter in %s: %s", context.directory, exc)
            return
        counter.set(self.records_dropped)
        self._dropped_counter = counter

    def _close_dropped_counter(self) -> None:
        counter, self._dropped_counter = self._dropped_counter, None
        if counter is not None:
            counter.close()

    def record_dropped(self, connection: object) -> None:
        """A connection dropped a record it could not open (counted in its stats too)."""
        self.records_dropped += 1
        if self._dropped_counter is not None:
            self._dropped_counter.set(self.records_dropped)
