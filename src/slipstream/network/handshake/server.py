"""The server's handshake machine (the responder) for every client at once, with the server's allocators.

Its bounds are its rules: nothing is allocated before a DONE proves the client's keys; half-open
handshakes live in a table of at most ``max_pending`` (the greediest source's oldest is dropped to make
room) that expires; new Diffie-Hellman work is paid for with tokens from a per-source and a server-wide
bucket; repeated HELLOs and DONEs get the cached answer, spaced, never new work. Answers go out on a
broadcast channel, so each is readable by its client alone: a refusal at HELLO inside the Noise message
2 (encrypted to that HELLO's ephemeral key), one after DONE sealed under the handshake's keys; and
nothing about the application (the registrations' names) goes to a client before it is admitted."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...client.allocation import AddressCounter, AllocationError, IdAllocator, PortAllocator
from ..errors import NoiseError
from ..events import ClientAccepted, Rejected
from ..noise import HandshakeState
from .packets import (
    BAD_APP_ID,
    HANDSHAKE_FAILED,
    HEADER,
    PLAINTEXT,
    REGISTRATION_MISMATCH,
    SERVER_FULL,
    U64,
    VERSION,
    PacketType,
    Welcome,
    ack_payload,
    expired_packet,
    header,
    key_of,
    parse_hello,
    prologue,
    refusal_payload,
    reject_text,
    seal_reject,
    seal_welcome,
)

REPEAT_GAP_NS = 200_000_000
"""A repeated HELLO or DONE gets the cached answer again at most this often (answers are broadcast
to every handshaking client, so storms of repeats cost everyone)."""
_SOURCE_BURST = 4.0
"""HELLOs with fresh nonces one transport source may send at once (a client retries one)."""
_MAX_SOURCES = 4096
"""Per-source buckets remembered (bounded memory; the oldest are forgotten)."""


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

    def held_sources(self) -> set[int]:
        """Transport sources (image session ids) a handshake is held for now, half-open or answered: an
        image of the handshake channel outside this set carries nothing we wait for."""
        return {key[0] for key in self._pending} | {key[0] for key in self._accepted}

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
        if len(data) < HEADER.size:
            self.stats.malformed += 1
            return
        version, kind, nonce = HEADER.unpack_from(data)
        if version != VERSION:
            self.stats.malformed += 1
            return
        body = memoryview(data)[HEADER.size :]
        key = (source, nonce)
        if kind == PacketType.HELLO:
            self._on_hello(key, nonce, body, address, port, now_ns)
        elif kind == PacketType.DONE:
            self._on_done(key, nonce, body, now_ns)
        else:
            self.stats.malformed += 1

    def _start_over(self, key: tuple[int, int], nonce: int, body: memoryview, now_ns: int) -> None:
        """Tell a client we hold no handshake for its DONE: an EXPIRED packet (not a refusal: no
        event) carrying a digest of that DONE. DONEs travel only from their client to us,
        so only the client that sent it can match the digest: another peer that copies a nonce off
        the broadcast channel cannot make that client start over. Each answer costs its source a
        token, like a new HELLO, so bogus DONEs cannot make us flood the channel."""
        if not self._take_token(key[0], now_ns):
            self.stats.rate_limited += 1
            return
        self.stats.restarted += 1
        self._out.append(expired_packet(nonce, body))

    def _reject(self, reason: int, message: str, address: str | None, tag: str, answer: bytes) -> None:
        """Refuse a client: ``answer`` is readable by it alone (a refusing HELLO_ACK encrypted to its
        ephemeral key, or a REJECT sealed under the handshake's keys); ``message`` is for our event."""
        self.stats.rejected += 1
        self._out.append(answer)
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
        hello = parse_hello(body)
        if hello is None:
            self.stats.malformed += 1
            return
        app, tag, flags, first, head_length = hello
        # Every answer, a refusal too, is a Noise message 2 (encrypted to the HELLO's ephemeral key):
        # it costs a token, and no other listener of the broadcast answers can read it.
        if not self._take_token(key[0], now_ns):
            self.stats.rate_limited += 1
            return
        verdict: tuple[int, str] | None = None
        if app != self._app:
            verdict = BAD_APP_ID, f"application id {app.decode('utf-8', 'replace')!r} is not served here"
        else:
            verdict = self._admission(address, tag, None, len(self.connections), self._count_for(address))
        noise = HandshakeState(
            initiator=False,
            static_private=self._static_private,
            prologue=prologue(header(PacketType.HELLO, nonce) + bytes(body[:head_length])),  # as received
        )
        payload = ack_payload(self._expiry_ms, self._description) if verdict is None else refusal_payload(*verdict)
        try:
            noise.read_message(first)
            answer = header(PacketType.HELLO_ACK, nonce) + noise.write_message(payload)
        except (NoiseError, ValueError):  # e.g. a low-order ephemeral key: no shared secret
            self.stats.malformed += 1
            return
        if verdict is not None:
            self._reject(verdict[0], verdict[1], address, tag, answer)
            return
        if len(self._pending) >= self.max_pending:
            self._evict()
        plaintext = bool(flags & PLAINTEXT) and self._allow_plaintext
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
            payload = pending.noise.read_message(bytes(body))
        except (NoiseError, ValueError):
            # Most likely the client answered our earlier HELLO_ACK and we have since started a new
            # handshake from its late HELLO (the first had expired): neither side can go on.
            self.stats.failed += 1
            self._start_over(key, nonce, body, now_ns)
            return
        client_key = pending.noise.remote_static
        assert client_key is not None
        address, tag = pending.address, pending.tag
        send, receive = pending.noise.split()
        send_key = key_of(send)

        def refuse(reason: int, message: str, detail: bytes | None = None) -> None:
            sealed = seal_reject(send_key, nonce, reason, reject_text(message) if detail is None else detail)
            self._reject(reason, message, address, tag, sealed)

        # Admission first: only an admitted client learns anything of our registrations.
        verdict = self._admission(address, tag, client_key, len(self.connections), self._count_for(address))
        if verdict is not None:
            refuse(*verdict)
            return
        if len(payload) < U64.size:
            refuse(HANDSHAKE_FAILED, "the client's handshake is malformed")
            return
        resume = U64.unpack_from(payload)[0]
        remote = payload[U64.size :]  # empty: the client found our fingerprint equal to its own
        difference = self._describe_difference(remote) if remote else None
        if difference is not None:
            refuse(REGISTRATION_MISMATCH, difference, self._description)  # the client describes it itself
            return
        allocation = self._allocate(address)
        if allocation is None:
            refuse(SERVER_FULL, "no ids or ports left on the server")
            return
        self.stats.accepted += 1
        allocation.key = key
        self._live_keys[key] = allocation.server_session_id
        self._unconfirmed[allocation.server_session_id] = (key, nonce, send_key, pending.plaintext, now_ns)
        if not self._confirm_accept:
            self.accept(allocation.server_session_id, now_ns)
        self._events.append(
            ClientAccepted(
                connection_id=allocation.server_session_id,
                pending_key=key,
                address=address,
                port=pending.port,
                tag=tag,
                server_session_id=allocation.server_session_id,
                client_session_id=allocation.client_session_id,
                server_stream_id=allocation.server_stream_id,
                client_stream_id=allocation.client_stream_id,
                control_port=allocation.control_port,
                remote_public_key=client_key,
                send_key=send_key,
                receive_key=key_of(receive),
                plaintext=pending.plaintext,
                resume=resume,
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
        welcome = seal_welcome(
            send_key,
            nonce,
            Welcome(
                allocation.server_session_id,
                allocation.client_session_id,
                allocation.server_stream_id,
                allocation.client_stream_id,
                allocation.control_port,
                self._expiry_ms,
                plaintext,
            ),
        )
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
