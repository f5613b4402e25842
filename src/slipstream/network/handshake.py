"""The handshake: client and server machines, sans-I/O (bytes and ``now_ns`` in; bytes, events and a
deadline out).

Rules of this file (read these first; the tables below are their code):

1. Noise XX in three messages, then a WELCOME: ``HELLO`` (-> e), ``HELLO_ACK`` (<- e, ee, s, es + the
   server's registration description), ``DONE`` (-> s, se + the client's description), ``WELCOME``
   (<- the allocation, sealed under a key derived from the server's send key). A ``REJECT`` carries a
   reason code and a short text; it is not authenticated (it can only stop a handshake, which a
   man in the middle can do anyway by dropping packets).
2. Every packet starts with ``version, type, nonce`` (the nonce is the client's random 64-bit
   connect key). The server keys half-open handshakes by (transport source, nonce), so a packet from
   another source cannot touch a client's handshake.
3. The server allocates nothing before ``DONE`` proves the client holds the keys of its HELLO:
   ids, ports and streams come only with ``ClientAccepted``. Half-open handshakes live in a table
   capped at ``max_pending`` (the oldest is dropped to make room) and expire after the handshake
   timeout; the Diffie-Hellman work for new HELLOs is limited by a token bucket, so a flood of
   forged HELLOs costs bounded memory and CPU, and a real client (which retries) still gets in.
4. Retransmission: the client resends its last message with back-off until the timeout; the server
   answers a repeated HELLO or DONE with the answer it cached, never with new work. A DONE the server
   cannot use (its half-open handshake expired or was evicted, or a late HELLO made it start a new one)
   gets a ``HANDSHAKE_EXPIRED`` REJECT, and the client starts over with a fresh nonce and ephemeral
   key instead of repeating that DONE until its timeout.
5. Admission (limits, filters, tag) is checked at HELLO (cheap refusals before any DH) and again at
   DONE (the client's key is known only then; the counts may have changed).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from ..client.allocation import AddressCounter, AllocationError, IdAllocator, PortAllocator
from .errors import NoiseError
from .events import ClientAccepted, HandshakeCompleted, HandshakeTimedOut, Rejected
from .noise import CipherState, HandshakeState

__all__ = [
    "KEY_CHANGED",
    "PROTOCOL_NAME",
    "AdmissionCheck",
    "ClientHandshake",
    "ClientState",
    "PacketType",
    "ServerHandshake",
    "ServerStats",
    "packet_nonce",
]

VERSION = 1
PROTOCOL_NAME = b"slipstream-network/1"
"""Part of the Noise prologue: both sides must speak this protocol and the same app id."""

KEY_CHANGED = 200
"""Local rejection code (never on the wire): the server's key differs from the pinned one."""
REGISTRATION_MISMATCH_LOCAL = 201
"""Local rejection code: the server's registrations differ from ours (client side check)."""
BAD_APP_ID = 202
"""Reason code for a HELLO naming another application."""

_HEADER = struct.Struct(">BBQ")
_WELCOME = struct.Struct(">iiiiHIB")
_PLAINTEXT = 1
"""Flag bit: (HELLO) the client would take plaintext IPC records; (WELCOME) records are plaintext."""
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_MAX_REJECT_TEXT = 240
_DIGEST_LENGTH = 16
REPEAT_GAP_NS = 200_000_000
"""A repeated HELLO or DONE gets the cached answer again at most this often (answers are broadcast
to every handshaking client, so storms of repeats cost everyone)."""
_SOURCE_BURST = 4.0
"""HELLOs with fresh nonces one transport source may send at once (a client retries one)."""
_MAX_SOURCES = 4096
"""Per-source buckets remembered (bounded memory; the oldest are forgotten)."""
_WELCOME_NONCE = bytes(12)


class PacketType(IntEnum):
    """Handshake packet types (second byte of every packet)."""

    HELLO = 1
    HELLO_ACK = 2
    DONE = 3
    WELCOME = 4
    REJECT = 5


