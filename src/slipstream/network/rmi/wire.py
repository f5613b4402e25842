"""RMI on the wire: the request header, flags, statuses, the references that stand for objects and
files, and the bounded decoders of response bodies. One module so both the caller's and the host's
side read the same layout.

- ``RMI_REQUEST``: ``request_id`` = call token (``generation << 16 | response id``; ``1`` means
  fire-and-forget, no reply); payload = ``flags u8 | object id u16 | interface u16 | method u16`` +
  msgpack array of the arguments (a create request carries each argument as a serialized message).
- ``RMI_RESPONSE``: ``request_id`` = the call's token; payload = status byte + msgpack body.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any, Final

import msgspec

__all__ = [
    "ARGS_AS_BYTES",
    "DEFAULT_TIMEOUT_NS",
    "EXCEPTION_BODY",
    "FILE_STREAM_MARK",
    "FLAG_CREATE",
    "FLAG_GLOBAL",
    "FLAG_OBJECT",
    "INT_BODY",
    "MAX_OBJECT_ID",
    "MAX_RESPONSE_ID",
    "MAX_TEXT",
    "MAX_TRACEBACK",
    "MIN_OBJECT_ID",
    "MIN_RESPONSE_ID",
    "MISSING_BODY",
    "ONEWAY_REQUEST_ID",
    "OWNER_RECEIVER",
    "OWNER_SENDER",
    "REF_BODY",
    "REQUEST_HEADER",
    "SIMPLE_ARG_TYPES",
    "TEXT_BODY",
    "FileRef",
    "OutFrame",
    "Status",
    "WireRef",
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

REQUEST_HEADER: Final = struct.Struct(">BHHH")
"""flags, object id, interface index, method index."""
FLAG_GLOBAL: Final = 0x01
FLAG_CREATE: Final = 0x02
FLAG_OBJECT: Final = 0x04
OWNER_SENDER: Final = 0
OWNER_RECEIVER: Final = 1
MAX_TEXT: Final = 4096
MAX_TRACEBACK: Final = 16384

OutFrame = tuple[int, int, bytes | bytearray]
"""``(frame kind, request id, payload)``: what the connection machine appends to its batch."""


class Status(IntEnum):
    """A response's first byte."""

    OK = 0
    CREATED = 1
    EXCEPTION = 2
    MISSING = 3
    REFUSED = 4
    BUSY = 5
    """Refused unrun: the host runs its ``max_pending_calls`` for this connection already (text body)."""


class WireRef(msgspec.Struct, array_like=True, frozen=True):
    """A remote object on the wire, in place of an interface-typed argument or result."""

    scope: int  # 0 connection, 1 global
    object_id: int
    interface_id: int
    owner: int  # OWNER_SENDER: the side that sent this message hosts the object


class FileRef(msgspec.Struct, array_like=True, frozen=True):
    """A file on the wire, in place of a ``Path`` argument or result: the sender streams the file
    (its stream id, as the receiver numbers the incoming stream) and sends this in the call."""

    stream_id: int
    size: int
    name: str


ARGS_AS_BYTES: Final = msgspec.msgpack.Decoder(list[bytes])
REF_BODY: Final = msgspec.msgpack.Decoder(WireRef)
EXCEPTION_BODY: Final = msgspec.msgpack.Decoder(tuple[str, str, str, list[Any] | None])
MISSING_BODY: Final = msgspec.msgpack.Decoder(tuple[int, bool])
TEXT_BODY: Final = msgspec.msgpack.Decoder(str)
INT_BODY: Final = msgspec.msgpack.Decoder(int)
SIMPLE_ARG_TYPES: Final = (str, int, float, bool, type(None), bytes)
"""Exception arguments carried back as values (others: the message only)."""
