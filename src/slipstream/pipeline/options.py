"""The report's options, importable without Spark (the command line parses them before Spark starts)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ABUSE_THRESHOLD = 5
"""Rejected handshakes from one address that put it on the abuse list (``--abuse-threshold``)."""


@dataclass(frozen=True)
class ReportOptions:
    """What the report computes. ``abuse_threshold``: rejected handshakes from one address that put it
    on the abuse list; ``bucket_s``: width of the throughput-over-time buckets."""

    abuse_threshold: int = DEFAULT_ABUSE_THRESHOLD
    bucket_s: int = 1

    def __post_init__(self) -> None:
        if self.abuse_threshold < 1:
            raise ValueError(f"abuse threshold must be >= 1, not {self.abuse_threshold}")
        if self.bucket_s < 1:
            raise ValueError(f"bucket must be >= 1 second, not {self.bucket_s}")
