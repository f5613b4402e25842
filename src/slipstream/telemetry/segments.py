"""The on-disk layout of a recording, shared by the recorder, the reader and ``pipeline compact``.

::

    ROOT/<kind>/date=2026-11-28/hour=13/host=<name>/<writer>.00000007.parquet
                                   a finalized segment: immutable, complete (Hive-style partitions, so
                                   Spark's own Parquet reader and DuckDB read them too)
    ROOT/<kind>/date=.../hour=.../host=<name>/<writer>.00000008-00000031.parquet
                                   segments 8..31 compacted into one file (``pipeline compact``); its
                                   key-value metadata ``slipstream.segments`` lists their (seq, rows)
    ROOT/<kind>/.../.<name>.tmp    a file being written (never read; hidden from Spark and DuckDB)
    ROOT/_journals/<writer>/.lock  flock'd by the live recorder of that writer
    ROOT/_journals/<writer>/<kind>/00000009.arrows
                                   the open segment's journal (Arrow IPC stream)
    ROOT/_journals/<writer>/.raw/capture-0/000000000003.raw
                                   a stream capture's raw term bytes, not converted yet (written by the
                                   capture, which holds .raw/capture-0/.lock; converted and deleted by
                                   the writer's recorder or recover)

``hour`` is the UTC hour in which the recorder wrote the segment's rows (a row's own ``timestamp_ns``
may be earlier by what was pending, about a flush interval): the recorder finalizes its open segments
at every UTC hour boundary, so a segment belongs to one partition. ``host`` is the recorder's stable
name (the host name, or ``RecorderConfig.name``: a server's endpoint, say), never the pid, so the
partitions of one machine stay the same across restarts. The writer id (``rec-<host>-<pid>``) only
needs to be unique among live recorders: it is in the file names, and streaming offsets are per writer.

One writer (one recorder, one process) owns its journal directory, so its segments of a kind are
finalized strictly in sequence order, and never with a seq below one already finalized (a journal left
behind by a failed write is finalized before the next segment, or, by recovery, after the last one);
that is what makes ``(writer, seq, row)`` a replayable offset. Each flush appends one record batch to
the journal and fsyncs it: a killed recorder loses at most the rows it had not flushed yet, and the
journal's complete batches are finalized by the next :func:`~slipstream.telemetry.convert.recover`.
A file becomes visible only by ``rename`` of a file written and fsynced in full, so a reader never
sees a partial one; reading needs no write access (no lock, no recovery).

The layout of earlier versions (``ROOT/<writer>/<kind>/00000007.parquet``, journals beside them) is
still listed and read, and still recovered in place.

pyarrow is imported inside the functions that need it, never at module import.
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from .records import _KIND_RE, KindSchema

SEGMENT_SUFFIX: Final = ".parquet"
JOURNAL_SUFFIX: Final = ".arrows"
LOCK_FILE: Final = ".lock"
JOURNALS_DIR: Final = "_journals"
"""Journals, locks and raw captures live under ``ROOT/_journals/<writer>/``: outside the partitions (Spark and
DuckDB skip names starting with ``_``)."""
SEQ_DIGITS: Final = 8
_SEGMENT_RE: Final = re.compile(r"(\d{8,})\.parquet")
_JOURNAL_RE: Final = re.compile(r"(\d{8,})\.arrows")
_FILE_RE: Final = re.compile(
    r"(?P<writer>[A-Za-z0-9][A-Za-z0-9_.-]*)\.(?P<first>\d{8,})(?:-(?P<last>\d{8,}))?\.parquet"
)
_WRITER_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_HOUR_FORMAT: Final = "%Y-%m-%dT%H"

META_KIND: Final = b"slipstream.kind"
META_VERSION: Final = b"slipstream.version"
META_WRITER: Final = b"slipstream.writer"
META_HOST: Final = b"slipstream.host"
META_HOUR: Final = b"slipstream.hour"
META_SEGMENTS: Final = b"slipstream.segments"
"""A compacted file's key-value metadata: JSON ``[[seq, rows], ...]`` of the segments it holds, in order."""


def check_writer_id(writer_id: str) -> str:
    """Writer ids are file and directory names: letters, digits, ``_.-``, at most 128, not starting with a dot."""
    from .errors import RecordError

    if not _WRITER_RE.fullmatch(writer_id):
        raise RecordError(f"writer id {writer_id!r}: use letters, digits and _.- (at most 128, no leading dot)")
    return writer_id


