"""The Noise Protocol Framework's ``XX`` handshake (rev. 34), ``Noise_XX_25519_ChaChaPoly_{BLAKE2s,SHA256}``.

XX lets two parties that know nothing of each other agree forward-secret keys and learn each other's
static (identity) key, each authenticated by the handshake::

    -> e
    <- e, ee, s, es
    -> s, se

Written from the specification (sections 4-5 and 7) over ``cryptography``'s X25519 and
ChaCha20-Poly1305 and the stdlib's hashlib/hmac; checked against published test vectors. Sans-I/O:
messages are bytes in and bytes out, and every failure (short, long, forged or out-of-turn message, a
low-order public key) raises :class:`NoiseError` and leaves the state unusable, as the spec requires.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .errors import NoiseError

__all__ = [
    "DHLEN",
    "HASHLEN",
    "MAX_MESSAGE_LEN",
    "TAGLEN",
    "CipherState",
    "HandshakeState",
    "generate_keypair",
    "public_key",
]

DHLEN: Final = 32
HASHLEN: Final = 32
TAGLEN: Final = 16
MAX_MESSAGE_LEN: Final = 65535
"""Noise messages are at most 65535 bytes (spec section 3)."""
MAX_NONCE: Final = 2**64 - 1
"""Reserved by the spec: a cipher state refuses to use it."""

_HashFactory = Callable[..., Any]
_HASHES: Final[dict[str, _HashFactory]] = {"BLAKE2s": hashlib.blake2s, "SHA256": hashlib.sha256}
_NONCE: Final = struct.Struct("<4xQ")
"""ChaChaPoly nonce: 32 bits of zeros then the 64-bit counter, little-endian (spec section 12.3)."""
_PATTERN: Final = (("e",), ("e", "ee", "s", "es"), ("s", "se"))


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair as raw bytes: (32-byte private, 32-byte public)."""
    private = X25519PrivateKey.generate()
    return (
        private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
        private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
    )


