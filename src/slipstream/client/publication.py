"""Publications: append messages to a stream's log in shared memory.

``offer`` copies a message in; ``try_claim`` hands out the frame's own memory to write into. Both
return the new stream position, or a negative code from ``slipstream.logbuffer.results`` that says
why nothing was written (never silently dropped).
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable
from functools import partial
from typing import Protocol

from ..errors import DriverError
from ..files.directory import close_mapping
from ..files.doorbell import ring_parked
from ..logbuffer import CLOSED, BufferClaim, ExclusiveAppender, LogBuffers
from ..logbuffer.layout import PARKED_WORD_INDEX


class Offer(Protocol):
    """The shape of ``offer``: append a message, return the new position or a negative result code."""

    def __call__(self, message: bytes | bytearray | memoryview, /, reserved_value: int = 0) -> int: ...


class ExclusivePublication:
    """A publication with a single writer thread: no locking on the hot path.

    ``offer(message, reserved_value=0)`` appends ``message`` and returns the new position, or
    NOT_CONNECTED / BACK_PRESSURED / ADMIN_ACTION / CLOSED / MAX_POSITION_EXCEEDED; it raises
    ValueError if the message exceeds ``max_message_length``. It is the log appender's own method
    (reading the driver's limit counter itself), so an offer costs one Python call.
    """

    def __init__(
        self,
        *,
        channel: str,
        stream_id: int,
        session_id: int,
        registration_id: int,
        mapping: mmap.mmap,
        limit_values: memoryview,
        limit_index: int,
        on_close: Callable[[ExclusivePublication], None],
        manage_destination: Callable[[int, str, bool], None] | None = None,
        doorbell: tuple[memoryview, int, Callable[[], None]] | None = None,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.session_id = session_id
        self.registration_id = registration_id
        self._mapping = mapping
        self._log = LogBuffers(memoryview(mapping))
        # UDP publications ring the doorbell: the driver does the sending, and may be parked in select.
        # IPC publications ring the subscribers parked in the log's parking table: after each append the
        # appender reads the parked word (one 8-byte read) and rings only if it is nonzero.
        if doorbell is None and channel.startswith("aeron:ipc"):
            meta = self._log.meta_i64
            doorbell = (meta, PARKED_WORD_INDEX, partial(ring_parked, meta))
        self._bell = doorbell
        self._appender = ExclusiveAppender(self._log, (limit_values, limit_index), doorbell)
        self.offer = self._appender.offer  # type: ignore[method-assign]
        self._limit_values = limit_values
        self._limit_index = limit_index
        self._on_close = on_close
        self._manage_destination = manage_destination
        self._closed = False
        self.driver_error: DriverError | None = None
        """Set (and the publication closed) when the media driver was lost; ``offer`` then returns CLOSED."""

    def try_claim(self, length: int, claim: BufferClaim) -> int:
        """Reserve a frame of ``length`` bytes (at most ``max_payload_length``) to write in place."""
        if self._closed:
            return CLOSED
        result = self._appender.claim(length, self._limit_values[self._limit_index], claim)
        if result > 0:
            claim._bell = self._bell
        return result

    @property
    def position(self) -> int:
        """Stream position after the last message appended here."""
        return self._appender.position

    @property
    def position_limit(self) -> int:
        """Position up to which the driver lets this publication write (flow control)."""
        return int(self._limit_values[self._limit_index])

    @property
    def is_connected(self) -> bool:
        """True while at least one subscriber is attached."""
        return not self._closed and self._log.is_connected

    @property
    def is_closed(self) -> bool:
        """True once closed by ``close`` or by the loss of the media driver."""
        return self._closed

    @property
    def max_message_length(self) -> int:
        """Longest message ``offer`` takes (bigger ones raise ValueError): fragments of up to a term's eighth."""
        return self._appender.max_message_length

    @property
    def max_payload_length(self) -> int:
        """Longest payload of one fragment (``mtu`` minus the header): the most ``try_claim`` takes."""
        return self._appender.max_payload_length

    @property
    def term_length(self) -> int:
        """Length of each of the log's three terms."""
        return self._log.term_length

    def add_destination(self, channel: str) -> None:
        """Manual multi-destination-cast (``control-mode=manual``): also send to ``aeron:udp?endpoint=H:P``.
        Raises RegistrationError if the driver refuses."""
        self._destination(channel, True)

    def remove_destination(self, channel: str) -> None:
        """Stop sending to a destination added with ``add_destination``."""
        self._destination(channel, False)

    def _destination(self, channel: str, add: bool) -> None:
        if self._closed or self._manage_destination is None:
            raise RuntimeError("the publication is closed")
        self._manage_destination(self.registration_id, channel, add)

    def close(self) -> None:
        """Close: subscribers receive everything offered so far, then see end of stream."""
        if self._closed:
            return
        self._closed = True
        self._appender.close()
        self._on_close(self)

    def offer(self, message: bytes | bytearray | memoryview, /, reserved_value: int = 0) -> int:
        """Append ``message``; returns the new stream position, or a negative code (NOT_CONNECTED,
        BACK_PRESSURED, ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED) saying why nothing was written.
        Raises ValueError if the message exceeds ``max_message_length``. (Each instance replaces this
        method with its log appender's own, so an offer costs one Python call; this is its documentation.)"""
        return self._appender.offer(message, reserved_value)

    def _lose(self, error: DriverError) -> None:
        """The driver is gone: close, and remember why (``offer_async`` raises it)."""
        self.driver_error = error
        self._release()

    def _release(self) -> None:
        """Drop the mapping (the client calls this once the driver knows)."""
        self._closed = True
        self._appender.close()
        close_mapping(self._mapping)

    def __enter__(self) -> ExclusivePublication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(channel={self.channel!r}, stream_id={self.stream_id}, "
            f"session_id={self.session_id}, position={self.position}, closed={self._closed})"
        )


class Publication(ExclusivePublication):
    """A publication that many threads of this process may offer to at once (a lock serialises them).

    Across processes each publisher has its own session: Aeron shares one log between processes using
    an atomic fetch-and-add on the tail, which Python cannot do on shared memory.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._lock = threading.Lock()
        self._offer_unlocked = self.offer
        self.offer = self._locked_offer  # type: ignore[method-assign]

    def _locked_offer(self, message: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        with self._lock:
            return self._offer_unlocked(message, reserved_value)

    def try_claim(self, length: int, claim: BufferClaim) -> int:
        with self._lock:
            return super().try_claim(length, claim)
