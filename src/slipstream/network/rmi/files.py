"""Files of remote calls, sans-I/O: ``pathlib.Path`` arguments and results travel as streamed files.

The sender streams the file as a MESSAGE-kind file stream marked :data:`~.wire.FILE_STREAM_MARK` and
puts a :class:`~.wire.FileRef` (the stream's id, size and name) in the call or the response. On the
receiving side the stream and the call that names it may arrive in either order; :class:`RmiFiles`
matches them:

- a host call with file arguments is held until each file has arrived whole (size and SHA-256 checked by
  the stream, the size checked here against what the call announced), then handed out with the temporary
  copies' paths in its arguments; the copies are removed as soon as the call completed or failed, so a
  method that wants to keep a file copies or moves it;
- a ``Path`` result completes its call once the file arrived; the caller owns the file from then on (it
  is not removed for it, not even when the connection closes); if the call fails or its caller went away
  (:meth:`RmiFiles.abandon`) first, the file is removed when it arrives.

Everything here is bounded: files that arrived for no call yet (``UNCLAIMED_FILES``), remembered failures
(``FAILED_REMEMBERED``) and calls waiting for files (``FILE_WAITERS``). A connection machine composes it
between its streams and its RMI endpoint; removing and handing over temporary files is the streams'.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import msgspec

from ..errors import InterfaceError
from ..events import RmiCallCompleted, RmiCallFailed, RmiFailure
from ..frames import FrameKind
from ..streaming import StreamingError, Streams
from .invocation import Invocation
from .registry import MethodSpec
from .wire import FILE_STREAM_MARK, FileRef

__all__ = [
    "FAILED_REMEMBERED",
    "FILE_WAITERS",
    "UNCLAIMED_FILES",
    "FileChannel",
    "FileStore",
    "RmiFiles",
    "StreamsChannel",
    "encode_with_files",
    "file_out",
]

UNCLAIMED_FILES: Final = 64
"""Files that arrived for calls not (yet) seen, kept at most; the oldest beyond are removed."""
FILE_WAITERS: Final = 1024
"""Files waited for at once (by host calls and results); more fail at once."""
FAILED_REMEMBERED: Final = 256
"""Incoming streams that failed (or were dropped), remembered so a call naming one fails at once."""


class FileStore(Protocol):
    """The connection's streams as RMI files use them: temporary copies removed or handed over."""

    def release(self, stream_id: int) -> bool:
        """Remove the temporary copy of a completed stream."""
        ...

    def detach(self, stream_id: int) -> str | None:
        """Hand the temporary copy over (nothing removes it any more)."""
        ...


class FileChannel(Protocol):
    """How an endpoint sends a ``Path`` argument or result: the connection streams the file."""

    def send(self, path: os.PathLike[str]) -> FileRef:
        """Start streaming the file (OSError/StreamingError when it cannot be read)."""
        ...

    def abort(self, stream_id: int) -> None:
        """Give up a file stream started for a call that could not be sent after all."""
        ...


class StreamsChannel:
    """The :class:`~.endpoint.FileChannel` over a connection's streams: a file goes as a marked stream."""

    def __init__(self, streams: Streams) -> None:
        self._streams = streams

    def send(self, path: os.PathLike[str]) -> FileRef:
        stream_id = self._streams.send_file(path, kind=FrameKind.MESSAGE, request_id=FILE_STREAM_MARK, announce=False)
        progress = self._streams.progress(stream_id, incoming=False)
        return FileRef(stream_id, progress[1] if progress is not None else 0, Path(path).name)

    def abort(self, stream_id: int) -> None:
        self._streams.abort(stream_id, "the call carrying this file was not sent")


