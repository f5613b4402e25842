"""The HTML report: the tables a person reads, with time-series plots (matplotlib, Agg, PNG files beside
the page).

Every plot is always drawn, with a "no data" note when its table is empty, so the page has the same
shape for every recording and a browser check can insist that every image loads. Tables fit the page
(long values wrap, nothing wider than the page); ids print as plain integers, times as ISO 8601 UTC, RTTs in µs with
their sample count beside them, and a percentile from too few samples as "n too small".
"""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .jobs import QUANTILES, TablesResult, min_samples
from .options import ReportOptions

PLOTS = ("server_traffic", "server_rtt", "churn", "talkers", "throughput", "message_types")
MAX_ROWS = 40
TOP_COUNTERS = 15
"""Driver counters shown: the ones that changed most over the recording."""
_RTT_COLUMNS = {f"rtt_p{round(q * 100)}_ns": q for q in QUANTILES}


# -- plots ----------------------------------------------------------------------------------------------


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.4), dpi=100)
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


def _times(values_ns: Sequence[int]) -> list[Any]:
    from datetime import UTC, datetime

    return [datetime.fromtimestamp(ns / 1e9, tz=UTC) for ns in values_ns]


def _time_axis(ax: Any, values_ns: Sequence[int], window_s: int) -> None:
    """An x axis of wall-clock times in UTC (``HH:MM:SS`` ticks, the date in the label), at least two
    windows wide, so a short run's one window still reads as a time."""
    import matplotlib.dates as mdates

    first, last = min(values_ns), max(values_ns)
    margin = window_s * 1_000_000_000
    ax.set_xlim(*_times([first - margin // 2, max(last + margin + margin // 2, first + 2 * margin)]))
    starts = sorted(set(values_ns))
    if len(starts) <= 10:  # a tick at each window's start
        ax.set_xticks(_times(starts))
    else:
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=mdates.UTC, maxticks=10))  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=mdates.UTC))  # type: ignore[no-untyped-call]
    day = time.strftime("%Y-%m-%d", time.gmtime(first / 1e9))
    ax.set_xlabel(f"window start, UTC ({day})")
    ax.grid(True, alpha=0.3)


def _series(rows: Sequence[dict[str, Any]], key: str, value: str) -> dict[str, list[tuple[int, Any]]]:
    series: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for row in rows:
        if row.get(value) is not None:
            series[str(row[key])].append((row["window_start_ns"], row[value]))
    for points in series.values():
        points.sort()
    return series


def plot_server_traffic(rows: Sequence[dict[str, Any]], path: Path, window_s: int) -> None:
    """Messages per second (both ways) per server, one point per window."""
    fig, ax = _figure()
    series = _series(rows, "server", "messages_per_s")
    if not series:
        _no_data(ax, "no connection statistics")
    else:
        for server, points in sorted(series.items())[:8]:
            ax.plot(_times([t for t, _ in points]), [v for _, v in points], marker="o", label=server)
        _time_axis(ax, [t for points in series.values() for t, _ in points], window_s)
        ax.set_ylabel("messages / s (in + out)")
        ax.legend(fontsize="small")
    ax.set_title(f"Traffic per server ({window_s} s windows)")
    _save(fig, path)


def plot_server_rtt(rows: Sequence[dict[str, Any]], path: Path, window_s: int) -> None:
    """RTT p50 / p95 / p99 per server and window, each point labelled with its sample count."""
    fig, ax = _figure()
    measured = [row for row in rows if row.get("rtt_p50_ns") is not None]
    if not measured:
        _no_data(ax, "no RTT samples")
    else:
        styles = {"rtt_p50_ns": "-", "rtt_p95_ns": "--", "rtt_p99_ns": ":"}
        servers = sorted({str(row["server"]) for row in measured})[:4]
        for server in servers:
            mine = sorted((r for r in measured if str(r["server"]) == server), key=lambda r: r["window_start_ns"])
            xs = _times([r["window_start_ns"] for r in mine])
            for column, style in styles.items():
                points = [(x, r[column] / 1000) for x, r in zip(xs, mine, strict=True) if r[column] is not None]
                if points:
                    label = f"{server} p{column[5:7]}"
                    ax.plot([x for x, _ in points], [v for _, v in points], style, marker="o", label=label)
            for x, r in zip(xs, mine, strict=True):
                ax.annotate(f"n={r['rtt_samples']}", (x, r["rtt_p50_ns"] / 1000), textcoords="offset points",
                            xytext=(0, 7), ha="center", fontsize="x-small", color="#555")  # fmt: skip
        _time_axis(ax, [r["window_start_ns"] for r in measured], window_s)
        ax.set_ylabel("RTT (µs)")
        ax.legend(fontsize="x-small")
    ax.set_title(f"Round-trip time per server ({window_s} s windows; p99 from ≥ {min_samples(0.99)} samples)")
    _save(fig, path)


