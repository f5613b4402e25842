"""Keeping a recording: compaction of small segments, retention by partition, recovery of dead writers.

``compact`` is the maintenance tool with write access (``slipstream pipeline compact``); readers never
write. Per partition (``<kind>/date=/hour=/host=``) and per writer it merges runs of consecutive small
segments into one file ``<writer>.<first>-<last>.parquet`` whose key-value metadata lists the
``(seq, rows)`` it holds, in order. The listing (:meth:`Recording.segments
<slipstream.telemetry.reader.Recording.segments>`) expands such a file into the same segments (same
writer, seq and rows), so a running streaming query's ``{writer: [seq, row]}`` offsets keep meaning the
same rows. The originals are hidden by the listing at once (the widest file holding a seq wins) and
deleted by a later compaction once the file that replaced them is older than the grace period: an
executor that listed an original before the compaction can still read it.

Spark's own Parquet reader and DuckDB do not know which files are superseded: until the grace period
has passed, they read the originals and the compacted file both. Compact with ``grace_s=0`` when no
query reads through slipstream, or read after the grace period.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .convert import recover
from .errors import TelemetryError
from .segments import (
    JOURNALS_DIR,
    META_SEGMENTS,
    SegmentFile,
    atomic_file,
    compacted_file_name,
    file_segments,
    hour_start,
    journal_writer_dirs,
    partitioned_kinds,
    remove_if_empty,
    resolve,
    segment_files,
    try_lock,
)

DEFAULT_TARGET_BYTES: Final = 128 << 20
"""Spark's default ``maxPartitionBytes``: one file, one task, compressed."""
DEFAULT_GRACE_S: Final = 3600.0
ROW_GROUP_ROWS: Final = 256 * 1024
TEMPORARY_AGE_S: Final = 3600.0
"""A temporary file this old is a dead writer's (a live one renames its file within seconds)."""
_DURATION_RE: Final = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_DURATION_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_RE: Final = re.compile(r"(\d+)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_SIZE_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class MaintenanceError(TelemetryError):
    """A maintenance operation cannot run: a bad option, a missing recording, another compaction running."""


def parse_period(text: str, option: str = "--retain") -> float:
    """Seconds of a period such as ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise MaintenanceError(f"{option}: expected a period like 30m, 12h, 7d or 2w, got {text!r}")
    return float(match[1]) * _DURATION_UNITS[match[2].lower()]


def parse_bytes(text: str, option: str = "--target-size") -> int:
    """Bytes of a size such as ``134217728``, ``128M``, ``128MiB`` or ``1GiB`` (1024-based)."""
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None or int(match[1]) == 0:
        raise MaintenanceError(f"{option}: expected a size like 64MiB, 128M or 1GiB, got {text!r}")
    return int(match[1]) * _SIZE_UNITS[match[2].lower()]


@dataclass
class CompactResult:
    """What a compaction did (or, dry, would do)."""

    recovered: int = 0
    """Segments finalized from dead writers' journals and raw captures."""
    merged: list[tuple[str, int, int, int]] = field(default_factory=list)
    """(new file, segments merged into it, their bytes, its bytes: 0 in a dry run)."""
    merged_bytes_in: int = 0
    deleted: list[str] = field(default_factory=list)
    """Superseded files deleted (their replacement is older than the grace period)."""
    waiting: int = 0
    """Superseded files kept for now (replaced less than the grace period ago)."""
    dropped_partitions: list[str] = field(default_factory=list)
    """``<kind>/date=/hour=`` partitions older than the retention period, deleted."""
    removed: list[str] = field(default_factory=list)
    """Leftover temporary files and empty journal directories of dead writers."""


def compact(
    root: str | Path,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    retain_s: float | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    fsync: bool = True,
    now: float | None = None,
) -> CompactResult:
    """Recover dead writers, drop partitions older than ``retain_s``, merge small segments into files of
    up to ``target_bytes`` and delete what compactions replaced more than ``grace_s`` ago. One compaction
    at a time per recording (a lock in ``ROOT/_journals``)."""
    root = Path(root)
    if not root.is_dir():
        raise MaintenanceError(f"{root}: no such recording directory")
    if target_bytes < 1:
        raise MaintenanceError(f"--target-size must be positive: {target_bytes}")
    if retain_s is not None and retain_s <= 0:
        raise MaintenanceError(f"--retain must be positive: {retain_s}")
    if grace_s < 0:
        raise MaintenanceError(f"--grace must not be negative: {grace_s}")
    now = time.time() if now is None else now
    result = CompactResult()
    lock = None
    if not dry_run:
        try:
            lock = try_lock(root / JOURNALS_DIR)
        except OSError as exc:
            raise MaintenanceError(f"{root}: cannot write the recording ({exc.strerror})") from None
        if lock is None:
            raise MaintenanceError(f"{root}: another compaction is running")
    try:
        if not dry_run:
            result.recovered = recover(root, fsync=fsync)
            _remove_dead_journal_dirs(root, result)
        if retain_s is not None:
            _retain(root, now - retain_s, dry_run, result)
        for kind in partitioned_kinds(root):
            files = [f for f in segment_files(root, kind) if f.hour]
            live, superseded = resolve(files)
            _delete_superseded(superseded, now - grace_s, dry_run, result)
            _remove_temporaries(root / kind, now - max(grace_s, TEMPORARY_AGE_S), dry_run, result)
            for run in _runs(live, target_bytes):
                _merge(run, dry_run, fsync, result)
    finally:
        if lock is not None:
            os.close(lock)
    return result


def _remove_dead_journal_dirs(root: Path, result: CompactResult) -> None:
    """Journal directories of writers that are gone and left nothing (one per recorder that ever ran)."""
    for directory in journal_writer_dirs(root):
        fd = try_lock(directory)
        if fd is None:
            continue
        try:
            if remove_if_empty(directory):
                result.removed.append(str(directory))
        finally:
            os.close(fd)


def _retain(root: Path, cutoff: float, dry_run: bool, result: CompactResult) -> None:
    """Delete every ``date=/hour=`` partition that ended before ``cutoff``, whole."""
    for kind in partitioned_kinds(root):
        for date in sorted((root / kind).glob("date=*")):
            for hour in sorted(date.glob("hour=*")):
                try:
                    start = hour_start(f"{date.name[5:]}T{hour.name[5:]}")
                except ValueError:
                    continue  # not ours
                if start + 3600 <= cutoff:
                    result.dropped_partitions.append(f"{kind}/{date.name}/{hour.name}")
                    if not dry_run:
                        shutil.rmtree(hour, ignore_errors=True)
            if not dry_run:
                with contextlib.suppress(OSError):
                    date.rmdir()  # only if it is empty now


def _delete_superseded(
    superseded: list[tuple[SegmentFile, SegmentFile]], cutoff: float, dry_run: bool, result: CompactResult
) -> None:
    for file, replacement in superseded:
        try:
            replaced_at = replacement.path.stat().st_mtime
        except FileNotFoundError:
            continue
        if replaced_at > cutoff:
            result.waiting += 1
            continue
        result.deleted.append(str(file.path))
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                file.path.unlink()


def _remove_temporaries(kind_dir: Path, cutoff: float, dry_run: bool, result: CompactResult) -> None:
    """A writer killed while finalizing leaves a hidden ``.<name>.tmp``: removed once it is old."""
    for path in kind_dir.glob("date=*/hour=*/host=*/.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime <= cutoff:
                result.removed.append(str(path))
                if not dry_run:
                    path.unlink()


def _runs(live: list[tuple[SegmentFile, frozenset[int]]], target_bytes: int) -> Iterator[list[SegmentFile]]:
    """Per partition and writer: runs of files with consecutive seqs, the same schema and together at
    most ``target_bytes``, of two files or more."""
    import pyarrow.parquet as pq

    groups: dict[tuple[Path, str], list[SegmentFile]] = {}
    for file, serves in live:
        if len(serves) == file.last - file.first + 1:  # a file partly replaced is left alone
            groups.setdefault((file.path.parent, file.writer), []).append(file)
    for files in groups.values():
        files.sort(key=lambda f: f.first)
        run: list[SegmentFile] = []
        size = 0
        schema: Any = None
        for file in files:
            try:
                file_size = file.path.stat().st_size
                file_schema = pq.read_schema(file.path).remove_metadata()
            except (OSError, ValueError):
                file_size, file_schema = target_bytes, None  # unreadable: never merged
            joins = (
                run
                and file.first == run[-1].last + 1
                and size + file_size <= target_bytes
                and file_schema is not None
                and file_schema.equals(schema)
            )
            if not joins:
                if len(run) > 1:
                    yield run
                run, size = [], 0
            if file_schema is None or file_size >= target_bytes:
                continue
            run.append(file)
            size += file_size
            schema = file_schema
        if len(run) > 1:
            yield run


def _merge(run: list[SegmentFile], dry_run: bool, fsync: bool, result: CompactResult) -> None:
    """One file of a run's rows, atomically, with the (seq, rows) it holds in its metadata."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    held = [entry for file in run for entry in file_segments(file)]
    final = run[0].path.parent / compacted_file_name(run[0].writer, run[0].first, run[-1].last)
    bytes_in = sum(file.path.stat().st_size for file in run)
    if dry_run:
        result.merged.append((str(final), len(held), bytes_in, 0))
        result.merged_bytes_in += bytes_in
        return
    first_schema = pq.read_schema(run[0].path)
    metadata = {k: v for k, v in (first_schema.metadata or {}).items() if not k.startswith(b"ARROW:")}
    metadata[META_SEGMENTS] = json.dumps(held).encode()
    schema = first_schema.with_metadata(metadata)
    written = 0
    with atomic_file(final, fsync=fsync) as sink:
        with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
            buffered: list[Any] = []
            rows = 0
            for file in run:
                table = pq.read_table(file.path).cast(schema)
                buffered.append(table)
                rows += table.num_rows
                if rows >= ROW_GROUP_ROWS:
                    whole = pa.concat_tables(buffered)
                    full = rows - rows % ROW_GROUP_ROWS
                    writer.write_table(whole.slice(0, full), row_group_size=ROW_GROUP_ROWS)
                    written += full
                    buffered, rows = [whole.slice(full)], rows - full
            if rows:
                writer.write_table(pa.concat_tables(buffered), row_group_size=ROW_GROUP_ROWS)
                written += rows
        if written != sum(rows for _, rows in held):  # never: the segments' footers said so
            raise MaintenanceError(f"{final}: {written} rows read for segments of {sum(r for _, r in held)}")
    result.merged.append((str(final), len(held), bytes_in, final.stat().st_size))
    result.merged_bytes_in += bytes_in
