"""``cnc.dat``: the driver's identity (version, pid, start time, heartbeat) and its counters.

The header keeps Aeron's field offsets; slipstream puts no ring buffers in it (commands travel on
the driver's socket), so their lengths are zero. Any process can map the file to read counters
while the driver runs; the heartbeat tells a reader whether the driver is still alive.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..errors import SlipstreamError
from .counters import METADATA_LENGTH, VALUE_LENGTH, CountersManager, CountersReader
from .directory import CNC_FILE, close_mapping, map_file

CNC_VERSION: Final = 0x53_01_00_00 | 1
"""'S' in the top byte marks slipstream's layout; the low bits count incompatible changes."""
HEADER_LENGTH: Final = 128
_HEADER = struct.Struct("<iiiiiiqqqi")
_HEARTBEAT_OFFSET: Final = 64
_STATE_OFFSET: Final = 72
PARKED_INDEX: Final = 80 // 8
"""i64 slot of the header: 1 while the driver sleeps in ``select``; clients that give it UDP work
then ring its doorbell (a Wake message) instead of waiting out the sleep."""

STATE_STARTING: Final = 0
STATE_RUNNING: Final = 1
STATE_CLOSED: Final = 2


class CncError(SlipstreamError, RuntimeError):
    """``cnc.dat`` is missing, too short or from an incompatible version."""


@dataclass(frozen=True, slots=True)
class CncHeader:
    version: int
    counters_metadata_length: int
    counters_values_length: int
    error_log_length: int
    client_liveness_timeout_ns: int
    start_timestamp_ms: int
    pid: int
    page_size: int


class CncFile:
    """A mapped ``cnc.dat``: header, counters and the error log section."""

    def __init__(self, mapping: mmap.mmap, header: CncHeader, path: Path) -> None:
        self.path = path
        self._mapping = mapping
        self.header = header
        view = memoryview(mapping)
        self._view = view
        self._i64 = view[:HEADER_LENGTH].cast("q")
        meta_start = HEADER_LENGTH
        values_start = meta_start + header.counters_metadata_length
        error_start = values_start + header.counters_values_length
        self.counters_metadata = view[meta_start:values_start]
        self.counters_values = view[values_start:error_start]
        self.error_log = view[error_start : error_start + header.error_log_length]

    @classmethod
    def create(
        cls,
        directory: Path,
        *,
        counters_capacity: int,
        error_log_length: int,
        client_liveness_timeout_ns: int,
        start_timestamp_ms: int,
        pid: int,
    ) -> CncFile:
        header = CncHeader(
            CNC_VERSION,
            counters_capacity * METADATA_LENGTH,
            counters_capacity * VALUE_LENGTH,
            error_log_length,
            client_liveness_timeout_ns,
            start_timestamp_ms,
            pid,
            mmap.PAGESIZE,
        )
        length = HEADER_LENGTH + header.counters_metadata_length + header.counters_values_length + error_log_length
        path = directory / CNC_FILE
        mapping = map_file(path, length, create=True)
        _HEADER.pack_into(
            mapping,
            0,
            0,
            0,
            0,
            header.counters_metadata_length,
            header.counters_values_length,
            error_log_length,
            client_liveness_timeout_ns,
            start_timestamp_ms,
            pid,
            header.page_size,
        )
        cnc = cls(mapping, header, path)
        cnc.state = STATE_STARTING
        # The version goes last: a reader that sees it sees a complete header.
        struct.pack_into("<i", mapping, 0, CNC_VERSION)
        return cnc

    @classmethod
    def open(cls, directory: Path) -> CncFile:
        path = directory / CNC_FILE
        try:
            mapping = map_file(path)
        except FileNotFoundError:
            raise CncError(f"no media driver has run in {directory} (no {CNC_FILE})") from None
        except (ValueError, OSError) as exc:
            raise CncError(f"cannot map {path}: {exc}") from None
        if len(mapping) < HEADER_LENGTH:
            close_mapping(mapping)
            raise CncError(f"{path} is too short to be a driver file")
        fields = _HEADER.unpack_from(mapping, 0)
        header = CncHeader(fields[0], fields[3], fields[4], fields[5], fields[6], fields[7], fields[8], fields[9])
        if header.version != CNC_VERSION:
            close_mapping(mapping)
            raise CncError(
                f"{path} has version {header.version:#x}, this slipstream needs {CNC_VERSION:#x}: "
                "a driver of another slipstream version owns this directory; stop it or choose another --dir"
            )
        needed = HEADER_LENGTH + header.counters_metadata_length + header.counters_values_length
        if (
            min(header.counters_metadata_length, header.counters_values_length, header.error_log_length) < 0
            or header.counters_metadata_length % METADATA_LENGTH
            or needed + header.error_log_length > len(mapping)
        ):
            close_mapping(mapping)
            raise CncError(f"{path} describes sections that do not fit the file")
        return cls(mapping, header, path)

    def counters_reader(self) -> CountersReader:
        return CountersReader(self.counters_metadata, self.counters_values)

    def counters_manager(self) -> CountersManager:
        return CountersManager(self.counters_metadata, self.counters_values)

    @property
    def heartbeat_ms(self) -> int:
        return int(self._i64[_HEARTBEAT_OFFSET // 8])

    @heartbeat_ms.setter
    def heartbeat_ms(self, value: int) -> None:
        self._i64[_HEARTBEAT_OFFSET // 8] = value

    @property
    def header_i64(self) -> memoryview:
        """The header as i64 slots (``PARKED_INDEX``), for hot paths that read one flag."""
        return self._i64

    @property
    def state(self) -> int:
        return int(self._i64[_STATE_OFFSET // 8])

    @state.setter
    def state(self, value: int) -> None:
        self._i64[_STATE_OFFSET // 8] = value

    def close(self) -> None:
        for view in (self.counters_metadata, self.counters_values, self.error_log, self._i64, self._view):
            view.release()
        close_mapping(self._mapping)
