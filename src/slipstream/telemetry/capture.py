"""Stream capture (an Aeron-Archive-like recording of any stream) and the driver-files sampler.

A capture has two halves that never share a CPU's time slice if they can help it. The hot side,
:class:`~slipstream.telemetry.rawcapture.RawCapture`, writes the stream's term bytes to raw files and
does nothing else. :class:`RawConverter` turns raw files into ``captured`` rows (and ``typed.<Type>``
rows with a decoder) for a recorder, vectorized with numpy, wherever CPU is cheap: the recorder's writer
thread (:class:`StreamCapture`, one process), a low-priority process (``slipstream record``), or the
recovery after a kill (:func:`recover_raw`). A raw file is deleted only once its rows are durable.

``DriverSampler`` reads the driver's files (counters, loss report, error log) on a thread at a
fixed interval: every counter each time, loss and error entries when their count changed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import threading
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..client import Context, Subscription
from ..files.observe import TYPE_NAMES as COUNTER_TYPE_NAMES
from ..files.observe import NoDriverError, counters, errors, loss, parse_stream_label
from .rawcapture import RAW_DIR, RawBlock, RawCapture, RawContent, raw_capture_dirs, raw_files, read_raw
from .recorder import Recorder
from .records import CapturedMessage, CounterSample, ErrorSample, KindSchema, LossSample, typed_schema
from .segments import LOCK_FILE, arrow_schema, finalized_segments, table_from_rows, try_lock, write_segment

log = logging.getLogger("slipstream.telemetry")

Decoder = Callable[[bytes], object | None]
"""Payload -> a registered message (msgspec Struct or dataclass), or None when it is not one."""

_CAPTURED = CapturedMessage.SCHEMA


def msgspec_decoder(*types: type[Any]) -> Decoder:
    """A decoder for msgpack payloads of tagged msgspec Structs; anything else decodes to None."""
    import msgspec

    if not types:
        raise ValueError("msgspec_decoder needs at least one message type")
    decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
        typing.Union[types] if len(types) > 1 else types[0]  # noqa: UP007 - a runtime union of types
    )

    def decode(payload: bytes) -> object | None:
        try:
            message: object = decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        return message

    return decode


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
        self._lock = threading.Lock()
        self._done: set[int] = set()
        self._converted: list[Path] = []
        """Converted since the last flush hook: their rows are in the sink, maybe not durable yet."""
        self._flushing: list[Path] = []
        """Converted before the flush in progress: durable once it succeeds."""
        self._kept: list[Path] = []

    def convert(self, *, final: bool = False) -> int:
        """Convert the rotated raw files not converted yet (with ``final``, the one being written too:
        its writer is gone); returns how many files that was."""
        with self._lock:
            converted = 0
            for raw in raw_files(self.raw_dir):
                if raw.seq in self._done or not (raw.closed or final):
                    continue
                content = read_raw(raw.path)
                self._done.add(raw.seq)
                self._converted.append(raw.path)
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
        """The flush that followed :meth:`flush_hook` made its rows durable: delete those raw files."""
        with self._lock:
            self._kept.extend(self._flushing)
            self._flushing = []
            if self._partial:
                return  # a message begun in a kept file is incomplete: a recovery needs its start
            for path in self._kept:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self._kept = []

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
            else:
                partial = self._partial.get(block.session_id)
                if partial is None:
                    continue  # joined mid-message: the start was before this capture
                partial += payload
                if flags & _END:
                    positions.append(block.position + offset)
                    payloads.append(bytes(self._partial.pop(block.session_id)))
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


class StreamCapture:
    """Records every message of ``channel``/``stream_id`` into ``recorder`` (kind ``captured``); with a
    decoder, recognised messages also go to ``typed.<Type>`` with their fields as typed columns.

    One process: a :class:`RawCapture` writes the term bytes into ``<writer_dir>/.raw/capture-<n>/``
    and the recorder's writer thread converts them before each flush (:class:`RawConverter`). Call
    :meth:`poll` (or :meth:`run`) from your thread. Nothing read is lost: a kill leaves raw files that
    the next recorder on the same root converts. When ``max_pending_bytes`` of raw files wait for
    conversion the capture stops reading, so a recorder that cannot keep up slows the publisher
    through flow control (like any slow subscriber). ``slipstream record`` runs the same two halves in
    two processes, the converter at idle priority.
    """

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        recorder: Recorder,
        *,
        decoder: Decoder | None = None,
        block_length_limit: int = 8 << 20,
        max_pending_bytes: int = 1 << 30,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.recorder = recorder
        self.decoder = decoder
        self.raw = RawCapture(
            context, channel, stream_id, new_capture_dir(recorder.writer_dir),
            block_length_limit=block_length_limit, max_pending_bytes=max_pending_bytes,
            flush_interval_s=recorder.config.flush_interval_s, fsync=recorder.config.fsync,
            on_rotate=lambda seq: recorder.request_flush(),
        )  # fmt: skip
        self.converter = RawConverter(self.raw.raw_dir, recorder, decoder=decoder)
        self.subscription: Subscription = self.raw.subscription
        recorder.add_flush_hook(self._flush_hook, after=self.converter.durable)

    @property
    def messages(self) -> int:
        """Messages converted and handed to the recorder so far (lags the stream by up to a flush)."""
        return self.converter.messages

    @property
    def bytes(self) -> int:
        return self.converter.bytes

    @property
    def dropped(self) -> int:
        """Messages the recorder refused."""
        return self.converter.dropped

    @property
    def backlogged_polls(self) -> int:
        """Polls skipped because ``max_pending_bytes`` of raw files waited for conversion."""
        return self.raw.backlogged_polls

    def poll(self, fragment_limit: int = 0) -> int:
        """Write what every image has new to the raw file; returns the bytes read (0 while backlogged)."""
        return self.raw.poll(fragment_limit)

    def _flush_hook(self) -> None:
        self.raw.rotate()
        self.converter.flush_hook()

    def convert(self) -> None:
        """Convert what was read so far (the recorder's writer thread does this before each flush; call
        it yourself to see ``messages`` up to date)."""
        self.raw.rotate()
        self.converter.convert()

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set (see :meth:`RawCapture.run`: large polls, sleeps sized to the window)."""
        self.raw.run(stop)

    def close(self) -> None:
        """Stop capturing; what was read is converted and flushed now (unless the recorder is closed
        already: then the raw files stay for the next recorder's recovery)."""
        self.raw.close()
        if not self.recorder.closed:
            self.recorder.flush()
        self.recorder.remove_flush_hook(self._flush_hook)


