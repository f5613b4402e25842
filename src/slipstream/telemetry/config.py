"""``RecordingConfig``: how servers, clients and the standalone driver turn recording on by configuration.

The network layer holds one of these in its configuration (off by default: ``directory=None``) and,
when enabled, opens a recorder with :meth:`RecordingConfig.open` and records its events and periodic
statistics through it (``recorder.record(handshake_rejected(...))``, ``ConnectionStats(...)`` every
``stats_interval_s``). It is plain data, so it can live in any configuration file.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from .._extras import require_extra
from .capture import DriverSampler
from .errors import RecordError
from .recorder import Recorder, RecorderConfig, default_writer_id


@dataclass(frozen=True)
class RecordingConfig:
    """Recording switched on by configuration. ``directory=None`` means off.

    Attributes:
        directory (Path | None): The recording's root: each process records below it as a writer of its own
            (``net-<host>-<pid>`` for servers and clients), partitioned by date, hour and ``recorder.name``. None
            records nothing; a directory needs the ``telemetry`` extra. Default ``None``.
        recorder (RecorderConfig): How the recorder writes: flush interval, segment size and age, pending-row bound.
            Default ``RecorderConfig()``.
        stats_interval_s (float): How often per-connection and per-stream statistics are sampled. Default ``1.0``.
        capture_messages (bool): Also capture whole messages (kind ``captured``, typed kinds for registered types).
            Default ``False``.
        driver_counters (bool): Sample the driver's counters, loss report and error log (``DriverSampler``). Default
            ``True``.
        rtt_interval_s (float | None): Ping every connection this often, each pong recorded as an RTT sample (a
            ``connection_stats`` row with ``rtt_ns``): a p99 needs 100 samples, so 0.1 gives one per connection in 10 s.
            None: only the application's own pings are sampled. Default ``None``.
    """

    directory: Path | None = None
    """The recording's root: each process records below it as a writer of its own (``net-<host>-<pid>``
    for servers and clients), partitioned by date, hour and ``recorder.name``. None records nothing; a
    directory needs the ``telemetry`` extra."""
    recorder: RecorderConfig = field(default_factory=RecorderConfig)
    """How the recorder writes: flush interval, segment size and age, pending-row bound."""
    stats_interval_s: float = 1.0
    """How often per-connection and per-stream statistics are sampled."""
    capture_messages: bool = False
    """Also capture whole messages (kind ``captured``, typed kinds for registered types)."""
    driver_counters: bool = True
    """Sample the driver's counters, loss report and error log (``DriverSampler``)."""
    rtt_interval_s: float | None = None
    """Ping every connection this often, each pong recorded as an RTT sample (a ``connection_stats`` row with
    ``rtt_ns``): a p99 needs 100 samples, so 0.1 gives one per connection in 10 s. None: only the application's
    own pings are sampled."""

    def __post_init__(self) -> None:
        if not self.stats_interval_s > 0:
            raise RecordError(f"RecordingConfig.stats_interval_s must be positive: {self.stats_interval_s}")
        if self.rtt_interval_s is not None and not self.rtt_interval_s > 0:
            raise RecordError(f"RecordingConfig.rtt_interval_s must be positive (or None): {self.rtt_interval_s}")
        if self.directory is not None:  # fail where recording is asked for, not when the first file is written
            require_extra("telemetry", "recording (RecordingConfig.directory)")

    @property
    def enabled(self) -> bool:
        """True when a directory is set."""
        return self.directory is not None

    def open(self, role: str) -> Recorder | None:
        """A recorder writing into ``directory/<role>-<host>-<pid>``, or None when recording is off."""
        if self.directory is None:
            return None
        return Recorder(self.directory, writer_id=default_writer_id(role), config=self.recorder)

    def acquire(self, driver_directory: str | Path | None = None) -> Recorder | None:
        """The recorder this process shares for ``directory`` (None when recording is off).

        A directory holds one writer per live recorder, so every server and client of a process that
        records into the same place shares one (writer ``net-<host>-<pid>``), closed when the last one
        calls :meth:`release`. With ``driver_counters``, the driver at ``driver_directory`` is sampled
        once per recorder, however many endpoints use it.
        """
        if self.directory is None:
            return None
        key = str(Path(self.directory).resolve())
        with _shared_lock:
            shared = _shared.get(key)
            if shared is None:
                recorder = Recorder(self.directory, writer_id=default_writer_id("net"), config=self.recorder)
                shared = _shared[key] = _Shared(recorder)
            shared.users += 1
            if self.driver_counters and driver_directory is not None:
                driver_key = str(Path(driver_directory).resolve())
                if driver_key not in shared.samplers:
                    sampler = DriverSampler(shared.recorder, driver_directory, interval_s=self.stats_interval_s)
                    shared.samplers[driver_key] = sampler.start()
            return shared.recorder


def release(recorder: Recorder) -> None:
    """Give back a recorder from :meth:`RecordingConfig.acquire`; the last user closes it."""
    with _shared_lock:
        for key, shared in list(_shared.items()):
            if shared.recorder is recorder:
                shared.users -= 1
                if shared.users > 0:
                    return
                del _shared[key]
                break
        else:
            return
    for sampler in shared.samplers.values():
        sampler.stop()
    recorder.close()


@dataclass
class _Shared:
    recorder: Recorder
    users: int = 0
    samplers: dict[str, DriverSampler] = field(default_factory=dict)


_shared: dict[str, _Shared] = {}
_shared_lock = threading.Lock()
