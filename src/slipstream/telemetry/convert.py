"""Raw capture files to rows: the conversion half of a stream capture, and recovery after a kill.

:class:`RawConverter` turns one capture's raw files (written by
:class:`~slipstream.telemetry.rawcapture.RawCapture`) into ``captured`` rows, and ``typed.<Type>`` rows
with a decoder, for a sink (a :class:`~slipstream.telemetry.recorder.Recorder`): runs of same-sized
messages with numpy in one go, anything else frame by frame. It runs wherever CPU is cheap: the
recorder's writer thread (``StreamCapture``), a process at idle priority (``slipstream record``), or
:func:`recover`, which finalizes what dead recorders and captures left. pyarrow and numpy are imported
only when a file is converted.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .rawcapture import RawBlock, RawContent, RawFile, raw_capture_dirs, raw_files, read_raw, remove_raw
from .records import CapturedMessage, KindSchema, typed_schema
from .segments import (
    LOCK_FILE,
    WriterLayout,
    arrow_schema,
    default_name,
    hour_of,
    journal_writer_dirs,
    legacy_writer_dirs,
    read_lock_info,
    recover_writer,
    table_from_rows,
    try_lock,
)

log = logging.getLogger("slipstream.telemetry")

Decoder = Callable[[bytes], object | None]
"""Payload -> a registered message (msgspec Struct or dataclass), or None when it is not one."""

_CAPTURED = CapturedMessage.SCHEMA


def load_decoder(spec: str) -> Decoder:
    """The decoder named ``MODULE:NAME`` (how ``slipstream record --decoder`` and recovery find it)."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"--decoder: expected MODULE:NAME, got {spec!r}")
    decoder: Decoder = getattr(importlib.import_module(module_name), name)
    return decoder


_HEADER_LENGTH = 32
_UNFRAGMENTED = 0xC0
_BEGIN = 0x80
_END = 0x40
_DATA = 0x01


@dataclass(slots=True)
class _Run:
    """Consecutive blocks of one image joined: one conversion for many polls' worth of frames."""

    session_id: int
    position: int
    data: bytes
    starts: list[int]
    """Offset in ``data`` where each block began, and each block's poll time: a frame's timestamp."""
    stamps: list[int]


def _runs(blocks: list[RawBlock]) -> list[_Run]:
    runs: list[_Run] = []
    parts: list[list[bytes | memoryview]] = []
    ends: list[int] = []
    for block in blocks:
        index = next((i for i in range(len(runs) - 1, -1, -1) if runs[i].session_id == block.session_id), None)
        if index is not None and ends[index] == block.position:
            run = runs[index]
            run.starts.append(ends[index] - run.position)
            run.stamps.append(block.timestamp_ns)
            parts[index].append(block.data)
            ends[index] += len(block.data)
            continue
        runs.append(_Run(block.session_id, block.position, b"", [0], [block.timestamp_ns]))
        parts.append([block.data])
        ends.append(block.position + len(block.data))
    for run, chunks in zip(runs, parts, strict=True):
        run.data = bytes(chunks[0]) if len(chunks) == 1 else b"".join(chunks)
    return runs


class _Sink(Protocol):
    """Where converted rows go: a :class:`Recorder`, or recovery's segment writer."""

    def extend_table(self, schema: KindSchema, table: Any, *, bounded: bool = True) -> bool: ...

    def extend(self, schema: KindSchema, rows: list[tuple[object, ...]]) -> bool: ...


