"""The report's tables in DuckDB SQL, over the same Parquet segment files the ``slipstream`` source reads.

One query per table of :data:`slipstream.pipeline.jobs.TABLES` (:data:`TABLES`), over one view per
recorded kind, so a table the report gains is added here by adding its SQL; :func:`compare` checks a
DuckDB table against Spark's row for row (floats to rounding, percentile columns to a tolerance where
Spark approximates them). This is the benchmark's single-machine yardstick: the same answers,
computed by an engine made for one machine.

The SQL mirrors ``jobs.py`` (and ``pipeline/abuse.py``) where the two engines differ: Spark's
``min_by``/``max_by`` keep null values (DuckDB's ``arg_min``/``arg_max`` skip them: ``arg_*_null``
here), Spark sorts nulls first ascending and last descending (set on the connection), DuckDB sums
integers into HUGEINT (cast back to BIGINT), Spark divides integers in doubles (the abuse list's
buckets: done the same way here). Percentiles: ``pcts(x)`` (p50/p95/p99 from one state) and
``pct(x, q)`` are macros, chosen per connection: ``exact`` is ``quantile_disc``, the ``ceil(q * n)``-th
smallest sample, which is what Spark's ``percentile_approx`` returns for a group it does not compress
(fewer than accuracy / 2 = 5,000 samples), so those agree exactly; ``approx`` is ``approx_quantile``
(a t-digest, interpolated). ``interpolated`` (``quantile_cont``, Spark's exact ``percentile``) is
there for the exact-against-approximate timing of :data:`RTT_GROUPINGS`.
"""

from __future__ import annotations

import glob
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEGMENT_GLOB = "{root}/{kind}/date=*/hour=*/host=*/*.parquet"
"""Where a kind's finalized segments are: the partitioned layout
(``ROOT/<kind>/date=YYYY-MM-DD/hour=HH/host=<name>/<writer>.<seq>.parquet``, compacted files too;
journals under ``ROOT/_journals`` and ``.<name>.tmp`` files being written do not match). The one place
the layout is written. The views read it with ``hive_partitioning`` on, so ``date``, ``hour`` and
``host`` are columns a time- or host-bounded query can filter on (DuckDB then opens only those
directories); the report's tables cover the whole recording and never name them."""

PERCENTILE_REL = 5e-3
"""How far (relative) a DuckDB percentile may be from Spark's. Both return a sample, the ``ceil(q * n)``-th
smallest; Spark's ``percentile_approx`` (accuracy 10,000) does so exactly for a group of fewer than 5,000
samples (every connection's RTTs at any size: equal there) and within n / 10,000 in rank above (a
window's RTTs at 5 M rows and up, a message type's sizes). On the benchmark's uniform values that rank
error is 1/10,000 of the range (RTT 20-200 us: 18 ns; size 16-1023 B: 0.1 B) plus, for integers with
many repeats, one step to a neighbouring value: a median size of about 520 B seen as 521 is 0.2 %. 0.5 %
covers that with margin; it is no tolerance for a wrong window, group or filter, which shows in the
counts and sums (compared exactly) and in every connection's exact percentiles."""


@dataclass(frozen=True)
class Table:
    """One report table: its query, and the columns that are percentiles (compared with a tolerance)."""

    sql: str
    percentiles: tuple[str, ...] = ()


RTT = ("rtt_p50_ns", "rtt_p95_ns", "rtt_p99_ns")

PRELUDE = (
    # The servers' view, as jobs.server_side (connection_stats before version 2 had no side: a server's);
    # server is jobs.server_name: the row's local host, or jobs.UNKNOWN_SERVER for older records.
    "CREATE VIEW server_events AS SELECT *, coalesce(local, '{unknown_server}') AS server FROM connection_events "
    "WHERE coalesce(side, 'server') = 'server'",
    "CREATE VIEW server_stats AS SELECT *, coalesce(local, '{unknown_server}') AS server FROM connection_stats "
    "WHERE coalesce(side, 'server') = 'server'",
    # abuse.host: the host of host:port or [v6]:port, anything else unchanged.
    r"""CREATE MACRO host(a) AS CASE
        WHEN regexp_matches(a, '^\[.*\]:[0-9]+$') THEN regexp_extract(a, '^\[(.*)\]:[0-9]+$', 1)
        WHEN regexp_matches(a, '^[^:]*:[0-9]+$') THEN regexp_extract(a, '^([^:]*):[0-9]+$', 1)
        ELSE a END""",
    # jobs.window_start: the tumbling window a row falls in.
    "CREATE MACRO win(ts) AS ts - (ts % {window_ns})",
    # jobs.stats_deltas: each stats row's counters as the change since the connection's previous row.
    """CREATE VIEW stats_deltas AS SELECT timestamp_ns, server, connection_id, tag, rtt_ns,
        host(address) AS remote, {deltas}
    FROM server_stats WINDOW w AS (PARTITION BY server, connection_id ORDER BY timestamp_ns)""",
)

