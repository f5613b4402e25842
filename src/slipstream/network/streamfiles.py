"""The file I/O of streams, injected into :class:`~.streaming.Streams`: spill files written, sent files read.

The stream machine is sans-I/O except for files, and where their reads and writes run is the caller's
choice, given as a :class:`StreamFiles` (the files themselves are :mod:`.localfiles`'):

- :class:`InlineStreamFiles` (the default) does each read and write at once on the caller's thread:
  deterministic, what the in-memory tests and ``slipstream.testing`` want.
- :class:`ThreadedStreamFiles` does them on one worker thread, so a slow disk delays the streams that
  wait on it and never the event loop that serves every other connection.

The machine never waits on a provider and is never called back by one: it asks (``due``, ``poll``,
``take``) and a not-yet answer means "later". The worker's only call out is ``wake()``, made after the
work that changes what the machine can do (a file closed, a chunk read for a starved stream, a failure:
the machine's ``deadline_ns`` is then due), at least once per :data:`WAKE_EVERY` bytes written (the
backlog shrank) and whenever its queue runs dry.

Bounds of the threaded provider: queued writes are counted per file (``SpillWriter.backlog``, summed by
``Streams.write_backlog``) and capped per connection by ``Streams(max_write_backlog=...)`` (32 MiB; plus
at most one ``spill_threshold`` when an in-memory stream moves to its file); an adapter stops polling a
connection's subscription while its backlog exceeds :data:`WRITE_BACKLOG_PAUSE`, so the peer is held
back by the transport's flow control instead of our memory. Reads run at most ``read_ahead`` bytes
(:data:`DEFAULT_READ_AHEAD`, at least one chunk) ahead of what the machine took, per file being sent.

Opening a file to send stays on the caller's thread on every provider (one ``open`` and ``fstat``), so a
missing or unreadable file still fails ``send_file`` at once; creating a spill file, writing, closing
and removing it run on the worker, in order, so removing a file the worker still writes is safe.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

from .localfiles import Data, FileSource, InlineStreamFiles, SpillFile, remove_spill

__all__ = [
    "DEFAULT_READ_AHEAD",
    "WAKE_EVERY",
    "WRITE_BACKLOG_PAUSE",
    "FileSource",
    "InlineStreamFiles",
    "SourceReader",
    "SpillFile",
    "SpillWriter",
    "StreamFiles",
    "SharedStreamFiles",
    "ThreadedStreamFiles",
    "shared_stream_files",
]

log = logging.getLogger(__name__)

WRITE_BACKLOG_PAUSE: Final = 8 * 1024 * 1024
"""Queued spill bytes of one connection above which an adapter stops polling its subscription. One poll
adds at most its fragment limit of chunks (64 x 64 KiB = 4 MiB), so with this pause a connection's
backlog stays under 12 MiB, well inside ``Streams``' default ``max_write_backlog`` (32 MiB)."""
DEFAULT_READ_AHEAD: Final = 1024 * 1024
"""Bytes the worker reads ahead of the machine, per file being sent (at least one chunk)."""
WAKE_EVERY: Final = 1024 * 1024
"""Written bytes after which the worker wakes the adapter even if nothing else finished (a paused
subscription resumes while the disk catches up, not only once it caught up)."""
JOIN_TIMEOUT_S: Final = 5.0


class SpillWriter(Protocol):
    """A temporary file an incoming stream is written to (created ``0600``)."""

    @property
    def backlog(self) -> int:
        """Bytes handed to :meth:`write` and not yet written."""
        ...

    @property
    def due(self) -> bool:
        """An outcome (closed after :meth:`finish`, or a failure) waits to be taken by :meth:`poll`."""
        ...

    def write(self, data: Data) -> None:
        """Append ``data`` (kept by reference until written: the caller leaves it unchanged). OSError
        when the file failed (now or earlier)."""
        ...

    def finish(self) -> object:
        """No more writes: close the file once all is written (a failure raises OSError here or comes from
        :meth:`poll`; any result is ignored)."""
        ...

    def poll(self) -> str | None:
        """The file's path once finished and closed (the caller owns the file from then on); None while
        writes are pending. OSError when the file failed."""
        ...

    def discard(self) -> None:
        """Give up: close and remove the file (safe at any time, also while a write is under way)."""
        ...


