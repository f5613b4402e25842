"""``Client`` for blocking code: :class:`~..connecting.ClientCore`'s connect steps carried out in the
calling thread (the lock held while a step runs, not while it waits), its reconnect after a loss in a
thread of its own (see :mod:`..connecting`)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ...client import ExclusivePublication, Registration, Subscription
from ..config import ClientConfig
from ..connecting import ClientCore, ConnectSteps, Registering, T, advance
from ..pacing import Nap, Sleep, Step
from ..transport import shared_contexts
from .connection import Connection
from .endpoint import Endpoint

__all__ = ["Client"]


class Client(Endpoint, ClientCore[Connection]):
    """An application client for blocking code: ``with Client(config) as client: c = client.connect(host,
    port)``; listeners (plain functions) run on the thread that cycles. ``busy_poll``: see ``Endpoint``."""

    def __init__(self, config: ClientConfig, *, busy_poll: bool = False) -> None:
        super().__init__(config, busy_poll=busy_poll)
        self.config: ClientConfig = config
        self._reconnect_thread: threading.Thread | None = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connecting -------------------------------------------------------------------------------

    def connect(
        self, host: str, port: int, control_port: int | None = None, timeout: float | None = None
    ) -> Connection:
        """Connect to the server at ``host:port`` (handshake port; its control port defaults to
        ``port + 1``), waiting at most ``timeout`` seconds in all (default: the config's
        ``connect_timeout``, 30 s; 0 waits forever). Raises a ClientRejected subclass, ConnectTimeout,
        or ClientClosedError after ``close``."""
        return self._run(self._connecting(host, port, control_port, timeout))

    def connect_ipc(self, timeout: float | None = None) -> Connection:
        """Connect over IPC to a server that called ``bind_ipc`` (``timeout``: as for ``connect``)."""
        return self._run(self._connecting_ipc(timeout))

    def reconnect(self) -> Connection:
        """Connect again to the last target (closing the current connection first, if any)."""
        self._check_reconnect()
        if self.connection is not None and not self.connection.is_closed:
            self.connection.close()
        return self._run(self._connecting_again())

    def _run(self, steps: ConnectSteps[T]) -> T:
        """Carry out each wait of ``steps``, a step at a time under the lock; what fails is thrown back in."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            with self.lock:
                wait, finished = advance(steps, reply, error)
            if finished:
                result: T = wait
                return result
            reply, error = None, None
            try:
                if isinstance(wait, Registering):
                    reply = self._registered(wait.first, wait.second)
                else:
                    self._take(wait)
            except BaseException as exc:  # (interrupted too: the attempt closes its streams)
                error = exc

    def _registered(
        self, first: Registration[Subscription], second: Registration[ExclusivePublication]
    ) -> tuple[Subscription, ExclusivePublication]:
        """Both registrations' streams once the driver answered (an invoker-mode driver is run between
        polls, under the lock); if either fails, neither stays."""
        context = first.context
        try:
            while True:
                with self.lock:
                    subscription, publication = first.poll(), second.poll()
                    if subscription is not None and publication is not None:
                        return subscription, publication
                    if context.is_invoker:
                        shared_contexts.invoke(context)
                time.sleep(1e-4)
        except BaseException:
            with self.lock:
                first.cancel()
                second.cancel()
            raise

    @staticmethod
    def _take(step: Step) -> None:
        if isinstance(step, (Sleep, Nap)):
            time.sleep(step.seconds)
        else:
            os.sched_yield()

    # -- after a fault ------------------------------------------------------------------------------

    def _reconnecting(self) -> bool:
        return self._reconnect_thread is not None

    def _in_reconnect(self) -> bool:
        return self._reconnect_thread is threading.current_thread()

    def _start_reconnect(self) -> None:
        def attempt() -> None:
            self._run(self._connecting_again())

        def then(worked: bool) -> None:
            self._reconnect_thread = None
            self._reconnect_ended()

        self._reconnect_thread = self._retry_thread(attempt, self.config.reconnect_max_delay, then)
        self._reconnect_thread.start()

    def close(self) -> None:
        """Close the connection (the server hears CLOSE at once) and release the driver (once: again is a no-op).
        Interrupted midway (a KeyboardInterrupt in its wait), it still stops and releases everything before the
        exception goes on. From a listener it returns at once: the close goes on in a thread of its own once the
        listener returns."""
        if self._closed:
            return
        if self._close_elsewhere(self.close):
            return
        try:
            with self.lock:
                self._close_started()
            self._wait_closings()
        finally:
            with self.lock:
                self._stop_poller()
                self._stop_recording()
            try:
                self._close_last()
            finally:
                self._closed = True
                self._close_done.set()