PERCENTILE_MACROS = {
    "exact": (
        "CREATE MACRO pct(x, q) AS quantile_disc(x, q)",
        "CREATE MACRO pcts(x) AS quantile_disc(x, [0.5, 0.95, 0.99])",
    ),
    "approx": (
        "CREATE MACRO pct(x, q) AS approx_quantile(x, q)",
        "CREATE MACRO pcts(x) AS approx_quantile(x, [0.5, 0.95, 0.99])",
    ),
    "interpolated": (
        "CREATE MACRO pct(x, q) AS quantile_cont(x, q)",
        "CREATE MACRO pcts(x) AS quantile_cont(x, [0.5, 0.95, 0.99])",
    ),
}

COUNTERS = ("messages_sent", "messages_received", "bytes_sent", "bytes_received", "naks_sent", "naks_received",
            "retransmits", "bytes_lost", "back_pressure_events")  # fmt: skip
"""jobs._COUNTERS, in its order."""


def _deltas() -> str:
    return ", ".join(
        f"CASE WHEN {c} >= lag({c}, 1, 0) OVER w THEN {c} - lag({c}, 1, 0) OVER w ELSE {c} END AS {c}" for c in COUNTERS
    )


def _rtt(samples: str = "rtt_samples", q: str = "rtt_q") -> str:
    """jobs._percentiles' columns from a subquery's ``count`` and ``pcts`` state: null below min_samples."""
    from slipstream.pipeline.jobs import QUANTILES, min_samples

    return ", ".join(
        f"CASE WHEN {samples} >= {min_samples(value)} THEN {q}[{i + 1}] END AS rtt_p{round(value * 100)}_ns"
        for i, value in enumerate(QUANTILES)
    )


def _sum(column: str, alias: str | None = None) -> str:
    return f"CAST(sum({column}) AS BIGINT) AS {alias or column}"


TRAFFIC = f"""
    count(DISTINCT connection_id) AS connections,
    {_sum("messages_received", "messages_in")}, {_sum("messages_sent", "messages_out")},
    {_sum("bytes_received", "bytes_in")}, {_sum("bytes_sent", "bytes_out")},
    CAST(sum(messages_received) + sum(messages_sent) AS DOUBLE) / {{window_s}} AS messages_per_s,
    CAST(sum(bytes_received) + sum(bytes_sent) AS DOUBLE) / {{window_s}} AS bytes_per_s,
    {_sum("naks_sent")}, {_sum("naks_received")}, {_sum("retransmits")}, {_sum("bytes_lost")},
    CASE WHEN sum(bytes_received) + sum(bytes_lost) > 0
        THEN CAST(sum(bytes_lost) AS DOUBLE) / (sum(bytes_received) + sum(bytes_lost)) ELSE 0.0::DOUBLE END
        AS loss_rate,
    {_sum("back_pressure_events")},
    count(rtt_ns) AS rtt_samples, pcts(rtt_ns) AS rtt_q
"""
"""jobs._traffic's measures (the RTT percentiles as a state for :func:`_rtt`)."""


def _traffic(keys: str) -> Table:
    return Table(
        f"""
        SELECT * EXCLUDE (rtt_q), {{rtt}} FROM (
            SELECT win(timestamp_ns) AS window_start_ns, {keys}, {TRAFFIC}
            FROM stats_deltas GROUP BY ALL
        ) ORDER BY window_start_ns, {keys}
        """,
        percentiles=RTT,
    )


