"""``StatsSampler``: periodic statistics without a loop of one's own.

The network layer keeps its per-connection and per-stream counters in its own objects; it hands a
``collect(now_ns)`` function that returns the current records (``ConnectionStats``, ``StreamStats``)
and this samples it every ``interval_s`` on a daemon thread, plus once more at :meth:`stop`, so a
short connection still leaves its final totals. ``collect`` runs on the sampler's thread: it should
copy numbers, not take long locks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from .recorder import Recorder
from .records import Record

log = logging.getLogger("slipstream.telemetry")


class StatsSampler:
    """Calls ``collect(now_ns)`` every ``interval_s`` and records what it returns."""

    def __init__(
        self, recorder: Recorder, collect: Callable[[int], Iterable[Record]], *, interval_s: float = 1.0
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive: {interval_s}")
        self.recorder = recorder
        self.collect = collect
        self.interval_s = interval_s
        self.samples = 0
        self.failures = 0
        """Samples whose ``collect`` raised (logged and counted; sampling goes on)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Take one sample now."""
        try:
            records = list(self.collect(time.time_ns()))
        except Exception:
            self.failures += 1
            log.exception("stats sampler: collect failed")
            return
        for record in records:
            self.recorder.record(record)
        self.samples += 1

    def start(self) -> StatsSampler:
        """Sample on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="slipstream-stats-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        """Stop the thread, then take a last sample (the final totals)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()

    def __enter__(self) -> StatsSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
