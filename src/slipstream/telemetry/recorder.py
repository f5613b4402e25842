"""``Recorder``: typed rows in, Parquet segments out, written by a background thread.

The caller's side (``record``, ``append``, ``extend``) only appends a tuple to a list under a lock:
no I/O, no Arrow, no allocation beyond the row. A writer thread wakes every flush interval (1 s by
default), turns each kind's pending rows into one Arrow record batch, appends it to the open
segment's journal and fsyncs it; a segment is finalized (Parquet, written, fsynced, renamed) when it
reaches its size or age limit, at each UTC hour boundary (a segment belongs to one ``date=/hour=``
partition), and on ``close``. Memory is bounded: past ``max_pending_rows`` rows
waiting for the writer, new rows are dropped and counted in ``dropped_rows`` (the recorder never
blocks the code it records, and never grows without bound).

See :mod:`slipstream.telemetry.segments` for the layout and why a kill loses at most one flush.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._extras import require_extra
from .convert import recover
from .errors import RecorderClosedError, RecordError, RecordingLockedError
from .records import KindSchema, Record
from .segments import (
    META_HOST,
    META_HOUR,
    WriterLayout,
    arrow_schema,
    check_name,
    check_writer_id,
    default_name,
    hour_of,
    journal_name,
    read_journal,
    table_from_rows,
    try_lock,
    write_lock_info,
)

log = logging.getLogger("slipstream.telemetry")


@dataclass(frozen=True, slots=True)
class RecorderConfig:
    """How a recorder writes. The defaults suit a long-running process.

    Attributes:
        flush_interval_s (float): Pending rows are made durable (journal + fsync) this often: at most this much is lost
            on a kill. Default ``1.0``.
        segment_max_bytes (int): A segment is finalized once its rows take this many bytes in memory (Arrow size).
            Default ``64 << 20`` (67108864).
        segment_max_age_s (float): ... or once it has been open this long, so readers of finalized segments see data
            this fresh. Default ``60.0``.
        max_pending_rows (int): Rows waiting for the writer thread; more are dropped and counted (bounded memory).
            Default ``1_000_000``.
        fsync (bool): fsync journals and finalized segments (and their directories); False leaves durability to the OS.
            Default ``True``.
        name (str | None): The stable name segments are partitioned by (``host=<name>``): a server's endpoint, say.
            None: the host name. Unlike the writer id it carries no pid, so a restart writes into the same partitions.
            Default ``None``.
    """

    flush_interval_s: float = 1.0
    """Pending rows are made durable (journal + fsync) this often: at most this much is lost on a kill."""
    segment_max_bytes: int = 64 << 20
    """A segment is finalized once its rows take this many bytes in memory (Arrow size)."""
    segment_max_age_s: float = 60.0
    """... or once it has been open this long, so readers of finalized segments see data this fresh."""
    max_pending_rows: int = 1_000_000
    """Rows waiting for the writer thread; more are dropped and counted (bounded memory)."""
    fsync: bool = True
    """fsync journals and finalized segments (and their directories); False leaves durability to the OS."""
    name: str | None = None
    """The stable name segments are partitioned by (``host=<name>``): a server's endpoint, say. None: the host
    name. Unlike the writer id it carries no pid, so a restart writes into the same partitions."""

    def __post_init__(self) -> None:
        if not self.flush_interval_s > 0:
            raise RecordError(f"RecorderConfig.flush_interval_s must be positive: {self.flush_interval_s}")
        if self.segment_max_bytes < 1:
            raise RecordError(f"RecorderConfig.segment_max_bytes must be positive: {self.segment_max_bytes}")
        if not self.segment_max_age_s > 0:
            raise RecordError(f"RecorderConfig.segment_max_age_s must be positive: {self.segment_max_age_s}")
        if self.max_pending_rows < 1:
            raise RecordError(f"RecorderConfig.max_pending_rows must be positive: {self.max_pending_rows}")
        if self.name is not None:
            try:
                check_name(self.name)
            except RecordError as exc:
                raise RecordError(f"RecorderConfig.name: {exc}") from None


@dataclass(slots=True)
class _OpenSegment:
    seq: int
    path: Path
    file: Any
    writer: Any
    opened_at: float
    hour: str
    """The UTC hour (``YYYY-MM-DDTHH``) the segment's rows are written in: its partition."""
    rows: int = 0
    nbytes: int = 0