def packet_nonce(data: bytes) -> int | None:
    """The client nonce a handshake packet carries, or None when it is too short to be one."""
    if len(data) < _HEADER.size:
        return None
    return int(_HEADER.unpack_from(data)[2])


def _header(kind: PacketType, nonce: int) -> bytes:
    return _HEADER.pack(VERSION, kind, nonce)


def _key_of(cipher: CipherState) -> bytes:
    """The key of a cipher state from a completed handshake's split (always set there)."""
    key = cipher.key
    if not key:
        raise NoiseError("split() gave a cipher state without a key")
    return key


def _welcome_key(send_key: bytes) -> bytes:
    """A key for the one WELCOME packet, derived from (never equal to) the server's record key."""
    return hmac.new(send_key, b"slipstream welcome", hashlib.sha256).digest()


def _prologue(app_id: str) -> bytes:
    return PROTOCOL_NAME + b"\x00" + app_id.encode()


def done_digest(body: bytes | memoryview) -> bytes:
    """What a ``HANDSHAKE_EXPIRED`` REJECT carries: a digest of the DONE (after its header) it answers."""
    return hashlib.sha256(body).digest()[:_DIGEST_LENGTH]


def reject_packet(nonce: int, reason: int, message: str) -> bytes:
    """A REJECT for the client whose nonce is ``nonce``."""
    text = message.encode("utf-8", "replace")[:_MAX_REJECT_TEXT]
    return _header(PacketType.REJECT, nonce) + _U8.pack(reason & 0xFF) + text


