"""What the media driver under a server or client is doing: ``server.driver_stats()``.

The seed's endpoint hands out its driver's counters, backlog, error log, loss report and version; here
they come from the same readers as ``slipstream stat | backlog | errors | loss``
(:mod:`slipstream.files.observe`), pointed at the directory of the driver the endpoint holds, and are
returned as one frozen snapshot an application can keep, compare or log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..client import Context
from ..files import observe
from ..files.cnc import CncError
from ..files.counters import SYSTEM_COUNTER_TYPE_ID, CounterInfo
from ..files.error_log import ErrorRecord
from ..files.loss_report import LossEntry
from ..files.observe import DriverStatus, StreamBacklog
from .errors import DriverNotAttachedError

__all__ = ["DriverStats", "read_driver_stats"]


@dataclass(frozen=True, slots=True)
class DriverStats:
    """A snapshot of the endpoint's media driver: its status and counters, the backlog of every stream
    it carries, its distinct errors and its loss report (each as ``slipstream stat``, ``backlog``,
    ``errors`` and ``loss`` show them, for the whole driver: a shared driver shows every process's streams)."""

    status: DriverStatus
    """Pid, start time, heartbeat, liveness and every counter (``status.counters``)."""
    backlog: tuple[StreamBacklog, ...]
    """Per stream: the producer's, sender's, receiver's and each subscriber's position, and how far behind."""
    errors: tuple[ErrorRecord, ...]
    """Each distinct error once, with its count and first and last time seen."""
    loss: tuple[LossEntry, ...]
    """One entry per image that saw a gap."""
    embedded: bool
    """True when this process started the driver (``driver="embedded"``, ``"invoker"`` or ``"auto"``
    finding none running); False when it attached to one (``slipstream driver``)."""
    invoker: bool
    """True when the driver has no thread and runs in the endpoint's event loop (``driver="invoker"``)."""

    @property
    def directory(self) -> Path:
        """The driver's directory."""
        return self.status.directory

    @property
    def pid(self) -> int:
        """The process the driver runs in (this one when embedded)."""
        return self.status.pid

    @property
    def version(self) -> str:
        """The version of the driver's file layout (``cnc.dat``) as major.minor.patch, as the seed's
        ``driverVersion()``: drivers and clients that differ in it cannot share a directory."""
        v = self.status.cnc_version
        return f"{(v >> 16) & 0xFF}.{(v >> 8) & 0xFF}.{v & 0xFF}"

    @property
    def counters(self) -> tuple[CounterInfo, ...]:
        """Every allocated counter, system counters first."""
        return self.status.counters

    @property
    def system(self) -> dict[str, int]:
        """The system counters by label (``"Bytes sent"``, ``"Errors"``, ``"NAKs received"``...)."""
        return {c.label: c.value for c in self.status.counters if c.type_id == SYSTEM_COUNTER_TYPE_ID}

    def streams(self, *, session_id: int | None = None, stream_id: int | None = None) -> tuple[StreamBacklog, ...]:
        """The backlog entries of the streams with this session id and/or stream id (a connection's:
        ``connection.publication.session_id`` and ``.stream_id``)."""
        return tuple(
            s
            for s in self.backlog
            if (session_id is None or s.session_id == session_id) and (stream_id is None or s.stream_id == stream_id)
        )


def read_driver_stats(context: Context | None, holder: str) -> DriverStats:
    """Read the stats of the driver ``context`` is attached to; ``DriverNotAttachedError`` when there is
    none (``holder`` names the endpoint in the message), it was lost, or another driver took its place."""
    if context is None:
        raise DriverNotAttachedError(f"{holder} holds no media driver (not bound or connected yet, or closed)")
    if context.driver_error is not None:
        raise DriverNotAttachedError(f"{holder} lost its media driver: {context.driver_error}")
    directory = context.directory
    try:
        status = observe.driver_status(directory)
        found_errors = observe.errors(directory)
        found_loss = observe.loss(directory)
    except (CncError, OSError) as exc:
        raise DriverNotAttachedError(f"{holder}: the files of its media driver are gone: {exc}") from exc
    if status.pid != context.driver_pid:
        raise DriverNotAttachedError(
            f"{holder}: the media driver in {directory} is now pid {status.pid}, not its pid {context.driver_pid}"
        )
    return DriverStats(
        status=status,
        backlog=tuple(observe.build_backlog(status.counters)),
        errors=tuple(found_errors),
        loss=tuple(found_loss),
        embedded=context.is_embedded,
        invoker=context.is_invoker,
    )
