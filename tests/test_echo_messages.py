"""The echo protocol without I/O: lines, one-time pad, allocators, admission; property-based."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.echo import messages as m

u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
ports = st.integers(1, 65535)


# -- lines ------------------------------------------------------------------------------------------


@given(ports)
def test_take1_hello_round_trips(port: int) -> None:
    assert m.parse_hello_port(m.format_hello_port(port)) == port


@pytest.mark.parametrize(
    "line", ["HELLO", "HELLO ", "HELLO 0", "HELLO 65536", "HELLO 8000 ", " HELLO 8000", "HELLO -1", "HELLO 8000\n",
             "hello 8000", "HELLO 99999999999999999999", "HELLO \uff18\uff10\uff10\uff10"]  # full-width digits
)
def test_take1_hello_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(m.MessageError):
        m.parse_hello_port(line)


@given(u32)
def test_hello_round_trips_in_upper_case_hex(key: int) -> None:
    line = m.format_hello(key)
    assert line == f"HELLO {key:X}"
    assert m.parse_hello(line) == key
    assert m.parse_hello(line.lower().replace("hello", "HELLO")) == key  # either case of hex digits


@pytest.mark.parametrize(
    "line", ["HELLO", "HELLO ", "HELLO G", "HELLO 123456789", "HELLO  1", "HELLO 1 ", "HELLO 1\n", "HELLO 0x1",
             "HELLO -1", "hello 1", "ECHO 1", "", "HELLO \u0661"]  # an Arabic-Indic digit
)
def test_hello_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(m.MessageError):
        m.parse_hello(line)


@given(st.text())
def test_parsers_never_raise_anything_but_message_error(text: str) -> None:
    for parse in (m.parse_hello, m.parse_hello_port, m.parse_echo, m.parse_initial_response,
                  m.parse_duologue_response):
        with contextlib.suppress(m.MessageError):
            parse(text)


@given(i32, ports, ports, u32)
def test_connect_round_trips(session: int, port: int, control_port: int, encrypted: int) -> None:
    line = m.format_connect(session, port, control_port, encrypted)
    assert line == f"{session} CONNECT {port} {control_port} {encrypted:X}"
    assert m.parse_initial_response(line) == m.ConnectResponse(session, port, control_port, encrypted)


@given(i32, st.text())
def test_session_errors_round_trip(session: int, message: str) -> None:
    line = m.format_session_error(session, message)
    assert m.parse_initial_response(line) == m.SessionErrorResponse(session, message)


def test_the_guides_lines_parse() -> None:
    assert m.parse_initial_response("-555798973 CONNECT 9014 9011 129F3C18") == m.ConnectResponse(
        -555798973, 9014, 9011, 0x129F3C18
    )
    assert m.parse_initial_response("-2147483648 ERROR too many connections for IP address") == (
        m.SessionErrorResponse(-(2**31), m.ERROR_TOO_MANY_CONNECTIONS)
    )
    assert m.parse_hello("HELLO 611786D9") == 0x611786D9
    assert m.parse_duologue_response("ECHO 12cbcf2e9c84b2f0") == m.EchoResponse("12cbcf2e9c84b2f0")
    assert m.format_session_error(-555798973, m.ERROR_SERVER_FULL) == "-555798973 ERROR server full"
    assert m.format_error(m.ERROR_BAD_MESSAGE) == "ERROR bad message"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("5 CONNECT 0 9011 1", m.UnrecognizedResponse(5, "CONNECT 0 9011 1")),  # port 0
        ("5 CONNECT 9014 70000 1", m.UnrecognizedResponse(5, "CONNECT 9014 70000 1")),
        ("5 CONNECT 9014 9011 123456789", m.UnrecognizedResponse(5, "CONNECT 9014 9011 123456789")),
        ("5 HELLO", m.UnrecognizedResponse(5, "HELLO")),
        ("-0 ERROR x", None),
        ("05 ERROR x", None),
        ("2147483648 ERROR x", None),
        ("5", None),
        ("ERROR x", None),
    ],
)
def test_initial_responses_that_are_not_connect_or_error(line: str, expected: object) -> None:
    if expected is None:
        with pytest.raises(m.MessageError):
            m.parse_initial_response(line)
    else:
        assert m.parse_initial_response(line) == expected


@given(st.text())
def test_echo_round_trips_any_text(message: str) -> None:
    assert m.parse_echo(m.format_echo(message)) == message
    assert m.parse_duologue_response(m.format_echo(message)) == m.EchoResponse(message)
    assert m.parse_duologue_response(m.format_error(message)) == m.ErrorResponse(message)


@pytest.mark.parametrize("line", ["ECHO", "ECHOx", "echo x", " ECHO x", "HELLO 1", ""])
def test_echo_rejects_other_lines(line: str) -> None:
    with pytest.raises(m.MessageError):
        m.parse_echo(line)


def test_decode_accepts_only_utf8() -> None:
    assert m.decode(b"ECHO \xc3\xa9") == "ECHO é"
    assert m.decode(memoryview(b"x")) == "x"
    assert m.decode(b"\xff\xfe") is None


# -- one-time pad -----------------------------------------------------------------------------------


@given(i32, u32)
def test_pad_decrypts_what_it_encrypts(session: int, key: int) -> None:
    encrypted = m.encrypt_session(session, key)
    assert 0 <= encrypted < 2**32
    assert m.decrypt_session(encrypted, key) == session


@given(i32, u32, u32)
def test_a_wrong_key_gives_a_different_session(session: int, key: int, other: int) -> None:
    if key != other:
        assert m.decrypt_session(m.encrypt_session(session, key), other) != session


def test_the_guides_example_pad() -> None:
    # Client key 611786D9, reply 129F3C18: the duologue's session, 1938340545 in the guide's log.
    assert m.decrypt_session(0x129F3C18, 0x611786D9) == 1938340545


def test_new_keys_are_32_bit_and_fresh() -> None:
    keys = {m.new_key() for _ in range(64)}
    assert all(0 <= key < 2**32 for key in keys) and len(keys) > 60


@given(st.integers())
def test_to_i32_wraps_like_java(value: int) -> None:
    wrapped = m.to_i32(value)
    assert -(2**31) <= wrapped < 2**31 and (wrapped - value) % 2**32 == 0


# -- admission --------------------------------------------------------------------------------------


@given(st.integers(0, 10), st.integers(1, 10), st.integers(0, 10), st.integers(1, 10))
def test_admission_checks_server_full_first(duologues: int, max_clients: int, owned: int, per_address: int) -> None:
    error = m.admission_error(duologues, max_clients, owned, per_address)
    if duologues >= max_clients:
        assert error == "server full"
    elif owned >= per_address:
        assert error == "too many connections for IP address"
    else:
        assert error is None


# -- allocators -------------------------------------------------------------------------------------


@settings(max_examples=200)
@given(st.integers(1, 65000), st.integers(1, 40), st.lists(st.booleans(), max_size=200), st.integers(0, 2**32))
def test_port_allocator_never_hands_out_a_port_twice(base: int, count: int, script: list[bool], seed: int) -> None:
    allocator = m.PortAllocator(base, min(count, 65536 - base), random.Random(seed))
    count = allocator.count
    held: list[int] = []
    for allocate in script:
        if allocate:
            if allocator.available >= 2:
                pair = allocator.allocate(2)
                assert len(set(pair)) == 2 and not set(pair) & set(held)
                assert all(base <= port < base + count for port in pair)
                held.extend(pair)
            else:
                with pytest.raises(m.AllocationError):
                    allocator.allocate(2)
                assert allocator.available == count - len(held)  # a failed allocation takes nothing
        elif held:
            port = held.pop(len(held) // 2)
            assert allocator.free(port)
            assert not allocator.free(port)  # a second free is a no-op, never a duplicate
        assert allocator.in_use == frozenset(held)
        assert allocator.available + len(held) == count


def test_port_allocator_covers_the_whole_range_and_reuses_freed_ports_last() -> None:
    allocator = m.PortAllocator(9010, 8, random.Random(1))
    first = allocator.allocate(8)
    assert sorted(first) == list(range(9010, 9018))
    assert allocator.available == 0
    allocator.free(first[3])
    allocator.free(first[0])
    assert allocator.allocate(2) == (first[3], first[0])
    assert not allocator.free(1)  # outside the range


@pytest.mark.parametrize(("base", "count"), [(0, 1), (65535, 2), (1, 0), (-5, 3)])
def test_port_allocator_rejects_bad_ranges(base: int, count: int) -> None:
    with pytest.raises(ValueError):
        m.PortAllocator(base, count)


@settings(max_examples=200)
@given(st.integers(-20, 20), st.integers(0, 30), st.lists(st.booleans(), max_size=120), st.integers(0, 2**32))
def test_session_allocator_stays_in_range_and_never_repeats(
    low: int, width: int, script: list[bool], seed: int
) -> None:
    allocator = m.SessionAllocator(low, low + width, random.Random(seed))
    held: set[int] = set()
    for allocate in script:
        if allocate:
            if len(held) == width + 1:
                with pytest.raises(m.AllocationError):
                    allocator.allocate()
                continue
            session = allocator.allocate()
            assert low <= session <= low + width and session not in held
            held.add(session)
        elif held:
            session = min(held)
            held.remove(session)
            assert allocator.free(session) and not allocator.free(session)
        assert allocator.in_use == held


def test_session_allocator_can_fill_a_range_completely() -> None:
    allocator = m.SessionAllocator(7, 7)
    assert allocator.allocate() == 7
    with pytest.raises(m.AllocationError):
        allocator.allocate()
    allocator.free(7)
    assert allocator.allocate() == 7
    small = m.SessionAllocator(-3, 3, random.Random(4))
    assert sorted(small.allocate() for _ in range(7)) == list(range(-3, 4))


def test_session_allocator_default_range_is_the_guides() -> None:
    allocator = m.SessionAllocator(m.RESERVED_SESSION_ID_LOW, m.RESERVED_SESSION_ID_HIGH)
    sessions = {allocator.allocate() for _ in range(100)}
    assert len(sessions) == 100 and all(1 <= s <= 2**31 - 1 for s in sessions)
    with pytest.raises(ValueError):
        m.SessionAllocator(5, 4)
    with pytest.raises(ValueError):
        m.SessionAllocator(0, 2**31)


@given(st.lists(st.tuples(st.sampled_from(["10.0.0.1", "10.0.0.2", "::1"]), st.booleans()), max_size=60))
def test_address_counter_matches_a_model(operations: list[tuple[str, bool]]) -> None:
    counter = m.AddressCounter()
    model: dict[str, int] = {}
    for address, up in operations:
        if up:
            model[address] = model.get(address, 0) + 1
            assert counter.increment(address) == model[address]
        elif model.get(address):
            model[address] -= 1
            assert counter.decrement(address) == model[address]
        assert counter.count_for(address) == model.get(address, 0)
        assert len(counter) == sum(1 for v in model.values() if v)