# -- client -----------------------------------------------------------------------------------------


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
    (ClientState.HELLO_SENT, PacketType.REJECT): "_on_reject",
    (ClientState.DONE_SENT, PacketType.WELCOME): "_on_welcome",
    (ClientState.DONE_SENT, PacketType.REJECT): "_on_reject",
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
    ) -> None:
        self.app_id = app_id
        self._flags = _PLAINTEXT if plaintext_ipc else 0
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
        self._noise = HandshakeState(
            initiator=True,
            static_private=static_private,
            prologue=_prologue(app_id),
            ephemeral_private=ephemeral_private,
        )
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
        app = self.app_id.encode()
        hello = (
            _header(PacketType.HELLO, self.nonce)
            + _U8.pack(len(app))
            + app
            + _U8.pack(len(self._tag))
            + self._tag
            + _U8.pack(self._flags)
            + self._noise.write_message(b"")
        )
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
        if len(data) < _HEADER.size:
            return
        version, kind, nonce = _HEADER.unpack_from(data)
        if nonce != self.nonce:
            return
        if version != VERSION or kind not in PacketType._value2member_map_:
            self.ignored += 1
            return
        handler = _CLIENT_TRANSITIONS.get((self.state, PacketType(kind)))
        if handler is None:
            return  # a duplicate or late packet
        getattr(self, handler)(memoryview(data)[_HEADER.size :], now_ns)

    def _on_reject(self, body: memoryview, now_ns: int) -> None:
        if len(body) < 1:
            self.ignored += 1
            return
        reason = body[0]
        if reason == _reason("HANDSHAKE_EXPIRED", 8):
            last = self._last
            if (
                self.state is ClientState.DONE_SENT
                and last is not None
                and hmac.compare_digest(bytes(body[1:]), done_digest(memoryview(last)[_HEADER.size :]))
            ):
                self._start_over(now_ns)
            else:
                self.ignored += 1  # not about our DONE: a stale answer, or someone else's doing
            return
        text = bytes(body[1:]).decode("utf-8", "replace")
        self._finish_rejected(reason, text)

    def _start_over(self, now_ns: int) -> None:
        """The server lost our half-open handshake: a fresh nonce and ephemeral key, and HELLO again
        (within the same timeout)."""
        self.restarts += 1
        self.nonce = int.from_bytes(os.urandom(8), "big") or 1
        self._noise = HandshakeState(
            initiator=True, static_private=self._static_private, prologue=_prologue(self.app_id)
        )
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
            self._finish_rejected(0, "the server's handshake answer failed to authenticate")
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
        if len(payload) < _U32.size:
            self._finish_rejected(0, "the server's handshake answer is malformed")
            return
        self.connection_expiry_ns = _U32.unpack_from(payload)[0] * 1_000_000
        difference = self._describe_difference(payload[_U32.size :])
        if difference is not None:
            self._finish_rejected(REGISTRATION_MISMATCH_LOCAL, difference)
            return
        done = _header(PacketType.DONE, self.nonce) + self._noise.write_message(self._description)
        send, receive = self._noise.split()
        self._keys = (_key_of(send), _key_of(receive))
        self._handshake_hash = self._noise.handshake_hash
        self.state = ClientState.DONE_SENT
        self._send(done, now_ns)

    def _on_welcome(self, body: memoryview, now_ns: int) -> None:
        assert self._keys is not None and self.remote_public_key is not None
        send_key, receive_key = self._keys
        try:
            plain = ChaCha20Poly1305(_welcome_key(receive_key)).decrypt(
                _WELCOME_NONCE, bytes(body), _header(PacketType.WELCOME, self.nonce)
            )
        except InvalidTag:
            self.ignored += 1
            return
        if len(plain) != _WELCOME.size:
            self.ignored += 1
            return
        server_session, client_session, server_stream, client_stream, port, expiry_ms, flags = _WELCOME.unpack(plain)
        self.plaintext = bool(flags & _PLAINTEXT)
        self.state = ClientState.COMPLETED
        self._events.append(
            HandshakeCompleted(
                connection_id=server_session,
                server_session_id=server_session,
                client_session_id=client_session,
                server_stream_id=server_stream,
                client_stream_id=client_stream,
                control_port=port,
                remote_public_key=self.remote_public_key,
                send_key=send_key,
                receive_key=receive_key,
                handshake_hash=self._handshake_hash,
                connection_expiry_ns=expiry_ms * 1_000_000,
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


# -- server -----------------------------------------------------------------------------------------


class AdmissionCheck(Protocol):
    """``(address, tag, public_key or None before DONE, current_total, current_for_address)`` ->
    a reject reason code, or None to admit."""

    def __call__(
        self, address: str | None, tag: str, public_key: bytes | None, current_total: int, current_for_address: int
    ) -> tuple[int, str] | None: ...


@dataclass(slots=True)
class _Pending:
    noise: HandshakeState
    answer: bytes
    expires_ns: int
    address: str | None
    port: int | None
    tag: str
    plaintext: bool
    answered_ns: int = 0


@dataclass(slots=True)
class _Accepted:
    welcome: bytes
    expires_ns: int
    answered_ns: int = 0


@dataclass(slots=True)
class _Allocation:
    address: str | None
    server_session_id: int
    client_session_id: int
    server_stream_id: int
    client_stream_id: int
    control_port: int
    key: tuple[int, int] | None = None
    """The (source, nonce) of the handshake that made it."""


@dataclass(slots=True)
class ServerStats:
    """What the server's handshake machine counted (readable from Python)."""

    hellos: int = 0
    malformed: int = 0
    rate_limited: int = 0
    evicted: int = 0
    expired: int = 0
    rejected: int = 0
    failed: int = 0
    accepted: int = 0
    unknown: int = 0
    restarted: int = 0
    """DONEs for handshakes no longer held, answered with ``HANDSHAKE_EXPIRED`` (the client starts over)."""


class ServerHandshake:
    """Every client's handshake on one server (the responder), with the server's allocators.

    Answers are broadcast on the server's handshake channel (each names its client's nonce).
    ``release(connection_id)`` gives a closed connection's ids and port back."""

    def __init__(
        self,
        *,
        app_id: str,
        static_private: bytes,
        description: bytes,
        describe_difference: Callable[[bytes], str | None],
        admission: AdmissionCheck,
        sessions: IdAllocator,
        streams: IdAllocator,
        ports: PortAllocator | None,
        timeout_ns: int,
        connection_expiry_ns: int,
        max_pending: int = 256,
        handshakes_per_second: float = 2000.0,
        now_ns: int = 0,
        allow_plaintext: bool = False,
        confirm_accept: bool = False,
    ) -> None:
        self.app_id = app_id
        self._allow_plaintext = allow_plaintext
        self._confirm_accept = confirm_accept
        self._unconfirmed: dict[int, tuple[tuple[int, int], int, bytes, bool, int]] = {}
        """connection id -> (pending key, nonce, send key, plaintext, expiry) awaiting :meth:`accept`."""
        self._app = app_id.encode()
        self._static_private = static_private
        self._prologue = _prologue(app_id)
        self._description = description
        self._describe_difference = describe_difference
        self._admission = admission
        self.sessions = sessions
        self.streams = streams
        self.ports = ports
        self.addresses = AddressCounter()
        self._timeout_ns = timeout_ns
        self._expiry_ms = max(1, connection_expiry_ns // 1_000_000)
        self.max_pending = max_pending
        self._rate = handshakes_per_second
        self._bucket_size = max(8.0, handshakes_per_second / 4)
        self._tokens = self._bucket_size
        self._tokens_at_ns = now_ns
        self._source_rate = max(1.0, handshakes_per_second / 100)
        self._sources: OrderedDict[int, tuple[float, int]] = OrderedDict()
        """Per-source token buckets (least recently used dropped beyond ``_MAX_SOURCES``)."""
        self._pending: OrderedDict[tuple[int, int], _Pending] = OrderedDict()
        self._accepted: OrderedDict[tuple[int, int], _Accepted] = OrderedDict()
        self.connections: dict[int, _Allocation] = {}
        self._live_keys: dict[tuple[int, int], int] = {}
        """(source, nonce) of each connection's handshake -> its id: a late DONE of theirs is no stranger."""
        self._out: list[bytes] = []
        self._events: list[ClientAccepted | Rejected] = []
        self.stats = ServerStats()

    @property
    def pending_count(self) -> int:
        """Half-open handshakes held now (bounded by ``max_pending``)."""
        return len(self._pending)

    @property
    def deadline_ns(self) -> int | None:
        """The next expiry of a half-open handshake or of a cached WELCOME."""
        times = [table[next(iter(table))].expires_ns for table in (self._pending, self._accepted) if table]
        return min(times) if times else None

    def handle_timer(self, now_ns: int) -> None:
        """Drop expired half-open handshakes and cached WELCOMEs (insertion order is expiry order)."""
        while self._pending:
            key = next(iter(self._pending))
            if self._pending[key].expires_ns > now_ns:
                break
            del self._pending[key]
            self.stats.expired += 1
        while self._accepted:
            key = next(iter(self._accepted))
            if self._accepted[key].expires_ns > now_ns:
                break
            del self._accepted[key]

    def receive(self, data: bytes, *, source: int, address: str | None, port: int | None, now_ns: int) -> None:
        """A packet from the handshake channel: ``source`` names its transport stream (the image's
        session id), ``address``/``port`` where it came from (None for IPC)."""
        if len(data) < _HEADER.size:
            self.stats.malformed += 1
            return
        version, kind, nonce = _HEADER.unpack_from(data)
        if version != VERSION:
            self.stats.malformed += 1
            return
        body = memoryview(data)[_HEADER.size :]
        key = (source, nonce)
        if kind == PacketType.HELLO:
            self._on_hello(key, nonce, body, address, port, now_ns)
        elif kind == PacketType.DONE:
            self._on_done(key, nonce, body, now_ns)
        else:
            self.stats.malformed += 1

    def _start_over(self, key: tuple[int, int], nonce: int, body: memoryview, now_ns: int) -> None:
        """Tell a client we hold no handshake for its DONE: a ``HANDSHAKE_EXPIRED`` REJECT (not a
        refusal: no event) carrying a digest of that DONE. DONEs travel only from their client to us,
        so only the client that sent it can match the digest: another peer that copies a nonce off
        the broadcast channel cannot make that client start over. Each answer costs its source a
        token, like a new HELLO, so bogus DONEs cannot make us flood the channel."""
        if not self._take_token(key[0], now_ns):
            self.stats.rate_limited += 1
            return
        self.stats.restarted += 1
        packet = _header(PacketType.REJECT, nonce) + _U8.pack(_reason("HANDSHAKE_EXPIRED", 8)) + done_digest(body)
        self._out.append(packet)

    def _reject(self, nonce: int, reason: int, message: str, address: str | None, tag: str) -> None:
        self.stats.rejected += 1
        self._out.append(reject_packet(nonce, reason, message))
        self._events.append(Rejected(reason, message, address, tag))

    def _on_hello(
        self, key: tuple[int, int], nonce: int, body: memoryview, address: str | None, port: int | None, now_ns: int
    ) -> None:
        self.stats.hellos += 1
        pending = self._pending.get(key)
        if pending is not None:
            # Our answer was lost (or is on its way): repeat it, do no new work, and keep the
            # handshake alive while the client is. Repeats are spaced: every answer is broadcast.
            pending.expires_ns = now_ns + self._timeout_ns
            self._pending.move_to_end(key)
            if now_ns - pending.answered_ns >= REPEAT_GAP_NS:
                pending.answered_ns = now_ns
                self._out.append(pending.answer)
            return
        if key in self._accepted:
            return  # the client will repeat DONE
        try:
            offset = 0
            (app_len,) = _U8.unpack_from(body, offset)
            app = bytes(body[1 : 1 + app_len])
            offset = 1 + app_len
            (tag_len,) = _U8.unpack_from(body, offset)
            tag_bytes = bytes(body[offset + 1 : offset + 1 + tag_len])
            offset += 1 + tag_len
            (flags,) = _U8.unpack_from(body, offset)
            offset += 1
            if len(app) != app_len or len(tag_bytes) != tag_len:
                raise ValueError("truncated")
            tag = tag_bytes.decode("utf-8")
        except (struct.error, ValueError):
            self.stats.malformed += 1
            return
        first = bytes(body[offset:])
        if app != self._app:
            self._reject(
                nonce, BAD_APP_ID, f"application id {app.decode('utf-8', 'replace')!r} is not served here", address, tag
            )
            return
        verdict = self._admission(address, tag, None, len(self.connections), self._count_for(address))
        if verdict is not None:
            self._reject(nonce, verdict[0], verdict[1], address, tag)
            return
        if not self._take_token(key[0], now_ns):
            self.stats.rate_limited += 1
            return
        noise = HandshakeState(initiator=False, static_private=self._static_private, prologue=self._prologue)
        try:
            noise.read_message(first)
            answer = _header(PacketType.HELLO_ACK, nonce) + noise.write_message(
                _U32.pack(self._expiry_ms) + self._description
            )
        except (NoiseError, ValueError):  # e.g. a low-order ephemeral key: no shared secret
            self.stats.malformed += 1
            return
        if len(self._pending) >= self.max_pending:
            self._evict()
        plaintext = bool(flags & _PLAINTEXT) and self._allow_plaintext
        self._pending[key] = _Pending(noise, answer, now_ns + self._timeout_ns, address, port, tag, plaintext, now_ns)
        self._out.append(answer)

    def _take_token(self, source: int, now_ns: int) -> bool:
        """A new handshake needs a token from its source's bucket (so one source, however fast,
        cannot crowd out the others) and one from the server's (so many sources together cannot
        make it do more than ``handshakes_per_second`` Diffie-Hellman operations)."""
        tokens, at_ns = self._sources.pop(source, (_SOURCE_BURST, now_ns))
        tokens = min(_SOURCE_BURST, tokens + max(0, now_ns - at_ns) * self._source_rate / 1e9)
        self._sources[source] = (tokens, now_ns)
        while len(self._sources) > _MAX_SOURCES:
            self._sources.popitem(last=False)
        if tokens < 1.0:
            return False
        elapsed = max(0, now_ns - self._tokens_at_ns)
        self._tokens_at_ns = now_ns
        self._tokens = min(self._bucket_size, self._tokens + elapsed * self._rate / 1e9)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        self._sources[source] = (tokens - 1.0, now_ns)
        return True

    def _evict(self) -> None:
        """Make room: drop the oldest half-open handshake of the source holding the most."""
        counts: dict[int, int] = {}
        for source, _ in self._pending:
            counts[source] = counts.get(source, 0) + 1
        greedy = max(counts, key=counts.__getitem__)
        for key in self._pending:
            if key[0] == greedy:
                del self._pending[key]
                break
        self.stats.evicted += 1

    def _count_for(self, address: str | None) -> int:
        return 0 if address is None else self.addresses.count_for(address)

    def _on_done(self, key: tuple[int, int], nonce: int, body: memoryview, now_ns: int) -> None:
        pending = self._pending.pop(key, None)
        if pending is None:
            accepted = self._accepted.get(key)
            if accepted is not None:
                if now_ns - accepted.answered_ns >= REPEAT_GAP_NS:
                    accepted.answered_ns = now_ns
                    self._out.append(accepted.welcome)  # our WELCOME was lost
            elif key in self._live_keys:
                self.stats.unknown += 1  # accepted (its WELCOME sent or to follow), the cache gone
            else:
                self.stats.unknown += 1  # expired or evicted: without an answer the client repeats DONE
                self._start_over(key, nonce, body, now_ns)
            return
        try:
            client_description = pending.noise.read_message(bytes(body))
        except (NoiseError, ValueError):
            # Most likely the client answered our earlier HELLO_ACK and we have since started a new
            # handshake from its late HELLO (the first had expired): neither side can go on.
            self.stats.failed += 1
            self._start_over(key, nonce, body, now_ns)
            return
        client_key = pending.noise.remote_static
        assert client_key is not None
        address = pending.address
        difference = self._describe_difference(client_description)
        if difference is not None:
            self._reject(nonce, _reason("REGISTRATION_MISMATCH", 4), difference, address, pending.tag)
            return
        verdict = self._admission(address, pending.tag, client_key, len(self.connections), self._count_for(address))
        if verdict is not None:
            self._reject(nonce, verdict[0], verdict[1], address, pending.tag)
            return
        allocation = self._allocate(address)
        if allocation is None:
            self._reject(nonce, _reason("SERVER_FULL", 1), "no ids or ports left on the server", address, pending.tag)
            return
        send, receive = pending.noise.split()
        self.stats.accepted += 1
        allocation.key = key
        self._live_keys[key] = allocation.server_session_id
        self._unconfirmed[allocation.server_session_id] = (key, nonce, _key_of(send), pending.plaintext, now_ns)
        if not self._confirm_accept:
            self.accept(allocation.server_session_id, now_ns)
        self._events.append(
            ClientAccepted(
                connection_id=allocation.server_session_id,
                pending_key=key,
                address=address,
                port=pending.port,
                tag=pending.tag,
                server_session_id=allocation.server_session_id,
                client_session_id=allocation.client_session_id,
                server_stream_id=allocation.server_stream_id,
                client_stream_id=allocation.client_stream_id,
                control_port=allocation.control_port,
                remote_public_key=client_key,
                send_key=_key_of(send),
                receive_key=_key_of(receive),
                plaintext=pending.plaintext,
            )
        )

    def accept(self, connection_id: int, now_ns: int) -> bool:
        """Send the WELCOME of an accepted client (after the adapter opened its streams, when the
        machine was made with ``confirm_accept``). False if unknown or already sent."""
        entry = self._unconfirmed.pop(connection_id, None)
        allocation = self.connections.get(connection_id)
        if entry is None or allocation is None:
            return False
        key, nonce, send_key, plaintext, _ = entry
        plain = _WELCOME.pack(
            allocation.server_session_id,
            allocation.client_session_id,
            allocation.server_stream_id,
            allocation.client_stream_id,
            allocation.control_port,
            self._expiry_ms,
            _PLAINTEXT if plaintext else 0,
        )
        header = _header(PacketType.WELCOME, nonce)
        welcome = header + ChaCha20Poly1305(_welcome_key(send_key)).encrypt(_WELCOME_NONCE, plain, header)
        while len(self._accepted) >= self.max_pending:
            self._accepted.popitem(last=False)
        self._accepted[key] = _Accepted(welcome, now_ns + self._timeout_ns, now_ns)
        self._out.append(welcome)
        return True

    def reallocate_port(self, connection_id: int) -> int | None:
        """A new control port for an accepted client whose port could not be bound (another program
        holds it); the old one goes to the back of the pool. None when no port is left."""
        allocation = self.connections.get(connection_id)
        if allocation is None or self.ports is None or not allocation.control_port:
            return None
        try:
            port = self.ports.allocate(1)[0]
        except (AllocationError, ValueError):
            return None
        self.ports.free(allocation.control_port)
        allocation.control_port = port
        return port

    def _allocate(self, address: str | None) -> _Allocation | None:
        taken: list[tuple[IdAllocator | PortAllocator, int]] = []
        try:
            server_session = self.sessions.allocate()
            taken.append((self.sessions, server_session))
            client_session = self.sessions.allocate()
            taken.append((self.sessions, client_session))
            server_stream = self.streams.allocate()
            taken.append((self.streams, server_stream))
            client_stream = self.streams.allocate()
            taken.append((self.streams, client_stream))
            port = 0
            if address is not None and self.ports is not None:
                port = self.ports.allocate(1)[0]
        except (AllocationError, ValueError):
            for allocator, value in taken:
                allocator.free(value)
            return None
        if address is not None:
            self.addresses.increment(address)
        allocation = _Allocation(address, server_session, client_session, server_stream, client_stream, port)
        self.connections[server_session] = allocation
        return allocation

    def release(self, connection_id: int) -> bool:
        """Give a closed connection's ids, port and address slot back (False if unknown)."""
        allocation = self.connections.pop(connection_id, None)
        self._unconfirmed.pop(connection_id, None)
        if allocation is None:
            return False
        if allocation.key is not None:
            self._live_keys.pop(allocation.key, None)
        self.sessions.free(allocation.server_session_id)
        self.sessions.free(allocation.client_session_id)
        self.streams.free(allocation.server_stream_id)
        self.streams.free(allocation.client_stream_id)
        if allocation.control_port and self.ports is not None:
            self.ports.free(allocation.control_port)
        if allocation.address is not None:
            self.addresses.decrement(allocation.address)
        return True

    def ids_in_use(self) -> frozenset[int]:
        """Session ids, stream ids and ports this machine holds for connections (its own books,
        kept in step with the allocators)."""
        held: set[int] = set()
        for allocation in self.connections.values():
            held.update(
                (
                    allocation.server_session_id,
                    allocation.client_session_id,
                    allocation.server_stream_id,
                    allocation.client_stream_id,
                )
            )
        return frozenset(held)

    def forget(self, key: tuple[int, int]) -> None:
        """Drop the cached WELCOME for ``key`` (its connection is up; no repeat is needed)."""
        self._accepted.pop(key, None)

    def messages_to_send(self) -> list[bytes]:
        """Packets for the handshake channel (broadcast; each names its client's nonce)."""
        out, self._out = self._out, []
        return out

    def take_events(self) -> list[ClientAccepted | Rejected]:
        """Accepted clients (open their streams, then :meth:`accept`) and rejections since the last call."""
        events, self._events = self._events, []
        return events


def _reason(name: str, fallback: int) -> int:
    """The admission module's code for ``name`` (kept in one place: its RejectReason enum)."""
    from .admission import RejectReason

    member = getattr(RejectReason, name, None)
    return int(member) if member is not None else fallback
