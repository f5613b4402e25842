"""What an application may override on a connection, and what it may read about its kind.

The seed lets an application give its endpoint a factory for its own ``Connection`` subclass and override
how messages are written and dispatched; here the subclass is named in the config
(``ServerConfig(connection_class=MyConnection)``, checked when the config is built) and overrides two
methods: :meth:`ConnectionHooks.outgoing` sees each message the application sends before it is encoded,
:meth:`ConnectionHooks.dispatch` each message received before the listeners do. Every adapter's
``Connection`` is built on this class, so the hooks mean the same whichever adapter runs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ConnectionHooks"]


class ConnectionHooks:
    """The override points of ``slipstream.network.Connection`` (subclass that, not this).

    A subclass keeps the constructor's keyword arguments (``__init__(self, **kwargs)`` calling
    ``super().__init__(**kwargs)``): servers and clients make every connection, never the application."""

    remote_address: str | None
    remote_key_changed = False
    """True on a client's connection when the server's key differed from the one pinned for its address and
    ``allow_key_change`` accepted (and re-pinned) it: the seed's ``remoteKeyHasChanged``."""
    _owner: Any
    """The ``endpoint.ConnectionOwner`` running this connection (not imported: it imports the config)."""
    _receipt: tuple[int, int] | None = None
    """(sync id, stream id) of the message being dispatched, until the listeners take it over."""

    @property
    def is_ipc(self) -> bool:
        """True for a shared-memory connection."""
        return self.remote_address is None

    @property
    def is_network(self) -> bool:
        """True for a UDP connection (the seed's ``isNetwork``), False for IPC."""
        return self.remote_address is not None

    def outgoing(self, message: object) -> object:
        """Called with each message the application sends (``send``, ``send_nowait``, ``send_sync``, and
        what a buffered session queued), before it is encoded; returns what is sent instead: this message,
        or another (a registered type). Runs in the sender's call, so keep it quick; what it raises
        reaches that caller. Remote calls and pings do not pass here."""
        return message

    def dispatch(self, message: object) -> None:
        """Called with each message received, inline on the receive path, before any listener: the default
        runs the ``on_message`` listeners. Override to transform or route messages; call
        ``super().dispatch(other)`` for the listeners to see ``other`` (a ``send_sync`` is acknowledged once
        they finish, or, if the override never calls it, when the override returns). What it raises goes
        to ``on_error``."""
        receipt, self._receipt = self._receipt or (0, 0), None
        self._owner.dispatch(self, message, *receipt)

    def received(self, message: object, sync_id: int = 0, stream_id: int = 0) -> None:
        """A message arrived (for the adapter): through :meth:`dispatch`; acknowledged here when the
        override kept it from the listeners."""
        self._receipt = (sync_id, stream_id)
        try:
            self.dispatch(message)
        except Exception as exc:
            self._owner.report_error(self, exc)
        receipt, self._receipt = self._receipt, None
        if receipt is not None:  # (what the listeners never saw is done with)
            sync_id, stream_id = receipt
            if stream_id:
                self.release_stream(stream_id)
            if sync_id:
                self.acknowledge_sync(sync_id)

    if TYPE_CHECKING:  # (the adapter's Connection has them)

        def acknowledge_sync(self, sync_id: int) -> None: ...

        def release_stream(self, stream_id: int) -> None: ...
