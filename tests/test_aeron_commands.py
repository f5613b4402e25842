"""Aeron's client <-> driver control protocol: byte-exact layouts, built here with struct from the field order
of Aeron 1.53's aeron_control_protocol.h and io.aeron.command flyweights (independent of the encoder), round
trips, truncated and lying records, field limits."""

from __future__ import annotations

import random
import struct

import pytest

from slipstream.files import aeron_commands as ac
from slipstream.files import commands as cmd

CLIENT = 0x0102030405060708


def _string(raw: bytes) -> bytes:
    return struct.pack("<i", len(raw)) + raw


# -- type ids and error codes -----------------------------------------------------------------------

COMMAND_IDS = {
    "ADD_PUBLICATION": 0x01,
    "REMOVE_PUBLICATION": 0x02,
    "ADD_EXCLUSIVE_PUBLICATION": 0x03,
    "ADD_SUBSCRIPTION": 0x04,
    "REMOVE_SUBSCRIPTION": 0x05,
    "CLIENT_KEEPALIVE": 0x06,
    "ADD_DESTINATION": 0x07,
    "REMOVE_DESTINATION": 0x08,
    "ADD_COUNTER": 0x09,
    "REMOVE_COUNTER": 0x0A,
    "CLIENT_CLOSE": 0x0B,
    "ADD_RCV_DESTINATION": 0x0C,
    "REMOVE_RCV_DESTINATION": 0x0D,
    "TERMINATE_DRIVER": 0x0E,
    "ADD_STATIC_COUNTER": 0x0F,
    "REJECT_IMAGE": 0x10,
    "REMOVE_DESTINATION_BY_ID": 0x11,
    "GET_NEXT_AVAILABLE_SESSION_ID": 0x12,
}
RESPONSE_IDS = {
    "ON_ERROR": 0x0F01,
    "ON_AVAILABLE_IMAGE": 0x0F02,
    "ON_PUBLICATION_READY": 0x0F03,
    "ON_OPERATION_SUCCESS": 0x0F04,
    "ON_UNAVAILABLE_IMAGE": 0x0F05,
    "ON_EXCLUSIVE_PUBLICATION_READY": 0x0F06,
    "ON_SUBSCRIPTION_READY": 0x0F07,
    "ON_COUNTER_READY": 0x0F08,
    "ON_UNAVAILABLE_COUNTER": 0x0F09,
    "ON_CLIENT_TIMEOUT": 0x0F0A,
    "ON_STATIC_COUNTER": 0x0F0B,
    "ON_PUBLICATION_ERROR": 0x0F0C,
    "ON_NEXT_AVAILABLE_SESSION_ID": 0x0F0D,
}


def test_type_ids_are_aerons() -> None:
    for name, value in {**COMMAND_IDS, **RESPONSE_IDS}.items():
        assert getattr(ac, name) == value, name
    assert dict(ac.COMMAND_NAMES) == {value: name for name, value in COMMAND_IDS.items()}
    assert dict(ac.RESPONSE_NAMES) == {value: name for name, value in RESPONSE_IDS.items()}


def test_error_codes_both_ways() -> None:
    expected = [
        "UNUSED", "INVALID_CHANNEL", "UNKNOWN_SUBSCRIPTION", "UNKNOWN_PUBLICATION", "CHANNEL_ENDPOINT_ERROR",
        "UNKNOWN_COUNTER", "UNKNOWN_COMMAND_TYPE_ID", "MALFORMED_COMMAND", "NOT_SUPPORTED", "UNKNOWN_HOST",
        "RESOURCE_TEMPORARILY_UNAVAILABLE", "GENERIC_ERROR", "STORAGE_SPACE", "IMAGE_REJECTED", "PUBLICATION_REVOKED",
    ]  # fmt: skip
    for value, name in enumerate(expected):
        assert ac.error_code_name(value) == name
        assert ac.error_code(name) == value
    assert ac.error_code_name(-1) == "UNKNOWN_CODE_VALUE"
    assert ac.error_code_name(99) == "UNKNOWN_CODE_VALUE"
    # slipstream's own codes have no Aeron number: an Aeron client sees a generic error.
    assert ac.error_code("UNKNOWN_DESTINATION") == 11
    assert ac.error_code("UNSUPPORTED_CHANNEL") == 11