def check_name(name: str) -> str:
    """A recorder's stable name is a partition directory (``host=<name>``): the same rule as writer ids."""
    from .errors import RecordError

    if not _WRITER_RE.fullmatch(name):
        raise RecordError(f"recorder name {name!r}: use letters, digits and _.- (at most 128, no leading dot)")
    return name


def default_name() -> str:
    """The host name, made a valid name: what recordings are partitioned by unless told otherwise."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname()).lstrip(".")
    return host[:128] or "host"


def hour_of(epoch_s: float) -> str:
    """The UTC hour ``YYYY-MM-DDTHH`` of a wall-clock time: the partition a segment written then belongs to."""
    return time.strftime(_HOUR_FORMAT, time.gmtime(epoch_s))


def hour_start(hour: str) -> float:
    """The epoch seconds at which a ``YYYY-MM-DDTHH`` hour begins."""
    return float(calendar.timegm(time.strptime(hour, _HOUR_FORMAT)))


def partition_dir(root: Path, kind: str, hour: str, host: str) -> Path:
    """``ROOT/<kind>/date=YYYY-MM-DD/hour=HH/host=<host>``: where a segment of that hour and host goes."""
    return root / kind / f"date={hour[:10]}" / f"hour={hour[11:13]}" / f"host={host}"


def segment_name(seq: int) -> str:
    """File name of finalized segment ``seq`` in the earlier layout (``ROOT/<writer>/<kind>/``)."""
    return f"{seq:0{SEQ_DIGITS}d}{SEGMENT_SUFFIX}"


def segment_file_name(writer: str, seq: int) -> str:
    """File name of a writer's finalized segment ``seq`` in a partition."""
    return f"{writer}.{seq:0{SEQ_DIGITS}d}{SEGMENT_SUFFIX}"


def compacted_file_name(writer: str, first: int, last: int) -> str:
    """File name of a writer's segments ``first..last`` compacted into one file."""
    return f"{writer}.{first:0{SEQ_DIGITS}d}-{last:0{SEQ_DIGITS}d}{SEGMENT_SUFFIX}"


def journal_name(seq: int) -> str:
    """File name of the journal of open segment ``seq``."""
    return f"{seq:0{SEQ_DIGITS}d}{JOURNAL_SUFFIX}"


def journal_dir(root: Path, writer: str) -> Path:
    """``ROOT/_journals/<writer>``: a recorder's lock, open journals and raw captures."""
    return root / JOURNALS_DIR / writer


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    """A directory's entries; none if it does not exist (a directory it cannot read raises: not empty)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(directory) as entries:
        return list(entries)
    return []


def finalized_segments(kind_dir: Path) -> list[tuple[int, Path]]:
    """``(seq, path)`` of an earlier-layout kind directory's finalized segments, in sequence order."""
    found = [(int(m[1]), Path(e.path)) for e in _scan(kind_dir) if (m := _SEGMENT_RE.fullmatch(e.name))]
    found.sort()
    return found


def journals(kind_dir: Path) -> list[tuple[int, Path]]:
    """``(seq, path)`` of a kind directory's journals (normally at most one: the open segment)."""
    found = [(int(m[1]), Path(e.path)) for e in _scan(kind_dir) if (m := _JOURNAL_RE.fullmatch(e.name))]
    found.sort()
    return found


def kind_dirs(writer_dir: Path) -> list[Path]:
    """The kind directories of a writer's (journal or earlier-layout) directory, sorted."""
    return sorted(Path(e.path) for e in _scan(writer_dir) if e.is_dir() and _KIND_RE.fullmatch(e.name))


def journal_writer_dirs(root: Path) -> list[Path]:
    """``ROOT/_journals/<writer>`` of every writer that ever recorded here (and was not cleaned up), sorted."""
    return sorted(Path(e.path) for e in _scan(root / JOURNALS_DIR) if e.is_dir() and _WRITER_RE.fullmatch(e.name))


def _is_partitioned(directory: Path) -> bool:
    return any(e.name.startswith("date=") for e in _scan(directory))


