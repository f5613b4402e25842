"""Remote objects (RMI), sans-I/O: interfaces, object tables, calls and the host-side dispatcher.

An *interface* is a Python class (a ``typing.Protocol`` or an abstract base) whose public methods are
the only things a peer can call. Registration resolves each method once: its index (methods sorted by
name), its parameter and result annotations (registered message types, builtins and containers of
them, or another registered interface), and a typed msgspec decoder for its arguments and result. On
the wire a call names ``(object id, interface index, method index)``; the host looks the function up
in that table, never by a name the peer sent, so no attribute, dunder or unregistered method can be
reached (the lesson of RPyC's and Pyro's security history).

Frames (kinds of :mod:`.frames`):

- ``RMI_REQUEST``: ``request_id`` = call token (``generation << 16 | response id``; ``1`` means
  fire-and-forget, no reply); payload = ``flags u8 | object id u16 | interface u16 | method u16`` +
  msgpack array of the arguments (a create request carries each argument as a serialized message).
- ``RMI_RESPONSE``: ``request_id`` = the call's token; payload = status byte + msgpack body.

Response ids come from one bounded pool (2-65535, every one freed: on response, timeout or close);
the token's upper 16 bits are a generation counter, so a late or replayed response to a freed id is
dropped and counted instead of completing another call.

Everything here takes ``now_ns`` and returns frames (``take_frames``) and pure-data events
(``take_events``); executing a host method is the one thing handed to the adapter
(:meth:`RmiEndpoint.execute` calls it and hands back an awaitable when the method is a coroutine).

How a connection composes it: one :class:`RmiEndpoint` per connection (the server passes its global
:class:`ObjectTable`); RMI_REQUEST frames go to :meth:`RmiEndpoint.receive_request` (then ``execute``),
RMI_RESPONSE frames to :meth:`RmiEndpoint.receive_response`; ``take_frames`` after each input or user
call, appended to the batch (streamed when larger than a message); ``deadline_ns`` joins the
connection's; :meth:`RmiEndpoint.close` when it closes. ``aio/rmi.py`` is that loop for asyncio.
"""

from __future__ import annotations

import collections.abc
import hashlib
import heapq
import inspect
import os
import pathlib
import random
import struct
import traceback
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final, Protocol

import msgspec

from ..client.allocation import AllocationError, IdAllocator
from .errors import ConnectionClosedError, NetworkError
from .frames import FrameKind
from .streaming import StreamingError

__all__ = [
    "DEFAULT_TIMEOUT_NS",
    "FILE_STREAM_MARK",
    "ONEWAY_REQUEST_ID",
    "FileChannel",
    "FileRef",
    "InterfaceError",
    "InterfaceSpec",
    "Invocation",
    "MethodSpec",
    "ObjectIdInUse",
    "ObjectTable",
    "OutFrame",
    "ProxyBase",
    "RemoteError",
    "RemoteObjectMissing",
    "RemoteRef",
    "RmiCallCompleted",
    "RmiCallFailed",
    "RmiCallTimeout",
    "RmiConnectionClosed",
    "RmiEndpoint",
    "RmiError",
    "RmiEvent",
    "RmiFailure",
    "RmiObjectReceived",
    "RmiOnewayFailed",
    "RmiRegistry",
    "RmiRequestRefused",
    "RmiStats",
    "exception_from",
]

DEFAULT_TIMEOUT_NS: Final = 3_000_000_000
"""The seed's per-proxy response timeout: 3 s."""
ONEWAY_REQUEST_ID: Final = 1
"""Request id of a fire-and-forget call (the seed's "response id 1 = async"): no response is sent."""
MIN_OBJECT_ID: Final = 1
MAX_OBJECT_ID: Final = 65535
MIN_RESPONSE_ID: Final = 2
MAX_RESPONSE_ID: Final = 65535
FILE_STREAM_MARK: Final = 0x524D4946
"""Request id of the MESSAGE-kind file stream that carries a ``pathlib.Path`` argument or result
("RMIF"): the connection hands such a file to RMI, never to message listeners."""

_REQUEST: Final = struct.Struct(">BHHH")
"""flags, object id, interface index, method index."""
_FLAG_GLOBAL: Final = 0x01
_FLAG_CREATE: Final = 0x02
_FLAG_OBJECT: Final = 0x04
_OWNER_SENDER: Final = 0
_OWNER_RECEIVER: Final = 1
_MAX_TEXT: Final = 4096
_MAX_TRACEBACK: Final = 16384

OutFrame = tuple[int, int, bytes]
"""``(frame kind, request id, payload)``: what the connection machine appends to its batch."""


# -- errors -----------------------------------------------------------------------------------------


class RmiError(NetworkError):
    """Base of the remote-object errors."""


class InterfaceError(RmiError, TypeError):
    """An interface, implementation or call that does not fit the registered interfaces."""


class ObjectIdInUse(RmiError, ValueError):
    """``save(obj, id)`` with an id another object holds (or out of 1-65535)."""


class RemoteError(RmiError):
    """The remote method raised an exception whose type is not registered on this side."""

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text


class RemoteObjectMissing(RmiError, LookupError):
    """The remote side has no object under the proxy's id (never saved, deleted, or another scope)."""

    def __init__(self, object_id: int, is_global: bool) -> None:
        scope = "global" if is_global else "connection-scoped"
        super().__init__(f"remote object {object_id} ({scope}) does not exist")
        self.object_id = object_id
        self.is_global = is_global


class RmiRequestRefused(RmiError):
    """The remote refused the call as malformed (unknown method, bad arguments, interface not served)."""


class RmiCallTimeout(RmiError, TimeoutError):
    """No response within the proxy's timeout; the message names the method."""


class RmiConnectionClosed(RmiError, ConnectionClosedError):
    """The connection closed before the call's response arrived (or before the call was made)."""


# -- registration -----------------------------------------------------------------------------------


class _Ref(msgspec.Struct, array_like=True, frozen=True):
    """A remote object on the wire, in place of an interface-typed argument or result."""

    scope: int  # 0 connection, 1 global
    object_id: int
    interface_id: int
    owner: int  # _OWNER_SENDER: the side that sent this message hosts the object


