"""``Recorder``: typed rows in, Parquet segments out, written by a background thread.

The caller's side (``record``, ``append``, ``extend``) only appends a tuple to a list under a lock:
no I/O, no Arrow, no allocation beyond the row. A writer thread wakes every flush interval (1 s by
default), turns each kind's pending rows into one Arrow record batch, appends it to the open
segment's journal and fsyncs it; a segment is finalized (Parquet, written, fsynced, renamed) when it
reaches its size or age limit, and on ``close``. Memory is bounded: past ``max_pending_rows`` rows
waiting for the writer, new rows are dropped and counted in ``dropped_rows`` (the recorder never
blocks the code it records, and never grows without bound).

See :mod:`slipstream.telemetry.segments` for the layout and why a kill loses at most one flush.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
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
    arrow_schema,
    check_writer_id,
    finalized_segments,
    journal_name,
    journals,
    table_from_rows,
    try_lock,
    write_segment,
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

    def __post_init__(self) -> None:
        if not self.flush_interval_s > 0:
            raise RecordError(f"RecorderConfig.flush_interval_s must be positive: {self.flush_interval_s}")
        if self.segment_max_bytes < 1:
            raise RecordError(f"RecorderConfig.segment_max_bytes must be positive: {self.segment_max_bytes}")
        if not self.segment_max_age_s > 0:
            raise RecordError(f"RecorderConfig.segment_max_age_s must be positive: {self.segment_max_age_s}")
        if self.max_pending_rows < 1:
            raise RecordError(f"RecorderConfig.max_pending_rows must be positive: {self.max_pending_rows}")


@dataclass(slots=True)
class _OpenSegment:
    seq: int
    path: Path
    file: Any
    writer: Any
    opened_at: float
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


def default_writer_id(prefix: str = "rec") -> str:
    """``<prefix>-<host>-<pid>``: unique among live processes on a host, and says who wrote it."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname()) or "host"
    return check_writer_id(f"{prefix}-{host}-{os.getpid()}")


class Recorder:
    """Records typed rows into ``directory/<writer_id>/<kind>/`` segments; one writer id per live recorder.

    Use it as a context manager (``close`` finalizes the open segments). Thread-safe: any thread may
    record. Starting a recorder finalizes what dead recorders left in the same root.
    """

    def __init__(
        self, directory: str | Path, *, writer_id: str | None = None, config: RecorderConfig | None = None
    ) -> None:
        require_extra("telemetry", "Recorder")  # segments are Parquet: fail now, not at the first flush
        self.directory = Path(directory)
        self.config = config or RecorderConfig()
        self.writer_id = check_writer_id(writer_id) if writer_id is not None else default_writer_id()
        self.writer_dir = self.directory / self.writer_id
        self.directory.mkdir(parents=True, exist_ok=True)
        recover(self.directory, fsync=self.config.fsync)  # including our own directory, if it is reused
        lock = try_lock(self.writer_dir)
        if lock is None:
            raise RecordingLockedError(f"another recorder is writing into {self.writer_dir}")
        self._lock_fd = lock
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
            for kind in list(self._kinds.values()):
                segment = kind.open
                if segment is not None and (
                    finalize
                    or segment.nbytes >= self.config.segment_max_bytes
                    or now - segment.opened_at >= self.config.segment_max_age_s
                ):
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
            kind_dir = self.writer_dir / kind.schema.kind
            kind_dir.mkdir(parents=True, exist_ok=True)
            existing = [seq for seq, _ in finalized_segments(kind_dir)] + [seq for seq, _ in journals(kind_dir)]
            kind.next_seq = max(existing, default=-1) + 1
        parts = [table_from_rows(kind.arrow, rows)] if rows else []
        parts.extend(table.cast(kind.arrow) for table in tables)
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        segment = kind.open or self._open(kind)
        segment.writer.write_table(table)
        segment.file.flush()
        if self.config.fsync:
            os.fsync(segment.file.fileno())
        segment.rows += table.num_rows
        segment.nbytes += table.nbytes
        self.written_rows += table.num_rows

    def _open(self, kind: _Kind) -> _OpenSegment:
        import pyarrow as pa

        seq = kind.next_seq
        kind.next_seq += 1
        path = self.writer_dir / kind.schema.kind / journal_name(seq)
        file = open(path, "wb")  # noqa: SIM115 - closed when the segment is finalized
        # Uncompressed: the journal is transient (read once, at finalization) and LZ4 measured costlier in CPU
        # than the extra bytes; the finalized Parquet segment is compressed (zstd).
        writer = pa.ipc.new_stream(file, kind.arrow)
        kind.open = _OpenSegment(seq, path, file, writer, time.monotonic())
        return kind.open

    def _abandon(self, kind: _Kind) -> None:
        """Stop appending to a journal a failed write may have torn: its complete batches are finalized
        by the next recorder's recovery, and the next rows go to a new segment."""
        segment, kind.open = kind.open, None
        if segment is not None:
            with contextlib.suppress(Exception):
                segment.file.close()

    def _finalize(self, kind: _Kind) -> None:
        import pyarrow as pa

        segment = kind.open
        assert segment is not None
        kind.open = None
        segment.writer.close()
        segment.file.close()
        table = pa.ipc.open_stream(pa.memory_map(str(segment.path))).read_all()
        write_segment(table, segment.path.parent, segment.seq, fsync=self.config.fsync)
        segment.path.unlink()
        self.segments_finalized += 1

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
