"""Idle strategies: what an agent does when a duty cycle found no work.

Aeron's four: busy-spin (lowest latency, burns a core), yielding, back-off (spin, then yield, then
sleep with growing pauses) and sleeping. ``idle(work_count)`` resets the back-off whenever work was
done, so a busy agent never sleeps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol


class IdleStrategy(Protocol):
    def idle(self, work_count: int = 0) -> None:
        """Wait according to the strategy; ``work_count`` > 0 means work was done (and resets it)."""

    def reset(self) -> None:
        """Forget the idle streak: the next wait starts from the shortest."""


class BusySpinIdleStrategy:
    """Never gives the core up: lowest latency, one full core per agent."""

    def idle(self, work_count: int = 0) -> None:
        """Return at once: the lowest latency, one core kept busy."""
        return None

    def reset(self) -> None:
        """Nothing to reset."""
        return None


class YieldingIdleStrategy:
    """Gives the core to other runnable threads when idle (``sched_yield``)."""

    def idle(self, work_count: int = 0) -> None:
        """Yield the CPU when no work was done."""
        if work_count <= 0:
            os.sched_yield()

    def reset(self) -> None:
        """Nothing to reset."""
        return None


class SleepingIdleStrategy:
    """Sleeps a fixed period when idle: low CPU, latency up to the period."""

    def __init__(self, period_s: float = 0.001) -> None:
        if period_s <= 0:
            raise ValueError(f"sleep period must be positive: {period_s}")
        self.period_s = period_s

    def idle(self, work_count: int = 0) -> None:
        """Sleep for the fixed period when no work was done."""
        if work_count <= 0:
            time.sleep(self.period_s)

    def reset(self) -> None:
        """Nothing to reset."""
        return None


class BackoffIdleStrategy:
    """Spin, then yield, then sleep from ``min_sleep_s`` doubling up to ``max_sleep_s``."""

    def __init__(
        self, max_spins: int = 10, max_yields: int = 5, min_sleep_s: float = 1e-6, max_sleep_s: float = 1e-3
    ) -> None:
        if max_spins < 0 or max_yields < 0 or not 0 < min_sleep_s <= max_sleep_s:
            raise ValueError("need max_spins >= 0, max_yields >= 0 and 0 < min_sleep_s <= max_sleep_s")
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.min_sleep_s = min_sleep_s
        self.max_sleep_s = max_sleep_s
        self._spins = 0
        self._yields = 0
        self._sleep_s = min_sleep_s

    def idle(self, work_count: int = 0) -> None:
        """Spin, then yield, then sleep for longer and longer while no work is done; work resets it."""
        if work_count > 0:
            self.reset()
            return
        if self._spins < self.max_spins:
            self._spins += 1
        elif self._yields < self.max_yields:
            self._yields += 1
            os.sched_yield()
        else:
            time.sleep(self._sleep_s)
            self._sleep_s = min(self._sleep_s * 2, self.max_sleep_s)

    def reset(self) -> None:
        """Start over with spinning."""
        self._spins = 0
        self._yields = 0
        self._sleep_s = self.min_sleep_s


class ParkingIdleStrategy:
    """Back-off whose last phase parks instead of sleeping: ``park(timeout_s)`` blocks in ``select`` on
    the agent's sockets, so an idle driver costs no CPU yet wakes the moment a datagram or a client's
    doorbell arrives."""

    def __init__(
        self,
        park: Callable[[float], int],
        max_spins: int = 10,
        max_yields: int = 5,
        park_timeout_s: float = 1e-3,
    ) -> None:
        if max_spins < 0 or max_yields < 0 or park_timeout_s <= 0:
            raise ValueError("need max_spins >= 0, max_yields >= 0 and park_timeout_s > 0")
        self.park = park
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.park_timeout_s = park_timeout_s
        self._spins = 0
        self._yields = 0

    def idle(self, work_count: int = 0) -> None:
        if work_count > 0:
            self.reset()
        elif self._spins < self.max_spins:
            self._spins += 1
        elif self._yields < self.max_yields:
            self._yields += 1
            os.sched_yield()
        else:
            self.park(self.park_timeout_s)

    def reset(self) -> None:
        self._spins = 0
        self._yields = 0


def idle_strategy(name: str) -> IdleStrategy:
    """Idle strategy by name, as configuration files and command lines give it."""
    strategies: dict[str, type[IdleStrategy]] = {
        "spin": BusySpinIdleStrategy,
        "busy-spin": BusySpinIdleStrategy,
        "yield": YieldingIdleStrategy,
        "backoff": BackoffIdleStrategy,
        "sleep": SleepingIdleStrategy,
    }
    try:
        return strategies[name]()
    except KeyError:
        raise ValueError(f"unknown idle strategy {name!r}; choose one of {', '.join(strategies)}") from None