# -- commands: byte-exact ---------------------------------------------------------------------------


def _encode(message: cmd.ClientMessage) -> tuple[int, bytes]:
    encoded = ac.encode_command(message, CLIENT)
    assert encoded is not None
    return encoded


@pytest.mark.parametrize("exclusive", [False, True])
def test_add_publication(exclusive: bool) -> None:
    channel = "aeron:udp?endpoint=localhost:40123|mtu=1408"
    type_id, payload = _encode(cmd.AddPublication(77, channel, 1001, exclusive))
    assert type_id == (0x03 if exclusive else 0x01)
    # client id, correlation id, stream id, channel length, channel
    assert payload == struct.pack("<qqii", CLIENT, 77, 1001, len(channel)) + channel.encode()
    assert len(payload) == 24 + len(channel)


def test_remove_publication_has_flags_and_no_revoke() -> None:
    type_id, payload = _encode(cmd.RemovePublication(78, 66))
    assert type_id == 0x02
    # client id, correlation id, registration id, flags (u64: bit 0 is revoke)
    assert payload == struct.pack("<qqqQ", CLIENT, 78, 66, 0)
    assert len(payload) == 32


def test_add_subscription() -> None:
    channel = "aeron:ipc"
    type_id, payload = _encode(cmd.AddSubscription(79, channel, -5))
    assert type_id == 0x04
    # client id, correlation id, registration correlation id (NULL_VALUE), stream id, channel length, channel
    assert payload == struct.pack("<qqqii", CLIENT, 79, -1, -5, 9) + b"aeron:ipc"


@pytest.mark.parametrize(
    ("message", "type_id"),
    [(cmd.RemoveSubscription(80, 12), 0x05), (cmd.RemoveCounter(80, 12), 0x0A)],
)
def test_remove_subscription_and_counter(message: cmd.ClientMessage, type_id: int) -> None:
    assert _encode(message) == (type_id, struct.pack("<qqq", CLIENT, 80, 12))


@pytest.mark.parametrize("add", [True, False])
def test_publication_destinations(add: bool) -> None:
    channel = "aeron:udp?endpoint=10.0.0.2:40124"
    kind = cmd.AddDestination if add else cmd.RemoveDestination
    type_id, payload = _encode(kind(81, 66, channel))
    # slipstream's destinations are a publication's (manual MDC): never the receive-side ids 0x0C/0x0D.
    assert type_id == (0x07 if add else 0x08)
    # client id, correlation id, publication registration id, channel length, channel
    assert payload == struct.pack("<qqqi", CLIENT, 81, 66, len(channel)) + channel.encode()


@pytest.mark.parametrize("key_length", [0, 1, 3, 4, 5, 112])
def test_add_counter_pads_the_key(key_length: int) -> None:
    key = bytes(range(1, key_length + 1))
    label = "orders: naks ü"
    type_id, payload = _encode(cmd.AddCounter(82, 1101, label, key))
    assert type_id == 0x09
    padding = b"\0" * (-key_length % 4)
    raw_label = label.encode("utf-8")
    # client id, correlation id, type id; key length, key padded to 4; label length, label
    expected = struct.pack("<qqi", CLIENT, 82, 1101) + _string(key) + padding + _string(raw_label)
    assert payload == expected
    assert len(payload) == 20 + 4 + (key_length + 3) // 4 * 4 + 4 + len(raw_label)


def test_reject_image() -> None:
    type_id, payload = _encode(cmd.RejectImage(83, 555, "bad peer"))
    assert type_id == 0x10
    # client id, correlation id, image correlation id, position, reason length, reason, terminator
    assert payload == struct.pack("<qqqqi", CLIENT, 83, 555, 0, 8) + b"bad peer\0"