TABLES: dict[str, Table] = {
    "sessions": Table(
        f"""
        WITH opened AS (
            SELECT server, connection_id,
                arg_min_null(address, timestamp_ns) AS address,
                arg_min_null(tag, timestamp_ns) AS tag,
                arg_min_null(transport, timestamp_ns) AS transport,
                min(CASE WHEN event IN ('handshake_accepted', 'connected') THEN timestamp_ns END) AS start_ns,
                max(CASE WHEN event = 'disconnected' THEN timestamp_ns END) AS end_ns,
                arg_max_null(CASE WHEN event = 'disconnected' THEN cause END, timestamp_ns) AS cause
            FROM server_events WHERE connection_id IS NOT NULL GROUP BY server, connection_id
        ), totals AS (
            SELECT * EXCLUDE (rtt_q), {{rtt}} FROM (
                SELECT server, connection_id,
                    {", ".join(f"max({c}) AS {c}" for c in COUNTERS if c != "naks_received")},
                    max(timestamp_ns) AS last_stats_ns, count(rtt_ns) AS rtt_samples, pcts(rtt_ns) AS rtt_q
                FROM server_stats GROUP BY server, connection_id
            )
        ), joined AS (
            SELECT *, (coalesce(end_ns, last_stats_ns) - start_ns) / 1e9 AS duration_s,
                coalesce(bytes_received, 0) + coalesce(bytes_lost, 0) AS offered
            FROM opened FULL OUTER JOIN totals USING (server, connection_id)
        )
        SELECT * EXCLUDE (last_stats_ns, offered),
            CASE WHEN duration_s > 0
                THEN (coalesce(bytes_sent, 0) + coalesce(bytes_received, 0)) / duration_s END
                AS throughput_bytes_per_s,
            CASE WHEN offered > 0 THEN coalesce(bytes_lost, 0) / offered ELSE 0.0::DOUBLE END AS loss_rate
        FROM joined ORDER BY server, connection_id
        """,
        percentiles=RTT,
    ),
    "server_windows": _traffic("server"),
    "link_windows": _traffic("server, remote"),
    "churn": Table(
        """
        SELECT win(timestamp_ns) AS window_start_ns, server, event, coalesce(cause, reason, '') AS detail,
            count(*) AS events
        FROM server_events GROUP BY ALL ORDER BY window_start_ns, server, event, detail
        """
    ),
    "top_talkers": Table(
        """
        WITH keyed AS (
            SELECT win(timestamp_ns) AS window_start_ns, 'address' AS dimension, remote AS key,
                messages_sent, messages_received, bytes_sent, bytes_received FROM stats_deltas
            UNION ALL
            SELECT win(timestamp_ns), 'tag', tag, messages_sent, messages_received, bytes_sent, bytes_received
            FROM stats_deltas
        ), totals AS (
            SELECT window_start_ns, dimension, key,
                CAST(sum(messages_sent) + sum(messages_received) AS BIGINT) AS messages,
                CAST(sum(bytes_sent) + sum(bytes_received) AS BIGINT) AS bytes
            FROM keyed GROUP BY ALL
        ), ranked AS (
            SELECT *, CAST(row_number() OVER (
                PARTITION BY window_start_ns, dimension ORDER BY bytes DESC, messages DESC, key
            ) AS INTEGER) AS rank FROM totals
        )
        SELECT * FROM ranked WHERE rank <= {top} ORDER BY window_start_ns, dimension, rank
        """
    ),
    "rejected_handshakes": Table(
        """
        SELECT host(address) AS address, coalesce(reason, 'unknown') AS reason, count(*) AS rejections,
            min(timestamp_ns) AS first_ns, max(timestamp_ns) AS last_ns
        FROM server_events WHERE event = 'handshake_rejected'
        GROUP BY 1, 2 ORDER BY rejections DESC, address, reason
        """
    ),
    "abuse_list": Table(
        # abuse.refusal_buckets (Spark's bucket: floor of a double division, as here), then abuse.abuse_snapshot.
        """
        WITH buckets AS (
            SELECT host(address) AS address,
                CAST(floor(timestamp_ns / {bucket_ns}) AS BIGINT) * {bucket_ns} AS bucket_ns,
                count(*) AS rejections, max(timestamp_ns) AS last_ns,
                list(DISTINCT coalesce(reason, 'unknown')) AS reasons
            FROM server_events WHERE event = 'handshake_rejected' GROUP BY 1, 2
        ), live AS (
            SELECT *, sum(rejections) OVER (
                PARTITION BY address ORDER BY bucket_ns DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
            ) AS running
            FROM buckets WHERE bucket_ns + {bucket_ns} > (SELECT max(last_ns) FROM buckets) - {abuse_window_ns}
        )
        SELECT address, CAST(sum(rejections) AS BIGINT) AS rejections,
            array_to_string(list_sort(list_distinct(flatten(list(reasons)))), ',') AS reasons,
            max(last_ns) AS last_ns,
            max(CASE WHEN running >= {abuse_threshold} THEN bucket_ns END) + {bucket_ns} + {abuse_window_ns}
                AS expires_ns
        FROM live GROUP BY address HAVING sum(rejections) >= {abuse_threshold}
        ORDER BY rejections DESC, address
        """
    ),
    "stream_throughput": Table(
        """
        SELECT channel, stream_id, session_id, win(timestamp_ns) AS window_start_ns,
            count(*) AS messages, CAST(sum(size) AS BIGINT) AS bytes,
            count(*) / {window_s}::DOUBLE AS messages_per_s, CAST(sum(size) AS DOUBLE) / {window_s} AS bytes_per_s
        FROM captured GROUP BY 1, 2, 3, 4 ORDER BY channel, stream_id, session_id, window_start_ns
        """
    ),
    "message_types": Table(
        """
        SELECT coalesce(message_type, '(raw)') AS message_type, count(*) AS messages,
            CAST(sum(size) AS BIGINT) AS bytes, min(size) AS min_size, pct(size, 0.5) AS p50_size,
            max(size) AS max_size
        FROM captured GROUP BY 1 ORDER BY messages DESC, message_type
        """,
        percentiles=("p50_size",),
    ),
    "driver_counters": Table(
        """
        SELECT *, last_value - first_value AS change FROM (
            SELECT driver, counter_id, registration_id,
                arg_max_null(type_name, timestamp_ns) AS type_name, arg_max_null(label, timestamp_ns) AS label,
                min(timestamp_ns) AS first_ns, max(timestamp_ns) AS last_ns,
                arg_min_null(value, timestamp_ns) AS first_value, arg_max_null(value, timestamp_ns) AS last_value
            FROM driver_counters GROUP BY 1, 2, 3
        ) ORDER BY abs(change) DESC, last_value DESC, driver, counter_id, registration_id
        """
    ),
    "loss": Table(
        """
        SELECT driver, session_id, stream_id, channel, source,
            max(observation_count) AS observation_count, max(total_bytes_lost) AS total_bytes_lost,
            min(first_observation_ms) AS first_observation_ms, max(last_observation_ms) AS last_observation_ms
        FROM loss_report GROUP BY 1, 2, 3, 4, 5
        ORDER BY total_bytes_lost DESC, driver, session_id, stream_id, channel, source
        """
    ),
    "errors": Table(
        """
        SELECT driver, text, max(observation_count) AS observation_count,
            min(first_observation_ms) AS first_observation_ms, max(last_observation_ms) AS last_observation_ms
        FROM error_log GROUP BY 1, 2 ORDER BY observation_count DESC, driver, text
        """
    ),
}
"""The report's tables, by the name ``jobs.TABLES`` gives them."""

