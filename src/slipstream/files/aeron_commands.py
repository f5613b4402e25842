"""Aeron's client <-> media driver control protocol (1.53): slipstream's commands as Aeron's bytes and back.

A client of the reference driver (``aeronmd``) writes commands into the CnC's to-driver ring buffer
(``files.ringbuffer``) and reads responses from the to-clients broadcast buffer (``files.broadcast``). This
module is only the message bodies, sans-I/O: a ``cmd.ClientMessage`` becomes ``(msg_type_id, payload)``, a
broadcast record's ``(msg_type_id, payload)`` becomes a ``cmd.DriverMessage``. Layouts are little-endian
and packed to 4 bytes, as Aeron's ``aeron_control_protocol.h``; a string is an i32 length then its bytes
(no terminator), and the first string of a pair is padded to 4 bytes before the second.

The broadcast buffer is shared by every client of the driver: responses to other clients' commands and
images of other clients' subscriptions arrive too. The caller keeps those whose correlation id (or
subscription registration id, or client id for a timeout) is its own; so, as Aeron's clients do, it takes
its client id and correlation ids from the ring buffer's shared correlation counter, unique driver-wide.
A client's first command makes the driver allocate its heartbeat counter and announce it as
ON_COUNTER_READY with the client id as correlation id (ON_UNAVAILABLE_COUNTER likewise after CLIENT_CLOSE).

Everything read from a record is checked against the payload's size: a short or lying record raises
``AeronProtocolError`` naming its type id, never an ``IndexError`` or a ``struct.error``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import msgspec

from slipstream.files import commands as cmd
from slipstream.files.counters import MAX_KEY_LENGTH, MAX_LABEL_LENGTH


class AeronProtocolError(ValueError):
    """A record from Aeron's driver (or for it) that does not parse: too short, a length that lies, bad text."""


# -- type ids ---------------------------------------------------------------------------------------

ADD_PUBLICATION: Final = 0x01
REMOVE_PUBLICATION: Final = 0x02
ADD_EXCLUSIVE_PUBLICATION: Final = 0x03
ADD_SUBSCRIPTION: Final = 0x04
REMOVE_SUBSCRIPTION: Final = 0x05
CLIENT_KEEPALIVE: Final = 0x06
ADD_DESTINATION: Final = 0x07
REMOVE_DESTINATION: Final = 0x08
ADD_COUNTER: Final = 0x09
REMOVE_COUNTER: Final = 0x0A
CLIENT_CLOSE: Final = 0x0B
ADD_RCV_DESTINATION: Final = 0x0C
REMOVE_RCV_DESTINATION: Final = 0x0D
TERMINATE_DRIVER: Final = 0x0E
ADD_STATIC_COUNTER: Final = 0x0F
REJECT_IMAGE: Final = 0x10
REMOVE_DESTINATION_BY_ID: Final = 0x11
GET_NEXT_AVAILABLE_SESSION_ID: Final = 0x12

ON_ERROR: Final = 0x0F01
ON_AVAILABLE_IMAGE: Final = 0x0F02
ON_PUBLICATION_READY: Final = 0x0F03
ON_OPERATION_SUCCESS: Final = 0x0F04
ON_UNAVAILABLE_IMAGE: Final = 0x0F05
ON_EXCLUSIVE_PUBLICATION_READY: Final = 0x0F06
ON_SUBSCRIPTION_READY: Final = 0x0F07
ON_COUNTER_READY: Final = 0x0F08
ON_UNAVAILABLE_COUNTER: Final = 0x0F09
ON_CLIENT_TIMEOUT: Final = 0x0F0A
ON_STATIC_COUNTER: Final = 0x0F0B
ON_PUBLICATION_ERROR: Final = 0x0F0C
ON_NEXT_AVAILABLE_SESSION_ID: Final = 0x0F0D

