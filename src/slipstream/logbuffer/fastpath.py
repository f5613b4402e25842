"""Which implementation of the hot loops runs: the C extension ``_fastpath`` or the pure-Python reference.

The C module is optional (built by ``pip install`` when a compiler is there). Without it, slipstream runs
the pure-Python code and logs one line saying so; ``SLIPSTREAM_NO_EXTENSIONS=1`` forces the pure path
(for differential testing and for ruling the extension out when chasing a bug).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

_log = logging.getLogger("slipstream")


def _load() -> ModuleType | None:
    if os.environ.get("SLIPSTREAM_NO_EXTENSIONS", "") not in ("", "0"):
        _log.info("slipstream: SLIPSTREAM_NO_EXTENSIONS is set: running the pure-Python path")
        return None
    try:
        return importlib.import_module("slipstream.logbuffer._fastpath")
    except ImportError as exc:
        _log.warning("slipstream: C fast path unavailable (%s): running the pure-Python path", exc)
        return None


FAST: ModuleType | None = _load()
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
