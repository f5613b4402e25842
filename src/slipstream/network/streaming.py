"""Large messages and files as streams of frames, with bounded memory on both sides (sans-I/O).

A payload too large for one transport message (any frame: a MESSAGE, a SYNC_REQUEST, an RMI request
or response) or the contents of a file travel as:

- ``STREAM_START`` (request id = stream id): ``flags u8 | inner kind u8 | inner request id u32 |
  total size u64`` + the file's name (UTF-8, at most 255 bytes; files only);
- ``STREAM_CHUNK`` (request id = stream id): ``offset u64`` + data, in order, no gaps;
- ``STREAM_END`` (request id = stream id): ``status u8`` then, for FINISHED, ``total u64 | SHA-256``;
  for ABORTED (the sender gave up) or REFUSED (the *receiver* refuses the stream, sent back to the
  sender under the sender's stream id) a UTF-8 reason.

The receiver refuses an announced size above ``max_stream_size`` and more than ``max_incoming``
concurrent streams before allocating anything; it grows an in-memory buffer only as bytes arrive, and a
stream larger than ``spill_threshold`` (or a file, or one that would push all in-memory streams past
that budget) goes to a temporary file, removed when the stream fails, on close, or when the
application releases it. Events report starts, progress, completions and failures on both sides.

The only I/O is in :class:`SpillFile` (writes) and :class:`FileSource` (reads of a file being sent);
everything else is frames in, frames and events out, with ``now_ns`` for the idle timeout.

How a connection composes it: a frame payload with :meth:`Streams.needs_streaming` goes to
:meth:`Streams.send` (a ``pathlib.Path`` message to :meth:`Streams.send_file`) instead of the batch;
STREAM_* frames that arrive go to :meth:`Streams.receive`; :meth:`Streams.take_frames` as the transport
drains (it bounds how much is read and queued at once); a :class:`StreamCompleted` is handled as the
frame it carries (a file as a message whose value is the path), then :meth:`Streams.release`;
``deadline_ns``/``handle_timer`` join the connection's; :meth:`Streams.close` when it closes.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Final

from .errors import NetworkError
from .frames import FrameKind

__all__ = [
    "DEFAULT_MAX_STREAM_SIZE",
    "DEFAULT_SPILL_THRESHOLD",
    "FileSource",
    "SpillFile",
    "StreamCompleted",
    "StreamFailed",
    "StreamFailure",
    "StreamProgressed",
    "StreamSent",
    "StreamStarted",
    "Streams",
    "StreamingError",
    "StreamEvent",
]

DEFAULT_SPILL_THRESHOLD: Final = 16 * 1024 * 1024
"""The seed's ``maxStreamSizeInMemoryMB`` default: 16 MiB kept in memory, more goes to a file."""
DEFAULT_MAX_STREAM_SIZE: Final = 4 * 1024**3
"""Largest announced stream accepted by default (4 GiB)."""
DEFAULT_IDLE_TIMEOUT_NS: Final = 30_000_000_000
DEFAULT_PROGRESS_STEP: Final = 1024 * 1024

_START: Final = struct.Struct(">BBIQ")
_OFFSET: Final = struct.Struct(">Q")
_FINISHED_BODY: Final = struct.Struct(">Q32s")
_FLAG_FILE: Final = 0x01
_MAX_NAME: Final = 255
_MAX_REASON: Final = 200
_SENT_REMEMBERED: Final = 256


class StreamingError(NetworkError):
    """A stream cannot be sent (closed, file unreadable, bad arguments)."""


class _End(IntEnum):
    FINISHED = 0
    ABORTED = 1
    REFUSED = 2


