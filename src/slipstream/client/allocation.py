"""Id and port allocators shared by the server sides of ``echo`` and ``network`` (the floor below both).

Pure bookkeeping with no I/O, so their invariants can be property-tested: ids are handed out in random
order (hard to guess), never twice until freed, and errors say which range ran dry.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Final

__all__ = ["AddressCounter", "AllocationError", "IdAllocator", "PortAllocator", "SessionAllocator"]

_I32_MIN: Final = -(2**31)
_I32_MAX: Final = 2**31 - 1


class AllocationError(RuntimeError):
    """No id or port is left to allocate, or one was freed that is not allocated."""


class PortAllocator:
    """Ports from ``[base, base + count)`` in random order, none handed out twice until freed.

    The whole range is kept in memory (it is small: two ports per client): O(1) allocation and
    freeing. Freed ports go to the back of the queue, so a port just released (whose socket may still
    be closing) is the last to be reused.
    """

    def __init__(self, base: int, count: int, rng: random.Random | None = None) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1: {count}")
        if not base > 0 or base + count - 1 > 65535:
            raise ValueError(f"ports [{base}, {base + count}) must lie within 1..65535")
        self.base = base
        self.count = count
        free = list(range(base, base + count))
        (rng or random.SystemRandom()).shuffle(free)
        self._free = free
        self._head = 0
        self._used: set[int] = set()

    def allocate(self, n: int) -> tuple[int, ...]:
        """``n`` distinct ports; raises AllocationError (allocating none) if fewer are free."""
        if n < 0:
            raise ValueError(f"n must not be negative: {n}")
        if self.available < n:
            raise AllocationError(f"too few ports available to allocate {n} (free: {self.available})")
        ports = tuple(self._free[self._head : self._head + n])
        self._head += n
        if self._head > self.count:  # compact now and then, so the queue stays O(count)
            del self._free[: self._head]
            self._head = 0
        self._used.update(ports)
        return ports

    def free(self, port: int) -> bool:
        """Return ``port`` to the pool; False (and no effect) if it is not currently allocated."""
        if port not in self._used:
            return False
        self._used.remove(port)
        self._free.append(port)
        return True

    @property
    def available(self) -> int:
        """How many ports can still be allocated."""
        return len(self._free) - self._head

    @property
    def in_use(self) -> frozenset[int]:
        """The ports allocated and not yet freed."""
        return frozenset(self._used)


class SessionAllocator:
    """Random session ids from ``[low, high]`` (inclusive), none handed out twice until freed.

    The range is huge (2^31 values by default), so only allocated values are stored. Random ids make
    a session hard to guess; when random probing keeps hitting used ids (a nearly full,
    small range) a scan from a random start finds a free one in at most ``in_use + 1`` steps.
    """

    _PROBES: Final = 16

    def __init__(self, low: int, high: int, rng: random.Random | None = None) -> None:
        if not _I32_MIN <= low <= high <= _I32_MAX:
            raise ValueError(f"need {_I32_MIN} <= low <= high <= {_I32_MAX}: [{low}, {high}]")
        self.low = low
        self.high = high
        self._size = high - low + 1
        self._rng = rng or random.SystemRandom()
        self._used: set[int] = set()

    def allocate(self) -> int:
        """A random free id; raises AllocationError when none is left."""
        if len(self._used) >= self._size:
            raise AllocationError(f"no session ids left in [{self.low}, {self.high}]")
        for _ in range(self._PROBES):
            candidate = self.low + self._rng.randrange(self._size)
            if candidate not in self._used:
                self._used.add(candidate)
                return candidate
        offset = self._rng.randrange(self._size)
        for step in range(len(self._used) + 1):  # pigeonhole: one of these is free
            candidate = self.low + (offset + step) % self._size
            if candidate not in self._used:
                self._used.add(candidate)
                return candidate
        raise AssertionError("unreachable: a free session id must exist")

    def free(self, session_id: int) -> bool:
        """Make ``session_id`` available again; False if it was not allocated."""
        if session_id not in self._used:
            return False
        self._used.remove(session_id)
        return True

    @property
    def in_use(self) -> frozenset[int]:
        """The session ids allocated and not yet freed."""
        return frozenset(self._used)


class AddressCounter:
    """How many duologues each client IP address owns (the per-address limit's bookkeeping)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def count_for(self, address: str) -> int:
        """How many ``address`` owns now."""
        return self._counts.get(address, 0)

    def increment(self, address: str) -> int:
        """One more for ``address``; returns its new count."""
        count = self._counts[address] = self._counts.get(address, 0) + 1
        return count

    def decrement(self, address: str) -> int:
        """One fewer; the address is forgotten at zero, so the table never outgrows live duologues."""
        count = self._counts.get(address, 0) - 1
        if count <= 0:
            self._counts.pop(address, None)
            return 0
        self._counts[address] = count
        return count

    def __len__(self) -> int:
        return len(self._counts)


class IdAllocator:
    """The seed's id allocator: ids of ``[low, high]`` (inclusive) in random order, freed ids reused FIFO.

    Never-used ids come first, in random order: a Fisher-Yates shuffle done lazily, one step per
    allocation, with only the swapped positions stored, so construction is O(1) whatever the range
    (a 65534-id range shuffled up front with a system RNG costs a quarter of a second) and memory grows
    with use. Once they run out, freed ids are reused first-in first-out, as the seed's queue does: the
    id a peer just gave up is the last to be handed out again, so stale packets of the old owner are
    unlikely to meet a new one. Freeing an id that is not allocated (twice, or foreign) raises.
    """

    def __init__(self, low: int, high: int, rng: random.Random | None = None) -> None:
        if low > high:
            raise ValueError(f"IdAllocator needs low <= high: [{low}, {high}]")
        self.low = low
        self.high = high
        self._size = high - low + 1
        self._rng = rng or random.SystemRandom()
        self._next = 0
        """Positions below this were drawn; [_next, _size) is the unshuffled rest."""
        self._swapped: dict[int, int] = {}
        """Position -> id offset, where the lazy shuffle moved one."""
        self._freed: deque[int] = deque()
        self._used: set[int] = set()

    def allocate(self) -> int:
        """The next free id; raises AllocationError when none is left."""
        if self._next < self._size:
            position = self._next
            pick = position + self._rng.randrange(self._size - position)
            swapped = self._swapped
            value = swapped.pop(pick, pick)
            if pick != position:
                swapped[pick] = swapped.pop(position, position)
            self._next = position + 1
            value += self.low
        elif self._freed:
            value = self._freed.popleft()
        else:
            raise AllocationError(f"no ids left in [{self.low}, {self.high}] ({len(self._used)} in use)")
        self._used.add(value)
        return value

    def free(self, value: int) -> None:
        """Give ``value`` back; raises AllocationError if it is not currently allocated (over-free)."""
        try:
            self._used.remove(value)
        except KeyError:
            raise AllocationError(
                f"id {value} is not allocated in [{self.low}, {self.high}] (freed twice or never allocated)"
            ) from None
        self._freed.append(value)

    @property
    def available(self) -> int:
        """How many ids can still be allocated."""
        return self._size - len(self._used)

    @property
    def in_use(self) -> frozenset[int]:
        """The ids allocated and not yet freed."""
        return frozenset(self._used)

    def __len__(self) -> int:
        return len(self._used)
