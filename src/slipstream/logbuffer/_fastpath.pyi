"""Type stubs for the C fast path; the pure-Python reference is in appender.py and reader.py."""

from collections.abc import Callable
from typing import TypeVar

from .header import Header

_T = TypeVar("_T", bound=tuple[object, ...])

class AppenderCore:
    """Hot appender state and the offer/claim fast paths; ExclusiveAppender subclasses it."""

    _term_offset: int
    _term_begin_position: int
    _check_offset: int
    _term_length: int
    _term_id_shifted: int
    _active_index: int
    _term_id: int
    _session_id: int
    _stream_id: int
    _max_payload: int
    _max_message_length: int
    _limit_index: int
    _parked_index: int
    _term: memoryview
    _term_i32: memoryview
    _tail_i64: memoryview
    _limit_values: memoryview
    _parked: memoryview | None
    _wake: Callable[[], None]
    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int: ...
    def claim(self, length: int, limit: int, claim: object) -> int: ...

def read_term(
    term: memoryview,
    term_i32: memoryview,
    offset: int,
    handler: Callable[[memoryview, Header], object],
    fragment_limit: int,
    header: Header,
) -> tuple[int, int, bool]: ...
def scan_block(term: memoryview, term_i32: memoryview, offset: int, max_length: int) -> tuple[int, int, bool]: ...
def scan_term(term: memoryview, term_i32: memoryview, offset: int, max_length: int) -> tuple[int, int]: ...
def is_equal_run(term: memoryview, offset: int, frame_length: int, count: int) -> bool: ...
def scan_equal_frames(data: bytes | bytearray | memoryview, result_type: type[_T]) -> _T | None: ...
def insert_datagram(
    term: memoryview, term_offset: int, data: bytes | bytearray | memoryview, first_frame_length: int
) -> bool: ...
