"""One epoll over every socket the driver's agents read: the command listener, clients and UDP sockets.

The agents run in one thread (Aeron's SHARED mode), so one wait covers them all: a parked driver
wakes for a client's command, its doorbell or a datagram. epoll is used directly: the selectors
module costs a microsecond per call, and an idle duty cycle polls once per cycle.
"""

from __future__ import annotations

import contextlib
import select
from typing import Generic, TypeVar

__all__ = ["SocketPoller"]

T = TypeVar("T")


class SocketPoller(Generic[T]):
    """Level-triggered readiness of registered file descriptors, each with what it stands for."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self.watched: dict[int, T] = {}
        """fd -> what it is, as given to ``register``."""

    def register(self, fd: int, what: T) -> None:
        """Watch ``fd`` for readability; ``poll`` reports it with ``what``."""
        self._epoll.register(fd, select.EPOLLIN)
        self.watched[fd] = what

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (nothing happens if it was not watched)."""
        if fd in self.watched:
            del self.watched[fd]
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    def poll(self, timeout_s: float) -> list[tuple[int, T]]:
        """The readable descriptors and what they are; waits up to ``timeout_s`` (0: does not wait)."""
        watched = self.watched
        return [(fd, watched[fd]) for fd, _ in self._epoll.poll(timeout_s if timeout_s > 0 else 0) if fd in watched]

    def fileno(self) -> int:
        """The epoll descriptor: readable while a watched descriptor is (an event loop can wait on it)."""
        return self._epoll.fileno()

    def close(self) -> None:
        """Release the epoll descriptor (the watched sockets are their owners' to close)."""
        self._epoll.close()
