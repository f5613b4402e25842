"""``Recording``: read a recording root back, as Arrow tables or as typed records.

The reader sees finalized segments only (immutable, complete) unless asked for the open journals
too; segments are addressed as ``(writer, seq)`` and rows within them by index, which is what the
Spark source's replayable offsets are made of. Older schema versions are upgraded on read (columns a
segment lacks come back null); a segment from a newer version is refused with
:class:`SchemaVersionError` instead of being misread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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


def _conform(table: Any, kind: str, path: object) -> Any:
    """Check a table's version and bring it to the current schema of a built-in kind."""
    import pyarrow as pa

    metadata = table.schema.metadata or {}
    stored_kind = metadata.get(META_KIND, b"").decode() or kind
    if stored_kind != kind:
        raise RecordError(f"{path}: holds kind {stored_kind!r}, expected {kind!r}")
    current = BUILTIN_SCHEMAS.get(kind)
    version = int(metadata.get(META_VERSION, b"1"))
    if current is None:
        return table.replace_schema_metadata(None)
    if version > current.version:
        raise SchemaVersionError(
            f"{path}: kind {kind!r} version {version} is newer than this reader's {current.version}; "
            "upgrade slipstream to read it"
        )
    target = arrow_schema(current)
    arrays = []
    for field in target:
        if field.name in table.column_names:
            arrays.append(table.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, type=field.type))
    return pa.Table.from_arrays(arrays, schema=target.remove_metadata())


class Recording:
    """A recording root: each kind's segments, partitioned by date, hour and host, of any number of writers
    (and the writer directories of the earlier layout). Reading never writes."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.unreadable: list[str] = []
        self._rows: dict[Path, int] = {}
        """Segment files that could not be read (damaged on disk, not written by a recorder); skipped."""

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

        cache: dict[Path, list[tuple[int, int]]] = self.__dict__.setdefault("_footers", {})
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
        """The Arrow schema rows of ``kind`` come back with: the built-in one, or a typed kind's as
        its first segment (or journal) recorded it."""
        import pyarrow.parquet as pq

        builtin = BUILTIN_SCHEMAS.get(kind)
        if builtin is not None:
            return arrow_schema(builtin).remove_metadata()
        for segment in self.segments(kind)[:1]:
            return pq.read_schema(segment.path).remove_metadata()
        for _, _, path in open_journals(self.root, kind):
            table = read_journal(path)
            if table is not None:
                return table.schema.remove_metadata()
        raise RecordError(f"{self.root}: no segment of kind {kind!r} (known kinds: {self.kinds()})")

    def read(self, kind: str, *, include_open: bool = False, columns: Sequence[str] | None = None) -> Any:
        """Every row of ``kind`` as one Arrow table: finalized segments, plus the open journals' flushed
        rows if ``include_open`` (fresher, but not stable: they are not segments yet)."""
        import pyarrow as pa

        tables = [read_segment(span, columns=columns) for span in spans(self.segments(kind))]
        if include_open:
            for _, _, path in open_journals(self.root, kind):
                table = read_journal(path)
                if table is not None and table.num_rows:
                    table = _conform(table, kind, path)
                    tables.append(table.select(list(columns)) if columns is not None else table)
        if not tables:
            schema = self.schema(kind)
            if columns is not None:
                schema = pa.schema([schema.field(name) for name in columns])
            return schema.empty_table()
        return pa.concat_tables(tables, promote_options="permissive")

    def records(self, kind: str) -> Iterator[Record]:
        """The rows of a built-in kind as typed records (for tools and tests; Spark reads tables)."""
        cls = RECORD_TYPE_BY_KIND.get(kind)
        if cls is None:
            raise RecordError(f"kind {kind!r} has no record type (typed kinds are read as tables)")
        for span in spans(self.segments(kind)):
            for row in read_segment(span).to_pylist():
                yield cls(**row)


def spans(segments: Sequence[Segment]) -> list[Segment]:
    """Consecutive segments that lie one after the other in the same file (a compacted one) joined into
    one (its first seq, their rows): a file is read once, not once per segment it holds."""
    joined: list[Segment] = []
    for segment in segments:
        last = joined[-1] if joined else None
        if last is not None and last.path == segment.path and last.base + last.rows == segment.base:
            joined[-1] = replace(last, rows=last.rows + segment.rows)
        else:
            joined.append(segment)
    return joined


def read_segment(
    segment: Segment, start_row: int = 0, stop_row: int | None = None, *, columns: Sequence[str] | None = None
) -> Any:
    """Rows ``[start_row, stop_row)`` of one finalized segment, conformed to the current schema.

    Safe to call in another process (a Spark executor): it needs only the segment's fields.
    """
    import pyarrow.parquet as pq

    table = _conform(pq.read_table(segment.path), segment.kind, segment.path)
    table = table.slice(segment.base, segment.rows)  # a compacted file holds other segments too
    if start_row or stop_row is not None:
        stop = table.num_rows if stop_row is None else min(stop_row, table.num_rows)
        table = table.slice(start_row, max(0, stop - start_row))
    if columns is not None:
        table = table.select(list(columns))
    return table


def kind_schema_of(kind: str) -> KindSchema | None:
    """The built-in schema of a kind, or None for a typed kind."""
    return BUILTIN_SCHEMAS.get(kind)
