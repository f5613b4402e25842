"""The root of slipstream's exceptions, and the media driver's, which every floor above may raise.

This module sits at the ground floor (it imports nothing of slipstream), so any package can derive
its errors from ``SlipstreamError`` and one ``except SlipstreamError`` catches them all.
"""

from __future__ import annotations


class SlipstreamError(Exception):
    """Base of every exception slipstream raises on purpose."""


class DriverError(SlipstreamError, RuntimeError):
    """The driver cannot start, or a client cannot reach a driver."""


class DriverAlreadyRunningError(DriverError):
    """Another live driver holds the directory."""