def test_reject_image_empty_reason_meets_the_c_drivers_minimum() -> None:
    # sizeof(aeron_reject_image_command_t) is 40 (its 1-byte text array, packed to 4): the driver refuses less.
    _, payload = _encode(cmd.RejectImage(84, 555, ""))
    assert payload == struct.pack("<qqqqi", CLIENT, 84, 555, 0, 0) + b"\0" * 4
    assert len(payload) == 40


def test_keepalive_and_close() -> None:
    assert _encode(cmd.Keepalive()) == (0x06, struct.pack("<qq", CLIENT, 0))
    assert _encode(cmd.CloseClient()) == (0x0B, struct.pack("<qq", CLIENT, -1))


@pytest.mark.parametrize("message", [cmd.Hello(CLIENT, 1234), cmd.Wake(), cmd.InvalidCommand(9, "bad")])
def test_commands_aeron_has_no_use_for(message: cmd.ClientMessage) -> None:
    assert ac.encode_command(message, CLIENT) is None


def test_not_a_command() -> None:
    with pytest.raises(ValueError, match="not a slipstream client command"):
        ac.encode_command(cmd.OperationSuccess(1), CLIENT)  # type: ignore[arg-type]


# -- commands: limits -------------------------------------------------------------------------------


def test_channel_length_limit() -> None:
    longest = "aeron:ipc?alias=" + "x" * (4095 - 16)
    assert len(longest) == 4095
    _, payload = _encode(cmd.AddSubscription(1, longest, 1))
    assert len(payload) == 32 + 4095
    with pytest.raises(ValueError, match="4096 bytes exceeds Aeron's 4095"):
        ac.encode_command(cmd.AddSubscription(1, longest + "x", 1), CLIENT)
    with pytest.raises(ValueError, match="4096 bytes exceeds"):
        ac.encode_command(cmd.AddDestination(1, 2, longest + "x"), CLIENT)


def test_channel_must_be_ascii() -> None:
    with pytest.raises(ValueError, match="ASCII"):
        ac.encode_command(cmd.AddPublication(1, "aeron:ipc?alias=é", 1, False), CLIENT)


def test_counter_limits() -> None:
    with pytest.raises(ValueError, match="key of 113 bytes exceeds Aeron's 112"):
        ac.encode_command(cmd.AddCounter(1, 1101, "label", b"k" * 113), CLIENT)
    _encode(cmd.AddCounter(1, 1101, "x" * 380))
    # The limit is in bytes: 190 two-byte characters fit, 191 do not.
    _encode(cmd.AddCounter(1, 1101, "é" * 190))
    with pytest.raises(ValueError, match="label of 382 bytes exceeds Aeron's 380"):
        ac.encode_command(cmd.AddCounter(1, 1101, "é" * 191), CLIENT)
    with pytest.raises(ValueError, match="type_id must be a signed 32-bit integer"):
        ac.encode_command(cmd.AddCounter(1, 2**31, "label"), CLIENT)


def test_reject_reason_limit() -> None:
    _encode(cmd.RejectImage(1, 2, "r" * 1023))
    with pytest.raises(ValueError, match="reason of 1024 bytes exceeds Aeron's 1023"):
        ac.encode_command(cmd.RejectImage(1, 2, "r" * 1024), CLIENT)