def encode_with_files(
    encoder: msgspec.msgpack.Encoder, files: FileChannel | None, m: MethodSpec, values: list[object]
) -> bytes:
    """The arguments' msgpack with each ``Path`` argument streamed and sent as a :class:`FileRef`.
    The other arguments are checked first, so a file starts streaming only for a call that goes out."""
    paths: list[tuple[int, os.PathLike[str]]] = []
    for position, optional in m.file_params:
        value = values[position]
        if value is None and optional:
            continue
        if not isinstance(value, os.PathLike):
            raise InterfaceError(f"{m.qualname}() argument {position}: a file (os.PathLike), not {value!r}")
        paths.append((position, value))
        values[position] = FileRef(0, 0, "")
    try:
        body = encoder.encode(values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InterfaceError(f"{m.qualname}: arguments cannot be serialized ({exc})") from exc
    m.check(body)
    if not paths:
        return body
    if files is None:
        raise InterfaceError(f"{m.qualname}: this connection cannot stream a Path argument")
    started: list[int] = []
    try:
        for position, path in paths:
            ref = files.send(path)
            started.append(ref.stream_id)
            values[position] = ref
    except BaseException:
        for stream_id in started:
            files.abort(stream_id)
        raise
    return encoder.encode(values)


def file_out(files: FileChannel | None, result: object, spec: MethodSpec) -> FileRef | None:
    """A ``Path`` result: the file starts streaming to the caller; the response carries its reference."""
    if result is None and spec.file_result_optional:
        return None
    if not isinstance(result, os.PathLike):
        raise InterfaceError(f"{spec.qualname}() returned {type(result).__qualname__}, not a file (os.PathLike)")
    if files is None:
        raise StreamingError(f"{spec.qualname}(): this connection cannot stream a Path result")
    return files.send(result)


@dataclass(slots=True)
class _Waiter:
    """A file some call waits for: a host call's argument (``invocation_id``) or a result (``call_id``)."""

    ref: FileRef
    invocation_id: int = 0
    call_id: int = 0


class RmiFiles:
    """Matches incoming file streams with the calls and results that name them (see the module)."""

    def __init__(self, store: FileStore) -> None:
        self._store = store
        self._marked: set[int] = set()
        """Incoming streams marked as RMI files, not yet complete."""
        self._arrived: OrderedDict[int, tuple[str, int]] = OrderedDict()
        """Files that arrived before the call or response naming them: stream id -> (path, size)."""
        self._failed: OrderedDict[int, str] = OrderedDict()
        self._unwanted: set[int] = set()
        """Streams whose call gave up on them: removed when they arrive."""
        self._waiters: dict[int, _Waiter] = {}
        """Stream id -> the call waiting for its file."""
        self._held: dict[int, tuple[Invocation, set[int]]] = {}
        """Host calls waiting for files, by invocation id, with the streams still missing."""
        self._claimed: dict[int, list[int]] = {}
        """Files of host calls (by invocation id), removed when the call completed or failed."""
        self._ready: list[Invocation] = []
        self._refused: list[tuple[Invocation, StreamingError]] = []
        self._events: list[RmiCallCompleted | RmiCallFailed] = []
        self.has_output = False
        """Something waits to be taken: set as each output comes, recomputed as each kind is taken (a plain
        attribute, since :class:`~.calls.RemoteCalls` asks after every input and call)."""
        self._closed_reason: str | None = None

    # -- outputs ----------------------------------------------------------------------------------

    def take_ready(self) -> list[Invocation]:
        """Held host calls whose files have all arrived (their arguments now hold the copies' paths)."""
        ready, self._ready = self._ready, []
        self.has_output = bool(self._refused or self._events)
        return ready

    def take_refused(self) -> list[tuple[Invocation, StreamingError]]:
        """Held host calls that cannot run because a file did not arrive: answer each with its error."""
        refused, self._refused = self._refused, []
        self.has_output = bool(self._ready or self._events)
        return refused

    def take_events(self) -> list[RmiCallCompleted | RmiCallFailed]:
        """Path results that completed or failed."""
        events, self._events = self._events, []
        self.has_output = bool(self._ready or self._refused)
        return events

    # -- streams ----------------------------------------------------------------------------------

    def started(self, stream_id: int) -> None:
        """An incoming file stream marked for RMI was announced."""
        self._marked.add(stream_id)

    def arrived(self, stream_id: int, path: str, size: int) -> bool:
        """A file stream completed: True when it carries an RMI file (then RMI owns the temporary copy
        and the connection must not dispatch it as a message)."""
        if stream_id not in self._marked:
            return False
        self._marked.discard(stream_id)
        if stream_id in self._unwanted:
            self._unwanted.discard(stream_id)
            self._store.release(stream_id)
            return True
        waiter = self._waiters.pop(stream_id, None)
        if waiter is not None:
            self._settle(waiter, path, size)
            return True
        self._arrived[stream_id] = (path, size)
        while len(self._arrived) > UNCLAIMED_FILES:
            oldest, _ = self._arrived.popitem(last=False)
            self._store.release(oldest)
            self._remember_failure(oldest, "removed unclaimed (too many files arrived for no call)")
        return True

    def failed(self, stream_id: int, reason: str) -> None:
        """An incoming stream failed (any: one refused at its start was never marked)."""
        self._marked.discard(stream_id)
        self._unwanted.discard(stream_id)
        waiter = self._waiters.pop(stream_id, None)
        if waiter is not None:
            self._error(waiter, f"a file did not arrive: {reason}")
        else:
            self._remember_failure(stream_id, reason)

    def _remember_failure(self, stream_id: int, reason: str) -> None:
        self._failed[stream_id] = reason
        while len(self._failed) > FAILED_REMEMBERED:
            self._failed.popitem(last=False)

    # -- calls ------------------------------------------------------------------------------------

    def hold(self, invocation: Invocation) -> None:
        """A host call naming files (``invocation.files``, ``invocation_id`` set): handed out by
        :meth:`take_ready` once they all arrived, or by :meth:`take_refused` when one cannot."""
        invocation_id = invocation.invocation_id
        self._held[invocation_id] = (invocation, {ref.stream_id for _, ref in invocation.files})
        self._claimed[invocation_id] = []
        for _, ref in invocation.files:
            if invocation_id not in self._held:
                break  # refused already: its other files are unwanted
            self._claim(_Waiter(ref, invocation_id=invocation_id))

    def await_result(self, call_id: int, ref: FileRef) -> None:
        """A call's response names a ``Path`` result: the call completes once its file arrived."""
        self._claim(_Waiter(ref, call_id=call_id))

    def release(self, invocation_id: int) -> None:
        """A host call completed or failed: remove the copies of its files."""
        for stream_id in self._claimed.pop(invocation_id, ()):
            self._store.release(stream_id)

    def abandon(self, call_id: int) -> None:
        """The caller of ``call_id`` went away: a result file it waits for is removed when it arrives."""
        for stream_id, waiter in list(self._waiters.items()):
            if waiter.call_id == call_id:
                del self._waiters[stream_id]
                self.discard(stream_id)

    def discard(self, stream_id: int) -> None:
        """Nobody wants the file of ``stream_id`` (its call gave up): removed now or when it arrives."""
        if self._arrived.pop(stream_id, None) is not None:
            self._store.release(stream_id)
        elif stream_id not in self._failed:
            self._unwanted.add(stream_id)

    def close(self, reason: str) -> None:
        """The connection closed: results waiting for files fail, held calls are dropped (no answer can
        go), files that arrived for no call are removed."""
        self._closed_reason = reason
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            if waiter.call_id:
                self._error(waiter, f"a file did not arrive: {reason}")
        self._held.clear()
        for stream_id in list(self._arrived):
            self._store.release(stream_id)
        self._arrived.clear()
        self._marked.clear()
        self._unwanted.clear()

    def _claim(self, waiter: _Waiter) -> None:
        """Take the file ``waiter`` names if it arrived or failed already, else wait for it."""
        ref = waiter.ref
        stream_id = ref.stream_id
        arrived = self._arrived.pop(stream_id, None)
        if arrived is not None:
            self._settle(waiter, *arrived)
        elif stream_id in self._failed:
            self._error(waiter, f"file {ref.name!r} did not arrive: {self._failed[stream_id]}")
        elif self._closed_reason is not None:
            self._error(waiter, f"file {ref.name!r} did not arrive: {self._closed_reason}")
        elif stream_id in self._waiters or len(self._waiters) >= FILE_WAITERS:
            self._error(waiter, f"file {ref.name!r}: too many calls wait for files")
        else:
            self._waiters[stream_id] = waiter

    def _settle(self, waiter: _Waiter, path: str, size: int) -> None:
        """The stream checked size and SHA-256 against what the sender streamed; this checks the size
        against what the call announced, then hands the copy over."""
        ref = waiter.ref
        if size != ref.size:
            self._store.release(ref.stream_id)
            self._error(waiter, f"file {ref.name!r}: {size} bytes arrived, the call announced {ref.size}")
            return
        if waiter.call_id:
            self._store.detach(ref.stream_id)  # the caller owns it now
            self._events.append(RmiCallCompleted(waiter.call_id, Path(path)))
            self.has_output = True
            return
        held = self._held.get(waiter.invocation_id)
        if held is None:
            self._store.release(ref.stream_id)
            return
        invocation, missing = held
        self._claimed[waiter.invocation_id].append(ref.stream_id)
        args = list(invocation.args)
        for position, file_ref in invocation.files:
            if file_ref.stream_id == ref.stream_id:
                args[position] = Path(path)
        invocation.args = tuple(args)
        missing.discard(ref.stream_id)
        if not missing:
            del self._held[waiter.invocation_id]
            self._ready.append(invocation)
            self.has_output = True

    def _error(self, waiter: _Waiter, message: str) -> None:
        if waiter.call_id:
            self._events.append(RmiCallFailed(waiter.call_id, RmiFailure.FILE_FAILED, "", message=message))
            self.has_output = True
            return
        held = self._held.pop(waiter.invocation_id, None)
        if held is None:
            return
        invocation, missing = held
        for stream_id in missing - {waiter.ref.stream_id}:
            other = self._waiters.get(stream_id)
            if other is not None and other.invocation_id == waiter.invocation_id:
                del self._waiters[stream_id]
            self.discard(stream_id)
        self.release(waiter.invocation_id)
        self._refused.append((invocation, StreamingError(message)))
        self.has_output = True
