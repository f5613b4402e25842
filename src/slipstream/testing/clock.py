"""A clock that moves only when told to, so protocol tests control time exactly.

Sans-I/O state machines take ``now_ns`` as an argument; tests drive them with this clock instead of
sleeping, which makes timeouts (100 ms heartbeats, 10 s liveness) instant and runs reproducible.
"""

from __future__ import annotations


class ManualClock:
    """Monotonic nanosecond clock advanced by hand; ``now_ns`` has the signature of ``time.monotonic_ns``."""

    __slots__ = ("_now_ns",)

    def __init__(self, start_ns: int = 0) -> None:
        if start_ns < 0:
            raise ValueError(f"start_ns must not be negative: {start_ns}")
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    def advance(self, delta_ns: int) -> int:
        """Move time forward by ``delta_ns`` (never backwards) and return the new time."""
        if delta_ns < 0:
            raise ValueError(f"a monotonic clock cannot go back: {delta_ns}")
        self._now_ns += delta_ns
        return self._now_ns

    def advance_to(self, when_ns: int) -> int:
        """Move time forward to ``when_ns`` if it is in the future; return the new time."""
        if when_ns > self._now_ns:
            self._now_ns = when_ns
        return self._now_ns

    def __repr__(self) -> str:
        return f"ManualClock(now_ns={self._now_ns})"
