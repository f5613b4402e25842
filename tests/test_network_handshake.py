"""The handshake machines in memory: Noise XX + WELCOME, rejections, retries under loss, the
half-open table under a flood, and every id given back."""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.network.events import ClientAccepted, HandshakeCompleted, HandshakeTimedOut, Rejected
from slipstream.network.handshake import KEY_CHANGED, REGISTRATION_MISMATCH_LOCAL, VERSION, ClientState, PacketType
from slipstream.testing import HandshakePair, LinkConditions


@dataclasses.dataclass
class Hello:
    text: str


@dataclasses.dataclass
class Other:
    number: int


def allocator_in_use(allocator: object) -> frozenset[int]:
    """What an allocator reports as handed out (``in_use`` as a property or a method)."""
    value = getattr(allocator, "in_use", frozenset())
    return frozenset(value() if callable(value) else value)


def completed(pair: HandshakePair, source: int) -> HandshakeCompleted:
    events = pair.clients[source].take_events()
    assert len(events) == 1 and isinstance(events[0], HandshakeCompleted), events
    return events[0]


def test_handshake_agrees_on_keys_and_allocation() -> None:
    pair = HandshakePair(server_types=[Hello], client_types=[Hello])
    client = pair.add_client(7)
    pair.pump(until=lambda: client.state is ClientState.COMPLETED)
    done = completed(pair, 7)
    (accepted,) = pair.server.take_events()
    assert isinstance(accepted, ClientAccepted)
    assert done.connection_id == accepted.connection_id == accepted.server_session_id
    assert done.send_key == accepted.receive_key and done.receive_key == accepted.send_key
    assert done.send_key != done.receive_key
    assert done.remote_public_key == pair.server_key[1]
    assert accepted.remote_public_key != pair.server_key[1] and len(accepted.remote_public_key) == 32
    assert (done.server_stream_id, done.client_stream_id) == (accepted.server_stream_id, accepted.client_stream_id)
    assert done.control_port == accepted.control_port and 30000 <= done.control_port < 30100
    assert accepted.address == "10.0.0.2"
    assert 1 <= done.server_session_id <= 65534 and done.client_session_id != done.server_session_id
    assert pair.server.release(done.connection_id)
    assert (
        not allocator_in_use(pair.server.sessions)
        and not allocator_in_use(pair.server.streams)
        and not allocator_in_use(pair.server.ports)
    )
    assert not pair.server.release(done.connection_id)


@pytest.mark.parametrize("seed", range(6))
def test_handshakes_complete_under_loss_duplication_and_reordering(seed: int) -> None:
    conditions = LinkConditions(loss=0.3, duplicate=0.2, reorder=0.2, delay_ns=1_000_000, jitter_ns=2_000_000)
    pair = HandshakePair(conditions=conditions, seed=seed, timeout_ns=30_000_000_000)
    clients = [pair.add_client(source) for source in range(1, 6)]
    pair.pump(
        until=lambda: all(
            c.state is not ClientState.HELLO_SENT and c.state is not ClientState.DONE_SENT for c in clients
        )
    )
    ids = set()
    for source, client in enumerate(clients, 1):
        assert client.state is ClientState.COMPLETED, (seed, source, client.state)
        ids.add(completed(pair, source).connection_id)
    accepted = [e for e in pair.server.take_events() if isinstance(e, ClientAccepted)]
    assert {e.connection_id for e in accepted} == ids and len(accepted) == 5  # each accepted once
    assert len(allocator_in_use(pair.server.sessions)) == 10


def test_client_times_out_when_the_server_never_answers() -> None:
    pair = HandshakePair(conditions=LinkConditions(loss=1.0), timeout_ns=3_000_000_000)
    client = pair.add_client(1)
    start = pair.clock.now_ns()
    pair.pump()
    (event,) = client.take_events()
    assert isinstance(event, HandshakeTimedOut) and client.state is ClientState.TIMED_OUT
    assert 3.0 <= event.waited_s < 3.1
    assert pair.clock.now_ns() - start >= 3_000_000_000
    sent = pair.network.stats.sent
    assert 4 <= sent <= 10  # retried with back-off, not flooding


def test_server_rejection_reaches_the_client_with_its_reason() -> None:
    def full(address: str | None, tag: str, key: bytes | None, total: int, per: int) -> tuple[int, str] | None:
        return (1, "server is full")

    pair = HandshakePair(admission=full)
    client = pair.add_client(1, tag="bob")
    pair.pump()
    (event,) = client.take_events()
    assert event == Rejected(1, "server is full") and client.state is ClientState.REJECTED
    assert not allocator_in_use(pair.server.sessions) and pair.server.pending_count == 0
    (refused,) = pair.server.take_events()  # the server's event names whom it refused: address and tag
    assert refused == Rejected(1, "server is full", "10.0.0.2", "bob")


