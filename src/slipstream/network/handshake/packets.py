"""The handshake's wire: packet header and types, the HELLO, HELLO_ACK payload, WELCOME and REJECT
layouts, and the keys and prologue both machines derive alike. Kept apart from the machines so each
side's layout is written once and the client's reader can be read against the server's writer."""

from __future__ import annotations

import hashlib
import hmac
import struct
from enum import IntEnum
from typing import Final, NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from ..admission import RejectReason
from ..errors import NoiseError
from ..noise import CipherState

VERSION = 2
"""Version 2: HELLO's fields in the Noise prologue, HELLO_ACK carries a fingerprint (or the refusal),
REJECT is sealed, EXPIRED is its own packet."""
PROTOCOL_NAME = b"slipstream-network/2"
"""Starts the Noise prologue (the HELLO's fields follow): both sides must speak this protocol."""

KEY_CHANGED = 200
"""Local rejection code (never on the wire): the server's key differs from the pinned one."""
REGISTRATION_MISMATCH_LOCAL = 201
"""Local rejection code: the server's registrations differ from ours (the difference described here)."""
BAD_APP_ID = 202
"""Reason code for a HELLO naming another application."""
PLAINTEXT_REFUSED = 203
"""Local rejection code: a WELCOME offered plaintext records this client did not ask for."""
HANDSHAKE_FAILED: Final = int(RejectReason.HANDSHAKE_FAILED)
REGISTRATION_MISMATCH: Final = int(RejectReason.REGISTRATION_MISMATCH)
SERVER_FULL: Final = int(RejectReason.SERVER_FULL)
"""The admission module's codes the machines send themselves (plain ints, as events carry them)."""

HEADER = struct.Struct(">BBQ")
"""version, packet type, the client's nonce: the start of every packet."""
PLAINTEXT = 1
"""Flag bit: (HELLO) the client would take plaintext IPC records; (WELCOME) records are plaintext."""
U8 = struct.Struct(">B")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
"""DONE's payload starts with the client's delivery session (0: none), then its registrations."""
_WELCOME = struct.Struct(">iiiiHIB")
_SEALED_NONCE = bytes(12)
"""Each sealing key (WELCOME's, REJECT's) seals one packet per handshake: a fixed nonce is safe."""
_MAX_REJECT_TEXT = 240
_DIGEST_LENGTH = 16
FINGERPRINT_LENGTH = 32


class PacketType(IntEnum):
    """Handshake packet types (second byte of every packet)."""

    HELLO = 1
    HELLO_ACK = 2
    DONE = 3
    WELCOME = 4
    REJECT = 5
    """A refusal after DONE: reason and text sealed under the handshake's keys."""
    EXPIRED = 6
    """Not a refusal: the server no longer holds the handshake of the DONE whose digest it carries."""


def packet_nonce(data: bytes) -> int | None:
    """The client nonce a handshake packet carries, or None when it is too short to be one."""
    if len(data) < HEADER.size:
        return None
    return int(HEADER.unpack_from(data)[2])


def header(kind: PacketType, nonce: int) -> bytes:
    """The header of a packet of ``kind`` for the client whose nonce is ``nonce``."""
    return HEADER.pack(VERSION, kind, nonce)


def key_of(cipher: CipherState) -> bytes:
    """The key of a cipher state from a completed handshake's split (always set there)."""
    key = cipher.key
    if not key:
        raise NoiseError("split() gave a cipher state without a key")
    return key


def fingerprint(description: bytes) -> bytes:
    """What HELLO_ACK tells of the server's registrations: equal or not, never their names."""
    return hashlib.sha256(description).digest()


def prologue(hello_head: bytes) -> bytes:
    """The Noise prologue: the protocol name, then the HELLO up to its Noise message (header, app id,
    tag, flags), so a peer of another protocol or application, or a HELLO altered on the way (its
    tag, flags or nonce), cannot complete the handshake."""
    return PROTOCOL_NAME + b"\x00" + hello_head


def done_digest(body: bytes | memoryview) -> bytes:
    """What an EXPIRED packet carries: a digest of the DONE (after its header) it answers."""
    return hashlib.sha256(body).digest()[:_DIGEST_LENGTH]


def expired_packet(nonce: int, done_body: bytes | memoryview) -> bytes:
    """An EXPIRED answer to the DONE whose body (after its header) is ``done_body``."""
    return header(PacketType.EXPIRED, nonce) + done_digest(done_body)


def hello_head(nonce: int, app: bytes, tag: bytes, flags: int) -> bytes:
    """HELLO up to its Noise message: ``header | app_len u8 | app | tag_len u8 | tag | flags u8``
    (the Noise message 1 follows). It is also the prologue's tail."""
    return header(PacketType.HELLO, nonce) + U8.pack(len(app)) + app + U8.pack(len(tag)) + tag + U8.pack(flags)


class Hello(NamedTuple):
    """A HELLO's fields (what :func:`parse_hello` read)."""

    app: bytes
    tag: str
    flags: int
    first_message: bytes
    head_length: int
    """Bytes of the body (after the header) before the Noise message: with the header, the prologue."""


