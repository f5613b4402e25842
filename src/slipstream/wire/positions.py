"""Position arithmetic: the 64-bit stream position and its (term id, term offset) form.

Term ids wrap as signed 32-bit integers; positions never wrap (the maximum is ``term_length << 31``).
"""

from __future__ import annotations

from .constants import (
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    MAX_MESSAGE_LENGTH_LIMIT,
    MTU_MAX,
    TERM_MAX_LENGTH,
    TERM_MIN_LENGTH,
)

_I32_MASK = 0xFFFFFFFF


def wrap_i32(value: int) -> int:
    """Wrap an integer into the signed 32-bit range, as Java/C int arithmetic does."""
    value &= _I32_MASK
    return value - 0x1_0000_0000 if value & 0x8000_0000 else value


def align(value: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round ``value`` up to a multiple of ``alignment`` (a power of two)."""
    return (value + alignment - 1) & -alignment


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def position_bits_to_shift(term_length: int) -> int:
    """log2 of the term length; the shift that turns term counts into positions."""
    return term_length.bit_length() - 1


def compute_position(term_id: int, term_offset: int, bits: int, initial_term_id: int) -> int:
    """Stream position of ``term_offset`` within ``term_id``."""
    term_count = wrap_i32(term_id - initial_term_id)
    return (term_count << bits) + term_offset


def raw_tail_position(raw_tail: int, term_length: int, bits: int, initial_term_id: int) -> int:
    """The position a raw tail counter stands for: :func:`compute_position` of its :func:`tail_term_id` and
    :func:`tail_term_offset`, in one frame (a driver reads it for a publication on every cycle that moved its
    limit, and a sender on every send)."""
    term_count = ((raw_tail >> 32) - initial_term_id) & _I32_MASK
    if term_count & 0x8000_0000:
        term_count -= 0x1_0000_0000
    return (term_count << bits) + min(raw_tail & _I32_MASK, term_length)


def compute_term_id(position: int, bits: int, initial_term_id: int) -> int:
    return wrap_i32(initial_term_id + (position >> bits))


def compute_term_offset(position: int, term_length: int) -> int:
    return position & (term_length - 1)


def index_by_position(position: int, bits: int) -> int:
    """Partition (0..2) of the log that holds ``position``."""
    return (position >> bits) % 3


def index_by_term(initial_term_id: int, term_id: int) -> int:
    return wrap_i32(term_id - initial_term_id) % 3


def index_by_term_count(term_count: int) -> int:
    return term_count % 3


def max_possible_position(term_length: int) -> int:
    return term_length << 31


def max_message_length(term_length: int) -> int:
    """Largest message a publication accepts: min(term_length / 8, 16 MiB)."""
    return min(term_length // 8, MAX_MESSAGE_LENGTH_LIMIT)


def max_payload_length(mtu: int) -> int:
    """Largest payload of one frame."""
    return mtu - DATA_HEADER_LENGTH


def check_term_length(term_length: int) -> None:
    """Raise ValueError unless the term length is a power of two in [64 KiB, 1 GiB]."""
    if not (TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH) or not is_power_of_two(term_length):
        raise ValueError(f"term length must be a power of 2 in [{TERM_MIN_LENGTH}, {TERM_MAX_LENGTH}]: {term_length}")


def check_mtu(mtu: int) -> None:
    """Raise ValueError unless the MTU is a multiple of 32 in (32, 65504]."""
    if not (DATA_HEADER_LENGTH < mtu <= MTU_MAX) or mtu % FRAME_ALIGNMENT:
        raise ValueError(f"mtu must be a multiple of {FRAME_ALIGNMENT} in ({DATA_HEADER_LENGTH}, {MTU_MAX}]: {mtu}")


def pack_tail(term_id: int, term_offset: int) -> int:
    """Raw tail counter value: term id in the high 32 bits, offset in the low 32 (as a signed i64)."""
    raw = ((term_id & _I32_MASK) << 32) | (term_offset & _I32_MASK)
    return raw - (1 << 64) if raw & (1 << 63) else raw


def tail_term_id(raw_tail: int) -> int:
    return wrap_i32(raw_tail >> 32)


def tail_term_offset(raw_tail: int, term_length: int) -> int:
    """Offset part of a raw tail, capped at the term length (tails may run past the end)."""
    return min(raw_tail & _I32_MASK, term_length)
