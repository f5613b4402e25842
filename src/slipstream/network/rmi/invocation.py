"""A host call, vetted and ready to run: what the adapter executes for a peer's request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .objects import RemoteRef
from .registry import MethodSpec
from .wire import FileRef

__all__ = ["Invocation"]


@dataclass(slots=True)
class Invocation:
    """A vetted request the host is to run: the function comes from the registered interface's table.

    ``args`` are the function's arguments (the target object first). When the implementation declares
    the calling connection, ``caller_slot`` is its position in ``args``: :meth:`arguments` puts the
    adapter's connection there. An object the caller hosts arrives as a :class:`RemoteRef`, which
    :meth:`arguments` turns into the adapter's proxy."""

    request_id: int
    oneway: bool
    object_id: int
    method: str
    spec: MethodSpec | None
    function: Callable[..., Any]
    args: tuple[object, ...]
    create_interface: int = -1
    files: tuple[tuple[int, FileRef], ...] = ()
    """(position in ``args``, reference) of ``Path`` arguments: the connection waits for each file's
    stream, puts the temporary copy's ``pathlib.Path`` in ``args`` before the call is handed out, and
    removes the copy when the call completed or failed."""
    caller_slot: int = -1
    invocation_id: int = 0
    """Set by the connection machine that holds the call while it runs (0: not held)."""
    counted: bool = False
    """The machine counted it against ``max_pending_calls`` as it arrived (an ``async def`` method), so
    the calls of one record cannot run past the limit; the adapter counts it done when its task ends."""

    def arguments(
        self, caller: object = None, resolve: Callable[[RemoteRef], object] | None = None
    ) -> tuple[object, ...]:
        """``args`` with ``caller`` in the caller's slot (when given) and each RemoteRef resolved."""
        args = self.args
        with_caller = caller is not None and self.caller_slot >= 0
        with_refs = resolve is not None and self.spec is not None and bool(self.spec.ref_params)
        if not (with_caller or with_refs):
            return args  # the common call: its arguments as they arrived
        values = list(args)
        if with_caller:
            values[self.caller_slot] = caller
        if resolve is not None and with_refs:
            values = [resolve(a) if isinstance(a, RemoteRef) else a for a in values]
        return tuple(values)

    def call(self, caller: object = None, resolve: Callable[[RemoteRef], object] | None = None) -> object:
        """Run it (the result may be awaitable: the adapter awaits it, then calls ``complete``)."""
        return self.function(*self.arguments(caller, resolve))
