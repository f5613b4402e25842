"""A hostile peer at the handshake (issue 29, items 3 and 4): nothing about the application before
admission, every answer readable by its client alone, and the transcript binding what the server
decides on. The machines in memory first, then real servers and clients on loopback under a raw
socket sniffer."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slipstream.network import (
    Client,
    ClientConfig,
    ClientRejected,
    ConnectionNotPermitted,
    RegistrationMismatch,
    Server,
    ServerConfig,
)
from slipstream.network.admission import RejectReason
from slipstream.network.events import ClientAccepted, HandshakeCompleted, Rejected
from slipstream.network.handshake import PLAINTEXT_REFUSED, ClientState, PacketType, rejection_error
from slipstream.network.handshake.packets import HEADER, Welcome, hello_head, open_reject, prologue, seal_welcome
from slipstream.network.noise import HandshakeState, generate_keypair
from slipstream.testing import HandshakePair, run_async


@dataclasses.dataclass
class SecretLedgerEntry:
    classified_balance: int


@dataclasses.dataclass
class HiddenAuditTrail:
    undisclosed_reviewer: str


@dataclasses.dataclass
class ClientOnlyGadget:
    peculiar_knob: int


SERVER_TYPES = [SecretLedgerEntry, HiddenAuditTrail]
NAMES = [b"SecretLedgerEntry", b"classified_balance", b"HiddenAuditTrail", b"undisclosed_reviewer"]
CLIENT_NAMES = [b"ClientOnlyGadget", b"peculiar_knob"]
KEY_NOT_ALLOWED = int(RejectReason.KEY_NOT_ALLOWED)


def allowlist(*publics: bytes) -> Any:
    """An admission check that admits only these static keys (the server's ``allowed_keys`` rule)."""

    def check(address: str | None, tag: str, key: bytes | None, total: int, per: int) -> tuple[int, str] | None:
        if tag == "blocked":
            return int(RejectReason.NOT_PERMITTED), RejectReason.NOT_PERMITTED.message
        if key is not None and key not in publics:
            return KEY_NOT_ALLOWED, RejectReason.KEY_NOT_ALLOWED.message
        return None

    return check


def drive(pair: HandshakePair) -> list[bytes]:
    """Pump the pair to the end, returning every packet the server sent (broadcast to every client)."""
    sent: list[bytes] = []
    original = pair.server.messages_to_send

    def capture() -> list[bytes]:
        out = original()
        sent.extend(out)
        return out

    pair.server.messages_to_send = capture  # type: ignore[method-assign]
    pair.pump()
    return sent


# -- nothing about the application before admission ------------------------------------------------


def test_hello_ack_tells_any_initiator_a_fingerprint_and_no_names() -> None:
    """An attacker with its own Noise implementation sends a HELLO and decrypts the answer: it holds the
    expiry and a 32-byte fingerprint, none of the registrations' names."""
    pair = HandshakePair(server_types=SERVER_TYPES)
    nonce = 0x1234
    head = hello_head(nonce, b"test", b"", 0)
    attacker = HandshakeState(initiator=True, static_private=generate_keypair()[0], prologue=prologue(head))
    pair.server.receive(head + attacker.write_message(b""), source=5, address="10.6.6.6", port=6, now_ns=1)
    (answer,) = pair.server.messages_to_send()
    assert answer[1] == PacketType.HELLO_ACK
    payload = attacker.read_message(answer[HEADER.size :])
    assert payload[0] == 0 and len(payload) == 1 + 4 + 32
    assert not any(name in payload or name in answer for name in NAMES)


def test_a_refused_key_learns_only_that_it_was_refused() -> None:
    """A client whose key is not allowed, and whose registrations differ, is told only that its key is
    not allowed (ConnectionNotPermitted): not what the server registers, not that they differ."""
    admitted = generate_keypair()
    pair = HandshakePair(server_types=SERVER_TYPES, client_types=[ClientOnlyGadget], admission=allowlist(admitted[1]))
    client = pair.add_client(1)
    sent = drive(pair)
    (event,) = client.take_events()
    assert event == Rejected(KEY_NOT_ALLOWED, RejectReason.KEY_NOT_ALLOWED.message)
    error = rejection_error(event, "server")
    assert isinstance(error, ConnectionNotPermitted) and not isinstance(error, RegistrationMismatch)
    assert not any(name.decode() in str(error) for name in NAMES + CLIENT_NAMES)
    assert not any(name in packet for packet in sent for name in NAMES)
    (refused,) = pair.server.take_events()  # the server's own record says why
    assert refused.reason == KEY_NOT_ALLOWED and not pair.server.connections


def test_an_admitted_client_is_told_the_mismatch_in_detail() -> None:
    admitted = generate_keypair()
    pair = HandshakePair(server_types=SERVER_TYPES, client_types=[ClientOnlyGadget], admission=allowlist(admitted[1]))
    client = pair.add_client(1, static_private=admitted[0])
    sent = drive(pair)
    (event,) = client.take_events()
    error = rejection_error(event, "server at here")
    assert isinstance(error, RegistrationMismatch)
    # the client names the difference from its side, with the server's type and field names
    assert "ClientOnlyGadget" in str(error) and "SecretLedgerEntry" in str(error)
    assert not any(name in packet for packet in sent for name in NAMES)  # sealed on the way
    (refused,) = pair.server.take_events()
    assert refused.reason == int(RejectReason.REGISTRATION_MISMATCH) and "ClientOnlyGadget" in refused.message
    assert not pair.server.connections


# -- every answer readable by its client alone -----------------------------------------------------


def test_each_refusal_reaches_only_its_client_among_concurrent_handshakes() -> None:
    """Five clients handshake at once on one broadcast channel: one refused at HELLO (tag), one at DONE
    (key). Each refusal is an event of its own client only, its text is in no packet's clear bytes,
    and a bystander holding the victim's nonce can neither read the REJECT nor forge one."""
    keys = [generate_keypair() for _ in range(5)]
    pair = HandshakePair(
        server_types=SERVER_TYPES,
        client_types=SERVER_TYPES,
        admission=allowlist(keys[0][1], keys[1][1], keys[2][1], keys[3][1]),
    )
    clients = [pair.add_client(i + 1, static_private=keys[i][0], tag="blocked" if i == 3 else "") for i in range(5)]
    sent = drive(pair)
    outcomes = [client.take_events() for client in clients]
    for i in (0, 1, 2):
        assert [type(e) for e in outcomes[i]] == [HandshakeCompleted], (i, outcomes[i])
    assert outcomes[3] == [Rejected(int(RejectReason.NOT_PERMITTED), RejectReason.NOT_PERMITTED.message)]
    assert outcomes[4] == [Rejected(KEY_NOT_ALLOWED, RejectReason.KEY_NOT_ALLOWED.message)]
    for text in (RejectReason.NOT_PERMITTED.message, RejectReason.KEY_NOT_ALLOWED.message):
        assert not any(text.encode() in packet for packet in sent)
    (reject,) = [p for p in sent if p[1] == PacketType.REJECT]
    assert HEADER.unpack_from(reject)[2] == clients[4].nonce
    bystander = next(e for e in outcomes[0] if isinstance(e, HandshakeCompleted))
    assert open_reject(bystander.receive_key, clients[4].nonce, memoryview(reject)[HEADER.size :]) is None


def test_a_forged_reject_or_refusal_does_not_stop_a_handshake() -> None:
    """A bystander copies a client's nonce off the broadcast channel and sends REJECTs of the old
    plaintext form: the client ignores them and completes."""
    pair = HandshakePair()
    client = pair.add_client(1, start=False)
    client.start(pair.clock.now_ns())
    for packet in client.messages_to_send():
        pair.server.receive(packet, source=1, address="10.0.0.2", port=40001, now_ns=pair.clock.now_ns())
    for packet in pair.server.messages_to_send():
        client.receive(packet, pair.clock.now_ns())
    assert client.state is ClientState.DONE_SENT
    prefix = HEADER.pack(2, PacketType.REJECT, client.nonce)
    for forged in (prefix + b"\x06you are not allowed", prefix + bytes(40), prefix):
        client.receive(forged, pair.clock.now_ns())
    assert client.state is ClientState.DONE_SENT and client.ignored == 3 and not client.take_events()
    pair.pump(until=lambda: client.state is ClientState.COMPLETED)
    assert client.state is ClientState.COMPLETED


# -- the transcript binds what the server decides on -----------------------------------------------


@pytest.mark.parametrize("field", ["tag", "flags", "app"])
def test_a_hello_altered_on_the_way_cannot_complete(field: str) -> None:
    """An on-path attacker rewrites the HELLO's tag (what ``filter`` and ``buffered_rule`` see), its
    flags (the plaintext-IPC request) or its app id: the handshake fails, nothing is accepted."""
    pair = HandshakePair(app_id="test")
    client = pair.add_client(1, tag="alice", start=False)
    client.start(pair.clock.now_ns())
    (hello,) = client.messages_to_send()
    at = HEADER.size + 1 + len(b"test")  # tag_len
    altered = bytearray(hello)
    if field == "tag":
        altered[at + 1 : at + 6] = b"admin"
    elif field == "flags":
        altered[at + 1 + len(b"alice")] |= 1
    else:
        altered[HEADER.size + 1 : HEADER.size + 5] = b"tesT"
        pair = HandshakePair(app_id="tesT")  # a server of the altered app id, which would answer
    assert bytes(altered) != hello
    pair.server.receive(bytes(altered), source=1, address="10.0.0.2", port=40001, now_ns=pair.clock.now_ns())
    answers = pair.server.messages_to_send()
    assert answers and answers[0][1] == PacketType.HELLO_ACK  # the server answered what it got
    for packet in answers:
        client.receive(packet, pair.clock.now_ns())
    (event,) = client.take_events()
    assert isinstance(event, Rejected) and "authenticate" in event.message
    assert client.state is ClientState.REJECTED and client.messages_to_send() == []  # no DONE
    assert not pair.server.connections and not pair.server.take_events()


def _accepted_and_welcome(pair: HandshakePair, client: Any) -> tuple[ClientAccepted, bytes]:
    client.start(pair.clock.now_ns())
    now = pair.clock.now_ns
    for _ in range(2):
        for packet in client.messages_to_send():
            pair.server.receive(packet, source=1, address="10.0.0.2", port=40001, now_ns=now())
        answers = pair.server.messages_to_send()
        if client.state is ClientState.HELLO_SENT:
            for packet in answers:
                client.receive(packet, now())
    (accepted,) = pair.server.take_events()
    assert isinstance(accepted, ClientAccepted)
    return accepted, answers[-1]


@pytest.mark.parametrize("asked", [False, True])
def test_a_plaintext_welcome_is_refused_unless_asked_for(asked: bool) -> None:
    """A server (its keys, so the WELCOME authenticates) offers plaintext records: a client that did
    not ask refuses with a clear error; one that asked takes them."""
    pair = HandshakePair()
    client = pair.add_client(1, start=False, plaintext_ipc=asked)
    accepted, honest = _accepted_and_welcome(pair, client)
    assert honest[1] == PacketType.WELCOME
    allocation = Welcome(
        accepted.server_session_id, accepted.client_session_id, accepted.server_stream_id,
        accepted.client_stream_id, accepted.control_port, 4000, True,
    )  # fmt: skip
    client.receive(seal_welcome(accepted.send_key, client.nonce, allocation), pair.clock.now_ns())
    (event,) = client.take_events()
    if asked:
        assert isinstance(event, HandshakeCompleted) and client.plaintext
        return
    assert event.reason == PLAINTEXT_REFUSED and client.state is ClientState.REJECTED and not client.plaintext
    error = rejection_error(event, "server at ipc")
    assert type(error) is ClientRejected and "plaintext" in str(error) and "did not ask" in str(error)
    client.receive(honest, pair.clock.now_ns())  # too late: the attempt is over
    assert not client.take_events() and client.state is ClientState.REJECTED


# -- real servers and clients on loopback, under a raw socket sniffer -------------------------------


class LoopbackSniffer:
    """Every UDP payload on the loopback interface from or to ``ports``, as a passive on-path attacker
    sees it (an AF_PACKET raw socket: root), captured on a thread until :meth:`stop`."""

    def __init__(self, ports: set[int]) -> None:
        self.ports = ports
        self.payloads: list[tuple[int, int, bytes]] = []
        """(source port, destination port, UDP payload), in capture order."""
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
        self._socket.bind(("lo", 0))
        self._socket.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame = self._socket.recv(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            self._take(frame)

    def _take(self, frame: bytes) -> None:
        if len(frame) < 14:
            return
        (ethertype,) = struct.unpack_from(">H", frame, 12)
        if ethertype == 0x0800 and len(frame) >= 34 and frame[23] == 17:
            udp = 14 + (frame[14] & 0x0F) * 4
        elif ethertype == 0x86DD and len(frame) >= 62 and frame[20] == 17:
            udp = 54
        else:
            return
        if len(frame) < udp + 8:
            return
        source, destination = struct.unpack_from(">HH", frame, udp)
        if source in self.ports or destination in self.ports:
            self.payloads.append((source, destination, frame[udp + 8 :]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


@pytest.fixture
def sniffer_ports() -> Iterator[tuple[int, LoopbackSniffer]]:
    from tests.test_network_aio import free_ports

    port = free_ports(20)
    try:
        sniffer = LoopbackSniffer({port, port + 1})
    except PermissionError:
        pytest.skip("a raw socket needs root (CAP_NET_RAW)")
    try:
        yield port, sniffer
    finally:
        sniffer.stop()


def test_sniffed_handshakes_hold_no_names_and_refusals_reach_only_their_clients(
    driver_dir: Path, sniffer_ports: tuple[int, LoopbackSniffer]
) -> None:
    """Five clients connect at once to a server that allows two keys and filters one tag: refused keys
    (one with other registrations, one with the same), an allowed key with other registrations, a
    refused tag, and a good client. Each gets its own outcome; on the wire (every packet of the
    handshake port and of the answers' broadcast channel) no type or field name and no refusal text."""
    port, sniffer = sniffer_ports

    def client_config(messages: list[type], tag: str = "") -> ClientConfig:
        return ClientConfig(
            app_id="hostile-test", driver_directory=driver_dir, enable_ipc=False, settings_store=":memory:",
            messages=messages, tag=tag,
        )  # fmt: skip

    async def main() -> None:
        async with (
            Client(client_config(SERVER_TYPES)) as good,
            Client(client_config([ClientOnlyGadget])) as odd,
            Client(client_config([ClientOnlyGadget])) as stranger,
            Client(client_config(SERVER_TYPES)) as stranger_alike,
            Client(client_config(SERVER_TYPES, tag="blocked")) as blocked,
        ):
            config = ServerConfig(
                app_id="hostile-test", driver_directory=driver_dir, enable_ipc=False, settings_store=":memory:",
                messages=SERVER_TYPES, allowed_keys=[good.public_key, odd.public_key, blocked.public_key],
                filter=lambda address, tag: tag != "blocked",
            )  # fmt: skip
            async with Server(config) as server:
                await server.bind(port)
                clients = [good, odd, stranger, stranger_alike, blocked]
                results = await asyncio.gather(
                    *(client.connect("127.0.0.1", port, timeout=15) for client in clients), return_exceptions=True
                )
                refused = [event.reason for event in server.rejected]
        connected, mismatch, *not_permitted = results
        assert not isinstance(connected, BaseException), connected
        assert isinstance(mismatch, RegistrationMismatch) and "SecretLedgerEntry" in str(mismatch), mismatch
        for error in not_permitted:
            assert isinstance(error, ConnectionNotPermitted), error
            assert not any(name.decode() in str(error) for name in NAMES + CLIENT_NAMES), error
        assert "key is not allowed" in str(not_permitted[0]) and "key is not allowed" in str(not_permitted[1])
        assert "does not permit" in str(not_permitted[2])
        assert sorted(refused) == sorted([4, 6, 6, 3])  # mismatch, two keys, the tag: each once
        return None

    run_async(main(), timeout=60)
    time.sleep(0.2)  # the last answers on their way through loopback
    sniffer.stop()
    payloads = [payload for _, _, payload in sniffer.payloads]
    hellos = [p for source, destination, p in sniffer.payloads if destination == port and b"hostile-test" in p]
    assert len(hellos) >= 5  # the sniffer sees the handshake: the app id travels in clear in every HELLO
    secrets = [*NAMES, *CLIENT_NAMES, b"not allowed", b"not permit", b"differ"]
    leaked = [(secret, p[:64]) for p in payloads for secret in secrets if secret in p]
    assert not leaked, leaked