class RawConverter:
    """Turns one capture's raw files, in order, into ``captured`` rows of ``sink`` (with a decoder, also
    ``typed.<Type>`` rows with the message's fields as typed columns).

    Runs of same-sized unfragmented messages are converted with numpy in one go, anything else frame
    by frame (mixed sizes, padding, fragmented messages reassembled per session, across files). A file
    is deleted by :meth:`durable`, which the sink's owner calls once what was converted is on disk; a
    file in which a still-incomplete message began is kept until it completes, so a recovery that
    re-reads it reassembles the message (rows already durable are skipped by position).
    """

    def __init__(self, raw_dir: str | Path, sink: _Sink, *, decoder: Decoder | None = None) -> None:
        self.raw_dir = Path(raw_dir)
        self.sink = sink
        self.decoder = decoder
        self.messages = 0
        """Messages converted and handed to the sink so far."""
        self.bytes = 0
        self.dropped = 0
        """Messages the sink refused."""
        self.files = 0
        self._typed: dict[type[Any], tuple[KindSchema, tuple[str, ...]]] = {}
        self._partial: dict[int, bytearray] = {}
        self._partial_since: dict[int, int] = {}
        """Per session with an incomplete message: the raw file (seq) where it began."""
        self._seq = 0
        self._lock = threading.Lock()
        self._done: set[int] = set()
        self._converted: list[RawFile] = []
        """Converted since the last flush hook: their rows are in the sink, maybe not durable yet."""
        self._flushing: list[RawFile] = []
        """Converted before the flush in progress: durable once it succeeds."""
        self._kept: list[RawFile] = []

    def convert(self, *, final: bool = False) -> int:
        """Convert the rotated raw files not converted yet (with ``final``, the one being written too:
        its writer is gone); returns how many files that was."""
        with self._lock:
            converted = 0
            for raw in raw_files(self.raw_dir):
                if raw.seq in self._done or not (raw.closed or final):
                    continue
                content = read_raw(raw.path)
                self._seq = raw.seq
                self._done.add(raw.seq)
                self._converted.append(raw)
                converted += 1
                if content is not None and content.blocks:
                    self._convert(content)
            self.files += converted
            return converted

    def flush_hook(self) -> None:
        """For ``Recorder.add_flush_hook``: convert, and mark what was converted as this flush's."""
        self.convert()
        with self._lock:
            self._flushing.extend(self._converted)
            self._converted = []

    def durable(self) -> None:
        """The flush that followed :meth:`flush_hook` made its rows durable: delete those raw files, but
        those where a still-incomplete message began, and later ones (a recovery re-reads them)."""
        with self._lock:
            self._kept.extend(self._flushing)
            self._flushing = []
            oldest = min(self._partial_since.values(), default=None)
            for raw in self._kept:
                if oldest is None or raw.seq < oldest:
                    remove_raw(raw)
            self._kept = [raw for raw in self._kept if oldest is not None and raw.seq >= oldest]

    def _convert(self, content: RawContent) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        tables = [self._block_table(run, content) for run in _runs(content.blocks)]
        kept = [t for t in tables if t is not None]
        if not kept:
            return
        table = pa.concat_tables(kept)
        if self.decoder is not None:
            table = self._decode(table)
        self.messages += table.num_rows
        self.bytes += int(pc.sum(table.column("size")).as_py() or 0)
        if not self.sink.extend_table(_CAPTURED, table, bounded=False):
            self.dropped += table.num_rows

    def _columns(
        self, run: _Run, content: RawContent, frame_offsets: Any, positions: Any, sizes: Any, payloads: Any
    ) -> Any:
        import numpy as np
        import pyarrow as pa

        n = len(positions)
        block_index = np.searchsorted(np.asarray(run.starts, dtype=np.int64), frame_offsets, side="right") - 1
        timestamps = np.asarray(run.stamps, dtype=np.int64)[block_index]
        return pa.Table.from_arrays(
            [
                pa.array(timestamps, pa.int64()),
                pa.repeat(pa.scalar(content.channel, pa.string()), n),  # constants: no Python list per row
                pa.repeat(pa.scalar(content.stream_id, pa.int64()), n),
                pa.repeat(pa.scalar(run.session_id, pa.int64()), n),
                pa.array(positions, pa.int64()),
                pa.array(sizes, pa.int64()),
                payloads,
                pa.nulls(n, pa.string()),
            ],
            schema=_captured_arrow(),
        )

    def _block_table(self, block: _Run, content: RawContent) -> Any:
        import numpy as np
        import pyarrow as pa

        data = block.data
        first = int.from_bytes(data[0:4], "little", signed=True)
        aligned = (first + 31) & -32
        if first > _HEADER_LENGTH and len(data) % aligned == 0 and block.session_id not in self._partial:
            n = len(data) // aligned
            headers = np.ndarray((n,), dtype=_header_dtype(), buffer=data, strides=(aligned,))
            if (
                (headers["length"] == first).all()
                and (headers["flags"] == _UNFRAGMENTED).all()
                and (headers["type"] == _DATA).all()
            ):
                frames = np.frombuffer(data, dtype=np.uint8).reshape(n, aligned)
                size = first - _HEADER_LENGTH
                payload = np.ascontiguousarray(frames[:, _HEADER_LENGTH:first])
                value_offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
                payloads = pa.BinaryArray.from_buffers(
                    pa.binary(), n, [None, pa.py_buffer(value_offsets), pa.py_buffer(payload)]
                )
                offsets = aligned * np.arange(n, dtype=np.int64)
                positions = block.position + aligned + offsets
                return self._columns(block, content, offsets, positions, np.full(n, size, dtype=np.int64), payloads)
        return self._walk(block, content)

    def _walk(self, block: _Run, content: RawContent) -> Any:
        """Frame by frame: mixed sizes, padding, fragmented messages (reassembled per session)."""
        import pyarrow as pa

        data = block.data
        positions: list[int] = []
        payloads: list[bytes] = []
        starts: list[int] = []
        offset = 0
        end = len(data)
        while offset + _HEADER_LENGTH <= end:
            length = int.from_bytes(data[offset : offset + 4], "little", signed=True)
            if length < _HEADER_LENGTH or offset + length > end:
                break  # cannot happen for frames a block poll delivered; stop rather than misread
            aligned = (length + 31) & -32
            flags = data[offset + 5]
            frame_type = data[offset + 6]
            payload = data[offset + _HEADER_LENGTH : offset + length]
            frame_offset = offset
            offset += aligned
            if frame_type != _DATA:
                continue  # padding
            if flags & _UNFRAGMENTED == _UNFRAGMENTED:
                positions.append(block.position + offset)
                payloads.append(payload)
                starts.append(frame_offset)
            elif flags & _BEGIN:
                self._partial[block.session_id] = bytearray(payload)
                self._partial_since[block.session_id] = self._seq
            else:
                partial = self._partial.get(block.session_id)
                if partial is None:
                    continue  # joined mid-message: the start was before this capture
                partial += payload
                if flags & _END:
                    positions.append(block.position + offset)
                    payloads.append(bytes(self._partial.pop(block.session_id)))
                    del self._partial_since[block.session_id]
                    starts.append(frame_offset)
        if not payloads:
            return None
        sizes = [len(p) for p in payloads]
        return self._columns(block, content, starts, positions, sizes, pa.array(payloads, pa.binary()))

    def _decode(self, table: Any) -> Any:
        import pyarrow as pa

        assert self.decoder is not None
        names: list[str | None] = []
        typed_rows: dict[type[Any], list[tuple[object, ...]]] = {}
        base = table.select(list(_CAPTURED.names[:6])).to_pylist()
        for row, payload in zip(base, table.column("payload").to_pylist(), strict=True):
            message = self.decoder(payload)
            if message is None:
                names.append(None)
                continue
            typed = self._typed.get(type(message))
            if typed is None:
                schema = typed_schema(type(message))
                typed = self._typed[type(message)] = (schema, schema.names[6:])  # after the capture columns
            names.append(typed[0].kind.removeprefix("typed."))
            typed_rows.setdefault(type(message), []).append(
                (*row.values(), *(getattr(message, name) for name in typed[1]))
            )
        for cls, rows in typed_rows.items():
            self.sink.extend(self._typed[cls][0], rows)  # bounded: typed rows are Python tuples
        index = table.schema.get_field_index("message_type")
        return table.set_column(index, "message_type", pa.array(names, pa.string()))


