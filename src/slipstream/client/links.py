"""How a ``Context`` talks to its media driver: one link per kind of driver.

A slipstream driver takes commands on its Unix socket (:class:`SocketLink`); the reference Aeron
driver, ``aeronmd``, takes them in its CnC file's ring buffer and answers on its broadcast buffer
(:class:`~slipstream.client.aeron_link.AeronLink`). The context drives either through the same few
calls, so registrations, images, keep-alives and the loss of the driver work alike on both.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections.abc import Callable
from typing import Protocol

from ..files import commands as cmd
from .errors import DriverUnavailableError


class DriverLink(Protocol):
    """What a context needs from the way to its driver."""

    client_id: int
    driver_pid: int
    client_liveness_timeout_ns: int
    parks: bool
    """Whether the driver may sleep until a client rings it (a slipstream driver's Wake command)."""

    def next_correlation_id(self) -> int:
        """A correlation id no other command to this driver carries."""
        ...

    def send(self, message: cmd.ClientMessage) -> None:
        """Send a command whole, or raise ``OSError`` (``TimeoutError`` when the driver does not read)."""
        ...

    def send_keepalive(self) -> bool:
        """Tell the driver this client lives, never waiting; False when that must be tried again soon."""
        ...

    def receive(self, timeout_s: float) -> list[cmd.DriverMessage] | None:
        """The driver's messages for this client, waiting up to ``timeout_s`` for some; None once the
        link is closed (by :meth:`shutdown` or by the driver). Raises ``ValueError`` on a garbled one."""
        ...

    def closed_reason(self) -> str | None:
        """Why the driver ended this client, when it said so (an Aeron driver's client timeout)."""
        ...

    def shutdown(self) -> None:
        """Make :meth:`receive` return None now (from any thread), after a last goodbye was sent."""
        ...

    def close(self) -> None:
        """Release what the link holds (after :meth:`shutdown` and the client thread's end)."""
        ...


class SocketLink:
    """A slipstream driver's socket: msgpack commands behind a length, answers on the same socket.

    ``invoke`` runs one duty cycle of an invoker-mode embedded driver, or is None: such a driver reads
    commands only while the application invokes it, so a full socket is made room in by invoking."""

    parks = True

    def __init__(self, sock: socket.socket, directory: os.PathLike[str], timeout_s: float,
                 invoke: Callable[[], int] | None) -> None:  # fmt: skip
        self._sock = sock
        self._directory = directory
        self._timeout_s = timeout_s
        self._invoke = invoke
        self._decoder = cmd.driver_decoder()
        self._sequence = 0
        self._early: list[cmd.DriverMessage] = []  # what came with the welcome: the first receive's
        welcome = self._handshake()
        self.client_id = welcome.client_id
        self.driver_pid = welcome.driver_pid
        self.client_liveness_timeout_ns = welcome.client_liveness_timeout_ns

    def _handshake(self) -> cmd.Welcome:
        deadline = time.monotonic() + self._timeout_s
        self._sock.settimeout(0.001 if self._invoke is not None else self._timeout_s)
        self._sock.sendall(cmd.encode(cmd.Hello(0, os.getpid())))
        while True:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                if self._invoke is not None and time.monotonic() < deadline:
                    self._invoke()
                    continue
                raise DriverUnavailableError(
                    f"the driver in {self._directory} did not answer within {self._timeout_s:.1f} s; "
                    "it may be hung: stop it and start a new one"
                ) from None
            if not data:
                raise DriverUnavailableError(f"the driver in {self._directory} closed the connection at once")
            messages = self._decoder.feed(data)
            if messages:
                break
        first = messages[0]
        if not isinstance(first, cmd.Welcome):
            raise DriverUnavailableError(f"unexpected first message from the driver: {first!r}")
        self._early = messages[1:]
        self._sock.settimeout(None)  # from now on: sends wait as send says, the client thread in select
        return first

    def next_correlation_id(self) -> int:
        """The client id in the high half: the driver numbers clients, each numbers its commands (the
        caller serialises calls)."""
        self._sequence += 1
        return (self.client_id << 32) | self._sequence

    def send(self, message: cmd.ClientMessage) -> None:
        """When the socket is full, an invoker-mode driver is invoked (an application that sends many
        commands at once, as many clients connecting together do, would otherwise wait forever); a
        driver with a thread of its own is waited for up to the timeout (then ``TimeoutError``)."""
        view = memoryview(_WAKE if message is WAKE else cmd.encode(message))
        deadline: float | None = None
        while view:
            try:
                view = view[self._sock.send(view, socket.MSG_DONTWAIT) :]
                continue
            except BlockingIOError:
                pass
            if self._invoke is not None:
                self._invoke()
                continue
            now = time.monotonic()
            deadline = now + self._timeout_s if deadline is None else deadline
            if now >= deadline:
                raise TimeoutError(f"the media driver did not read commands for {self._timeout_s:.1f} s")
            select.select([], [self._sock], [], deadline - now)

    def send_keepalive(self) -> bool:
        """A keep-alive of a few bytes, all or nothing; none when the socket is full (the driver has
        commands of ours to read: it knows we live)."""
        with contextlib.suppress(OSError):
            self._sock.send(_KEEPALIVE, socket.MSG_DONTWAIT)
        return True

    def receive(self, timeout_s: float) -> list[cmd.DriverMessage] | None:
        """Sleeps in ``select``: an idle client costs no CPU, and a driver process that dies closes the
        socket, which ends the wait at once."""
        if self._early:
            early, self._early = self._early, []
            return early
        try:
            readable, _, _ = select.select([self._sock], [], [], timeout_s)
            data = self._sock.recv(65536) if readable else None
        except BlockingIOError:
            return []
        except (OSError, ValueError):  # ValueError: closed meanwhile
            return None
        if data is None:
            return []
        if not data:
            return None
        return self._decoder.feed(data)

    def closed_reason(self) -> str | None:
        """None: a slipstream driver that ends a client closes its socket, which ``receive`` reports."""
        return None

    def shutdown(self) -> None:
        """Say goodbye (the driver frees what this client held) and shut the socket both ways."""
        with contextlib.suppress(OSError):
            self.send(cmd.CloseClient())
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()


WAKE = cmd.Wake()
"""The one Wake message: sent often, encoded once."""
_WAKE = cmd.encode(WAKE)
_KEEPALIVE = cmd.encode(cmd.Keepalive())