class StreamFailure(IntEnum):
    """Why a stream failed."""

    SENDER_ABORTED = 1
    """The sender gave up (closed, file changed or unreadable)."""
    REFUSED = 2
    """The receiver refused it (too large, too many, idle, bad data) and told the sender."""
    CONNECTION_LOST = 3
    CHUNK_MISSING = 4
    """A chunk arrived at an offset other than the next expected one."""
    CHECKSUM_MISMATCH = 5
    SIZE_MISMATCH = 6
    TOO_LARGE = 7
    TOO_MANY = 8
    TIMED_OUT = 9
    """No chunk for the idle timeout."""
    SPILL_FAILED = 10
    """The temporary file could not be written."""


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """An incoming stream was announced and accepted (``kind``/``request_id``: the frame it carries)."""

    stream_id: int
    total: int
    is_file: bool
    name: str
    kind: int = FrameKind.MESSAGE
    request_id: int = 0


@dataclass(frozen=True, slots=True)
class StreamProgressed:
    """Bytes so far of a stream (incoming or outgoing), every ``progress_step`` bytes and at the end."""

    stream_id: int
    done: int
    total: int
    incoming: bool


@dataclass(frozen=True, slots=True)
class StreamCompleted:
    """An incoming stream arrived whole and checked (size and SHA-256).

    ``payload`` holds it when it stayed in memory; otherwise ``path`` names the temporary file, which
    the receiver removes on :meth:`Streams.release` or close. The connection treats the payload as one
    frame of ``kind``/``request_id`` (a file is a message whose value is the path).
    """

    stream_id: int
    kind: int
    request_id: int
    size: int
    sha256: bytes
    payload: bytes | None
    path: str | None
    is_file: bool
    name: str


@dataclass(frozen=True, slots=True)
class StreamSent:
    """An outgoing stream's last frame was handed out."""

    stream_id: int
    size: int
    sha256: bytes


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """A stream failed; its resources (buffers, temporary file, open file) are already freed."""

    stream_id: int
    failure: StreamFailure
    detail: str
    incoming: bool


StreamEvent = StreamStarted | StreamProgressed | StreamCompleted | StreamSent | StreamFailed
OutFrame = tuple[int, int, bytes | bytearray]


# -- the I/O ------------------------------------------------------------------------------------------


class SpillFile:
    """A temporary file a stream is written to (created 0600 by ``mkstemp``), removed unless handed over."""

    def __init__(self, directory: str | None = None, prefix: str = "slipstream-stream-") -> None:
        fd, self.path = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
        self._file = os.fdopen(fd, "wb", buffering=1024 * 1024)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._file.write(data)

    def finish(self) -> str:
        """Close it and return its path (the caller now owns the file)."""
        self._file.close()
        return self.path

    def discard(self) -> None:
        """Close and remove it."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

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

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - kept open across chunks, closed by close()
        self.size = os.fstat(self._file.fileno()).st_size
        self.name = Path(path).name

    def read_into(self, buffer: memoryview) -> int:
        """Fill ``buffer`` from the file (fewer bytes only at its end); the bytes read."""
        return self._file.readinto(buffer)

    def close(self) -> None:
        self._file.close()


# -- the machine --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Outgoing:
    stream_id: int
    kind: int
    request_id: int
    total: int
    data: memoryview | None
    source: FileSource | None
    name: str
    offset: int = 0
    started: bool = False
    next_progress: int = 0
    hasher: hashlib._Hash | None = None


@dataclass(slots=True)
class _Incoming:
    stream_id: int
    kind: int
    request_id: int
    total: int
    is_file: bool
    name: str
    last_ns: int
    received: int = 0
    next_progress: int = 0
    buffer: bytearray | None = None
    spill: SpillFile | None = None
    hasher: hashlib._Hash | None = None


@dataclass(slots=True)
class StreamStats:
    """Counters of one connection's streams (bad frames are counted, never raised)."""

    streams_sent: int = 0
    streams_received: int = 0
    streams_failed: int = 0
    malformed_frames: int = 0
    unknown_stream_frames: int = 0
    spilled_streams: int = 0


