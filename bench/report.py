"""Turning raw benchmark figures into comparable rows, a printed table and a JSON record.

Every row compares slipstream with pyzmq on one figure and carries a ratio oriented so that > 1
always means slipstream is better (throughput: slipstream/pyzmq; latency: pyzmq/slipstream), so a
reader never has to remember which way a column points.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

PERCENTILES = (50.0, 99.0, 99.9)
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(slots=True)
class Row:
    id: str
    """Stable key (e.g. ``throughput.32B.standalone``) that tests and comparisons between runs use."""
    benchmark: str
    kind: Literal["throughput", "latency"]
    unit: str
    slipstream: float
    pyzmq: float
    ratio: float = field(init=False)
    slipstream_extra: str = ""
    pyzmq_extra: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    """Further figures behind the row (MB/s, refusals counted, CPU used), kept in the JSON."""

    def __post_init__(self) -> None:
        if self.kind == "throughput":
            self.ratio = self.slipstream / self.pyzmq if self.pyzmq > 0 else math.nan
        else:
            self.ratio = self.pyzmq / self.slipstream if self.slipstream > 0 else math.nan


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: an observed value, never an interpolation between two."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def latency_summary(rtt_ns: Sequence[int]) -> dict[str, Any]:
    """Percentiles in microseconds plus a log-bucket histogram, instead of every sample in the JSON."""
    values = sorted(rtt_ns)
    us = [v / 1000.0 for v in values]
    summary: dict[str, Any] = {
        "count": len(us),
        "min_us": us[0] if us else math.nan,
        "mean_us": sum(us) / len(us) if us else math.nan,
        "max_us": us[-1] if us else math.nan,
    }
    for pct in (50.0, 90.0, 99.0, 99.9, 99.99):
        summary[f"p{pct:g}_us"] = percentile(us, pct)
    buckets: dict[str, int] = {}
    for v in us:
        # four buckets per power of two: fine enough to see modes, small enough to keep
        key = 2 ** (math.floor(math.log2(max(v, 0.001)) * 4) / 4)
        label = f"{key:.3g}"
        buckets[label] = buckets.get(label, 0) + 1
    summary["histogram_us_lower_bound"] = buckets
    return summary


def machine_info() -> dict[str, Any]:
    """What the figures depend on, so runs on different machines are not compared blindly."""
    import zmq

    import slipstream

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": sys.version,
        "python_implementation": platform.python_implementation(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "slipstream": slipstream.__version__,
    }
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = os.getloadavg()
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "msg/s":
        return f"{value / 1e6:.3f} M msg/s" if value >= 1e6 else f"{value / 1e3:.1f} k msg/s"
    return f"{value:.1f} {unit}" if value >= 100 else f"{value:.2f} {unit}"


def format_table(rows: Sequence[Row]) -> str:
    headers = ("benchmark", "slipstream", "pyzmq", "ratio")
    cells = []
    for row in rows:
        slip = _fmt(row.slipstream, row.unit) + (f" ({row.slipstream_extra})" if row.slipstream_extra else "")
        zmq = _fmt(row.pyzmq, row.unit) + (f" ({row.pyzmq_extra})" if row.pyzmq_extra else "")
        ratio = "n/a" if math.isnan(row.ratio) else f"{row.ratio:.2f}x"
        cells.append((row.benchmark, slip, zmq, ratio))
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    for c in cells:
        lines.append(
            "  ".join((c[0].ljust(widths[0]), c[1].rjust(widths[1]), c[2].rjust(widths[2]), c[3].rjust(widths[3])))
        )
    lines.append("ratio > 1: slipstream is better (throughput slipstream/pyzmq, latency pyzmq/slipstream)")
    return "\n".join(lines)


def default_output(now: datetime) -> Path:
    return RESULTS_DIR / f"ipc-{now.strftime('%Y-%m-%d-%H%M%S')}.json"


def write_json(
    path: Path,
    *,
    started: datetime,
    options: dict[str, Any],
    rows: Sequence[Row],
    notes: Sequence[str],
    raw: dict[str, Any],
) -> None:
    """Write atomically (temp file, then rename) so a crash never leaves a half-written result."""
    document = {
        "suite": "ipc",
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "options": options,
        "rows": [asdict(row) for row in rows],
        "notes": list(notes),
        "raw": raw,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, allow_nan=True, default=str) + "\n")
    tmp.replace(path)