COMMAND_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {
        ADD_PUBLICATION: "ADD_PUBLICATION",
        REMOVE_PUBLICATION: "REMOVE_PUBLICATION",
        ADD_EXCLUSIVE_PUBLICATION: "ADD_EXCLUSIVE_PUBLICATION",
        ADD_SUBSCRIPTION: "ADD_SUBSCRIPTION",
        REMOVE_SUBSCRIPTION: "REMOVE_SUBSCRIPTION",
        CLIENT_KEEPALIVE: "CLIENT_KEEPALIVE",
        ADD_DESTINATION: "ADD_DESTINATION",
        REMOVE_DESTINATION: "REMOVE_DESTINATION",
        ADD_COUNTER: "ADD_COUNTER",
        REMOVE_COUNTER: "REMOVE_COUNTER",
        CLIENT_CLOSE: "CLIENT_CLOSE",
        ADD_RCV_DESTINATION: "ADD_RCV_DESTINATION",
        REMOVE_RCV_DESTINATION: "REMOVE_RCV_DESTINATION",
        TERMINATE_DRIVER: "TERMINATE_DRIVER",
        ADD_STATIC_COUNTER: "ADD_STATIC_COUNTER",
        REJECT_IMAGE: "REJECT_IMAGE",
        REMOVE_DESTINATION_BY_ID: "REMOVE_DESTINATION_BY_ID",
        GET_NEXT_AVAILABLE_SESSION_ID: "GET_NEXT_AVAILABLE_SESSION_ID",
    }
)
RESPONSE_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {
        ON_ERROR: "ON_ERROR",
        ON_AVAILABLE_IMAGE: "ON_AVAILABLE_IMAGE",
        ON_PUBLICATION_READY: "ON_PUBLICATION_READY",
        ON_OPERATION_SUCCESS: "ON_OPERATION_SUCCESS",
        ON_UNAVAILABLE_IMAGE: "ON_UNAVAILABLE_IMAGE",
        ON_EXCLUSIVE_PUBLICATION_READY: "ON_EXCLUSIVE_PUBLICATION_READY",
        ON_SUBSCRIPTION_READY: "ON_SUBSCRIPTION_READY",
        ON_COUNTER_READY: "ON_COUNTER_READY",
        ON_UNAVAILABLE_COUNTER: "ON_UNAVAILABLE_COUNTER",
        ON_CLIENT_TIMEOUT: "ON_CLIENT_TIMEOUT",
        ON_STATIC_COUNTER: "ON_STATIC_COUNTER",
        ON_PUBLICATION_ERROR: "ON_PUBLICATION_ERROR",
        ON_NEXT_AVAILABLE_SESSION_ID: "ON_NEXT_AVAILABLE_SESSION_ID",
    }
)

SKIPPED_RESPONSES: Final = frozenset({ON_STATIC_COUNTER, ON_PUBLICATION_ERROR, ON_NEXT_AVAILABLE_SESSION_ID})
"""Responses a slipstream client does not act on; ``decode_response`` returns None for them. The first and
last answer commands slipstream never sends (add static counter, next session id); a publication error
reports an ERR frame a receiver sent to one of the driver's publications, which slipstream's API does not
surface (the publication sees its image go instead)."""

REMOVE_PUBLICATION_FLAG_REVOKE: Final = 0x1
NULL_VALUE: Final = -1

# -- limits -----------------------------------------------------------------------------------------

MAX_CHANNEL_LENGTH: Final = 4095
"""Aeron's longest channel URI in bytes (``AERON_URI_MAX_LENGTH`` 4096 counts a terminator)."""
MAX_REJECT_REASON_LENGTH: Final = 1023
"""The driver refuses a longer reason to reject an image (it travels in an ERR frame)."""
MAX_ERROR_MESSAGE_LENGTH: Final = 8192
"""``encode_error_response`` cuts a longer message (Aeron's ``AERON_ERROR_MAX_TOTAL_LENGTH``)."""

# -- error codes (aeron_client_error.h, ErrorCode.java) ----------------------------------------------

ERROR_CODES: Final[Mapping[int, str]] = MappingProxyType(
    {
        -1: "UNKNOWN_CODE_VALUE",
        0: "UNUSED",
        1: "INVALID_CHANNEL",
        2: "UNKNOWN_SUBSCRIPTION",
        3: "UNKNOWN_PUBLICATION",
        4: "CHANNEL_ENDPOINT_ERROR",
        5: "UNKNOWN_COUNTER",
        6: "UNKNOWN_COMMAND_TYPE_ID",
        7: "MALFORMED_COMMAND",
        8: "NOT_SUPPORTED",
        9: "UNKNOWN_HOST",
        10: "RESOURCE_TEMPORARILY_UNAVAILABLE",
        11: "GENERIC_ERROR",
        12: "STORAGE_SPACE",
        13: "IMAGE_REJECTED",
        14: "PUBLICATION_REVOKED",
    }
)
"""Aeron's error code numbers and names."""
_ERROR_VALUES: Final = {name: value for value, name in ERROR_CODES.items()}
GENERIC_ERROR: Final = 11


