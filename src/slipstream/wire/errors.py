"""Exceptions of the protocol layer.

They subclass ValueError so callers that only care about "bad input" can catch the builtin.
"""

from __future__ import annotations


class FrameError(ValueError):
    """A datagram or frame that is not valid Aeron wire format."""