def legacy_writer_dirs(root: Path) -> list[Path]:
    """Writer directories of the earlier layout (``ROOT/<writer>/<kind>/<seq>.parquet``), sorted: a directory
    of the root that holds no ``date=`` partitions but kind directories or a lock."""
    found = []
    for entry in _scan(root):
        if not entry.is_dir() or not _WRITER_RE.fullmatch(entry.name):
            continue
        path = Path(entry.path)
        if not _is_partitioned(path) and ((path / LOCK_FILE).exists() or kind_dirs(path)):
            found.append(path)
    return sorted(found)


def partitioned_kinds(root: Path) -> list[str]:
    """The kinds with partitioned segments under ``root``, sorted."""
    return sorted(
        e.name for e in _scan(root) if e.is_dir() and _KIND_RE.fullmatch(e.name) and _is_partitioned(Path(e.path))
    )


def partitions(root: Path, kind: str) -> list[tuple[Path, str, str]]:
    """``(directory, hour, host)`` of every partition of ``kind``, in time order."""
    found = []
    for date in _scan(root / kind):
        if not date.name.startswith("date="):
            continue
        for hour in _scan(Path(date.path)):
            if not hour.name.startswith("hour="):
                continue
            for host in _scan(Path(hour.path)):
                if host.name.startswith("host=") and host.is_dir():
                    found.append((Path(host.path), f"{date.name[5:]}T{hour.name[5:]}", host.name[5:]))
    found.sort(key=lambda p: (p[1], p[2]))
    return found


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One Parquet file of a recording: a finalized segment, or (``compacted``) segments ``first..last`` of
    one writer merged into one file. ``hour`` and ``host`` are empty in the earlier layout."""

    kind: str
    writer: str
    first: int
    last: int
    path: Path
    hour: str = ""
    host: str = ""
    compacted: bool = False


def segment_files(root: Path, kind: str) -> list[SegmentFile]:
    """Every segment file of ``kind`` (both layouts), superseded ones too: see :func:`resolve`."""
    found = []
    for directory, hour, host in partitions(root, kind):
        for entry in _scan(directory):
            match = _FILE_RE.fullmatch(entry.name)
            if match is not None:
                first = int(match["first"])
                last = int(match["last"]) if match["last"] else first
                found.append(
                    SegmentFile(
                        kind, match["writer"], first, last, Path(entry.path), hour, host, match["last"] is not None
                    )
                )
    for writer_dir in legacy_writer_dirs(root):
        found.extend(
            SegmentFile(kind, writer_dir.name, seq, seq, path) for seq, path in finalized_segments(writer_dir / kind)
        )
    return found


def resolve(
    files: list[SegmentFile],
) -> tuple[list[tuple[SegmentFile, frozenset[int]]], list[tuple[SegmentFile, SegmentFile]]]:
    """Which file holds each ``(writer, seq)``: the widest file covering it (a compaction over the originals
    it merged). Returns the live files by writer then seq, each with the seqs it serves, and the superseded
    files, each with the file that superseded it (``pipeline compact`` deletes those after a grace period)."""
    live: list[tuple[SegmentFile, frozenset[int]]] = []
    superseded: list[tuple[SegmentFile, SegmentFile]] = []
    taken: dict[tuple[str, int], SegmentFile] = {}
    for file in sorted(files, key=lambda f: (f.writer, f.first - f.last, f.first, str(f.path))):
        seqs = range(file.first, file.last + 1)
        free = frozenset(seq for seq in seqs if (file.writer, seq) not in taken)
        if not free:
            superseded.append((file, taken[file.writer, file.first]))
            continue
        for seq in free:
            taken[file.writer, seq] = file
        live.append((file, free))
    live.sort(key=lambda entry: (entry[0].writer, entry[0].first))
    return live, superseded


def file_segments(file: SegmentFile) -> list[tuple[int, int]]:
    """``(seq, rows)`` of the segments a file holds, in order (a compacted file's from its metadata)."""
    import pyarrow.parquet as pq

    metadata = pq.read_metadata(file.path)
    if not file.compacted:
        return [(file.first, metadata.num_rows)]
    listed = json.loads((metadata.metadata or {})[META_SEGMENTS])
    return [(int(seq), int(rows)) for seq, rows in listed]


def open_journals(root: Path, kind: str) -> list[tuple[str, int, Path]]:
    """``(writer, seq, path)`` of the journals of ``kind`` (open segments, or left by a dead recorder)."""
    found: list[tuple[str, int, Path]] = []
    for writer_dir in [*journal_writer_dirs(root), *legacy_writer_dirs(root)]:
        found.extend((writer_dir.name, seq, path) for seq, path in journals(writer_dir / kind))
    return found


def recorded_kinds(root: Path) -> list[str]:
    """Every kind any writer recorded here, finalized or not (both layouts), sorted."""
    kinds = set(partitioned_kinds(root))
    for writer_dir in [*journal_writer_dirs(root), *legacy_writer_dirs(root)]:
        kinds.update(path.name for path in kind_dirs(writer_dir))
    return sorted(kinds)


@dataclass(frozen=True, slots=True)
class WriterLayout:
    """Where one writer's journals and segments go: the partitioned layout, or (``legacy``) the earlier one,
    whose directories are still recovered in place."""

    root: Path
    writer: str
    legacy: bool = False

    @property
    def directory(self) -> Path:
        """The writer's lock, journals and raw captures."""
        return self.root / self.writer if self.legacy else journal_dir(self.root, self.writer)

    def finalized(self, kind: str) -> list[SegmentFile]:
        """This writer's segment files of ``kind`` (both layouts: a writer id may be reused)."""
        return [f for f in segment_files(self.root, kind) if f.writer == self.writer]

    def last_seq(self, kind: str) -> int:
        """The highest seq of a finalized segment of ``kind`` (-1 if none)."""
        return max((f.last for f in self.finalized(kind)), default=-1)

    def next_seq(self, kind: str) -> int:
        """The seq of the writer's next segment of ``kind``: above every finalized one and every journal."""
        opened = [seq for seq, _ in journals(self.directory / kind)]
        return max([self.last_seq(kind), *opened]) + 1

    def write(self, table: Any, kind: str, seq: int, hour: str, host: str, *, fsync: bool = True) -> Path:
        """Finalize segment ``seq`` of ``kind`` (in partition ``hour``/``host``) atomically."""
        if self.legacy:
            return write_segment(table, self.root / self.writer / kind, seq, fsync=fsync)
        return write_segment(table, partition_dir(self.root, kind, hour, host), seq, fsync=fsync, writer=self.writer)


# -- locking ---------------------------------------------------------------------------------------


def try_lock(directory: Path) -> int | None:
    """Take a directory's lock; the fd holds it (until closed, or the process dies), or None if a live
    process holds it (or the lock file was replaced while we waited: someone removed the directory)."""
    path = directory / LOCK_FILE
    for attempt in range(3):  # a compaction may remove a dead writer's empty directory meanwhile
        directory.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    return fd


def write_lock_info(fd: int, info: dict[str, str]) -> None:
    """Leave a writer's details (its stable name) in its lock file, for a recovery after it died."""
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def read_lock_info(directory: Path) -> dict[str, str]:
    """What :func:`write_lock_info` left (empty if nothing)."""
    try:
        info = json.loads((directory / LOCK_FILE).read_bytes() or b"{}")
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in info.items()} if isinstance(info, dict) else {}


