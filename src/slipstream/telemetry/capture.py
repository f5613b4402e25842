"""Stream capture (an Aeron-Archive-like recording of any stream) and the driver-files sampler.

``StreamCapture`` is one more subscriber on the stream: it copies each whole message into a row and
hands the poll's rows to the recorder in one call; Arrow and disk happen on the recorder's thread.
A capture that falls behind holds the publisher back only as any slow subscriber would (flow
control), which is what the recording-overhead benchmark measures.

``DriverSampler`` reads the driver's files (counters, loss report, error log) on a thread at a
fixed interval: every counter each time, loss and error entries when their count changed.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..client import Context, Subscription
from ..files.observe import TYPE_NAMES as COUNTER_TYPE_NAMES
from ..files.observe import NoDriverError, counters, errors, loss, parse_stream_label
from .recorder import Recorder
from .records import CapturedMessage, CounterSample, ErrorSample, KindSchema, LossSample, typed_schema
from .segments import arrow_schema

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


_HEADER_LENGTH = 32
_UNFRAGMENTED = 0xC0
_BEGIN = 0x80
_END = 0x40
_DATA = 0x01


@dataclass(slots=True)
class _Block:
    """Whole frames copied out of one image's term at one poll: converted later, on the writer thread."""

    timestamp_ns: int
    session_id: int
    position: int
    """Stream position of the block's first byte."""
    data: bytes


@dataclass(slots=True)
class _Run:
    """Consecutive blocks of one image joined: one conversion for many polls' worth of frames."""

    session_id: int
    position: int
    data: bytes
    starts: list[int]
    """Offset in ``data`` where each block began, and each block's poll time: a frame's timestamp."""
    stamps: list[int]


def _runs(blocks: list[_Block]) -> list[_Run]:
    runs: list[_Run] = []
    parts: list[list[bytes]] = []
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
        run.data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return runs


class StreamCapture:
    """Records every message of ``channel``/``stream_id`` into ``recorder`` (kind ``captured``); with a
    decoder, recognised messages also go to ``typed.<Type>`` with their fields as typed columns.

    The hot path is a block poll: each image's new frames are copied in one piece per poll (no call
    per message). The recorder's writer thread turns blocks into columns (vectorized with numpy for
    runs of same-sized messages, frame by frame otherwise, reassembling fragmented messages), so the
    capture keeps up with a fast stream. When ``max_pending_bytes`` of blocks wait for the writer the
    capture stops reading, so a recorder that cannot keep up slows the publisher through flow control
    (like any slow subscriber) rather than losing messages or growing without bound.
    """

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        recorder: Recorder,
        *,
        decoder: Decoder | None = None,
        block_length_limit: int = 1 << 20,
        max_pending_bytes: int = 64 << 20,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.recorder = recorder
        self.decoder = decoder
        self.block_length_limit = block_length_limit
        self.max_pending_bytes = max_pending_bytes
        self.messages = 0
        """Messages converted and handed to the recorder so far (lags the stream by up to a flush)."""
        self.bytes = 0
        self.dropped = 0
        """Messages the recorder refused (its pending-row bound was reached)."""
        self.backlogged_polls = 0
        """Polls skipped because ``max_pending_bytes`` of blocks were waiting (the capture was behind)."""
        self._typed: dict[type[Any], tuple[KindSchema, tuple[str, ...]]] = {}
        self._lock = threading.Lock()
        self._convert_lock = threading.Lock()
        self._blocks: list[_Block] = []
        self._pending_bytes = 0
        self._flush_requested = False
        self._partial: dict[int, bytearray] = {}
        self._now = 0
        self._image_position = 0
        self.subscription: Subscription = context.add_subscription(channel, stream_id)
        recorder.add_flush_hook(self.convert)

    def _on_block(self, block: memoryview, session_id: int, term_id: int) -> None:
        copied = _Block(self._now, session_id, self._image_position, bytes(block))
        with self._lock:
            self._blocks.append(copied)
            self._pending_bytes += len(block)

    def poll(self, fragment_limit: int = 0) -> int:
        """Copy what every image has new; returns the bytes read (0 while the writer is behind).

        ``fragment_limit`` is accepted for symmetry with ``Subscription.poll`` and ignored: a block poll
        reads up to ``block_length_limit`` bytes per image."""
        if self._pending_bytes >= self.max_pending_bytes:
            self.backlogged_polls += 1
            return 0
        self._now = time.time_ns()
        read = 0
        for image in self.subscription.images:
            self._image_position = image.position
            read += image.block_poll(self._on_block, self.block_length_limit)
        if self._pending_bytes >= self.max_pending_bytes >> 2 and not self._flush_requested:
            self._flush_requested = True  # a fast stream: convert before the backlog stops the capture
            self.recorder.request_flush()
        return read

    def convert(self) -> None:
        """Turn the waiting blocks into rows for the recorder (the recorder's writer thread calls this
        before each flush; call it yourself to see ``messages`` up to date)."""
        with self._convert_lock:
            with self._lock:
                blocks, self._blocks = self._blocks, []
                self._pending_bytes = 0
                self._flush_requested = False
            if not blocks:
                return
            import pyarrow as pa
            import pyarrow.compute as pc

            tables = [self._block_table(run) for run in _runs(blocks)]
            kept = [t for t in tables if t is not None]
            if not kept:
                return
            table = pa.concat_tables(kept)
            if self.decoder is not None:
                table = self._decode(table)
            self.messages += table.num_rows
            self.bytes += int(pc.sum(table.column("size")).as_py() or 0)
            if not self.recorder.extend_table(_CAPTURED, table, bounded=False):
                self.dropped += table.num_rows

    def _columns(self, run: _Run, frame_offsets: Any, positions: Any, sizes: Any, payloads: Any) -> Any:
        import numpy as np
        import pyarrow as pa

        n = len(positions)
        block_index = np.searchsorted(np.asarray(run.starts, dtype=np.int64), frame_offsets, side="right") - 1
        timestamps = np.asarray(run.stamps, dtype=np.int64)[block_index]
        return pa.Table.from_arrays(
            [
                pa.array(timestamps, pa.int64()),
                pa.repeat(pa.scalar(self.channel, pa.string()), n),  # constants: no Python list per row
                pa.repeat(pa.scalar(self.stream_id, pa.int64()), n),
                pa.repeat(pa.scalar(run.session_id, pa.int64()), n),
                pa.array(positions, pa.int64()),
                pa.array(sizes, pa.int64()),
                payloads,
                pa.nulls(n, pa.string()),
            ],
            schema=_captured_arrow(),
        )

    def _block_table(self, block: _Run) -> Any:
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
                return self._columns(block, offsets, positions, np.full(n, size, dtype=np.int64), payloads)
        return self._walk(block)

    def _walk(self, block: _Run) -> Any:
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
        return self._columns(block, starts, positions, sizes, pa.array(payloads, pa.binary()))

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
            self.recorder.extend(self._typed[cls][0], rows)  # bounded: typed rows are Python tuples
        index = table.schema.get_field_index("message_type")
        return table.set_column(index, "message_type", pa.array(names, pa.string()))

    def run(self, stop: threading.Event, *, idle_s: float = 0.001) -> None:
        """Poll until ``stop`` is set, sleeping ``idle_s`` when there was nothing to read."""
        while not stop.is_set():
            if self.poll() == 0:
                stop.wait(idle_s)

    def close(self) -> None:
        """Stop capturing; what was read is converted now (the recorder's close writes it)."""
        self.subscription.close()
        self.recorder.remove_flush_hook(self.convert)
        self.convert()


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