RTT_GROUPINGS = {"per_connection": "connection_id", "per_minute": "timestamp_ns // 60000000000"}
"""The RTT percentile table's two shapes: many small groups (a connection's samples) and few large ones
(a minute of the fleet's samples: where an exact percentile has to hold and sort many values)."""


def rtt_percentiles(key: str) -> Table:
    """RTT p50/p95/p99 and the sample count per ``key`` (an expression, output as ``key``): the part of
    the sessions table that percentiles make costly. ``pcts`` computes the three from one state."""
    return Table(
        f"""
        SELECT key, samples, q[1] AS rtt_p50_ns, q[2] AS rtt_p95_ns, q[3] AS rtt_p99_ns FROM (
            SELECT {key} AS key, count(rtt_ns) AS samples, pcts(rtt_ns) AS q FROM server_stats GROUP BY 1
        ) ORDER BY key
        """,
        percentiles=("rtt_p50_ns", "rtt_p95_ns", "rtt_p99_ns"),
    )


def segment_glob(root: Path, kind: str) -> str | None:
    """The glob of ``kind``'s segments under ``root``, or None when it has none (DuckDB refuses an empty glob)."""
    pattern = SEGMENT_GLOB.format(root=str(root).rstrip("/"), kind=kind)
    return pattern if glob.glob(pattern) else None


