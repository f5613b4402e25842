"""Calls in flight on the caller's side: their tokens, response ids and deadlines.

A token is ``generation << 16 | response id``: response ids come from one bounded pool (2-65535, each
freed on response, timeout or close) and the generation makes a late or replayed response to a freed id
name no call. Deadlines sit in a heap that is compacted when completed calls have left too many stale
entries behind.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Protocol

from ...client.allocation import AllocationError, IdAllocator
from ..errors import RmiError
from .registry import MethodSpec
from .wire import MAX_RESPONSE_ID, MIN_RESPONSE_ID

__all__ = ["IdPool", "Pending", "PendingCalls"]


class IdPool(Protocol):
    """A pool of response ids (``IdAllocator`` or a connection's shared pool)."""

    def allocate(self) -> int: ...

    def free(self, value: int) -> None: ...


@dataclass(slots=True)
class Pending:
    """One call waiting for its response."""

    method: str
    spec: MethodSpec | None  # None: a create
    interface_id: int
    deadline_ns: int = 0  # 0: none


class PendingCalls:
    """The caller's table of calls in flight, by token."""

    def __init__(self, response_ids: IdPool | None = None) -> None:
        self._ids: IdPool = (
            response_ids if response_ids is not None else IdAllocator(MIN_RESPONSE_ID, MAX_RESPONSE_ID, random.Random())
        )
        self._generation = 0
        self._calls: dict[int, Pending] = {}
        self._timeouts: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, token: int) -> Pending | None:
        """The call ``token`` names, if it is in flight."""
        return self._calls.get(token)

    def start(self, pending: Pending, now_ns: int, timeout_ns: int) -> int:
        """Track a new call (``timeout_ns`` 0: no deadline); returns its token. RmiError when every
        response id is in use."""
        if timeout_ns < 0:
            raise ValueError(f"timeout must not be negative: {timeout_ns} ns")
        try:
            response_id = self._ids.allocate()
        except AllocationError as exc:
            raise RmiError(f"too many RMI calls in flight ({len(self._calls)}): {exc}") from None
        self._generation = (self._generation + 1) & 0xFFFF
        token = (self._generation << 16) | response_id
        if timeout_ns:
            pending.deadline_ns = now_ns + timeout_ns
            heap = self._timeouts
            if len(heap) > 2 * len(self._calls) + 64:  # completed calls leave entries behind: compact
                heap[:] = [(p.deadline_ns, t) for t, p in self._calls.items() if p.deadline_ns]
                heapq.heapify(heap)
            heapq.heappush(heap, (pending.deadline_ns, token))
        self._calls[token] = pending
        return token

    def finish(self, token: int) -> Pending | None:
        """Stop tracking ``token`` (its response id goes back to the pool); the call, or None."""
        pending = self._calls.pop(token, None)
        if pending is not None:
            self._ids.free(token & 0xFFFF)
        return pending

    @property
    def deadline_ns(self) -> int | None:
        """The earliest deadline of a call in flight, or None."""
        heap = self._timeouts
        while heap:
            when, token = heap[0]
            pending = self._calls.get(token)
            if pending is not None and pending.deadline_ns == when:
                return when
            heapq.heappop(heap)
        return None

    def expired(self, now_ns: int) -> list[tuple[int, Pending]]:
        """Finish and return every call whose deadline has passed, earliest first."""
        out: list[tuple[int, Pending]] = []
        heap = self._timeouts
        while heap and heap[0][0] <= now_ns:
            when, token = heapq.heappop(heap)
            pending = self._calls.get(token)
            if pending is None or pending.deadline_ns != when:
                continue
            self.finish(token)
            out.append((token, pending))
        return out

    def finish_all(self) -> list[tuple[int, Pending]]:
        """Finish and return every call in flight (the connection closed)."""
        calls = list(self._calls.items())
        for token, _ in calls:
            self.finish(token)
        self._timeouts.clear()
        return calls
