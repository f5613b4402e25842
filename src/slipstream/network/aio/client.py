"""``Client`` for asyncio: :class:`~..connecting.ClientCore`'s connect steps awaited, and its reconnect
after a loss run as a task (see :mod:`..connecting` for what a client does)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..config import ClientConfig
from ..connecting import ClientCore, ConnectSteps, Registering, T, advance
from .connection import Connection
from .endpoint import Endpoint
from .transport import IdleBackoff, registered_pair

__all__ = ["Client"]


class Client(Endpoint, ClientCore[Connection]):
    """An application client: ``async with Client(config) as client: c = await client.connect(host, port)``."""

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        self.config: ClientConfig = config
        self._reconnect_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- connecting -------------------------------------------------------------------------------

    async def connect(
        self, host: str, port: int, control_port: int | None = None, timeout: float | None = None
    ) -> Connection:
        """Connect to the server at ``host:port`` (handshake port; its control port defaults to
        ``port + 1``), waiting at most ``timeout`` seconds in all (default: the config's
        ``connect_timeout``, 30 s; 0 waits forever). Raises a ClientRejected subclass, ConnectTimeout,
        or ClientClosedError after ``close``."""
        return await self._run(self._connecting(host, port, control_port, timeout))

    async def connect_ipc(self, timeout: float | None = None) -> Connection:
        """Connect over IPC to a server that called ``bind_ipc`` (``timeout``: as for ``connect``)."""
        return await self._run(self._connecting_ipc(timeout))

    async def reconnect(self) -> Connection:
        """Connect again to the last target (closing the current connection first, if any)."""
        self._check_reconnect()
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()
        return await self._run(self._connecting_again())

    async def _run(self, steps: ConnectSteps[T]) -> T:
        """Await each wait of ``steps``; what fails is thrown back in (the attempt cleans up)."""
        backoff = IdleBackoff()
        reply: Any = None
        error: BaseException | None = None
        while True:
            wait, finished = advance(steps, reply, error)
            if finished:
                result: T = wait
                return result
            reply, error = None, None
            try:
                if isinstance(wait, Registering):
                    context = wait.first.context
                    reply = await registered_pair(context, wait.first, wait.second)
                else:
                    await backoff.take(wait)
            except BaseException as exc:  # (cancelled too: the attempt closes its streams)
                error = exc

    # -- after a fault ------------------------------------------------------------------------------

    def _reconnecting(self) -> bool:
        return self._reconnect_task is not None

    def _in_reconnect(self) -> bool:
        return self._reconnect_task is not None and asyncio.current_task() is self._reconnect_task

    def _start_reconnect(self) -> None:
        self._reconnect_task = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        """Connect again until it works, ``close`` is called, or the server refuses us for good."""

        async def attempt() -> None:
            await self._run(self._connecting_again())

        try:
            await self._retry(attempt, self.config.reconnect_max_delay)
        finally:
            self._reconnect_task = None
            self._reconnect_ended()

    async def close(self) -> None:
        """Close the connection (the server hears CLOSE at once), let the listeners still running finish
        (up to ``close_timeout``, then they are cancelled) and release the driver. Cancelled midway, it
        still stops and releases everything before the cancellation goes on."""
        self._close_started()
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        try:
            await self._wait_closings()
            await self._stop_poller()
        finally:
            self._stop_poller_now()
            self._stop_recording()
            try:
                await self._release_context_drained()
            finally:
                self.store.close()
                self._closed = True
