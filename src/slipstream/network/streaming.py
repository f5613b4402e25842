"""Large messages and files as streams of frames, with bounded memory on both sides (sans-I/O).

The frames (STREAM_START, STREAM_CHUNK, STREAM_END) and the events are in :mod:`.streamwire`. The
receiver refuses an announced size above ``max_stream_size`` and more than ``max_incoming`` concurrent
streams before allocating anything; it grows an in-memory buffer only as bytes arrive, and a stream
larger than ``spill_threshold`` (or a file, or one that would push all in-memory streams past that
budget) goes to a temporary file, removed when the stream fails, on close, or when the application
releases it; a file keeps the sender's name (:mod:`.localfiles`). Events report starts, progress,
completions and failures on both sides.

File I/O, the one thing here that can block, is injected (a :class:`~.streamfiles.StreamFiles`): the
default reads and writes at once on the caller's thread, deterministic for tests; an adapter passes a
:class:`~.streamfiles.ThreadedStreamFiles`, so a slow disk never stalls the event loop that serves every
other connection. The machine never waits on it: a spilled stream completes once its file is closed,
taken in by :meth:`Streams.handle_timer` (``deadline_ns`` is due once the worker finished something); a
file being sent hands out only chunks already read; :attr:`Streams.write_backlog` tells the adapter
when to stop reading its subscription. The rest is frames in, frames and events out, and ``now_ns``.

How a connection composes it: a frame payload with :meth:`Streams.needs_streaming` goes to
:meth:`Streams.send` (a ``pathlib.Path`` message to :meth:`Streams.send_file`) instead of the batch;
STREAM_* frames that arrive go to :meth:`Streams.receive`; :meth:`Streams.take_frames` as the transport
drains (it bounds how much is read and queued at once); a :class:`StreamCompleted` is handled as the
frame it carries (a file as a message whose value is the path), then :meth:`Streams.release`;
``deadline_ns``/``handle_timer`` join the connection's; :meth:`Streams.close` when it closes.
"""

from __future__ import annotations

import os
from typing import Final

from .frames import FrameKind
from .limits import SpillQuota, stream_refusal
from .streamfiles import FileSource, InlineStreamFiles, SpillFile, StreamFiles
from .streamwire import (
    FINISHED_BODY,
    FLAG_FILE,
    MAX_NAME,
    OFFSET,
    REFUSALS,
    START,
    End,
    IncomingStream,
    OutFrame,
    OutgoingStream,
    StreamCompleted,
    StreamEvent,
    StreamFailed,
    StreamFailure,
    StreamingError,
    StreamProgressed,
    StreamSent,
    StreamStarted,
    StreamStats,
    end_frame,
    finished_frame,
    reason_of,
    refusal_end,
)

