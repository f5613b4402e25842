"""Doorbells: a file descriptor an event loop can wait on, rung by whoever appends to a shared log.

Shared memory has no descriptor to wake an event loop, so a subscriber that would otherwise sleep
in asyncio's millisecond steps parks instead: it owns a slot of the log's parking table (metadata,
see ``logbuffer.layout``), writes its doorbell's number there and sets its parked byte, polls once
more, and waits on the doorbell. A writer that appended a frame reads the parked word (one 8-byte
read: nothing else when nobody is parked) and rings each parked slot's number.

A doorbell is a non-blocking UNIX datagram socket bound in Linux's abstract namespace under a name
made from its number, so it needs no file and vanishes with its process. Ringing never blocks and
never raises: a full queue means it is already rung, a missing name means the subscriber is gone.
Correctness never depends on a ring (a parked subscriber still waits with a timeout); only latency does.

The parking protocol loses no wake-up a store/load order can keep: subscriber "set parked, poll,
wait", writer "append, read parked, ring". x86-64 may let a store pass a later load, so both sides
could in principle miss each other; that costs one safety timeout, never data.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import mmap
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from ..logbuffer.constants import LOG_META_DATA_LENGTH
from ..logbuffer.fastpath import FAST
from ..logbuffer.layout import DOORBELL_NUMBERS_INDEX, PARKED_WORD_INDEX, PARKED_WORD_OFFSET, PARKING_SLOTS

__all__ = [
    "Doorbell",
    "ParkingSlot",
    "doorbell_address",
    "map_parking_slot",
    "ring",
    "ring_parked",
    "wait_any",
]

_UID: Final = os.getuid()
_counter = itertools.count(1)
_sender: socket.socket | None = None
_sender_lock = threading.Lock()
_RING: Final = b"\x01"
GONE_QUIET_S: Final = 1.0
"""How long a doorbell found gone is left alone (a new process reusing the pid, and so the number,
waits on its safety timeout meanwhile, never on data)."""
_GONE_LIMIT: Final = 4096
_DRAIN_LIMIT: Final = 4096
"""Rings read by one ``drain`` at most (as the C one): a flood of rings cannot hold the reader."""
_c_drain = getattr(FAST, "drain_datagrams", None)
_c_send_ring = getattr(FAST, "send_ring", None)
_NOBODY_THERE: Final = frozenset((errno.ECONNREFUSED, errno.ENOENT))
"""What sending a ring fails with when no doorbell has that name (the Python path's ConnectionRefusedError and
FileNotFoundError)."""
_gone: dict[int, float] = {}
"""Numbers of doorbells found gone -> until when they are not rung."""


def doorbell_address(number: int) -> bytes:
    """The abstract-namespace name of doorbell ``number`` (per user, so users cannot ring each other's)."""
    return b"\0slipstream-doorbell-%d-%d" % (_UID, number)


def _next_number() -> int:
    """pid << 16 | a per-process counter: unique per process and context, and it fits an int64 slot."""
    while True:
        number = (os.getpid() << 16) | (next(_counter) & 0xFFFF)
        if number & 0xFFFF:
            return number


def _sending_socket() -> socket.socket:
    global _sender
    sender = _sender
    if sender is None:
        with _sender_lock:
            sender = _sender
            if sender is None:
                sender = _sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    return sender


def ring(number: int) -> None:
    """Ring doorbell ``number``: one byte, never blocking, never raising (gone or already rung is fine).

    A doorbell found gone (its subscriber died parked, before the driver freed its slot) is not rung
    again for ``GONE_QUIET_S``: a writer would otherwise pay a failed system call on every append until
    the driver times the dead client out."""
    if _gone:
        until = _gone.get(number)
        if until is not None:
            if time.monotonic() < until:
                return
            del _gone[number]
    if _c_send_ring is not None:  # (the GIL held: see send_ring in _fastpath.c)
        if _c_send_ring(_sending_socket().fileno(), doorbell_address(number)) in _NOBODY_THERE:
            _note_gone(number)
        return  # (any other error: its queue is full, it is rung already)
    try:
        _sending_socket().sendto(_RING, socket.MSG_DONTWAIT, doorbell_address(number))
    except (ConnectionRefusedError, FileNotFoundError):
        _note_gone(number)
    except OSError:
        pass  # its queue is full: it is rung already


def _note_gone(number: int) -> None:
    """Doorbell ``number`` is gone: left alone for ``GONE_QUIET_S``."""
    if len(_gone) >= _GONE_LIMIT:
        _gone.clear()
    _gone[number] = time.monotonic() + GONE_QUIET_S


def ring_parked(meta_i64: memoryview) -> None:
    """Ring every parked slot of a log's parking table (``meta_i64``: its metadata as int64s).

    A writer calls this only after it read a nonzero parked word, so the common case costs that read."""
    word = meta_i64[PARKED_WORD_INDEX]
    for slot in range(PARKING_SLOTS):
        if (word >> (slot << 3)) & 0xFF:
            number = meta_i64[DOORBELL_NUMBERS_INDEX + slot]
            if number:
                ring(number)


class Doorbell:
    """A doorbell this process waits on: ``fileno`` for ``loop.add_reader``, ``wait`` for coroutines.

    ``wakeups`` counts waits a ring ended, ``timeouts`` those the timeout ended (tests and
    benchmarks tell the two apart with them)."""

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            for _ in range(0x10000):
                number = _next_number()
                try:
                    sock.bind(doorbell_address(number))
                    break
                except OSError as exc:  # a name still held (counter wrapped): take the next one
                    last: OSError = exc
            else:
                raise last
        except BaseException:
            sock.close()
            raise
        self.number = number
        self._sock = sock
        self._fd = sock.fileno()
        self._lock = threading.Lock()
        self._waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[asyncio.Future[bool | None]]] = (
            weakref.WeakKeyDictionary()
        )
        """Loops the descriptor is registered with (it stays registered between waits: two system calls
        less per wait, and a stale ring is drained on arrival), and each loop's waiting futures."""
        self.wakeups = 0
        self.timeouts = 0
        self.closed = False

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> int:
        """Read every pending ring; returns how many there were. In C when the fast path is there: one call, the
        GIL held (a woken thread would otherwise wait to get it back after each read, up to a switch interval
        each while another thread runs Python: a parked poller took a second to drain 20 rings so)."""
        if _c_drain is not None:
            fd = self._sock.fileno()  # (-1 once closed: the number may belong to another file by now)
            return int(_c_drain(fd)) if fd >= 0 else 0
        count = 0
        recv = self._sock.recv
        while count < _DRAIN_LIMIT:
            try:
                recv(64)
            except (BlockingIOError, OSError):
                return count
            count += 1
        return count

    async def wait(self, timeout_s: float) -> bool:
        """Wait until rung (True) or ``timeout_s`` passed (False)."""
        return bool(await wait_any((self,), timeout_s))

    def _register(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[bool | None]) -> None:
        with self._lock:
            waiters = self._waiters.get(loop)
            if waiters is None:
                waiters = self._waiters[loop] = set()
                loop.add_reader(self._fd, self._on_readable, loop)
            waiters.add(future)

    def _unregister(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[bool | None]) -> None:
        with self._lock:
            waiters = self._waiters.get(loop)
            if waiters is not None:
                waiters.discard(future)

    def _on_readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """Drain, and wake every waiter: this loop's here, other loops' through their own thread (the
        loop that drains first would otherwise leave the others nothing to see)."""
        if not self.drain():
            return
        with self._lock:
            waiting = [(other, list(futures)) for other, futures in self._waiters.items() if futures]
        for other, futures in waiting:
            if other is loop:
                _wake_all(futures, self)
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    other.call_soon_threadsafe(_wake_all, futures, self)

    def close(self) -> None:
        """Stop listening (rings to this number are dropped from now on) and wake every waiter, as a ring
        would: what it waited for is closing too."""
        if self.closed:
            return
        with self._lock:
            self.closed = True
            waiting = {loop: list(futures) for loop, futures in self._waiters.items()}
            self._waiters.clear()
        for loop, futures in waiting.items():
            try:
                loop.remove_reader(self._fd)
                if futures:
                    loop.call_soon_threadsafe(_wake_all, futures, None)
            except (RuntimeError, ValueError):  # the loop is closed already
                pass
        self._sock.close()

    def __repr__(self) -> str:
        return f"Doorbell(number={self.number:#x}, wakeups={self.wakeups}, timeouts={self.timeouts})"