def remove_if_empty(directory: Path) -> bool:
    """Remove a dead writer's journal directory (caller holds its lock) if nothing is left in it but its
    lock and empty directories; True if removed."""
    for entry in _scan(directory):
        if entry.name == LOCK_FILE:
            continue
        if not entry.is_dir(follow_symlinks=False):
            return False
        if any(e.name != LOCK_FILE and (not e.is_dir() or _scan(Path(e.path))) for e in _scan(Path(entry.path))):
            return False
    with contextlib.suppress(OSError):
        for entry in _scan(directory):
            if entry.is_dir(follow_symlinks=False):
                for inner in _scan(Path(entry.path)):
                    if inner.is_dir(follow_symlinks=False):
                        os.rmdir(inner.path)
                    else:
                        os.unlink(inner.path)
                os.rmdir(entry.path)
        os.unlink(directory / LOCK_FILE)
        os.rmdir(directory)
        return True
    return False


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- arrow ------------------------------------------------------------------------------------------


def arrow_type(name: str) -> Any:
    """The Arrow type of a column type name."""
    import pyarrow as pa

    return {
        "int64": pa.int64(),
        "int32": pa.int32(),
        "float64": pa.float64(),
        "string": pa.string(),
        "binary": pa.binary(),
        "bool": pa.bool_(),
    }[name]


