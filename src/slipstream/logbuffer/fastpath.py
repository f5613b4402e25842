"""Which implementation of the hot loops runs: the C extension ``_fastpath`` or the pure-Python reference.

The C module is optional (built by ``pip install`` when a compiler is there). Without it, slipstream runs
the pure-Python code and logs one line saying so; ``SLIPSTREAM_NO_EXTENSIONS=1`` forces the pure path
(for differential testing and for ruling the extension out when chasing a bug).

It also holds the atomic operations on shared memory that Aeron's ring and broadcast buffers need
(files/ringbuffer.py, files/broadcast.py): Python has no compare-and-set on a buffer, so writers need the
extension (``require_atomics``); acquire loads fall back to plain reads on x86-64 (``load_acquire_i64``).
"""

from __future__ import annotations

import importlib
import logging
import os
import platform
from types import ModuleType
from typing import Any, Protocol, cast

from ..errors import AtomicsUnavailableError

_log = logging.getLogger("slipstream")


def load_extension(name: str) -> ModuleType | None:
    """The C module ``name`` (one of the fast path's), or None when it is off or was not built: the
    caller then runs its pure-Python reference. Every module of the fast path loads through here, so
    ``SLIPSTREAM_NO_EXTENSIONS`` turns them all off at once."""
    if os.environ.get("SLIPSTREAM_NO_EXTENSIONS", "") not in ("", "0"):
        _log.info("slipstream: SLIPSTREAM_NO_EXTENSIONS is set: running the pure-Python path (%s)", name)
        return None
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _log.warning("slipstream: C fast path unavailable (%s): running the pure-Python path", exc)
        return None


FAST: ModuleType | None = load_extension("slipstream.logbuffer._fastpath")
"""The loaded extension module, or None when the pure-Python path runs."""


def fast_path_active() -> bool:
    """True when the log buffer's hot loops run in C (the extension loaded and was not disabled)."""
    return FAST is not None


def fast_path_description() -> str:
    """One line for ``slipstream --version``: which path runs and why."""
    if FAST is not None:
        return "fast path: C extension (slipstream.logbuffer._fastpath)"
    if os.environ.get("SLIPSTREAM_NO_EXTENSIONS", "") not in ("", "0"):
        return "fast path: off (SLIPSTREAM_NO_EXTENSIONS is set): pure Python"
    return "fast path: unavailable (extension not built): pure Python"


class Atomics(Protocol):
    """The extension's atomic operations on a buffer shared between processes (offsets in bytes; a word
    outside the buffer or not naturally aligned in memory is a ValueError; the writes need a writable
    buffer)."""

    def compare_and_set_i64(self, buffer: Any, offset: int, expected: int, update: int) -> bool: ...
    def get_and_add_i64(self, buffer: Any, offset: int, delta: int) -> int: ...
    def load_acquire_i64(self, buffer: Any, offset: int) -> int: ...
    def load_acquire_i32(self, buffer: Any, offset: int) -> int: ...
    def store_release_i64(self, buffer: Any, offset: int, value: int) -> None: ...
    def store_release_i32(self, buffer: Any, offset: int, value: int) -> None: ...


ATOMICS: Atomics | None = cast(Atomics, FAST) if FAST is not None and hasattr(FAST, "compare_and_set_i64") else None
"""The atomic operations, or None without the extension (or with a build older than them)."""

_PLAIN_LOADS_ARE_ACQUIRE = platform.machine().lower() in ("x86_64", "amd64")


def require_atomics(what: str) -> Atomics:
    """The atomic operations, or ``AtomicsUnavailableError`` saying that ``what`` needs the C extension."""
    if ATOMICS is None:
        raise AtomicsUnavailableError(
            f"{what} needs atomic operations on shared memory, which only the C extension "
            f"slipstream.logbuffer._fastpath provides ({fast_path_description()})"
        )
    return ATOMICS


def _plain_load(buffer: Any, offset: int, width: int) -> int:
    # The fallback of the acquire loads without the extension. On x86-64 every load already has acquire
    # semantics (the CPU does not reorder a load with later loads or stores), and an aligned 4- or 8-byte
    # load is single-copy atomic; a memoryview item read copies the item with one fixed-size memcpy, which
    # compilers emit as one load (unlike struct's "<q", which assembles the bytes one by one). Elsewhere
    # (ARM, ...) a plain load gives no such order, so there the extension is required.
    if not _PLAIN_LOADS_ARE_ACQUIRE:
        require_atomics("an acquire load on this CPU")
    view = memoryview(buffer).cast("B")
    if offset < 0 or offset > view.nbytes - width:
        raise ValueError(f"offset {offset}: a {width}-byte word there is outside the buffer")
    if offset % width:
        raise ValueError(f"offset {offset}: the word is not {width}-byte aligned")
    word = view[offset : offset + width]
    return int(word.cast("q")[0] if width == 8 else word.cast("i")[0])


def load_acquire_i64(buffer: Any, offset: int) -> int:
    """The i64 at ``offset``, loaded with acquire semantics (works without the extension on x86-64)."""
    if ATOMICS is not None:
        return ATOMICS.load_acquire_i64(buffer, offset)
    return _plain_load(buffer, offset, 8)


def load_acquire_i32(buffer: Any, offset: int) -> int:
    """The i32 at ``offset``, loaded with acquire semantics (works without the extension on x86-64)."""
    if ATOMICS is not None:
        return ATOMICS.load_acquire_i32(buffer, offset)
    return _plain_load(buffer, offset, 4)