def connect(root: Path, *, percentiles: str = "exact", threads: int = 2, window_s: int = 60) -> Any:
    """A DuckDB connection with one view per recorded kind of ``root`` (an empty table with the kind's
    schema where nothing was recorded), the report's helper views and macros (windows ``window_s`` wide)."""
    import duckdb

    from slipstream.pipeline.jobs import UNKNOWN_SERVER
    from slipstream.telemetry import BUILTIN_SCHEMAS
    from slipstream.telemetry.segments import arrow_schema

    con = duckdb.connect()
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET default_null_order = 'nulls_first_on_asc_last_on_desc'")  # Spark's
    for kind, schema in BUILTIN_SCHEMAS.items():
        pattern = segment_glob(root, kind)
        if pattern is None:
            con.register(f"_empty_{kind}", arrow_schema(schema).empty_table())
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM _empty_{kind}")
        else:
            quoted = pattern.replace("'", "''")
            con.execute(
                f"CREATE VIEW {kind} AS SELECT * FROM read_parquet('{quoted}', union_by_name = true, "
                "hive_partitioning = true)"
            )
    values = {"unknown_server": UNKNOWN_SERVER.replace("'", "''"), "window_ns": int(window_s) * 10**9,
              "deltas": _deltas()}  # fmt: skip
    for statement in (*PRELUDE, *PERCENTILE_MACROS[percentiles]):
        con.execute(statement.format(**values) if statement in PRELUDE else statement)
    return con


def query(table: Table, abuse_threshold: int = 5, window_s: int = 60, top: int = 10) -> str:
    """The table's SQL with the report's options in it (integers, validated by ``ReportOptions``) and the
    abuse list's window and bucket (``pipeline/abuse.py``'s defaults, which the report uses)."""
    from slipstream.pipeline.abuse import DEFAULT_BUCKET_S, DEFAULT_WINDOW_S

    return table.sql.format(
        abuse_threshold=int(abuse_threshold), window_s=int(window_s), top=int(top), rtt=_rtt(),
        bucket_ns=DEFAULT_BUCKET_S * 10**9, abuse_window_ns=DEFAULT_WINDOW_S * 10**9,
    )  # fmt: skip


def build_tables(
    root: Path,
    output_dir: Path,
    *,
    abuse_threshold: int = 5,
    window_s: int = 60,
    top: int = 10,
    percentiles: str = "exact",
    threads: int = 2,
    names: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """Compute each table and write it as ``output_dir/<name>.parquet`` (as the report writes its
    tables, with ``ReportOptions``' ``abuse_threshold``, ``window_s`` and ``top``); returns the seconds
    each took."""
    output_dir.mkdir(parents=True, exist_ok=True)
    con = connect(root, percentiles=percentiles, threads=threads, window_s=window_s)
    seconds: dict[str, float] = {}
    try:
        for name in names or tuple(TABLES):
            target = str(output_dir / f"{name}.parquet").replace("'", "''")
            sql = query(TABLES[name], abuse_threshold, window_s, top)
            started = time.monotonic()
            con.execute(f"COPY ({sql}) TO '{target}' (FORMAT parquet)")
            seconds[name] = time.monotonic() - started
    finally:
        con.close()
    return seconds


def rows(path: Path) -> list[dict[str, Any]]:
    """A written table's rows (a Parquet file, or Spark's directory of parts), in file order."""
    import pyarrow.parquet as pq

    rows_: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows_


def compare(
    expected: list[dict[str, Any]],
    got: list[dict[str, Any]],
    percentiles: tuple[str, ...] = (),
    *,
    percentile_rel: float = PERCENTILE_REL,
    limit: int = 5,
) -> list[str]:
    """The differences between two tables, row for row (empty when they agree): the same columns in
    the same order, the same rows in the same order; floats agree to 1e-9 relative, percentile columns
    to ``percentile_rel`` relative (:data:`PERCENTILE_REL`: Spark approximates large groups)."""
    if not expected and not got:
        return []
    names = list((expected or got)[0])
    other = list((got or expected)[0])
    if names != other:
        return [f"columns differ: {names} against {other}"]
    differences = []
    if len(expected) != len(got):
        differences.append(f"{len(expected)} rows against {len(got)}")
    for index, (want, have) in enumerate(zip(expected, got, strict=False)):
        for name in names:
            a, b = want[name], have[name]
            numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
            if numbers and (name in percentiles or isinstance(a, float) or isinstance(b, float)):
                rel = percentile_rel if name in percentiles else 1e-9
                same = math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)
            else:
                same = a == b
            if not same:
                differences.append(f"row {index} column {name}: {a!r} against {b!r}")
                if len(differences) >= limit:
                    return differences
    return differences
