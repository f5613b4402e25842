"""Typed messages as msgpack (msgspec) over a registry of message types; never pickle.

A message on the wire is a type id then its msgpack body. Id 0 is the builtins (None, bool, int,
float, str, bytes, list, dict, tuple: always allowed, decoded untyped, so tuples come back as lists);
ids 1.. are the registered types (msgspec Structs and dataclasses) in registration order, each
decoded by its own cached, typed msgspec Decoder: a body that does not match the type's fields is a
:class:`MessageDecodeError`, never a half-built object. Both sides must register the same types in
the same order; :meth:`Serialization.description` is what the handshake compares.

Ids below 128 take one byte, others two (``0x80 | high``, ``low``): up to 32767 registered types.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import struct
import typing
from collections.abc import Sequence
from types import UnionType
from typing import Any, Final, cast

import msgspec

from .errors import FrameError, MessageDecodeError, UnregisteredTypeError
from .frames import _IS_MESSAGE, _KIND_OF, _KINDS, FRAME_HEADER, FRAME_OVERHEAD, FrameKind, walk_frames
from .session import RECORDS_C

__all__ = ["BUILTIN_TYPES", "MAX_TYPES", "Serialization"]

BUILTIN_TYPES: Final[frozenset[type]] = frozenset(
    {type(None), bool, int, float, str, bytes, bytearray, list, dict, tuple}
)
"""Types sent without registration (as type id 0)."""
MAX_TYPES: Final = 0x7FFF
_DESCRIPTION_VERSION: Final = 1
_ONE_BYTE: Final = tuple(bytes((i,)) for i in range(128))
_HEADER_ROOM: Final = bytes(FRAME_OVERHEAD)
_pack_header_into: Final = FRAME_HEADER.pack_into


def _type_name(tp: type) -> str:
    """The name both sides compare: the qualified class name (module paths differ between a script's
    ``__main__`` and an imported module, so they are left out)."""
    return tp.__qualname__


def _fields(tp: type) -> list[list[str]]:
    """[field name, annotation text] pairs, in declaration order (annotations resolved where possible, so
    ``from __future__ import annotations`` on one side only does not make a difference)."""
    if issubclass(tp, msgspec.Struct):
        return [[f.encode_name, _annotation(f.type)] for f in msgspec.structs.fields(tp)]
    try:
        hints = typing.get_type_hints(tp)
    except Exception:  # an annotation that does not resolve here: compare its text
        hints = {}
    return [[f.name, _annotation(hints.get(f.name, f.type))] for f in dataclasses.fields(cast(Any, tp))]


_DOTTED: Final = re.compile(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)")


def _annotation(annotation: object) -> str:
    """Canonical annotation text without module paths: ``Optional[app.Point]`` and ``Point | None``
    both read ``Point | None``, so equivalent spellings compare equal on the two sides."""
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is UnionType:
        return " | ".join(_annotation(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is not None and args:
        return f"{_annotation(origin)}[{', '.join(_annotation(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__qualname__
    return _DOTTED.sub(r"\1", str(annotation).replace("typing.", ""))


def _id_prefix(type_id: int) -> bytes:
    return _ONE_BYTE[type_id] if type_id < 128 else bytes((0x80 | (type_id >> 8), type_id & 0xFF))


class Serialization:
    """A registry of message types with a cached encoder and per-type decoders.

    Registration order is part of the contract: both peers must list the same types in the same order
    (the seed's rule, checked during the handshake through :meth:`fingerprint`/:meth:`first_difference`).
    """

    def __init__(self, types: Sequence[type] = ()) -> None:
        registered: list[type] = []
        seen: set[type] = set()
        for tp in types:
            if not isinstance(tp, type) or not (issubclass(tp, msgspec.Struct) or dataclasses.is_dataclass(tp)):
                raise TypeError(f"message types must be msgspec Structs or dataclasses, not {tp!r}")
            if tp in seen:
                raise TypeError(f"message type {_type_name(tp)} is registered twice")
            seen.add(tp)
            registered.append(tp)
        if len(registered) > MAX_TYPES:
            raise TypeError(f"at most {MAX_TYPES} message types can be registered, not {len(registered)}")
        self.types: tuple[type, ...] = tuple(registered)
        self._encoder = msgspec.msgpack.Encoder()
        self._encode_into = self._encoder.encode_into
        self._prefix: dict[type, bytes] = {tp: _id_prefix(i + 1) for i, tp in enumerate(registered)}
        for tp in BUILTIN_TYPES:
            self._prefix[tp] = _ONE_BYTE[0]
        self._frame_start = {tp: _HEADER_ROOM + prefix for tp, prefix in self._prefix.items()}
        """Type -> room for a frame header, then the type id: what a frame of that type starts with."""
        self.plain_types = frozenset(tp for tp in self._prefix if not issubclass(tp, os.PathLike))
        """The types whose instances are plain messages, never files (``os.PathLike``): a sender's fast check."""
        decoders: list[msgspec.msgpack.Decoder[Any]] = [msgspec.msgpack.Decoder()]
        for tp in registered:
            try:
                decoders.append(msgspec.msgpack.Decoder(tp))
            except TypeError as exc:
                raise TypeError(f"message type {_type_name(tp)} cannot be serialized: {exc}") from None
        self._decode_fns = [decoder.decode for decoder in decoders]
        self._description = msgspec.msgpack.encode(
            [_DESCRIPTION_VERSION, [[_type_name(tp), _fields(tp)] for tp in registered]]
        )
        self._fingerprint = hashlib.sha256(self._description).digest()

    def type_id(self, tp: type) -> int:
        """The wire id of ``tp`` (0 for builtins); raises UnregisteredTypeError."""
        prefix = self._prefix.get(tp)
        if prefix is None:
            raise UnregisteredTypeError(_unregistered(tp))
        return prefix[0] if len(prefix) == 1 else ((prefix[0] & 0x7F) << 8) | prefix[1]

    def encode(self, obj: object) -> bytes:
        """Type id + msgpack body; raises UnregisteredTypeError naming the type (or the nested value's)."""
        prefix = self._prefix.get(type(obj))
        if prefix is None:
            raise UnregisteredTypeError(_unregistered(type(obj)))
        try:
            return prefix + self._encoder.encode(obj)
        except (TypeError, ValueError, OverflowError) as exc:
            raise UnregisteredTypeError(f"cannot encode a {_type_name(type(obj))}: {exc}") from exc

    def encode_into(self, obj: object, buf: bytearray) -> None:
        """Append type id + msgpack body to ``buf`` (no intermediate bytes); ``buf`` is unchanged on error."""
        prefix = self._prefix.get(type(obj))
        if prefix is None:
            raise UnregisteredTypeError(_unregistered(type(obj)))
        start = len(buf)
        buf += prefix
        try:
            self._encoder.encode_into(obj, buf, -1)
        except (TypeError, ValueError, OverflowError) as exc:
            del buf[start:]
            raise UnregisteredTypeError(f"cannot encode a {_type_name(type(obj))}: {exc}") from exc

    def encode_frame_into(self, buf: bytearray, kind: int, request_id: int, obj: object) -> int:
        """Append one whole connection frame carrying ``obj`` to ``buf``: the frame header, then the type id
        and msgpack body encoded in place (no intermediate bytes), the length patched in last. The batching
        fast path: one call and no payload object per message, where :meth:`encode` +
        :func:`~.frames.encode_frame_into` make two calls and a bytes object.

        Returns the number of bytes appended (the caller may check it against its record limit and cut
        ``buf`` back). On any error ``buf`` is left as it was. In C when the extension is built; what
        would raise runs :meth:`py_encode_frame_into`, the reference, which raises it.
        """
        if RECORDS_C is not None and type(buf) is bytearray:
            size: int = RECORDS_C.encode_frame_into(buf, kind, request_id, obj, self._frame_start, self._encode_into)
            if size >= 0:
                return size
        return self.py_encode_frame_into(buf, kind, request_id, obj)

    def py_encode_frame_into(self, buf: bytearray, kind: int, request_id: int, obj: object) -> int:
        """:meth:`encode_frame_into` in Python: the reference, and what runs without the C extension."""
        frame_start = self._frame_start.get(type(obj))
        if frame_start is None:
            raise UnregisteredTypeError(_unregistered(type(obj)))
        start = len(buf)
        try:
            buf += frame_start
            self._encoder.encode_into(obj, buf, -1)
            size = len(buf) - start
            _pack_header_into(buf, start, kind, request_id, size - FRAME_OVERHEAD)
        except (TypeError, ValueError, OverflowError) as exc:
            del buf[start:]
            raise UnregisteredTypeError(f"cannot encode a {_type_name(type(obj))}: {exc}") from exc
        except struct.error:
            del buf[start:]
            raise FrameError(f"frame kind {kind!r} or request_id {request_id!r} out of range") from None
        if _KINDS[kind] is None:
            del buf[start:]
            raise FrameError(f"unknown frame kind {kind!r}")
        return size

    def decode(self, data: bytes | bytearray | memoryview) -> object:
        """The message ``data`` holds; raises MessageDecodeError for an unknown id or a bad body."""
        try:
            first = data[0]
            if first < 128:
                return self._decode_fns[first](data[1:])
            return self._decode_fns[((first & 0x7F) << 8) | data[1]](data[2:])
        except Exception as exc:  # hostile bodies: msgspec errors, RecursionError, errors of __post_init__
            raise MessageDecodeError(self._why(data, exc)) from exc

    def _why(self, data: bytes | bytearray | memoryview, exc: Exception) -> str:
        """The text of a decode failure (the slow path, kept out of :meth:`decode`)."""
        if len(data) == 0:
            return "empty message"
        first = data[0]
        if first >= 128 and len(data) < 2:
            return "truncated type id"
        type_id = first if first < 128 else ((first & 0x7F) << 8) | data[1]
        if type_id > len(self.types):
            return f"unknown message type id {type_id} (this side registers {len(self.types)})"
        name = "builtin value" if type_id == 0 else _type_name(self.types[type_id - 1])
        return f"a {name} message failed to decode: {exc}"

    def decode_record(
        self, data: bytes | bytearray | memoryview, *, max_frames: int = 65536
    ) -> list[tuple[FrameKind, int, object]]:
        """Every frame of a record's plaintext as ``(kind, request_id, value)``, messages decoded in one pass.

        For MESSAGE and SYNC_REQUEST frames ``value`` is the decoded message, or a
        :class:`MessageDecodeError` *instance* (returned, not raised: one bad message must not cost the
        others in the record); for every other kind it is the payload bytes. Framing is checked as
        :func:`~.frames.walk_frames` checks it, as for :func:`~.frames.decode_frames`, and a malformed
        record raises FrameError as a whole. The receive fast path: no Frame objects, one slice per
        message; in C when the extension is built (:meth:`py_decode_record` is the reference).
        """
        if RECORDS_C is not None:
            frames: list[tuple[FrameKind, int, object]] = RECORDS_C.decode_record(
                data, max_frames, self._decode_fns, self._why
            )
            return frames
        return self.py_decode_record(data, max_frames=max_frames)

    def py_decode_record(
        self, data: bytes | bytearray | memoryview, *, max_frames: int = 65536
    ) -> list[tuple[FrameKind, int, object]]:
        """:meth:`decode_record` in Python: the reference, and what runs without the C extension."""
        record = data if isinstance(data, bytes) else bytes(data)
        out: list[tuple[FrameKind, int, object]] = []
        kind_of = _KIND_OF
        is_message = _IS_MESSAGE
        decode_fns = self._decode_fns
        stop = 0
        for kind_byte, request_id, length in walk_frames(record, max_frames):
            start = stop + FRAME_OVERHEAD
            stop = start + length
            if is_message[kind_byte]:
                value: object
                if length == 0:
                    value = MessageDecodeError("empty message")
                else:
                    try:
                        first = record[start]
                        if first < 128:
                            value = decode_fns[first](record[start + 1 : stop])
                        else:
                            type_id = ((first & 0x7F) << 8) | record[start + 1]
                            value = decode_fns[type_id](record[start + 2 : stop])
                    except Exception as exc:  # hostile bodies, as in decode()
                        value = MessageDecodeError(self._why(record[start:stop], exc))
                        value.__cause__ = exc
                out.append((kind_of[kind_byte], request_id, value))
            else:
                out.append((kind_of[kind_byte], request_id, record[start:stop]))
        return out

    def description(self) -> bytes:
        """Canonical msgpack of the registrations: names and (field, type) pairs, in registration order."""
        return self._description

    def fingerprint(self) -> bytes:
        """SHA-256 of :meth:`description`: equal fingerprints mean compatible registrations."""
        return self._fingerprint

    def first_difference(self, remote_description: bytes) -> str | None:
        """None if the remote registers the same types; otherwise text naming the first difference."""
        if remote_description == self._description:
            return None
        try:
            version, remote = msgspec.msgpack.decode(
                remote_description, type=tuple[int, list[tuple[str, list[tuple[str, str]]]]]
            )
        except (msgspec.DecodeError, msgspec.ValidationError):
            return "the remote's registration list is malformed"
        if version != _DESCRIPTION_VERSION:
            return f"the remote describes its registrations in version {version}, this side in {_DESCRIPTION_VERSION}"
        local = [(_type_name(tp), [(name, kind) for name, kind in _fields(tp)]) for tp in self.types]
        for index, (mine, theirs) in enumerate(zip(local, remote, strict=False), start=1):
            if mine[0] != theirs[0]:
                return f"type #{index} is {mine[0]} here but {theirs[0][:100]} on the remote"
            if list(mine[1]) != list(theirs[1]):
                return f"type #{index} {mine[0]} has fields {_show(mine[1])} here but {_show(theirs[1])} on the remote"
        if len(local) > len(remote):
            return f"type #{len(remote) + 1} {local[len(remote)][0]} is registered here but not on the remote"
        if len(remote) > len(local):
            return f"type #{len(local) + 1} {remote[len(local)][0][:100]} is registered on the remote but not here"
        return "the registrations differ"


def _show(fields: Sequence[tuple[str, str]]) -> str:
    text = ", ".join(f"{name}: {kind}" for name, kind in fields)
    return f"({text[:200]})"


def _unregistered(tp: type) -> str:
    return (
        f"message type {tp.__module__}.{tp.__qualname__} is not registered; "
        "add it to the config's messages (both sides, same order)"
    )
