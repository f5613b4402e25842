"""What a connection's calls give back, whatever the adapter: a ping's times, a streamed transfer's
progress, and its counters. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import StreamingError
from .events import StreamFailed, StreamProgressed, StreamSent, StreamStarted
from .requests import stream_error

__all__ = ["ConnectionStats", "Ping", "Transfer", "Transfers", "connection_stats"]


@dataclass(frozen=True, slots=True)
class Transfer:
    """A large message or file on its way: bytes so far of ``total`` (``name``: a file's name)."""

    stream_id: int
    incoming: bool
    done: int
    total: int
    name: str = ""


@dataclass(frozen=True, slots=True)
class Ping:
    """A ping's result, as the seed's ``Ping``: seconds. ``outbound``/``inbound`` use each side's
    wall clock, so they include the difference between the two clocks."""

    round_trip: float
    outbound: float
    inbound: float


class Transfers(dict[tuple[bool, int], Transfer]):
    """Large messages and files in flight, by (incoming, stream id): bytes so far and total, as the
    connection's stream events say."""

    def record(
        self, event: StreamStarted | StreamProgressed | StreamSent | StreamFailed, where: str
    ) -> StreamingError | None:
        """Take ``event`` in; for a stream that failed, the error to report (``where``, the side, the id and
        why; typed by the limit that refused it, see :func:`~.requests.stream_error`)."""
        if isinstance(event, StreamStarted):
            key = (event.incoming, event.stream_id)
            self[key] = Transfer(event.stream_id, event.incoming, 0, event.total, event.name)
        elif isinstance(event, StreamProgressed):
            key = (event.incoming, event.stream_id)
            name = self[key].name if key in self else ""
            if event.done < event.total:
                self[key] = Transfer(event.stream_id, event.incoming, event.done, event.total, name)
            else:
                self.pop(key, None)  # all bytes in (incoming: delivered with the message)
        elif isinstance(event, StreamSent):
            self.pop((False, event.stream_id), None)
        else:
            self.pop((event.incoming, event.stream_id), None)
            side = "incoming" if event.incoming else "outgoing"
            text = f"{where}: {side} stream {event.stream_id} failed ({event.failure.name.lower()}): {event.detail}"
            return stream_error(event.failure, text)
        return None


@dataclass(slots=True)
class ConnectionStats:
    """Counters of one connection (records rejected are in the record layer's counters)."""

    messages_sent: int = 0
    messages_received: int = 0
    records_sent: int = 0
    records_received: int = 0
    bytes_sent: int = 0
    """Bytes of the records handed out to send (sealed: what the transport carries)."""
    bytes_received: int = 0
    """Bytes of the records received and accepted."""
    records_dropped: int = 0
    decode_errors: int = 0
    frame_errors: int = 0


def connection_stats(stats: ConnectionStats, records: object, back_pressure_events: int) -> dict[str, int]:
    """A connection's counters (its machine's ``stats`` and record layer): messages and records both ways, and
    records dropped (tampered, replayed...)."""
    return {
        "messages_sent": stats.messages_sent,
        "messages_received": stats.messages_received,
        "records_sent": stats.records_sent,
        "records_received": stats.records_received,
        "bytes_sent": stats.bytes_sent,
        "bytes_received": stats.bytes_received,
        "back_pressure_events": back_pressure_events,
        "records_dropped": stats.records_dropped,
        "decode_errors": stats.decode_errors,
        "rejected_malformed": int(getattr(records, "rejected_malformed", 0)),
        "rejected_tampered": int(getattr(records, "rejected_tampered", 0)),
        "rejected_replayed": int(getattr(records, "rejected_replayed", 0)),
    }
