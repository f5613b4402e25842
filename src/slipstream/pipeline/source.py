"""The ``slipstream`` Spark data source: recordings in (batch and streaming), slipstream streams out.

Reading (``spark.read.format("slipstream").option("kind", "captured").load(DIR)``) goes through
:mod:`slipstream.telemetry`'s reader only: the Spark driver lists finalized segments, executors read
slices of them as Arrow record batches (no per-row conversion). Typed kinds (``typed.<Type>``) come
out with the message's fields as typed columns.

Streaming offsets are ``{"writers": {writer: [seq, row]}}``: for each writer directory, every segment
before ``seq`` and the first ``row`` rows of segment ``seq`` have been read. Finalized segments never
change and a writer finalizes them in sequence order, so an offset names the same rows forever: a
query restarted from its checkpoint resumes exactly where its last committed batch ended.

Writing (``df.write.format("slipstream").option("channel", ...).option("stream", ...).save()``)
is :mod:`slipstream.pipeline.sink`: each row one msgpack message numbered (query, batch, sequence),
published by the commit on the Spark driver, so a receiver that drops repeats applies each row once.
Every row passes through the Spark driver's memory: it suits answers (abuse lists, alerts), not exports.

Every session finds the source by itself: PySpark 4 registers the ``DefaultSource`` of each installed
top-level ``pyspark_*`` module under its name, and ``pyspark_slipstream`` (shipped with slipstream)
exposes this class. :func:`register` does it explicitly for a Python that does not see the install.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ..telemetry import RecordError, Recording, Segment
from ..telemetry.reader import RowFilter, iter_segment, segment_ranges, spans

NAME = "slipstream"
DEFAULT_KIND = "captured"
DEFAULT_ROWS_PER_PARTITION = 4 * 262_144
"""Four of the recorder's 256 Ki-row row groups: few enough tasks that a Python worker's
per-task cost stays small, enough of them to keep two cores busy from a few million rows."""
BATCH_ROWS = 65_536
"""Rows per Arrow batch handed to Spark: a row group (256 Ki rows, payloads included) would make
batches of hundreds of MB in the JVM."""


class SlipstreamSourceError(ValueError):
    """A bad option of the ``slipstream`` data source; the message names it."""


def spark_schema(arrow_schema: Any) -> StructType:
    """A Spark schema for an Arrow schema of the telemetry floor's column types."""
    import pyarrow as pa

    def convert(arrow_type: Any) -> DataType:
        if pa.types.is_int64(arrow_type):
            return LongType()
        if pa.types.is_int32(arrow_type):
            return IntegerType()
        if pa.types.is_floating(arrow_type):
            return DoubleType()
        if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
            return StringType()
        if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
            return BinaryType()
        if pa.types.is_boolean(arrow_type):
            return BooleanType()
        raise SlipstreamSourceError(f"column type {arrow_type} has no Spark mapping")

    return StructType([StructField(f.name, convert(f.type), f.nullable) for f in arrow_schema])


def arrow_schema_of(schema: StructType) -> Any:
    """The Arrow schema a Spark schema of the telemetry floor's types reads as (:func:`spark_schema`
    inverted): what each task conforms its rows to, so every segment yields the same columns."""
    import pyarrow as pa

    types = {
        LongType: pa.int64(),
        IntegerType: pa.int32(),
        DoubleType: pa.float64(),
        StringType: pa.string(),
        BinaryType: pa.binary(),
        BooleanType: pa.bool_(),
    }
    fields = []
    for field in schema.fields:
        arrow_type = types.get(type(field.dataType))
        if arrow_type is None:
            raise SlipstreamSourceError(f"column {field.name!r}: type {field.dataType} is not one slipstream records")
        fields.append(pa.field(field.name, arrow_type, field.nullable))
    return pa.schema(fields)


@dataclass(frozen=True)
class SegmentSlice:
    """Rows ``[start, stop)`` of one finalized segment (segment-relative, whole row groups unless an
    offset cuts one)."""

    segment: Segment
    start: int
    stop: int


@dataclass(frozen=True)
class SlicePartition(InputPartition):
    """What one task reads: consecutive slices, up to ``rowsPerPartition`` rows (small segments share
    a task instead of paying one each)."""

    slices: tuple[SegmentSlice, ...]


