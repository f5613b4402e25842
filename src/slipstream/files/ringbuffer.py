"""Aeron's many-to-one ring buffer (the CnC's to-driver command buffer): layout facts.

A buffer of ``capacity`` bytes (a power of two) followed by a trailer of counters, each on its own pair
of cache lines so that writers in different processes do not share lines. Records are 8-byte aligned:
length (i32, written last and with release semantics), message type id (i32), then the message.
"""

from __future__ import annotations

from typing import Final

CACHE_LINE_LENGTH: Final = 64
TAIL_POSITION_OFFSET: Final = 2 * CACHE_LINE_LENGTH
HEAD_CACHE_POSITION_OFFSET: Final = 4 * CACHE_LINE_LENGTH
HEAD_POSITION_OFFSET: Final = 6 * CACHE_LINE_LENGTH
CORRELATION_COUNTER_OFFSET: Final = 8 * CACHE_LINE_LENGTH
CONSUMER_HEARTBEAT_OFFSET: Final = 10 * CACHE_LINE_LENGTH
TRAILER_LENGTH: Final = 12 * CACHE_LINE_LENGTH
"""Offsets above are relative to the trailer, which starts at ``capacity``."""
RECORD_HEADER_LENGTH: Final = 8
RECORD_ALIGNMENT: Final = 8
PADDING_MSG_TYPE_ID: Final = -1