def error_code_name(value: int) -> str:
    """Aeron's name for an error code number; ``UNKNOWN_CODE_VALUE`` for a number it does not define."""
    return ERROR_CODES.get(value, "UNKNOWN_CODE_VALUE")


def error_code(name: str) -> int:
    """Aeron's number for an error code name; ``GENERIC_ERROR`` for slipstream's own codes (such as
    ``UNKNOWN_DESTINATION``), which Aeron's clients cannot tell apart anyway."""
    return _ERROR_VALUES.get(name, GENERIC_ERROR)


# -- layouts ----------------------------------------------------------------------------------------

_I32 = struct.Struct("<i")
_CORRELATED = struct.Struct("<qq")  # client id, correlation id
_PUBLICATION = struct.Struct("<qqii")  # ..., stream id, channel length
_REMOVE_PUBLICATION = struct.Struct("<qqqQ")  # ..., registration id, flags
_REMOVE = struct.Struct("<qqq")  # ..., registration id (subscription, counter)
_SUBSCRIPTION = struct.Struct("<qqqii")  # ..., registration correlation id, stream id, channel length
_DESTINATION = struct.Struct("<qqqi")  # ..., publication registration id, channel length
_COUNTER = struct.Struct("<qqi")  # ..., type id; then key (length, bytes, pad to 4), label (length, bytes)
_REJECT_IMAGE = struct.Struct("<qqqqi")  # ..., image correlation id, position, reason length
_REJECT_IMAGE_MIN_LENGTH: Final = 40
"""``sizeof(aeron_reject_image_command_t)``: its one-byte text array pads it to 40; the C driver refuses less."""

_PUBLICATION_READY = struct.Struct("<qqiiii")  # correlation, registration, session, stream, limit, status ids
_SUBSCRIPTION_READY = struct.Struct("<qi")  # correlation id, channel status indicator id
_IMAGE_READY = struct.Struct("<qiiqi")  # correlation, session, stream, subscription registration, position id
_IMAGE_MESSAGE = struct.Struct("<qqi")  # image correlation id, subscription registration id, stream id
_ERROR_RESPONSE = struct.Struct("<qi")  # offending correlation id, error code; then the message
_COUNTER_UPDATE = struct.Struct("<qi")  # correlation (registration) id, counter id
_LONG = struct.Struct("<q")

_I32_RANGE: Final = range(-(2**31), 2**31)
_I64_RANGE: Final = range(-(2**63), 2**63)


# -- responses of our own ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientTimeout:
    """ON_CLIENT_TIMEOUT: the driver gave up on client ``client_id`` (it sent nothing for too long) and
    freed its resources; if that is this client, it must stop."""

    client_id: int


@dataclass(frozen=True, slots=True)
class UnavailableCounter:
    """ON_UNAVAILABLE_COUNTER: the counter a client added under ``registration_id`` is gone."""

    registration_id: int
    counter_id: int


# -- commands ---------------------------------------------------------------------------------------


