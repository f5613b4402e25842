"""The hot side of a stream capture: term bytes straight to disk, nothing else (Aeron Archive's way).

``RawCapture`` is one more subscriber on the stream. Each poll block-polls every image and writes each
block from the term's shared memory to a data file with one ``pwrite``, plus one 40-byte index entry
per block. The write lands in the page cache and returns; the disk gets it in the background (and by
the fsync of each rotation), and the converter reads it back from memory. With ``direct_io`` the block
goes with ``O_DIRECT`` instead (the disk reads the term by DMA: no copy by the CPU, no page cache), but
each write then waits for the disk: on a virtual machine, where the host emulates the disk with the
guest's CPUs stalled, that cost a 32-byte-message stream being recorded about a quarter of its rate,
against about a tenth with the page cache (``python -m bench.pipeline --part recording``, 2 cores).
Where ``O_DIRECT`` is refused, an ordinary ``pwrite`` of the same bytes. No per-message work, no
pyarrow: turning frames into rows is someone else's job, on another CPU or later
(:class:`~slipstream.telemetry.convert.RawConverter`).

Polls are large and rare: between polls the capture sleeps for half the time a fast publisher needs
to fill the window it has over this subscriber (a stream far from its limit needs no spinning).
The files being written are rotated (the index renamed to ``<seq>.raw``, everything fsynced on a helper
thread, so a slow disk never stalls polling) every flush interval and every ``file_bytes``: a SIGKILL
loses nothing written, a power cut at most one flush interval. When ``max_pending_bytes`` of raw files
wait for conversion the capture stops reading, so a converter that cannot keep up slows the publisher
through flow control instead of losing messages or filling the disk.

Layout of one rotation (little-endian)::

    <seq>.raw[.open]          index: b"SLIPRAW2", u32 n, n bytes of JSON {channel, stream_id, decoder},
                              zeros to a multiple of 32; then per block: b"BLK2", u32 length, i32 session_id,
                              i32 term_id, i64 position, i64 timestamp_ns, i64 offset in the data file
    <seq>-<session>.data      the session's term bytes, the block at ``position`` at ``offset``

A data file mirrors the stream from a 512-byte boundary (``O_DIRECT`` writes whole sectors, so the bytes
around a block may be stale or half-written: only what an index entry covers is read). An entry is
appended after its block is written, so a reader that stops at the first incomplete entry (a torn tail)
reads only complete blocks.
"""

from __future__ import annotations

import contextlib
import errno
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
from .errors import RecordingLockedError
from .segments import try_lock

log = logging.getLogger("slipstream.telemetry")

RAW_DIR: Final = ".raw"
"""Raw captures live in ``<writer_dir>/.raw/<capture>/``: hidden from readers, which skip dot names."""
OPEN_SUFFIX: Final = ".raw.open"
CLOSED_SUFFIX: Final = ".raw"
_FILE_RE: Final = re.compile(r"(\d{12})\.raw(\.open)?")
_PRELUDE_MAGIC: Final = b"SLIPRAW2"
_BLOCK_MAGIC: Final = b"BLK2"
_BLOCK: Final = struct.Struct("<4sIiiqqq")
_SECTOR: Final = 512
_ALLOCATE_STEP: Final = 16 << 20
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
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(raw_dir):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
    return total


def _data_path(raw_dir: Path, seq: int, session_id: int) -> Path:
    return raw_dir / f"{seq:012d}-{session_id & 0xFFFFFFFF:08x}.data"