class Streams:
    """One connection's outgoing and incoming streams.

    ``chunk_payload`` is the largest STREAM_CHUNK payload the connection can carry in one transport
    message (8 bytes of it are the offset); payloads larger than that are what the connection streams.
    """

    def __init__(
        self,
        *,
        chunk_payload: int,
        spill_threshold: int = DEFAULT_SPILL_THRESHOLD,
        max_stream_size: int = DEFAULT_MAX_STREAM_SIZE,
        max_incoming: int = 16,
        idle_timeout_ns: int = DEFAULT_IDLE_TIMEOUT_NS,
        progress_step: int = DEFAULT_PROGRESS_STEP,
        temp_dir: str | None = None,
        temp_prefix: str = "slipstream-stream-",
    ) -> None:
        if chunk_payload <= _OFFSET.size:
            raise ValueError(f"chunk_payload must exceed {_OFFSET.size} bytes: {chunk_payload}")
        if spill_threshold < 0:
            raise ValueError(f"spill_threshold must not be negative: {spill_threshold}")
        if max_stream_size < 0:
            raise ValueError(f"max_stream_size must not be negative: {max_stream_size}")
        if max_incoming < 1:
            raise ValueError(f"max_incoming must be at least 1: {max_incoming}")
        if idle_timeout_ns <= 0:
            raise ValueError(f"idle_timeout_ns must be positive: {idle_timeout_ns}")
        if progress_step <= 0:
            raise ValueError(f"progress_step must be positive: {progress_step}")
        self.chunk_payload = chunk_payload
        self.chunk_data = chunk_payload - _OFFSET.size
        self.spill_threshold = spill_threshold
        self.max_stream_size = max_stream_size
        self.max_incoming = max_incoming
        self.idle_timeout_ns = idle_timeout_ns
        self.progress_step = progress_step
        self.temp_dir = temp_dir
        self.temp_prefix = temp_prefix
        self.stats = StreamStats()
        self.closed = False
        self._next_id = 0
        self._outgoing: dict[int, _Outgoing] = {}
        self._incoming: dict[int, _Incoming] = {}
        self._in_memory = 0
        self._handed: dict[int, str] = {}
        self._sent: dict[int, None] = {}
        """Ids of the last streams sent whole (oldest first, bounded): the receiver may refuse one
        after its last chunk left (it announced too much, say), and the sender must still hear it."""
        self._frames: list[OutFrame] = []
        self._events: list[StreamEvent] = []

    # -- outputs ----------------------------------------------------------------------------------

    def take_events(self) -> list[StreamEvent]:
        """Events since the last call."""
        events, self._events = self._events, []
        return events

    @property
    def deadline_ns(self) -> int | None:
        """When the quietest incoming stream times out (None without incoming streams)."""
        if not self._incoming:
            return None
        return min(s.last_ns for s in self._incoming.values()) + self.idle_timeout_ns

    @property
    def sending(self) -> bool:
        """Outgoing streams have frames left to hand out."""
        return bool(self._outgoing or self._frames)

    def progress(self, stream_id: int, *, incoming: bool) -> tuple[int, int] | None:
        """(bytes so far, total) of a live stream, or None."""
        if incoming:
            s = self._incoming.get(stream_id)
            return (s.received, s.total) if s is not None else None
        o = self._outgoing.get(stream_id)
        return (o.offset, o.total) if o is not None else None

    @property
    def in_memory_bytes(self) -> int:
        """Bytes held in memory by incoming streams (bounded by ``spill_threshold``)."""
        return self._in_memory

    # -- sending ----------------------------------------------------------------------------------

    def needs_streaming(self, size: int) -> bool:
        """Whether a frame payload of ``size`` bytes is too big for one chunk-sized frame."""
        return size > self.chunk_payload

    def _check_target(self, kind: int, request_id: int) -> None:
        if not 0 <= kind <= 0xFF or not 0 <= request_id <= 0xFFFF_FFFF:
            raise StreamingError(f"frame kind {kind} must be 0..255 and request_id {request_id} 0..{0xFFFF_FFFF}")

    def _new_id(self) -> int:
        while True:
            self._next_id = self._next_id % 0xFFFF_FFFF + 1
            if self._next_id not in self._outgoing:
                return self._next_id

    def send(self, kind: int, request_id: int, payload: bytes | bytearray | memoryview) -> int:
        """Stream ``payload`` as a frame of ``kind``/``request_id``; returns the stream id."""
        if self.closed:
            raise StreamingError("cannot stream on a closed connection")
        self._check_target(kind, request_id)
        data = memoryview(bytes(payload) if isinstance(payload, bytearray) else payload).cast("B")
        stream_id = self._new_id()
        self._outgoing[stream_id] = _Outgoing(
            stream_id, int(kind), request_id, len(data), data, None, "", hasher=hashlib.sha256()
        )
        return stream_id

    def send_file(self, path: str | os.PathLike[str], *, kind: int = FrameKind.MESSAGE, request_id: int = 0) -> int:
        """Stream a file's contents (the receiver gets a temporary copy); returns the stream id.
        Raises StreamingError when the file cannot be opened."""
        if self.closed:
            raise StreamingError("cannot stream on a closed connection")
        self._check_target(kind, request_id)
        try:
            source = FileSource(path)
        except OSError as exc:
            raise StreamingError(f"cannot send file {os.fspath(path)!r}: {exc}") from exc
        stream_id = self._new_id()
        name = source.name.encode("utf-8", "replace")[:_MAX_NAME].decode("utf-8", "ignore")
        self._outgoing[stream_id] = _Outgoing(
            stream_id, int(kind), request_id, source.size, None, source, name, hasher=hashlib.sha256()
        )
        return stream_id

    def abort(self, stream_id: int, reason: str = "aborted by the sender") -> bool:
        """Give up an outgoing stream: the receiver is told (ABORTED) and frees what it holds."""
        stream = self._outgoing.pop(stream_id, None)
        if stream is None:
            return False
        self._fail_outgoing(stream, StreamFailure.SENDER_ABORTED, reason, tell_peer=True)
        return True

    def _fail_outgoing(self, stream: _Outgoing, failure: StreamFailure, detail: str, *, tell_peer: bool) -> None:
        self._outgoing.pop(stream.stream_id, None)
        if stream.source is not None:
            stream.source.close()
        if tell_peer and stream.started:
            self._frames.append((FrameKind.STREAM_END, stream.stream_id, _end(_End.ABORTED, detail)))
        self.stats.streams_failed += 1
        self._events.append(StreamFailed(stream.stream_id, failure, detail, False))

    def take_frames(self, max_bytes: int = 1024 * 1024) -> list[OutFrame]:
        """Frames to send, at most about ``max_bytes`` of chunk data (round-robin over the outgoing
        streams), plus any control frames; call again as the transport drains."""
        frames, self._frames = self._frames, []
        budget = max_bytes
        while self._outgoing and budget > 0:
            for stream in list(self._outgoing.values()):
                budget -= self._step(stream, frames)
                if budget <= 0:
                    break
        return frames

    def _step(self, stream: _Outgoing, frames: list[OutFrame]) -> int:
        """Hand out the stream's next frame (START, one chunk, or END); returns the data bytes used."""
        if not stream.started:
            stream.started = True
            flags = _FLAG_FILE if stream.source is not None else 0
            header = _START.pack(flags, stream.kind, stream.request_id, stream.total)
            frames.append((FrameKind.STREAM_START, stream.stream_id, header + stream.name.encode("utf-8")))
            return 1
        assert stream.hasher is not None
        if stream.offset < stream.total:
            n = min(self.chunk_data, stream.total - stream.offset)
            payload: bytes | bytearray
            if stream.data is not None:
                chunk: memoryview = stream.data[stream.offset : stream.offset + n]
                payload = _OFFSET.pack(stream.offset) + chunk
            else:
                assert stream.source is not None
                payload = bytearray(_OFFSET.size + n)  # the file is read straight after the offset
                _OFFSET.pack_into(payload, 0, stream.offset)
                chunk = memoryview(payload)[_OFFSET.size :]
                try:
                    got = stream.source.read_into(chunk)
                except OSError as exc:
                    self._fail_outgoing(
                        stream, StreamFailure.SENDER_ABORTED, f"file read failed: {exc}", tell_peer=True
                    )
                    return 1
                if got != n:
                    self._fail_outgoing(
                        stream, StreamFailure.SENDER_ABORTED, "the file shrank while sent", tell_peer=True
                    )
                    return 1
            stream.hasher.update(chunk)
            frames.append((FrameKind.STREAM_CHUNK, stream.stream_id, payload))
            stream.offset += n
            if stream.offset >= stream.next_progress or stream.offset == stream.total:
                stream.next_progress = stream.offset + self.progress_step
                self._events.append(StreamProgressed(stream.stream_id, stream.offset, stream.total, False))
            return n
        digest = stream.hasher.digest()
        frames.append(
            (
                FrameKind.STREAM_END,
                stream.stream_id,
                bytes((_End.FINISHED,)) + _FINISHED_BODY.pack(stream.total, digest),
            )
        )
        del self._outgoing[stream.stream_id]
        if stream.source is not None:
            stream.source.close()
        self._sent[stream.stream_id] = None
        if len(self._sent) > _SENT_REMEMBERED:
            del self._sent[next(iter(self._sent))]
        self.stats.streams_sent += 1
        self._events.append(StreamSent(stream.stream_id, stream.total, digest))
        return 1

    # -- receiving --------------------------------------------------------------------------------

    def receive(self, kind: int, stream_id: int, payload: bytes, now_ns: int) -> None:
        """A STREAM_START, STREAM_CHUNK or STREAM_END frame from the peer (anything bad is counted)."""
        if self.closed:
            return
        if kind == FrameKind.STREAM_CHUNK:
            self._chunk(stream_id, payload, now_ns)
        elif kind == FrameKind.STREAM_START:
            self._start(stream_id, payload, now_ns)
        elif kind == FrameKind.STREAM_END:
            self._end(stream_id, payload)
        else:
            self.stats.malformed_frames += 1

    def _refuse(self, stream_id: int, failure: StreamFailure, detail: str) -> None:
        """Tell the sender we will not take this stream, and report it here."""
        self._frames.append((FrameKind.STREAM_END, stream_id, _end(_End.REFUSED, detail)))
        self.stats.streams_failed += 1
        self._events.append(StreamFailed(stream_id, failure, detail, True))

    def _start(self, stream_id: int, payload: bytes, now_ns: int) -> None:
        if len(payload) < _START.size or len(payload) > _START.size + _MAX_NAME:
            self.stats.malformed_frames += 1
            return
        flags, inner_kind, inner_request_id, total = _START.unpack_from(payload)
        if stream_id in self._incoming or flags & ~_FLAG_FILE:
            self.stats.malformed_frames += 1
            return
        if total > self.max_stream_size:
            self._refuse(
                stream_id, StreamFailure.TOO_LARGE, f"announced {total} bytes exceed the maximum {self.max_stream_size}"
            )
            return
        if len(self._incoming) >= self.max_incoming:
            self._refuse(stream_id, StreamFailure.TOO_MANY, f"already {len(self._incoming)} incoming streams")
            return
        is_file = bool(flags & _FLAG_FILE)
        name = payload[_START.size :].decode("utf-8", "replace")
        stream = _Incoming(
            stream_id, inner_kind, inner_request_id, total, is_file, name, now_ns, hasher=hashlib.sha256()
        )
        if is_file or total > self.spill_threshold:
            if not self._spill(stream):
                return
        else:
            stream.buffer = bytearray()
        self._incoming[stream_id] = stream
        self._events.append(StreamStarted(stream_id, total, is_file, name, inner_kind, inner_request_id))

    def _spill(self, stream: _Incoming) -> bool:
        """Move the stream to a temporary file (writing what memory held); False if that failed."""
        try:
            stream.spill = SpillFile(self.temp_dir, self.temp_prefix)
            if stream.buffer:
                stream.spill.write(stream.buffer)
        except OSError as exc:
            self._fail_incoming(stream, StreamFailure.SPILL_FAILED, f"temporary file: {exc}", tell_peer=True)
            return False
        if stream.buffer is not None:
            self._in_memory -= len(stream.buffer)
            stream.buffer = None
        self.stats.spilled_streams += 1
        return True

    def _chunk(self, stream_id: int, payload: bytes, now_ns: int) -> None:
        stream = self._incoming.get(stream_id)
        if stream is None:
            self.stats.unknown_stream_frames += 1
            return
        if len(payload) < _OFFSET.size:
            self._fail_incoming(stream, StreamFailure.CHUNK_MISSING, "a chunk without an offset", tell_peer=True)
            return
        (offset,) = _OFFSET.unpack_from(payload)
        n = len(payload) - _OFFSET.size
        if offset != stream.received:
            self._fail_incoming(
                stream,
                StreamFailure.CHUNK_MISSING,
                f"chunk at offset {offset}, expected {stream.received}",
                tell_peer=True,
            )
            return
        if stream.received + n > stream.total:
            self._fail_incoming(
                stream, StreamFailure.SIZE_MISMATCH, f"more than the announced {stream.total} bytes", tell_peer=True
            )
            return
        data = memoryview(payload)[_OFFSET.size :]
        if stream.buffer is not None and self._in_memory + n > self.spill_threshold and not self._spill(stream):
            return
        assert stream.hasher is not None
        stream.hasher.update(data)
        if stream.buffer is not None:
            stream.buffer += data
            self._in_memory += n
        else:
            assert stream.spill is not None
            try:
                stream.spill.write(data)
            except OSError as exc:
                self._fail_incoming(stream, StreamFailure.SPILL_FAILED, f"temporary file: {exc}", tell_peer=True)
                return
        stream.received += n
        stream.last_ns = now_ns
        if stream.received >= stream.next_progress or stream.received == stream.total:
            stream.next_progress = stream.received + self.progress_step
            self._events.append(StreamProgressed(stream_id, stream.received, stream.total, True))

    def _end(self, stream_id: int, payload: bytes) -> None:
        if not payload:
            self.stats.malformed_frames += 1
            return
        status = payload[0]
        if status == _End.REFUSED:  # about a stream *we* send
            outgoing = self._outgoing.get(stream_id)
            reason = bytes(payload[1 : 1 + _MAX_REASON]).decode("utf-8", "replace")
            if outgoing is None:
                if stream_id in self._sent:  # refused after its last chunk left
                    del self._sent[stream_id]
                    self.stats.streams_failed += 1
                    self._events.append(
                        StreamFailed(stream_id, StreamFailure.REFUSED, f"the receiver refused it: {reason}", False)
                    )
                else:
                    self.stats.unknown_stream_frames += 1
                return
            self._fail_outgoing(outgoing, StreamFailure.REFUSED, f"the receiver refused it: {reason}", tell_peer=False)
            return
        stream = self._incoming.get(stream_id)
        if stream is None:
            self.stats.unknown_stream_frames += 1
            return
        if status == _End.ABORTED:
            reason = bytes(payload[1 : 1 + _MAX_REASON]).decode("utf-8", "replace")
            self._fail_incoming(stream, StreamFailure.SENDER_ABORTED, reason)
            return
        if status != _End.FINISHED or len(payload) != 1 + _FINISHED_BODY.size:
            self._fail_incoming(stream, StreamFailure.SIZE_MISMATCH, "a malformed end of stream", tell_peer=True)
            return
        total, digest = _FINISHED_BODY.unpack_from(payload, 1)
        if total != stream.total or stream.received != stream.total:
            self._fail_incoming(
                stream,
                StreamFailure.SIZE_MISMATCH if stream.received == stream.total else StreamFailure.CHUNK_MISSING,
                f"received {stream.received} of {stream.total} bytes (the sender says {total})",
            )
            return
        assert stream.hasher is not None
        mine = stream.hasher.digest()
        if mine != digest:
            self._fail_incoming(stream, StreamFailure.CHECKSUM_MISMATCH, "SHA-256 of the received bytes differs")
            return
        del self._incoming[stream_id]
        path: str | None = None
        data: bytes | None = None
        if stream.spill is not None:
            try:
                path = stream.spill.finish()
            except OSError as exc:
                stream.spill.discard()
                self.stats.streams_failed += 1
                self._events.append(StreamFailed(stream_id, StreamFailure.SPILL_FAILED, str(exc), True))
                return
            self._handed[stream_id] = path
        else:
            assert stream.buffer is not None
            data = bytes(stream.buffer)
            self._in_memory -= len(stream.buffer)
        self.stats.streams_received += 1
        self._events.append(
            StreamCompleted(
                stream_id, stream.kind, stream.request_id, stream.total, mine, data, path, stream.is_file, stream.name
            )
        )

    def _fail_incoming(
        self, stream: _Incoming, failure: StreamFailure, detail: str, *, tell_peer: bool = False
    ) -> None:
        self._incoming.pop(stream.stream_id, None)
        if stream.buffer is not None:
            self._in_memory -= len(stream.buffer)
            stream.buffer = None
        if stream.spill is not None:
            stream.spill.discard()
            stream.spill = None
        if tell_peer:
            self._frames.append((FrameKind.STREAM_END, stream.stream_id, _end(_End.REFUSED, detail)))
        self.stats.streams_failed += 1
        self._events.append(StreamFailed(stream.stream_id, failure, detail, True))

    # -- lifecycle --------------------------------------------------------------------------------

    def release(self, stream_id: int) -> bool:
        """Remove the temporary file of a completed stream (after its listener ran); False if none."""
        path = self._handed.pop(stream_id, None)
        if path is None:
            return False
        with contextlib.suppress(OSError):
            os.unlink(path)
        return True

    def detach(self, stream_id: int) -> str | None:
        """Hand the temporary file of a completed stream over to the application: it is no longer
        removed on :meth:`release` or close (the caller owns it now). Its path, or None if none."""
        return self._handed.pop(stream_id, None)

    def handle_timer(self, now_ns: int) -> None:
        """Fail incoming streams idle for ``idle_timeout_ns`` (the sender is told)."""
        for stream in list(self._incoming.values()):
            if now_ns - stream.last_ns >= self.idle_timeout_ns:
                self._fail_incoming(
                    stream, StreamFailure.TIMED_OUT, f"no chunk for {self.idle_timeout_ns / 1e9:g} s", tell_peer=True
                )

    def connection_lost(self, reason: str = "connection lost") -> None:
        """The connection is gone: every stream fails, on both sides of this machine, freeing everything."""
        for stream in list(self._incoming.values()):
            self._fail_incoming(stream, StreamFailure.CONNECTION_LOST, reason)
        for outgoing in list(self._outgoing.values()):
            self._fail_outgoing(outgoing, StreamFailure.CONNECTION_LOST, reason, tell_peer=False)
        self._frames.clear()

    def close(self, reason: str = "connection closed") -> None:
        """As :meth:`connection_lost`, and remove completed temporary files not yet released."""
        self.connection_lost(reason)
        for stream_id in list(self._handed):
            self.release(stream_id)
        self.closed = True


def _end(status: _End, reason: str) -> bytes:
    return bytes((status,)) + reason.encode("utf-8", "replace")[:_MAX_REASON]