class _SegmentSink:
    """Recovery's sink: each kind's rows become one finalized segment after the writer's last, minus
    rows a conversion before the kill already made durable (at or below the kind's last position per
    channel, stream and session: a raw file deleted just after its rows were written, or kept for an
    incomplete message, is converted once)."""

    def __init__(self, layout: WriterLayout, hour: str, fsync: bool) -> None:
        self.layout = layout
        self.hour = hour
        self.fsync = fsync
        self.kinds: dict[str, tuple[KindSchema, list[Any], list[tuple[object, ...]]]] = {}

    def extend_table(self, schema: KindSchema, table: Any, *, bounded: bool = True) -> bool:
        self.kinds.setdefault(schema.kind, (schema, [], []))[1].append(table)
        return True

    def extend(self, schema: KindSchema, rows: list[tuple[object, ...]]) -> bool:
        self.kinds.setdefault(schema.kind, (schema, [], []))[2].extend(rows)
        return True

    def write(self) -> int:
        import pyarrow as pa

        made = 0
        for schema, tables, rows in self.kinds.values():
            arrow = arrow_schema(schema, self.layout.writer)
            parts = [table_from_rows(arrow, rows)] if rows else []
            parts.extend(t.cast(arrow) for t in tables)
            table = _above_floors(pa.concat_tables(parts), [f.path for f in self.layout.finalized(schema.kind)])
            if table.num_rows == 0:
                continue
            host = read_lock_info(self.layout.directory).get("name") or default_name()
            seq = self.layout.next_seq(schema.kind)
            self.layout.write(table, schema.kind, seq, self.hour, host, fsync=self.fsync)
            made += 1
        return made


