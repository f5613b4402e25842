"""Stream files on the caller's thread: the spill file an incoming stream is written to, the file an
outgoing one is read from, and :class:`InlineStreamFiles`, the provider that does both at once
(deterministic: what the in-memory tests and ``slipstream.testing`` use; the threaded provider in
:mod:`.streamfiles` runs these same classes on its worker).

A received file keeps the sender's name: it is written as ``<private directory>/<name>``, the directory
made by ``mkdtemp`` (``0700``, only ours) so no name a peer sends can reach another file; the name is cut
to its last path component first, and a name that is empty, ``.`` or ``..`` (or cannot be created) falls
back to a nameless temporary file. :func:`remove_spill` removes the file and then its private directory
if it is empty: an application that moved the file out leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

__all__ = ["NAMED_DIR_SUFFIX", "FileSource", "InlineStreamFiles", "SpillFile", "remove_spill", "safe_name"]

Data = bytes | bytearray | memoryview

NAMED_DIR_SUFFIX: Final = ".received"
"""How a received file's private directory ends (``<prefix>XXXXXXXX.received``): :func:`remove_spill`
removes only an empty directory named so."""
_OPEN_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def safe_name(name: str) -> str:
    """A peer's file name as one path component ('' when none is usable)."""
    for separator in ("/", "\\", "\x00"):
        name = name.rpartition(separator)[2]
    return "" if name in ("", ".", "..") else name


def remove_spill(path: str) -> None:
    """Remove a spill file (quietly if it is gone: the application may have moved it), then its private
    directory when it has one and it is empty."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    folder = os.path.dirname(path)
    if folder.endswith(NAMED_DIR_SUFFIX):
        with contextlib.suppress(OSError):  # not empty: the application put something there
            os.rmdir(folder)


class SpillFile:
    """A temporary file a stream is written to (``0600``), removed unless handed over; with ``name``, a file
    of that name in a private directory of its own (see the module's docstring)."""

    backlog: Final = 0
    due: Final = False

    def __init__(self, directory: str | None = None, prefix: str = "slipstream-stream-", name: str = "") -> None:
        self.path = ""
        if name := safe_name(name):
            folder = tempfile.mkdtemp(prefix=prefix, suffix=NAMED_DIR_SUFFIX, dir=directory)
            try:
                fd = os.open(os.path.join(folder, name), _OPEN_FLAGS, 0o600)
                self.path = os.path.join(folder, name)
            except OSError:  # a name this file system takes no file under: nameless after all
                os.rmdir(folder)
        if not self.path:
            fd, self.path = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
        self._file = os.fdopen(fd, "wb", buffering=1024 * 1024)

    def write(self, data: Data) -> None:
        self._file.write(data)

    def finish(self) -> str:
        """Close it and return its path (the caller now owns the file)."""
        self._file.close()
        return self.path

    def poll(self) -> str | None:
        return self.path if self._file.closed else None

    def discard(self) -> None:
        """Close and remove it."""
        with contextlib.suppress(OSError):
            self._file.close()
        remove_spill(self.path)

    @staticmethod
    @contextlib.contextmanager
    def mapped(path: str) -> Iterator[memoryview]:
        """A read-only view of a completed spill (decode a large message from it without reading it into
        the heap: msgspec decodes from any buffer)."""
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                yield memoryview(b"")
                return
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    yield view
                finally:
                    view.release()


class FileSource:
    """A file being sent, read one chunk at a time (opened at once so a missing file fails ``send_file``)."""

    due: Final = False

    def __init__(self, path: str | os.PathLike[str], *, chunk: int = 64 * 1024, headroom: int = 0) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - kept open across chunks, closed by close()
        self.size = os.fstat(self._file.fileno()).st_size
        self.name = Path(path).name
        self._chunk = chunk
        self._headroom = headroom
        self._offset = 0

    def read_into(self, buffer: memoryview) -> int:
        """Fill ``buffer`` from the file (fewer bytes only at its end); the bytes read."""
        return self._file.readinto(buffer)

    def take(self) -> bytearray:
        """The next chunk, read now, after ``headroom`` free bytes (short where the file ended early)."""
        n = min(self._chunk, self.size - self._offset)
        self._offset += n
        payload = bytearray(self._headroom + n)
        with memoryview(payload) as whole, whole[self._headroom :] as body:
            got = self.read_into(body)
        return payload if got == n else payload[: self._headroom + got]

    def close(self) -> None:
        self._file.close()


class InlineStreamFiles:
    """Reads and writes at once on the caller's thread (the default: deterministic, blocking)."""

    def spill(self, directory: str | None, prefix: str, name: str = "") -> SpillFile:
        return SpillFile(directory, prefix, name)

    def source(self, path: str | os.PathLike[str], *, chunk: int, headroom: int) -> FileSource:
        return FileSource(path, chunk=chunk, headroom=headroom)

    def remove(self, path: str) -> None:
        remove_spill(path)
