"""The report's options, importable without Spark (the command line parses them before Spark starts)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ABUSE_THRESHOLD = 5
"""Rejected handshakes from one address that put it on the abuse list (``--abuse-threshold``)."""
DEFAULT_WINDOW_S = 60
"""The report's tumbling window (``--window``): per-minute by default."""
DEFAULT_TOP = 10
"""Top talkers kept per window and dimension (``--top``)."""


@dataclass(frozen=True)
class ReportOptions:
    """What the report computes. ``abuse_threshold``: rejected handshakes from one address that put it
    on the abuse list; ``window_s``: width of the tumbling windows of every table over time;
    ``top``: talkers kept per window (by address, by tag)."""

    abuse_threshold: int = DEFAULT_ABUSE_THRESHOLD
    window_s: int = DEFAULT_WINDOW_S
    top: int = DEFAULT_TOP

    def __post_init__(self) -> None:
        if self.abuse_threshold < 1:
            raise ValueError(f"--abuse-threshold must be >= 1, not {self.abuse_threshold}")
        if self.window_s < 1:
            raise ValueError(f"--window must be >= 1 second, not {self.window_s}")
        if self.top < 1:
            raise ValueError(f"--top must be >= 1, not {self.top}")
