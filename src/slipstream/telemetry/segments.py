"""The on-disk layout of a recording, shared by the recorder and the reader.

::

    ROOT/<writer>/.lock                        flock'd by the live recorder of that writer
    ROOT/<writer>/<kind>/00000007.parquet      a finalized segment: immutable, complete
    ROOT/<writer>/<kind>/00000008.arrows       the open segment's journal (Arrow IPC stream)
    ROOT/<writer>/<kind>/.00000008.parquet.tmp a segment being finalized (never read)
    ROOT/<writer>/.raw/capture-0/000000000003.raw  a stream capture's raw term bytes, not converted yet
                                               (written by the capture, which holds .raw/capture-0/.lock;
                                               converted and deleted by the writer's recorder or recover)

One writer (one recorder, one process) owns a writer directory, so within it segments are
finalized strictly in sequence order; that is what makes ``(writer, segment, row)`` a replayable
offset. Each flush appends one record batch to the journal and fsyncs it: a killed recorder loses at
most the rows it had not flushed yet, and the journal's complete batches are finalized by the next
:func:`~slipstream.telemetry.convert.recover` (which also converts the raw files of a dead stream capture).
A segment becomes visible only by ``rename`` of a file that was written and fsynced
in full, so a reader never sees a partial segment.

pyarrow is imported inside the functions that need it, never at module import.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path
from typing import Any, Final

from .records import KindSchema

SEGMENT_SUFFIX: Final = ".parquet"
JOURNAL_SUFFIX: Final = ".arrows"
LOCK_FILE: Final = ".lock"
SEQ_DIGITS: Final = 8
_SEGMENT_RE: Final = re.compile(r"(\d{8})\.parquet")
_JOURNAL_RE: Final = re.compile(r"(\d{8})\.arrows")
_WRITER_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

META_KIND: Final = b"slipstream.kind"
META_VERSION: Final = b"slipstream.version"
META_WRITER: Final = b"slipstream.writer"


def check_writer_id(writer_id: str) -> str:
    """Writer ids are directory names: letters, digits, ``_.-``, at most 128, not starting with a dot."""
    from .errors import RecordError

    if not _WRITER_RE.fullmatch(writer_id):
        raise RecordError(f"writer id {writer_id!r}: use letters, digits and _.- (at most 128, no leading dot)")
    return writer_id


def segment_name(seq: int) -> str:
    """File name of finalized segment ``seq``."""
    return f"{seq:0{SEQ_DIGITS}d}{SEGMENT_SUFFIX}"


def journal_name(seq: int) -> str:
    """File name of the journal of open segment ``seq``."""
    return f"{seq:0{SEQ_DIGITS}d}{JOURNAL_SUFFIX}"


def finalized_segments(kind_dir: Path) -> list[tuple[int, Path]]:
    """``(seq, path)`` of a kind directory's finalized segments, in sequence order."""
    found: list[tuple[int, Path]] = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(kind_dir):
            match = _SEGMENT_RE.fullmatch(entry.name)
            if match is not None:
                found.append((int(match[1]), Path(entry.path)))
    found.sort()
    return found


def journals(kind_dir: Path) -> list[tuple[int, Path]]:
    """``(seq, path)`` of a kind directory's journals (normally at most one: the open segment)."""
    found: list[tuple[int, Path]] = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(kind_dir):
            match = _JOURNAL_RE.fullmatch(entry.name)
            if match is not None:
                found.append((int(match[1]), Path(entry.path)))
    found.sort()
    return found


def writer_dirs(root: Path) -> list[Path]:
    """The writer directories under a recording root, sorted by name."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return sorted(Path(e.path) for e in os.scandir(root) if e.is_dir() and _WRITER_RE.fullmatch(e.name))
    return []


def kind_dirs(writer_dir: Path) -> list[Path]:
    """The kind directories of a writer directory, sorted."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return sorted(Path(e.path) for e in os.scandir(writer_dir) if e.is_dir() and not e.name.startswith("."))
    return []


# -- locking ---------------------------------------------------------------------------------------


def try_lock(writer_dir: Path) -> int | None:
    """Take the writer directory's lock; the fd holds it (until closed, or the process dies), or None if
    a live recorder holds it."""
    writer_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(writer_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


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


def write_segment(table: Any, kind_dir: Path, seq: int, *, fsync: bool = True) -> Path:
    """Write a finalized segment atomically: to a temporary name, fsync, rename, fsync the directory."""
    import pyarrow.parquet as pq

    final = kind_dir / segment_name(seq)
    tmp = kind_dir / f".{segment_name(seq)}.tmp"
    with open(tmp, "wb") as sink:
        pq.write_table(table, sink, compression="zstd", row_group_size=256 * 1024)
        sink.flush()
        if fsync:
            os.fsync(sink.fileno())
    os.replace(tmp, final)
    if fsync:
        fsync_dir(kind_dir)
    return final


def recover_writer(writer_dir: Path, *, fsync: bool = True) -> int:
    """Finalize the journals a dead recorder left in ``writer_dir`` (caller holds its lock); returns
    how many segments that made. Leftover temporary files are removed."""
    made = 0
    for kind_dir in kind_dirs(writer_dir):
        for entry in list(os.scandir(kind_dir)):
            if entry.name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        for seq, path in journals(kind_dir):
            table = read_journal(path)
            if table is not None and table.num_rows > 0 and not (kind_dir / segment_name(seq)).exists():
                write_segment(table, kind_dir, seq, fsync=fsync)
                made += 1
            path.unlink()
    return made
