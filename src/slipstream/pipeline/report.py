"""The HTML report: the tables a person reads, with plots (matplotlib, Agg, PNG files beside the page).

Every plot is always drawn, with a "no data" note when its table is empty, so the page has the same
shape for every recording and a browser check can insist that every image loads.
"""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .jobs import TablesResult
from .options import ReportOptions

PLOTS = ("throughput", "message_types", "rejections", "rtt")
MAX_ROWS = 50


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_throughput(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Messages per bucket over time, one line per stream (at most ten)."""
    fig, ax = _figure()
    series: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        series[f"{row['channel']} stream {row['stream_id']} session {row['session_id']}"].append(
            (row["second"], row["messages"])
        )
    if not series:
        _no_data(ax, "no captured streams")
    elif max(len(points) for points in series.values()) < 3:  # a short run: one bar per stream reads better
        labels = sorted(series)[:10]
        ax.barh(labels, [sum(m for _, m in series[label]) for label in labels])
        ax.set_xlabel("messages (the run is shorter than three buckets)")
        ax.tick_params(axis="y", labelsize="x-small")
    else:
        start = min(t for points in series.values() for t, _ in points)
        for label, points in sorted(series.items())[:10]:
            points.sort()
            ax.plot([t - start for t, _ in points], [m for _, m in points], marker=".", label=label)
        ax.set_xlabel("seconds since the first captured message")
        ax.set_ylabel("messages per bucket")
        ax.legend(fontsize="small")
    ax.set_title("Per-stream throughput over time")
    _save(fig, path)


def plot_message_types(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """The ten most frequent message types."""
    fig, ax = _figure()
    top = list(rows)[:10]
    if not top:
        _no_data(ax, "no captured messages")
    else:
        ax.barh([str(r["message_type"]) for r in reversed(top)], [r["messages"] for r in reversed(top)])
        ax.set_xlabel("messages")
    ax.set_title("Top message types")
    _save(fig, path)


def plot_rejections(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Refused handshakes per reason."""
    fig, ax = _figure()
    by_reason: dict[str, int] = defaultdict(int)
    for row in rows:
        by_reason[str(row["reason"])] += int(row["rejections"])
    if not by_reason:
        _no_data(ax, "no rejected handshakes")
    else:
        reasons = sorted(by_reason, key=lambda r: (-by_reason[r], r))
        ax.bar(reasons, [by_reason[r] for r in reasons], color="#c0504d")
        ax.set_ylabel("rejected handshakes")
    ax.set_title("Rejected handshakes by reason")
    _save(fig, path)


def plot_rtt(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """RTT p50/p95/p99 per session (the first twenty with samples)."""
    fig, ax = _figure()
    measured = [r for r in rows if r.get("rtt_p50_ns") is not None][:20]
    if not measured:
        _no_data(ax, "no RTT samples")
    else:
        xs = range(len(measured))
        width = 0.27
        for i, (key, label) in enumerate((("rtt_p50_ns", "p50"), ("rtt_p95_ns", "p95"), ("rtt_p99_ns", "p99"))):
            ax.bar([x + (i - 1) * width for x in xs], [r[key] / 1000 for r in measured], width, label=label)
        ax.set_xticks(list(xs), [str(r["connection_id"]) for r in measured])
        ax.set_xlabel("connection id")
        ax.set_ylabel("RTT (µs)")
        ax.legend(fontsize="small")
    ax.set_title("Round-trip time per session")
    _save(fig, path)


def _cell(value: object, column: str = "") -> str:
    if value is None:
        return '<td class="null">-</td>'
    if isinstance(value, float):
        return f'<td class="num">{value:,.3f}</td>'
    if column.endswith("_ns") and isinstance(value, int) and value > 10**17:  # a wall-clock time
        return f"<td>{_utc(value)}</td>"
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="num">{value:,}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def _table(name: str, rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return f'<p class="empty">No rows in <code>{html.escape(name)}</code>.</p>'
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "\n".join("<tr>" + "".join(_cell(row[c], c) for c in columns) + "</tr>" for row in rows[:MAX_ROWS])
    more = f"<p>{len(rows) - MAX_ROWS} more rows in the Parquet table.</p>" if len(rows) > MAX_ROWS else ""
    return f'<table id="table-{html.escape(name)}"><tr>{head}</tr>\n{body}</table>{more}'


def _utc(timestamp_ns: int) -> str:
    seconds, ns = divmod(timestamp_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{ns // 1_000_000:03d}"


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; }
th { background: #eee; } td.num { text-align: right; font-variant-numeric: tabular-nums; } td.null { color: #aaa; }
img { display: block; margin: 0.5em 0; border: 1px solid #ddd; }
.summary td:first-child { font-weight: bold; }
"""

SECTIONS = (
    ("Sessions", "sessions", "rtt", "Per connection: duration, messages and bytes each way, throughput, RTT, loss."),
    ("Rejected handshakes", "rejected_handshakes", "rejections", "Refused handshakes by host and reason."),
    ("Abuse list", "abuse_list", None, "Hosts at or over the rejection threshold: what servers should refuse."),
    ("Stream throughput", "stream_throughput", "throughput", "Captured messages per stream per time bucket."),
    ("Message types", "message_types", "message_types", "Top message types and their sizes."),
    ("Driver counters", "driver_counters", None, "Each counter's last sampled value."),
    ("Loss", "loss", None, "The loss report's entries."),
    ("Errors", "errors", None, "The distinct error log's entries."),
)


def write_report(
    result: TablesResult,
    output_dir: str | Path,
    *,
    input_dir: str | Path,
    options: ReportOptions,
    master: str,
    spark_version: str,
    elapsed_s: float,
) -> Path:
    """Draw the plots and write ``output_dir/report.html``; returns its path."""
    output = Path(output_dir)
    plots = output / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    plot_throughput(result.rows.get("stream_throughput", []), plots / "throughput.png")
    plot_message_types(result.rows.get("message_types", []), plots / "message_types.png")
    plot_rejections(result.rows.get("rejected_handshakes", []), plots / "rejections.png")
    plot_rtt(result.rows.get("sessions", []), plots / "rtt.png")
    summary = [
        ("Recording", str(Path(input_dir).resolve())),
        ("Generated", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())),
        ("Spark", f"{spark_version} on {master}"),
        ("Jobs took", f"{elapsed_s:.1f} s"),
        ("Sessions", f"{len(result.rows.get('sessions', [])):,}"),
        ("Messages captured", f"{sum(r['messages'] for r in result.rows.get('message_types', [])):,}"),
        ("Refused handshakes", f"{sum(r['rejections'] for r in result.rows.get('rejected_handshakes', [])):,}"),
        ("Abuse-listed hosts", ", ".join(r["address"] for r in result.rows.get("abuse_list", [])) or "none"),
        ("Abuse threshold", f"{options.abuse_threshold} rejected handshakes"),
        *((f"Input rows: {kind}", f"{rows:,}") for kind, rows in result.input_rows.items()),
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>slipstream report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>slipstream report</h1>",
        '<table class="summary">'
        + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in summary)
        + "</table>",
    ]
    for title, table, plot, text in SECTIONS:
        parts.append(f'<h2 id="{table}">{html.escape(title)}</h2><p>{html.escape(text)} '
                     f'(Parquet: <code>tables/{table}</code>)</p>')
        if plot is not None:
            parts.append(f'<img src="plots/{plot}.png" alt="{html.escape(title)} plot" width="800" height="360">')
        parts.append(_table(table, result.rows.get(table, [])))
    parts.append("</body></html>")
    path = output / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
