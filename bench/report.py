"""What a run plans and what it found: the plan, comparable rows, notes, a printed table and a JSON record.

Every row compares slipstream with pyzmq on one figure and carries a ratio oriented so that > 1
always means slipstream is better (throughput: slipstream/pyzmq; latency: pyzmq/slipstream), so a
reader never has to remember which way a column points. The row and note builders here serve every
suite (IPC, UDP), so the same figure is summarised the same way whatever carried it; ``Comparison`` is
the same rule for the benchmarks with other peers (``bench.network``, ``bench.rmi``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

PERCENTILES = (50.0, 99.0, 99.9)
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SUITES = ("ipc", "udp")
SUITE_TITLES = {
    "ipc": "IPC: slipstream aeron:ipc vs pyzmq ipc://, two processes",
    "udp": "UDP: slipstream aeron:udp on 127.0.0.1 (standalone driver) vs pyzmq tcp://127.0.0.1, two processes",
    "aeron-c": "Aeron C yardstick: the reference C media driver and C client samples",
}


@dataclass(frozen=True, slots=True)
class Plan:
    """Counts and limits of one invocation, shared by the suites and kept in the JSON's options;
    ``--quick`` shrinks them so the smoke test stays fast."""

    messages: int
    samples: int
    warmup: int
    parked_samples: int
    parked_gap_s: float
    time_limit_s: float
    rounds: int = 1
    sizes: tuple[int, ...] = (32, 1024)
    latency_size: int = 32
    udp_messages: int = 1_000_000
    """Messages per UDP throughput run: as over IPC. (Runs of 300,000 lasted 0.2 s, and their spread
    was set by start-up, page faults of fresh logs, more than by the transport.)"""
    udp_samples: int = 5000
    bulk_bytes: int = 1 << 30
    bulk_message_size: int = 64 * 1024
    bulk_time_limit_s: float = 60.0
    udp_wait: str = "yield"
    """How UDP throughput clients wait on a refused offer or an empty poll (see ``--udp-wait``)."""


@dataclass(slots=True)
class Row:
    id: str
    """Stable key (e.g. ``throughput.32B.standalone``, ``udp.bulk.65536B``) that tests and
    comparisons between runs use; UDP rows start with ``udp.``, IPC rows keep their original keys."""
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
    suite: str = "ipc"

    def __post_init__(self) -> None:
        self.ratio = oriented_ratio(self.kind, self.slipstream, self.pyzmq)


RATIO_RULE = "> 1: slipstream better (rates slipstream/peer, times peer/slipstream)"


def oriented_ratio(kind: str, slipstream: float, peer: float) -> float:
    """slipstream against a peer, oriented so that > 1 always means slipstream is better: a reader
    never has to remember which way a figure points (``kind`` ``latency``: lower is better)."""
    if kind == "latency":
        return peer / slipstream if slipstream > 0 else math.nan
    return slipstream / peer if peer > 0 else math.nan


@dataclass(slots=True)
class Comparison:
    """One measure of slipstream against one named peer: the rows of the benchmarks whose peers are not
    all pyzmq (``bench.network``, ``bench.rmi``), printed by ``comparison_table``."""

    key: str
    """Stable name in the JSON's ``ratios`` (``ipc.rtt_p50.blocking/pyzmq-curve-ipc``)."""
    measure: str
    kind: Literal["throughput", "latency"]
    unit: str
    slipstream: float
    peer: str
    peer_value: float
    ratio: float = field(init=False)

    def __post_init__(self) -> None:
        self.ratio = oriented_ratio(self.kind, self.slipstream, self.peer_value)


def ratios(comparisons: Sequence[Comparison]) -> dict[str, Any]:
    """The JSON's top-level ``ratios``: every comparison's ratio by key, and the rule they follow."""
    return {"note": RATIO_RULE, **{c.key: c.ratio for c in comparisons}}


@dataclass(slots=True)
class SuiteResult:
    """What one suite hands back for the table and the JSON."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    not_measured: list[dict[str, str]] = field(default_factory=list)
    """Rows a suite knowingly leaves out, each with the reason, so their absence is on record."""


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def size_label(size: int) -> str:
    """``32 B``, ``1 KiB``, ``64 KiB``, ``1 GiB``: the largest binary unit that divides the size."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def cpu_percent(worker: dict[str, Any]) -> str:
    return f"{worker['cpu_s'] / worker['wall_s'] * 100:.0f}%" if worker["wall_s"] > 0 else "n/a"


