"""The report's tables in DuckDB SQL, over the same Parquet segment files the ``slipstream`` source reads.

One query per table of :data:`slipstream.pipeline.jobs.TABLES` (:data:`TABLES`), over one view per
recorded kind, so a table the report gains is added here by adding its SQL; :func:`compare` checks a
DuckDB table against Spark's row for row (floats to rounding, percentile columns to a tolerance, since
either side may approximate them). This is the benchmark's single-machine yardstick: the same answers,
computed by an engine made for one machine.

The SQL mirrors ``jobs.py`` where the two engines differ: Spark's ``min_by``/``max_by`` keep null values
(DuckDB's ``arg_min``/``arg_max`` skip them: ``arg_*_null`` here), Spark sorts nulls first ascending and
last descending (set on the connection), DuckDB sums integers into HUGEINT (cast back to BIGINT).
``pct(x, q)`` (and ``pcts(x)``, p50/p95/p99 from one state) is a macro: exact (``quantile_cont``, the
same interpolation as Spark's ``percentile``) or approximate (``approx_quantile``, a t-digest), chosen
per connection.
"""

from __future__ import annotations

import glob
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEGMENT_GLOB = "{root}/*/{kind}/*.parquet"
"""Where a kind's finalized segments are (``ROOT/<writer>/<kind>/<seq>.parquet``; journals and files
being finalized do not match). The one place the layout is written: a Hive-partitioned layout
(``ROOT/<kind>/date=.../hour=.../host=.../*.parquet``) changes this line only (DuckDB adds the
partition columns by itself)."""


@dataclass(frozen=True)
class Table:
    """One report table: its query, and the columns that are percentiles (compared with a tolerance)."""

    sql: str
    percentiles: tuple[str, ...] = ()


PRELUDE = (
    # The servers' view, as jobs.server_side (connection_stats before version 2 had no side: a server's).
    "CREATE VIEW server_events AS SELECT * FROM connection_events WHERE coalesce(side, 'server') = 'server'",
    "CREATE VIEW server_stats AS SELECT * FROM connection_stats WHERE coalesce(side, 'server') = 'server'",
    # jobs.host: the host of host:port or [v6]:port, anything else unchanged.
    r"""CREATE MACRO host(a) AS CASE
        WHEN regexp_matches(a, '^\[.*\]:[0-9]+$') THEN regexp_extract(a, '^\[(.*)\]:[0-9]+$', 1)
        WHEN regexp_matches(a, '^[^:]*:[0-9]+$') THEN regexp_extract(a, '^([^:]*):[0-9]+$', 1)
        ELSE a END""",
)

PERCENTILE_MACROS = {
    "exact": (
        "CREATE MACRO pct(x, q) AS quantile_cont(x, q)",
        "CREATE MACRO pcts(x) AS quantile_cont(x, [0.5, 0.95, 0.99])",
    ),
    "approx": (
        "CREATE MACRO pct(x, q) AS CAST(approx_quantile(x, q) AS DOUBLE)",
        "CREATE MACRO pcts(x) AS CAST(approx_quantile(x, [0.5, 0.95, 0.99]) AS DOUBLE[])",
    ),
}