@pytest.mark.parametrize(
    ("message", "client_id", "field"),
    [
        (cmd.AddPublication(1, "aeron:ipc", 2**31, False), CLIENT, "stream_id"),
        (cmd.AddSubscription(1, "aeron:ipc", -(2**31) - 1), CLIENT, "stream_id"),
        (cmd.RemovePublication(2**63, 1), CLIENT, "correlation_id"),
        (cmd.RemoveSubscription(1, -(2**63) - 1), CLIENT, "registration_id"),
        (cmd.AddSubscription(True, "aeron:ipc", 1), CLIENT, "correlation_id"),  # type: ignore[arg-type]
        (cmd.Keepalive(), 2**63, "client_id"),
    ],
)
def test_integers_out_of_range(message: cmd.ClientMessage, client_id: int, field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a signed"):
        ac.encode_command(message, client_id)


def test_extreme_integers_fit() -> None:
    low, high = -(2**63), 2**63 - 1
    _, payload = _encode(cmd.AddPublication(high, "aeron:ipc", -(2**31), True))
    assert payload[:24] == struct.pack("<qqii", CLIENT, high, -(2**31), 9)
    assert ac.encode_command(cmd.RemoveCounter(low, high), low) == (0x0A, struct.pack("<qqq", low, low, high))


# -- command correlation ids (for a driver answering Aeron clients) ----------------------------------

ANSWERED = [
    cmd.AddPublication(101, "aeron:ipc", 1, False),
    cmd.AddPublication(102, "aeron:ipc", 1, True),
    cmd.RemovePublication(103, 1),
    cmd.AddSubscription(104, "aeron:ipc", 1),
    cmd.RemoveSubscription(105, 1),
    cmd.AddDestination(106, 1, "aeron:udp?endpoint=localhost:1"),
    cmd.RemoveDestination(107, 1, "aeron:udp?endpoint=localhost:1"),
    cmd.AddCounter(108, 1101, "label", b"key"),
    cmd.RemoveCounter(109, 1),
    cmd.RejectImage(110, 1, "why"),
]


@pytest.mark.parametrize("message", ANSWERED, ids=lambda message: type(message).__name__)
def test_command_correlation_id(message: cmd.AddPublication) -> None:
    type_id, payload = _encode(message)
    assert ac.command_correlation_id(type_id, payload) == message.correlation_id
    assert ac.command_correlation_id(type_id, memoryview(payload)) == message.correlation_id
    assert ac.command_correlation_id(type_id, payload[:15]) is None


def test_command_correlation_id_of_unanswered_commands() -> None:
    for message in (cmd.Keepalive(), cmd.CloseClient()):
        type_id, payload = _encode(message)
        assert ac.command_correlation_id(type_id, payload) is None
    # Commands slipstream does not send still have their correlation id where every command has it.
    other = struct.pack("<qqqq", CLIENT, 111, 5, 6)
    assert ac.command_correlation_id(ac.REMOVE_DESTINATION_BY_ID, other) == 111
    assert ac.command_correlation_id(ac.TERMINATE_DRIVER, other) == 111
    assert ac.command_correlation_id(0x7F, other) is None
    assert ac.command_correlation_id(ac.ON_ERROR, other) is None


# -- responses: byte-exact decoding -----------------------------------------------------------------

LOG = b"/dev/shm/aeron-user/publications/42.logbuffer"


@pytest.mark.parametrize("type_id", [0x0F03, 0x0F06])
def test_publication_ready(type_id: int) -> None:
    # correlation id, registration id, session id, stream id, position limit counter id,
    # channel status indicator id, log file name
    record = struct.pack("<qqiiii", 200, 199, -7, 1001, 12, 13) + _string(LOG)
    ready = ac.decode_response(type_id, record)
    assert ready == cmd.PublicationReady(200, 199, -7, 1001, LOG.decode(), 12, "")
    request = cmd.AddPublication(200, "aeron:udp?endpoint=localhost:40123", 1001, type_id == 0x0F06)
    assert isinstance(ready, cmd.PublicationReady)
    assert ac.with_channel(ready, request) == cmd.PublicationReady(
        200, 199, -7, 1001, LOG.decode(), 12, request.channel
    )
    with pytest.raises(ValueError, match="does not answer 201"):
        ac.with_channel(ready, cmd.AddPublication(201, "aeron:ipc", 1001, False))


def test_subscription_ready() -> None:
    # correlation id, channel status indicator id; the registration id is the correlation id
    record = struct.pack("<qi", 300, 14)
    assert ac.decode_response(0x0F07, record) == cmd.SubscriptionReady(300, 300)


@pytest.mark.parametrize("log_length", [0, 1, 2, 3, 4, 5, 45])
def test_available_image(log_length: int) -> None:
    log = (b"/dev/shm/x/" * 5)[:log_length]
    source = b"127.0.0.1:40123"
    # correlation id, session id, stream id, subscription registration id, subscriber position counter id,
    # log file name padded to 4, source identity
    record = (
        struct.pack("<qiiqi", 400, 9, 1001, 300, 21)
        + _string(log)
        + b"\xee" * (-log_length % 4)  # padding bytes are not read
        + _string(source)
    )
    image = ac.decode_response(0x0F02, memoryview(record))
    assert image == cmd.ImageAvailable(300, 400, 9, 1001, log.decode(), 21, -1, source.decode(), -1)


def test_unavailable_image() -> None:
    # image correlation id, subscription registration id, stream id, channel
    channel = b"aeron:udp?endpoint=localhost:40123"
    record = struct.pack("<qqi", 400, 300, 1001) + _string(channel)
    assert ac.decode_response(0x0F05, record) == cmd.ImageUnavailable(300, 400)


def test_operation_success_counters_timeout() -> None:
    assert ac.decode_response(0x0F04, struct.pack("<q", 500)) == cmd.OperationSuccess(500)
    assert ac.decode_response(0x0F08, struct.pack("<qi", 501, 33)) == cmd.CounterReady(501, 33)
    assert ac.decode_response(0x0F09, struct.pack("<qi", 501, 33)) == ac.UnavailableCounter(501, 33)
    assert ac.decode_response(0x0F0A, struct.pack("<q", CLIENT)) == ac.ClientTimeout(CLIENT)


def test_error_response() -> None:
    # offending correlation id, error code, message
    record = struct.pack("<qi", 600, 1) + _string(b"invalid channel: aeron:bogus")
    assert ac.decode_response(0x0F01, record) == cmd.ErrorResponse(
        600, "INVALID_CHANNEL", "invalid channel: aeron:bogus"
    )


def test_error_response_with_a_code_aeron_does_not_define_keeps_the_number() -> None:
    record = struct.pack("<qi", 601, 77) + _string(b"from the future")
    assert ac.decode_response(0x0F01, record) == cmd.ErrorResponse(
        601, "UNKNOWN_CODE_VALUE", "from the future (Aeron error code 77)"
    )


def test_error_message_with_bad_bytes_is_shown_not_dropped() -> None:
    record = struct.pack("<qi", 602, 11) + _string(b"bad \xff byte")
    assert ac.decode_response(0x0F01, record) == cmd.ErrorResponse(602, "GENERIC_ERROR", "bad \ufffd byte")


def test_trailing_bytes_are_tolerated() -> None:
    # A later driver may append fields; the known ones still read.
    assert ac.decode_response(0x0F04, struct.pack("<qq", 500, 99)) == cmd.OperationSuccess(500)


@pytest.mark.parametrize("type_id", [0x0F0B, 0x0F0C, 0x0F0D])
def test_skipped_responses(type_id: int) -> None:
    assert type_id in ac.SKIPPED_RESPONSES
    assert ac.decode_response(type_id, b"") is None


def test_unknown_response_type() -> None:
    with pytest.raises(ac.AeronProtocolError, match=r"type 0x0f0e \(unknown\)"):
        ac.decode_response(0x0F0E, struct.pack("<q", 1))
    with pytest.raises(ac.AeronProtocolError, match=r"0x0001 \(ADD_PUBLICATION\)"):
        ac.decode_response(ac.ADD_PUBLICATION, struct.pack("<q", 1))


# -- error responses a driver sends ------------------------------------------------------------------


def test_encode_error_response_layout_and_round_trip() -> None:
    type_id, payload = ac.encode_error_response(700, ac.error_code("UNKNOWN_PUBLICATION"), "no publication 5")
    assert type_id == 0x0F01
    assert payload == struct.pack("<qi", 700, 3) + _string(b"no publication 5")
    assert ac.decode_response(type_id, payload) == cmd.ErrorResponse(700, "UNKNOWN_PUBLICATION", "no publication 5")


def test_encode_error_response_cuts_a_long_message_at_a_character() -> None:
    message = "a" + "é" * 5000  # 10001 bytes; byte 8192 is the middle of a character
    _, payload = ac.encode_error_response(701, 11, message)
    decoded = ac.decode_response(0x0F01, payload)
    assert isinstance(decoded, cmd.ErrorResponse)
    assert decoded.message == "a" + "é" * 4095
    assert len(payload) == 16 + 8191
    with pytest.raises(ValueError, match="code must be a signed 32-bit"):
        ac.encode_error_response(701, 2**31, "x")


# -- truncated and lying records --------------------------------------------------------------------

VALID_RECORDS = [
    (0x0F01, struct.pack("<qi", 600, 1) + _string(b"message")),
    (0x0F02, struct.pack("<qiiqi", 400, 9, 1001, 300, 21) + _string(b"log") + b"\0" + _string(b"src")),
    (0x0F03, struct.pack("<qqiiii", 200, 199, 7, 1001, 12, 13) + _string(LOG)),
    (0x0F04, struct.pack("<q", 500)),
    (0x0F05, struct.pack("<qqi", 400, 300, 1001) + _string(b"aeron:ipc")),
    (0x0F06, struct.pack("<qqiiii", 200, 200, 7, 1001, 12, 13) + _string(LOG)),
    (0x0F07, struct.pack("<qi", 300, 14)),
    (0x0F08, struct.pack("<qi", 501, 33)),
    (0x0F09, struct.pack("<qi", 501, 33)),
    (0x0F0A, struct.pack("<q", CLIENT)),
]


@pytest.mark.parametrize(
    ("type_id", "record"), VALID_RECORDS, ids=lambda value: f"{value:#x}" if isinstance(value, int) else ""
)
def test_every_truncation_is_refused(type_id: int, record: bytes) -> None:
    assert ac.decode_response(type_id, record) is not None
    for cut in range(len(record)):
        with pytest.raises(ac.AeronProtocolError, match=f"type 0x{type_id:04x}"):
            ac.decode_response(type_id, record[:cut])


@pytest.mark.parametrize("claimed", [-1, -(2**31), 8, 2**31 - 1])
def test_lying_string_lengths_are_refused(claimed: int) -> None:
    # Each record has 7 bytes where its string claims more (or a negative number).
    lying = struct.pack("<i", claimed) + b"abcdefg"
    cases = [
        (0x0F01, struct.pack("<qi", 600, 1) + lying, "error message"),
        (0x0F03, struct.pack("<qqiiii", 200, 199, 7, 1001, 12, 13) + lying, "log file name"),
        (0x0F05, struct.pack("<qqi", 400, 300, 1001) + lying, "channel"),
        (0x0F02, struct.pack("<qiiqi", 400, 9, 1001, 300, 21) + lying, "log file name"),
        (0x0F02, struct.pack("<qiiqi", 400, 9, 1001, 300, 21) + _string(b"log") + b"\0" + lying, "source identity"),
    ]
    for type_id, record, field in cases:
        with pytest.raises(ac.AeronProtocolError, match=f"{field} claims {claimed} bytes, 7 remain"):
            ac.decode_response(type_id, record)


def test_a_path_that_is_not_utf8_is_refused() -> None:
    record = struct.pack("<qqiiii", 200, 199, 7, 1001, 12, 13) + _string(b"/dev/shm/\xff.logbuffer")
    with pytest.raises(ac.AeronProtocolError, match=r"ON_PUBLICATION_READY\): log file name is not UTF-8"):
        ac.decode_response(0x0F03, record)


def test_random_records_never_crash() -> None:
    """Whatever bytes come, the decoder returns a message or raises AeronProtocolError, nothing else."""
    rng = random.Random(33)
    outcomes = {"message": 0, "refused": 0}
    for _ in range(3000):
        type_id = rng.choice(list(RESPONSE_IDS.values()))
        base = dict(VALID_RECORDS).get(type_id, b"")
        record = bytearray(base or rng.randbytes(rng.randrange(40)))
        for _ in range(rng.randrange(1, 4)):  # flip a few bytes, then maybe cut
            if record:
                record[rng.randrange(len(record))] = rng.randrange(256)
        if rng.random() < 0.3:
            del record[rng.randrange(len(record) + 1) :]
        try:
            ac.decode_response(type_id, bytes(record))
            outcomes["message"] += 1
        except ac.AeronProtocolError:
            outcomes["refused"] += 1
    assert outcomes["message"] > 0 and outcomes["refused"] > 0