@dataclass(slots=True)
class _Kind:
    schema: KindSchema
    arrow: Any = None
    next_seq: int = 0
    pending: list[tuple[object, ...]] = field(default_factory=list)
    tables: list[Any] = field(default_factory=list)
    """Arrow tables handed over whole (``extend_table``), written after ``pending``'s rows."""
    open: _OpenSegment | None = None
    abandoned: list[_OpenSegment] = field(default_factory=list)
    """Journals given up after a failed write: finalized (at their own seq) before the next segment is."""


def default_writer_id(prefix: str = "rec") -> str:
    """``<prefix>-<host>-<pid>``: unique among live processes on a host, and says who wrote it."""
    return check_writer_id(f"{prefix}-{default_name()[:100]}-{os.getpid()}")


class Recorder:
    """Records typed rows into ``directory/<kind>/date=/hour=/host=<name>/<writer_id>.<seq>.parquet`` segments
    (journals in ``directory/_journals/<writer_id>/``); one writer id per live recorder.

    Use it as a context manager (``close`` finalizes the open segments). Thread-safe: any thread may
    record. Starting a recorder finalizes what dead recorders left in the same root. ``name`` (or
    ``config.name``) is the stable partition name; the host name by default.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        writer_id: str | None = None,
        config: RecorderConfig | None = None,
        name: str | None = None,
    ) -> None:
        require_extra("telemetry", "Recorder")  # segments are Parquet: fail now, not at the first flush
        self.directory = Path(directory)
        self.config = config or RecorderConfig()
        self.writer_id = check_writer_id(writer_id) if writer_id is not None else default_writer_id()
        self.name = check_name(name or self.config.name or default_name())
        """The stable name the segments are partitioned by (``host=<name>``)."""
        self._layout = WriterLayout(self.directory, self.writer_id)
        self.writer_dir = self._layout.directory
        """This writer's lock, open journals and raw captures (``directory/_journals/<writer_id>``)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        recover(self.directory, fsync=self.config.fsync)  # including our own directory, if it is reused
        lock = try_lock(self.writer_dir)
        if lock is None:
            raise RecordingLockedError(f"another recorder is writing as {self.writer_id} into {self.directory}")
        write_lock_info(lock, {"name": self.name})
        self._lock_fd = lock
        self._wall: Callable[[], float] = time.time
        """The wall clock segments are partitioned by (a test sets it to cross an hour)."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._kinds: dict[str, _Kind] = {}
        self._hooks: list[tuple[Callable[[], object], Callable[[], object] | None]] = []
        self._pending_rows = 0
        self.dropped_rows = 0
        """Rows refused because ``max_pending_rows`` were waiting (bounded memory)."""
        self.written_rows = 0
        """Rows made durable in journals so far."""
        self.segments_finalized = 0
        self.last_error: BaseException | None = None
        """The writer thread's last I/O error (disk full, say). Recording goes on; the rows of the failed
        flush are counted in ``dropped_rows``."""
        self._closed = False
        self._final_flush = False
        """True during close's last flush: flush hooks (a capture converting its last blocks) still add."""
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"slipstream-recorder:{self.writer_id}", daemon=True)
        self._thread.start()

    # -- the caller's side --------------------------------------------------------------------------

    def register(self, schema: KindSchema) -> None:
        """Declare a kind (built-in kinds and typed kinds register themselves on first use)."""
        with self._lock:
            self._register(schema)

    def _register(self, schema: KindSchema) -> _Kind:
        kind = self._kinds.get(schema.kind)
        if kind is None:
            kind = self._kinds[schema.kind] = _Kind(schema)
        elif kind.schema != schema:
            raise RecordError(f"kind {schema.kind!r} is already registered with another schema")
        return kind

    def record(self, record: Record) -> bool:
        """Record one typed record; False if it was dropped (too many rows pending)."""
        return self.extend(record.SCHEMA, [record.row()])

    def append(self, schema: KindSchema, row: tuple[object, ...]) -> bool:
        """Record one row of ``schema`` given as a tuple in column order (the fast path)."""
        return self.extend(schema, [row])

    def extend(self, schema: KindSchema, rows: list[tuple[object, ...]]) -> bool:
        """Record rows of ``schema`` (tuples in column order): one lock for a whole batch. False if
        they were dropped because ``max_pending_rows`` rows are already waiting."""
        with self._lock:
            if self._closed and not self._final_flush:
                raise RecorderClosedError(f"recorder {self.writer_id} is closed")
            kind = self._kinds.get(schema.kind)
            if kind is None or kind.schema is not schema:
                kind = self._register(schema)
            if self._pending_rows + len(rows) > self.config.max_pending_rows:
                self.dropped_rows += len(rows)
                return False
            kind.pending.extend(rows)
            self._pending_rows += len(rows)
        return True

    def extend_table(self, schema: KindSchema, table: Any, *, bounded: bool = True) -> bool:
        """Record an Arrow table whose columns are ``schema``'s (a producer that builds columns itself,
        as the block capture does, skips the per-row tuples). False if dropped (bounded memory).

        ``bounded=False`` is for flush hooks: their table is written by the flush that called them, and
        the producer bounds its own backlog (the capture's ``max_pending_bytes``)."""
        with self._lock:
            if self._closed and not self._final_flush:
                raise RecorderClosedError(f"recorder {self.writer_id} is closed")
            kind = self._kinds.get(schema.kind)
            if kind is None or kind.schema is not schema:
                kind = self._register(schema)
            if bounded and self._pending_rows + table.num_rows > self.config.max_pending_rows:
                self.dropped_rows += table.num_rows
                return False
            kind.tables.append(table)
            self._pending_rows += table.num_rows
        return True

    def add_flush_hook(self, hook: Callable[[], object], *, after: Callable[[], object] | None = None) -> None:
        """Run ``hook`` on the writer thread at the start of every flush: a producer that defers its
        conversion work (raw files to rows) does it there, off its own hot path. ``after`` runs once that
        flush has made everything durable (the producer may then delete its raw files)."""
        with self._lock:
            self._hooks.append((hook, after))

    def remove_flush_hook(self, hook: Callable[[], object]) -> None:
        """Stop calling ``hook`` (a capture that closes removes its own)."""
        with self._lock:
            self._hooks = [entry for entry in self._hooks if entry[0] != hook]

    def request_flush(self) -> None:
        """Ask the writer thread to flush now rather than at the next interval (a producer whose
        backlog grows fast calls it; cheap, never blocks)."""
        self._wake.set()

    @property
    def pending_rows(self) -> int:
        """Rows waiting for the writer thread."""
        return self._pending_rows

    # -- the writer's side --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.config.flush_interval_s)
            self._wake.clear()
            if self._closed:
                break
            try:
                self.flush()
            except Exception as exc:  # keep recording: the next flush retries
                self.last_error = exc
                log.exception("recorder %s: flush failed", self.writer_id)

    def flush(self, *, finalize: bool = False) -> None:
        """Make every pending row durable now (and finalize the open segments if ``finalize``)."""
        with self._flush_lock:
            hooks = list(self._hooks)
            for hook, _ in hooks:
                try:
                    hook()
                except Exception:  # one producer's bug must not stop everyone's rows
                    log.exception("recorder %s: flush hook %r failed", self.writer_id, hook)
            with self._lock:
                batches = [(kind, kind.pending, kind.tables) for kind in self._kinds.values()
                           if kind.pending or kind.tables]  # fmt: skip
                for kind, _, _ in batches:
                    kind.pending = []
                    kind.tables = []
                self._pending_rows = 0
            failure: BaseException | None = None
            for kind, rows, tables in batches:
                try:
                    self._write(kind, rows, tables)
                except Exception as exc:  # disk full, say: these rows are lost, and counted as such
                    self.dropped_rows += len(rows) + sum(t.num_rows for t in tables)
                    self._abandon(kind)
                    failure = exc
            if failure is not None:
                raise failure
            now = time.monotonic()
            hour = hour_of(self._wall())
            for kind in list(self._kinds.values()):
                segment = kind.open
                if (segment is not None and (
                    finalize
                    or segment.nbytes >= self.config.segment_max_bytes
                    or now - segment.opened_at >= self.config.segment_max_age_s
                    or segment.hour != hour
                )) or (kind.abandoned and finalize):  # fmt: skip
                    self._finalize(kind)
            for _, after in hooks:
                if after is not None:
                    try:
                        after()
                    except Exception:
                        log.exception("recorder %s: after-flush hook %r failed", self.writer_id, after)

    def _write(self, kind: _Kind, rows: list[tuple[object, ...]], tables: list[Any]) -> None:
        import pyarrow as pa

        if kind.arrow is None:
            kind.arrow = arrow_schema(kind.schema, self.writer_id)
            (self.writer_dir / kind.schema.kind).mkdir(parents=True, exist_ok=True)
            kind.next_seq = self._layout.next_seq(kind.schema.kind)
        parts = [table_from_rows(kind.arrow, rows)] if rows else []
        parts.extend(table.cast(kind.arrow) for table in tables)
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        hour = hour_of(self._wall())
        if kind.open is not None and kind.open.hour != hour:  # a new UTC hour: a new partition
            try:
                self._finalize(kind)
            except Exception:  # retried before the next segment is finalized; these rows go on
                log.exception("recorder %s: finalizing %s at the hour failed", self.writer_id, kind.schema.kind)
                self._abandon(kind)
        segment = kind.open or self._open(kind, hour)
        segment.writer.write_table(table)
        segment.file.flush()
        if self.config.fsync:
            os.fsync(segment.file.fileno())
        segment.rows += table.num_rows
        segment.nbytes += table.nbytes
        self.written_rows += table.num_rows

    def _open(self, kind: _Kind, hour: str) -> _OpenSegment:
        import pyarrow as pa

        seq = kind.next_seq
        kind.next_seq += 1
        path = self.writer_dir / kind.schema.kind / journal_name(seq)
        file = open(path, "wb")  # noqa: SIM115 - closed when the segment is finalized
        # The journal says where its segment goes, for a recovery after a kill. Uncompressed: the journal is
        # transient (read once, at finalization) and LZ4 measured costlier in CPU than the extra bytes; the
        # finalized Parquet segment is compressed (zstd).
        schema = kind.arrow.with_metadata(
            {**kind.arrow.metadata, META_HOUR: hour.encode(), META_HOST: self.name.encode()}
        )
        try:
            writer = pa.ipc.new_stream(file, schema)
        except BaseException:
            file.close()
            raise
        kind.open = _OpenSegment(seq, path, file, writer, time.monotonic(), hour)
        return kind.open

    def _abandon(self, kind: _Kind) -> None:
        """Stop appending to a journal a failed write may have torn: its complete batches are finalized
        (at its own seq) before the next segment is, and the next rows go to a new journal."""
        segment, kind.open = kind.open, None
        if segment is not None:
            with contextlib.suppress(Exception):
                segment.file.close()
            kind.abandoned.append(segment)

    def _finalize(self, kind: _Kind) -> None:
        """Finalize the abandoned journals, in order, then the open segment: a writer's segments appear in
        strictly increasing seq, so none appears behind a streaming query's position. If an abandoned one
        cannot be finalized yet, neither is the open one (the next finalization retries)."""
        while kind.abandoned:
            self._finish(kind.abandoned[0])
            kind.abandoned.pop(0)
        segment = kind.open
        if segment is None:
            return
        kind.open = None
        try:
            segment.writer.close()
            segment.file.close()
            self._finish(segment)
        except BaseException:
            kind.abandoned.append(segment)
            raise

    def _finish(self, segment: _OpenSegment) -> None:
        """A closed journal's complete batches to its finalized segment (none if it holds no rows)."""
        table = read_journal(segment.path)
        if table is not None and table.num_rows > 0:
            kind = segment.path.parent.name
            self._layout.write(table, kind, segment.seq, segment.hour, self.name, fsync=self.config.fsync)
            self.segments_finalized += 1
        segment.path.unlink()

    # -- closing ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush everything pending and finalize the open segments; later records raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join()
        self._final_flush = True
        try:
            self.flush(finalize=True)
        finally:
            self._final_flush = False
            for kind in self._kinds.values():
                if kind.open is not None:
                    with contextlib.suppress(Exception):
                        kind.open.file.close()
            os.close(self._lock_fd)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Recorder({str(self.writer_dir)!r}, pending={self._pending_rows}, dropped={self.dropped_rows})"
