"""``cnc.dat``: the driver's identity (version, pid, start time, heartbeat) and its counters, in Aeron's layout.

The file is Aeron's CnC file, version 0.2.0: a 128-byte header, the to-driver ring buffer, the to-clients
broadcast buffer, the counters' metadata and values, and the distinct-error log. So Aeron's own tools
(AeronStat, ErrorStat, LossStat) read a slipstream driver's directory, and slipstream's tools read an
``aeronmd`` directory. slipstream's commands travel on the driver's socket (``driver.sock``), so its two
buffers stay small and idle; they are there because Aeron's readers find the driver's heartbeat in the
to-driver ring buffer's trailer (its consumer heartbeat), and so does slipstream now: one heartbeat, in
Aeron's place.

A slipstream driver marks its file in the header's padding (``SLIP`` and its layout version, after
Aeron's fields), and keeps its run state and its parked flag there too; in ``aeronmd``'s files those
bytes are zero.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ..errors import SlipstreamError
from . import broadcast, ringbuffer
from .counters import METADATA_LENGTH, VALUE_LENGTH, CountersManager, CountersReader
from .directory import CNC_FILE, close_mapping, map_file


def semantic_version(major: int, minor: int, patch: int) -> int:
    """Aeron's packing of a version in an i32: ``major << 16 | minor << 8 | patch``."""
    return (major & 0xFF) << 16 | (minor & 0xFF) << 8 | (patch & 0xFF)


def version_text(version: int) -> str:
    """A CnC version as Aeron's tools print it (``0.2.0``)."""
    return f"{(version >> 16) & 0xFF}.{(version >> 8) & 0xFF}.{version & 0xFF}"


CNC_VERSION: Final = semantic_version(0, 2, 0)
"""Aeron's CnC version, which slipstream writes; it reads any 0.2.x."""
HEADER_LENGTH: Final = 128
"""Aeron's ``AERON_CNC_VERSION_AND_META_DATA_LENGTH``: the header, padded to two cache lines."""
_HEADER = struct.Struct("<iiiiiiqqqi")
"""Aeron's fields: version, to-driver, to-clients, counters metadata, counters values and error log
lengths (i32), client liveness timeout (ns), start time (ms), pid (i64), page size (i32): 52 bytes."""

SLIPSTREAM_MARKER: Final = b"SLIP"
MARKER_OFFSET: Final = 56
"""In Aeron's padding: ``SLIP`` marks a file a slipstream driver wrote."""
LAYOUT_VERSION_OFFSET: Final = 60
SLIPSTREAM_LAYOUT_VERSION: Final = 2
"""Counts incompatible changes of what slipstream keeps in the padding (1 was the pre-Aeron layout)."""
_STATE_OFFSET: Final = 72
PARKED_INDEX: Final = 80 // 8
"""i64 slot of the header: 1 while the driver sleeps in ``select``; clients that give it UDP work
then ring its doorbell (a Wake message) instead of waiting out the sleep."""
_OLD_SLIPSTREAM_TOP_BYTE: Final = 0x53
"""'S': the top byte of the version slipstream wrote before it took Aeron's layout."""

TO_DRIVER_CAPACITY: Final = 64 * 1024
"""The to-driver ring buffer's capacity (plus its trailer): small, since commands use the socket."""
TO_CLIENTS_CAPACITY: Final = 64 * 1024
"""The to-clients broadcast buffer's capacity (plus its trailer)."""

STATE_STARTING: Final = 0
STATE_RUNNING: Final = 1
STATE_CLOSED: Final = 2

Flavour = Literal["slipstream", "aeron"]


class CncError(SlipstreamError, RuntimeError):
    """``cnc.dat`` is missing, too short or from an incompatible version."""


