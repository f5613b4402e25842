"""The driver directory: where a media driver keeps its shared files, and how they are mapped.

``<dir>/cnc.dat`` holds the driver's identity and counters, ``<dir>/driver.sock`` is its command
socket, ``<dir>/driver.lock`` is held (flock) for the driver's lifetime so two drivers can never share
a directory, ``<dir>/driver.toml`` holds the settings it runs with, and ``<dir>/publications/`` holds IPC log
buffers.
"""

from __future__ import annotations

import contextlib
import getpass
import mmap
import os
from pathlib import Path

from ..errors import DriverDirectoryError

CNC_FILE = "cnc.dat"
SOCKET_FILE = "driver.sock"
LOCK_FILE = "driver.lock"
CONFIG_FILE = "driver.toml"
"""The settings the driver runs with, as TOML, written when it starts (``slipstream settings`` prints it)."""
PUBLICATIONS_DIR = "publications"
IMAGES_DIR = "images"
ENV_DIR = "SLIPSTREAM_DIR"


def default_directory() -> Path:
    """``$SLIPSTREAM_DIR``, else ``/dev/shm/slipstream-<user>`` (tmpfs, so logs live in memory)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    base = Path("/dev/shm")
    if not base.is_dir():
        base = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return base / f"slipstream-{user}"


def raise_open_file_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (as Go's runtime and the JVM do);
    the limit now in force. Every mapped log holds a file descriptor (CPython's ``mmap`` keeps a duplicate
    of the one it mapped), a few per stream, so a server with a few hundred connections would run out
    under the common soft limit of 1024 long before its hard limit."""
    import resource  # (Unix; this module maps files in /dev/shm, so it is Unix already)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    with contextlib.suppress(ValueError, OSError):  # a sandbox may refuse: keep what we have
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def map_file(path: Path, length: int | None = None, *, create: bool = False, writable: bool = True) -> mmap.mmap:
    """Map ``path`` shared. With ``create`` the file is made (or truncated) to ``length`` bytes, sparse."""
    if create:
        if length is None or length <= 0:
            raise ValueError("a length is needed to create a mapped file")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, length)
            return mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if length is not None and size < length:
            raise ValueError(f"{path} holds {size} bytes, expected at least {length}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, length or size, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)


def close_mapping(mapping: mmap.mmap) -> None:
    """Close a mapping; if views of it are still held somewhere, leave it to the garbage collector."""
    with contextlib.suppress(BufferError):
        mapping.close()


def release_log_file(path: Path, mapping: mmap.mmap) -> None:
    """Release a log file the driver mapped (its log's views closed first) and delete it. Readers that
    mapped it keep their pages until they unmap; a file already gone is no error."""
    close_mapping(mapping)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def socket_address(directory: Path) -> str:
    """Address of the driver's command socket. Unix socket paths are limited to ~107 bytes, so a long
    directory is reached through ``/proc/self/fd`` of an open descriptor (see ``DirectoryHandle``)."""
    return str(directory / SOCKET_FILE)


class DirectoryHandle:
    """Keeps a descriptor of the directory open so long socket paths can be shortened."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)

    def socket_path(self) -> str:
        full = socket_address(self.directory)
        if len(full.encode()) < 100:
            return full
        return f"/proc/self/fd/{self._fd}/{SOCKET_FILE}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def directory_error(directory: Path, exc: OSError) -> DriverDirectoryError:
    """An OS error on the driver directory, as one line that names it and the way out."""
    reason = exc.strerror or type(exc).__name__
    return DriverDirectoryError(
        f"cannot use driver directory {directory}: {reason}"
        f"{f' ({exc.filename})' if exc.filename and str(exc.filename) != str(directory) else ''}; "
        "choose a directory this user can write (--dir DIR, or $SLIPSTREAM_DIR) or fix its permissions"
    )