def test_registration_mismatch_names_the_first_differing_type() -> None:
    pair = HandshakePair(server_types=[Hello, Other], client_types=[Hello])
    client = pair.add_client(1)
    pair.pump()
    (event,) = client.take_events()
    assert isinstance(event, Rejected) and event.reason == REGISTRATION_MISMATCH_LOCAL
    assert "Other" in event.message
    assert not allocator_in_use(pair.server.sessions)


def test_other_app_id_is_rejected() -> None:
    pair = HandshakePair(app_id="alpha")
    client = pair.add_client(1, app_id="beta")
    pair.pump()
    (event,) = client.take_events()
    assert isinstance(event, Rejected) and "beta" in event.message


def test_pinned_key_mismatch_is_refused_unless_allowed() -> None:
    pair = HandshakePair()
    client = pair.add_client(1, pinned_key=b"\x01" * 32)
    allowed = pair.add_client(2, pinned_key=b"\x01" * 32, allow_key_change=True)
    same = pair.add_client(3, pinned_key=pair.server_key[1])
    pair.pump()
    (event,) = client.take_events()
    assert isinstance(event, Rejected) and event.reason == KEY_CHANGED
    assert isinstance(allowed.take_events()[0], HandshakeCompleted)
    assert isinstance(same.take_events()[0], HandshakeCompleted)
    assert len(pair.server.connections) == 2


def test_hello_flood_keeps_memory_bounded_and_lets_real_clients_in() -> None:
    """Forged HELLOs from thousands of sources (never completing) cost at most ``max_pending``
    entries, allocate nothing, and real clients (which retry) still complete among them."""
    pair = HandshakePair(max_pending=32, handshakes_per_second=5000, timeout_ns=10_000_000_000)
    real = []
    for round_ in range(40):
        # 50 forged HELLOs per simulated millisecond, each from a fresh source with a fresh nonce
        for i in range(50):
            source = 1000 + round_ * 50 + i
            packet = (
                bytes([VERSION, PacketType.HELLO])
                + (source + 7).to_bytes(8, "big")
                + b"\x04test\x00\x00"
                + os.urandom(32)
            )
            pair.server.receive(packet, source=source, address="10.9.0.1", port=source, now_ns=pair.clock.now_ns())
        pair.server.messages_to_send()
        assert pair.server.pending_count <= 32
        if round_ % 10 == 0:
            real.append(pair.add_client(len(real) + 1))
        pair.pump(max_ns=1_000_000, until=lambda: False)
    pair.pump(until=lambda: all(c.state is ClientState.COMPLETED for c in real), max_ns=10_000_000_000)
    assert all(c.state is ClientState.COMPLETED for c in real)
    assert len(pair.server.connections) == len(real) == 4
    assert len(allocator_in_use(pair.server.sessions)) == 8  # nothing allocated for the forged ones
    stats = pair.server.stats
    assert stats.hellos >= 2000 and (stats.evicted + stats.rate_limited) > 0
    pair.clock.advance(11_000_000_000)
    pair.server.handle_timer(pair.clock.now_ns())
    assert pair.server.pending_count == 0  # half-open handshakes expire


def test_forged_done_does_not_disturb_a_real_handshake() -> None:
    pair = HandshakePair()
    client = pair.add_client(1, start=False)
    client.start(pair.clock.now_ns())
    for packet in client.messages_to_send():
        pair.server.receive(packet, source=1, address="10.0.0.2", port=40001, now_ns=pair.clock.now_ns())
    # A forged DONE with the client's nonce but from another transport source is ignored.
    forged = bytes([VERSION, PacketType.DONE]) + client.nonce.to_bytes(8, "big") + bytes(64)
    pair.server.receive(forged, source=2, address="10.0.0.66", port=1, now_ns=pair.clock.now_ns())
    assert pair.server.stats.unknown == 1 and pair.server.pending_count == 1
    for packet in pair.server.messages_to_send():
        client.receive(packet, pair.clock.now_ns())
    pair.pump(until=lambda: client.state is ClientState.COMPLETED)
    assert client.state is ClientState.COMPLETED


