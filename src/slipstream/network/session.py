"""The record layer after the handshake: AEAD records with counter nonces and a replay window.

A record is ``counter (u64, big-endian) | ChaCha20-Poly1305(plaintext) | tag (16 bytes)`` where the
nonce is the counter (four zero bytes then the counter), so a record carries its own nonce and can be
opened out of order: the transport may be unreliable (``reliable=false``) and reorder. Counters start
at 0, go up by one per record, and never wrap (a layer refuses to seal past 2**64 - 2), so a nonce is
never reused under one key.

Replay: a window of ``replay_window`` counters below the highest accepted one. A record is accepted once
if its counter is above the window's floor and not yet seen; the window is a ring of the last counter
accepted in each slot (``counter % window``), so checking and marking cost one list index each, with
no big-integer bitmap shifting. A record is marked seen only after its tag verified, so forged records
cannot poison the window. Rejections are counted and raised as :class:`RecordRejected` subclasses.
"""

from __future__ import annotations

import struct
from types import ModuleType
from typing import TYPE_CHECKING, Final, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from ..logbuffer.fastpath import load_extension
from .errors import FrameError, MessageDecodeError, NetworkError, RecordMalformed, RecordReplayed, RecordTampered
from .frames import _IS_MESSAGE, _KINDS

__all__ = [
    "COUNTER_SIZE",
    "MAX_RECORD",
    "RECORD_OVERHEAD",
    "TAG_SIZE",
    "PlainRecords",
    "PyRecordLayer",
    "RecordLayer",
    "Records",
]

COUNTER_SIZE: Final = 8
TAG_SIZE: Final = 16
RECORD_OVERHEAD: Final = COUNTER_SIZE + TAG_SIZE
"""Bytes a record adds to its plaintext."""
MAX_RECORD: Final = 16 * 1024 * 1024
"""Default largest record accepted (a transport message larger than any the layer above sends)."""
_LAST_COUNTER: Final = 2**64 - 2
_COUNTER: Final = struct.Struct(">Q")
_NONCE_PAD: Final = b"\x00\x00\x00\x00"
_NONCE: Final = struct.Struct(">4xQ")
"""A counter as its 12-byte nonce (four zero bytes, then the counter), in one call."""
_SEAL_INTO_FROM: Final = 4096
"""Plaintext size from which a record is encrypted into its own buffer (large chunks: 147 -> 79 us per
128 KiB here) instead of concatenated to its counter (small records: 2.3 us against 3.8)."""

RECORDS_C: ModuleType | None = load_extension("slipstream.network._records")
"""The record layer and the record decoder in C (``_records.c``), or None: the Python reference runs."""
if RECORDS_C is not None:
    RECORDS_C.bind(
        RecordMalformed,
        RecordReplayed,
        RecordTampered,
        NetworkError,
        InvalidTag,
        FrameError,
        MessageDecodeError,
        _KINDS,
        _IS_MESSAGE,
    )


def _check(send_key: bytes, receive_key: bytes, replay_window: int, max_record: int) -> None:
    if len(send_key) != 32 or len(receive_key) != 32:
        raise ValueError("send_key and receive_key must be 32 bytes each")
    if not 1 <= replay_window <= 1 << 20:
        raise ValueError(f"replay_window must be 1..{1 << 20}, not {replay_window}")
    if max_record < RECORD_OVERHEAD:
        raise ValueError(f"max_record must be at least {RECORD_OVERHEAD}, not {max_record}")


class _Counts:
    """What both record layers derive from their counters."""

    __slots__ = ()
    _send_counter: int
    rejected_malformed: int
    rejected_tampered: int
    rejected_replayed: int

    @property
    def send_counter(self) -> int:
        """The counter the next sealed record gets."""
        return self._send_counter

    @property
    def rejected(self) -> int:
        """All records refused, whatever the reason."""
        return self.rejected_malformed + self.rejected_tampered + self.rejected_replayed