TABLES: dict[str, Table] = {
    "sessions": Table(
        """
        WITH opened AS (
            SELECT connection_id,
                arg_min_null(address, timestamp_ns) AS address,
                arg_min_null(tag, timestamp_ns) AS tag,
                arg_min_null(transport, timestamp_ns) AS transport,
                min(CASE WHEN event IN ('handshake_accepted', 'connected') THEN timestamp_ns END) AS start_ns,
                max(CASE WHEN event = 'disconnected' THEN timestamp_ns END) AS end_ns,
                arg_max_null(CASE WHEN event = 'disconnected' THEN cause END, timestamp_ns) AS cause
            FROM server_events WHERE connection_id IS NOT NULL GROUP BY connection_id
        ), totals AS (
            SELECT connection_id,
                max(messages_sent) AS messages_sent, max(messages_received) AS messages_received,
                max(bytes_sent) AS bytes_sent, max(bytes_received) AS bytes_received,
                max(bytes_lost) AS bytes_lost, max(naks_sent) AS naks_sent, max(retransmits) AS retransmits,
                max(back_pressure_events) AS back_pressure_events, max(timestamp_ns) AS last_stats_ns,
                pct(rtt_ns, 0.5) AS rtt_p50_ns, pct(rtt_ns, 0.95) AS rtt_p95_ns, pct(rtt_ns, 0.99) AS rtt_p99_ns
            FROM server_stats GROUP BY connection_id
        ), joined AS (
            SELECT *, (coalesce(end_ns, last_stats_ns) - start_ns) / 1e9 AS duration_s,
                coalesce(bytes_received, 0) + coalesce(bytes_lost, 0) AS offered
            FROM opened FULL OUTER JOIN totals USING (connection_id)
        )
        SELECT * EXCLUDE (last_stats_ns, offered),
            CASE WHEN duration_s > 0
                THEN (coalesce(bytes_sent, 0) + coalesce(bytes_received, 0)) / duration_s END
                AS throughput_bytes_per_s,
            CASE WHEN offered > 0 THEN coalesce(bytes_lost, 0) / offered ELSE 0.0 END AS loss_rate
        FROM joined ORDER BY connection_id
        """,
        percentiles=("rtt_p50_ns", "rtt_p95_ns", "rtt_p99_ns"),
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
        """
        SELECT host(address) AS address, count(*) AS rejections,
            array_to_string(list_sort(list(DISTINCT coalesce(reason, 'unknown'))), ',') AS reasons,
            max(timestamp_ns) AS last_ns
        FROM server_events WHERE event = 'handshake_rejected'
        GROUP BY 1 HAVING count(*) >= {abuse_threshold} ORDER BY rejections DESC, address
        """
    ),
    "stream_throughput": Table(
        """
        SELECT channel, stream_id, session_id,
            CAST(floor(timestamp_ns / ({bucket_s} * 1000000000)) * {bucket_s} AS BIGINT) AS second,
            count(*) AS messages, CAST(sum(size) AS BIGINT) AS bytes
        FROM captured GROUP BY 1, 2, 3, 4 ORDER BY channel, stream_id, session_id, second
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
        SELECT driver, counter_id, registration_id, type_name,
            arg_max_null(label, timestamp_ns) AS label, arg_max_null(value, timestamp_ns) AS value
        FROM driver_counters GROUP BY 1, 2, 3, 4 ORDER BY driver, counter_id, registration_id
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


def connect(root: Path, *, percentiles: str = "exact", threads: int = 2) -> Any:
    """A DuckDB connection with one view per recorded kind of ``root`` (an empty table with the kind's
    schema where nothing was recorded), the report's helper views and the ``pct`` macro."""
    import duckdb

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
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM read_parquet('{quoted}', union_by_name = true)")
    for statement in (*PRELUDE, *PERCENTILE_MACROS[percentiles]):
        con.execute(statement)
    return con


def query(table: Table, abuse_threshold: int = 5, bucket_s: int = 1) -> str:
    """The table's SQL with the report's options in it (integers, validated by ``ReportOptions``)."""
    return table.sql.format(abuse_threshold=int(abuse_threshold), bucket_s=int(bucket_s))


def build_tables(
    root: Path,
    output_dir: Path,
    *,
    abuse_threshold: int = 5,
    bucket_s: int = 1,
    percentiles: str = "exact",
    threads: int = 2,
    names: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """Compute each table and write it as ``output_dir/<name>.parquet`` (as the report writes its
    tables); returns the seconds each took."""
    output_dir.mkdir(parents=True, exist_ok=True)
    con = connect(root, percentiles=percentiles, threads=threads)
    seconds: dict[str, float] = {}
    try:
        for name in names or tuple(TABLES):
            target = str(output_dir / f"{name}.parquet").replace("'", "''")
            started = time.monotonic()
            con.execute(f"COPY ({query(TABLES[name], abuse_threshold, bucket_s)}) TO '{target}' (FORMAT parquet)")
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
    percentile_rel: float = 0.10,
    limit: int = 5,
) -> list[str]:
    """The differences between two tables, row for row (empty when they agree): the same columns in
    the same order, the same rows in the same order; floats agree to 1e-9 relative, percentile columns
    to ``percentile_rel`` relative (one side may approximate them: an approximation that returns a
    sample, as Spark's ``percentile_approx`` does, lands up to one gap between neighbouring samples from
    the interpolated value, 8 % with the benchmark's 100 uniform RTT samples per connection)."""
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
