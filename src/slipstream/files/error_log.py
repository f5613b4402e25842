"""The distinct error log: each different error once, with how often and when it was seen.

Kept in the error-log section of ``cnc.dat`` in Aeron's record layout: length (i32, header plus
text), observation_count (i32), last_observation_ms (i64), first_observation_ms (i64), then the
text, records 8-byte aligned. Repeating an error updates its record in place, so a flood of the
same failure costs no space. The length is written last, so readers never see half a record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

HEADER_LENGTH: Final = 24
RECORD_ALIGNMENT: Final = 8
MAX_TEXT_LENGTH: Final = 4096
_HEAD = struct.Struct("<iiqq")


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    observation_count: int
    last_observation_ms: int
    first_observation_ms: int
    text: str

    def describe(self) -> str:
        return (
            f"{self.observation_count} observations from {self.first_observation_ms} "
            f"to {self.last_observation_ms} for:\n {self.text}"
        )


class DistinctErrorLog:
    """Writer over the error-log buffer (the driver's only)."""

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self._next = 0
        self._records: dict[str, int] = {}
        self.dropped = 0
        """Distinct errors that did not fit."""

    def record(self, text: str, now_ms: int, observations: int = 1) -> bool:
        """Count ``observations`` of the error ``text``; False if a new error no longer fits."""
        if observations <= 0:
            return True
        buffer = self.buffer
        offset = self._records.get(text)
        if offset is not None:
            count = struct.unpack_from("<i", buffer, offset + 4)[0]
            struct.pack_into("<q", buffer, offset + 8, now_ms)
            struct.pack_into("<i", buffer, offset + 4, min(count + observations, 0x7FFFFFFF))
            return True
        raw = text.encode("utf-8", "replace")[:MAX_TEXT_LENGTH]
        length = HEADER_LENGTH + len(raw)
        aligned = (length + RECORD_ALIGNMENT - 1) & -RECORD_ALIGNMENT
        if self._next + aligned > len(buffer):
            self.dropped += observations
            return False
        offset = self._next
        buffer[offset + HEADER_LENGTH : offset + length] = raw
        struct.pack_into("<iqq", buffer, offset + 4, min(observations, 0x7FFFFFFF), now_ms, now_ms)
        struct.pack_into("<i", buffer, offset, length)  # published last
        self._next += aligned
        self._records[text] = offset
        return True


def read_error_log(buffer: memoryview | bytes) -> Iterator[ErrorRecord]:
    """Records of an error log; stops at the first empty or impossible record."""
    data = bytes(buffer)
    offset = 0
    while offset + HEADER_LENGTH <= len(data):
        length, count, last, first = _HEAD.unpack_from(data, offset)
        if length < HEADER_LENGTH or length > len(data) - offset:
            return
        text = data[offset + HEADER_LENGTH : offset + length].decode("utf-8", "replace")
        yield ErrorRecord(count, last, first, text)
        offset += (length + RECORD_ALIGNMENT - 1) & -RECORD_ALIGNMENT