def parse_hello(body: memoryview) -> Hello | None:
    """The fields of a HELLO's body (after its header), or None when it is malformed."""
    try:
        offset = 0
        (app_len,) = U8.unpack_from(body, offset)
        app = bytes(body[1 : 1 + app_len])
        offset = 1 + app_len
        (tag_len,) = U8.unpack_from(body, offset)
        tag_bytes = bytes(body[offset + 1 : offset + 1 + tag_len])
        offset += 1 + tag_len
        (flags,) = U8.unpack_from(body, offset)
        offset += 1
        if len(app) != app_len or len(tag_bytes) != tag_len:
            raise ValueError("truncated")
        tag = tag_bytes.decode("utf-8")
    except (struct.error, ValueError):
        return None
    return Hello(app, tag, flags, bytes(body[offset:]), offset)


def ack_payload(expiry_ms: int, description: bytes) -> bytes:
    """HELLO_ACK's Noise payload when the HELLO is admitted: ``0 u8 | expiry_ms u32 | fingerprint``."""
    return U8.pack(0) + U32.pack(expiry_ms) + fingerprint(description)


def refusal_payload(reason: int, message: str) -> bytes:
    """HELLO_ACK's Noise payload when the HELLO is refused: ``reason u8 (not 0) | text``; encrypted
    to that HELLO's ephemeral key, so only its sender reads it."""
    return U8.pack(reason & 0xFF or HANDSHAKE_FAILED) + message.encode("utf-8", "replace")[:_MAX_REJECT_TEXT]


class Ack(NamedTuple):
    """A HELLO_ACK's payload: admitted (``reason`` 0, with the expiry and the server's fingerprint), or
    refused (``reason`` and ``text``)."""

    reason: int
    expiry_ms: int = 0
    fingerprint: bytes = b""
    text: str = ""


def parse_ack(payload: bytes) -> Ack | None:
    """What a HELLO_ACK's Noise payload says, or None when it is malformed."""
    if not payload:
        return None
    reason = payload[0]
    if reason:
        return Ack(reason, text=payload[1:].decode("utf-8", "replace"))
    if len(payload) != 1 + U32.size + FINGERPRINT_LENGTH:
        return None
    return Ack(0, U32.unpack_from(payload, 1)[0], payload[1 + U32.size :])


def _sealing_key(send_key: bytes, label: bytes) -> bytes:
    """A key for one sealed packet, derived from (never equal to) the server's record key."""
    return hmac.new(send_key, label, hashlib.sha256).digest()


def _seal(label: bytes, send_key: bytes, kind: PacketType, nonce: int, plain: bytes) -> bytes:
    packet_header = header(kind, nonce)
    return packet_header + ChaCha20Poly1305(_sealing_key(send_key, label)).encrypt(_SEALED_NONCE, plain, packet_header)


def _open(label: bytes, receive_key: bytes, kind: PacketType, nonce: int, body: memoryview) -> bytes | None:
    try:
        return ChaCha20Poly1305(_sealing_key(receive_key, label)).decrypt(
            _SEALED_NONCE, bytes(body), header(kind, nonce)
        )
    except InvalidTag:
        return None


def seal_reject(send_key: bytes, nonce: int, reason: int, detail: bytes) -> bytes:
    """A REJECT after DONE: ``reason u8 | detail`` sealed under a key derived from the server's send
    key (the header as associated data): only the client it is for can read it, and no one else can
    make one. ``detail`` is the text, or for a registration mismatch the server's description."""
    return _seal(b"slipstream reject", send_key, PacketType.REJECT, nonce, U8.pack(reason & 0xFF) + detail)


def reject_text(message: str) -> bytes:
    """A REJECT's text, bounded."""
    return message.encode("utf-8", "replace")[:_MAX_REJECT_TEXT]


def open_reject(receive_key: bytes, nonce: int, body: memoryview) -> tuple[int, bytes] | None:
    """(reason, detail) of a REJECT's body, or None when it does not authenticate under our key."""
    plain = _open(b"slipstream reject", receive_key, PacketType.REJECT, nonce, body)
    if not plain:
        return None
    return plain[0], plain[1:]


class Welcome(NamedTuple):
    """The allocation a WELCOME carries."""

    server_session_id: int
    client_session_id: int
    server_stream_id: int
    client_stream_id: int
    control_port: int
    expiry_ms: int
    plaintext: bool


def seal_welcome(send_key: bytes, nonce: int, welcome: Welcome) -> bytes:
    """The WELCOME packet: the allocation sealed under a key derived from the server's send key, the
    header as associated data."""
    plain = _WELCOME.pack(
        welcome.server_session_id,
        welcome.client_session_id,
        welcome.server_stream_id,
        welcome.client_stream_id,
        welcome.control_port,
        welcome.expiry_ms,
        PLAINTEXT if welcome.plaintext else 0,
    )
    return _seal(b"slipstream welcome", send_key, PacketType.WELCOME, nonce, plain)


def open_welcome(receive_key: bytes, nonce: int, body: memoryview) -> Welcome | None:
    """The allocation of a WELCOME's body (after its header), or None when it does not authenticate
    under our key or has the wrong size."""
    plain = _open(b"slipstream welcome", receive_key, PacketType.WELCOME, nonce, body)
    if plain is None or len(plain) != _WELCOME.size:
        return None
    server_session, client_session, server_stream, client_stream, port, expiry_ms, flags = _WELCOME.unpack(plain)
    return Welcome(
        server_session, client_session, server_stream, client_stream, port, expiry_ms, bool(flags & PLAINTEXT)
    )
