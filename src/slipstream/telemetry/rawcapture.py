"""The hot side of a stream capture: term bytes straight to raw files, nothing else (Aeron Archive's way).

``RawCapture`` is one more subscriber on the stream. Each poll block-polls every image and writes the
blocks as they lie in the term (``os.writev`` of the term's memoryview behind a 32-byte block header:
no Python copy, no per-message work, no pyarrow) into ``<raw_dir>/<seq>.raw.open``. Turning frames into
rows is someone else's job, on another CPU or later (:class:`~slipstream.telemetry.capture.RawConverter`),
so the capture costs the stream it records little more than one memcpy into the page cache.

Polls are large and rare: between polls the capture sleeps for a quarter of the time a fast publisher
needs to fill the window it has over this subscriber (a stream far from its limit needs no spinning).
The file being written is rotated (renamed to ``<seq>.raw``, fsynced on a helper thread, so a slow
disk never stalls polling) every flush interval and every ``file_bytes``: a SIGKILL loses nothing
written (it is in the page cache) and a power cut at most one flush interval. When ``max_pending_bytes``
of raw files wait for conversion the capture stops reading, so a converter that cannot keep up slows
the publisher through flow control instead of losing messages or filling the disk.

Layout of a raw file (little-endian)::

    prelude  b"SLIPRAW1", u32 n, n bytes of JSON {channel, stream_id, decoder}, zeros to a multiple of 32
    block    b"BLK1", u32 length, i32 session_id, i32 term_id, i64 position, i64 timestamp_ns, length bytes

``position`` is the stream position of the block's first byte; a block is whole frames of one term. A
reader stops at the first block that is not complete (a torn tail after a kill).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..client import Context, Subscription
from .segments import try_lock

log = logging.getLogger("slipstream.telemetry")

RAW_DIR: Final = ".raw"
"""Raw captures live in ``<writer_dir>/.raw/<capture>/``: hidden from readers, which skip dot names."""
OPEN_SUFFIX: Final = ".raw.open"
CLOSED_SUFFIX: Final = ".raw"
_FILE_RE: Final = re.compile(r"(\d{12})\.raw(\.open)?")
_PRELUDE_MAGIC: Final = b"SLIPRAW1"
_BLOCK_MAGIC: Final = b"BLK1"
_BLOCK: Final = struct.Struct("<4sIiiqq")
_ALLOCATE_STEP: Final = 8 << 20
ASSUMED_PEAK_RATE: Final = 2 << 30
"""Bytes per second a publisher may burst at (a core's memcpy): sizes the sleep between polls."""


@dataclass(slots=True)
class RawBlock:
    """Whole frames of one image's term, as one poll saw them."""

    timestamp_ns: int
    session_id: int
    position: int
    """Stream position of the block's first byte."""
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class RawFile:
    """A raw file on disk: ``closed`` once the capture rotated it (only those are converted live)."""

    seq: int
    path: Path
    closed: bool


def raw_files(raw_dir: Path) -> list[RawFile]:
    """A capture directory's raw files in sequence order."""
    found: list[RawFile] = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(raw_dir):
            match = _FILE_RE.fullmatch(entry.name)
            if match is not None:
                found.append(RawFile(int(match[1]), Path(entry.path), match[2] is None))
    found.sort(key=lambda f: f.seq)
    return found


def raw_capture_dirs(writer_dir: Path) -> list[Path]:
    """The capture directories of a writer directory."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return sorted(Path(e.path) for e in os.scandir(writer_dir / RAW_DIR) if e.is_dir())
    return []


def pending_bytes(raw_dir: Path) -> int:
    """Bytes of raw files waiting for conversion (what ``max_pending_bytes`` bounds)."""
    total = 0
    for raw in raw_files(raw_dir):
        with contextlib.suppress(FileNotFoundError):
            total += raw.path.stat().st_size
    return total


def _prelude(channel: str, stream_id: int, decoder: str | None) -> bytes:
    meta = json.dumps({"channel": channel, "stream_id": stream_id, "decoder": decoder}).encode()
    head = _PRELUDE_MAGIC + len(meta).to_bytes(4, "little") + meta
    return head + bytes(-len(head) % 32)


@dataclass(slots=True)
class RawContent:
    """What a raw file holds: the capture's identity and its complete blocks."""

    channel: str
    stream_id: int
    decoder: str | None
    """``MODULE:NAME`` of the capture's decoder when it had an importable one (recovery types rows)."""
    blocks: list[RawBlock]


def read_raw(path: Path) -> RawContent | None:
    """A raw file's complete blocks (a torn tail is ignored), or None if not even its prelude is whole."""
    data = memoryview(path.read_bytes())
    if len(data) < 12 or bytes(data[:8]) != _PRELUDE_MAGIC:
        return None
    n = int.from_bytes(data[8:12], "little")
    end = 12 + n
    if end > len(data):
        return None
    try:
        meta = json.loads(bytes(data[12:end]))
    except ValueError:
        return None
    offset = end + (-end % 32)
    blocks: list[RawBlock] = []
    while offset + _BLOCK.size <= len(data):
        magic, length, session_id, _, position, timestamp_ns = _BLOCK.unpack_from(data, offset)
        start = offset + _BLOCK.size
        if magic != _BLOCK_MAGIC or start + length > len(data):
            break  # a block cut short by a kill (or zeros after a power cut): everything before is intact
        blocks.append(RawBlock(timestamp_ns, session_id, position, data[start : start + length]))
        offset = start + length
    return RawContent(str(meta["channel"]), int(meta["stream_id"]), meta.get("decoder"), blocks)


class _Syncer:
    """fsync and close rotated files on a thread: a slow disk must not stall polling (the window)."""

    def __init__(self, fsync: bool) -> None:
        self._fsync = fsync
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="slipstream-raw-fsync", daemon=True)
        self._thread.start()

    def submit(self, fd: int) -> None:
        self._queue.put(fd)

    def _run(self) -> None:
        while (fd := self._queue.get()) is not None:
            try:
                if self._fsync:
                    os.fsync(fd)
            except OSError:
                log.exception("raw capture: fsync failed")
            finally:
                os.close(fd)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class RawCapture:
    """Writes every frame of ``channel``/``stream_id`` into raw files under ``raw_dir`` (see the module).

    ``on_rotate(seq)`` is called after each rotation (a converter's cue). Thread-safe between one
    polling thread and one thread calling :meth:`rotate`.
    """

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        raw_dir: str | Path,
        *,
        block_length_limit: int = 8 << 20,
        max_pending_bytes: int = 1 << 30,
        file_bytes: int = 64 << 20,
        flush_interval_s: float = 1.0,
        fsync: bool = True,
        decoder_spec: str | None = None,
        on_rotate: Callable[[int], object] | None = None,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.raw_dir = Path(raw_dir)
        self.block_length_limit = block_length_limit
        self.max_pending_bytes = max_pending_bytes
        self.file_bytes = file_bytes
        self.flush_interval_ns = int(flush_interval_s * 1e9)
        self.on_rotate = on_rotate
        self.bytes_written = 0
        """Raw bytes (block headers and frames) written so far."""
        self.backlogged_polls = 0
        """Polls skipped because ``max_pending_bytes`` of raw files waited for conversion."""
        lock = try_lock(self.raw_dir)
        if lock is None:
            raise RuntimeError(f"another capture is writing into {self.raw_dir}")
        self._lock_fd = lock
        self._prelude = _prelude(channel, stream_id, decoder_spec)
        self._seq = max((f.seq for f in raw_files(self.raw_dir)), default=-1) + 1
        self._fd = -1
        self._file_size = 0
        self._allocated = 0
        self._opened_ns = 0
        self._pending = pending_bytes(self.raw_dir)
        self._now = 0
        self._position = 0
        self._lock = threading.Lock()
        self._syncer = _Syncer(fsync)
        self._closed = False
        self.subscription: Subscription = context.add_subscription(channel, stream_id)

    def _path(self, seq: int, suffix: str) -> Path:
        return self.raw_dir / f"{seq:012d}{suffix}"

    def _on_block(self, block: memoryview, session_id: int, term_id: int) -> None:
        if self._fd < 0:
            self._fd = os.open(self._path(self._seq, OPEN_SUFFIX), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            self._file_size = 0
            self._allocated = 0
            self._opened_ns = self._now
            self._write([self._prelude])
        if self._file_size + _BLOCK.size + len(block) > self._allocated:
            self._allocate(_BLOCK.size + len(block))
        header = _BLOCK.pack(_BLOCK_MAGIC, len(block), session_id, term_id, self._position, self._now)
        self._write([header, block])

    def _write(self, parts: list[bytes | memoryview]) -> None:
        """Write all of ``parts`` or keep trying: the block poll has consumed the frames, so giving up
        would lose them; blocking here back-pressures the publisher instead (disk full, say)."""
        total = sum(len(p) for p in parts)
        done = 0
        while done < total:
            try:
                done += os.writev(self._fd, parts) if done == 0 else os.write(self._fd, b"".join(parts)[done:])
            except OSError:
                if self._closed:
                    raise
                log.exception("raw capture: write to %s failed; retrying", self.raw_dir)
                os.ftruncate(self._fd, self._file_size)
                self._allocated = self._file_size
                done = 0
                time.sleep(0.5)
        self._file_size += total
        self._pending += total
        self.bytes_written += total

    def _allocate(self, need: int) -> None:
        """Allocate the file ahead of the writes, in steps: writing into allocated blocks measured about
        a third cheaper in CPU than extending the file (ext4). Trailing zeros read as a torn tail."""
        step = max(need, min(self.file_bytes, _ALLOCATE_STEP))
        try:
            os.posix_fallocate(self._fd, self._file_size, step)
        except OSError:
            return  # not supported, or the disk is full: plain writes (which retry) still work
        self._allocated = self._file_size + step

    def poll(self, fragment_limit: int = 0) -> int:
        """Write what every image has new (up to a publication window each); returns the bytes consumed.

        ``fragment_limit`` is accepted for symmetry with ``Subscription.poll`` and ignored."""
        if self._pending >= self.max_pending_bytes:
            self._pending = pending_bytes(self.raw_dir)  # the converter may have caught up
            if self._pending >= self.max_pending_bytes:
                self.backlogged_polls += 1
                return 0
        read = 0
        with self._lock:
            self._now = time.time_ns()
            for image in self.subscription.images:
                window = image.publication_window
                got = 0
                while got < window:
                    self._position = image.position
                    n = image.block_poll(self._on_block, self.block_length_limit)
                    if n == 0:
                        break
                    got += n
                read += got
            if self._fd >= 0 and (
                self._file_size >= self.file_bytes or self._now - self._opened_ns >= self.flush_interval_ns
            ):
                self._rotate()
        return read

    def rotate(self) -> None:
        """Close the file being written (a converter may then take it); a no-op when nothing was written."""
        with self._lock:
            self._rotate()

    def _rotate(self) -> None:
        if self._fd < 0:
            return
        seq = self._seq
        if self._allocated > self._file_size:
            os.ftruncate(self._fd, self._file_size)  # the converter and the backlog see the real size
        os.rename(self._path(seq, OPEN_SUFFIX), self._path(seq, CLOSED_SUFFIX))
        self._syncer.submit(self._fd)
        self._fd = -1
        self._seq += 1
        self._pending = pending_bytes(self.raw_dir)
        if self.on_rotate is not None:
            self.on_rotate(seq)

    def window(self) -> int | None:
        """The smallest window a publisher has over this capture (None while there is no image)."""
        return min((image.publication_window for image in self.subscription.images), default=None)

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set: at once again after a poll that read a quarter of the window (the
        capture is behind), else after a quarter of the time a publisher bursting at ``ASSUMED_PEAK_RATE``
        needs to fill the window (0.5 to 10 ms; 10 ms with no image): polls stay large and rare, and the
        publisher never waits for the capture."""
        while not stop.is_set():
            read = self.poll()
            window = self.window()
            if window is None:
                stop.wait(0.01)
            elif read < window // 4:
                stop.wait(min(0.01, max(0.0005, window / 4 / ASSUMED_PEAK_RATE)))

    def close(self) -> None:
        """Stop capturing: the last file is rotated and fsynced, the directory's lock released."""
        if self._closed:
            return
        self.subscription.close()
        self.rotate()
        self._closed = True
        self._syncer.close()
        os.close(self._lock_fd)
