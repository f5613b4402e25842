"""When a receiver NAKs a gap: a fixed delay then retries (unicast), or a random backoff (group).

Aeron's ``StaticDelayGenerator`` and ``OptimalMulticastDelayGenerator``: on a group channel every
receiver draws its delay from a distribution skewed late, so one usually NAKs first and the others
hear the retransmission instead of NAKing too (feedback suppression).
"""

from __future__ import annotations

import math
import random

__all__ = ["NakDelayGenerator"]


class NakDelayGenerator:
    """NAK timing: a fixed delay then retries (unicast), or a random backoff each time (group)."""

    __slots__ = ("_base", "_constant", "_factor", "_rng", "_span", "delay_ns", "group", "retry_ns")

    def __init__(
        self, delay_ns: int, retry_ns: int, group: bool, group_size: int, max_backoff_ns: int, rng: random.Random
    ) -> None:
        self.delay_ns = delay_ns
        self.retry_ns = retry_ns
        self.group = group
        self._rng = rng
        # Exponential feedback suppression: delays in [0, max_backoff] skewed late, so that in a group
        # one receiver usually NAKs first and the others hear the retransmission instead.
        lam = math.log(group_size) + 1.0
        backoff = float(max_backoff_ns)
        self._span = lam / backoff
        self._base = lam / (backoff * (math.exp(lam) - 1.0))
        self._constant = backoff / lam
        self._factor = (math.exp(lam) - 1.0) * (backoff / lam)

    def next(self, retry: bool) -> int:
        """The delay before the first NAK of a gap (``retry=False``) or before the next one."""
        if self.group:
            x = self._rng.random() * self._span + self._base
            return max(0, int(self._constant * math.log(x * self._factor)))
        return self.retry_ns if retry else self.delay_ns
