"""Two sans-I/O RMI endpoints joined by hand (no connection, no streams): what the RMI tests exercise
the call machine with. :meth:`RmiPair.flush` moves frames both ways until nothing moves; a host call
runs at once (a coroutine method is the adapter's: it is refused here)."""

from __future__ import annotations

from typing import Any

from ..network.events import RmiCallCompleted
from ..network.frames import FrameKind
from ..network.rmi import IdPool, ObjectTable, RmiEndpoint, RmiRegistry, exception_from

__all__ = ["RmiPair", "deliver"]


def deliver(target: RmiEndpoint, kind: int, request_id: int, payload: bytes, caller: object = None) -> None:
    """Hand one RMI frame to ``target``, running a host call it vets (synchronous methods only)."""
    if kind == FrameKind.RMI_REQUEST:
        invocation = target.receive_request(request_id, payload, caller)
        if invocation is not None:
            assert target.execute(invocation) is None, "coroutine methods are the adapter's"
    else:
        target.receive_response(request_id, payload)


class RmiPair:
    """A client and a server :class:`RmiEndpoint` (``global_objects``: the server's global table)."""

    def __init__(
        self,
        client_registry: RmiRegistry,
        server_registry: RmiRegistry,
        *,
        global_objects: ObjectTable | None = None,
        response_ids: IdPool | None = None,
        caller: object = None,
    ) -> None:
        self.client_registry, self.server_registry = client_registry, server_registry
        self.client = RmiEndpoint(client_registry, response_ids=response_ids)
        self.server = RmiEndpoint(server_registry, global_objects=global_objects)
        self.caller = caller
        self.client_events: list[Any] = []
        self.server_events: list[Any] = []

    def flush(self, max_rounds: int = 100) -> None:
        """Move frames both ways until quiet (AssertionError if they keep flowing)."""
        for _ in range(max_rounds):
            moved = False
            for source, target, events in (
                (self.client, self.server, self.server_events),
                (self.server, self.client, self.client_events),
            ):
                for kind, request_id, payload in source.take_frames():
                    moved = True
                    deliver(target, kind, request_id, bytes(payload), caller=self.caller)  # (as the wire gives it)
                events.extend(target.take_events())
            if not moved:
                return
        raise AssertionError("frames kept flowing")

    def result(self, call_id: int) -> Any:
        """Flush, then the outcome of the client's call ``call_id``: its value, or its exception raised."""
        self.flush()
        for event in self.client_events:
            if getattr(event, "call_id", None) == call_id:
                self.client_events.remove(event)
                if isinstance(event, RmiCallCompleted):
                    return event.value
                raise exception_from(event, self.client_registry)
        raise AssertionError(f"no outcome for call {call_id}")