__all__ = [
    "DEFAULT_MAX_STREAM_SIZE",
    "DEFAULT_MAX_WRITE_BACKLOG",
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
DEFAULT_MAX_WRITE_BACKLOG: Final = 32 * 1024 * 1024
"""Bytes of one connection's streams that may wait to be written: a chunk beyond fails its stream
(SPILL_FAILED) rather than grow memory. An adapter pausing at ``WRITE_BACKLOG_PAUSE`` stays well under."""
DEFAULT_IDLE_TIMEOUT_NS: Final = 30_000_000_000
DEFAULT_PROGRESS_STEP: Final = 1024 * 1024
_SENT_REMEMBERED: Final = 256


# -- the machine --------------------------------------------------------------------------------------


class Streams:
    """One connection's outgoing and incoming streams.

    ``chunk_payload`` is the largest STREAM_CHUNK payload the connection can carry in one transport
    message (8 bytes of it are the offset); payloads larger than that are what the connection streams.
    ``files`` does the file I/O (default: at once, on the caller's thread; see :mod:`.streamfiles`).
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
        files: StreamFiles | None = None,
        max_write_backlog: int = DEFAULT_MAX_WRITE_BACKLOG,
        max_message_size: int | None = None,
        quota: SpillQuota | None = None,
    ) -> None:
        if chunk_payload <= OFFSET.size:
            raise ValueError(f"chunk_payload must exceed {OFFSET.size} bytes: {chunk_payload}")
        for name, value, least in (
            ("spill_threshold", spill_threshold, 0),
            ("max_stream_size", max_stream_size, 0),
            ("max_incoming", max_incoming, 1),
            ("idle_timeout_ns", idle_timeout_ns, 1),
            ("progress_step", progress_step, 1),
            ("max_write_backlog", max_write_backlog, 0),
        ):
            if value < least:
                raise ValueError(f"{name} must be at least {least}: {value}")
        self.chunk_payload = chunk_payload
        self.chunk_data = chunk_payload - OFFSET.size
        self.spill_threshold = spill_threshold
        self.max_stream_size = max_stream_size
        self.max_incoming = max_incoming
        self.idle_timeout_ns = idle_timeout_ns
        self.progress_step = progress_step
        self.temp_dir = temp_dir
        self.temp_prefix = temp_prefix
        self.max_write_backlog = max_write_backlog
        self.max_message_size = max_message_size
        """Largest stream that is not a file (decoded in memory once whole); None: ``max_stream_size``."""
        self.quota = quota
        """Disk for spilled streams, shared with the server's other connections (None: unbounded)."""
        self._files: StreamFiles = files if files is not None else InlineStreamFiles()
        self.stats = StreamStats()
        self.closed = False
        self._next_id = 0
        self._outgoing: dict[int, OutgoingStream] = {}
        self._incoming: dict[int, IncomingStream] = {}
        self._finishing: dict[int, IncomingStream] = {}
        """Checked, waiting for their files to be written and closed (they count as incoming)."""
        self._starved: set[int] = set()
        """Outgoing file streams that found no chunk read yet."""
        self._in_memory = 0
        self._handed: dict[int, tuple[str, int]] = {}
        """Completed streams' files not yet released: path, bytes of quota held."""
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
        """When the quietest incoming stream times out (None without incoming streams), or 0 (due) when
        file I/O finished and :meth:`handle_timer` has outcomes to take in."""
        if not (self._incoming or self._finishing or self._starved):
            return None  # the common case (asked with every deadline of the connection): nothing built
        if self._io_due():
            return 0
        if not self._incoming:
            return None
        return min(s.last_ns for s in self._incoming.values()) + self.idle_timeout_ns

    def _io_due(self) -> bool:
        if any(s.spill is not None and s.spill.due for s in self._spilling()):
            return True
        return any((o := self._outgoing.get(i)) and o.source is not None and o.source.due for i in self._starved)

    def _spilling(self) -> list[IncomingStream]:
        """Incoming streams, those still arriving and those whose files are being closed."""
        return [*self._incoming.values(), *self._finishing.values()]

    @property
    def sending(self) -> bool:
        """Outgoing streams have frames left to hand out."""
        return bool(self._outgoing or self._frames)

    def progress(self, stream_id: int, *, incoming: bool) -> tuple[int, int] | None:
        """(bytes so far, total) of a live stream, or None."""
        if incoming:
            s = self._incoming.get(stream_id) or self._finishing.get(stream_id)
            return (s.received, s.total) if s is not None else None
        o = self._outgoing.get(stream_id)
        return (o.offset, o.total) if o is not None else None

    @property
    def in_memory_bytes(self) -> int:
        """Bytes held in memory by incoming streams (bounded by ``spill_threshold``)."""
        return self._in_memory

    @property
    def write_backlog(self) -> int:
        """Bytes of incoming streams handed to their files and not yet written (0 inline). An adapter stops
        polling while this exceeds :data:`~.streamfiles.WRITE_BACKLOG_PAUSE`; ``max_write_backlog`` caps it."""
        if not (self._incoming or self._finishing):
            return 0  # (asked with every poll of the connection: without streams, nothing is built)
        return sum(s.spill.backlog for s in self._spilling() if s.spill is not None)

    # -- sending ----------------------------------------------------------------------------------

    def needs_streaming(self, size: int) -> bool:
        """Whether a frame payload of ``size`` bytes is too big for one chunk-sized frame."""
        return size > self.chunk_payload

    def _check_target(self, kind: int, request_id: int) -> None:
        if self.closed:
            raise StreamingError("cannot stream on a closed connection")
        if not 0 <= kind <= 0xFF or not 0 <= request_id <= 0xFFFF_FFFF:
            raise StreamingError(f"frame kind {kind} must be 0..255 and request_id {request_id} 0..{0xFFFF_FFFF}")

    def _new_id(self) -> int:
        while True:
            self._next_id = self._next_id % 0xFFFF_FFFF + 1
            if self._next_id not in self._outgoing:
                return self._next_id

    def send(self, kind: int, request_id: int, payload: bytes | bytearray | memoryview) -> int:
        """Stream ``payload`` as a frame of ``kind``/``request_id``; returns the stream id."""
        self._check_target(kind, request_id)
        data = memoryview(bytes(payload) if isinstance(payload, bytearray) else payload).cast("B")
        stream_id = self._new_id()
        self._outgoing[stream_id] = OutgoingStream(stream_id, int(kind), request_id, len(data), data, None, "")
        return stream_id

    def send_file(
        self, path: str | os.PathLike[str], *, kind: int = FrameKind.MESSAGE, request_id: int = 0, announce: bool = True
    ) -> int:
        """Stream a file's contents; returns the stream id. The receiver gets a copy under the file's name
        in a private directory (``announce=False``: a nameless temporary file). Raises StreamingError when
        the file cannot be opened."""
        self._check_target(kind, request_id)
        try:
            source = self._files.source(path, chunk=self.chunk_data, headroom=OFFSET.size)
        except OSError as exc:
            raise StreamingError(f"cannot send file {os.fspath(path)!r}: {exc}") from exc
        stream_id = self._new_id()
        name = source.name.encode("utf-8", "replace")[:MAX_NAME].decode("utf-8", "ignore")
        outgoing = OutgoingStream(stream_id, int(kind), request_id, source.size, None, source, name, announce)
        self._outgoing[stream_id] = outgoing
        return stream_id

    def abort(self, stream_id: int, reason: str = "aborted by the sender") -> bool:
        """Give up an outgoing stream: the receiver is told (ABORTED) and frees what it holds."""
        stream = self._outgoing.pop(stream_id, None)
        if stream is None:
            return False
        self._fail_outgoing(stream, StreamFailure.SENDER_ABORTED, reason, tell_peer=True)
        return True

    def _fail_outgoing(self, stream: OutgoingStream, failure: StreamFailure, detail: str, *, tell_peer: bool) -> None:
        self._outgoing.pop(stream.stream_id, None)
        self._starved.discard(stream.stream_id)
        if stream.source is not None:
            stream.source.close()
        if tell_peer and stream.started:
            self._frames.append((FrameKind.STREAM_END, stream.stream_id, end_frame(End.ABORTED, detail)))
        self.stats.streams_failed += 1
        self._events.append(StreamFailed(stream.stream_id, failure, detail, False))

    def take_frames(self, max_bytes: int = 1024 * 1024) -> list[OutFrame]:
        """Frames to send, at most about ``max_bytes`` of chunk data (round-robin over the outgoing
        streams), plus any control frames; call again as the transport drains."""
        frames, self._frames = self._frames, []
        budget = max_bytes
        self._starved.clear()
        while self._outgoing and budget > 0:
            spent = budget
            for stream in list(self._outgoing.values()):
                budget -= self._step(stream, frames)
                if budget <= 0:
                    break
            if budget == spent:  # every file stream waits for its next chunk to be read
                break
        return frames

    def _step(self, stream: OutgoingStream, frames: list[OutFrame]) -> int:
        """Hand out the stream's next frame (START, one chunk, or END); returns the data bytes used (0:
        its next chunk is still being read)."""
        if not stream.started:
            stream.started = True
            flags = FLAG_FILE if stream.source is not None else 0
            header = START.pack(flags, stream.kind, stream.request_id, stream.total)
            announced = stream.name.encode("utf-8") if stream.announce else b""
            frames.append((FrameKind.STREAM_START, stream.stream_id, header + announced))
            s = stream
            self._events.append(StreamStarted(s.stream_id, s.total, bool(flags), s.name, s.kind, s.request_id, False))
            return 1
        if stream.offset < stream.total:
            n = min(self.chunk_data, stream.total - stream.offset)
            payload: bytes | bytearray
            if stream.data is not None:
                chunk: memoryview = stream.data[stream.offset : stream.offset + n]
                payload = OFFSET.pack(stream.offset) + chunk
            else:
                assert stream.source is not None
                failed = "the file shrank while sent"
                try:
                    read = stream.source.take()  # the file's bytes after room for the offset
                except OSError as exc:
                    read, failed = bytearray(), f"file read failed: {exc}"
                if read is None:  # not read yet: the stream waits
                    self._starved.add(stream.stream_id)
                    return 0
                if len(read) != OFFSET.size + n:
                    self._fail_outgoing(stream, StreamFailure.SENDER_ABORTED, failed, tell_peer=True)
                    return 1
                payload = read
                OFFSET.pack_into(payload, 0, stream.offset)
                chunk = memoryview(payload)[OFFSET.size :]
            stream.hasher.update(chunk)
            frames.append((FrameKind.STREAM_CHUNK, stream.stream_id, payload))
            stream.offset += n
            if stream.offset >= stream.next_progress or stream.offset == stream.total:
                stream.next_progress = stream.offset + self.progress_step
                self._events.append(StreamProgressed(stream.stream_id, stream.offset, stream.total, False))
            return n
        digest = stream.hasher.digest()
        frames.append((FrameKind.STREAM_END, stream.stream_id, finished_frame(stream.total, digest)))
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

    def _refuse(self, stream_id: int, failure: StreamFailure, detail: str, tell_peer: bool = True) -> None:
        """Tell the sender we will not take this stream, and report it here."""
        if tell_peer:
            self._frames.append((FrameKind.STREAM_END, stream_id, end_frame(refusal_end(failure), detail)))
        self.stats.streams_failed += 1
        self._events.append(StreamFailed(stream_id, failure, detail, True))

    def _start(self, stream_id: int, payload: bytes, now_ns: int) -> None:
        if len(payload) < START.size or len(payload) > START.size + MAX_NAME:
            self.stats.malformed_frames += 1
            return
        flags, inner_kind, inner_request_id, total = START.unpack_from(payload)
        if stream_id in self._incoming or stream_id in self._finishing or flags & ~FLAG_FILE:
            self.stats.malformed_frames += 1
            return
        is_file = bool(flags & FLAG_FILE)
        live = len(self._incoming) + len(self._finishing)
        limits = dict(max_stream_size=self.max_stream_size, max_incoming=self.max_incoming)
        if refused := stream_refusal(total, is_file, live, max_message_size=self.max_message_size, **limits):
            self._refuse(stream_id, *refused)
            return
        name = payload[START.size :].decode("utf-8", "replace")
        stream = IncomingStream(stream_id, inner_kind, inner_request_id, total, is_file, name, now_ns)
        stream.buffer = None if is_file or total > self.spill_threshold else bytearray()
        if stream.buffer is None and not self._spill(stream):
            return
        self._incoming[stream_id] = stream
        self._events.append(StreamStarted(stream_id, total, is_file, name, inner_kind, inner_request_id))

    def _spill(self, stream: IncomingStream) -> bool:
        """Move the stream to a temporary file (writing what memory held); False if that failed."""
        if self.quota is not None:
            if not self.quota.reserve(stream.total):
                detail = f"{stream.total} bytes exceed its spill_quota ({self.quota.used} of {self.quota.limit} in use)"
                self._fail_incoming(stream, StreamFailure.OVER_QUOTA, detail, tell_peer=True)
                return False
            stream.reserved = stream.total
        try:
            stream.spill = self._files.spill(self.temp_dir, self.temp_prefix, stream.name if stream.is_file else "")
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
        if len(payload) < OFFSET.size:
            self._fail_incoming(stream, StreamFailure.CHUNK_MISSING, "a chunk without an offset", tell_peer=True)
            return
        (offset,) = OFFSET.unpack_from(payload)
        n = len(payload) - OFFSET.size
        if offset != stream.received:
            detail = f"chunk at offset {offset}, expected {stream.received}"
            self._fail_incoming(stream, StreamFailure.CHUNK_MISSING, detail, tell_peer=True)
            return
        if stream.received + n > stream.total:
            detail = f"more than the announced {stream.total} bytes"
            self._fail_incoming(stream, StreamFailure.SIZE_MISMATCH, detail, tell_peer=True)
            return
        data = memoryview(payload)[OFFSET.size :]
        if stream.buffer is not None and self._in_memory + n > self.spill_threshold and not self._spill(stream):
            return
        if stream.spill is not None and (backlog := self.write_backlog) + n > self.max_write_backlog:
            detail = f"the disk is {backlog} bytes behind"
            self._fail_incoming(stream, StreamFailure.SPILL_FAILED, detail, tell_peer=True)
            return
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
        if (refusal := REFUSALS.get(status)) is not None:  # about a stream *we* send
            detail = f"the receiver refused it: {reason_of(payload)}"
            if (outgoing := self._outgoing.get(stream_id)) is not None:
                self._fail_outgoing(outgoing, refusal, detail, tell_peer=False)
            elif stream_id in self._sent:  # refused after its last chunk left
                del self._sent[stream_id]
                self.stats.streams_failed += 1
                self._events.append(StreamFailed(stream_id, refusal, detail, False))
            else:
                self.stats.unknown_stream_frames += 1
            return
        stream = self._incoming.get(stream_id)
        if stream is None:
            self.stats.unknown_stream_frames += 1
            return
        if status == End.ABORTED:
            self._fail_incoming(stream, StreamFailure.SENDER_ABORTED, reason_of(payload))
            return
        if status != End.FINISHED or len(payload) != 1 + FINISHED_BODY.size:
            self._fail_incoming(stream, StreamFailure.SIZE_MISMATCH, "a malformed end of stream", tell_peer=True)
            return
        total, digest = FINISHED_BODY.unpack_from(payload, 1)
        if total != stream.total or stream.received != stream.total:
            self._fail_incoming(
                stream,
                StreamFailure.SIZE_MISMATCH if stream.received == stream.total else StreamFailure.CHUNK_MISSING,
                f"received {stream.received} of {stream.total} bytes (the sender says {total})",
            )
            return
        mine = stream.hasher.digest()
        if mine != digest:
            self._fail_incoming(stream, StreamFailure.CHECKSUM_MISMATCH, "SHA-256 of the received bytes differs")
            return
        del self._incoming[stream_id]
        stream.digest = mine
        if stream.spill is None:
            assert stream.buffer is not None
            self._in_memory -= len(stream.buffer)
            self._completed(stream, bytes(stream.buffer), None)
            return
        self._finishing[stream_id] = stream
        try:
            stream.spill.finish()
        except OSError as exc:
            self._fail_incoming(stream, StreamFailure.SPILL_FAILED, str(exc))
            return
        self._finish(stream)

    def _finish(self, stream: IncomingStream) -> None:
        """Take in what the stream's file did: a failure fails the stream (the sender is told); a checked
        stream completes once its file is written and closed."""
        assert stream.spill is not None
        try:
            path = stream.spill.poll()
        except OSError as exc:  # the sender still has the stream's id when it arrived whole
            self._fail_incoming(stream, StreamFailure.SPILL_FAILED, f"temporary file: {exc}", tell_peer=True)
            return
        if path is not None and stream.stream_id in self._finishing:
            del self._finishing[stream.stream_id]
            self._handed[stream.stream_id] = (path, stream.reserved)
            self._completed(stream, None, path)

    def _completed(self, stream: IncomingStream, data: bytes | None, path: str | None) -> None:
        self.stats.streams_received += 1
        s = stream
        event = StreamCompleted(s.stream_id, s.kind, s.request_id, s.total, s.digest, data, path, s.is_file, s.name)
        self._events.append(event)

    def _fail_incoming(
        self, stream: IncomingStream, failure: StreamFailure, detail: str, *, tell_peer: bool = False
    ) -> None:
        self._incoming.pop(stream.stream_id, None)
        self._finishing.pop(stream.stream_id, None)
        if stream.buffer is not None:
            self._in_memory -= len(stream.buffer)
            stream.buffer = None
        if stream.spill is not None:
            stream.spill.discard()
            stream.spill = None
        if self.quota is not None:
            self.quota.release(stream.reserved)
            stream.reserved = 0
        self._refuse(stream.stream_id, failure, detail, tell_peer)

    # -- lifecycle --------------------------------------------------------------------------------

    def release(self, stream_id: int) -> bool:
        """Remove the temporary file of a completed stream (after its listener ran); False if none."""
        handed = self._handed.pop(stream_id, None)
        if handed is None:
            return False
        self._files.remove(handed[0])
        if self.quota is not None:
            self.quota.release(handed[1])
        return True

    def detach(self, stream_id: int) -> str | None:
        """Hand the temporary file of a completed stream over to the application: it is no longer
        removed on :meth:`release` or close (the caller owns it now, outside the spill quota). Its path, or
        None if none."""
        handed = self._handed.pop(stream_id, None)
        if handed is None:
            return None
        if self.quota is not None:
            self.quota.release(handed[1])
        return handed[0]

    def handle_timer(self, now_ns: int) -> None:
        """Take in finished file I/O (completions, failures); fail incoming streams idle for
        ``idle_timeout_ns`` (the sender is told), unless they wait for our disk (back-pressure)."""
        for stream in self._spilling():
            if stream.spill is not None and stream.spill.due:
                self._finish(stream)
        self._starved.clear()  # take_frames looks again
        idle = f"no chunk for {self.idle_timeout_ns / 1e9:g} s"
        for stream in list(self._incoming.values()):
            if now_ns - stream.last_ns < self.idle_timeout_ns:
                continue
            if stream.spill is not None and stream.spill.backlog:  # our disk is behind, not the peer
                stream.last_ns = now_ns
            else:
                self._fail_incoming(stream, StreamFailure.TIMED_OUT, idle, tell_peer=True)

    def connection_lost(self, reason: str = "connection lost") -> None:
        """The connection is gone: every stream fails, on both sides of this machine, freeing everything."""
        for stream in self._spilling():
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
