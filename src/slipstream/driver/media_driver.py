"""``MediaDriver``: runs a driver conductor for one directory, embedded (a thread) or standalone.

A directory belongs to one driver at a time: the driver holds an exclusive ``flock`` on
``driver.lock`` for its lifetime, and the kernel releases it if the process dies, so a crashed
driver never blocks the next one. A driver that removes its directory when it closes
(``DriverConfig.dir_delete_on_shutdown``) does so while it still holds that lock, the lock file last, so
a driver claiming the directory meanwhile either waits or keeps a directory of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import DriverAlreadyRunningError, DriverDirectoryError, DriverError
from ..files.cnc import STATE_CLOSED, STATE_RUNNING, CncFile
from ..files.directory import (
    CNC_FILE,
    CONFIG_FILE,
    IMAGES_DIR,
    LOCK_FILE,
    PUBLICATIONS_DIR,
    SOCKET_FILE,
    DirectoryHandle,
    directory_error,
    raise_open_file_limit,
)
from ..files.idle import IdleStrategy, ParkingIdleStrategy, idle_strategy
from ..files.loss_report import LOSS_REPORT_FILE, LossReport
from .clock import StallClock
from .conductor import DriverConductor, clean_publications_dir
from .config import DriverConfig
from .config_file import effective_config, format_config
from .ipc_publication import PublicationState
from .network_publication import NetworkPublication

log = logging.getLogger("slipstream.driver")

CLAIM_ATTEMPTS = 5
"""Tries at claiming a directory that the driver closing in it removes meanwhile."""


class MediaDriver:
    """A media driver for ``config.directory``. ``start`` claims the directory; ``run`` serves until
    ``stop``; ``launch_embedded`` does both on a daemon thread, or with ``threading_mode="invoker"``
    only starts, and the application calls ``invoke`` for each duty cycle."""

    def __init__(self, config: DriverConfig | None = None) -> None:
        self.config = (config or DriverConfig()).made_unique()
        self.config.validate()
        self.directory = Path(self.config.directory)
        self._lock_fd = -1
        self._conductor: DriverConductor | None = None
        self._cnc: CncFile | None = None
        self._loss_report: LossReport | None = None
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._embedded = False

    def start(self) -> MediaDriver:
        """Claim the directory (one driver per directory) and create its files and socket; ``run`` then serves."""
        directory = self.directory
        raise_open_file_limit()  # every log the driver maps holds a descriptor, a few per stream
        lock_fd = _claim(directory)
        self._lock_fd = lock_fd
        os.ftruncate(lock_fd, 0)
        os.write(lock_fd, f"{os.getpid()}\n".encode())
        try:
            self._prepare(directory)
        except OSError as exc:
            self._shutdown(clean=False)
            raise directory_error(directory, exc) from None
        except BaseException:
            self._shutdown(clean=False)
            raise
        return self

    def _prepare(self, directory: Path) -> None:
        for stale in (SOCKET_FILE, CNC_FILE, LOSS_REPORT_FILE, CONFIG_FILE):
            with contextlib.suppress(FileNotFoundError):
                (directory / stale).unlink()
        clean_publications_dir(directory)
        config = self.config
        self._cnc = CncFile.create(
            directory,
            counters_capacity=config.counters_capacity,
            error_log_length=config.error_log_length,
            client_liveness_timeout_ns=config.client_liveness_timeout_ns,
            start_timestamp_ms=time.time_ns() // 1_000_000,
            pid=os.getpid(),
        )
        handle = DirectoryHandle(directory)
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(handle.socket_path())
            listener.listen(64)
        finally:
            handle.close()
        self._listener = listener
        self._loss_report = LossReport(directory)
        # The duty cycle's one clock, whichever thread runs it: timeouts leave the driver's own stalls out.
        clock = StallClock(config.effective_stall_threshold_ns())
        self._conductor = DriverConductor(config, self._cnc, listener, clock, self._loss_report)
        _write_settings(directory, effective_config(config, embedded=self._embedded))
        self._cnc.heartbeat_ms = time.time_ns() // 1_000_000
        self._cnc.state = STATE_RUNNING
        log.info("media driver started in %s (pid %d)", directory, os.getpid())

    def run(self) -> None:
        """Serve until ``stop`` is called (from another thread or a signal handler)."""
        conductor = self._conductor
        if conductor is None:
            raise DriverError("start() the driver before run()")
        name = self.config.idle_strategy
        # Back-off and sleep park in select instead of sleeping blind: same CPU, instant wake-ups.
        idle: IdleStrategy
        if name == "backoff":
            idle = ParkingIdleStrategy(conductor.park)
        elif name == "sleep":
            idle = ParkingIdleStrategy(conductor.park, max_spins=0, max_yields=0)
        else:
            idle = idle_strategy(name)
        try:
            while not self._stop.is_set():
                idle.idle(self._duty_cycle(conductor))
        finally:
            self._shutdown()

    @staticmethod
    def _duty_cycle(conductor: DriverConductor) -> int:
        try:
            return conductor.do_work(conductor.clock.now_ns())
        except Exception as exc:  # counted and logged like Aeron's agent error handler; keep serving
            log.exception("driver duty cycle failed")
            conductor.record_error(f"duty cycle failed: {exc!r}")
            return 0

    @property
    def is_invoker(self) -> bool:
        """True when the application runs the duty cycle (``invoke``) instead of a driver thread."""
        return self.config.threading_mode == "invoker"

    def invoke(self) -> int:
        """Run one duty cycle on the caller's thread (invoker mode); the work it did, 0 once closed.
        Call it from one thread only."""
        conductor = self._conductor
        if conductor is None or self._closed:
            return 0
        return self._duty_cycle(conductor)

    def send_now(self, registration_id: int) -> int:
        """In invoker mode, send what the network publication ``registration_id`` holds now (its
        datagrams, as the next duty cycle would), so an application's offer leaves at once instead of
        a loop turn later; the datagrams sent, 0 for anything else. Control datagrams wait for the
        duty cycle, and so does whatever the sender reports (finished, connected)."""
        conductor = self._conductor
        if conductor is None or self._closed or not self.is_invoker:
            return 0
        network = conductor.network_publications.get(registration_id)
        if network is None:
            return 0
        try:
            return network.send_fresh(conductor.clock.now_ns(), conductor.counters)
        except Exception as exc:  # as a duty cycle's: counted and logged, never the application's problem
            log.exception("sending publication %d failed", registration_id)
            conductor.record_error(f"send failed: {exc!r}")
            return 0

    def data_in_flight(self) -> bool:
        """In invoker mode, whether the application should invoke again soon even without input (see
        ``DriverConductor.data_in_flight``); False for a driver with its own thread."""
        conductor = self._conductor
        return self.is_invoker and conductor is not None and not self._closed and conductor.data_in_flight()

    def carries_network(self) -> bool:
        """In invoker mode, whether some stream goes over UDP (``DriverConductor.carries_network``): an
        application that polls its images between duty cycles must still run them for datagrams. False
        for a driver with its own thread."""
        conductor = self._conductor
        return self.is_invoker and conductor is not None and not self._closed and conductor.carries_network()

    def streams_deadline_ns(self) -> int | None:
        """In invoker mode, when a stream's timers next want a duty cycle (see
        ``DriverConductor.streams_deadline_ns``); None for a driver with its own thread, or none due."""
        conductor = self._conductor
        if not self.is_invoker or conductor is None or self._closed:
            return None
        deadline = conductor.streams_deadline_ns()
        return None if deadline >= 1 << 63 else conductor.clock.to_source_ns(deadline)

    def input_fileno(self) -> int | None:
        """In invoker mode, a descriptor readable while the driver has input waiting (a datagram, a
        client's command): an application that parks its loop waits on it too, then invokes. None
        otherwise (a driver thread reads its own input)."""
        conductor = self._conductor
        if not self.is_invoker or conductor is None or self._closed:
            return None
        return conductor.poller.fileno()

    def launch_embedded(self) -> MediaDriver:
        """Start, and serve on a daemon thread inside this process unless in invoker mode. An embedded
        driver removes its directory when it closes, unless ``dir_delete_on_shutdown`` is False."""
        self._embedded = True
        self.start()
        if not self.is_invoker:
            self._thread = threading.Thread(target=self.run, name=f"slipstream-driver:{self.directory}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ask ``run`` to return (from a signal handler or another thread)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def close(self, *, drain: bool = True) -> None:
        """Stop serving and release the directory (removing it, when ``DriverConfig.deletes_directory``).

        Closed UDP publications are first given time to finish (send what was offered, signal end
        of stream, linger), bounded by the publication linger: an embedded driver closing with its
        application must not drop data its ``offer`` calls accepted.
        ``drain=False``: the caller has just drained (``Context.close`` does, with its subscriptions
        still open), so closing does not wait again for publications that could not finish then.
        """
        if self._thread is not None:
            if drain:
                self.drain()
            self.stop()
        else:
            if self.is_invoker and drain:
                self.drain()
            self._shutdown()

    def drain(self) -> None:
        """Give closed UDP publications time to finish before the driver stops.

        First every byte offered is sent, while a receiver is connected (bounded by the publication
        linger plus a second); then up to half a second more for end of stream to be heard and
        acknowledged. Publications nobody receives are not waited for.
        """
        invoking = self.is_invoker and self._thread is None
        for _ in self.drain_steps():
            if not invoking:
                time.sleep(0.005)
            elif self.invoke() == 0:
                time.sleep(0.0002)

    def drain_steps(self) -> Iterator[None]:
        """``drain`` as steps: yields while closed publications are still finishing (the caller waits a
        moment, and invokes an invoker-mode driver, between steps), ends when they are done or the
        bounds passed. An asyncio application awaits between steps, so its other work (a server in the
        same process hearing the end of stream) goes on meanwhile."""
        conductor = self._conductor
        invoking = self.is_invoker and self._thread is None
        if conductor is None or self._closed or not (invoking or (self._thread and self._thread.is_alive())):
            return

        def closing() -> list[NetworkPublication]:
            return [p for p in list(conductor.network_publications.values()) if p.state is not PublicationState.ACTIVE]

        def unsent(p: NetworkPublication) -> bool:
            return p.sender.is_connected and p.sender.sender_position < p.log.producer_position()

        deadline = time.monotonic() + self.config.publication_linger_ns / 1e9 + 1.0
        while time.monotonic() < deadline and any(unsent(p) for p in closing()):
            yield
        deadline = min(deadline, time.monotonic() + 0.5)
        while time.monotonic() < deadline and any(p.sender.is_connected for p in closing()):
            yield

    def _shutdown(self, *, clean: bool = True) -> None:
        """Release everything; ``clean``: the driver had started and is closing, not failing to start."""
        if self._closed:
            return
        self._closed = True
        if self._conductor is not None:
            self._conductor.close()
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                (self.directory / SOCKET_FILE).unlink()
        if self._loss_report is not None:
            self._loss_report.close()
        if self._cnc is not None:
            self._cnc.state = STATE_CLOSED
            self._cnc.close()
        if clean and self.config.deletes_directory(embedded=self._embedded):
            self._remove_directory()
        self._release()
        log.info("media driver in %s stopped", self.directory)

    def _remove_directory(self) -> None:
        """Remove what this driver made, its lock file last and while it still holds the lock (a driver
        claiming the directory meanwhile waits, or makes a lock file of its own and so keeps the directory),
        then the directory if that emptied it. Clients of other processes keep what they mapped."""
        directory = self.directory
        try:
            for name in (PUBLICATIONS_DIR, IMAGES_DIR):
                shutil.rmtree(directory / name, ignore_errors=True)
            for name in (CNC_FILE, LOSS_REPORT_FILE, SOCKET_FILE, CONFIG_FILE, LOCK_FILE):
                with contextlib.suppress(FileNotFoundError):
                    (directory / name).unlink()
            directory.rmdir()
        except OSError as exc:  # files that are not the driver's (or a new driver's lock): they stay
            log.info("driver directory %s kept: %s", directory, exc.strerror or exc)

    def _release(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> MediaDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_settings(directory: Path, config: DriverConfig) -> None:
    """``driver.toml``: the settings this driver runs with, for any process to read (``running_config``,
    ``slipstream settings``); written whole, then renamed, so a reader never sees half of it."""
    partial = directory / f".{CONFIG_FILE}.{os.getpid()}"
    partial.write_text(format_config(config) + "\n", encoding="utf-8")
    partial.replace(directory / CONFIG_FILE)


def _claim(directory: Path) -> int:
    """The descriptor of ``directory``'s lock file, locked, the directory and the file made if missing.
    The locked file must still be the one at that path: a driver closing meanwhile may have removed it
    (and the directory), and then the claim starts over."""
    for _ in range(CLAIM_ATTEMPTS):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except (FileNotFoundError, FileExistsError):
            continue  # the directory went meanwhile (mkdir saw it, then found no directory: FileExistsError)
        except OSError as exc:
            raise directory_error(directory, exc) from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            holder = _lock_holder(directory)
            raise DriverAlreadyRunningError(
                f"a media driver{holder} already uses {directory}; attach to it, stop it, or choose another directory"
            ) from None
        if _is_file_at(lock_fd, directory / LOCK_FILE):
            return lock_fd
        os.close(lock_fd)
    raise DriverDirectoryError(
        f"cannot claim driver directory {directory}: it was removed {CLAIM_ATTEMPTS} times while this driver "
        "claimed it; try again"
    )


def _is_file_at(fd: int, path: Path) -> bool:
    try:
        here = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino)


def _lock_holder(directory: Path) -> str:
    try:
        pid = (directory / LOCK_FILE).read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""