def new_capture_dir(writer_dir: Path) -> Path:
    """A fresh ``<writer_dir>/.raw/capture-<n>`` for one capture."""
    base = writer_dir / RAW_DIR
    base.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        path = base / f"capture-{n}"
        try:
            path.mkdir()
        except FileExistsError:
            n += 1
            continue
        return path


class _SegmentSink:
    """Recovery's sink: each kind's rows become one finalized segment after the writer's last, minus
    rows a conversion before the kill already made durable (at or below the kind's last position per
    channel, stream and session: a raw file deleted just after its rows were written, or kept for an
    incomplete message, is converted once)."""

    def __init__(self, writer_dir: Path, fsync: bool) -> None:
        self.writer_dir = writer_dir
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
            arrow = arrow_schema(schema, self.writer_dir.name)
            parts = [table_from_rows(arrow, rows)] if rows else []
            parts.extend(t.cast(arrow) for t in tables)
            kind_dir = self.writer_dir / schema.kind
            table = _above_floors(pa.concat_tables(parts), kind_dir)
            if table.num_rows == 0:
                continue
            kind_dir.mkdir(parents=True, exist_ok=True)
            seq = max((seq for seq, _ in finalized_segments(kind_dir)), default=-1) + 1
            write_segment(table, kind_dir, seq, fsync=self.fsync)
            made += 1
        return made


def _above_floors(table: Any, kind_dir: Path) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    keys = ["channel", "stream_id", "session_id"]
    segments = [pq.read_table(path, columns=[*keys, "position"]) for _, path in finalized_segments(kind_dir)]
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


def recover_raw(writer_dir: Path, *, fsync: bool = True) -> int:
    """Convert the raw files a dead capture left in ``writer_dir`` into finalized segments (typed too,
    when the capture's decoder is importable) and delete them; captures still writing (their directory
    is locked) are left alone. Returns how many segments that made."""
    made = 0
    for raw_dir in raw_capture_dirs(writer_dir):
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
                sink = _SegmentSink(writer_dir, fsync)
                RawConverter(raw_dir, sink, decoder=decoder).convert(final=True)
                made += sink.write()
                for raw in files:
                    raw.path.unlink()
            with contextlib.suppress(OSError):
                (raw_dir / LOCK_FILE).unlink()
                raw_dir.rmdir()
        finally:
            os.close(lock)
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


class DriverSampler:
    """Samples a driver's counters, loss report and error log into a recorder every ``interval_s``."""

    def __init__(self, recorder: Recorder, driver_dir: str | Path, *, interval_s: float = 1.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive: {interval_s}")
        self.recorder = recorder
        self.driver_dir = Path(driver_dir)
        self.interval_s = interval_s
        self.samples = 0
        self._loss_seen: dict[tuple[int, int, str, str], int] = {}
        self._errors_seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Take one sample now (the thread calls this; tests may too)."""
        now = time.time_ns()
        driver = str(self.driver_dir)
        try:
            snapshot = counters(self.driver_dir)
            losses = loss(self.driver_dir)
            logged = errors(self.driver_dir)
        except NoDriverError:
            return
        rows: list[tuple[object, ...]] = []
        for info in snapshot:
            label = parse_stream_label(info.label)
            rows.append(
                CounterSample(
                    now,
                    driver,
                    info.counter_id,
                    info.type_id,
                    COUNTER_TYPE_NAMES.get(info.type_id, str(info.type_id)),
                    info.label,
                    info.value,
                    info.registration_id,
                    label.session_id if label else None,
                    label.stream_id if label else None,
                    label.channel if label else None,
                ).row()
            )
        self.recorder.extend(CounterSample.SCHEMA, rows)
        for entry in losses:
            key = (entry.session_id, entry.stream_id, entry.channel, entry.source)
            if self._loss_seen.get(key) != entry.observation_count:
                self._loss_seen[key] = entry.observation_count
                self.recorder.record(
                    LossSample(
                        now,
                        driver,
                        entry.observation_count,
                        entry.total_bytes_lost,
                        entry.first_observation_ms,
                        entry.last_observation_ms,
                        entry.session_id,
                        entry.stream_id,
                        entry.channel,
                        entry.source,
                    )
                )
        for error in logged:
            if self._errors_seen.get(error.text) != error.observation_count:
                self._errors_seen[error.text] = error.observation_count
                self.recorder.record(
                    ErrorSample(
                        now,
                        driver,
                        error.observation_count,
                        error.first_observation_ms,
                        error.last_observation_ms,
                        error.text,
                    )
                )
        self.samples += 1

    def start(self) -> DriverSampler:
        """Sample every ``interval_s`` on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="slipstream-driver-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:
                log.exception("driver sampler: sample failed")

    def stop(self) -> None:
        """Stop the thread after one last sample, so a short run still records the final values."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.sample()
        except Exception:
            log.exception("driver sampler: last sample failed")
