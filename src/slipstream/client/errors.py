"""Errors a client raises; each says what happened and what to do about it."""

from __future__ import annotations

from ..errors import DriverAlreadyRunningError, DriverError

__all__ = ["DriverAlreadyRunningError", "DriverError", "DriverLostError", "DriverUnavailableError", "RegistrationError"]


class DriverUnavailableError(DriverError):
    """No media driver answered in the directory within the timeout."""


class DriverLostError(DriverError):
    """The media driver this client used went away (process died or closed)."""


class RegistrationError(DriverError):
    """The driver refused a command (bad channel, unsupported media, ...); ``code`` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
