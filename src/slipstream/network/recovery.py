"""How an endpoint comes back after a fault, decided without I/O: the waits between attempts, which
failures are worth another attempt, and whether a driver is there to attach to.

The seed's ``AeronDriver`` closes what a lost driver carried, restarts the driver, and its client connects
again while its server binds again; so do slipstream's (``ClientConfig.reconnect``,
``ServerConfig.rebind``). Attempts start at once and back off (0.05 s, doubling to the configured
maximum), so a short fault is over in a fraction of a second and a long one costs one attempt every few
seconds. A server that refuses this client for good (its key changed, other registrations, a filter)
ends the attempts; a busy one (full, per-address limit) does not.
"""

from __future__ import annotations

import os
from typing import Final

from .errors import ConnectionNotPermitted, RegistrationMismatch, ServerKeyChanged

__all__ = ["FIRST_RETRY_S", "PERMANENT", "QUIET_PART", "RetryDelays", "driver_available", "quiet_deadline_ns"]

FIRST_RETRY_S: Final = 0.05
"""The wait before the first attempt after a fault."""

PERMANENT: Final = (ServerKeyChanged, RegistrationMismatch, ConnectionNotPermitted)
"""Refusals that another attempt cannot change: reconnecting stops (and says why)."""

QUIET_PART: Final = 2
"""A client that hears nothing from its server for ``1/QUIET_PART`` of the connection's expiry (two of the
server's keepalives missed) connects again alongside, and the new connection replaces the quiet one once
up: a server whose driver restarted has forgotten the connection and sends nothing more, and waiting out
the whole expiry would only add to the outage (the server ends the old connection when the same client
session comes back, and delivery replays what it had not acknowledged, so a false alarm costs nothing)."""


def quiet_deadline_ns(last_received_ns: int, expiry_ns: int) -> int:
    """When a client's connection whose server was last heard from at ``last_received_ns`` counts as quiet."""
    return last_received_ns + expiry_ns // QUIET_PART


class RetryDelays:
    """The waits before successive attempts: ``first_s``, then doubling up to ``max_s``."""

    def __init__(self, max_s: float, first_s: float = FIRST_RETRY_S) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"need 0 < first_s <= max_s: {first_s}, {max_s}")
        self.first_s = first_s
        self.max_s = max_s
        self._next = first_s

    def next(self) -> float:
        """The wait before the next attempt (and the one after doubles)."""
        wait = self._next
        self._next = min(wait * 2, self.max_s)
        return wait

    def reset(self) -> None:
        """An attempt worked: the next fault starts from ``first_s`` again."""
        self._next = self.first_s


def driver_available(directory: str | os.PathLike[str] | None, driver: str) -> bool:
    """Whether attaching to ``directory`` can work now without blocking: always for a driver this process
    starts itself (embedded or invoker mode, or ``auto`` finding none), only while one runs for ``external``
    (else the attach would wait for it up to the driver timeout)."""
    if driver != "external" or directory is None:
        return True
    from ..files.observe import driver_status  # the driver-files reader, needed once a driver is lost

    try:
        return driver_status(os.fspath(directory)).alive
    except (OSError, ValueError, RuntimeError):
        return False