def encode_command(message: cmd.ClientMessage, client_id: int) -> tuple[int, bytes] | None:
    """Aeron's ``(msg_type_id, payload)`` for one of slipstream's commands, or None for one Aeron has no
    use for: ``Hello`` (Aeron's driver meets a client at its first command), ``Wake`` (Aeron's driver polls
    the ring buffer, there is no parked driver to wake) and ``InvalidCommand`` (made by slipstream's driver,
    never sent). Raises ValueError for a field Aeron cannot carry (too long, not ASCII, out of range)."""
    _check_int("client_id", client_id, _I64_RANGE)
    match message:
        case cmd.AddPublication(correlation_id, channel, stream_id, exclusive):
            raw = _channel_bytes(channel)
            head = _PUBLICATION.pack(
                client_id, _i64("correlation_id", correlation_id), _i32("stream_id", stream_id), len(raw)
            )
            return (ADD_EXCLUSIVE_PUBLICATION if exclusive else ADD_PUBLICATION), head + raw
        case cmd.RemovePublication(correlation_id, registration_id):
            # No revoke: slipstream's publications close by draining, as Aeron's default does.
            payload = _REMOVE_PUBLICATION.pack(
                client_id, _i64("correlation_id", correlation_id), _i64("registration_id", registration_id), 0
            )
            return REMOVE_PUBLICATION, payload
        case cmd.AddSubscription(correlation_id, channel, stream_id):
            raw = _channel_bytes(channel)
            head = _SUBSCRIPTION.pack(
                client_id, _i64("correlation_id", correlation_id), NULL_VALUE, _i32("stream_id", stream_id), len(raw)
            )
            return ADD_SUBSCRIPTION, head + raw
        case cmd.RemoveSubscription(correlation_id, registration_id):
            return REMOVE_SUBSCRIPTION, _remove(client_id, correlation_id, registration_id)
        case cmd.AddDestination(correlation_id, registration_id, channel):
            # slipstream's destinations are a publication's (manual MDC): Aeron's ADD_DESTINATION, not the
            # subscription side's ADD_RCV_DESTINATION.
            return ADD_DESTINATION, _destination(client_id, correlation_id, registration_id, channel)
        case cmd.RemoveDestination(correlation_id, registration_id, channel):
            return REMOVE_DESTINATION, _destination(client_id, correlation_id, registration_id, channel)
        case cmd.AddCounter(correlation_id, type_id, label, key):
            return ADD_COUNTER, _counter(client_id, correlation_id, type_id, label, key)
        case cmd.RemoveCounter(correlation_id, registration_id):
            return REMOVE_COUNTER, _remove(client_id, correlation_id, registration_id)
        case cmd.RejectImage(correlation_id, image_correlation_id, reason):
            return REJECT_IMAGE, _reject_image(client_id, correlation_id, image_correlation_id, reason)
        case cmd.Keepalive():
            # Aeron's 1.53 clients write now (epoch ms) into their heartbeat counter instead; the driver
            # still takes this command, from a client it already knows (one that sent another command
            # first), and answers nothing, so the correlation id is 0.
            return CLIENT_KEEPALIVE, _CORRELATED.pack(client_id, 0)
        case cmd.CloseClient():
            return CLIENT_CLOSE, _CORRELATED.pack(client_id, NULL_VALUE)
        case cmd.Hello() | cmd.Wake() | cmd.InvalidCommand():
            return None
    raise ValueError(f"not a slipstream client command: {message!r}")


def _check_int(name: str, value: object, allowed: range) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        bits = 32 if allowed is _I32_RANGE else 64
        raise ValueError(f"{name} must be a signed {bits}-bit integer, not {value!r}")
    return value


def _i32(name: str, value: object) -> int:
    return _check_int(name, value, _I32_RANGE)


def _i64(name: str, value: object) -> int:
    return _check_int(name, value, _I64_RANGE)


def _channel_bytes(channel: object) -> bytes:
    if not isinstance(channel, str):
        raise ValueError(f"channel must be a str, not {channel!r}")
    try:
        raw = channel.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"channel must be ASCII for Aeron's driver: {channel!r}") from None
    if len(raw) > MAX_CHANNEL_LENGTH:
        raise ValueError(f"channel of {len(raw)} bytes exceeds Aeron's {MAX_CHANNEL_LENGTH}")
    return raw


def _text_bytes(name: str, text: object, limit: int) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a str, not {text!r}")
    raw = text.encode("utf-8")
    if len(raw) > limit:
        raise ValueError(f"{name} of {len(raw)} bytes exceeds Aeron's {limit}")
    return raw


def _pad4(length: int) -> int:
    return -length % 4


def _remove(client_id: int, correlation_id: int, registration_id: int) -> bytes:
    return _REMOVE.pack(client_id, _i64("correlation_id", correlation_id), _i64("registration_id", registration_id))


def _destination(client_id: int, correlation_id: int, registration_id: int, channel: str) -> bytes:
    raw = _channel_bytes(channel)
    head = _DESTINATION.pack(
        client_id, _i64("correlation_id", correlation_id), _i64("registration_id", registration_id), len(raw)
    )
    return head + raw