class PyRecordLayer(_Counts):
    """Seals outgoing and opens incoming records of one session (one AEAD object per direction): the
    reference, run without the C extension (:class:`RecordLayer` is this in C when it is built).

    ``send_key`` and ``receive_key`` are the handshake's split keys for this side. Not thread-safe; one
    instance per connection, driven by one loop.
    """

    __slots__ = (
        "_floor",
        "_highest",
        "_open",
        "_seal",
        "_seal_into",
        "_seen",
        "_send_counter",
        "max_record",
        "records_opened",
        "records_sealed",
        "rejected_malformed",
        "rejected_replayed",
        "rejected_tampered",
        "replay_window",
    )

    def __init__(
        self, send_key: bytes, receive_key: bytes, *, replay_window: int = 4096, max_record: int = MAX_RECORD
    ) -> None:
        _check(send_key, receive_key, replay_window, max_record)
        sealer = ChaCha20Poly1305(send_key)
        self._seal = sealer.encrypt
        self._seal_into = sealer.encrypt_into
        self._open = ChaCha20Poly1305(receive_key).decrypt
        self.replay_window = replay_window
        self.max_record = max_record
        self._send_counter = 0
        self._highest = -1
        """Highest counter accepted so far (-1: none yet)."""
        self._floor = -1
        """Counters at or below this are too old for the window (``_highest - replay_window``)."""
        self._seen: list[int] = [-1] * replay_window
        self.records_sealed = 0
        """Records sealed (sent)."""
        self.records_opened = 0
        """Records that verified and were accepted."""
        self.rejected_malformed = 0
        """Records too short or too long, or past the last counter."""
        self.rejected_tampered = 0
        """Records whose tag did not verify (altered, forged, other key)."""
        self.rejected_replayed = 0
        """Records already accepted, or older than the window."""

    def seal(self, plaintext: bytes | bytearray | memoryview) -> bytes | bytearray:
        """One record carrying ``plaintext``; raises NetworkError (without sealing) once counters run out."""
        counter = self._send_counter
        if counter > _LAST_COUNTER:
            raise NetworkError("the session's record counter is exhausted; a new handshake is needed")
        self._send_counter = counter + 1
        header = _COUNTER.pack(counter)
        self.records_sealed += 1
        size = len(plaintext)
        if size < _SEAL_INTO_FROM:
            return header + self._seal(_NONCE_PAD + header, plaintext, None)
        record = bytearray(RECORD_OVERHEAD + size)  # encrypted in place: no second copy of a large record
        record[:COUNTER_SIZE] = header
        self._seal_into(_NONCE_PAD + header, plaintext, None, memoryview(record)[COUNTER_SIZE:])
        return record

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        """The plaintext of ``record``; raises RecordMalformed, RecordTampered or RecordReplayed (counted)."""
        size = len(record)
        if size < RECORD_OVERHEAD or size > self.max_record:
            self.rejected_malformed += 1
            raise RecordMalformed(f"a record of {size} bytes (must be {RECORD_OVERHEAD}..{self.max_record})")
        (counter,) = _COUNTER.unpack_from(record)  # read in place (a view of the log, often): no copy
        if counter > _LAST_COUNTER:  # (no sealer gets there: the ring below keeps 2**64 - 1 free)
            self.rejected_malformed += 1
            raise RecordMalformed(f"record counter {counter} is past the last one a sealer uses")
        if counter <= self._floor:
            self.rejected_replayed += 1
            raise RecordReplayed(f"record {counter} is older than the replay window (highest {self._highest})")
        slot = counter % self.replay_window
        seen = self._seen
        if seen[slot] == counter:
            self.rejected_replayed += 1
            raise RecordReplayed(f"record {counter} was already received")
        try:
            plaintext = self._open(_NONCE.pack(counter), memoryview(record)[COUNTER_SIZE:], None)
        except InvalidTag:
            self.rejected_tampered += 1
            raise RecordTampered(f"record {counter} failed authentication") from None
        seen[slot] = counter
        if counter > self._highest:
            self._highest = counter
            self._floor = counter - self.replay_window
        self.records_opened += 1
        return plaintext


if TYPE_CHECKING or RECORDS_C is None:
    RecordLayer = PyRecordLayer
else:

    class RecordLayer(RECORDS_C.RecordCore, _Counts):  # type: ignore[misc,name-defined]
        """Seals outgoing and opens incoming records of one session, with its counters, replay window,
        ``seal`` and ``open`` in C (see :class:`PyRecordLayer`, the reference: the same records and errors).
        The encryption is still the ``cryptography`` package's ChaCha20-Poly1305, called from C."""

        __slots__ = ()

        def __init__(
            self, send_key: bytes, receive_key: bytes, *, replay_window: int = 4096, max_record: int = MAX_RECORD
        ) -> None:
            _check(send_key, receive_key, replay_window, max_record)
            sealer = ChaCha20Poly1305(send_key)
            super().__init__(
                sealer.encrypt,
                sealer.encrypt_into,
                ChaCha20Poly1305(receive_key).decrypt,
                replay_window,
                max_record,
                _SEAL_INTO_FROM,
            )


class Records(Protocol):
    """The record layer as a connection machine uses it (:class:`RecordLayer`, or plain for IPC)."""

    def seal(self, plaintext: bytes | bytearray | memoryview) -> bytes | bytearray:
        """One record carrying ``plaintext``."""
        ...

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        """The plaintext of ``record``; raises a RecordRejected subclass."""
        ...


class PlainRecords:
    """No encryption: for IPC connections configured with ``encrypt_ipc=False`` on both sides."""

    records_sealed = 0
    records_opened = 0
    rejected_malformed = 0
    rejected_tampered = 0
    rejected_replayed = 0

    def seal(self, plaintext: bytes | bytearray | memoryview) -> bytes:
        """The plaintext itself."""
        return bytes(plaintext)

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        """The record itself."""
        return bytes(record)
