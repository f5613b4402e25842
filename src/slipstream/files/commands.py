"""Messages between clients and the media driver, and their framing on the driver's socket.

Commands and responses are small typed records (msgspec structs, msgpack encoded) behind a 4-byte
little-endian length. The data path never goes through here: only set-up, tear-down, image
notifications and keep-alives. The decoder is sans-I/O: bytes in, messages out, with a bound on
frame size so that a misbehaving client cannot make the driver allocate without limit.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import msgspec

PROTOCOL_VERSION: Final = 1
MAX_MESSAGE_LENGTH: Final = 64 * 1024
_LENGTH = struct.Struct("<I")


class CommandError(ValueError):
    """A frame on the driver socket that is not a valid message."""


# -- client to driver -------------------------------------------------------------------------------


class Hello(msgspec.Struct, tag=True, frozen=True):
    client_id: int
    pid: int
    version: int = PROTOCOL_VERSION


class AddPublication(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    channel: str
    stream_id: int
    exclusive: bool


class RemovePublication(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    registration_id: int


class AddSubscription(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    channel: str
    stream_id: int


class RemoveSubscription(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    registration_id: int


class AddDestination(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    registration_id: int
    channel: str


class RemoveDestination(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    registration_id: int
    channel: str


class AddCounter(msgspec.Struct, tag=True, frozen=True):
    """A counter of the client's own in the driver's counters file (Aeron's ``addCounter``): readers
    such as ``slipstream stat`` see it; the client writes its value; the driver frees it with the client."""

    correlation_id: int
    type_id: int
    label: str
    key: bytes = b""


class RemoveCounter(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    registration_id: int


class RejectImage(msgspec.Struct, tag=True, frozen=True):
    """A subscriber refuses an image (Aeron's ``Image.reject``): the driver sends its publisher an ERR
    frame with ``reason`` and removes it."""

    correlation_id: int
    image_correlation_id: int
    reason: str


class Wake(msgspec.Struct, tag=True, frozen=True):
    """Doorbell: a parked driver has UDP work (a client appended to a network publication)."""


class Keepalive(msgspec.Struct, tag=True, frozen=True):
    pass


class CloseClient(msgspec.Struct, tag=True, frozen=True):
    pass


class InvalidCommand(msgspec.Struct, tag=True, frozen=True):
    """Made by the driver's decoder, never sent: a well-framed command whose fields have the wrong types
    or values. It carries the command's correlation id when one could be read, so the driver answers
    that command with an error instead of dropping the client."""

    correlation_id: int
    reason: str


ClientMessage = (
    Hello
    | AddPublication
    | RemovePublication
    | AddSubscription
    | RemoveSubscription
    | AddDestination
    | RemoveDestination
    | AddCounter
    | RemoveCounter
    | RejectImage
    | Wake
    | Keepalive
    | CloseClient
    | InvalidCommand
)

# -- driver to client -------------------------------------------------------------------------------


class Welcome(msgspec.Struct, tag=True, frozen=True):
    driver_pid: int
    client_liveness_timeout_ns: int
    client_id: int
    version: int = PROTOCOL_VERSION


class PublicationReady(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    registration_id: int
    session_id: int
    stream_id: int
    log_file: str
    publication_limit_counter_id: int
    channel: str


class SubscriptionReady(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    registration_id: int


class CounterReady(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    counter_id: int


class OperationSuccess(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int


class ErrorResponse(msgspec.Struct, tag=True, frozen=True):
    correlation_id: int
    code: str
    message: str


class ImageAvailable(msgspec.Struct, tag=True, frozen=True):
    subscription_registration_id: int
    correlation_id: int
    session_id: int
    stream_id: int
    log_file: str
    subscriber_position_counter_id: int
    join_position: int
    source_identity: str
    parking_slot: int = -1
    """The subscriber's slot in the log's parking table (``logbuffer.layout``), or -1: all taken."""


class ImageUnavailable(msgspec.Struct, tag=True, frozen=True):
    subscription_registration_id: int
    correlation_id: int


DriverMessage = (
    Welcome
    | PublicationReady
    | SubscriptionReady
    | CounterReady
    | OperationSuccess
    | ErrorResponse
    | ImageAvailable
    | ImageUnavailable
)

_encoder = msgspec.msgpack.Encoder()


def encode(message: ClientMessage | DriverMessage) -> bytes:
    """One framed message: length prefix, then msgpack."""
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


T = TypeVar("T")


class Decoder(Generic[T]):
    """Splits a byte stream into messages of type ``T``; keeps partial frames between feeds."""

    def __init__(self, message_type: type[T], invalid: Callable[[int, str], T] | None = None) -> None:
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(message_type)
        self._buffer = bytearray()
        self._invalid = invalid

    def feed(self, data: bytes) -> list[T]:
        """Messages completed by ``data``. Raises CommandError on a bad frame; the stream is then unusable."""
        self._buffer += data
        messages: list[T] = []
        buf = self._buffer
        start = 0
        while len(buf) - start >= 4:
            (length,) = _LENGTH.unpack_from(buf, start)
            if length > MAX_MESSAGE_LENGTH:
                raise CommandError(f"message of {length} bytes exceeds {MAX_MESSAGE_LENGTH}")
            if len(buf) - start - 4 < length:
                break
            body = bytes(buf[start + 4 : start + 4 + length])
            start += 4 + length
            try:
                messages.append(self._decoder.decode(body))
            except msgspec.ValidationError as exc:
                # Framing is intact, so the stream stays usable: answer the command if it has an id.
                correlation_id = _correlation_id(body) if self._invalid is not None else None
                if correlation_id is None or self._invalid is None:
                    raise CommandError(f"invalid message: {exc}") from None
                messages.append(self._invalid(correlation_id, f"invalid command: {exc}"))
            except msgspec.DecodeError as exc:
                raise CommandError(f"invalid message: {exc}") from None
        del buf[:start]
        return messages


_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1


def _correlation_id(body: bytes) -> int | None:
    """The ``correlation_id`` of a msgpack map, if it has an int one (the body is at most 64 KiB)."""
    try:
        value = msgspec.msgpack.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(value, dict):
        return None
    correlation_id = value.get("correlation_id")
    if isinstance(correlation_id, bool) or not isinstance(correlation_id, int):
        return None
    return correlation_id if _I64_MIN <= correlation_id <= _I64_MAX else None


def client_decoder() -> Decoder[ClientMessage]:
    """Decoder the driver uses for what clients send; a mistyped command becomes ``InvalidCommand``."""
    return Decoder(ClientMessage, InvalidCommand)  # type: ignore[arg-type]


def driver_decoder() -> Decoder[DriverMessage]:
    """Decoder a client uses for what the driver sends."""
    return Decoder(DriverMessage)  # type: ignore[arg-type]