def arrow_schema(schema: KindSchema, writer_id: str | None = None) -> Any:
    """The Arrow schema of a kind, with the kind and version (and writer) in its metadata."""
    import pyarrow as pa

    metadata = {META_KIND: schema.kind.encode(), META_VERSION: str(schema.version).encode()}
    if writer_id is not None:
        metadata[META_WRITER] = writer_id.encode()
    return pa.schema(
        [pa.field(name, arrow_type(kind), nullable=nullable) for name, kind, nullable in schema.columns],
        metadata=metadata,
    )


def table_from_rows(arrow: Any, rows: list[tuple[object, ...]]) -> Any:
    """Rows (tuples in column order) to an Arrow table of the given schema."""
    import pyarrow as pa

    columns = list(zip(*rows, strict=True)) if rows else [() for _ in arrow]
    arrays = [pa.array(values, type=field.type) for values, field in zip(columns, arrow, strict=True)]
    return pa.Table.from_arrays(arrays, schema=arrow)


def read_journal(path: Path) -> Any | None:
    """The complete record batches of a journal as a table (a torn tail is ignored), or None if not
    even the schema made it to disk."""
    import pyarrow as pa

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
    except (pa.ArrowException, OSError, ValueError):
        return None
    batches = []
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError):
            break  # a batch cut short by a kill: everything before it is intact
    return pa.Table.from_batches(batches, schema=reader.schema)


@contextlib.contextmanager
def atomic_file(final: Path, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """A file that appears at ``final`` whole or not at all: written under a hidden temporary name (never
    listed; Spark and DuckDB skip it), fsynced, renamed, the directory fsynced. An exception in the
    block removes the temporary file instead."""
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"  # two processes never share a temporary
    try:
        with open(tmp, "wb") as sink:
            yield sink
            sink.flush()
            if fsync:
                os.fsync(sink.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    os.replace(tmp, final)
    if fsync:
        fsync_dir(final.parent)


def write_parquet(table: Any, final: Path, *, fsync: bool = True) -> Path:
    """Write a Parquet file atomically (:func:`atomic_file`)."""
    import pyarrow.parquet as pq

    with atomic_file(final, fsync=fsync) as sink:
        pq.write_table(table, sink, compression="zstd", row_group_size=256 * 1024)
    return final


def write_segment(table: Any, directory: Path, seq: int, *, fsync: bool = True, writer: str | None = None) -> Path:
    """Write finalized segment ``seq`` into ``directory`` atomically: named ``<writer>.<seq>.parquet`` in a
    partition (see :func:`partition_dir`), or ``<seq>.parquet`` in an earlier-layout kind directory when no
    ``writer`` is given."""
    directory.mkdir(parents=True, exist_ok=True)
    name = segment_name(seq) if writer is None else segment_file_name(writer, seq)
    return write_parquet(table, directory / name, fsync=fsync)


def recover_writer(layout: WriterLayout, *, fsync: bool = True) -> int:
    """Finalize the journals a dead recorder left (caller holds its lock); returns how many segments that
    made. Leftover temporary files are removed.

    A journal's seq is kept when it is above the writer's last finalized segment of its kind; one below
    (abandoned after a failed write, while later segments were finalized) gets the next free seq, so no
    segment appears behind a streaming query that already read past that seq."""
    made = 0
    for kind_dir in kind_dirs(layout.directory):
        kind = kind_dir.name
        for entry in _scan(kind_dir):
            if entry.name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        pending = journals(kind_dir)
        if not pending:
            continue
        finalized = layout.finalized(kind)
        done = {seq for f in finalized for seq in range(f.first, f.last + 1)}
        last = max(done, default=-1)
        next_free = max([last, *(seq for seq, _ in pending)]) + 1
        in_place = [(seq, path) for seq, path in pending if seq > last]
        late = [(seq, path) for seq, path in pending if seq <= last]
        for seq, path in [*in_place, *late]:
            table = read_journal(path)
            if table is not None and table.num_rows > 0 and seq not in done:
                if seq <= last:
                    seq, next_free = next_free, next_free + 1
                metadata = table.schema.metadata or {}
                hour = metadata.get(META_HOUR, b"").decode() or hour_of(path.stat().st_mtime)
                host = (
                    metadata.get(META_HOST, b"").decode()
                    or read_lock_info(layout.directory).get("name")
                    or default_name()
                )
                layout.write(table, kind, seq, hour, host, fsync=fsync)
                made += 1
            path.unlink()
    return made