class SourceReader(Protocol):
    """A file being sent, handed out chunk by chunk in order."""

    @property
    def size(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def due(self) -> bool:
        """A chunk or a failure waits to be taken by :meth:`take`."""
        ...

    def take(self) -> bytearray | None:
        """The next chunk: ``headroom`` free bytes, then ``chunk`` bytes of the file (fewer only where
        the file ended early); None while it is being read. OSError when reading failed."""
        ...

    def close(self) -> None: ...


class StreamFiles(Protocol):
    """Makes the files a :class:`~.streaming.Streams` machine writes and reads."""

    def spill(self, directory: str | None, prefix: str, name: str = "") -> SpillWriter:
        """A new temporary file in ``directory`` (None: the system's), named ``name`` in a private directory
        when a name is given (see :mod:`.localfiles`); OSError when it cannot be made."""
        ...

    def source(self, path: str | os.PathLike[str], *, chunk: int, headroom: int) -> SourceReader:
        """``path`` opened for sending (OSError at once when it cannot be opened)."""
        ...

    def remove(self, path: str) -> None:
        """Remove a completed spill file the machine still owns (quietly if it is gone already)."""
        ...


# -- on a worker thread -------------------------------------------------------------------------------

Job = Callable[[], bool]
"""Work for the worker; True when the adapter must be woken now."""


def _closed_error() -> OSError:
    return OSError("the stream file worker was closed")


def _remove(path: str) -> bool:
    """A removal on the worker (nothing to wake the adapter for)."""
    remove_spill(path)
    return False


class ThreadedStreamFiles:
    """The reads and writes of ``files`` (default: plain files) on one worker thread, in order; ``wake``
    is called from that thread when work finished (the asyncio adapter passes a thread-safe kick of its
    poller). One per endpoint is enough; :meth:`close` stops it."""

    def __init__(
        self,
        wake: Callable[[], None] = lambda: None,
        *,
        read_ahead: int = DEFAULT_READ_AHEAD,
        files: InlineStreamFiles | None = None,
        name: str = "slipstream-stream-files",
    ) -> None:
        if read_ahead <= 0:
            raise ValueError(f"read_ahead must be positive: {read_ahead}")
        self.read_ahead = read_ahead
        self._files = files if files is not None else InlineStreamFiles()
        self._worker = _Worker(wake, name)

    @property
    def running(self) -> bool:
        return self._worker.thread.is_alive()

    def spill(self, directory: str | None, prefix: str, name: str = "") -> SpillWriter:
        worker = self._worker
        writer = _ThreadedSpill(worker)
        with worker.lock:
            worker.submit(functools.partial(writer.create, self._files, directory, prefix, name))
            worker.writers.add(writer)
        return writer

    def source(self, path: str | os.PathLike[str], *, chunk: int, headroom: int) -> SourceReader:
        worker = self._worker
        reader = _ThreadedSource(
            worker, self._files.source(path, chunk=chunk, headroom=headroom), chunk, self.read_ahead
        )
        with worker.lock:
            if worker.stopping:
                reader.source.close()
                raise _closed_error()
            worker.readers.add(reader)
            reader.refill()
        return reader

    def remove(self, path: str) -> None:
        with self._worker.lock:
            if not self._worker.stopping:
                self._worker.submit(functools.partial(_remove, path))
                return
        remove_spill(path)

    def close(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stop the worker: unfinished spill files are removed, open sources closed (both after any write
        or read under way), and the thread is joined for up to ``timeout`` seconds."""
        worker = self._worker
        with worker.lock:
            writers, worker.writers = worker.writers, set()
            readers, worker.readers = worker.readers, set()
            for writer in writers:
                writer.abandon()
            for reader in readers:
                reader.abandon()
            worker.stopping = True
            worker.work.notify()
        worker.thread.join(timeout)
        if worker.thread.is_alive():  # stuck in a write: unlinking under it is safe, it writes to no name
            log.warning("the stream file worker did not stop within %g s", timeout)
            for writer in writers:
                writer.unlink()


class SharedStreamFiles:
    """One :class:`ThreadedStreamFiles` per key (an adapter's event loop), shared by the key's endpoints
    and closed with the last of them: one worker thread per loop, however many servers and clients."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared: weakref.WeakKeyDictionary[object, list[Any]] = weakref.WeakKeyDictionary()

    def acquire(self, key: object, wake: Callable[[], None]) -> ThreadedStreamFiles:
        """The files of ``key`` (``wake`` is its worker's, when it is made now)."""
        with self._lock:
            entry = self._shared.get(key)
            if entry is None:
                entry = self._shared[key] = [ThreadedStreamFiles(wake), 0]
            entry[1] += 1
            files: ThreadedStreamFiles = entry[0]
            return files

    def release(self, key: object) -> None:
        """One user of ``key``'s files is done; the last closes them."""
        with self._lock:
            entry = self._shared.get(key)
            if entry is None or entry[1] > 1:
                if entry is not None:
                    entry[1] -= 1
                return
            del self._shared[key]
        entry[0].close()


shared_stream_files = SharedStreamFiles()
"""The process's stream-file workers, by event loop."""


class _Worker:
    """The worker thread, its queue, and what the provider's files share with it (under ``lock``)."""

    def __init__(self, wake: Callable[[], None], name: str) -> None:
        self.wake = wake
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)
        self.jobs: deque[Job] = deque()
        self.writers: set[_ThreadedSpill] = set()
        """Spill files not yet handed over or discarded: removed by ``close``."""
        self.readers: set[_ThreadedSource] = set()
        self.stopping = False
        self.written = 0
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job (the lock held); OSError once closed."""
        if self.stopping:
            raise _closed_error()
        self.jobs.append(job)
        self.work.notify()

    def run(self) -> None:
        unwoken = False  # jobs done since the last wake
        while True:
            with self.work:
                while not self.jobs and not (self.stopping or unwoken):
                    self.work.wait()
                job = self.jobs.popleft() if self.jobs else None
                if job is None and self.stopping and not unwoken:
                    return
            if job is None or self.do(job):
                self.ring()
                unwoken = False
            else:
                unwoken = True

    @staticmethod
    def do(job: Job) -> bool:
        try:
            return job()
        except Exception:  # a bug, not the disk (jobs turn OSError into a failed stream): keep serving
            log.exception("stream file worker: a job failed")
            return True

    def ring(self) -> None:
        self.written = 0
        try:
            self.wake()
        except Exception:  # a closing adapter's kick: nothing left to wake
            log.debug("stream file worker: wake failed", exc_info=True)

    def wrote(self, n: int) -> bool:
        self.written += n
        return self.written >= WAKE_EVERY


class _ThreadedSpill:
    """A spill file whose creation, writes and close run on the worker, in the order asked."""

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._lock = worker.lock
        self._file: SpillFile | None = None
        self._error: OSError | None = None
        self._closed = False
        self._gone = False  # discarded or handed over: nothing more is reported
        self.backlog = 0

    @property
    def due(self) -> bool:
        return not self._gone and (self._error is not None or self._closed)

    def write(self, data: Data) -> None:
        if self._error is not None:
            raise self._error
        if not isinstance(data, bytes) and not (isinstance(data, memoryview) and isinstance(data.obj, bytes)):
            data = bytes(data)  # the caller may reuse its buffer; bytes never change
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        with self._lock:
            self._worker.submit(functools.partial(self._write, data, n))
            self.backlog += n

    def finish(self) -> None:
        with self._lock:  # a failure, even one known now, is reported by poll(): the peer hears of it
            self._worker.submit(self._finish)

    def poll(self) -> str | None:
        with self._lock:
            if self._error is not None:
                raise self._error
            if not self._closed or self._file is None:
                return None
            self._gone = True
            self._worker.writers.discard(self)
            return self._file.path

    def discard(self) -> None:
        with self._lock:
            if self._gone:
                return
            self._gone = True
            self._worker.writers.discard(self)
            if not self._worker.stopping:  # else close() queued the removal already
                self._worker.submit(self._remove)

    def abandon(self) -> None:
        """The provider closes (the lock held): fail, and remove the file after the worker's queue."""
        if self._error is None:
            self._error = _closed_error()
        self._worker.jobs.append(self._remove)

    def unlink(self) -> None:
        if self._file is not None:
            remove_spill(self._file.path)

    # -- on the worker ------------------------------------------------------------------------------

    def _skip(self) -> bool:
        with self._lock:
            return self._gone or self._error is not None

    def create(self, files: InlineStreamFiles, directory: str | None, prefix: str, name: str) -> bool:
        if self._skip():
            return False
        try:
            self._file = files.spill(directory, prefix, name)
        except OSError as exc:
            return self._fail(exc)
        return False

    def _write(self, data: Data, n: int) -> bool:
        try:
            if not self._skip() and self._file is not None:
                self._file.write(data)
        except OSError as exc:
            return self._fail(exc)
        finally:
            with self._lock:
                self.backlog -= n
        return self._worker.wrote(n)

    def _finish(self) -> bool:
        if self._skip() or self._file is None:
            return True  # a failure to report (or nothing: discarded)
        try:
            self._file.finish()
        except OSError as exc:
            return self._fail(exc)
        with self._lock:
            self._closed = True
        return True

    def _fail(self, error: OSError) -> bool:
        with self._lock:
            if self._error is None:
                self._error = error
        self._remove()
        return True

    def _remove(self) -> bool:
        if self._file is not None:
            self._file.discard()
        return False


class _ThreadedSource:
    """A file being sent, read on the worker at most ``read_ahead`` bytes ahead of :meth:`take`."""

    def __init__(self, worker: _Worker, source: FileSource, chunk: int, read_ahead: int) -> None:
        self._worker = worker
        self._lock = worker.lock
        self.source = source
        self.size = source.size
        self.name = source.name
        self._depth = max(1, read_ahead // chunk)
        self._chunk = chunk
        self._ready: deque[bytearray] = deque()
        self._asked = 0  # bytes of read jobs queued so far
        self._in_flight = 0
        self._error: OSError | None = None
        self._closed = False

    @property
    def due(self) -> bool:
        return self._error is not None or (not self._closed and bool(self._ready))

    def take(self) -> bytearray | None:
        with self._lock:
            if self._error is not None:
                raise self._error
            payload = self._ready.popleft() if self._ready else None
            self.refill()
            return payload

    def refill(self) -> None:
        """Queue reads up to the read-ahead (the lock held)."""
        while not self._closed and self._asked < self.size and len(self._ready) + self._in_flight < self._depth:
            self._worker.submit(self._read)
            self._asked += min(self._chunk, self.size - self._asked)
            self._in_flight += 1

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ready.clear()
            self._worker.readers.discard(self)
            if not self._worker.stopping:  # else close() queued it already
                self._worker.submit(self._close)

    def abandon(self) -> None:
        """The provider closes (the lock held): fail, and close the file after the worker's queue."""
        if self._error is None:
            self._error = _closed_error()
        self._closed = True
        self._ready.clear()
        self._worker.jobs.append(self._close)

    # -- on the worker ------------------------------------------------------------------------------

    def _read(self) -> bool:
        with self._lock:
            self._in_flight -= 1
            if self._closed or self._error is not None:
                return False
        try:
            payload = self.source.take()
        except OSError as exc:
            with self._lock:
                self._error = exc
            return True
        with self._lock:
            starved = not self._ready
            if not self._closed:
                self._ready.append(payload)
        return starved

    def _close(self) -> bool:
        self.source.close()
        return False