def remove_raw(raw: RawFile) -> None:
    """Delete a rotation: its data files first, then the index (an index without data reads as empty)."""
    prefix = f"{raw.seq:012d}-"
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(raw.path.parent):
            if entry.name.startswith(prefix) and entry.name.endswith(".data"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError):
        raw.path.unlink()


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
    seq = int(_FILE_RE.fullmatch(path.name)[1])  # type: ignore[index]
    files: dict[int, memoryview] = {}
    blocks: list[RawBlock] = []
    while offset + _BLOCK.size <= len(data):
        magic, length, session_id, _, position, timestamp_ns, at = _BLOCK.unpack_from(data, offset)
        if magic != _BLOCK_MAGIC:
            break  # an entry cut short by a kill (or zeros after a power cut): everything before is intact
        offset += _BLOCK.size
        mirror = files.get(session_id)
        if mirror is None:
            try:
                mirror = files[session_id] = memoryview(_data_path(path.parent, seq, session_id).read_bytes())
            except FileNotFoundError:
                mirror = files[session_id] = memoryview(b"")
        if at + length > len(mirror):
            continue  # its data never reached the disk (a power cut) or was deleted: nothing to read
        blocks.append(RawBlock(timestamp_ns, session_id, position, mirror[at : at + length]))
    return RawContent(str(meta["channel"]), int(meta["stream_id"]), meta.get("decoder"), blocks)


