"""``Recording``: read a recording root back, as Arrow tables or as typed records.

The reader sees finalized segments only (immutable, complete) unless asked for the open journals
too; segments are addressed as ``(writer, seq)`` and rows within them by index, which is what the
Spark source's replayable offsets are made of. Older schema versions are upgraded on read (columns a
segment lacks come back null); a segment from a newer version is refused with
:class:`SchemaVersionError` instead of being misread.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .errors import RecordError, SchemaVersionError
from .records import BUILTIN_SCHEMAS, RECORD_TYPE_BY_KIND, KindSchema, Record
from .segments import (
    META_KIND,
    META_VERSION,
    arrow_schema,
    file_segments,
    journal_writer_dirs,
    legacy_writer_dirs,
    open_journals,
    read_journal,
    recorded_kinds,
    resolve,
    segment_files,
)

log = logging.getLogger("slipstream.telemetry")


@dataclass(frozen=True, slots=True)
class Segment:
    """One finalized segment: where it is and how many rows it holds (from its Parquet footer).

    A compacted file holds several segments of one writer: ``base`` is this segment's first row in the
    file at ``path`` (0 for a file of its own). ``host`` and ``hour`` (``YYYY-MM-DDTHH``, UTC) are its
    partition; empty for a segment of the earlier, unpartitioned layout.
    """

    writer: str
    kind: str
    seq: int
    path: str
    rows: int
    base: int = 0
    host: str = ""
    hour: str = ""


RowFilter = tuple[str, str, Any]
"""``(column, op, value)``, op one of ``== < <= > >= in`` (``in``: a tuple of values): a predicate the
reader applies while reading (row groups whose statistics rule it out are skipped). Plain data, so a
Spark executor can be handed it."""


def _target(metadata: dict[bytes, bytes] | None, kind: str, path: object, schema: Any | None) -> Any:
    """The schema a segment's rows come back with, after checking its kind and version: ``schema`` if
    given (a typed kind's schema merged over all its segments, or a subset of columns), else the
    built-in kind's current schema, else (a typed kind) the segment's own."""
    metadata = metadata or {}
    stored_kind = metadata.get(META_KIND, b"").decode() or kind
    if stored_kind != kind:
        raise RecordError(f"{path}: holds kind {stored_kind!r}, expected {kind!r}")
    current = BUILTIN_SCHEMAS.get(kind)
    if current is not None and int(metadata.get(META_VERSION, b"1")) > current.version:
        version = int(metadata[META_VERSION])
        raise SchemaVersionError(
            f"{path}: kind {kind!r} version {version} is newer than this reader's {current.version}; "
            "upgrade slipstream to read it"
        )
    if schema is not None:
        return schema
    return arrow_schema(current).remove_metadata() if current is not None else None


def _conform(table: Any, kind: str, path: object, schema: Any | None = None) -> Any:
    """Check a table's version and bring it to ``schema`` (see :func:`_target`): columns it lacks
    (an older version, an older typed message) come back null; a column of another type is cast."""
    import pyarrow as pa

    target = _target(table.schema.metadata, kind, path, schema)
    if target is None:
        return table.replace_schema_metadata(None)
    arrays = []
    for field in target:
        if field.name in table.column_names:
            column = table.column(field.name)
            arrays.append(column if column.type == field.type else column.cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, type=field.type))
    return pa.Table.from_arrays(arrays, schema=target.remove_metadata())


def merge_schemas(kind: str, schemas: Sequence[tuple[str, Any]]) -> Any:
    """One schema for ``(path, schema)`` pairs of one kind: every column any of them has, in order of
    first appearance; a column some lack is nullable (it reads as null there). A column recorded with
    two types is an error naming both files."""
    import pyarrow as pa

    seen: dict[str, tuple[Any, str]] = {}
    nullable: dict[str, bool] = {}
    counts: dict[str, int] = {}
    for path, schema in schemas:
        for field in schema:
            if field.name in seen and seen[field.name][0].type != field.type:
                first, first_path = seen[field.name]
                raise RecordError(
                    f"kind {kind!r}: column {field.name!r} is {first.type} in {first_path} "
                    f"but {field.type} in {path}; these segments cannot be read as one table"
                )
            seen.setdefault(field.name, (field, path))
            nullable[field.name] = nullable.get(field.name, False) or field.nullable
            counts[field.name] = counts.get(field.name, 0) + 1
    return pa.schema([f.with_nullable(nullable[n] or counts[n] < len(schemas)) for n, (f, _) in seen.items()])


class Recording:
    """A recording root: each kind's segments, partitioned by date, hour and host, of any number of writers
    (and the writer directories of the earlier layout). Reading never writes."""

    def __init__(self, root: str | Path) -> None:
        self.root = local_root(root)
        self.unreadable: list[str] = []
        """Segment files that could not be read (damaged on disk, not written by a recorder); skipped."""
        self._footers: dict[Path, list[tuple[int, int]]] = {}
        """The ``(seq, rows)`` each segment file holds, by path (finalized files never change)."""
        self._schemas: dict[str, Any] = {}
        """Typed segments' schemas by path (finalized files never change)."""

    def writers(self) -> list[str]:
        """Every writer (one per recorder that ever wrote here) with segments or journals, sorted."""
        found = {path.name for path in [*journal_writer_dirs(self.root), *legacy_writer_dirs(self.root)]}
        for kind in recorded_kinds(self.root):
            found.update(file.writer for file in segment_files(self.root, kind))
        return sorted(found)

    def kinds(self) -> list[str]:
        """Every kind any writer has recorded (finalized or not), sorted."""
        return recorded_kinds(self.root)

    def segments(self, kind: str, writers: Sequence[str] | None = None) -> list[Segment]:
        """The finalized segments of ``kind``, by writer then sequence (the order offsets follow).

        A compacted file is listed as the segments it holds (same writer, seq and rows; ``base`` says
        where each starts in the file), and the originals it replaced are not listed: a streaming
        query's ``{writer: [seq, row]}`` offsets mean the same rows before and after a compaction.
        Listing only reads directories and Parquet footers: it needs no write access.
        """
        import pyarrow as pa

        cache = self._footers
        files = [f for f in segment_files(self.root, kind) if writers is None or f.writer in writers]
        while True:
            live, _ = resolve(files)
            damaged = []
            found: list[Segment] = []
            for file, serves in live:
                held = cache.get(file.path)
                if held is None:  # finalized files never change: their footer is read once
                    try:
                        held = cache[file.path] = file_segments(file)
                    except (pa.ArrowException, OSError, KeyError, ValueError) as exc:  # damaged: skipped, said
                        if str(file.path) not in self.unreadable:
                            self.unreadable.append(str(file.path))
                            log.warning("skipping unreadable segment %s: %s", file.path, exc)
                        damaged.append(file)
                        continue
                base = 0
                for seq, rows in held:
                    if seq in serves:
                        found.append(Segment(file.writer, kind, seq, str(file.path), rows, base, file.host, file.hour))
                    base += rows
            if not damaged:
                found.sort(key=lambda segment: (segment.writer, segment.seq))
                return found
            files = [f for f in files if f not in damaged]  # what a damaged compaction replaced is listed again

    def schema(self, kind: str) -> Any:
        """The Arrow schema rows of ``kind`` come back with: the built-in one, or for a typed kind the
        union of every finalized segment's (a message type that gained a field: older segments read it
        as null), or the first open journal's when no segment is finalized yet."""
        import pyarrow.parquet as pq

        builtin = BUILTIN_SCHEMAS.get(kind)
        if builtin is not None:
            return arrow_schema(builtin).remove_metadata()
        schemas: list[tuple[str, Any]] = []
        for segment in self.segments(kind):
            if segment.path not in self._schemas:
                self._schemas[segment.path] = pq.read_schema(segment.path).remove_metadata()
            if not schemas or schemas[-1][0] != segment.path:  # a compacted file holds several segments
                schemas.append((segment.path, self._schemas[segment.path]))
        if schemas:
            return merge_schemas(kind, schemas)
        for _, _, path in open_journals(self.root, kind):
            table = read_journal(path)
            if table is not None:
                return table.schema.remove_metadata()
        raise RecordError(f"{self.root}: no segment of kind {kind!r} (known kinds: {self.kinds()})")

    def read(self, kind: str, *, include_open: bool = False, columns: Sequence[str] | None = None) -> Any:
        """Every row of ``kind`` as one Arrow table: finalized segments, plus the open journals' flushed
        rows if ``include_open`` (fresher, but not stable: they are not segments yet)."""
        import pyarrow as pa

        open_tables: list[tuple[str, Any]] = []
        if include_open:
            for _, _, path in open_journals(self.root, kind):
                table = read_journal(path)
                if table is not None and table.num_rows:
                    open_tables.append((str(path), table))
        try:
            schema = self.schema(kind)
        except RecordError:
            if not open_tables:
                raise
            schema = None
        if kind not in BUILTIN_SCHEMAS and open_tables:
            found = [("finalized segments", schema)] if schema is not None else []
            schema = merge_schemas(kind, found + [(p, t.schema.remove_metadata()) for p, t in open_tables])
        if columns is not None:
            missing = [name for name in columns if name not in schema.names]
            if missing:
                raise RecordError(f"kind {kind!r} has no column {missing} (columns: {schema.names})")
            schema = _select(schema, columns)
        whole = [(segment, 0, segment.rows) for segment in self.segments(kind)]
        tables = [read_segment(span, first, stop, schema=schema) for span, first, stop in spans(whole)]
        tables += [_conform(table, kind, path, schema) for path, table in open_tables]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def records(self, kind: str) -> Iterator[Record]:
        """The rows of a built-in kind as typed records (for tools and tests; Spark reads tables)."""
        cls = RECORD_TYPE_BY_KIND.get(kind)
        if cls is None:
            raise RecordError(f"kind {kind!r} has no record type (typed kinds are read as tables)")
        for span, first, stop in spans([(segment, 0, segment.rows) for segment in self.segments(kind)]):
            for row in read_segment(span, first, stop).to_pylist():
                yield cls(**row)


def spans(ranges: Sequence[tuple[Segment, int, int]]) -> list[tuple[Segment, int, int]]:
    """``(segment, first, stop)`` row ranges that continue one another inside one file (a compacted one's
    segments) joined into one range of a segment grown over them: the file's footer is read, and its row
    groups cut, once per run instead of once per segment it holds."""
    joined: list[tuple[Segment, int, int]] = []
    for segment, first, stop in ranges:
        if joined:
            last, last_first, last_stop = joined[-1]
            if last.path == segment.path and last.base + last_stop == segment.base + first:
                grown = replace(last, rows=segment.base + segment.rows - last.base)
                joined[-1] = (grown, last_first, segment.base + stop - last.base)
                continue
        joined.append((segment, first, stop))
    return joined


def local_root(root: str | Path) -> Path:
    """A recording root as a local path: ``file://`` URIs are accepted; other schemes (``s3a://``,
    ``hdfs://`` ...) are refused, as is a root that does not exist: both would otherwise read as an
    empty recording. Remote storage is read where it is mounted (s3fs, an NFS or HDFS mount)."""
    text = str(root)
    if "://" in text or text.startswith("file:"):
        uri = urlparse(text)
        if uri.scheme != "file" or uri.netloc not in ("", "localhost"):
            raise RecordError(
                f"{text}: slipstream reads recordings from a local (or locally mounted) filesystem only, "
                f"not {uri.scheme}://{uri.netloc}; mount it or copy it, and give the local path"
            )
        text = unquote(uri.path)
    path = Path(text)
    if not path.is_dir():
        raise RecordError(f"{path}: {'not a directory' if path.exists() else 'no such directory'} (a recording root)")
    return path


def _may_match(row_group: Any, filters: Sequence[RowFilter], columns: dict[str, int]) -> bool:
    """Whether a row group's statistics allow a row that satisfies every filter."""
    for name, op, value in filters:
        index = columns.get(name)
        if index is None:
            return False  # the column is all null here (an older segment): no comparison holds
        stats = row_group.column(index).statistics
        if stats is None:
            continue
        if stats.null_count == row_group.num_rows:
            return False
        if not stats.has_min_max:
            continue
        low, high = stats.min, stats.max
        values = value if op == "in" else (value,)
        if op in ("==", "in") and not any(low <= v <= high for v in values):
            return False
        if (op == "<" and not low < value) or (op == "<=" and not low <= value):
            return False
        if (op == ">" and not high > value) or (op == ">=" and not high >= value):
            return False
    return True


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _expression(filters: Sequence[RowFilter]) -> Any:
    """The filters as one pyarrow compute expression (their conjunction)."""
    import pyarrow.compute as pc

    terms = [pc.field(name).isin(list(value)) if op == "in" else _COMPARE[op](pc.field(name), value)
             for name, op, value in filters]  # fmt: skip
    return functools.reduce(operator.and_, terms)


def segment_ranges(
    segment: Segment, start_row: int = 0, stop_row: int | None = None, filters: Sequence[RowFilter] = ()
) -> list[tuple[int, int]]:
    """The row ranges (relative to the segment) of its Parquet row groups inside ``[start_row,
    stop_row)`` whose statistics do not rule ``filters`` out: what a reader cut at row-group
    boundaries reads, one range per row group, in order."""
    import pyarrow.parquet as pq

    metadata = pq.read_metadata(segment.path)
    return [(a, b) for _, _, a, b in _row_groups(metadata, segment, start_row, stop_row, filters)]


def _row_groups(
    metadata: Any, segment: Segment, start_row: int, stop_row: int | None, filters: Sequence[RowFilter]
) -> Iterator[tuple[int, int, int, int]]:
    """``(row group, its first file row, first, stop)``, first/stop relative to the segment, for the
    row groups that overlap the range and may match the filters."""
    stop = segment.rows if stop_row is None else min(stop_row, segment.rows)
    low, high = segment.base + start_row, segment.base + stop
    columns = {metadata.schema.column(i).name: i for i in range(metadata.num_columns)}
    offset = 0
    for index in range(metadata.num_row_groups):
        row_group = metadata.row_group(index)
        first, offset = offset, offset + row_group.num_rows
        if offset <= low or first >= high:
            if first >= high:
                return
            continue
        if filters and not _may_match(row_group, filters, columns):
            continue
        yield index, first, max(low, first) - segment.base, min(high, offset) - segment.base


def iter_segment(
    segment: Segment,
    start_row: int = 0,
    stop_row: int | None = None,
    *,
    columns: Sequence[str] | None = None,
    schema: Any | None = None,
    filters: Sequence[RowFilter] = (),
) -> Iterator[Any]:
    """Rows ``[start_row, stop_row)`` of one finalized segment (file rows ``base + start_row`` on), a
    table per Parquet row group, conformed (see :func:`read_segment`). Only the row groups that overlap
    the range and whose statistics allow ``filters`` are read, and only the columns asked for (plus
    those the filters test); the filters are then applied to the rows.

    Safe to call in another process (a Spark executor): it needs only its arguments.
    """
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(segment.path)
    target = _target(parquet.schema_arrow.metadata, segment.kind, segment.path, schema)
    if target is None:
        target = parquet.schema_arrow.remove_metadata()
    if columns is not None:
        unknown = [name for name in columns if name not in target.names]
        if unknown:
            raise RecordError(f"{segment.path}: kind {segment.kind!r} has no column {unknown} ({target.names})")
        target = _select(target, columns)
    present = set(parquet.schema_arrow.names)
    if any(name not in present for name, _, _ in filters):
        return  # a column this segment lacks is all null: no row satisfies a comparison with it
    wanted = list(dict.fromkeys([*target.names, *(name for name, _, _ in filters)]))
    read = [name for name in wanted if name in present]
    expression = _expression(filters) if filters else None
    for index, group_first, first, stop in _row_groups(parquet.metadata, segment, start_row, stop_row, filters):
        table = parquet.read_row_group(index, columns=read, use_threads=False)
        offset = segment.base + first - group_first
        if offset or stop - first != table.num_rows:
            table = table.slice(offset, stop - first)
        if expression is not None:
            table = table.filter(expression)
        yield _conform(table.replace_schema_metadata(parquet.schema_arrow.metadata), segment.kind, segment.path, target)


def _select(schema: Any, columns: Sequence[str]) -> Any:
    import pyarrow as pa

    return pa.schema([schema.field(name) for name in columns])


def read_segment(
    segment: Segment,
    start_row: int = 0,
    stop_row: int | None = None,
    *,
    columns: Sequence[str] | None = None,
    schema: Any | None = None,
    filters: Sequence[RowFilter] = (),
) -> Any:
    """Rows ``[start_row, stop_row)`` of one finalized segment as one table, conformed to ``schema``
    (a typed kind's merged schema from :meth:`Recording.schema`; default: the built-in kind's current
    schema, or the segment's own) and to ``columns``: columns the segment lacks come back null.

    Reads only the row groups and columns needed (see :func:`iter_segment`).
    """
    import pyarrow as pa

    tables = list(iter_segment(segment, start_row, stop_row, columns=columns, schema=schema, filters=filters))
    if tables:
        return pa.concat_tables(tables)
    target = _target(None, segment.kind, segment.path, schema)
    if target is None:
        import pyarrow.parquet as pq

        target = pq.read_schema(segment.path).remove_metadata()
    return (_select(target, columns) if columns is not None else target).empty_table()


def kind_schema_of(kind: str) -> KindSchema | None:
    """The built-in schema of a kind, or None for a typed kind."""
    return BUILTIN_SCHEMAS.get(kind)
