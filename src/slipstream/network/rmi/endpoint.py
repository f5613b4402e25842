"""One connection's remote calls, sans-I/O: the caller's side (response ids, deadlines, results) and
the host's (vetted requests, responses).

Response ids come from one bounded pool (2-65535, every one freed: on response, timeout or close);
the token's upper 16 bits are a generation counter, so a late or replayed response to a freed id is
dropped and counted instead of completing another call.

Everything here takes ``now_ns`` and returns frames (``take_frames``) and pure-data events
(``take_events``): an object the peer hosts arrives as a :class:`~.objects.RemoteRef`, which the
adapter turns into a proxy. Running a host method is left to the adapter: a request becomes an
:class:`Invocation` (the function comes from the registered interface's table), which the adapter
runs and answers with :meth:`RmiEndpoint.complete` or :meth:`RmiEndpoint.fail`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..errors import (
    InterfaceError,
    RemoteError,
    RemoteObjectMissing,
    RmiCallTimeout,
    RmiConnectionClosed,
    RmiError,
    RmiRequestRefused,
    StreamingError,
)
from ..events import RmiCallCompleted, RmiCallFailed, RmiEvent, RmiFailure, RmiObjectReceived, RmiOnewayFailed
from ..frames import RMI_REQUEST, RMI_RESPONSE
from .files import FileChannel, encode_with_files, file_out
from .invocation import Invocation
from .objects import ObjectTable, ProxyBase, RemoteRef
from .pending import IdPool, Pending, PendingCalls
from .registry import InterfaceSpec, MethodSpec, RmiRegistry
from .wire import (
    ARGS_AS_BYTES,
    DEFAULT_TIMEOUT_NS,
    EXCEPTION_BODY,
    FLAG_CREATE,
    FLAG_GLOBAL,
    FLAG_OBJECT,
    INT_BODY,
    MAX_OBJECT_ID,
    MAX_TEXT,
    MAX_TRACEBACK,
    MIN_OBJECT_ID,
    MIN_RESPONSE_ID,
    MISSING_BODY,
    ONEWAY_REQUEST_ID,
    OWNER_RECEIVER,
    OWNER_SENDER,
    REF_BODY,
    REQUEST_HEADER,
    SIMPLE_ARG_TYPES,
    TEXT_BODY,
    FileRef,
    OutFrame,
    Status,
    WireRef,
)

__all__ = ["RmiEndpoint", "RmiStats", "exception_from"]

_STATUS_BYTE = tuple(bytes((status,)) for status in range(256))
"""A response's status byte, prebuilt."""
_OK = Status.OK
"""(A module name, as ``frames.RMI_REQUEST``: every call's response reads it.)"""


@dataclass(slots=True)
class RmiStats:
    """Counters of one endpoint."""

    calls_sent: int = 0
    oneway_sent: int = 0
    responses_received: int = 0
    responses_dropped: int = 0
    """Responses to no pending call (late, replayed or forged)."""
    requests_received: int = 0
    requests_refused: int = 0
    objects_missing: int = 0


class _Refused(Exception):
    pass


class _Missing(Exception):
    def __init__(self, object_id: int, is_global: bool) -> None:
        self.object_id = object_id
        self.is_global = is_global


