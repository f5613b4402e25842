"""The connection machine's remote-objects part: calls made, host calls answered, RMI frames in and out.

:class:`~..connection.ConnectionMachine` is built on it (its module docstring says how remote objects ride on a
connection); kept apart so each module stays one idea of a readable size.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConnectionClosedError
from ..events import Event
from ..results import ConnectionStats
from .calls import RemoteCalls
from .invocation import Invocation
from .objects import RemoteRef
from .registry import MethodSpec
from .wire import DEFAULT_TIMEOUT_NS

__all__ = ["RemoteObjectsPart"]


class RemoteObjectsPart:
    """What the connection machine does with its :class:`RemoteCalls` (None: it carries no remote objects).
    The machine sets the attributes and appends the frames."""

    rmi: RemoteCalls | None
    closed: bool
    stats: ConnectionStats
    _events: list[Event]

    def _append(self, kind: int, request_id: int, payload: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError  # (the machine's: a frame into the batch)

    def _remote(self) -> RemoteCalls:
        if self.rmi is None:
            raise ConnectionClosedError("this connection carries no remote objects")
        return self.rmi

    def call(
        self,
        ref: RemoteRef,
        method: MethodSpec | str,
        args: Sequence[object],
        now_ns: int,
        *,
        timeout_ns: int = DEFAULT_TIMEOUT_NS,
        oneway: bool = False,
    ) -> int:
        """Call ``method`` on the peer's object ``ref`` (see :meth:`RmiEndpoint.call`); the call id that
        ``RmiCallCompleted`` or ``RmiCallFailed`` will name (0: fire-and-forget)."""
        endpoint = (self.rmi or self._remote()).endpoint
        call_id = endpoint.call(ref, method, args, now_ns, timeout_ns=timeout_ns, oneway=oneway)
        for kind, request_id, payload in endpoint.take_frames():  # a call makes frames, never events
            self._append(kind, request_id, payload)
        return call_id

    def create(self, interface: type, args: Sequence[object], now_ns: int, *, timeout_ns: int) -> int:
        """Have the peer construct its implementation of ``interface``; the call id."""
        call_id = self._remote().endpoint.create(interface, args, now_ns, timeout_ns=timeout_ns)
        self.take_rmi()
        return call_id

    def send_object(self, value: object) -> None:
        """Send a proxy or a registered implementation as a message (see :meth:`RmiEndpoint.send_object`)."""
        self._remote().endpoint.send_object(value)
        self.take_rmi()

    def abandon_call(self, call_id: int) -> None:
        """The caller of ``call_id`` went away: its outcome is dropped, a result file removed."""
        if self.rmi is not None:
            self.rmi.abandon(call_id)

    def invocation(self, invocation_id: int) -> Invocation:
        """The host call a ``RmiRequestReceived`` names, to run (KeyError once answered or closed)."""
        if self.rmi is None:
            raise KeyError(invocation_id)
        return self.rmi.invocation(invocation_id)

    def complete_invocation(self, invocation_id: int, result: object) -> None:
        """Answer a host call with its result (a no-op once the connection closed)."""
        if self.rmi is not None:
            self.rmi.complete(invocation_id, result)
            self.take_rmi()

    def fail_invocation(self, invocation_id: int, error: BaseException) -> None:
        """Answer a host call with the exception it raised (a no-op once the connection closed)."""
        if self.rmi is not None:
            self.rmi.fail(invocation_id, error)
            self.take_rmi()

    def _rmi_frame(self, kind: int, request_id: int, payload: bytes) -> None:
        if self.rmi is None:
            self.stats.frame_errors += 1
            return
        self.rmi.receive(kind, request_id, payload)
        self.take_rmi()

    def take_rmi(self) -> None:
        """Move what remote objects have for us: frames into the batch (in call order), events into ours."""
        assert self.rmi is not None
        frames, events = self.rmi.take_output()
        if frames and not self.closed:
            for kind, request_id, payload in frames:
                self._append(kind, request_id, payload)
        if events:
            self._events += events