def _partitions(
    segments: Sequence[tuple[Segment, int, int]], per_partition: int, filters: Sequence[RowFilter] = ()
) -> list[SlicePartition]:
    """Cut ``(segment, first, stop)`` ranges at Parquet row-group boundaries (a row group is never read
    by two tasks, whatever ``rowsPerPartition``: a small value cannot multiply the I/O), skip the row
    groups the filters rule out, and pack what is left into partitions of up to ``per_partition`` rows."""
    partitions: list[SlicePartition] = []
    current: list[SegmentSlice] = []
    rows = 0
    for segment, first, stop in spans(segments):  # a compacted file's segments: one footer read, one cut
        for low, high in segment_ranges(segment, first, stop, filters):
            if current and rows + (high - low) > per_partition:
                partitions.append(SlicePartition(tuple(current)))
                current, rows = [], 0
            last = current[-1] if current else None
            if last is not None and last.segment == segment and last.stop == low:
                current[-1] = SegmentSlice(segment, last.start, high)
            else:
                current.append(SegmentSlice(segment, low, high))
            rows += high - low
    if current:
        partitions.append(SlicePartition(tuple(current)))
    return partitions


def _read_partition(partition: InputPartition, schema: Any, filters: Sequence[RowFilter]) -> Iterator[Any]:
    if not isinstance(partition, SlicePartition):  # Spark's placeholder when there is nothing to read
        return
    columns = schema.names
    for part in partition.slices:
        for table in iter_segment(part.segment, part.start, part.stop, columns=columns, schema=schema, filters=filters):
            yield from table.to_batches(max_chunksize=BATCH_ROWS)


_PUSHED: dict[type[Filter], str] = {
    EqualTo: "==",
    LessThan: "<",
    LessThanOrEqual: "<=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    In: "in",
}


def _row_filter(spark_filter: Filter, schema: StructType) -> RowFilter | None:
    """The reader's form of a Spark filter it can apply exactly, or None. Exactly: comparisons of an
    integer or string column with a literal of the same kind, where Arrow and Spark agree (not doubles:
    Spark orders NaN above everything, Arrow compares it false; not nulls)."""
    op = _PUSHED.get(type(spark_filter))
    path: tuple[str, ...] = getattr(spark_filter, "attribute", ())
    if op is None or len(path) != 1 or path[0] not in schema.fieldNames():
        return None
    value = getattr(spark_filter, "value", None)
    values = tuple(value) if op == "in" and isinstance(value, (tuple, list)) else (value,)
    data_type = schema[path[0]].dataType
    if isinstance(data_type, (LongType, IntegerType)):
        fits = all(type(v) is int for v in values)
    elif isinstance(data_type, StringType):
        fits = all(type(v) is str for v in values)
    else:
        fits = False
    if not fits or not values:
        return None
    return (path[0], op, values if op == "in" else value)


def _option_int(options: Mapping[str, str], name: str, default: int) -> int:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SlipstreamSourceError(f"option {name!r}: expected an integer, got {text!r}") from None
    if value < 1:
        raise SlipstreamSourceError(f"option {name!r}: must be >= 1, got {value}")
    return value


