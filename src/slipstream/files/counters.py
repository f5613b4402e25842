"""Counters: 64-bit values in shared memory, each with a metadata record (type, label, key).

Aeron's layout: metadata records of 512 bytes (state, type id, free-for-reuse deadline, 112-byte key,
label) and value records of 128 bytes (value, registration id, owner id, reference id), one cache
line pair each so that writers in different processes do not share lines. The driver allocates and
frees; any process may read, and the owner of a position counter writes its value.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Final

METADATA_LENGTH: Final = 512
VALUE_LENGTH: Final = 128
KEY_OFFSET: Final = 16
MAX_KEY_LENGTH: Final = 112
LABEL_LENGTH_OFFSET: Final = 128
LABEL_OFFSET: Final = 132
MAX_LABEL_LENGTH: Final = 380

RECORD_UNUSED: Final = 0
RECORD_ALLOCATED: Final = 1
RECORD_RECLAIMED: Final = -1

# Type ids, as Aeron numbers them.
SYSTEM_COUNTER_TYPE_ID: Final = 0
PUBLISHER_LIMIT_TYPE_ID: Final = 1
SENDER_POSITION_TYPE_ID: Final = 2
RECEIVER_HWM_TYPE_ID: Final = 3
SUBSCRIBER_POSITION_TYPE_ID: Final = 4
RECEIVER_POSITION_TYPE_ID: Final = 5
SENDER_LIMIT_TYPE_ID: Final = 9
PUBLISHER_POSITION_TYPE_ID: Final = 12
# Per-stream loss and repair (Aeron counts these per driver only; slipstream also per stream, so a
# connection's NAKs, retransmissions and losses can be told apart from the others').
SENDER_NAKS_RECEIVED_TYPE_ID: Final = 900
SENDER_RETRANSMITS_TYPE_ID: Final = 901
RECEIVER_NAKS_SENT_TYPE_ID: Final = 902
RECEIVER_BYTES_LOST_TYPE_ID: Final = 903
APPLICATION_TYPE_ID_MIN: Final = 1000
"""Type ids from here on are for clients' own counters (``Context.add_counter``); below, the driver's."""
NETWORK_RECORDS_DROPPED_TYPE_ID: Final = 1001
"""``slipstream.network``: records an endpoint dropped (tampered, replayed, forged or malformed)."""
NETWORK_ERRORS_TYPE_ID: Final = 1002
"""``slipstream.network``: errors an endpoint met (undispatched or undecodable messages, failed listeners...),
reported to ``on_error`` or counted there as repeats: a flood shows here, not in the log."""

_META_HEAD = struct.Struct("<iiq")
_LABEL_LEN = struct.Struct("<i")
_VALUE_IDS = struct.Struct("<qqq")


@dataclass(frozen=True, slots=True)
class CounterInfo:
    """One allocated counter as a reader sees it."""

    counter_id: int
    type_id: int
    label: str
    value: int
    registration_id: int
    owner_id: int
    reference_id: int
    key: bytes


_VALUE_STRIDE: Final = VALUE_LENGTH // 8
"""i64 slots per counter value record."""


class CountersReader:
    """Reads (and, for owners, writes) counters in two buffers: metadata and values."""

    def __init__(self, metadata: memoryview, values: memoryview) -> None:
        if len(metadata) // METADATA_LENGTH != len(values) // VALUE_LENGTH:
            raise ValueError("counters metadata and values buffers describe different capacities")
        self.metadata = metadata
        self.values = values
        self.values_i64 = values.cast("q")
        self.capacity = len(values) // VALUE_LENGTH

    def _check(self, counter_id: int) -> None:
        if not 0 <= counter_id < self.capacity:
            raise IndexError(f"counter id {counter_id} outside [0, {self.capacity})")

    def value_index(self, counter_id: int) -> int:
        """Index of the counter's value in ``values_i64``: hot paths keep it and index directly."""
        self._check(counter_id)
        return counter_id * _VALUE_STRIDE

    def get(self, counter_id: int) -> int:
        # Read on every duty cycle (subscriber positions): the index check is inlined.
        if not 0 <= counter_id < self.capacity:
            self._check(counter_id)
        value: int = self.values_i64[counter_id * _VALUE_STRIDE]
        return value

    def min_value(self, counter_ids: Collection[int]) -> int:
        """The smallest value of some counters (e.g. the slowest subscriber's position); at least one id.
        Read every duty cycle, so one counter (the common case) costs no map and no min."""
        get = self.get
        return get(*counter_ids) if len(counter_ids) == 1 else min(map(get, counter_ids))

    def set(self, counter_id: int, value: int) -> None:
        if not 0 <= counter_id < self.capacity:
            self._check(counter_id)
        self.values_i64[counter_id * _VALUE_STRIDE] = value

    def state(self, counter_id: int) -> int:
        self._check(counter_id)
        return int(_META_HEAD.unpack_from(self.metadata, counter_id * METADATA_LENGTH)[0])

    def registration_id(self, counter_id: int) -> int | None:
        """The registration id of an allocated counter (None if the id is not allocated): a reader that
        keeps counter ids checks with it that the id still holds the counter it found."""
        if self.state(counter_id) != RECORD_ALLOCATED:
            return None
        return int(_VALUE_IDS.unpack_from(self.values, counter_id * VALUE_LENGTH + 8)[0])

    def info(self, counter_id: int) -> CounterInfo | None:
        """The counter, or None if that id is not allocated. Tolerates a corrupt label length."""
        self._check(counter_id)
        base = counter_id * METADATA_LENGTH
        state, type_id, _ = _META_HEAD.unpack_from(self.metadata, base)
        if state != RECORD_ALLOCATED:
            return None
        label_length = _LABEL_LEN.unpack_from(self.metadata, base + LABEL_LENGTH_OFFSET)[0]
        label_length = max(0, min(label_length, MAX_LABEL_LENGTH))
        label = bytes(self.metadata[base + LABEL_OFFSET : base + LABEL_OFFSET + label_length])
        vbase = counter_id * VALUE_LENGTH
        value = int(self.values_i64[vbase // 8])
        registration_id, owner_id, reference_id = _VALUE_IDS.unpack_from(self.values, vbase + 8)
        key = bytes(self.metadata[base + KEY_OFFSET : base + KEY_OFFSET + MAX_KEY_LENGTH])
        return CounterInfo(
            counter_id, type_id, label.decode("utf-8", "replace"), value, registration_id, owner_id, reference_id, key
        )

    def __iter__(self) -> Iterator[CounterInfo]:
        """Allocated counters in id order; stops at the first never-used record."""
        for counter_id in range(self.capacity):
            state = _META_HEAD.unpack_from(self.metadata, counter_id * METADATA_LENGTH)[0]
            if state == RECORD_UNUSED:
                return
            info = self.info(counter_id)
            if info is not None:
                yield info

    def find(self, type_id: int, registration_id: int) -> CounterInfo | None:
        for info in self:
            if info.type_id == type_id and info.registration_id == registration_id:
                return info
        return None


class CountersManager(CountersReader):
    """The driver's side: allocation and freeing. Freed ids are reused only after a delay, so a reader
    holding an old id does not suddenly read someone else's counter."""

    def __init__(self, metadata: memoryview, values: memoryview, reuse_delay_ms: int = 1000) -> None:
        super().__init__(metadata, values)
        self.reuse_delay_ms = reuse_delay_ms
        self._high_water = 0
        self._free: list[tuple[int, int]] = []  # (reusable at ms, id)

    def allocate(
        self,
        label: str,
        type_id: int,
        *,
        registration_id: int = 0,
        owner_id: int = 0,
        reference_id: int = 0,
        key: bytes = b"",
        now_ms: int = 0,
    ) -> int:
        if len(key) > MAX_KEY_LENGTH:
            raise ValueError(f"counter key longer than {MAX_KEY_LENGTH} bytes")
        counter_id = self._next_id(now_ms)
        base = counter_id * METADATA_LENGTH
        raw_label = label.encode("utf-8")[:MAX_LABEL_LENGTH]
        meta = self.metadata
        meta[base + KEY_OFFSET : base + KEY_OFFSET + MAX_KEY_LENGTH] = key.ljust(MAX_KEY_LENGTH, b"\0")
        _LABEL_LEN.pack_into(meta, base + LABEL_LENGTH_OFFSET, len(raw_label))
        meta[base + LABEL_OFFSET : base + LABEL_OFFSET + MAX_LABEL_LENGTH] = raw_label.ljust(MAX_LABEL_LENGTH, b"\0")
        vbase = counter_id * VALUE_LENGTH
        self.values_i64[vbase // 8] = 0
        _VALUE_IDS.pack_into(self.values, vbase + 8, registration_id, owner_id, reference_id)
        # The state goes last: a reader that sees ALLOCATED sees the whole record.
        _META_HEAD.pack_into(meta, base, RECORD_ALLOCATED, type_id, 0)
        return counter_id

    def _next_id(self, now_ms: int) -> int:
        if self._free and self._free[0][0] <= now_ms:
            return self._free.pop(0)[1]
        if self._high_water >= self.capacity:
            raise MemoryError(f"all {self.capacity} counters are in use")
        counter_id = self._high_water
        self._high_water += 1
        return counter_id

    def free(self, counter_id: int, now_ms: int = 0) -> None:
        self._check(counter_id)
        deadline = now_ms + self.reuse_delay_ms
        _META_HEAD.pack_into(self.metadata, counter_id * METADATA_LENGTH, RECORD_RECLAIMED, 0, deadline)
        self._free.append((deadline, counter_id))

    def set_label(self, counter_id: int, label: str) -> None:
        base = counter_id * METADATA_LENGTH
        raw = label.encode("utf-8")[:MAX_LABEL_LENGTH]
        self.metadata[base + LABEL_OFFSET : base + LABEL_OFFSET + MAX_LABEL_LENGTH] = raw.ljust(MAX_LABEL_LENGTH, b"\0")
        _LABEL_LEN.pack_into(self.metadata, base + LABEL_LENGTH_OFFSET, len(raw))
