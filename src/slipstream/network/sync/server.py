"""``Server`` for blocking code: :class:`~..serving.ServerCore` bound and closed from the calling thread,
its handshakes and connections run by the process's poll thread (see :mod:`..serving`)."""

from __future__ import annotations

import threading
import time

from ..config import ServerConfig
from ..serving import REBIND_MAX_DELAY_S, SETTLE_STEP_S, ServerCore
from .connection import Connection
from .endpoint import Endpoint

__all__ = ["Server"]


class Server(Endpoint, ServerCore[Connection]):
    """An application server for blocking code: ``with Server(config) as server: server.bind(port)``;
    listeners (plain functions) run on the process's poll thread. ``busy_poll``: see ``Endpoint``."""

    def __init__(self, config: ServerConfig, *, busy_poll: bool = False) -> None:
        super().__init__(config, busy_poll=busy_poll)
        self.config: ServerConfig = config
        self._rebinding = False
        self._closed = threading.Event()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bind(self, port: int, control_port: int | None = None) -> None:
        """Listen on UDP ``port`` (handshakes) and ``control_port`` (default ``port + 1``), for the
        enabled IP families; with IPC enabled, also on IPC (clients on this host use it)."""
        with self.lock:
            self._bind(port, control_port)

    def bind_ipc(self) -> None:
        """Listen over IPC only (clients use ``connect_ipc``)."""
        with self.lock:
            self._bind_ipc_only()

    def serve_forever(self, timeout: float | None = None) -> bool:
        """Block until ``close`` (from another thread or a listener) or ``timeout`` seconds; whether it closed."""
        return self._closed.wait(timeout)

    def _start_rebind(self) -> None:
        if self._rebinding:
            return
        self._rebinding = True

        def attempt() -> None:
            with self.lock:
                self._bind_again()

        def then(worked: bool) -> None:
            self._rebinding = False
            if worked and not self._closing:
                self._start_poller()

        self._retry_thread(attempt, REBIND_MAX_DELAY_S, then).start()

    def close(self) -> None:
        """Close every connection (each peer hears CLOSE), stop listening, release the driver. Interrupted
        midway (a KeyboardInterrupt in one of its waits), it still tells the peers, stops and releases
        everything before the exception goes on. From a listener it returns at once: the close goes on in a
        thread of its own once the listener returns (``serve_forever`` returns when it is done)."""
        if self._closed.is_set():
            return
        if self._close_elsewhere(self.close):
            return
        try:
            with self.lock:
                self._close_started()
            # Starting connections that are half up come up first (see aio.Server._settle_starting).
            deadline_ns = time.monotonic_ns() + int(self.config.close_timeout * 1e9)
            try:
                self.drive(lambda: not self._half_up(), lambda _: time.sleep(SETTLE_STEP_S), deadline_ns)
            finally:  # (interrupted while settling too: the peers hear CLOSE, not their expiry)
                with self.lock:
                    self._close_connections()
            self._wait_closings()
            with self.lock:
                self._close_table()
        finally:
            with self.lock:
                self._stop_poller()
                self._links.close()
                self._stop_recording()
            try:
                self._close_last()
            finally:
                self._closed.set()
                self._close_done.set()