def plot_churn(rows: Sequence[dict[str, Any]], path: Path, window_s: int) -> None:
    """Connects, disconnects and refused handshakes per window (all servers), as bars side by side."""
    fig, ax = _figure()
    kinds = (("connected", "connects", "#4f81bd"), ("disconnected", "disconnects", "#9bbb59"),
             ("handshake_rejected", "refused", "#c0504d"))  # fmt: skip
    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        counts[row["event"]][row["window_start_ns"]] += int(row["events"])
    windows = sorted({t for per in counts.values() for t in per})
    if not windows:
        _no_data(ax, "no connection events")
    else:
        import matplotlib.dates as mdates

        width = window_s / 86400 / 4  # a quarter of a window, in days (matplotlib's date unit)
        xs = [mdates.date2num(x) for x in _times(windows)]  # type: ignore[no-untyped-call]
        for i, (event, label, color) in enumerate(kinds):
            ax.bar([x + (i - 1) * width for x in xs], [counts[event].get(t, 0) for t in windows], width,
                   label=label, color=color)  # fmt: skip
        ax.xaxis_date(tz=mdates.UTC)
        _time_axis(ax, windows, window_s)
        ax.set_ylabel("events")
        ax.legend(fontsize="small")
    ax.set_title(f"Connects, disconnects and refusals ({window_s} s windows)")
    _save(fig, path)