def throughput_row(
    row_id: str,
    benchmark: str,
    slip_runs: list[dict[str, Any]],
    zmq_runs: list[dict[str, Any]],
    *,
    suite: str,
    unit: Literal["msg/s", "MB/s"] = "msg/s",
    details: dict[str, Any] | None = None,
) -> Row:
    """A slipstream-vs-pyzmq throughput row from runs of ``bench.ipc.run_throughput`` and
    ``bench.zmq_peer.run_throughput``: the median round of each, plus what the publisher was refused."""
    slip_mb = median([r["mb_per_s"] for r in slip_runs])
    zmq_mb = median([r["mb_per_s"] for r in zmq_runs])
    slip_rate = median([r["msgs_per_s"] for r in slip_runs])
    zmq_rate = median([r["msgs_per_s"] for r in zmq_runs])
    by_mb = unit == "MB/s"
    return Row(
        id=row_id,
        benchmark=benchmark,
        kind="throughput",
        unit=unit,
        slipstream=slip_mb if by_mb else slip_rate,
        pyzmq=zmq_mb if by_mb else zmq_rate,
        slipstream_extra=f"{slip_rate:.0f} msg/s" if by_mb else f"{slip_mb:.1f} MB/s",
        pyzmq_extra=f"{zmq_rate:.0f} msg/s" if by_mb else f"{zmq_mb:.1f} MB/s",
        details={
            "statistic": f"median of {len(slip_runs)} rounds",
            "slipstream_mb_per_s": slip_mb,
            "pyzmq_mb_per_s": zmq_mb,
            "slipstream_msgs_per_s_rounds": [r["msgs_per_s"] for r in slip_runs],
            "pyzmq_msgs_per_s_rounds": [r["msgs_per_s"] for r in zmq_runs],
            "slipstream_messages_measured": [r["subscriber"]["measured"] for r in slip_runs],
            "pyzmq_messages_measured": [r["pull"]["measured"] for r in zmq_runs],
            "stopped_at_time_limit": any(r["publisher"]["timed_out"] for r in slip_runs)
            or any(r["subscriber"]["timed_out"] for r in slip_runs)
            or any(r["pull"]["timed_out"] for r in zmq_runs),
            "back_pressured": sum(r["publisher"]["back_pressured"] for r in slip_runs),
            "back_pressured_messages": sum(r["publisher"]["back_pressured_messages"] for r in slip_runs),
            "admin_actions": sum(r["publisher"]["admin_actions"] for r in slip_runs),
            "missing_messages": sum(r["publisher"]["sent"] - r["subscriber"]["received"] for r in slip_runs),
            **(details or {}),
        },
        suite=suite,
    )


def refusals_note(label: str, slip_runs: list[dict[str, Any]]) -> str:
    """Back-pressure and other refusals over every round, the driver's CPU, anything that went missing."""
    pubs = [run["publisher"] for run in slip_runs]
    subs = [run["subscriber"] for run in slip_runs]
    rates = sorted(run["msgs_per_s"] for run in slip_runs)
    driver_cpu = [run["driver_cpu_s"] for run in slip_runs if not math.isnan(run["driver_cpu_s"])]
    note = (
        f"{label}: {len(slip_runs)} rounds, {_k(rates[0])}..{_k(rates[-1])} k msg/s; publisher "
        f"back-pressured {sum(p['back_pressured'] for p in pubs)} times on "
        f"{sum(p['back_pressured_messages'] for p in pubs)} of {sum(p['sent'] for p in pubs)} messages, "
        f"ADMIN_ACTION {sum(p['admin_actions'] for p in pubs)}, NOT_CONNECTED {sum(p['not_connected'] for p in pubs)}"
    )
    if driver_cpu:
        wall = sum(run["driver_wall_s"] for run in slip_runs)
        note += f"; driver process CPU {sum(driver_cpu):.2f} s in all"
        note += f" ({sum(driver_cpu) / wall * 100:.0f}% of a core from go to results)" if wall > 0 else ""
    if any(p["timed_out"] for p in pubs):
        note += "; a publisher stopped at the time limit"
    for pub, sub in zip(pubs, subs, strict=True):
        if sub["received"] < pub["sent"]:
            note += (
                f"; MISSING {pub['sent'] - sub['received']} of {pub['sent']} messages at the subscriber "
                f"(image state {sub['images']}, publisher position {pub['position']})"
            )
    return note


def zmq_spread_note(label: str, zmq_runs: list[dict[str, Any]]) -> str:
    rates = sorted(r["msgs_per_s"] for r in zmq_runs)
    return f"pyzmq {label}: {len(zmq_runs)} rounds, {_k(rates[0])}..{_k(rates[-1])} k msg/s"


def _k(rate: float) -> str:
    """Thousands, with decimals only where the rate is small enough to need them (bulk transfers)."""
    return f"{rate / 1e3:.0f}" if rate >= 10e3 else f"{rate / 1e3:.2f}"