class FileRef(msgspec.Struct, array_like=True, frozen=True):
    """A file on the wire, in place of a ``Path`` argument or result: the sender streams the file
    (its stream id, as the receiver numbers the incoming stream) and sends this in the call."""

    stream_id: int
    size: int
    name: str


class FileChannel(Protocol):
    """How an endpoint sends a ``Path`` argument or result: the connection streams the file."""

    def send(self, path: os.PathLike[str]) -> FileRef:
        """Start streaming the file (OSError/StreamingError when it cannot be read)."""
        ...

    def abort(self, stream_id: int) -> None:
        """Give up a file stream started for a call that could not be sent after all."""
        ...


@dataclass(frozen=True, slots=True)
class RemoteRef:
    """Pure-data handle of an object the peer hosts: what a proxy refers to."""

    interface_id: int
    object_id: int
    is_global: bool = False


_PLAIN: Final[frozenset[Any]] = frozenset(
    {Any, type(None), None, bool, int, float, str, bytes, bytearray, list, dict, tuple, set, frozenset}
)
_CONTAINERS: Final[frozenset[Any]] = frozenset(
    {
        list,
        tuple,
        dict,
        set,
        frozenset,
        typing.Union,
        types.UnionType,
        typing.Annotated,
        collections.abc.Sequence,
        collections.abc.Mapping,
    }
)


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """One callable method of an interface, resolved at registration."""

    index: int
    name: str
    qualname: str
    """``Interface.method``, for messages."""
    interface_id: int
    signature: inspect.Signature
    param_names: tuple[str, ...]
    annotations: tuple[str, ...]
    result_annotation: str
    ref_params: tuple[tuple[int, int, bool], ...]
    """(position, interface id, optional) of interface-typed parameters."""
    ref_result: tuple[int, bool] | None
    """(interface id, optional) when the result is an interface."""
    arg_decoder: msgspec.msgpack.Decoder[Any] = field(repr=False)
    result_decoder: msgspec.msgpack.Decoder[Any] = field(repr=False)
    file_params: tuple[tuple[int, bool], ...] = ()
    """(position, optional) of ``pathlib.Path`` parameters: each travels as a streamed file."""
    file_result: bool = False
    """The result is a ``pathlib.Path`` (a streamed file)."""
    file_result_optional: bool = False

    def bind(self, args: Sequence[object], kwargs: dict[str, object] | None = None) -> tuple[object, ...]:
        """The call's arguments as one positional tuple (defaults applied); InterfaceError if they do not fit."""
        if not kwargs and len(args) == len(self.param_names):
            return tuple(args)  # the common case, without inspect's general binding
        try:
            bound = self.signature.bind(None, *args, **(kwargs or {}))
        except TypeError as exc:
            raise InterfaceError(f"{self.name}(): {exc}") from None
        bound.apply_defaults()
        return tuple(bound.args[1:])


@dataclass(frozen=True, slots=True)
class InterfaceSpec:
    """A registered interface: its methods by index and name, and this side's implementation if any."""

    interface_id: int
    cls: type
    name: str
    methods: tuple[MethodSpec, ...]
    by_name: dict[str, MethodSpec]
    implementation: type | None


class _Messages(Protocol):
    """The message registry as RMI uses it (``serialization.Serialization``)."""

    types: tuple[type, ...]

    def encode(self, obj: object) -> bytes: ...

    def decode(self, data: bytes) -> object: ...


_DEFAULT_EXCEPTIONS: Final[tuple[type[BaseException], ...]] = (
    ArithmeticError,
    AssertionError,
    AttributeError,
    FileNotFoundError,
    IndexError,
    KeyError,
    LookupError,
    NotImplementedError,
    OverflowError,
    PermissionError,
    RuntimeError,
    TypeError,
    ValueError,
    ZeroDivisionError,
)
"""Builtin exception types re-raised as themselves without registration."""


