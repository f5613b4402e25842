"""RMI interfaces: what a peer may call, resolved once at registration.

An *interface* is a Python class (a ``typing.Protocol`` or an abstract base) whose public methods are
the only things a peer can call. Registration resolves each method once: its index (methods sorted by
name), its parameter and result annotations (registered message types, builtins and containers of
them, or another registered interface), and a typed msgspec decoder for its arguments and result. On
the wire a call names ``(object id, interface index, method index)``; the host looks the function up
in this table, never by a name the peer sent, so no attribute, dunder or unregistered method can be
reached (the lesson of RPyC's and Pyro's security history).
"""

from __future__ import annotations

import collections.abc
import hashlib
import inspect
import pathlib
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec

from ..errors import InterfaceError
from .wire import FileRef, WireRef

__all__ = ["InterfaceSpec", "MethodSpec", "RmiRegistry"]

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

    def check(self, body: bytes | memoryview) -> None:
        """Whether the host would take ``body`` (the encoded arguments): decoded here with its own decoder,
        so an argument of the wrong type raises InterfaceError before anything is sent."""
        try:
            self.arg_decoder.decode(body)
        except msgspec.ValidationError as exc:
            raise InterfaceError(f"{self.qualname}() arguments do not fit its annotations: {exc}") from None

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
                wire.append(WireRef | None if ref[1] else WireRef)
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
            result_wire: Any = WireRef | None if ref_result[1] else WireRef
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