def _above_floors(table: Any, paths: list[Path]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    keys = ["channel", "stream_id", "session_id"]
    segments = [pq.read_table(path, columns=[*keys, "position"]) for path in paths]
    if not segments:
        return table
    floors = pa.concat_tables(segments).group_by(keys).aggregate([("position", "max")]).to_pylist()
    keep = pa.array([True] * table.num_rows)
    for floor in floors:
        seen = pc.and_(
            pc.and_(pc.equal(table["channel"], floor["channel"]), pc.equal(table["stream_id"], floor["stream_id"])),
            pc.and_(pc.equal(table["session_id"], floor["session_id"]),
                    pc.less_equal(table["position"], floor["position_max"])),
        )  # fmt: skip
        keep = pc.and_(keep, pc.invert(seen))
    return table.filter(keep)


def recover_raw(layout: WriterLayout, *, fsync: bool = True) -> int:
    """Convert the raw files a dead capture left in the writer's directory into finalized segments (typed
    too, when the capture's decoder is importable; in the partition of the hour the first was written) and
    delete them; captures still writing (their directory is locked) are left alone. Returns how many
    segments that made."""
    made = 0
    for raw_dir in raw_capture_dirs(layout.directory):
        lock = try_lock(raw_dir)
        if lock is None:
            continue
        try:
            files = raw_files(raw_dir)
            if files:
                first = read_raw(files[0].path)
                decoder = None
                if first is not None and first.decoder:
                    try:
                        decoder = load_decoder(first.decoder)
                    except (ImportError, AttributeError, ValueError):
                        log.warning("recovering %s: decoder %s not importable; no typed rows", raw_dir, first.decoder)
                sink = _SegmentSink(layout, hour_of(files[0].path.stat().st_mtime), fsync)
                RawConverter(raw_dir, sink, decoder=decoder).convert(final=True)
                made += sink.write()
                for raw in files:
                    remove_raw(raw)
            with contextlib.suppress(OSError):
                (raw_dir / LOCK_FILE).unlink()
                raw_dir.rmdir()
        finally:
            os.close(lock)
    return made


def recover(root: Path | str, *, fsync: bool = True) -> int:
    """Finalize what dead recorders left under a recording root: their journals, then their captures'
    raw files; live writers are left alone. Returns how many segments it made. Safe to call at any
    time, from any process that may write the recording (it takes each dead writer's lock); readers
    never call it: a :class:`~slipstream.telemetry.reader.Recording` reads what is finalized."""
    root = Path(root)
    layouts = [WriterLayout(root, d.name) for d in journal_writer_dirs(root)]
    layouts += [WriterLayout(root, d.name, legacy=True) for d in legacy_writer_dirs(root)]
    made = 0
    for layout in layouts:
        fd = try_lock(layout.directory)
        if fd is None:
            continue
        try:
            made += recover_writer(layout, fsync=fsync)
            made += recover_raw(layout, fsync=fsync)
        finally:
            os.close(fd)
    return made


@functools.cache
def _captured_arrow() -> Any:
    return arrow_schema(_CAPTURED)


@functools.cache
def _header_dtype() -> Any:
    """Aeron's data frame header as a numpy record (numpy is imported only when a capture converts)."""
    import numpy as np

    return np.dtype(
        [("length", "<i4"), ("version", "u1"), ("flags", "u1"), ("type", "<u2"), ("term_offset", "<i4"),
         ("session_id", "<i4"), ("stream_id", "<i4"), ("term_id", "<i4"), ("reserved", "<i8")]
    )  # fmt: skip