def plot_talkers(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Bytes per remote host and per tag over the recording (the ten largest of each)."""
    fig, ax = _figure()
    totals: dict[str, int] = defaultdict(int)
    for row in rows:
        totals[f"{row['dimension']}: {row['key']}"] += int(row["bytes"])
    if not totals:
        _no_data(ax, "no connection statistics")
    else:
        top = sorted(totals, key=lambda k: (-totals[k], k))[:10]
        ax.barh(list(reversed(top)), [totals[k] for k in reversed(top)], color="#8064a2")
        ax.set_xlabel("bytes (in + out, windows where it was a top talker)")
        ax.tick_params(axis="y", labelsize="small")
    ax.set_title("Top talkers by remote address and by tag")
    _save(fig, path)


def plot_throughput(rows: Sequence[dict[str, Any]], path: Path, window_s: int) -> None:
    """Captured messages per second per stream, one line per stream (at most eight)."""
    fig, ax = _figure()
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        label = f"{_abbreviate(str(row['channel']), 40)} stream {row['stream_id']}"
        series[label].append((row["window_start_ns"], row["messages_per_s"]))
    if not series:
        _no_data(ax, "no captured streams")
    else:
        for label, points in sorted(series.items())[:8]:
            points.sort()
            ax.plot(_times([t for t, _ in points]), [v for _, v in points], marker="o", label=label)
        _time_axis(ax, [t for points in series.values() for t, _ in points], window_s)
        ax.set_ylabel("messages / s")
        ax.legend(fontsize="x-small")
    ax.set_title(f"Captured streams ({window_s} s windows)")
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


# -- tables ---------------------------------------------------------------------------------------------


def utc(timestamp_ns: int) -> str:
    """A wall-clock time as ISO 8601 UTC, to the millisecond (``2026-11-28T13:41:35.123Z``)."""
    seconds, ns = divmod(timestamp_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1_000_000:03d}Z"


def _number(value: float) -> str:
    """Three significant digits or more, no separators: 0.123, 12.3, 31625."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _abbreviate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit // 2 - 1] + "…" + text[-(limit // 2) :]


def cell(value: object, column: str, row: dict[str, Any] | None = None) -> str:
    """One table cell: ids as plain integers, ``*_ns`` / ``*_ms`` wall-clock times as ISO UTC, RTTs in
    µs ("n too small" when the table withheld a percentile), other numbers without separators."""
    if value is None:
        if column in _RTT_COLUMNS and row is not None and row.get("rtt_samples"):
            n = row["rtt_samples"]
            needed = min_samples(_RTT_COLUMNS[column])
            return f'<td class="null" title="{n} samples; needs {needed}">n too small</td>'
        return '<td class="null">-</td>'
    if isinstance(value, bool):
        return f"<td>{value}</td>"
    if isinstance(value, int):
        if column.endswith("_ns") and value > 10**17:  # a wall-clock time (a window start to the second)
            return _time_cell(utc(value).replace(".000Z", "Z") if column == "window_start_ns" else utc(value))
        if column.endswith("_ms") and value > 10**11:
            return _time_cell(utc(value * 1_000_000))
        if column in _RTT_COLUMNS:
            return f'<td class="num">{_number(value / 1000)}</td>'  # µs, said in the header
        return f'<td class="num">{value}</td>'
    if isinstance(value, float):
        return (
            f'<td class="num">{value:.4f}</td>'
            if column.endswith("_rate")
            else f'<td class="num">{_number(value)}</td>'
        )
    text = str(value)
    if column == "driver":  # a driver directory: its name says which
        text = Path(text).name or text
    long = ' class="long"' if len(text) > 12 else ""  # long values (addresses, channels) wrap anywhere
    return f'<td{long} title="{html.escape(text)}">{html.escape(_abbreviate(text, 120))}</td>'


def _time_cell(iso: str) -> str:
    """An ISO time that may wrap between its date and its time, nowhere else."""
    day, _, clock = iso.partition("T")
    return f"<td>{day}<wbr>T{clock}</td>"


def _header(column: str) -> str:
    names = {"window_start_ns": "window (UTC)", "connection_id": "conn id", "connections": "conns",
             "rtt_samples": "RTT n", "messages_per_s": "msgs/s", "bytes_per_s": "bytes/s",
             "back_pressure_events": "back press.", "retransmits": "retx", "messages_received": "msgs in",
             "messages_sent": "msgs out", "bytes_received": "bytes in", "bytes_sent": "bytes out",
             "messages_in": "msgs in", "messages_out": "msgs out", "duration_s": "secs"}  # fmt: skip
    if column in names:
        return names[column]
    if column in _RTT_COLUMNS:
        return f"RTT {column[4:7]} µs"
    return column.removesuffix("_ns").replace("_", " ")


def table(name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
          limit: int = MAX_ROWS) -> str:  # fmt: skip
    """``rows`` as an HTML table of ``columns`` (all of them when None), at most ``limit`` rows."""
    if not rows:
        return f'<p class="empty">No rows in <code>{html.escape(name)}</code>.</p>'
    shown = [c for c in (columns or list(rows[0])) if c in rows[0]]
    head = "".join(f"<th>{html.escape(_header(c))}</th>" for c in shown)
    body = "\n".join("<tr>" + "".join(cell(row[c], c, row) for c in shown) + "</tr>" for row in rows[:limit])
    more = f'<p class="more">{len(rows) - limit} more rows in the Parquet table.</p>' if len(rows) > limit else ""
    return f'<table id="table-{html.escape(name)}"><tr>{head}</tr>\n{body}</table>{more}'


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; color: #222; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1.5em; width: 100%; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.4em; overflow-wrap: break-word; vertical-align: top; }
th { background: #eee; text-align: left; } td.long { overflow-wrap: anywhere; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; } td.null { color: #999; }
img { display: block; margin: 0.5em 0; border: 1px solid #ddd; max-width: 100%; height: auto; }
.summary td:first-child { font-weight: bold; width: 14em; }
"""

_WINDOW = ("window_start_ns",)
_TRAFFIC = ("connections", "messages_per_s", "bytes_per_s", "naks_sent", "retransmits", "bytes_lost", "loss_rate",
            "back_pressure_events", "rtt_samples", "rtt_p50_ns", "rtt_p95_ns", "rtt_p99_ns")  # fmt: skip
SECTIONS: tuple[tuple[str, str, str | None, str, tuple[str, ...] | None], ...] = (
    ("Servers over time", "server_windows", "server_traffic",
     "Per window and server (the recording host): connections, traffic rates, repairs, loss, back pressure, RTT.",
     (*_WINDOW, "server", *_TRAFFIC)),
    ("Round-trip time", "server_windows", "server_rtt",
     "RTT percentiles per server and window, from the servers' completed pings; n is the sample count.", ()),
    ("Links over time", "link_windows", None,
     "Per window and link (server ↔ remote host): the same measures.", (*_WINDOW, "server", "remote", *_TRAFFIC)),
    ("Connects and disconnects", "churn", "churn",
     "Per window and server: connection events by cause (disconnects) or reason (refusals).", None),
    ("Top talkers", "top_talkers", "talkers",
     "Per window: the remote hosts and the tags that moved most bytes.", None),
    ("Sessions", "sessions", None, "Per connection: when, how long, traffic each way, loss, RTT.",
     ("server", "connection_id", "address", "tag", "start_ns", "duration_s", "cause", "messages_received",
      "messages_sent", "bytes_received", "bytes_sent", "loss_rate", "rtt_samples", "rtt_p50_ns", "rtt_p99_ns")),
    ("Rejected handshakes", "rejected_handshakes", None, "Refused handshakes by host and reason.", None),
    ("Abuse list", "abuse_list", None, "Hosts at or over the rejection threshold: what servers should refuse.", None),
    ("Captured streams", "stream_throughput", "throughput", "Captured messages per stream and window.", None),
    ("Message types", "message_types", "message_types", "Captured message types and their sizes.", None),
    ("Driver counters", "driver_counters", None,
     f"The {TOP_COUNTERS} counters that changed most between their first and last sample (all in the Parquet table).",
     ("driver", "type_name", "label", "first_value", "last_value", "change")),
    ("Loss", "loss", None, "The loss report's entries.", None),
    ("Errors", "errors", None, "The distinct error log's entries.", None),
)  # fmt: skip
"""(title, table, plot, text, columns shown: None all, () none)."""


def _span(result: TablesResult) -> str:
    starts = [r["window_start_ns"] for name in ("server_windows", "churn", "stream_throughput")
              for r in result.rows.get(name, [])]  # fmt: skip
    if not starts:
        return "no timed rows"
    return f"{utc(min(starts))} to {utc(max(starts))} (window starts)"


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
    rows = result.rows
    window = options.window_s
    plot_server_traffic(rows.get("server_windows", []), plots / "server_traffic.png", window)
    plot_server_rtt(rows.get("server_windows", []), plots / "server_rtt.png", window)
    plot_churn(rows.get("churn", []), plots / "churn.png", window)
    plot_talkers(rows.get("top_talkers", []), plots / "talkers.png")
    plot_throughput(rows.get("stream_throughput", []), plots / "throughput.png", window)
    plot_message_types(rows.get("message_types", []), plots / "message_types.png")
    counters = [r for r in rows.get("driver_counters", []) if r.get("change")][:TOP_COUNTERS]
    shown = {**rows, "driver_counters": counters}
    samples = sum(r["rtt_samples"] for r in rows.get("server_windows", []))
    summary = [
        ("Recording", f"{Path(input_dir).resolve()} (read only; unfinalized journals are not read)"),
        ("Generated", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
        ("Spark", f"{spark_version} on {master}; jobs took {elapsed_s:.1f} s"),
        ("Window", f"tumbling, {window} s, on the rows' timestamps (UTC); {_span(result)}"),
        ("Servers", ", ".join(sorted({str(r["server"]) for r in rows.get("server_windows", [])})) or "none"),
        ("Sessions", str(len(rows.get("sessions", [])))),
        (
            "RTT samples",
            f"{samples} (p95 needs {min_samples(0.95)} per group, p99 {min_samples(0.99)}; "
            "RecordingConfig.rtt_interval_s samples more)",
        ),
        ("Messages captured", str(sum(r["messages"] for r in rows.get("message_types", [])))),
        ("Refused handshakes", str(sum(r["rejections"] for r in rows.get("rejected_handshakes", [])))),
        ("Abuse-listed hosts", ", ".join(str(r["address"]) for r in rows.get("abuse_list", [])) or "none"),
        ("Abuse threshold", f"{options.abuse_threshold} rejected handshakes"),
        ("Input rows", ", ".join(f"{kind} {n}" for kind, n in result.input_rows.items())),
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
    for title, name, plot, text, columns in SECTIONS:
        parts.append(f'<h2 id="{html.escape(title.lower().replace(" ", "-"))}">{html.escape(title)}</h2>')
        parts.append(f"<p>{html.escape(text)} (Parquet: <code>tables/{name}</code>)</p>")
        if plot is not None:
            parts.append(f'<img src="plots/{plot}.png" alt="{html.escape(title)} plot" width="800" height="340">')
        if columns != ():
            parts.append(table(name, shown.get(name, []), columns))
    parts.append("</body></html>")
    path = output / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
