"""The client's handshake machine (the initiator): HELLO, then DONE, then the WELCOME or a REJECT, with
retransmission and back-off until the timeout. States are an enum and a ``(state, packet) -> handler``
table; a packet that fits no entry is ignored, as duplicates and other clients' packets must be."""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from enum import Enum

from ..admission import RejectReason
from ..errors import (
    ClientRejected,
    ConnectionNotPermitted,
    NoiseError,
    RegistrationMismatch,
    ServerFull,
    ServerKeyChanged,
    TooManyConnectionsForAddress,
)
from ..events import HandshakeCompleted, HandshakeTimedOut, Rejected
from ..noise import HandshakeState
from .packets import (
    BAD_APP_ID,
    HEADER,
    KEY_CHANGED,
    PLAINTEXT,
    PLAINTEXT_REFUSED,
    REGISTRATION_MISMATCH,
    REGISTRATION_MISMATCH_LOCAL,
    U64,
    VERSION,
    PacketType,
    done_digest,
    fingerprint,
    header,
    hello_head,
    key_of,
    open_reject,
    open_welcome,
    parse_ack,
    prologue,
)


class ClientState(Enum):
    """Where a client handshake is."""

    START = "start"
    HELLO_SENT = "hello sent"
    DONE_SENT = "done sent"
    COMPLETED = "completed"
    REJECTED = "rejected"
    TIMED_OUT = "timed out"


_CLIENT_TRANSITIONS: dict[tuple[ClientState, PacketType], str] = {
    (ClientState.HELLO_SENT, PacketType.HELLO_ACK): "_on_hello_ack",
    (ClientState.DONE_SENT, PacketType.WELCOME): "_on_welcome",
    (ClientState.DONE_SENT, PacketType.REJECT): "_on_reject",
    (ClientState.DONE_SENT, PacketType.EXPIRED): "_on_expired",
}
"""(state, packet) -> handler. Anything else is ignored (duplicates, other clients' packets)."""


