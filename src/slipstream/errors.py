"""The root of slipstream's exceptions, and the media driver's, which every floor above may raise.

This module sits at the ground floor (it imports nothing of slipstream), so any package can derive
its errors from ``SlipstreamError`` and one ``except SlipstreamError`` catches them all. Errors about
an argument or a setting are also ``ValueError`` (or ``TypeError``), so code that catches the
builtins keeps working.
"""

from __future__ import annotations


class SlipstreamError(Exception):
    """Base of every exception slipstream raises on purpose."""


class MissingExtraError(SlipstreamError, ImportError):
    """A feature needs an optional extra that is not installed; the message names the ``pip install``."""

    def __init__(self, message: str, *, extra: str, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.extra = extra
        """The extra to install (``telemetry``, ``pipeline``)."""


class InvalidArgumentError(SlipstreamError, ValueError):
    """An argument has a value slipstream cannot use; the message names the argument."""


class InvalidArgumentTypeError(SlipstreamError, TypeError):
    """An argument has the wrong type; the message names the argument and the type expected."""


class DriverConfigError(InvalidArgumentError):
    """A media driver setting is out of range or contradicts another; the message names the setting."""


class DriverError(SlipstreamError, RuntimeError):
    """The driver cannot start, or a client cannot reach a driver."""


class DriverAlreadyRunningError(DriverError):
    """Another live driver holds the directory."""


class DriverDirectoryError(DriverError):
    """The driver directory cannot be created, read or written (permissions, a file in the way, ...)."""


class AtomicsUnavailableError(SlipstreamError, RuntimeError):
    """Writing to a buffer shared between processes (Aeron's ring and broadcast buffers) needs atomic
    compare-and-set and release stores, which only the C extension provides (not built, or disabled by
    ``SLIPSTREAM_NO_EXTENSIONS``)."""
