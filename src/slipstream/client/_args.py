"""Checks of the client API's arguments, made at the call so that nothing malformed reaches the driver."""

from __future__ import annotations

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..wire.uri import ChannelUri

_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1


def check_channel(name: str, channel: object) -> ChannelUri:
    """Parse a channel given as text or ``ChannelUri``; a wrong type is an ``InvalidArgumentTypeError``."""
    if isinstance(channel, ChannelUri):
        return channel
    if not isinstance(channel, str):
        raise InvalidArgumentTypeError(
            f"{name} must be a channel URI string such as 'aeron:ipc', got {type(channel).__name__}: {channel!r:.80}"
        )
    return ChannelUri.parse(channel)


def check_stream_id(name: str, stream_id: object) -> int:
    """A stream id is a 32-bit signed int (not a bool, float or string)."""
    if isinstance(stream_id, bool) or not isinstance(stream_id, int):
        raise InvalidArgumentTypeError(f"{name} must be an int, got {type(stream_id).__name__}: {stream_id!r:.80}")
    if not _I32_MIN <= stream_id <= _I32_MAX:
        raise InvalidArgumentError(f"{name} must fit in 32 bits [{_I32_MIN}, {_I32_MAX}]: {stream_id}")
    return stream_id


def check_callable(name: str, value: object) -> None:
    """Callbacks are checked when registered, not when the driver first calls them back."""
    if value is not None and not callable(value):
        raise InvalidArgumentTypeError(f"{name} must be callable or None, got {type(value).__name__}")
