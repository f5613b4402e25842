"""Type stubs for the C fast path; the pure-Python reference is in appender.py, reader.py and, for the two
client classes built on it, client/image.py (``PyImage``) and client/assembler.py (``PyFragmentAssembler``)."""

from collections.abc import Callable
from typing import Any, TypeVar

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

class AssemblerCore:
    """FragmentAssembler's state and reassembly; read_term assembles inline for it."""

    def __init__(self, handler: Callable[[memoryview, Header], object]) -> None: ...
    def __call__(self, fragment: memoryview, header: Header) -> None: ...
    def free_session_buffer(self, session_id: int) -> None: ...

class ImageCore:
    """An image's position, terms and poll; client.image.Image subclasses it."""

    _position: int
    _mask: int
    _bits: int
    _index: int
    _terms: tuple[memoryview, ...]
    _values: memoryview
    _header: Header
    _closed: bool
    is_corrupt: bool
    def poll(self, handler: Callable[[memoryview, Header], object], fragment_limit: int) -> int: ...

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
def cut_datagrams(
    term: memoryview, offset: int, window: int, mtu: int, budget: int, out: list[bytes | bytearray | memoryview]
) -> tuple[int, int, bool]:
    """The sender's cut of new data into datagrams, appended to ``out`` as slices of ``term``:
    (bytes consumed, padding included; bytes sent; window shut or a frame did not fit)."""

def send_datagrams(
    fd: int, datagrams: list[bytes | bytearray | memoryview], start: int, gso: bool
) -> tuple[int, int, int] | None:
    """Linux only. A connected socket's send from ``datagrams[start]`` (the GIL released for more than 64 KiB,
    else held and non-blocking): (start, end, errno) of the first failed call (errno -1: a short send), or
    (len, len, 0); None leaves it to Python."""

def receive_batches(fd: int, buffer: bytearray, budget: int, gro: bool) -> list[tuple[int, int, int, Any]]:
    """Linux only. Up to ``budget`` (at most 64) non-blocking receive calls (the GIL released once more than
    64 KiB came in), each into the next 64 KiB of ``buffer`` while that much is left: (start, end, segment,
    source) per call, until one fails."""

def send_ring(fd: int, address: bytes) -> int:
    """Linux only. One byte from UNIX datagram socket ``fd`` to ``address`` (a sun_path), non-blocking, the GIL
    held: 0 when sent, else the errno (ECONNREFUSED or ENOENT: nobody there; EAGAIN: its queue is full)."""

def drain_datagrams(fd: int) -> int:
    """Linux only. Read and drop the datagrams queued on ``fd`` (at most 4096), non-blocking, the GIL held; how
    many there were."""

def compare_and_set_i64(buffer: Any, offset: int, expected: int, update: int) -> bool:
    """Atomically replace the i64 at ``offset`` by ``update`` if it is ``expected``; whether it did."""

def get_and_add_i64(buffer: Any, offset: int, delta: int) -> int:
    """Atomically add ``delta`` to the i64 at ``offset``; the value before."""

def load_acquire_i64(buffer: Any, offset: int) -> int: ...
def load_acquire_i32(buffer: Any, offset: int) -> int: ...
def store_release_i64(buffer: Any, offset: int, value: int) -> None: ...
def store_release_i32(buffer: Any, offset: int, value: int) -> None: ...