async def wait_any(
    doorbells: Iterable[Doorbell], timeout_s: float, future: asyncio.Future[bool | None] | None = None
) -> bool | None:
    """Wait until one of ``doorbells`` is rung (True) or ``timeout_s`` passed (False).

    A caller that may end the wait itself passes ``future`` and sets its result (which is returned). Each
    doorbell registers its descriptor with the running loop once, however many coroutines wait on it."""
    loop = asyncio.get_running_loop()
    if future is None:
        future = loop.create_future()
    bells = [bell for bell in doorbells if not bell.closed]
    for bell in bells:
        bell._register(loop, future)
    handle = loop.call_later(timeout_s, _time_out, future)
    try:
        result = await future
    finally:
        handle.cancel()
        for bell in bells:
            bell._unregister(loop, future)
    if result is False:
        for bell in bells:
            bell.timeouts += 1
    return result


def _wake_all(futures: list[asyncio.Future[bool | None]], bell: Doorbell | None) -> None:
    for future in futures:
        if not future.done():
            future.set_result(True)
            if bell is not None:
                bell.wakeups += 1


def _time_out(future: asyncio.Future[bool | None]) -> None:
    if not future.done():
        future.set_result(False)


class ParkingSlot:
    """A subscriber's slot in one log's parking table: the doorbell number and the parked byte it alone writes.

    The log may be mapped read-only for reading; this maps only the metadata's first page, writable.
    Several waiters of this process may park the same slot at once: the byte stays set until the last
    one unparks (a count, so one waiter's wake does not unpark another)."""

    def __init__(self, mapping: mmap.mmap, slot: int) -> None:
        if not 0 <= slot < PARKING_SLOTS:
            raise ValueError(f"parking slot {slot} outside [0, {PARKING_SLOTS})")
        self.slot = slot
        self._mapping = mapping
        self._bytes = memoryview(mapping)
        self._i64 = self._bytes.cast("q")
        self._holders = 0
        self._number = 0

    def park(self, number: int) -> None:
        """Publish ``number`` then set the parked byte (stores stay in order on x86-64: a writer that
        sees the byte sees the number)."""
        if number != self._number:
            self._i64[DOORBELL_NUMBERS_INDEX + self.slot] = number
            self._number = number
        if self._holders == 0:
            self._bytes[PARKED_WORD_OFFSET + self.slot] = 1
        self._holders += 1

    def unpark(self) -> None:
        """Clear the parked byte once the last waiter of this process is done."""
        if self._holders > 0:
            self._holders -= 1
            if self._holders == 0:
                self._bytes[PARKED_WORD_OFFSET + self.slot] = 0

    @property
    def is_parked(self) -> bool:
        return bool(self._bytes[PARKED_WORD_OFFSET + self.slot])

    def close(self) -> None:
        """Clear the byte and drop the mapping (the driver clears the slot too when it unlinks us)."""
        if self._holders:
            self._holders = 0
            self._bytes[PARKED_WORD_OFFSET + self.slot] = 0
        self._i64.release()
        self._bytes.release()
        with contextlib.suppress(BufferError):
            self._mapping.close()


def map_parking_slot(path: Path, term_length: int, slot: int) -> ParkingSlot | None:
    """Map slot ``slot`` of the log at ``path`` (metadata after three terms of ``term_length``), or None
    when this process may not write the file: it then simply never parks on a doorbell."""
    if not 0 <= slot < PARKING_SLOTS:
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        page = min(LOG_META_DATA_LENGTH, mmap.PAGESIZE)
        mapping = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=3 * term_length)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return ParkingSlot(mapping, slot)
