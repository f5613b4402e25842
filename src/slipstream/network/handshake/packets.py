"""The handshake's wire: packet header and types, the HELLO and WELCOME layouts, REJECT, and the keys
and prologue both machines derive alike. Kept apart from the machines so each side's layout is written
once and the client's reader can be read against the server's writer."""

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

VERSION = 1
PROTOCOL_NAME = b"slipstream-network/1"
"""Part of the Noise prologue: both sides must speak this protocol and the same app id."""

KEY_CHANGED = 200
"""Local rejection code (never on the wire): the server's key differs from the pinned one."""
REGISTRATION_MISMATCH_LOCAL = 201
"""Local rejection code: the server's registrations differ from ours (client side check)."""
BAD_APP_ID = 202
"""Reason code for a HELLO naming another application."""
HANDSHAKE_EXPIRED: Final = int(RejectReason.HANDSHAKE_EXPIRED)
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
_WELCOME_NONCE = bytes(12)
_MAX_REJECT_TEXT = 240
_DIGEST_LENGTH = 16


class PacketType(IntEnum):
    """Handshake packet types (second byte of every packet)."""

    HELLO = 1
    HELLO_ACK = 2
    DONE = 3
    WELCOME = 4
    REJECT = 5


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


def _welcome_key(send_key: bytes) -> bytes:
    """A key for the one WELCOME packet, derived from (never equal to) the server's record key."""
    return hmac.new(send_key, b"slipstream welcome", hashlib.sha256).digest()


def prologue(app_id: str) -> bytes:
    """The Noise prologue: a peer of another protocol or application cannot complete the handshake."""
    return PROTOCOL_NAME + b"\x00" + app_id.encode()


def done_digest(body: bytes | memoryview) -> bytes:
    """What a ``HANDSHAKE_EXPIRED`` REJECT carries: a digest of the DONE (after its header) it answers."""
    return hashlib.sha256(body).digest()[:_DIGEST_LENGTH]


def reject_packet(nonce: int, reason: int, message: str) -> bytes:
    """A REJECT for the client whose nonce is ``nonce``."""
    text = message.encode("utf-8", "replace")[:_MAX_REJECT_TEXT]
    return header(PacketType.REJECT, nonce) + U8.pack(reason & 0xFF) + text


def expired_packet(nonce: int, done_body: bytes | memoryview) -> bytes:
    """A ``HANDSHAKE_EXPIRED`` REJECT answering the DONE whose body (after its header) is ``done_body``."""
    return header(PacketType.REJECT, nonce) + U8.pack(HANDSHAKE_EXPIRED) + done_digest(done_body)


def hello_packet(nonce: int, app: bytes, tag: bytes, flags: int, first_message: bytes) -> bytes:
    """HELLO: ``app_len u8 | app | tag_len u8 | tag | flags u8 | Noise message 1``."""
    return (
        header(PacketType.HELLO, nonce)
        + U8.pack(len(app))
        + app
        + U8.pack(len(tag))
        + tag
        + U8.pack(flags)
        + first_message
    )


class Hello(NamedTuple):
    """A HELLO's fields (what :func:`parse_hello` read)."""

    app: bytes
    tag: str
    flags: int
    first_message: bytes


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
    return Hello(app, tag, flags, bytes(body[offset:]))


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
    packet_header = header(PacketType.WELCOME, nonce)
    return packet_header + ChaCha20Poly1305(_welcome_key(send_key)).encrypt(_WELCOME_NONCE, plain, packet_header)


def open_welcome(receive_key: bytes, nonce: int, body: memoryview) -> Welcome | None:
    """The allocation of a WELCOME's body (after its header), or None when it does not authenticate
    under our key or has the wrong size."""
    try:
        plain = ChaCha20Poly1305(_welcome_key(receive_key)).decrypt(
            _WELCOME_NONCE, bytes(body), header(PacketType.WELCOME, nonce)
        )
    except InvalidTag:
        return None
    if len(plain) != _WELCOME.size:
        return None
    server_session, client_session, server_stream, client_stream, port, expiry_ms, flags = _WELCOME.unpack(plain)
    return Welcome(
        server_session, client_session, server_stream, client_stream, port, expiry_ms, bool(flags & PLAINTEXT)
    )
