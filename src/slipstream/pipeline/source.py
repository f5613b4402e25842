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
    InputPartition,
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

from ..telemetry import Recording, Segment, read_segment

NAME = "slipstream"
DEFAULT_KIND = "captured"
DEFAULT_ROWS_PER_PARTITION = 1_000_000


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


@dataclass(frozen=True)
class SegmentSlice(InputPartition):
    """Rows ``[start, stop)`` of one finalized segment: what one task reads."""

    segment: Segment
    start: int
    stop: int


def _slices(segment: Segment, start: int, stop: int, per_partition: int) -> list[SegmentSlice]:
    return [SegmentSlice(segment, s, min(stop, s + per_partition)) for s in range(start, stop, per_partition)]


def _read_slice(partition: SegmentSlice, columns: list[str]) -> Iterator[Any]:
    table = read_segment(partition.segment, partition.start, partition.stop, columns=columns)
    yield from table.to_batches()


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

    Read options: ``path`` (the recording root, or ``load(DIR)``), ``kind`` (default ``captured``),
    ``columns`` (comma-separated: read only these),
    ``rowsPerPartition`` (default 1000000), ``maxRecordsPerTrigger`` (streaming). Write options:
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
        return Recording(path)

    @property
    def kind(self) -> str:
        """The recorded kind read (option ``kind``, default ``captured``)."""
        return str(self.options.get("kind", DEFAULT_KIND))

    def schema(self) -> StructType:
        """The kind's schema (or the ``columns`` option's subset of it)."""
        full = spark_schema(self._recording().schema(self.kind))
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
        """Batch reads: one partition per segment slice of ``rowsPerPartition`` rows."""
        per_partition = _option_int(self.options, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION)
        return _BatchReader(self._recording(), self.kind, schema, per_partition)

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
        self.columns = [f.name for f in schema.fields]
        self.per_partition = per_partition

    def partitions(self) -> Sequence[InputPartition]:
        slices: list[SegmentSlice] = []
        for segment in self.recording.segments(self.kind):
            slices.extend(_slices(segment, 0, segment.rows, self.per_partition))
        return slices

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SegmentSlice):  # Spark's placeholder when there is nothing to read
            return iter(())
        return _read_slice(partition, self.columns)


Offset = dict[str, dict[str, list[int]]]


class _StreamReader(DataSourceStreamReader):
    """Offsets per writer: ``[seq, row]`` = everything before row ``row`` of segment ``seq`` is read."""

    def __init__(
        self, recording: Recording, kind: str, schema: StructType, per_partition: int, max_rows: int | None
    ) -> None:
        self.recording = recording
        self.kind = kind
        self.columns = [f.name for f in schema.fields]
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
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        writers = {w: list(pos) for w, pos in start.get("writers", {}).items()}
        for segment, first in self._pending(start):
            take = segment.rows - first if budget is None else min(budget, segment.rows - first)
            if take <= 0:
                break
            end = first + take
            writers[segment.writer] = [segment.seq + 1, 0] if end == segment.rows else [segment.seq, end]
            if budget is not None:
                budget -= take
        return {"writers": writers}

    def reportLatestOffset(self) -> Offset:
        return self.latestOffset(self.initialOffset(), ReadAllAvailable())

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        stop_at = end.get("writers", {})
        slices: list[SegmentSlice] = []
        for segment, first in self._pending(start):
            stop_seq, stop_row = stop_at.get(segment.writer, [-1, 0])
            if segment.seq > stop_seq or (segment.seq == stop_seq and stop_row == 0):
                continue
            stop = segment.rows if segment.seq < stop_seq else min(stop_row, segment.rows)
            if stop > first:
                slices.extend(_slices(segment, first, stop, self.per_partition))
        return slices

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SegmentSlice):  # Spark's placeholder when there is nothing to read
            return iter(())
        return _read_slice(partition, self.columns)

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