def public_key(private: bytes) -> bytes:
    """The raw public key of a raw 32-byte X25519 private key."""
    return _private(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


_STATIC_KEYS: dict[bytes, tuple[X25519PrivateKey, bytes]] = {}
"""Parsed static keys: a server builds a HandshakeState per HELLO with the same key, and parsing it
(a scalar multiplication for the public half) costs as much as a DH. Bounded: cleared when full."""
_STATIC_KEYS_MAX: Final = 16


def _static_key(raw: bytes) -> tuple[X25519PrivateKey, bytes]:
    cached = _STATIC_KEYS.get(raw)
    if cached is None:
        private = _private(raw)
        cached = (private, private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
        if len(_STATIC_KEYS) >= _STATIC_KEYS_MAX:
            _STATIC_KEYS.clear()
        _STATIC_KEYS[raw] = cached
    return cached


def _private(raw: bytes) -> X25519PrivateKey:
    if len(raw) != DHLEN:
        raise ValueError(f"an X25519 private key is {DHLEN} bytes, not {len(raw)}")
    return X25519PrivateKey.from_private_bytes(raw)


class CipherState:
    """A key and a nonce counter (spec section 5.1); after the handshake, one per direction."""

    __slots__ = ("_aead", "key", "nonce")

    def __init__(self, key: bytes | None = None) -> None:
        self.key = b""
        """The 32-byte key (empty before one is set)."""
        self._aead: ChaCha20Poly1305 | None = None
        self.nonce = 0
        if key is not None:
            self.initialize_key(key)

    def initialize_key(self, key: bytes) -> None:
        """Use ``key`` from now on, with the nonce back at 0."""
        self.key = key
        self._aead = ChaCha20Poly1305(key)
        self.nonce = 0

    @property
    def has_key(self) -> bool:
        """Whether a key is set (before the first ``ee`` the handshake's payloads travel in clear)."""
        return self._aead is not None

    def _next_nonce(self) -> bytes:
        if self.nonce >= MAX_NONCE:
            raise NoiseError("the cipher state's nonces are exhausted")
        nonce = _NONCE.pack(self.nonce)
        self.nonce += 1
        return nonce

    def encrypt_with_ad(self, ad: bytes, plaintext: bytes) -> bytes:
        """ChaCha20-Poly1305 of ``plaintext`` under the next nonce (the plaintext itself with no key)."""
        if self._aead is None:
            return bytes(plaintext)
        return self._aead.encrypt(self._next_nonce(), plaintext, ad)

    def decrypt_with_ad(self, ad: bytes, ciphertext: bytes) -> bytes:
        """The plaintext of ``ciphertext``; raises NoiseError if it does not authenticate (the nonce is
        then not consumed, as the spec says)."""
        if self._aead is None:
            return bytes(ciphertext)
        if len(ciphertext) < TAGLEN:
            raise NoiseError(f"a ciphertext of {len(ciphertext)} bytes is shorter than its {TAGLEN}-byte tag")
        if self.nonce >= MAX_NONCE:
            raise NoiseError("the cipher state's nonces are exhausted")
        try:
            plaintext = self._aead.decrypt(_NONCE.pack(self.nonce), ciphertext, ad)
        except InvalidTag:
            raise NoiseError("a Noise ciphertext failed authentication") from None
        self.nonce += 1
        return plaintext


class _SymmetricState:
    """Chaining key, handshake hash and the handshake's cipher state (spec section 5.2)."""

    def __init__(self, protocol_name: bytes, hash_factory: _HashFactory) -> None:
        self._hash = hash_factory
        if len(protocol_name) <= HASHLEN:
            self.h = protocol_name.ljust(HASHLEN, b"\x00")
        else:
            self.h = self._digest(protocol_name)
        self.ck = self.h
        self.cipher = CipherState()

    def _digest(self, data: bytes) -> bytes:
        hasher = self._hash()
        hasher.update(data)
        digest: bytes = hasher.digest()
        return digest

    def _hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self._hash).digest()

    def hkdf(self, ikm: bytes, outputs: int) -> tuple[bytes, ...]:
        """The spec's HKDF (section 4.3): 2 or 3 outputs of HASHLEN bytes chained from ``ck``."""
        temp = self._hmac(self.ck, ikm)
        out: list[bytes] = []
        previous = b""
        for i in range(1, outputs + 1):
            previous = self._hmac(temp, previous + bytes((i,)))
            out.append(previous)
        return tuple(out)

    def mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = self.hkdf(ikm, 2)
        self.cipher.initialize_key(temp_k[:32])

    def mix_hash(self, data: bytes) -> None:
        self.h = self._digest(self.h + data)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ciphertext = self.cipher.encrypt_with_ad(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        plaintext = self.cipher.decrypt_with_ad(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[CipherState, CipherState]:
        k1, k2 = self.hkdf(b"", 2)
        return CipherState(k1[:32]), CipherState(k2[:32])


class HandshakeState:
    """One side of a Noise XX handshake (spec section 5.3), driven by ``write_message``/``read_message``.

    The initiator writes messages 1 and 3, the responder message 2. ``ephemeral_private`` is only for
    test vectors: a real handshake draws a fresh ephemeral key (that is where forward secrecy comes from).
    """

    def __init__(
        self,
        *,
        initiator: bool,
        static_private: bytes,
        prologue: bytes = b"",
        ephemeral_private: bytes | None = None,
        hash_name: str = "BLAKE2s",
    ) -> None:
        factory = _HASHES.get(hash_name)
        if factory is None:
            raise ValueError(f"hash_name must be one of {sorted(_HASHES)}, not {hash_name!r}")
        self.initiator = initiator
        self.protocol_name = f"Noise_XX_25519_ChaChaPoly_{hash_name}"
        self._symmetric = _SymmetricState(self.protocol_name.encode("ascii"), factory)
        self._symmetric.mix_hash(bytes(prologue))
        self._s, self._s_public = _static_key(bytes(static_private))
        self._e_given = _private(ephemeral_private) if ephemeral_private is not None else None
        self._e: X25519PrivateKey | None = None
        self._re: X25519PublicKey | None = None
        self._rs: X25519PublicKey | None = None
        self.remote_static: bytes | None = None
        """The peer's static public key, once its ``s`` token was read and authenticated."""
        self._step = 0
        self._failed = False
        self._split: tuple[CipherState, CipherState] | None = None

    @property
    def local_static(self) -> bytes:
        """This side's static public key."""
        return self._s_public

    @property
    def is_complete(self) -> bool:
        """All three messages were written or read."""
        return self._step == len(_PATTERN)

    @property
    def is_my_turn(self) -> bool:
        """Whether the next message is one this side writes."""
        return not self.is_complete and (self._step % 2 == 0) == self.initiator

    @property
    def handshake_hash(self) -> bytes:
        """``h``: after the handshake, a unique, authenticated id of this session (for channel binding)."""
        return self._symmetric.h

    def _check_turn(self, writing: bool) -> None:
        if self._failed:
            raise NoiseError("the handshake failed earlier and cannot continue")
        if self.is_complete:
            raise NoiseError("the handshake is already complete")
        if self.is_my_turn != writing:
            raise NoiseError(f"message {self._step + 1} is not this side's to {'write' if writing else 'read'}")

    def _dh(self, local: X25519PrivateKey | None, remote: X25519PublicKey | None) -> bytes:
        assert local is not None and remote is not None  # the pattern guarantees both
        try:
            return local.exchange(remote)
        except ValueError:  # a low-order point: the shared secret would be all zeros
            raise NoiseError("the peer's public key is not acceptable (low-order point)") from None

    def _mix_dh(self, token: str) -> None:
        """ee, es or se, each side taking its half (the initiator's es is DH(e, rs), the responder's DH(s, re))."""
        if token == "ee":
            secret = self._dh(self._e, self._re)
        elif (token == "es") == self.initiator:
            secret = self._dh(self._e, self._rs)
        else:
            secret = self._dh(self._s, self._re)
        self._symmetric.mix_key(secret)

    def write_message(self, payload: bytes = b"") -> bytes:
        """The next handshake message, carrying ``payload`` (encrypted once a key is agreed)."""
        self._check_turn(writing=True)
        try:
            out = bytearray()
            symmetric = self._symmetric
            for token in _PATTERN[self._step]:
                if token == "e":
                    self._e = self._e_given if self._e_given is not None else X25519PrivateKey.generate()
                    e_public = self._e.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
                    out += e_public
                    symmetric.mix_hash(e_public)
                elif token == "s":
                    out += symmetric.encrypt_and_hash(self._s_public)
                else:
                    self._mix_dh(token)
            out += symmetric.encrypt_and_hash(bytes(payload))
            if len(out) > MAX_MESSAGE_LEN:
                raise NoiseError(f"a handshake message of {len(out)} bytes exceeds {MAX_MESSAGE_LEN}")
        except BaseException:
            self._failed = True
            raise
        self._step += 1
        return bytes(out)

    def read_message(self, message: bytes) -> bytes:
        """The payload of the peer's next handshake message; raises NoiseError if it is not valid."""
        self._check_turn(writing=False)
        message = bytes(message)
        minimum = self._minimum_length()
        if not minimum <= len(message) <= MAX_MESSAGE_LEN:
            self._failed = True
            raise NoiseError(
                f"handshake message {self._step + 1} must be {minimum}..{MAX_MESSAGE_LEN} bytes, not {len(message)}"
            )
        try:
            symmetric = self._symmetric
            offset = 0
            for token in _PATTERN[self._step]:
                if token == "e":
                    re = message[offset : offset + DHLEN]
                    offset += DHLEN
                    self._re = X25519PublicKey.from_public_bytes(re)
                    symmetric.mix_hash(re)
                elif token == "s":
                    size = DHLEN + (TAGLEN if symmetric.cipher.has_key else 0)
                    rs = symmetric.decrypt_and_hash(message[offset : offset + size])
                    offset += size
                    self._rs = X25519PublicKey.from_public_bytes(rs)
                    self.remote_static = rs
                else:
                    self._mix_dh(token)
            payload = symmetric.decrypt_and_hash(message[offset:])
        except BaseException:
            self._failed = True
            raise
        self._step += 1
        return payload

    def _minimum_length(self) -> int:
        """The shortest valid message at this step: keys (with tags once encrypted) and an empty payload's tag."""
        keyed = self._symmetric.cipher.has_key
        size = 0
        for token in _PATTERN[self._step]:
            if token == "e":
                size += DHLEN
            elif token == "s":
                size += DHLEN + (TAGLEN if keyed else 0)
            elif token in ("ee", "es", "se"):
                keyed = True
        return size + (TAGLEN if keyed else 0)

    def split(self) -> tuple[CipherState, CipherState]:
        """(send, receive) cipher states for THIS side, once the handshake is complete."""
        if not self.is_complete or self._failed:
            raise NoiseError("split() needs a completed handshake")
        if self._split is None:
            self._split = self._symmetric.split()
        c1, c2 = self._split
        return (c1, c2) if self.initiator else (c2, c1)