class RmiEndpoint:
    """One connection's RMI: outgoing calls with their response ids and deadlines, and the host side.

    ``global_objects`` is the server's table shared by all connections (a client passes None: it
    hosts no global objects); ``objects`` is this connection's table. ``response_ids`` may be the
    connection's shared pool (2-65535, anything with IdAllocator's allocate/free); by default the
    endpoint has its own ``IdAllocator(2, 65535)`` on a fast non-cryptographic RNG (response ids need
    no secrecy: records are authenticated and every call token carries a generation too). ``files``
    streams ``Path`` arguments and results (the connection's streams); without it they are refused.
    """

    def __init__(
        self,
        registry: RmiRegistry,
        *,
        global_objects: ObjectTable | None = None,
        response_ids: IdPool | None = None,
        files: FileChannel | None = None,
        tracebacks: bool = False,
    ) -> None:
        self.registry = registry
        self.tracebacks = tracebacks
        """Whether an exception a hosted method raised goes back with its traceback (the server's
        ``rmi_tracebacks``); without, the caller gets its type and message only."""
        self.global_objects = global_objects
        self.objects = ObjectTable(registry)
        self.stats = RmiStats()
        self.closed = False
        self.close_reason = ""
        self._pending = PendingCalls(response_ids)
        self.frames: list[OutFrame] = []
        """Frames to send, oldest first (each ``(kind, request id, payload)``): taken with :meth:`take_frames`, or
        read in place and replaced by the connection's :class:`~.calls.RemoteCalls`, which looks at them after
        every input."""
        self.events: list[RmiEvent] = []
        """Events since the last :meth:`take_events` (the same)."""
        self._encoder = msgspec.msgpack.Encoder()
        self.files = files
        """How ``Path`` arguments and results are streamed; None: refused."""

    # -- outputs ----------------------------------------------------------------------------------

    def take_frames(self) -> list[OutFrame]:
        """Frames to send, oldest first (each ``(kind, request id, payload)``)."""
        frames, self.frames = self.frames, []
        return frames

    def take_events(self) -> list[RmiEvent]:
        """Events since the last call."""
        events, self.events = self.events, []
        return events

    @property
    def has_output(self) -> bool:
        """Frames or events are waiting to be taken."""
        return bool(self.frames or self.events)

    def is_waiting(self, call_id: int) -> bool:
        """Whether the call ``call_id`` waits for its response."""
        return self._pending.get(call_id) is not None

    @property
    def in_flight(self) -> int:
        """Calls waiting for a response."""
        return len(self._pending)

    @property
    def deadline_ns(self) -> int | None:
        """The earliest call timeout, or None."""
        return self._pending.deadline_ns

    def handle_timer(self, now_ns: int) -> None:
        """Fail every call whose deadline has passed (freeing its response id)."""
        for token, pending in self._pending.expired(now_ns):
            self.events.append(RmiCallFailed(token, RmiFailure.TIMED_OUT, pending.method))

    def close(self, reason: str = "connection closed") -> None:
        """The connection closed: every call in flight fails at once, ids are freed, objects forgotten."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        for token, pending in self._pending.finish_all():
            self.events.append(RmiCallFailed(token, RmiFailure.CLOSED, pending.method, message=reason))
        self.frames.clear()
        self.objects.clear()

    # -- caller side ------------------------------------------------------------------------------

    def call(
        self,
        ref: RemoteRef,
        method: MethodSpec | str,
        args: Sequence[object],
        now_ns: int,
        *,
        timeout_ns: int = DEFAULT_TIMEOUT_NS,
        oneway: bool = False,
    ) -> int:
        """Queue a call of ``method`` on the peer's object ``ref`` with positional ``args``.

        Returns the call id that :class:`RmiCallCompleted`/:class:`RmiCallFailed` will name (0 for a
        fire-and-forget call, which gets no response). ``timeout_ns`` 0 waits forever; negative is
        refused. Raises InterfaceError for arguments that do not fit, RmiConnectionClosed when closed.
        """
        if timeout_ns < 0:
            raise ValueError(f"timeout must not be negative: {timeout_ns} ns")
        spec = self.registry.interfaces[ref.interface_id]
        m = method if type(method) is MethodSpec else spec.by_name.get(method)  # type: ignore[arg-type]
        if m is None or m.interface_id != ref.interface_id:
            raise InterfaceError(f"{spec.name} has no method {method!r}")
        if self.closed:
            raise RmiConnectionClosed(f"cannot call {spec.name}.{m.name}: {self.close_reason}")
        if len(args) != len(m.param_names):
            raise InterfaceError(f"{spec.name}.{m.name} takes {len(m.param_names)} arguments, not {len(args)}")
        values: Sequence[object] = args
        if m.ref_params:
            values = list(args)
            for position, interface_id, optional in m.ref_params:
                values[position] = self._ref_out(
                    values[position], interface_id, optional, f"{m.name}() argument {position}"
                )
        header = REQUEST_HEADER.pack(FLAG_GLOBAL if ref.is_global else 0, ref.object_id, ref.interface_id, m.index)
        payload: bytes | bytearray
        if m.file_params:
            payload = header + encode_with_files(self._encoder, self.files, m, list(values))
        else:  # the arguments encoded after the header in place: no body object, no concatenation
            payload = bytearray(header)
            try:
                self._encoder.encode_into(values, payload, -1)
            except (TypeError, ValueError, OverflowError) as exc:
                raise InterfaceError(f"{spec.name}.{m.name}: arguments cannot be serialized ({exc})") from exc
            m.check(memoryview(payload)[REQUEST_HEADER.size :])
        if oneway:
            self.frames.append((RMI_REQUEST, ONEWAY_REQUEST_ID, payload))
            self.stats.oneway_sent += 1
            return 0
        token = self._pending.start(Pending(m.qualname, m, ref.interface_id), now_ns, timeout_ns)
        self.frames.append((RMI_REQUEST, token, payload))
        self.stats.calls_sent += 1
        return token

    def create(
        self, interface: type, args: Sequence[object], now_ns: int, *, timeout_ns: int = DEFAULT_TIMEOUT_NS
    ) -> int:
        """Ask the peer to construct its implementation of ``interface`` with ``args`` (registered
        messages or builtins); the :class:`RmiCallCompleted` value is the new object's RemoteRef."""
        spec = self.registry.interface(interface)
        if self.closed:
            raise RmiConnectionClosed(f"cannot create a {spec.name}: {self.close_reason}")
        messages = self.registry.messages
        if messages is None and args:
            raise InterfaceError("create() with arguments needs the registry's message serialization")
        encoded = [messages.encode(a) for a in args] if messages is not None else []
        payload = REQUEST_HEADER.pack(FLAG_CREATE, 0, spec.interface_id, 0) + self._encoder.encode(encoded)
        if timeout_ns < 0:
            raise ValueError(f"timeout must not be negative: {timeout_ns} ns")
        token = self._pending.start(Pending(f"create({spec.name})", None, spec.interface_id), now_ns, timeout_ns)
        self.frames.append((RMI_REQUEST, token, payload))
        self.stats.calls_sent += 1
        return token

    def is_remote_object(self, value: object) -> bool:
        """Whether ``value`` travels as a remote object when sent as a message (a proxy of this
        connection, or an instance of a registered implementation)."""
        return isinstance(value, (ProxyBase, RemoteRef)) or bool(self.registry.served(value))

    def send_object(self, value: object) -> None:
        """Send a proxy or a registered implementation as a *message*: the peer gets
        :class:`RmiObjectReceived` with its own object (for a proxy it hosts) or a proxy (for an
        implementation this side now hosts, saved in the connection's table if it was not yet)."""
        if self.closed:
            raise RmiConnectionClosed(f"cannot send an object: {self.close_reason}")
        if isinstance(value, ProxyBase):
            interface_id = value.rmi_ref.interface_id
        elif isinstance(value, RemoteRef):
            interface_id = value.interface_id
        else:
            served = self.registry.served(value)
            if not served:
                raise InterfaceError(
                    f"{type(value).__qualname__} is not a registered implementation of any RMI interface"
                )
            interface_id = served[0]
        wire_ref = self._ref_out(value, interface_id, False, "send_object()")
        payload = REQUEST_HEADER.pack(FLAG_OBJECT, 0, interface_id, 0) + self._encoder.encode(wire_ref)
        self.frames.append((RMI_REQUEST, ONEWAY_REQUEST_ID, payload))

    def receive_response(self, request_id: int, payload: bytes) -> None:
        """An RMI_RESPONSE frame: completes (or fails) the pending call it names; others are counted."""
        pending = self._pending.finish(request_id) if payload else None  # (an empty one leaves the call waiting)
        if pending is None:
            self.stats.responses_dropped += 1
            return
        self.stats.responses_received += 1
        status = payload[0]
        body = payload[1:]
        method = pending.method
        try:
            if status == _OK and pending.spec is not None:
                value = pending.spec.result_decoder.decode(body)
                if pending.spec.ref_result is not None:
                    value = self._ref_in(value, pending.spec.ref_result[0])
                self.events.append(RmiCallCompleted(request_id, value))
            elif status == Status.CREATED and pending.spec is None:
                object_id = INT_BODY.decode(body)
                if not MIN_OBJECT_ID <= object_id <= MAX_OBJECT_ID:
                    raise _Refused(f"object id {object_id} out of range")
                self.events.append(RmiCallCompleted(request_id, RemoteRef(pending.interface_id, object_id)))
            elif status == Status.EXCEPTION:
                type_name, message, tb, args = EXCEPTION_BODY.decode(body)
                self.events.append(
                    RmiCallFailed(
                        request_id,
                        RmiFailure.EXCEPTION,
                        method,
                        type_name[:MAX_TEXT],
                        message[:MAX_TEXT],
                        tb[:MAX_TRACEBACK],
                        tuple(args) if args is not None else None,
                    )
                )
            elif status == Status.MISSING:
                object_id, is_global = MISSING_BODY.decode(body)
                self.events.append(
                    RmiCallFailed(request_id, RmiFailure.MISSING, method, object_id=object_id, is_global=is_global)
                )
            elif status in (Status.REFUSED, Status.BUSY):
                failure = RmiFailure.REFUSED if status == Status.REFUSED else RmiFailure.BUSY
                text = TEXT_BODY.decode(body)[:MAX_TEXT]
                self.events.append(RmiCallFailed(request_id, failure, method, message=text))
            else:
                raise _Refused(f"unexpected response status {status}")
        except Exception as exc:  # a hostile or mismatched response: the call fails, nothing escapes
            self.events.append(RmiCallFailed(request_id, RmiFailure.BAD_RESPONSE, method, message=str(exc)[:MAX_TEXT]))

    # -- host side --------------------------------------------------------------------------------

    def receive_request(self, request_id: int, payload: bytes, caller: object = None) -> Invocation | None:
        """An RMI_REQUEST frame. Returns the vetted :class:`Invocation` to run, or None when the request
        was refused (an error response is queued unless it was fire-and-forget). ``caller`` is passed
        as the first argument to implementation methods that declare the calling connection."""
        self.stats.requests_received += 1
        oneway = request_id == ONEWAY_REQUEST_ID
        if self.closed:
            return None
        if len(payload) < REQUEST_HEADER.size or (not oneway and request_id & 0xFFFF < MIN_RESPONSE_ID):
            self.stats.requests_refused += 1
            if not oneway:
                self._respond(request_id, Status.REFUSED, self._encoder.encode("malformed request"))
            return None
        flags, object_id, interface_id, method_index = REQUEST_HEADER.unpack_from(payload)
        method_name = "?"
        try:
            if interface_id >= len(self.registry.interfaces):
                raise _Refused(f"unknown interface index {interface_id}")
            spec = self.registry.interfaces[interface_id]
            if flags == FLAG_OBJECT:
                if not oneway:
                    raise _Refused("an object message expects no response")
                try:
                    wire_ref = REF_BODY.decode(payload[REQUEST_HEADER.size :])
                except Exception as exc:
                    raise _Refused(f"bad object reference: {str(exc)[:200]}") from None
                self.events.append(RmiObjectReceived(self._ref_in(wire_ref, interface_id)))
                return None
            if flags & FLAG_CREATE:
                method_name = f"create({spec.name})"
                return self._create_invocation(request_id, oneway, spec, payload[REQUEST_HEADER.size :])
            if flags & ~FLAG_GLOBAL:
                raise _Refused(f"unknown flags {flags:#x}")
            if method_index >= len(spec.methods):
                raise _Refused(f"{spec.name} has no method index {method_index}")
            m = spec.methods[method_index]
            method_name = m.qualname
            is_global = bool(flags & FLAG_GLOBAL)
            table = self.global_objects if is_global else self.objects
            target = table.get(object_id) if table is not None else None
            if target is None:
                raise _Missing(object_id, is_global)
            if interface_id not in self.registry.served(target):
                raise _Refused(f"object {object_id} does not serve {spec.name}")
            try:
                args = list(m.arg_decoder.decode(payload[REQUEST_HEADER.size :]))
            except Exception as exc:
                raise _Refused(f"bad arguments for {method_name}: {str(exc)[:200]}") from None
            for position, ref_interface, _ in m.ref_params:
                args[position] = self._ref_in(args[position], ref_interface)
            try:
                function, takes_connection = self.registry.functions(type(target), interface_id)[m.index]
            except Exception as exc:  # e.g. a subclass of the implementation with another signature
                raise _Refused(f"{method_name} cannot be dispatched on this side: {str(exc)[:200]}") from None
            call_args = (target, caller, *args) if takes_connection else (target, *args)
            files: tuple[tuple[int, FileRef], ...] = ()
            if m.file_params:
                skip = 2 if takes_connection else 1
                files = tuple(
                    (skip + position, ref)
                    for position, _ in m.file_params
                    if isinstance(ref := args[position], FileRef)
                )
                for _, ref in files:
                    if not (0 < ref.stream_id <= 0xFFFF_FFFF and ref.size >= 0):
                        raise _Refused(f"bad file reference for {method_name}")
            return Invocation(
                request_id,
                oneway,
                object_id,
                method_name,
                m,
                function,
                call_args,
                files=files,
                caller_slot=1 if takes_connection else -1,
            )
        except _Missing as missing:
            self.stats.objects_missing += 1
            if not oneway:
                self._respond(request_id, Status.MISSING, self._encoder.encode((missing.object_id, missing.is_global)))
            else:
                self.events.append(
                    RmiOnewayFailed(object_id, method_name, "RemoteObjectMissing", f"no object {missing.object_id}", "")
                )
            return None
        except _Refused as refused:
            self.stats.requests_refused += 1
            if not oneway:
                self._respond(request_id, Status.REFUSED, self._encoder.encode(str(refused)))
            return None

    def refuse_busy(self, request_id: int, limit: int) -> None:
        """Refuse a request unrun because ``limit`` calls and listener tasks run already: the caller hears
        BUSY; a fire-and-forget call, which nobody answers, is reported here (RmiOnewayFailed)."""
        self.stats.requests_refused += 1
        text = f"busy: {limit} calls and listener tasks already run for this connection (max_pending_calls)"
        if request_id != ONEWAY_REQUEST_ID:
            if not self.closed and request_id & 0xFFFF >= MIN_RESPONSE_ID:
                self._respond(request_id, Status.BUSY, self._encoder.encode(text))
        else:
            self.events.append(RmiOnewayFailed(0, "?", "RmiRequestRefused", text, ""))

    def _create_invocation(self, request_id: int, oneway: bool, spec: InterfaceSpec, body: bytes) -> Invocation:
        impl = spec.implementation
        if impl is None:
            raise _Refused(f"this side registers no implementation of {spec.name}")
        messages = self.registry.messages
        try:
            raw = ARGS_AS_BYTES.decode(body)
            args = tuple(messages.decode(a) for a in raw) if messages is not None else ()
            if raw and messages is None:
                raise ValueError("no message serialization")
        except Exception as exc:
            raise _Refused(f"bad constructor arguments for {spec.name}: {str(exc)[:200]}") from None
        return Invocation(request_id, oneway, 0, f"create({spec.name})", None, impl, args, spec.interface_id)

    def execute(
        self, invocation: Invocation, caller: object = None, resolve: Callable[[RemoteRef], object] | None = None
    ) -> Any:
        """Run ``invocation`` and respond, or return the awaitable a coroutine method gave (the adapter
        awaits it and then calls :meth:`complete` or :meth:`fail`); ``caller`` and ``resolve`` as for
        :meth:`Invocation.arguments`."""
        try:
            result = invocation.call(caller, resolve)
        except Exception as exc:
            self.fail(invocation, exc)
            return None
        if result is not None and hasattr(type(result), "__await__"):
            return result
        self.complete(invocation, result)
        return None

    def complete(self, invocation: Invocation, result: object) -> None:
        """Respond with ``result`` (a create's result is the constructed object: it is saved here)."""
        if self.closed:
            return
        if invocation.create_interface >= 0:
            try:
                object_id = self.objects.save(result)
            except RmiError as exc:
                self.fail(invocation, exc)
                return
            if not invocation.oneway:
                self._respond(invocation.request_id, Status.CREATED, self._encoder.encode(object_id))
            return
        if invocation.oneway:
            return
        spec = invocation.spec
        assert spec is not None
        try:
            if spec.ref_result is not None:
                result = self._ref_out(result, spec.ref_result[0], spec.ref_result[1], f"{spec.name}() result")
            elif spec.file_result:
                result = file_out(self.files, result, spec)
            body = self._encoder.encode(result)
        except Exception as exc:
            self.fail(invocation, exc)
            return
        self._respond(invocation.request_id, _OK, body)

    def fail(self, invocation: Invocation, exc: BaseException) -> None:
        """Respond with the exception the method raised (type name, message; its traceback only with
        ``tracebacks``)."""
        if self.closed:
            return
        type_name = type(exc).__qualname__
        message = str(exc)[:MAX_TEXT]
        if invocation.oneway:  # reported here (on_error), never sent: the traceback stays
            tb = "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:]
            self.events.append(RmiOnewayFailed(invocation.object_id, invocation.method, type_name, message, tb))
            return
        tb = "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:] if self.tracebacks else ""
        args: list[object] | None = list(exc.args)
        if not all(isinstance(a, SIMPLE_ARG_TYPES) for a in exc.args):
            args = None
        try:
            body = self._encoder.encode((type_name, message, tb, args))
        except (TypeError, ValueError, OverflowError):
            body = self._encoder.encode((type_name, message, tb, None))
        self._respond(invocation.request_id, Status.EXCEPTION, body)

    def _respond(self, request_id: int, status: Status, body: bytes) -> None:
        self.frames.append((RMI_RESPONSE, request_id, _STATUS_BYTE[status] + body))

    # -- substitution -----------------------------------------------------------------------------

    def _ref_out(self, value: object, interface_id: int, optional: bool, where: str) -> WireRef | None:
        """An interface-typed value on its way out: a proxy goes back as a reference to the receiver's
        object; a local implementation is saved here (if it is not yet) and goes as a reference to it."""
        spec = self.registry.interfaces[interface_id]
        if value is None:
            if optional:
                return None
            raise InterfaceError(f"{where}: None is not a {spec.name}")
        if isinstance(value, (ProxyBase, RemoteRef)):
            if isinstance(value, RemoteRef):  # the pure-data proxy of the default proxy factory
                ref = value
            else:
                ref = value.rmi_ref
                if value.rmi_endpoint is not self:
                    raise InterfaceError(f"{where}: a proxy can only be sent back over the connection it came from")
            if ref.interface_id != interface_id:
                raise InterfaceError(
                    f"{where}: a proxy of {self.registry.interfaces[ref.interface_id].name} is not a {spec.name}"
                )
            return WireRef(int(ref.is_global), ref.object_id, interface_id, OWNER_RECEIVER)
        if interface_id not in self.registry.served(value):
            raise InterfaceError(
                f"{where}: {type(value).__qualname__} is not a registered implementation of {spec.name}"
            )
        if self.global_objects is not None:
            global_id = self.global_objects.id_of(value)
            if global_id is not None:
                return WireRef(1, global_id, interface_id, OWNER_SENDER)
        return WireRef(0, self.objects.save(value), interface_id, OWNER_SENDER)

    def _ref_in(self, value: object, interface_id: int) -> object:
        """An interface-typed value that arrived: our own object when it names one we host, else a proxy."""
        if value is None:
            return None
        assert isinstance(value, WireRef)
        if value.interface_id != interface_id:
            raise _Refused(f"a reference to interface {value.interface_id} where {interface_id} is declared")
        is_global = bool(value.scope)
        if value.owner == OWNER_RECEIVER:
            table = self.global_objects if is_global else self.objects
            obj = table.get(value.object_id) if table is not None else None
            if obj is None:
                raise _Missing(value.object_id, is_global)
            if interface_id not in self.registry.served(obj):
                raise _Refused(f"object {value.object_id} does not serve interface {interface_id}")
            return obj
        if not MIN_OBJECT_ID <= value.object_id <= MAX_OBJECT_ID:
            raise _Refused(f"object id {value.object_id} out of range")
        return RemoteRef(interface_id, value.object_id, is_global)