def latency_rows(
    row_prefix: str, title: str, slip: dict[str, Any], zmq: dict[str, Any], *, suite: str, size: int
) -> tuple[list[Row], str]:
    """Percentile rows (and a note on samples and CPU) from ``bench.ipc.run_latency`` and
    ``bench.zmq_peer.run_latency`` results; their raw samples are replaced by a summary in place."""
    for result in (slip, zmq):
        if "rtt_ns" in result:
            result["summary"] = latency_summary(result.pop("rtt_ns"))
    slip_summary, zmq_summary = slip["summary"], zmq["summary"]
    timed_out = slip["timed_out"] or zmq["timed_out"]
    rows = [
        Row(
            id=f"{row_prefix}.p{pct:g}",
            benchmark=f"RTT {size} B p{pct:g}, {title}",
            kind="latency",
            unit="us",
            slipstream=slip_summary[f"p{pct:g}_us"],
            pyzmq=zmq_summary[f"p{pct:g}_us"],
            details={
                "slipstream_samples": slip_summary["count"],
                "pyzmq_samples": zmq_summary["count"],
                "stopped_at_time_limit": timed_out,
            },
            suite=suite,
        )
        for pct in PERCENTILES
    ]
    pong, rep = slip["ponger"], zmq["rep"]
    note = (
        f"{slip_summary['count']} vs {zmq_summary['count']} samples; pong side CPU "
        f"slipstream {cpu_percent(pong)} vs pyzmq {cpu_percent(rep)} of a core"
        + (f"; driver process used {slip['driver_cpu_s']:.2f} s CPU" if not math.isnan(slip["driver_cpu_s"]) else "")
        + (f" (stopped at the {slip['params']['time_limit_s']:g} s limit)" if timed_out else "")
    )
    return rows, note


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
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        # The figures belong to this tree, uncommitted changes included ("-dirty").
        info["git"] = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
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
    if unit in ("msg/s", "calls/s"):
        return f"{value / 1e6:.3f} M {unit}" if value >= 1e6 else f"{value / 1e3:.1f} k {unit}"
    return f"{value:.1f} {unit}" if value >= 100 else f"{value:.2f} {unit}"


def _ratio(ratio: float) -> str:
    return "n/a" if math.isnan(ratio) else f"{ratio:.2f}x"


def format_table(rows: Sequence[Row]) -> str:
    """One table, columns aligned across suites, with a title line wherever the suite changes."""
    headers = ("benchmark", "slipstream", "pyzmq", "ratio")
    cells = []
    for row in rows:
        slip = _fmt(row.slipstream, row.unit) + (f" ({row.slipstream_extra})" if row.slipstream_extra else "")
        zmq = _fmt(row.pyzmq, row.unit) + (f" ({row.pyzmq_extra})" if row.pyzmq_extra else "")
        cells.append((row.benchmark, slip, zmq, _ratio(row.ratio)))
    head, body = _columns(headers, cells)
    lines = head
    suite = None
    for row, line in zip(rows, body, strict=True):
        if row.suite != suite:
            suite = row.suite
            lines.append(f"[{SUITE_TITLES.get(suite, suite)}]")
        lines.append(line)
    lines.append("ratio > 1: slipstream is better (throughput slipstream/pyzmq, latency pyzmq/slipstream)")
    return "\n".join(lines)


def comparison_table(comparisons: Sequence[Comparison]) -> str:
    """Measure, slipstream, peer, ratio: one line per comparison, with the ratio's rule under it."""
    cells = [
        (
            c.measure,
            _fmt(c.slipstream, c.unit),
            f"{c.peer} {_fmt(c.peer_value, c.unit)}",
            _ratio(c.ratio),
        )
        for c in comparisons
    ]
    head, body = _columns(("measure", "slipstream", "peer", "ratio"), cells)
    return "\n".join([*head, *body, f"ratio {RATIO_RULE}"])


def _columns(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> tuple[list[str], list[str]]:
    """Header lines and one line per row, columns aligned (the first left, the others right)."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    head = [
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    body = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in cells
    ]
    return head, body


def default_output(now: datetime, suites: Sequence[str] = ("ipc",)) -> Path:
    """``ipc-<time>.json`` or ``udp-<time>.json`` for one suite, ``bench-<time>.json`` for both."""
    name = suites[0] if len(suites) == 1 else "bench"
    return RESULTS_DIR / f"{name}-{now.strftime('%Y-%m-%d-%H%M%S')}.json"


def write_json(
    path: Path,
    *,
    started: datetime,
    options: dict[str, Any],
    rows: Sequence[Row],
    notes: Sequence[str],
    raw: dict[str, Any],
    suites: Sequence[str] = ("ipc",),
    not_measured: Sequence[dict[str, str]] = (),
    aeron_c: Sequence[Any] | None = None,
    note: str | None = None,
) -> None:
    """Write atomically (temp file, then rename) so a crash never leaves a half-written result.
    ``aeron_c`` holds the Aeron C yardstick's rows (``bench.aeron_c``) when that suite ran; ``note``
    a remark of whoever ran it (what else loaded the machine, say)."""
    document: dict[str, Any] = {
        "suite": suites[0] if len(suites) == 1 else "all",
        "suites": list(suites),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "options": options,
        "rows": [asdict(row) for row in rows],
        "not_measured": list(not_measured),
        "notes": list(notes),
        "raw": raw,
    }
    if aeron_c is not None:
        document["aeron_c"] = [asdict(row) for row in aeron_c]
    if note:
        document["note"] = note
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, allow_nan=True, default=str) + "\n")
    tmp.replace(path)
