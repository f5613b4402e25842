"""``RecordingConfig``: how servers, clients and the standalone driver turn recording on by configuration.

The network layer holds one of these in its configuration (off by default: ``directory=None``) and,
when enabled, opens a recorder with :meth:`RecordingConfig.open` and records its events and periodic
statistics through it (``recorder.record(handshake_rejected(...))``, ``ConnectionStats(...)`` every
``stats_interval_s``). It is plain data, so it can live in any configuration file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import RecordError
from .recorder import Recorder, RecorderConfig, default_writer_id


@dataclass(frozen=True)
class RecordingConfig:
    """Recording switched on by configuration. ``directory=None`` means off."""

    directory: Path | None = None
    recorder: RecorderConfig = field(default_factory=RecorderConfig)
    stats_interval_s: float = 1.0
    """How often per-connection and per-stream statistics are sampled."""
    capture_messages: bool = False
    """Also capture whole messages (kind ``captured``, typed kinds for registered types)."""
    driver_counters: bool = True
    """Sample the driver's counters, loss report and error log (``DriverSampler``)."""

    def __post_init__(self) -> None:
        if not self.stats_interval_s > 0:
            raise RecordError(f"RecordingConfig.stats_interval_s must be positive: {self.stats_interval_s}")

    @property
    def enabled(self) -> bool:
        """True when a directory is set."""
        return self.directory is not None

    def open(self, role: str) -> Recorder | None:
        """A recorder writing into ``directory/<role>-<host>-<pid>``, or None when recording is off."""
        if self.directory is None:
            return None
        return Recorder(self.directory, writer_id=default_writer_id(role), config=self.recorder)