def exception_from(event: RmiCallFailed, registry: RmiRegistry) -> BaseException:
    """The exception a failed call raises: the remote type when registered here, else RemoteError."""
    if event.failure == RmiFailure.EXCEPTION:
        exc_type = registry.exception_type(event.type_name)
        if exc_type is not None:
            try:
                exc = exc_type(*event.args) if event.args is not None else exc_type(event.message)
            except Exception:
                exc = None
            if exc is not None:
                exc.remote_traceback = event.traceback_text  # type: ignore[attr-defined]
                return exc
        return RemoteError(event.type_name, event.message, event.traceback_text)
    if event.failure == RmiFailure.MISSING:
        return RemoteObjectMissing(event.object_id, event.is_global)
    if event.failure == RmiFailure.TIMED_OUT:
        return RmiCallTimeout(f"no response to {event.method} within its timeout")
    if event.failure == RmiFailure.CLOSED:
        return RmiConnectionClosed(f"the connection closed before {event.method} returned: {event.message}")
    if event.failure in (RmiFailure.REFUSED, RmiFailure.BUSY):
        reason = "busy" if event.failure == RmiFailure.BUSY else "malformed"
        return RmiRequestRefused(f"the remote refused {event.method}: {event.message}", reason)
    if event.failure == RmiFailure.FILE_FAILED:
        return StreamingError(event.message)
    return RmiError(f"bad response to {event.method}: {event.message}")