def _interface_methods(cls: type) -> list[tuple[str, Callable[..., Any]]]:
    """Public functions declared by ``cls`` and its interface bases (not object's, Protocol's, ABC's)."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins", "typing", "abc", "typing_extensions"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod, property)):
                raise InterfaceError(f"{cls.__qualname__}.{name}: interfaces hold plain methods only")
            if inspect.isfunction(value):
                found[name] = value
    return sorted(found.items())


def _file_of(annotation: object) -> bool | None:
    """None unless ``annotation`` is ``pathlib.Path`` (False) or ``Path | None`` (True: optional)."""
    if annotation is pathlib.Path:
        return False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if len(args) == 2 and type(None) in args and pathlib.Path in args:
            return True
    return None


def _describe(annotation: object) -> str:
    if isinstance(annotation, type):
        return annotation.__qualname__
    return str(annotation).replace("typing.", "")


class RmiRegistry:
    """Interfaces (with this side's implementation, if it hosts one) and exception types, in order.

    Both sides register the same interfaces in the same order (an implementation only where that side
    hosts objects); :meth:`description` is what the handshake compares, next to the message types.
    """

    def __init__(
        self,
        interfaces: Iterable[type | tuple[type, type | None]] = (),
        *,
        messages: _Messages | None = None,
        exceptions: Sequence[type[BaseException]] = (),
    ) -> None:
        pairs: list[tuple[type, type | None]] = []
        for item in interfaces:
            iface, impl = item if isinstance(item, tuple) else (item, None)
            if not isinstance(iface, type):
                raise InterfaceError(f"an interface must be a class, not {iface!r}")
            if impl is not None and not isinstance(impl, type):
                raise InterfaceError(f"the implementation of {iface.__qualname__} must be a class, not {impl!r}")
            if any(iface is seen for seen, _ in pairs):
                raise InterfaceError(f"interface {iface.__qualname__} is registered twice")
            pairs.append((iface, impl))
        if len(pairs) > 65535:
            raise InterfaceError("at most 65535 interfaces can be registered")
        self.messages = messages
        self._message_types: frozenset[type] = frozenset(messages.types) if messages is not None else frozenset()
        self._interface_ids: dict[type, int] = {iface: i for i, (iface, _) in enumerate(pairs)}
        self.interfaces: tuple[InterfaceSpec, ...] = tuple(
            self._build(i, iface, impl) for i, (iface, impl) in enumerate(pairs)
        )
        registered_exceptions: list[type[BaseException]] = []
        for exc_type in exceptions:
            if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
                raise InterfaceError(f"exceptions must be Exception subclasses, not {exc_type!r}")
            registered_exceptions.append(exc_type)
        self.exceptions: tuple[type[BaseException], ...] = tuple(registered_exceptions)
        self._exceptions_by_name: dict[str, type[BaseException]] = {e.__qualname__: e for e in _DEFAULT_EXCEPTIONS}
        self._exceptions_by_name.update((e.__qualname__, e) for e in registered_exceptions)
        self._served: dict[type, tuple[int, ...]] = {}
        self._functions: dict[tuple[type, int], tuple[tuple[Callable[..., Any], bool], ...]] = {}
        self._description = msgspec.msgpack.encode(
            [
                1,
                [
                    [spec.name, [[m.name, list(m.annotations), m.result_annotation] for m in spec.methods]]
                    for spec in self.interfaces
                ],
                [e.__qualname__ for e in self.exceptions],
            ]
        )

    # -- building ---------------------------------------------------------------------------------

    def _build(self, interface_id: int, iface: type, impl: type | None) -> InterfaceSpec:
        methods: list[MethodSpec] = []
        for index, (name, function) in enumerate(_interface_methods(iface)):
            methods.append(self._method(interface_id, index, iface, name, function))
        if not methods:
            raise InterfaceError(f"interface {iface.__qualname__} declares no public methods")
        if len(methods) > 65535:
            raise InterfaceError(f"interface {iface.__qualname__} declares more than 65535 methods")
        spec = InterfaceSpec(
            interface_id, iface, iface.__qualname__, tuple(methods), {m.name: m for m in methods}, impl
        )
        if impl is not None:
            self._check_implementation(spec, impl)
        return spec

    def _method(
        self, interface_id: int, index: int, iface: type, name: str, function: Callable[..., Any]
    ) -> MethodSpec:
        where = f"{iface.__qualname__}.{name}"
        signature = inspect.signature(function)
        params = list(signature.parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise InterfaceError(f"{where} must be a method taking self")
        for param in params[1:]:
            if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                raise InterfaceError(
                    f"{where}: parameter {param.name} must be positional (no *args, **kwargs, keyword-only)"
                )
        try:
            hints = typing.get_type_hints(function, include_extras=True)
        except Exception as exc:
            raise InterfaceError(f"{where}: annotations cannot be resolved ({exc})") from exc
        wire: list[Any] = []
        texts: list[str] = []
        refs: list[tuple[int, int, bool]] = []
        files: list[tuple[int, bool]] = []
        for position, param in enumerate(params[1:]):
            if param.name not in hints:
                raise InterfaceError(f"{where}: parameter {param.name} needs a type annotation")
            annotation = hints[param.name]
            ref = self._ref_of(annotation)
            file_optional = _file_of(annotation)
            if ref is not None:
                refs.append((position, ref[0], ref[1]))
                wire.append(_Ref | None if ref[1] else _Ref)
            elif file_optional is not None:
                files.append((position, file_optional))
                wire.append(FileRef | None if file_optional else FileRef)
            else:
                self._check_annotation(annotation, f"{where} parameter {param.name}")
                wire.append(annotation)
            texts.append(_describe(annotation))
        if "return" not in hints:
            raise InterfaceError(f"{where} needs a return annotation (None if it returns nothing)")
        result = hints["return"]
        ref_result = self._ref_of(result)
        file_result = _file_of(result)
        if ref_result is not None:
            result_wire: Any = _Ref | None if ref_result[1] else _Ref
        elif file_result is not None:
            result_wire = FileRef | None if file_result else FileRef
        else:
            self._check_annotation(result, f"{where} result")
            result_wire = result
        try:
            arg_type: Any = tuple.__class_getitem__(tuple(wire)) if wire else tuple[()]
            arg_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(arg_type)
            result_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(result_wire)
        except TypeError as exc:
            raise InterfaceError(f"{where}: annotations msgpack cannot carry ({exc})") from exc
        return MethodSpec(
            index=index,
            name=name,
            qualname=where,
            interface_id=interface_id,
            signature=signature,
            param_names=tuple(p.name for p in params[1:]),
            annotations=tuple(texts),
            result_annotation=_describe(result),
            ref_params=tuple(refs),
            ref_result=ref_result,
            arg_decoder=arg_decoder,
            result_decoder=result_decoder,
            file_params=tuple(files),
            file_result=file_result is not None,
            file_result_optional=bool(file_result),
        )

    def _ref_of(self, annotation: object) -> tuple[int, bool] | None:
        """(interface id, optional) when ``annotation`` is a registered interface or ``Interface | None``."""
        if isinstance(annotation, type) and annotation in self._interface_ids:
            return self._interface_ids[annotation], False
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            args = typing.get_args(annotation)
            rest = [a for a in args if a is not type(None)]
            if len(args) == 2 and len(rest) == 1 and isinstance(rest[0], type) and rest[0] in self._interface_ids:
                return self._interface_ids[rest[0]], True
        return None

    def _check_annotation(self, annotation: object, where: str) -> None:
        """Only builtins, registered message types and containers of them may cross the wire."""
        if annotation in _PLAIN or annotation is Ellipsis:
            return
        origin = typing.get_origin(annotation)
        if origin is typing.Literal:
            return
        if origin is not None:
            if origin not in _CONTAINERS:
                raise InterfaceError(f"{where}: {_describe(annotation)} is not a container msgpack can carry")
            args = typing.get_args(annotation)
            if origin is typing.Annotated:
                args = args[:1]
            for arg in args:
                self._check_annotation(arg, where)
            return
        if isinstance(annotation, type):
            if annotation in self._interface_ids:
                raise InterfaceError(f"{where}: an interface may only be a parameter or result itself, not nested")
            if issubclass(annotation, pathlib.PurePath):
                raise InterfaceError(f"{where}: a Path (a streamed file) may only be a parameter or result itself")
            if annotation in self._message_types:
                return
            raise InterfaceError(
                f"{where}: type {annotation.__qualname__} is neither a builtin nor a registered message type"
            )
        raise InterfaceError(f"{where}: unsupported annotation {annotation!r}")

    def _check_implementation(self, spec: InterfaceSpec, impl: type) -> None:
        for method in spec.methods:
            function = getattr(impl, method.name, None)
            if function is None or not callable(function):
                raise InterfaceError(f"{impl.__qualname__} does not implement {spec.name}.{method.name}")
            self._takes_connection(spec, method, function, impl)

    @staticmethod
    def _takes_connection(spec: InterfaceSpec, method: MethodSpec, function: Callable[..., Any], impl: type) -> bool:
        """True when the implementation declares one extra leading parameter: the calling connection."""
        try:
            params = list(inspect.signature(function).parameters.values())[1:]
        except (TypeError, ValueError):
            return False
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return False
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        expected = len(method.param_names)
        if len(positional) == expected:
            return False
        if len(positional) == expected + 1:
            return True
        raise InterfaceError(
            f"{impl.__qualname__}.{method.name} takes {len(positional)} parameters; {spec.name}.{method.name} "
            f"declares {expected} (one more is allowed: the calling connection, first)"
        )

    # -- queries ----------------------------------------------------------------------------------

    def interface(self, cls: type) -> InterfaceSpec:
        """The registered spec of ``cls``; InterfaceError if it is not registered."""
        interface_id = self._interface_ids.get(cls)
        if interface_id is None:
            raise InterfaceError(f"{getattr(cls, '__qualname__', cls)!r} is not a registered RMI interface")
        return self.interfaces[interface_id]

    def served(self, obj: object) -> tuple[int, ...]:
        """Ids of the interfaces ``obj`` serves: those registered with an implementation it is an instance of."""
        tp = type(obj)
        cached = self._served.get(tp)
        if cached is None:
            cached = tuple(
                spec.interface_id
                for spec in self.interfaces
                if spec.implementation is not None and isinstance(obj, spec.implementation)
            )
            self._served[tp] = cached
        return cached

    def functions(self, tp: type, interface_id: int) -> tuple[tuple[Callable[..., Any], bool], ...]:
        """(function, takes connection) for each method index of the interface, looked up once per type."""
        key = (tp, interface_id)
        found = self._functions.get(key)
        if found is None:
            spec = self.interfaces[interface_id]
            found = tuple(
                (getattr(tp, m.name), self._takes_connection(spec, m, getattr(tp, m.name), tp)) for m in spec.methods
            )
            self._functions[key] = found
        return found

    def exception_type(self, name: str) -> type[BaseException] | None:
        """The exception class registered (or a default builtin) under ``name``."""
        return self._exceptions_by_name.get(name)

    def description(self) -> bytes:
        """Canonical msgpack of the interfaces (names, methods, annotations) and exception names."""
        return self._description

    def fingerprint(self) -> bytes:
        """SHA-256 of :meth:`description`."""
        return hashlib.sha256(self._description).digest()

    def first_difference(self, remote_description: bytes) -> str | None:
        """None when the remote registers the same interfaces; else text naming the first difference."""
        if remote_description == self._description:
            return None
        try:
            remote = msgspec.msgpack.decode(remote_description)
            _, remote_ifaces, remote_exceptions = remote
            local = msgspec.msgpack.decode(self._description)
            _, local_ifaces, local_exceptions = local
        except (msgspec.DecodeError, ValueError, TypeError):
            return "the remote's RMI registration list is malformed"
        for index, (mine, theirs) in enumerate(zip(local_ifaces, remote_ifaces, strict=False), start=1):
            if mine != theirs:
                name = mine[0]
                if not isinstance(theirs, list) or len(theirs) != 2 or theirs[0] != name:
                    return f"RMI interface #{index} is {name} here but {str(theirs[:1])[:100]} on the remote"
                return f"RMI interface #{index} {name} declares different methods here and on the remote"
        if len(local_ifaces) != len(remote_ifaces):
            return f"{len(local_ifaces)} RMI interfaces are registered here, {len(remote_ifaces)} on the remote"
        if local_exceptions != remote_exceptions:
            return "the registered RMI exception types differ"
        return "the RMI registrations differ"


_identity: Final = id
"""The builtin ``id`` (the object tables' methods name their parameter ``id``, as the issue does)."""


# -- object tables ----------------------------------------------------------------------------------


class ObjectTable:
    """Objects a side hosts, by id (1-65535; 0 is invalid): the global table or one connection's.

    Only objects that serve a registered interface (an instance of a registered implementation) can be
    saved. Automatic ids cycle through the range, so an id just deleted is the last to be reused (a
    stale proxy is unlikely to reach a new object).
    """

    def __init__(self, registry: RmiRegistry, *, is_global: bool = False) -> None:
        self.registry = registry
        self.is_global = is_global
        self._by_id: dict[int, object] = {}
        self._ids: dict[int, int] = {}
        self._next = MIN_OBJECT_ID

    def save(self, obj: object, id: int | None = None, *, object_id: int | None = None) -> int:
        """Host ``obj`` under ``id`` (1-65535; by default the next free one); returns its id (the
        existing one when it is already saved). ``object_id=`` is the older name of ``id``."""
        object_id = _either(id, object_id, "save", optional=True)
        if not self.registry.served(obj):
            raise InterfaceError(f"{type(obj).__qualname__} is not a registered implementation of any RMI interface")
        existing = self._ids.get(_identity(obj))
        if existing is not None:
            if object_id is not None and object_id != existing:
                raise ObjectIdInUse(f"this object is already saved under id {existing}, not {object_id}")
            return existing
        if object_id is None:
            if len(self._by_id) >= MAX_OBJECT_ID:
                raise ObjectIdInUse(f"all {MAX_OBJECT_ID} object ids are in use")
            while self._next in self._by_id:
                self._next = self._next % MAX_OBJECT_ID + 1
            object_id = self._next
            self._next = self._next % MAX_OBJECT_ID + 1
        elif not MIN_OBJECT_ID <= object_id <= MAX_OBJECT_ID:
            raise ObjectIdInUse(f"object id {object_id} is outside {MIN_OBJECT_ID}-{MAX_OBJECT_ID}")
        elif object_id in self._by_id:
            raise ObjectIdInUse(
                f"object id {object_id} holds another object ({type(self._by_id[object_id]).__qualname__})"
            )
        self._by_id[object_id] = obj
        self._ids[_identity(obj)] = object_id
        return object_id

    def get(self, id: int | None = None, *, object_id: int | None = None) -> object | None:
        """The object saved under ``id``, or None (``object_id=`` is the older name of ``id``)."""
        return self._by_id.get(_either(id, object_id, "get"))

    def id_of(self, obj: object) -> int | None:
        """The id ``obj`` is saved under, or None."""
        object_id = self._ids.get(_identity(obj))
        return object_id if object_id is not None and self._by_id.get(object_id) is obj else None

    def delete(self, id: object = None, *, obj_or_id: object = None) -> bool:
        """Forget an object, by ``id`` or by the object itself; False if it was not saved. A call the
        peer makes on it afterwards fails with RemoteObjectMissing naming the id. (``obj_or_id=`` is
        the older name of ``id``.)"""
        obj_or_id = _either(id, obj_or_id, "delete")
        if isinstance(obj_or_id, int) and not isinstance(obj_or_id, bool):
            obj = self._by_id.pop(obj_or_id, None)
            if obj is None:
                return False
            self._ids.pop(_identity(obj), None)
            return True
        object_id = self.id_of(obj_or_id)
        if object_id is None:
            return False
        del self._by_id[object_id]
        del self._ids[_identity(obj_or_id)]
        return True

    def clear(self) -> None:
        """Forget every object (the connection closed)."""
        self._by_id.clear()
        self._ids.clear()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, object_id: object) -> bool:
        return object_id in self._by_id


def _either(id: object, alias: object, method: str, *, optional: bool = False) -> Any:
    """The id given as ``id`` or under its older keyword name (not both); TypeError when neither is
    given unless ``optional``."""
    if id is not None and alias is not None:
        raise TypeError(f"{method}() got the id twice (id= and its older name)")
    value = id if id is not None else alias
    if value is None and not optional:
        raise TypeError(f"{method}() needs an id")
    return value


# -- events -----------------------------------------------------------------------------------------


class RmiFailure(IntEnum):
    """Why a call failed."""

    EXCEPTION = 1
    """The remote method raised."""
    MISSING = 2
    """No object under that id on the remote."""
    REFUSED = 3
    """The remote refused the request as malformed."""
    TIMED_OUT = 4
    CLOSED = 5
    """The connection closed with the call in flight."""
    BAD_RESPONSE = 6
    """The response did not decode as the method's result type."""


@dataclass(frozen=True, slots=True)
class RmiCallCompleted:
    """A call's response arrived; ``value`` is the result (a :class:`RemoteRef`/proxy or local object
    in place of an interface-typed result; for a create, the proxy's :class:`RemoteRef`)."""

    call_id: int
    value: object


@dataclass(frozen=True, slots=True)
class RmiCallFailed:
    """A call failed; :func:`exception_from` turns this into the exception the caller should see."""

    call_id: int
    failure: RmiFailure
    method: str
    type_name: str = ""
    message: str = ""
    traceback_text: str = ""
    args: tuple[object, ...] | None = None
    object_id: int = 0
    is_global: bool = False


@dataclass(frozen=True, slots=True)
class RmiOnewayFailed:
    """A fire-and-forget call this side hosted raised (nobody waits for it: report it to on_error)."""

    object_id: int
    method: str
    type_name: str
    message: str
    traceback_text: str


@dataclass(frozen=True, slots=True)
class RmiObjectReceived:
    """The peer sent a remote object as a message (:meth:`RmiEndpoint.send_object`): ``value`` is our own
    object when it names one we host, else a proxy (or RemoteRef) of the peer's. Dispatch it as a message."""

    value: object


RmiEvent = RmiCallCompleted | RmiCallFailed | RmiOnewayFailed | RmiObjectReceived


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
    if event.failure == RmiFailure.REFUSED:
        return RmiRequestRefused(f"the remote refused {event.method}: {event.message}")
    return RmiError(f"bad response to {event.method}: {event.message}")


# -- the endpoint -----------------------------------------------------------------------------------


class _Status(IntEnum):
    OK = 0
    CREATED = 1
    EXCEPTION = 2
    MISSING = 3
    REFUSED = 4


class ProxyBase:
    """What a proxy is to the core: a :class:`RemoteRef` and the endpoint it belongs to.

    The asyncio layer subclasses it; the core only reads these two slots when a proxy is passed as an
    argument or returned as a result (it goes back as a reference, arriving as the real object).
    """

    __slots__ = ("_rmi_endpoint", "_rmi_ref")

    def __init__(self, endpoint: RmiEndpoint, ref: RemoteRef) -> None:
        object.__setattr__(self, "_rmi_endpoint", endpoint)
        object.__setattr__(self, "_rmi_ref", ref)


class _IdPool(Protocol):
    def allocate(self) -> int: ...

    def free(self, value: int) -> None: ...


@dataclass(slots=True)
class _Pending:
    method: str
    spec: MethodSpec | None  # None: a create
    deadline_ns: int  # 0: none
    interface_id: int


@dataclass(slots=True)
class Invocation:
    """A vetted request the host is to run: the function comes from the registered interface's table."""

    request_id: int
    oneway: bool
    object_id: int
    method: str
    spec: MethodSpec | None
    function: Callable[..., Any]
    args: tuple[object, ...]
    create_interface: int = -1
    files: tuple[tuple[int, FileRef], ...] = ()
    """(position in ``args``, reference) of ``Path`` arguments: the adapter waits for each file's
    stream, puts the temporary copy's ``pathlib.Path`` in ``args`` before running, and removes the
    copy when the call completed or failed."""

    def call(self) -> object:
        """Run it (the result may be awaitable: the adapter awaits it, then calls ``complete``)."""
        return self.function(*self.args)


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


_ARGS_AS_BYTES: Final = msgspec.msgpack.Decoder(list[bytes])
_REF_BODY: Final = msgspec.msgpack.Decoder(_Ref)
_EXCEPTION_BODY: Final = msgspec.msgpack.Decoder(tuple[str, str, str, list[Any] | None])
_MISSING_BODY: Final = msgspec.msgpack.Decoder(tuple[int, bool])
_TEXT_BODY: Final = msgspec.msgpack.Decoder(str)
_INT_BODY: Final = msgspec.msgpack.Decoder(int)
_SIMPLE_ARG_TYPES: Final = (str, int, float, bool, type(None), bytes)


class RmiEndpoint:
    """One connection's RMI: outgoing calls with their response ids and deadlines, and the host side.

    ``global_objects`` is the server's table shared by all connections (a client passes None: it
    hosts no global objects); ``objects`` is this connection's table. ``response_ids`` may be the
    connection's shared pool (2-65535, anything with IdAllocator's allocate/free); by default the
    endpoint has its own ``IdAllocator(2, 65535)`` on a fast non-cryptographic RNG (response ids need
    no secrecy: records are authenticated and every call token carries a generation too). ``proxy_factory`` turns
    a :class:`RemoteRef` that arrives (an argument or a result naming an object the peer hosts) into
    what the application sees; by default the RemoteRef itself.
    """

    def __init__(
        self,
        registry: RmiRegistry,
        *,
        global_objects: ObjectTable | None = None,
        response_ids: _IdPool | None = None,
        proxy_factory: Callable[[RemoteRef], object] | None = None,
    ) -> None:
        self.registry = registry
        self.global_objects = global_objects
        self.objects = ObjectTable(registry)
        self.proxy_factory: Callable[[RemoteRef], object] = proxy_factory or (lambda ref: ref)
        self.stats = RmiStats()
        self.closed = False
        self.close_reason = ""
        self._ids: _IdPool = (
            response_ids if response_ids is not None else IdAllocator(MIN_RESPONSE_ID, MAX_RESPONSE_ID, random.Random())
        )
        self._generation = 0
        self._pending: dict[int, _Pending] = {}
        self._timeouts: list[tuple[int, int]] = []
        self._frames: list[OutFrame] = []
        self._events: list[RmiEvent] = []
        self._encoder = msgspec.msgpack.Encoder()
        self.files: FileChannel | None = None
        """How ``Path`` arguments and results are streamed (the adapter sets it); None: refused."""

    # -- outputs ----------------------------------------------------------------------------------

    def take_frames(self) -> list[OutFrame]:
        """Frames to send, oldest first (each ``(kind, request id, payload)``)."""
        frames, self._frames = self._frames, []
        return frames

    def take_events(self) -> list[RmiEvent]:
        """Events since the last call."""
        events, self._events = self._events, []
        return events

    @property
    def has_output(self) -> bool:
        """Frames or events are waiting to be taken."""
        return bool(self._frames or self._events)

    @property
    def in_flight(self) -> int:
        """Calls waiting for a response."""
        return len(self._pending)

    @property
    def deadline_ns(self) -> int | None:
        """The earliest call timeout, or None."""
        heap = self._timeouts
        while heap:
            when, token = heap[0]
            pending = self._pending.get(token)
            if pending is not None and pending.deadline_ns == when:
                return when
            heapq.heappop(heap)
        return None

    def handle_timer(self, now_ns: int) -> None:
        """Fail every call whose deadline has passed (freeing its response id)."""
        heap = self._timeouts
        while heap and heap[0][0] <= now_ns:
            when, token = heapq.heappop(heap)
            pending = self._pending.get(token)
            if pending is None or pending.deadline_ns != when:
                continue
            self._finish(token)
            self._events.append(RmiCallFailed(token, RmiFailure.TIMED_OUT, pending.method))

    def close(self, reason: str = "connection closed") -> None:
        """The connection closed: every call in flight fails at once, ids are freed, objects forgotten."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        for token, pending in list(self._pending.items()):
            self._finish(token)
            self._events.append(RmiCallFailed(token, RmiFailure.CLOSED, pending.method, message=reason))
        self._timeouts.clear()
        self._frames.clear()
        self.objects.clear()

    # -- caller side ------------------------------------------------------------------------------

    def _token(self) -> int:
        try:
            response_id = self._ids.allocate()
        except AllocationError as exc:
            raise RmiError(f"too many RMI calls in flight ({len(self._pending)}): {exc}") from None
        self._generation = (self._generation + 1) & 0xFFFF
        return (self._generation << 16) | response_id

    def _finish(self, token: int) -> None:
        del self._pending[token]
        self._ids.free(token & 0xFFFF)

    def _track(self, token: int, pending: _Pending, now_ns: int, timeout_ns: int) -> None:
        if timeout_ns < 0:
            raise ValueError(f"timeout must not be negative: {timeout_ns} ns")
        if timeout_ns:
            pending.deadline_ns = now_ns + timeout_ns
            heap = self._timeouts
            if len(heap) > 2 * len(self._pending) + 64:  # completed calls leave entries behind: compact
                heap[:] = [(p.deadline_ns, t) for t, p in self._pending.items() if p.deadline_ns]
                heapq.heapify(heap)
            heapq.heappush(heap, (pending.deadline_ns, token))
        self._pending[token] = pending

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
        if m.file_params:
            body = self._encode_with_files(m, list(values))
        else:
            try:
                body = self._encoder.encode(values)
            except (TypeError, ValueError, OverflowError) as exc:
                raise InterfaceError(f"{spec.name}.{m.name}: arguments cannot be serialized ({exc})") from exc
        payload = _REQUEST.pack(_FLAG_GLOBAL if ref.is_global else 0, ref.object_id, ref.interface_id, m.index) + body
        if oneway:
            self._frames.append((FrameKind.RMI_REQUEST, ONEWAY_REQUEST_ID, payload))
            self.stats.oneway_sent += 1
            return 0
        token = self._token()
        self._track(token, _Pending(m.qualname, m, 0, ref.interface_id), now_ns, timeout_ns)
        self._frames.append((FrameKind.RMI_REQUEST, token, payload))
        self.stats.calls_sent += 1
        return token

    def _encode_with_files(self, m: MethodSpec, values: list[object]) -> bytes:
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
            self._encoder.encode(values)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InterfaceError(f"{m.qualname}: arguments cannot be serialized ({exc})") from exc
        if paths and self.files is None:
            raise InterfaceError(f"{m.qualname}: this connection cannot stream a Path argument")
        started: list[int] = []
        try:
            for position, path in paths:
                assert self.files is not None
                ref = self.files.send(path)
                started.append(ref.stream_id)
                values[position] = ref
        except BaseException:
            for stream_id in started:
                assert self.files is not None
                self.files.abort(stream_id)
            raise
        return self._encoder.encode(values)

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
        payload = _REQUEST.pack(_FLAG_CREATE, 0, spec.interface_id, 0) + self._encoder.encode(encoded)
        if timeout_ns < 0:
            raise ValueError(f"timeout must not be negative: {timeout_ns} ns")
        token = self._token()
        self._track(token, _Pending(f"create({spec.name})", None, 0, spec.interface_id), now_ns, timeout_ns)
        self._frames.append((FrameKind.RMI_REQUEST, token, payload))
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
            interface_id = object.__getattribute__(value, "_rmi_ref").interface_id
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
        payload = _REQUEST.pack(_FLAG_OBJECT, 0, interface_id, 0) + self._encoder.encode(wire_ref)
        self._frames.append((FrameKind.RMI_REQUEST, ONEWAY_REQUEST_ID, payload))

    def receive_response(self, request_id: int, payload: bytes) -> None:
        """An RMI_RESPONSE frame: completes (or fails) the pending call it names; others are counted."""
        pending = self._pending.get(request_id)
        if pending is None or not payload:
            self.stats.responses_dropped += 1
            return
        self._finish(request_id)
        self.stats.responses_received += 1
        status = payload[0]
        body = payload[1:]
        method = pending.method
        try:
            if status == _Status.OK and pending.spec is not None:
                value = pending.spec.result_decoder.decode(body)
                if pending.spec.ref_result is not None:
                    value = self._ref_in(value, pending.spec.ref_result[0])
                self._events.append(RmiCallCompleted(request_id, value))
            elif status == _Status.CREATED and pending.spec is None:
                object_id = _INT_BODY.decode(body)
                if not MIN_OBJECT_ID <= object_id <= MAX_OBJECT_ID:
                    raise _Refused(f"object id {object_id} out of range")
                self._events.append(
                    RmiCallCompleted(request_id, self.proxy_factory(RemoteRef(pending.interface_id, object_id)))
                )
            elif status == _Status.EXCEPTION:
                type_name, message, tb, args = _EXCEPTION_BODY.decode(body)
                self._events.append(
                    RmiCallFailed(
                        request_id,
                        RmiFailure.EXCEPTION,
                        method,
                        type_name[:_MAX_TEXT],
                        message[:_MAX_TEXT],
                        tb[:_MAX_TRACEBACK],
                        tuple(args) if args is not None else None,
                    )
                )
            elif status == _Status.MISSING:
                object_id, is_global = _MISSING_BODY.decode(body)
                self._events.append(
                    RmiCallFailed(request_id, RmiFailure.MISSING, method, object_id=object_id, is_global=is_global)
                )
            elif status == _Status.REFUSED:
                self._events.append(
                    RmiCallFailed(request_id, RmiFailure.REFUSED, method, message=_TEXT_BODY.decode(body)[:_MAX_TEXT])
                )
            else:
                raise _Refused(f"unexpected response status {status}")
        except Exception as exc:  # a hostile or mismatched response: the call fails, nothing escapes
            self._events.append(
                RmiCallFailed(request_id, RmiFailure.BAD_RESPONSE, method, message=str(exc)[:_MAX_TEXT])
            )

    # -- host side --------------------------------------------------------------------------------

    def receive_request(self, request_id: int, payload: bytes, caller: object = None) -> Invocation | None:
        """An RMI_REQUEST frame. Returns the vetted :class:`Invocation` to run, or None when the request
        was refused (an error response is queued unless it was fire-and-forget). ``caller`` is passed
        as the first argument to implementation methods that declare the calling connection."""
        self.stats.requests_received += 1
        oneway = request_id == ONEWAY_REQUEST_ID
        if self.closed:
            return None
        if len(payload) < _REQUEST.size or (not oneway and request_id & 0xFFFF < MIN_RESPONSE_ID):
            self.stats.requests_refused += 1
            if not oneway:
                self._respond(request_id, _Status.REFUSED, self._encoder.encode("malformed request"))
            return None
        flags, object_id, interface_id, method_index = _REQUEST.unpack_from(payload)
        method_name = "?"
        try:
            if interface_id >= len(self.registry.interfaces):
                raise _Refused(f"unknown interface index {interface_id}")
            spec = self.registry.interfaces[interface_id]
            if flags == _FLAG_OBJECT:
                if not oneway:
                    raise _Refused("an object message expects no response")
                try:
                    wire_ref = _REF_BODY.decode(payload[_REQUEST.size :])
                except Exception as exc:
                    raise _Refused(f"bad object reference: {str(exc)[:200]}") from None
                self._events.append(RmiObjectReceived(self._ref_in(wire_ref, interface_id)))
                return None
            if flags & _FLAG_CREATE:
                method_name = f"create({spec.name})"
                return self._create_invocation(request_id, oneway, spec, payload[_REQUEST.size :])
            if flags & ~_FLAG_GLOBAL:
                raise _Refused(f"unknown flags {flags:#x}")
            if method_index >= len(spec.methods):
                raise _Refused(f"{spec.name} has no method index {method_index}")
            m = spec.methods[method_index]
            method_name = m.qualname
            is_global = bool(flags & _FLAG_GLOBAL)
            table = self.global_objects if is_global else self.objects
            target = table.get(object_id) if table is not None else None
            if target is None:
                raise _Missing(object_id, is_global)
            if interface_id not in self.registry.served(target):
                raise _Refused(f"object {object_id} does not serve {spec.name}")
            try:
                args = list(m.arg_decoder.decode(payload[_REQUEST.size :]))
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
            return Invocation(request_id, oneway, object_id, method_name, m, function, call_args, files=files)
        except _Missing as missing:
            self.stats.objects_missing += 1
            if not oneway:
                self._respond(request_id, _Status.MISSING, self._encoder.encode((missing.object_id, missing.is_global)))
            else:
                self._events.append(
                    RmiOnewayFailed(object_id, method_name, "RemoteObjectMissing", f"no object {missing.object_id}", "")
                )
            return None
        except _Refused as refused:
            self.stats.requests_refused += 1
            if not oneway:
                self._respond(request_id, _Status.REFUSED, self._encoder.encode(str(refused)))
            return None

    def _create_invocation(self, request_id: int, oneway: bool, spec: InterfaceSpec, body: bytes) -> Invocation:
        impl = spec.implementation
        if impl is None:
            raise _Refused(f"this side registers no implementation of {spec.name}")
        messages = self.registry.messages
        try:
            raw = _ARGS_AS_BYTES.decode(body)
            args = tuple(messages.decode(a) for a in raw) if messages is not None else ()
            if raw and messages is None:
                raise ValueError("no message serialization")
        except Exception as exc:
            raise _Refused(f"bad constructor arguments for {spec.name}: {str(exc)[:200]}") from None
        return Invocation(request_id, oneway, 0, f"create({spec.name})", None, impl, args, spec.interface_id)

    def execute(self, invocation: Invocation) -> Any:
        """Run ``invocation`` and respond, or return the awaitable a coroutine method gave (the adapter
        awaits it and then calls :meth:`complete` or :meth:`fail`)."""
        try:
            result = invocation.call()
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
                self._respond(invocation.request_id, _Status.CREATED, self._encoder.encode(object_id))
            return
        if invocation.oneway:
            return
        spec = invocation.spec
        assert spec is not None
        try:
            if spec.ref_result is not None:
                result = self._ref_out(result, spec.ref_result[0], spec.ref_result[1], f"{spec.name}() result")
            elif spec.file_result:
                result = self._file_out(result, spec)
            body = self._encoder.encode(result)
        except Exception as exc:
            self.fail(invocation, exc)
            return
        self._respond(invocation.request_id, _Status.OK, body)

    def _file_out(self, result: object, spec: MethodSpec) -> FileRef | None:
        """A ``Path`` result: the file starts streaming to the caller; the response carries its reference."""
        if result is None and spec.file_result_optional:
            return None
        if not isinstance(result, os.PathLike):
            raise InterfaceError(f"{spec.qualname}() returned {type(result).__qualname__}, not a file (os.PathLike)")
        if self.files is None:
            raise StreamingError(f"{spec.qualname}(): this connection cannot stream a Path result")
        return self.files.send(result)

    def fail(self, invocation: Invocation, exc: BaseException) -> None:
        """Respond with the exception the method raised (type name, message, traceback text)."""
        if self.closed:
            return
        type_name = type(exc).__qualname__
        message = str(exc)[:_MAX_TEXT]
        tb = "".join(traceback.format_exception(exc))[-_MAX_TRACEBACK:]
        if invocation.oneway:
            self._events.append(RmiOnewayFailed(invocation.object_id, invocation.method, type_name, message, tb))
            return
        args: list[object] | None = list(exc.args)
        if not all(isinstance(a, _SIMPLE_ARG_TYPES) for a in exc.args):
            args = None
        try:
            body = self._encoder.encode((type_name, message, tb, args))
        except (TypeError, ValueError, OverflowError):
            body = self._encoder.encode((type_name, message, tb, None))
        self._respond(invocation.request_id, _Status.EXCEPTION, body)

    def _respond(self, request_id: int, status: _Status, body: bytes) -> None:
        self._frames.append((FrameKind.RMI_RESPONSE, request_id, bytes((status,)) + body))

    # -- substitution -----------------------------------------------------------------------------

    def _ref_out(self, value: object, interface_id: int, optional: bool, where: str) -> _Ref | None:
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
                ref = object.__getattribute__(value, "_rmi_ref")
                if object.__getattribute__(value, "_rmi_endpoint") is not self:
                    raise InterfaceError(f"{where}: a proxy can only be sent back over the connection it came from")
            if ref.interface_id != interface_id:
                raise InterfaceError(
                    f"{where}: a proxy of {self.registry.interfaces[ref.interface_id].name} is not a {spec.name}"
                )
            return _Ref(int(ref.is_global), ref.object_id, interface_id, _OWNER_RECEIVER)
        if interface_id not in self.registry.served(value):
            raise InterfaceError(
                f"{where}: {type(value).__qualname__} is not a registered implementation of {spec.name}"
            )
        if self.global_objects is not None:
            global_id = self.global_objects.id_of(value)
            if global_id is not None:
                return _Ref(1, global_id, interface_id, _OWNER_SENDER)
        return _Ref(0, self.objects.save(value), interface_id, _OWNER_SENDER)

    def _ref_in(self, value: object, interface_id: int) -> object:
        """An interface-typed value that arrived: our own object when it names one we host, else a proxy."""
        if value is None:
            return None
        assert isinstance(value, _Ref)
        if value.interface_id != interface_id:
            raise _Refused(f"a reference to interface {value.interface_id} where {interface_id} is declared")
        is_global = bool(value.scope)
        if value.owner == _OWNER_RECEIVER:
            table = self.global_objects if is_global else self.objects
            obj = table.get(value.object_id) if table is not None else None
            if obj is None:
                raise _Missing(value.object_id, is_global)
            if interface_id not in self.registry.served(obj):
                raise _Refused(f"object {value.object_id} does not serve interface {interface_id}")
            return obj
        if not MIN_OBJECT_ID <= value.object_id <= MAX_OBJECT_ID:
            raise _Refused(f"object id {value.object_id} out of range")
        return self.proxy_factory(RemoteRef(interface_id, value.object_id, is_global))
