"""How an endpoint tells its application about errors without flooding it (sans-I/O).

An error is reported when it is the first of its kind (its type and text) from its source (a connection,
or the endpoint itself) in a window; repeats in that window are counted, not reported, and so are errors
of a type past ``distinct`` different texts per window (a listener failing on every message with a new
text each time). When the window of something suppressed ends, :meth:`ErrorLimiter.take_summaries` gives
one summary per source and type (the count and the last text): the first, then a count, never silence.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final

from .errors import ErrorsSuppressed

__all__ = ["DEFAULT_DISTINCT", "DEFAULT_WINDOW_NS", "ErrorLimiter", "Suppressed"]

DEFAULT_WINDOW_NS: Final = 10_000_000_000
"""How long repeats of a reported error are counted instead of reported."""
DEFAULT_DISTINCT: Final = 8
"""Different texts of one error type from one source reported per window."""


@dataclass(slots=True)
class Suppressed:
    """Errors of one type from one source counted, not reported, in a window that has ended."""

    source: Hashable
    type_name: str
    count: int
    last: str


@dataclass(slots=True)
class _Window:
    ends_ns: int
    texts: set[str] = field(default_factory=set)
    suppressed: int = 0
    last: str = ""


class ErrorLimiter:
    """Which errors to report, per (source, type) window (see the module)."""

    def __init__(self, *, window_ns: int = DEFAULT_WINDOW_NS, distinct: int = DEFAULT_DISTINCT) -> None:
        if window_ns <= 0 or distinct <= 0:
            raise ValueError(f"window_ns and distinct must be positive: {window_ns}, {distinct}")
        self.window_ns = window_ns
        self.distinct = distinct
        self._windows: dict[tuple[Hashable, str], _Window] = {}
        self._due: list[Suppressed] = []
        self.suppressed = 0
        """Errors counted instead of reported, in all."""

    def admit(self, source: Hashable, error: BaseException, now_ns: int) -> bool:
        """Whether to report ``error`` now (False: it was counted)."""
        key = (source, type(error).__qualname__)
        window = self._windows.get(key)
        if window is None or now_ns >= window.ends_ns:
            if window is not None and window.suppressed:  # its summary is due (take_summaries gives it)
                self._due.append(Suppressed(source, key[1], window.suppressed, window.last))
            window = self._windows[key] = _Window(now_ns + self.window_ns)
        text = str(error)[:200]
        if text not in window.texts and len(window.texts) < self.distinct:
            window.texts.add(text)
            return True
        window.suppressed += 1
        window.last = text
        self.suppressed += 1
        return False

    @property
    def deadline_ns(self) -> int | None:
        """When the earliest window with something suppressed ends (its summary is then due)."""
        if self._due:
            return 0
        ends = [w.ends_ns for w in self._windows.values() if w.suppressed]
        return min(ends) if ends else None

    def take_summaries(self, now_ns: int) -> list[Suppressed]:
        """A summary of each ended window that suppressed something; ended windows are forgotten."""
        out, self._due = self._due, []
        for key, window in list(self._windows.items()):
            if now_ns >= window.ends_ns:
                del self._windows[key]
                if window.suppressed:
                    out.append(Suppressed(key[0], key[1], window.suppressed, window.last))
        return out

    def forget(self, source: Hashable) -> list[Suppressed]:
        """The source is gone (a connection ended): its pending summaries, now, and its windows dropped."""
        out: list[Suppressed] = []
        for key, window in list(self._windows.items()):
            if key[0] == source:
                del self._windows[key]
                if window.suppressed:
                    out.append(Suppressed(source, key[1], window.suppressed, window.last))
        return out

    def suppressed_errors(self, now_ns: int, source: Hashable | None = None) -> list[ErrorsSuppressed]:
        """The summaries of windows that ended (or, with ``source``, all of that gone source's) as the
        errors to report."""
        out = []
        for summary in self.take_summaries(now_ns) if source is None else self.forget(source):
            where = "the endpoint" if summary.source is None else f"connection {summary.source}"
            text = f"{where}: {summary.count} more {summary.type_name} not reported in {self.window_ns / 1e9:g} s: "
            out.append(ErrorsSuppressed(text + summary.last, summary.type_name, summary.count, summary.last))
        return out
