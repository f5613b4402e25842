"""Errors a client raises; each says what happened and what to do about it."""

from __future__ import annotations

from ..errors import DriverAlreadyRunningError, DriverDirectoryError, DriverError

__all__ = [
    "DriverAlreadyRunningError",
    "DriverDirectoryError",
    "DriverError",
    "DriverLostError",
    "DriverUnavailableError",
    "RegistrationError",
]


class DriverUnavailableError(DriverError):
    """No media driver answered in the directory within the timeout."""


class DriverLostError(DriverError):
    """The media driver this client used went away (process died or closed)."""


class RegistrationError(DriverError):
    """The driver refused a command (bad channel, unsupported media, ...); ``code`` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def renewed(error: DriverError) -> DriverError:
    """A new exception like a stored one, to raise again: re-raising the same object would grow its
    traceback with every call that meets it."""
    if isinstance(error, RegistrationError):
        copy: DriverError = RegistrationError(error.code, str(error).partition(": ")[2])
    else:
        copy = type(error)(*error.args)
    copy.__cause__ = error.__cause__
    return copy