class ClientHandshake:
    """One connect attempt's handshake (the initiator). Feed it every packet of the handshake
    channel: packets for other clients' nonces are ignored."""

    def __init__(
        self,
        *,
        app_id: str,
        tag: str,
        static_private: bytes,
        description: bytes,
        describe_difference: Callable[[bytes], str | None],
        pinned_key: bytes | None,
        allow_key_change: bool,
        now_ns: int,
        timeout_ns: int,
        nonce: int | None = None,
        ephemeral_private: bytes | None = None,
        retry_initial_ns: int = 300_000_000,
        retry_max_ns: int = 2_000_000_000,
        plaintext_ipc: bool = False,
        resume: int = 0,
    ) -> None:
        self.app_id = app_id
        self._resume = resume
        """The client's delivery session (``delivery.Delivery.session_id``) the server resumes; 0: none."""
        self._flags = PLAINTEXT if plaintext_ipc else 0
        self.plaintext = False
        """Set by WELCOME: the server agreed to plaintext records (IPC, both sides configured so)."""
        self.nonce = nonce if nonce is not None else int.from_bytes(os.urandom(8), "big") or 1
        self.state = ClientState.START
        self.remote_public_key: bytes | None = None
        self.connection_expiry_ns = 0
        self._tag = tag.encode()
        self._description = description
        self._describe_difference = describe_difference
        self._pinned_key = pinned_key
        self._allow_key_change = allow_key_change
        self._static_private = static_private
        self._ephemeral_private = ephemeral_private
        self._noise = self._new_noise()
        self.restarts = 0
        """Times the server said it no longer held our handshake and we started over."""
        self._started_ns = now_ns
        self._give_up_ns = now_ns + timeout_ns
        self._retry_initial_ns = retry_initial_ns
        self._retry_max_ns = retry_max_ns
        self._retry_ns = retry_initial_ns
        self._next_retry_ns: int | None = None
        self._last: bytes | None = None
        self._out: list[bytes] = []
        self._events: list[HandshakeCompleted | Rejected | HandshakeTimedOut] = []
        self._keys: tuple[bytes, bytes] | None = None
        self._handshake_hash = b""
        self.ignored = 0
        """Packets with our nonce that did not fit (forged, duplicated, corrupted): counted, dropped."""

    def _hello_head(self) -> bytes:
        return hello_head(self.nonce, self.app_id.encode(), self._tag, self._flags)

    def _new_noise(self) -> HandshakeState:
        """A Noise state for this nonce: the HELLO's fields are its prologue (a given ephemeral key,
        for tests, is used once)."""
        ephemeral, self._ephemeral_private = self._ephemeral_private, None
        return HandshakeState(
            initiator=True,
            static_private=self._static_private,
            prologue=prologue(self._hello_head()),
            ephemeral_private=ephemeral,
        )

    @property
    def deadline_ns(self) -> int | None:
        """When :meth:`handle_timer` must run next (None once finished)."""
        if self.state in (ClientState.COMPLETED, ClientState.REJECTED, ClientState.TIMED_OUT):
            return None
        if self._next_retry_ns is None:
            return self._give_up_ns
        return min(self._next_retry_ns, self._give_up_ns)

    def start(self, now_ns: int) -> None:
        """Send HELLO."""
        if self.state is not ClientState.START:
            raise RuntimeError(f"handshake already started ({self.state.value})")
        hello = self._hello_head() + self._noise.write_message(b"")
        self.state = ClientState.HELLO_SENT
        self._send(hello, now_ns)

    def _send(self, packet: bytes, now_ns: int) -> None:
        self._last = packet
        self._out.append(packet)
        self._retry_ns = self._retry_initial_ns
        self._next_retry_ns = now_ns + self._retry_ns

    def handle_timer(self, now_ns: int) -> None:
        """Retransmit with back-off, or give up at the timeout."""
        deadline = self.deadline_ns
        if deadline is None or now_ns < deadline:
            return
        if now_ns >= self._give_up_ns:
            self.state = ClientState.TIMED_OUT
            self._events.append(HandshakeTimedOut((now_ns - self._started_ns) / 1e9))
            return
        if self._last is not None:
            self._out.append(self._last)
        self._retry_ns = min(self._retry_ns * 2, self._retry_max_ns)
        self._next_retry_ns = now_ns + self._retry_ns

    def receive(self, data: bytes, now_ns: int) -> None:
        """A packet from the server's handshake channel (possibly for another client)."""
        if len(data) < HEADER.size:
            return
        version, kind, nonce = HEADER.unpack_from(data)
        if nonce != self.nonce:
            return
        if version != VERSION or kind not in PacketType._value2member_map_:
            self.ignored += 1
            return
        handler = _CLIENT_TRANSITIONS.get((self.state, PacketType(kind)))
        if handler is None:
            return  # a duplicate or late packet
        getattr(self, handler)(memoryview(data)[HEADER.size :], now_ns)

    def _on_expired(self, body: memoryview, now_ns: int) -> None:
        last = self._last
        if last is not None and hmac.compare_digest(bytes(body), done_digest(memoryview(last)[HEADER.size :])):
            self._start_over(now_ns)
        else:
            self.ignored += 1  # not about our DONE: a stale answer, or someone else's doing

    def _on_reject(self, body: memoryview, now_ns: int) -> None:
        assert self._keys is not None
        opened = open_reject(self._keys[1], self.nonce, body)
        if opened is None:
            self.ignored += 1  # not sealed for us: forged, corrupted, or another handshake's
            return
        reason, detail = opened
        if reason == REGISTRATION_MISMATCH:
            # Told only now that we are admitted: the server's description, to say what differs here.
            difference = self._describe_difference(detail)
            self._finish_rejected(REGISTRATION_MISMATCH_LOCAL, difference or "the server's registrations differ")
            return
        self._finish_rejected(reason, detail.decode("utf-8", "replace"))

    def _start_over(self, now_ns: int) -> None:
        """The server lost our half-open handshake: a fresh nonce and ephemeral key, and HELLO again
        (within the same timeout)."""
        self.restarts += 1
        self.nonce = int.from_bytes(os.urandom(8), "big") or 1
        self._noise = self._new_noise()
        self.remote_public_key = None
        self._keys = None
        self._handshake_hash = b""
        self.state = ClientState.START
        self.start(now_ns)

    def _finish_rejected(self, reason: int, text: str) -> None:
        self.state = ClientState.REJECTED
        self._events.append(Rejected(reason, text))

    def _on_hello_ack(self, body: memoryview, now_ns: int) -> None:
        try:
            payload = self._noise.read_message(bytes(body))
        except (NoiseError, ValueError):
            # Cannot be ours: a corrupted or forged answer. The Noise state is unusable after a
            # failed read, so this attempt ends (the caller may retry with a fresh one).
            self.ignored += 1
            self._finish_rejected(
                0, "the server's handshake answer failed to authenticate (altered on the way, or not from the server)"
            )
            return
        server_key = self._noise.remote_static
        assert server_key is not None
        self.remote_public_key = server_key
        if self._pinned_key is not None and server_key != self._pinned_key and not self._allow_key_change:
            self._finish_rejected(
                KEY_CHANGED,
                f"the server's public key {server_key.hex()[:16]}... differs from the pinned "
                f"{self._pinned_key.hex()[:16]}...",
            )
            return
        ack = parse_ack(payload)
        if ack is None:
            self._finish_rejected(0, "the server's handshake answer is malformed")
            return
        if ack.reason:
            self._finish_rejected(ack.reason, ack.text)
            return
        self.connection_expiry_ns = ack.expiry_ms * 1_000_000
        # Only a fingerprint so far: how the registrations differ the server says once it has
        # admitted us. Ours goes to it (encrypted, in DONE) only when they differ; empty means "the same".
        same = hmac.compare_digest(ack.fingerprint, fingerprint(self._description))
        payload = U64.pack(self._resume) + (b"" if same else self._description)
        done = header(PacketType.DONE, self.nonce) + self._noise.write_message(payload)
        send, receive = self._noise.split()
        self._keys = (key_of(send), key_of(receive))
        self._handshake_hash = self._noise.handshake_hash
        self.state = ClientState.DONE_SENT
        self._send(done, now_ns)

    def _on_welcome(self, body: memoryview, now_ns: int) -> None:
        assert self._keys is not None and self.remote_public_key is not None
        send_key, receive_key = self._keys
        welcome = open_welcome(receive_key, self.nonce, body)
        if welcome is None:
            self.ignored += 1
            return
        if welcome.plaintext and not self._flags & PLAINTEXT:
            self._finish_rejected(
                PLAINTEXT_REFUSED, "the server offered plaintext records, which this client did not ask for"
            )
            return
        self.plaintext = welcome.plaintext
        self.state = ClientState.COMPLETED
        self._events.append(
            HandshakeCompleted(
                connection_id=welcome.server_session_id,
                server_session_id=welcome.server_session_id,
                client_session_id=welcome.client_session_id,
                server_stream_id=welcome.server_stream_id,
                client_stream_id=welcome.client_stream_id,
                control_port=welcome.control_port,
                remote_public_key=self.remote_public_key,
                send_key=send_key,
                receive_key=receive_key,
                handshake_hash=self._handshake_hash,
                connection_expiry_ns=welcome.expiry_ms * 1_000_000,
                key_changed=self._pinned_key is not None and self._pinned_key != self.remote_public_key,
            )
        )

    def messages_to_send(self) -> list[bytes]:
        """Packets for the server's handshake port, oldest first."""
        out, self._out = self._out, []
        return out

    def take_events(self) -> list[HandshakeCompleted | Rejected | HandshakeTimedOut]:
        """What happened since the last call (at most one event: the outcome)."""
        events, self._events = self._events, []
        return events


def rejection_error(event: Rejected, where: str) -> ClientRejected:
    """The exception a client raises for a rejection: the server's reason code, or one of its own
    (a changed key, different registrations); ``where`` names the server in the message."""
    text = f"{where}: {event.message}"
    reason = event.reason
    if reason == KEY_CHANGED:
        return ServerKeyChanged(text)
    if reason in (REGISTRATION_MISMATCH_LOCAL, BAD_APP_ID, int(RejectReason.REGISTRATION_MISMATCH)):
        return RegistrationMismatch(text)
    if reason == int(RejectReason.SERVER_FULL):
        return ServerFull(text)
    if reason == int(RejectReason.TOO_MANY_FOR_ADDRESS):
        return TooManyConnectionsForAddress(text)
    if reason in (int(RejectReason.NOT_PERMITTED), int(RejectReason.KEY_NOT_ALLOWED), int(RejectReason.BAD_TAG)):
        return ConnectionNotPermitted(text)
    return ClientRejected(text)