class SlipstreamDataSource(DataSource):
    """``format("slipstream")``: see the module docstring for options and guarantees.

    Read options: ``path`` (the recording root, or ``load(DIR)``; a local path or ``file://`` URI),
    ``kind`` (default ``captured``), ``columns`` (comma-separated: read only these),
    ``rowsPerPartition`` (default 1048576, whole row groups), ``pushFilters`` (``true``: batch reads
    apply comparisons themselves), ``maxRecordsPerTrigger`` (streaming, shared fairly among writers). Write options:
    ``channel``, ``stream``, ``dir``, ``type``, ``tagField``, ``connectTimeout``, ``receiverTimeout``,
    ``retain``, ``queryId``, ``batchId``, ``sinkState`` (see :mod:`slipstream.pipeline.sink`).
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``slipstream``."""
        return NAME

    def _recording(self) -> Recording:
        path = self.options.get("path")
        if not path:
            raise SlipstreamSourceError("option 'path': give the recording directory, e.g. .load(DIR)")
        try:
            return Recording(path)
        except RecordError as exc:
            raise SlipstreamSourceError(f"option 'path': {exc}") from None

    @property
    def kind(self) -> str:
        """The recorded kind read (option ``kind``, default ``captured``)."""
        return str(self.options.get("kind", DEFAULT_KIND))

    def schema(self) -> StructType:
        """The kind's schema (or the ``columns`` option's subset of it); a typed kind's merged over all
        its segments."""
        try:
            full = spark_schema(self._recording().schema(self.kind))
        except RecordError as exc:
            raise SlipstreamSourceError(str(exc)) from None
        wanted = self.options.get("columns")
        if not wanted:
            return full
        # The Python data source API has no column pruning: this option is it (payloads are big).
        names = [name.strip() for name in wanted.split(",") if name.strip()]
        unknown = [name for name in names if name not in full.fieldNames()]
        if unknown:
            raise SlipstreamSourceError(f"option 'columns': {unknown} not in kind {self.kind!r} ({full.fieldNames()})")
        return StructType([full[name] for name in names])

    def reader(self, schema: StructType) -> DataSourceReader:
        """Batch reads: partitions of whole row groups, up to ``rowsPerPartition`` rows each."""
        per_partition = _option_int(self.options, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION)
        recording = self._recording()
        if not recording.kinds():
            raise SlipstreamSourceError(f"option 'path': {recording.root} holds no recording (no kind of any writer)")
        if self.options.get("pushFilters", "false").lower() == "true":
            return _FilteringBatchReader(recording, self.kind, schema, per_partition)
        return _BatchReader(recording, self.kind, schema, per_partition)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Streaming reads with ``{writer: [segment, row]}`` offsets."""
        max_rows = self.options.get("maxRecordsPerTrigger")
        return _StreamReader(
            self._recording(),
            self.kind,
            schema,
            _option_int(self.options, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION),
            _option_int(self.options, "maxRecordsPerTrigger", 1) if max_rows is not None else None,
        )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Batch writes: tasks encode, the commit publishes (:mod:`slipstream.pipeline.sink`)."""
        from .sink import _BatchWriter, _SinkOptions

        return _BatchWriter(_SinkOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Streaming writes: each micro-batch published by its commit (:mod:`slipstream.pipeline.sink`)."""
        from .sink import _SinkOptions, _StreamWriter

        return _StreamWriter(_SinkOptions.parse(self.options))


# -- reading ------------------------------------------------------------------------------------------


class _BatchReader(DataSourceReader):
    def __init__(self, recording: Recording, kind: str, schema: StructType, per_partition: int) -> None:
        self.recording = recording
        self.kind = kind
        self.spark_schema = schema
        self.schema = arrow_schema_of(schema)
        self.per_partition = per_partition
        self.filters: list[RowFilter] = []

    def partitions(self) -> Sequence[InputPartition]:
        segments = [(segment, 0, segment.rows) for segment in self.recording.segments(self.kind)]
        return _partitions(segments, self.per_partition, self.filters)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(partition, self.schema, self.filters)


class _FilteringBatchReader(_BatchReader):
    """A batch reader that takes filters: option ``pushFilters=true`` (and Spark's
    ``spark.sql.python.filterPushdown.enabled``, which :func:`~slipstream.pipeline.session.spark_session`
    sets; Spark refuses a reader that implements ``pushFilters`` without it).

    Opt-in because of a Spark 4.3 bug: the read planned with pushed filters is kept on the loaded
    relation, so the same DataFrame scanned again without filters (``df.where(...).count()`` then
    ``df.count()``, or both in one query, a union say) reads only the filtered rows. Load a DataFrame
    with this option for filtered queries only."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Take the comparisons the reader applies exactly (see :func:`_row_filter`): row groups whose
        statistics rule them out are never read, the rest is filtered with ``pyarrow.compute``; Spark
        does not check them again. Every other filter is handed back for Spark to apply."""
        for spark_filter in filters:
            row_filter = _row_filter(spark_filter, self.spark_schema)
            if row_filter is None:
                yield spark_filter
            else:
                self.filters.append(row_filter)


Offset = dict[str, dict[str, list[int]]]


def _shares(available: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` rows over writers with ``available`` rows each: equal shares, what a writer
    cannot use goes to the others (water-filling), so one busy writer cannot starve the rest. Each
    writer with rows pending gets at least ``budget // writers``; deterministic (name order breaks ties)."""
    taken = dict.fromkeys(available, 0)
    active = sorted(w for w, n in available.items() if n > 0)
    while budget > 0 and active:
        share = max(1, budget // len(active))
        for writer in active:
            give = min(share, available[writer] - taken[writer], budget)
            taken[writer] += give
            budget -= give
            if budget == 0:
                break
        active = [w for w in active if taken[w] < available[w]]
    return taken


class _StreamReader(DataSourceStreamReader):
    """Offsets per writer: ``[seq, row]`` = everything before row ``row`` of segment ``seq`` is read."""

    def __init__(
        self, recording: Recording, kind: str, schema: StructType, per_partition: int, max_rows: int | None
    ) -> None:
        self.recording = recording
        self.kind = kind
        self.schema = arrow_schema_of(schema)
        self.per_partition = per_partition
        self.max_rows = max_rows

    def initialOffset(self) -> Offset:
        return {"writers": {}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows is not None else ReadAllAvailable()

    def _pending(self, start: Offset) -> Iterator[tuple[Segment, int]]:
        """Unread segments after ``start``, each with the first unread row, writer by writer."""
        done = start.get("writers", {})
        for segment in self.recording.segments(self.kind):
            seq, row = done.get(segment.writer, [-1, 0])
            if segment.seq < seq:
                continue
            first = row if segment.seq == seq else 0
            if first < segment.rows:
                yield segment, first

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        """Everything pending, or under ``maxRecordsPerTrigger`` each writer's fair share of it
        (:func:`_shares`), taken in segment order from where that writer's offset stands."""
        pending = list(self._pending(start))
        writers = {w: list(pos) for w, pos in start.get("writers", {}).items()}
        available: dict[str, int] = {}
        for segment, first in pending:
            available[segment.writer] = available.get(segment.writer, 0) + segment.rows - first
        budget = _shares(available, limit.max_rows) if isinstance(limit, ReadMaxRows) else available
        for segment, first in pending:
            take = min(budget[segment.writer], segment.rows - first)
            if take <= 0:
                continue
            budget[segment.writer] -= take
            end = first + take
            writers[segment.writer] = [segment.seq + 1, 0] if end == segment.rows else [segment.seq, end]
        return {"writers": writers}

    def reportLatestOffset(self) -> Offset:
        return self.latestOffset(self.initialOffset(), ReadAllAvailable())

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        stop_at = end.get("writers", {})
        ranges: list[tuple[Segment, int, int]] = []
        for segment, first in self._pending(start):
            stop_seq, stop_row = stop_at.get(segment.writer, [-1, 0])
            if segment.seq > stop_seq or (segment.seq == stop_seq and stop_row == 0):
                continue
            stop = segment.rows if segment.seq < stop_seq else min(stop_row, segment.rows)
            if stop > first:
                ranges.append((segment, first, stop))
        return _partitions(ranges, self.per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(partition, self.schema, ())

    def commit(self, end: Offset) -> None:
        """Nothing to release: segments are files the recorder owns."""


def known(spark: Any, name: str = NAME) -> bool:
    """True when ``spark`` already resolves ``format(name)``: registered in this session, or found by
    PySpark's own lookup of installed ``pyspark_*`` modules (``pyspark_slipstream`` ships ``slipstream``).
    False when that cannot be asked (a Spark Connect session has no JVM here)."""
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name))
    except Exception:
        return False


def register(spark: Any) -> None:
    """Register ``format("slipstream")`` with a Spark session.

    Not needed where slipstream is installed in the Python that Spark runs: PySpark then finds
    ``pyspark_slipstream.DefaultSource`` in every session by itself. For sessions whose Python does
    not see the installed package (a path added at run time, a notebook's own interpreter), this
    registers it explicitly; where the lookup already found it, it does nothing (registering again
    would only replace it with itself, and Spark warns about that).
    """
    if not known(spark):
        spark.dataSource.register(SlipstreamDataSource)