def _counter(client_id: int, correlation_id: int, type_id: int, label: str, key: bytes) -> bytes:
    if not isinstance(key, bytes):
        raise ValueError(f"counter key must be bytes, not {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"counter key of {len(key)} bytes exceeds Aeron's {MAX_KEY_LENGTH}")
    raw_label = _text_bytes("counter label", label, MAX_LABEL_LENGTH)
    return b"".join(
        (
            _COUNTER.pack(client_id, _i64("correlation_id", correlation_id), _i32("type_id", type_id)),
            _I32.pack(len(key)),
            key,
            bytes(_pad4(len(key))),
            _I32.pack(len(raw_label)),
            raw_label,
        )
    )


def _reject_image(client_id: int, correlation_id: int, image_correlation_id: int, reason: str) -> bytes:
    raw = _text_bytes("reject reason", reason, MAX_REJECT_REASON_LENGTH)
    # Position 0: Aeron's driver uses it only to reject an IPC publication; slipstream rejects UDP images.
    head = _REJECT_IMAGE.pack(
        client_id,
        _i64("correlation_id", correlation_id),
        _i64("image_correlation_id", image_correlation_id),
        0,
        len(raw),
    )
    # A terminator as Aeron's C client writes; it also lifts an empty reason to the driver's minimum size.
    body = head + raw + b"\0"
    return body.ljust(_REJECT_IMAGE_MIN_LENGTH, b"\0")


_CORRELATED_COMMANDS: Final = frozenset(COMMAND_NAMES) - {CLIENT_KEEPALIVE, CLIENT_CLOSE}


def command_correlation_id(msg_type_id: int, payload: bytes | memoryview) -> int | None:
    """The correlation id of an Aeron client's command, to answer it; None for one that expects no answer
    (keepalive, client close, an unknown type id, as Aeron's driver) or too short to hold one."""
    if msg_type_id not in _CORRELATED_COMMANDS or len(payload) < _CORRELATED.size:
        return None
    return int(_CORRELATED.unpack_from(payload, 0)[1])


def encode_error_response(correlation_id: int, code: int, message: str) -> tuple[int, bytes]:
    """ON_ERROR answering command ``correlation_id`` with Aeron error ``code`` (see ``error_code``); a
    message longer than ``MAX_ERROR_MESSAGE_LENGTH`` bytes is cut (at a character boundary), since failing
    to report an error would be worse."""
    raw = message.encode("utf-8")
    if len(raw) > MAX_ERROR_MESSAGE_LENGTH:
        raw = raw[:MAX_ERROR_MESSAGE_LENGTH].decode("utf-8", "ignore").encode("utf-8")
    head = _ERROR_RESPONSE.pack(_i64("correlation_id", correlation_id), _i32("code", code))
    return ON_ERROR, head + _I32.pack(len(raw)) + raw


# -- responses --------------------------------------------------------------------------------------


class _Reader:
    """Bounds-checked reads from one record, errors naming its type id."""

    __slots__ = ("_payload", "_type_id")

    def __init__(self, msg_type_id: int, payload: bytes | memoryview) -> None:
        self._type_id = msg_type_id
        self._payload = payload

    def fail(self, what: str) -> AeronProtocolError:
        name = RESPONSE_NAMES.get(self._type_id) or COMMAND_NAMES.get(self._type_id) or "unknown"
        return AeronProtocolError(f"Aeron record type 0x{self._type_id:04x} ({name}): {what}")

    def fixed(self, layout: struct.Struct) -> tuple[int, ...]:
        if len(self._payload) < layout.size:
            raise self.fail(f"{len(self._payload)} bytes, shorter than its {layout.size}-byte header")
        return layout.unpack_from(self._payload, 0)

    def string(self, offset: int, field: str, *, strict: bool = True) -> tuple[str, int]:
        """The length-prefixed string at ``offset`` and the offset just after it. Identifiers (paths,
        channels) must be valid UTF-8; free text (``strict=False``) shows bad bytes as U+FFFD."""
        size = len(self._payload)
        if size - offset < _I32.size:
            raise self.fail(f"{size} bytes, too short for the length of {field} at offset {offset}")
        (length,) = _I32.unpack_from(self._payload, offset)
        start = offset + _I32.size
        if length < 0 or length > size - start:
            raise self.fail(f"{field} claims {length} bytes, {size - start} remain")
        raw = bytes(self._payload[start : start + length])
        try:
            text = raw.decode("utf-8", "strict" if strict else "replace")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{field} is not UTF-8: {exc}") from None
        return text, start + length


def decode_response(
    msg_type_id: int, payload: bytes | memoryview
) -> cmd.DriverMessage | ClientTimeout | UnavailableCounter | None:
    """slipstream's message for a record of Aeron's to-clients broadcast buffer; None for one in
    ``SKIPPED_RESPONSES``. Raises ``AeronProtocolError`` for a record that does not parse or an unknown type.

    Two things the record lacks, by Aeron's design, and the caller supplies: a ``PublicationReady``'s
    channel (empty here: ``with_channel`` fills it from the request) and an ``ImageAvailable``'s join
    position (-1 here: it is the value of the subscriber position counter the record names). The parking
    slot is -1 (Aeron's log buffers have no parking table). Aeron's channel status indicator counter ids
    are dropped: slipstream's messages have no place for them."""
    reader = _Reader(msg_type_id, payload)
    if msg_type_id in (ON_PUBLICATION_READY, ON_EXCLUSIVE_PUBLICATION_READY):
        correlation_id, registration_id, session_id, stream_id, limit_id, _status_id = reader.fixed(_PUBLICATION_READY)
        log_file, _ = reader.string(_PUBLICATION_READY.size, "log file name")
        return cmd.PublicationReady(correlation_id, registration_id, session_id, stream_id, log_file, limit_id, "")
    if msg_type_id == ON_SUBSCRIPTION_READY:
        correlation_id, _status_id = reader.fixed(_SUBSCRIPTION_READY)
        # An Aeron subscription is registered under the correlation id of the command that added it.
        return cmd.SubscriptionReady(correlation_id, correlation_id)
    if msg_type_id == ON_AVAILABLE_IMAGE:
        correlation_id, session_id, stream_id, subscription_id, position_id = reader.fixed(_IMAGE_READY)
        log_file, end = reader.string(_IMAGE_READY.size, "log file name")
        # The source identity follows the log file name padded to 4 bytes (a short record fails the read).
        source_identity, _ = reader.string(end + _pad4(end), "source identity")
        return cmd.ImageAvailable(
            subscription_id, correlation_id, session_id, stream_id, log_file, position_id, -1, source_identity
        )
    if msg_type_id == ON_UNAVAILABLE_IMAGE:
        correlation_id, subscription_id, _stream_id = reader.fixed(_IMAGE_MESSAGE)
        reader.string(_IMAGE_MESSAGE.size, "channel")  # checked, not kept: slipstream's message has no channel
        return cmd.ImageUnavailable(subscription_id, correlation_id)
    if msg_type_id == ON_OPERATION_SUCCESS:
        (correlation_id,) = reader.fixed(_LONG)
        return cmd.OperationSuccess(correlation_id)
    if msg_type_id == ON_ERROR:
        correlation_id, code = reader.fixed(_ERROR_RESPONSE)
        text, _ = reader.string(_ERROR_RESPONSE.size, "error message", strict=False)
        if code not in ERROR_CODES:
            text = f"{text} (Aeron error code {code})"
        return cmd.ErrorResponse(correlation_id, error_code_name(code), text)
    if msg_type_id == ON_COUNTER_READY:
        correlation_id, counter_id = reader.fixed(_COUNTER_UPDATE)
        return cmd.CounterReady(correlation_id, counter_id)
    if msg_type_id == ON_UNAVAILABLE_COUNTER:
        registration_id, counter_id = reader.fixed(_COUNTER_UPDATE)
        return UnavailableCounter(registration_id, counter_id)
    if msg_type_id == ON_CLIENT_TIMEOUT:
        (client_id,) = reader.fixed(_LONG)
        return ClientTimeout(client_id)
    if msg_type_id in SKIPPED_RESPONSES:
        return None
    raise reader.fail("not a response type this protocol version defines")


def with_channel(ready: cmd.PublicationReady, request: cmd.AddPublication) -> cmd.PublicationReady:
    """``ready`` completed with the channel of the ``request`` it answers (Aeron's record carries none)."""
    if ready.correlation_id != request.correlation_id:
        raise ValueError(
            f"publication ready for correlation id {ready.correlation_id} does not answer {request.correlation_id}"
        )
    return msgspec.structs.replace(ready, channel=request.channel)