class _Mirror:
    """One session's data file of one rotation: the stream from ``base`` (a sector boundary) on."""

    def __init__(self, path: Path, position: int, direct: bool) -> None:
        self.base = position & -_SECTOR
        self.end = position
        self.allocated = 0
        self.direct = direct
        if direct:
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
                return
            except OSError:  # tmpfs and others: no O_DIRECT
                self.direct = False
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def write_direct(self, sectors: memoryview, offset: int) -> None:
        written = os.pwrite(self.fd, sectors, offset)
        if written != len(sectors):
            raise OSError(errno.EIO, f"short O_DIRECT write ({written} of {len(sectors)} bytes)")

    def buffered(self) -> None:
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY)
        os.close(self.fd)
        self.fd = fd
        self.direct = False

    def allocate(self, size: int) -> None:
        """Allocate ahead of the writes: writes into allocated blocks cost less (ext4's extent updates)."""
        with contextlib.suppress(OSError):  # not supported, or the disk is full: the writes still try
            os.posix_fallocate(self.fd, 0, size)
            self.allocated = size


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
        direct_io: bool = False,
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
        self.direct_io = direct_io
        """Write blocks with ``O_DIRECT`` (see the module): no page cache, but each write waits for the disk."""
        self.on_rotate = on_rotate
        self.bytes_written = 0
        """Raw bytes (block headers and frames) written so far."""
        self.backlogged_polls = 0
        """Polls skipped because ``max_pending_bytes`` of raw files waited for conversion."""
        lock = try_lock(self.raw_dir)
        if lock is None:
            raise RecordingLockedError(f"another capture is writing into {self.raw_dir}")
        self._lock_fd = lock
        self._prelude = _prelude(channel, stream_id, decoder_spec)
        self._seq = max((f.seq for f in raw_files(self.raw_dir)), default=-1) + 1
        self._fd = -1
        """The open index (-1 between rotations)."""
        self._mirrors: dict[int, _Mirror] = {}
        self._data_bytes = 0
        self._opened_ns = 0
        self._pending = pending_bytes(self.raw_dir)
        self._now = 0
        self._position = 0
        self._term = memoryview(b"")
        self._term_mask = 0
        self._lock = threading.Lock()
        self._syncer = _Syncer(fsync)
        self._closed = False
        self.subscription: Subscription = context.add_subscription(channel, stream_id)

    def _path(self, seq: int, suffix: str) -> Path:
        return self.raw_dir / f"{seq:012d}{suffix}"

    def _on_block(self, block: memoryview, session_id: int, term_id: int) -> None:
        if self._fd < 0:
            self._fd = os.open(self._path(self._seq, OPEN_SUFFIX), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            self._opened_ns = self._now
            self._data_bytes = 0
            self._retrying(lambda: os.write(self._fd, self._prelude))
        mirror = self._mirrors.get(session_id)
        position = self._position
        if mirror is None:
            mirror = self._mirrors[session_id] = _Mirror(
                _data_path(self.raw_dir, self._seq, session_id), position, self.direct_io
            )
        end = position + len(block)
        if end - mirror.base > mirror.allocated:
            mirror.allocate(end - mirror.base + _ALLOCATE_STEP)
        if mirror.direct:
            low, high = position & -_SECTOR, -(-end // _SECTOR) * _SECTOR
            start = position & self._term_mask
            sectors = self._term[start - (position - low) : start + (high - position)]
            if not self._retrying(lambda: mirror.write_direct(sectors, low - mirror.base)):
                mirror.buffered()  # O_DIRECT refused: the same bytes through the page cache from now on
        if not mirror.direct:
            self._retrying(lambda: os.pwrite(mirror.fd, block, position - mirror.base))
        mirror.end = end
        entry = _BLOCK.pack(_BLOCK_MAGIC, len(block), session_id, term_id, position, self._now, position - mirror.base)
        self._retrying(lambda: os.write(self._fd, entry))
        self._data_bytes += len(block)
        self._pending += len(block) + len(entry)
        self.bytes_written += len(block) + len(entry)

    def _retrying(self, write: Callable[[], object]) -> bool:
        """Run ``write`` until it succeeds: the block poll has consumed the frames, so giving up would lose
        them; blocking here back-pressures the publisher instead (disk full, say). False if O_DIRECT was
        refused (EINVAL: unaligned memory or a file system without it)."""
        while True:
            try:
                write()
                return True
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    return False
                if self._closed:
                    raise
                log.exception("raw capture: write to %s failed; retrying", self.raw_dir)
                time.sleep(0.5)

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
                self._term_mask = image.term_length - 1
                while got < window:
                    self._position = image.position
                    self._term = image.term_view(self._position)
                    n = image.block_poll(self._on_block, self.block_length_limit)
                    if n == 0:
                        break
                    got += n
                read += got
            if self._fd >= 0 and (
                self._data_bytes >= self.file_bytes or self._now - self._opened_ns >= self.flush_interval_ns
            ):
                self._rotate()
        return read

    def rotate(self, *, notify: bool = True) -> None:
        """Close the file being written (a converter may then take it); a no-op when nothing was written.
        ``notify=False`` skips ``on_rotate`` (the converter itself asked)."""
        with self._lock:
            self._rotate(notify)

    def _rotate(self, notify: bool = True) -> None:
        if self._fd < 0:
            return
        seq = self._seq
        for mirror in self._mirrors.values():
            os.ftruncate(mirror.fd, mirror.end - mirror.base)  # allocated ahead: the backlog sees real sizes
            self._syncer.submit(mirror.fd)  # data before the index that points into it
        self._mirrors = {}
        os.rename(self._path(seq, OPEN_SUFFIX), self._path(seq, CLOSED_SUFFIX))
        self._syncer.submit(self._fd)
        self._fd = -1
        self._seq += 1
        self._pending = pending_bytes(self.raw_dir)
        if notify and self.on_rotate is not None:
            self.on_rotate(seq)

    def window(self) -> int | None:
        """The smallest window a publisher has over this capture (None while there is no image)."""
        return min((image.publication_window for image in self.subscription.images), default=None)

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set: at once again after a poll that read a quarter of the window (the
        capture is behind), else after half the time a publisher bursting at ``ASSUMED_PEAK_RATE`` needs to
        fill the window (0.5 to 10 ms; 10 ms with no image). Polls stay large and rare (a wake-up costs
        tens of microseconds of CPU in a VM), and the publisher does not wait for the capture."""
        while not stop.is_set():
            read = self.poll()
            window = self.window()
            if window is None:
                time.sleep(0.01)
            elif read < window // 4:
                time.sleep(min(0.01, max(0.0005, window / 2 / ASSUMED_PEAK_RATE)))

    def close(self) -> None:
        """Stop capturing: the last file is rotated and fsynced, the directory's lock released."""
        if self._closed:
            return
        self.subscription.close()
        self.rotate()
        self._closed = True
        self._syncer.close()
        os.close(self._lock_fd)