class CncStartingError(CncError):
    """``cnc.dat`` is being written (too short, or no version yet): its driver is starting; try again."""


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
    to_driver_buffer_length: int = 0
    to_clients_buffer_length: int = 0

    @property
    def version_text(self) -> str:
        return version_text(self.version)


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class CncFile:
    """A mapped ``cnc.dat`` of either driver: header, command buffers, counters and the error log."""

    def __init__(self, mapping: mmap.mmap, header: CncHeader, path: Path, flavour: Flavour) -> None:
        self.path = path
        self.flavour: Flavour = flavour
        self._mapping = mapping
        self.header = header
        view = memoryview(mapping)
        self._view = view
        self._i64 = view[:HEADER_LENGTH].cast("q")
        to_clients_start = HEADER_LENGTH + header.to_driver_buffer_length
        meta_start = to_clients_start + header.to_clients_buffer_length
        values_start = meta_start + header.counters_metadata_length
        error_start = values_start + header.counters_values_length
        self.to_driver_buffer = view[HEADER_LENGTH:to_clients_start]
        """The to-driver ring buffer: ``capacity`` bytes, then ``files.ringbuffer``'s trailer."""
        self.to_clients_buffer = view[to_clients_start:meta_start]
        """The to-clients broadcast buffer: ``capacity`` bytes, then ``files.broadcast``'s trailer."""
        self.counters_metadata = view[meta_start:values_start]
        self.counters_values = view[values_start:error_start]
        self.error_log = view[error_start : error_start + header.error_log_length]
        trailer = to_clients_start - ringbuffer.TRAILER_LENGTH
        self._to_driver_trailer = view[trailer:to_clients_start].cast("q")

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
        to_driver_capacity: int = TO_DRIVER_CAPACITY,
        to_clients_capacity: int = TO_CLIENTS_CAPACITY,
    ) -> CncFile:
        """A slipstream driver's file: Aeron's layout, marked as slipstream's, state ``starting``."""
        if not (_is_power_of_two(to_driver_capacity) and _is_power_of_two(to_clients_capacity)):
            raise ValueError(f"buffer capacities must be powers of two: {to_driver_capacity}, {to_clients_capacity}")
        header = CncHeader(
            CNC_VERSION,
            counters_capacity * METADATA_LENGTH,
            counters_capacity * VALUE_LENGTH,
            error_log_length,
            client_liveness_timeout_ns,
            start_timestamp_ms,
            pid,
            mmap.PAGESIZE,
            to_driver_capacity + ringbuffer.TRAILER_LENGTH,
            to_clients_capacity + broadcast.TRAILER_LENGTH,
        )
        length = (
            HEADER_LENGTH
            + header.to_driver_buffer_length
            + header.to_clients_buffer_length
            + header.counters_metadata_length
            + header.counters_values_length
            + error_log_length
        )
        length = -(-length // header.page_size) * header.page_size  # as Aeron: whole pages
        path = directory / CNC_FILE
        mapping = map_file(path, length, create=True)
        _HEADER.pack_into(
            mapping,
            0,
            0,
            header.to_driver_buffer_length,
            header.to_clients_buffer_length,
            header.counters_metadata_length,
            header.counters_values_length,
            error_log_length,
            client_liveness_timeout_ns,
            start_timestamp_ms,
            pid,
            header.page_size,
        )
        mapping[MARKER_OFFSET : MARKER_OFFSET + 4] = SLIPSTREAM_MARKER
        struct.pack_into("<i", mapping, LAYOUT_VERSION_OFFSET, SLIPSTREAM_LAYOUT_VERSION)
        cnc = cls(mapping, header, path, "slipstream")
        cnc.state = STATE_STARTING
        # The version goes last: a reader that sees it sees a complete header.
        struct.pack_into("<i", mapping, 0, CNC_VERSION)
        return cnc

    @classmethod
    def open(cls, directory: Path) -> CncFile:
        """Map the ``cnc.dat`` of ``directory``, written by a slipstream driver or by ``aeronmd``."""
        path = directory / CNC_FILE
        try:
            mapping = map_file(path)
        except FileNotFoundError:
            raise CncError(f"no media driver has run in {directory} (no {CNC_FILE})") from None
        except (ValueError, OSError) as exc:
            raise CncError(f"cannot map {path}: {exc}") from None
        try:
            header, flavour = _read_header(mapping, path)
        except CncError:
            close_mapping(mapping)
            raise
        return cls(mapping, header, path, flavour)

    def counters_reader(self) -> CountersReader:
        return CountersReader(self.counters_metadata, self.counters_values)

    def counters_manager(self) -> CountersManager:
        return CountersManager(self.counters_metadata, self.counters_values)

    @property
    def heartbeat_ms(self) -> int:
        """The driver's last heartbeat (ms since the epoch): the to-driver ring buffer's consumer heartbeat."""
        return int(self._to_driver_trailer[ringbuffer.CONSUMER_HEARTBEAT_OFFSET // 8])

    @heartbeat_ms.setter
    def heartbeat_ms(self, value: int) -> None:
        self._to_driver_trailer[ringbuffer.CONSUMER_HEARTBEAT_OFFSET // 8] = value

    @property
    def header_i64(self) -> memoryview:
        """The header as i64 slots (``PARKED_INDEX``), for hot paths that read one flag."""
        return self._i64

    @property
    def state(self) -> int:
        """``STATE_*`` of a slipstream driver. ``aeronmd`` keeps no state: its files read as running, and
        whether it still runs is for its heartbeat and its pid to tell."""
        if self.flavour == "aeron":
            return STATE_RUNNING
        return int(self._i64[_STATE_OFFSET // 8])

    @state.setter
    def state(self, value: int) -> None:
        if self.flavour != "slipstream":
            raise CncError(f"{self.path} belongs to an Aeron driver: slipstream records no state in it")
        self._i64[_STATE_OFFSET // 8] = value

    def close(self) -> None:
        views = (
            self.to_driver_buffer,
            self.to_clients_buffer,
            self.counters_metadata,
            self.counters_values,
            self.error_log,
            self._to_driver_trailer,
            self._i64,
            self._view,
        )
        for view in views:
            view.release()
        close_mapping(self._mapping)


def _read_header(mapping: mmap.mmap, path: Path) -> tuple[CncHeader, Flavour]:
    """Recognise the file's writer and check its sections; ``CncError`` says plainly what is wrong."""
    if len(mapping) < HEADER_LENGTH:
        raise CncStartingError(f"{path} is too short to be a driver file")
    fields = _HEADER.unpack_from(mapping, 0)
    version = fields[0]
    header = CncHeader(
        version, fields[3], fields[4], fields[5], fields[6], fields[7], fields[8], fields[9], fields[1], fields[2]
    )
    if version == 0:
        raise CncStartingError(f"{path} has no version yet: its driver is still starting")
    if (version >> 24) & 0xFF == _OLD_SLIPSTREAM_TOP_BYTE:
        raise CncError(
            f"{path} was written by an older slipstream (layout {version:#x}), before slipstream took Aeron's "
            f"CnC layout {version_text(CNC_VERSION)}: stop that driver or choose another --dir"
        )
    if (version >> 8) != (CNC_VERSION >> 8):
        raise CncError(
            f"{path} has CnC version {version_text(version)} ({version:#x}); this slipstream reads CnC version "
            f"{version_text(CNC_VERSION).rsplit('.', 1)[0]}.x (Aeron's {version_text(CNC_VERSION)}): "
            "a driver of another version owns this directory; stop it or choose another --dir"
        )
    flavour: Flavour = "aeron"
    if bytes(mapping[MARKER_OFFSET : MARKER_OFFSET + 4]) == SLIPSTREAM_MARKER:
        (layout,) = struct.unpack_from("<i", mapping, LAYOUT_VERSION_OFFSET)
        if layout != SLIPSTREAM_LAYOUT_VERSION:
            raise CncError(
                f"{path} was written by a slipstream of layout version {layout}, this slipstream needs "
                f"{SLIPSTREAM_LAYOUT_VERSION}: stop that driver or choose another --dir"
            )
        flavour = "slipstream"
    lengths = (
        header.to_driver_buffer_length,
        header.to_clients_buffer_length,
        header.counters_metadata_length,
        header.counters_values_length,
        header.error_log_length,
    )
    to_driver_capacity = header.to_driver_buffer_length - ringbuffer.TRAILER_LENGTH
    to_clients_capacity = header.to_clients_buffer_length - broadcast.TRAILER_LENGTH
    if (
        min(lengths) < 0
        or not _is_power_of_two(to_driver_capacity)
        or to_driver_capacity < ringbuffer.RECORD_HEADER_LENGTH
        or not _is_power_of_two(to_clients_capacity)
        or header.counters_metadata_length % METADATA_LENGTH
        or header.counters_values_length % VALUE_LENGTH
        or HEADER_LENGTH + sum(lengths) > len(mapping)
    ):
        raise CncError(f"{path} describes sections that do not fit the file")
    return header, flavour