def test_a_client_whose_half_open_handshake_the_server_lost_starts_over() -> None:
    """A loaded server let the half-open handshake expire, then took the client's late HELLO as a new
    one (another ephemeral key): the client's DONE, made from the first HELLO_ACK, cannot be read.
    Without an answer the client would repeat that DONE until its timeout; it is told to start over."""
    pair = HandshakePair(timeout_ns=5_000_000_000)
    client = pair.add_client(1, start=False, timeout_ns=30_000_000_000)  # a connect waits longer
    server = pair.server

    def to_server(packets: list[bytes]) -> None:
        for packet in packets:
            server.receive(packet, source=1, address="10.0.0.2", port=40001, now_ns=pair.clock.now_ns())

    client.start(pair.clock.now_ns())
    hello = client.messages_to_send()
    to_server(hello)
    first_ack = server.messages_to_send()
    pair.clock.advance(6_000_000_000)
    server.handle_timer(pair.clock.now_ns())
    assert server.pending_count == 0 and server.stats.expired == 1
    to_server(hello)  # the late repeat: a new half-open handshake, a new answer
    second_ack = server.messages_to_send()
    assert second_ack != first_ack
    for packet in first_ack:
        client.receive(packet, pair.clock.now_ns())
    assert client.state is ClientState.DONE_SENT
    to_server(client.messages_to_send())
    assert server.stats.failed == 1 and server.stats.restarted == 1
    for packet in second_ack + server.messages_to_send():
        client.receive(packet, pair.clock.now_ns())
    assert client.restarts == 1 and client.state is ClientState.HELLO_SENT
    pair.pump(until=lambda: client.state is ClientState.COMPLETED)
    assert client.state is ClientState.COMPLETED and not [e for e in client.take_events() if isinstance(e, Rejected)]
    assert len(server.connections) == 1


def test_a_done_for_an_expired_handshake_gets_start_over_and_a_forger_cannot_send_it() -> None:
    """The DONE itself came after the half-open handshake expired: the client starts over. A peer that
    copies the client's nonce off the broadcast channel and sends its own DONE gets an answer that
    the client ignores (it names a DONE the client never sent)."""
    pair = HandshakePair(timeout_ns=5_000_000_000)
    client = pair.add_client(1, start=False, timeout_ns=30_000_000_000)  # a connect waits longer
    server = pair.server
    now = pair.clock.now_ns
    client.start(now())
    for packet in client.messages_to_send():
        server.receive(packet, source=1, address="10.0.0.2", port=40001, now_ns=now())
    for packet in server.messages_to_send():
        client.receive(packet, now())
    (done,) = client.messages_to_send()
    forged = bytes([VERSION, PacketType.DONE]) + client.nonce.to_bytes(8, "big") + bytes(64)
    server.receive(forged, source=2, address="10.0.0.66", port=1, now_ns=now())
    for packet in server.messages_to_send():
        client.receive(packet, now())
    assert client.state is ClientState.DONE_SENT and client.restarts == 0 and client.ignored == 1
    pair.clock.advance(6_000_000_000)
    server.handle_timer(now())
    server.receive(done, source=1, address="10.0.0.2", port=40001, now_ns=now())
    assert server.stats.restarted == 2 and not server.connections
    for packet in server.messages_to_send():
        client.receive(packet, now())
    assert client.restarts == 1 and client.state is ClientState.HELLO_SENT
    pair.pump(until=lambda: client.state is ClientState.COMPLETED)
    assert client.state is ClientState.COMPLETED and len(server.connections) == 1


def test_malformed_packets_are_counted_and_dropped() -> None:
    pair = HandshakePair()
    for data in (
        b"",
        b"\x01",
        b"\x09\x01" + bytes(8),
        bytes([VERSION, 1]) + bytes(8) + b"\xff",
        bytes([VERSION, 9]) + bytes(20),
    ):
        pair.server.receive(data, source=1, address="10.0.0.2", port=1, now_ns=pair.clock.now_ns())
    assert pair.server.stats.malformed == 5 and pair.server.pending_count == 0
    assert pair.server.messages_to_send() == []


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 7))
def test_hostile_bytes_never_raise_and_allocate_nothing(data: bytes, kind: int) -> None:
    pair = _FUZZ_PAIR
    client = _FUZZ_CLIENT
    framed = bytes([VERSION, kind]) + data  # also reach past the version check
    for packet in (data, framed, framed[:2] + client.nonce.to_bytes(8, "big") + data):
        pair.server.receive(packet, source=9, address="10.9.9.9", port=9, now_ns=pair.clock.now_ns())
        client.receive(packet, pair.clock.now_ns())
    assert pair.server.pending_count <= pair.server.max_pending
    assert not pair.server.connections
    pair.server.messages_to_send()
    pair.server.take_events()


_FUZZ_PAIR = HandshakePair(max_pending=8)
_FUZZ_CLIENT = _FUZZ_PAIR.add_client(1)
