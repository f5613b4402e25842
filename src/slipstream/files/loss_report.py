"""``loss-report.dat``: one entry per image that saw loss, readable by any process while the driver runs.

Aeron's layout: 64-byte aligned entries of observation_count (i64), total_bytes_lost (i64),
first_observation_ms (i64), last_observation_ms (i64), session_id (i32), stream_id (i32), then the
channel and the source as length-prefixed ASCII (each padded to 4 bytes). The count is written last
when an entry is created, so a reader stops at the first entry whose count is not positive.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .directory import close_mapping, map_file

LOSS_REPORT_FILE: Final = "loss-report.dat"
LOSS_REPORT_LENGTH: Final = 1024 * 1024
ENTRY_ALIGNMENT: Final = 64
_HEAD = struct.Struct("<qqqqii")
_LEN = struct.Struct("<i")


@dataclass(frozen=True, slots=True)
class LossEntry:
    observation_count: int
    total_bytes_lost: int
    first_observation_ms: int
    last_observation_ms: int
    session_id: int
    stream_id: int
    channel: str
    source: str

    def csv(self) -> str:
        return (
            f"{self.observation_count},{self.total_bytes_lost},{self.first_observation_ms},"
            f"{self.last_observation_ms},{self.session_id},{self.stream_id},{self.channel},{self.source}"
        )


def _padded(text: str) -> bytes:
    raw = text.encode("ascii", "replace")
    return _LEN.pack(len(raw)) + raw + bytes(-len(raw) % 4)


class LossReport:
    """The driver's writer. ``record`` adds an observation for an image; entries never move."""

    def __init__(self, directory: Path, length: int = LOSS_REPORT_LENGTH) -> None:
        self.path = directory / LOSS_REPORT_FILE
        self._mapping: mmap.mmap = map_file(self.path, length, create=True)
        self._view = memoryview(self._mapping)
        self._next = 0
        self._entries: dict[object, int] = {}
        self.full = False

    def record(
        self, key: object, bytes_lost: int, now_ms: int, session_id: int, stream_id: int, channel: str, source: str
    ) -> bool:
        """Count one observation of ``bytes_lost`` for the image identified by ``key``; False when full."""
        view = self._view
        offset = self._entries.get(key)
        if offset is None:
            body = _padded(channel) + _padded(source)
            length = _HEAD.size + len(body)
            aligned = (length + ENTRY_ALIGNMENT - 1) & -ENTRY_ALIGNMENT
            if self._next + aligned > len(view):
                self.full = True
                return False
            offset = self._next
            self._next += aligned
            view[offset + _HEAD.size : offset + length] = body
            _HEAD.pack_into(view, offset, 0, bytes_lost, now_ms, now_ms, session_id, stream_id)
            struct.pack_into("<q", view, offset, 1)  # published last
            self._entries[key] = offset
            return True
        count, total, first, _, _, _ = _HEAD.unpack_from(view, offset)
        struct.pack_into("<qqq", view, offset + 8, total + bytes_lost, first, now_ms)
        struct.pack_into("<q", view, offset, count + 1)
        return True

    def close(self) -> None:
        self._view.release()
        close_mapping(self._mapping)


def read_loss_report(directory: Path) -> Iterator[LossEntry]:
    """Entries of a driver's loss report; tolerates a truncated or corrupt file (stops there)."""
    path = directory / LOSS_REPORT_FILE
    try:
        mapping = map_file(path, writable=False)
    except (FileNotFoundError, ValueError):
        return
    try:
        data = bytes(mapping)
    finally:
        close_mapping(mapping)
    offset = 0
    while offset + _HEAD.size + 8 <= len(data):
        count, total, first, last, session_id, stream_id = _HEAD.unpack_from(data, offset)
        if count <= 0:
            return
        cursor = offset + _HEAD.size
        texts: list[str] = []
        for _ in range(2):
            (length,) = _LEN.unpack_from(data, cursor)
            if not 0 <= length <= len(data) - cursor - 4:
                return
            texts.append(data[cursor + 4 : cursor + 4 + length].decode("ascii", "replace"))
            cursor += 4 + length + (-length % 4)
        yield LossEntry(count, total, first, last, session_id, stream_id, texts[0], texts[1])
        offset += (cursor - offset + ENTRY_ALIGNMENT - 1) & -ENTRY_ALIGNMENT
