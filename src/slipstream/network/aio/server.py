"""``Server`` for asyncio: :class:`~..serving.ServerCore` bound, closed and bound again after a lost
driver on the event loop (see :mod:`..serving` for what a server does)."""

from __future__ import annotations

import asyncio

from ..config import ServerConfig
from ..serving import REBIND_MAX_DELAY_S, SETTLE_STEP_S, ServerCore
from .connection import Connection
from .endpoint import Endpoint

__all__ = ["Server"]


class Server(Endpoint, ServerCore[Connection]):
    """An application server: ``async with Server(config) as server: await server.bind(port)``."""

    def __init__(self, config: ServerConfig) -> None:
        super().__init__(config)
        self.config: ServerConfig = config
        self._rebinding: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def bind(self, port: int, control_port: int | None = None) -> None:
        """Listen on UDP ``port`` (handshakes) and ``control_port`` (default ``port + 1``), for the
        enabled IP families; with IPC enabled, also on IPC (clients on this host use it)."""
        self._bind(port, control_port)

    async def bind_ipc(self) -> None:
        """Listen over IPC only (clients use ``connect_ipc``)."""
        self._bind_ipc_only()

    def _start_rebind(self) -> None:
        if self._rebinding is None:
            self._rebinding = asyncio.ensure_future(self._rebind())

    async def _rebind(self) -> None:
        async def attempt() -> None:
            self._bind_again()

        try:
            if await self._retry(attempt, REBIND_MAX_DELAY_S):
                self._start_poller()
        finally:
            self._rebinding = None

    async def _settle_starting(self) -> None:
        """Before closing, wait (at most the close timeout) until each starting connection that is half up
        is up: its client may count itself connected already (its image of our publication comes up
        before our publication hears its status message). Closed like any other, it hears CLOSE instead
        of waiting out its expiry, and ``on_connect`` / ``on_disconnect`` run here as they did there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.close_timeout
        while self._half_up() and loop.time() < deadline:
            self.wake()
            await asyncio.sleep(SETTLE_STEP_S)

    async def close(self) -> None:
        """Close every connection (each peer hears CLOSE), let the listeners still running finish (up to
        ``close_timeout``, then they are cancelled), stop listening, release the driver. Cancelled midway,
        it still tells the peers, stops and releases everything before the cancellation goes on."""
        self._close_started()
        if self._rebinding is not None:
            self._rebinding.cancel()
        try:
            try:
                await self._settle_starting()
            finally:  # (cancelled while settling too: the peers hear CLOSE, not their expiry)
                self._close_connections()
            await self._wait_closings()
            self._close_table()
            await self._stop_poller()
        finally:
            self._stop_poller_now()
            self._links.close()
            self._stop_recording()
            try:
                await self._release_context_drained()
            finally:
                self.store.close()
