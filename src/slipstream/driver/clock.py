"""``StallClock``: the driver's time for its timeouts, leaving out the driver's own stalls.

A stopped process (SIGSTOP, a debugger, a VM migration, a laptop lid) stops its driver and its own
clients together; on resume, wall time says every peer was silent for the whole stop, though the driver
was not listening then. So the duty cycle reads this clock once per cycle: a gap since the previous
reading longer than any sane cycle takes (``threshold_ns``, well below the liveness timeouts) is a
stall, and counts as ``threshold_ns`` only. Every timeout judged on this time (client liveness, image
liveness, a publication's connection, linger and unblock) then waits for the peer to be silent over
time the driver itself was running. A peer that really went silent while the driver ran still times
out as before: only the driver's own gap is left out.

A stall counts as the threshold rather than as nothing so that time always moves: an invoker-mode
application that calls rarely delays a timeout, it never freezes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["StallClock"]


class StallClock:
    """Monotonic nanoseconds minus the part of each stall above ``threshold_ns``. Read by one thread
    (the one running the duty cycle); its times are never behind an earlier reading."""

    __slots__ = ("_last_ns", "_source", "last_stall_ns", "stalled_ns", "stalls", "threshold_ns")

    def __init__(self, threshold_ns: int, source: Callable[[], int] = time.monotonic_ns) -> None:
        if threshold_ns <= 0:
            raise ValueError(f"threshold_ns must be positive: {threshold_ns}")
        self.threshold_ns = threshold_ns
        self._source = source
        self._last_ns = source()
        self.stalled_ns = 0
        """Time left out so far: what this clock is behind its source."""
        self.stalls = 0
        """Gaps longer than the threshold seen so far."""
        self.last_stall_ns = 0
        """The whole length of the latest of those gaps."""

    def now_ns(self) -> int:
        """The time now, less the stalls; a gap since the last reading above the threshold is a stall."""
        raw = self._source()
        gap = raw - self._last_ns
        self._last_ns = raw
        if gap > self.threshold_ns:
            self.stalled_ns += gap - self.threshold_ns
            self.stalls += 1
            self.last_stall_ns = gap
        return raw - self.stalled_ns

    def to_source_ns(self, when_ns: int) -> int:
        """A time of this clock (a deadline) as the source clock's, for callers that wait on that one."""
        return when_ns + self.stalled_ns

    def __repr__(self) -> str:
        return f"StallClock(threshold_ns={self.threshold_ns}, stalls={self.stalls}, stalled_ns={self.stalled_ns})"
