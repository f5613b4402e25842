"""Aeron's one-to-many broadcast buffer (the CnC's to-clients buffer): layout facts.

A buffer of ``capacity`` bytes (a power of two) followed by a 128-byte trailer: tail intent counter,
tail counter and latest counter (i64 each). Records are 8-byte aligned: length (i32), message type id
(i32), then the message; a receiver that falls a whole capacity behind has been lapped.
"""

from __future__ import annotations

from typing import Final

TAIL_INTENT_COUNTER_OFFSET: Final = 0
TAIL_COUNTER_OFFSET: Final = 8
LATEST_COUNTER_OFFSET: Final = 16
TRAILER_LENGTH: Final = 128
"""Offsets above are relative to the trailer, which starts at ``capacity``."""
RECORD_HEADER_LENGTH: Final = 8
RECORD_ALIGNMENT: Final = 8
PADDING_MSG_TYPE_ID: Final = -1
