"""Results of ``offer`` and ``try_claim``: a new position (> 0) or one of these negative codes.

The codes and their meaning are Aeron's, so that knowledge and tooling carry over. Nothing is ever
swallowed: every refusal reaches the caller as one of these.
"""

from __future__ import annotations

from typing import Final

NOT_CONNECTED: Final = -1
"""No subscriber is connected; the message was not sent."""
BACK_PRESSURED: Final = -2
"""Subscribers have not kept up; retry later."""
ADMIN_ACTION: Final = -3
"""The log rotated to a new term during the call; retry at once."""
CLOSED: Final = -4
"""The publication is closed."""
MAX_POSITION_EXCEEDED: Final = -5
"""The stream reached its maximum position; it must be closed and a new one opened."""

_NAMES: Final = {
    NOT_CONNECTED: "NOT_CONNECTED",
    BACK_PRESSURED: "BACK_PRESSURED",
    ADMIN_ACTION: "ADMIN_ACTION",
    CLOSED: "CLOSED",
    MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
}


def result_name(result: int) -> str:
    """Readable name of an offer result: the code's name, or ``position N`` for a success."""
    return _NAMES.get(result, f"position {result}" if result > 0 else f"unknown result {result}")
