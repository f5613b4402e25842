"""``Context``: a client's connection to a media driver, embedded or standalone.

The context attaches to the driver serving its directory, or (by default) starts one on a thread of
this process when none runs. Commands go over a link to the driver (``client.links``): a slipstream
driver's socket, or the CnC file of the reference Aeron driver (``client.aeron_link``). A background
thread reads the driver's answers and image notifications and sends keep-alives. On a slipstream
driver that thread sleeps in ``recv``, so an idle client costs no CPU, and it notices at once when the
driver's process dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from ..driver.config import DriverConfig
from ..errors import (
    DriverAlreadyRunningError,
    DriverConfigError,
    DriverError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from ..files import commands as cmd
from ..files.cnc import PARKED_INDEX, CncError, CncFile, CncStartingError
from ..files.counters import APPLICATION_TYPE_ID_MIN, MAX_KEY_LENGTH, CountersReader
from ..files.directory import (
    CNC_FILE,
    LOCK_FILE,
    SOCKET_FILE,
    DirectoryHandle,
    default_directory,
    directory_error,
    map_file,
    raise_open_file_limit,
)
from ..files.doorbell import Doorbell, ring
from ..wire.uri import ChannelUri, check_supported
from ._args import check_callable, check_channel, check_stream_id
from .counter import Counter
from .errors import DriverLostError, DriverUnavailableError, RegistrationError, renewed
from .image import Image
from .links import WAKE, DriverLink, SocketLink
from .publication import ExclusivePublication, Publication
from .subscription import ImageHandler, Subscription

if TYPE_CHECKING:
    from ..driver.media_driver import MediaDriver

log = logging.getLogger("slipstream.client")

DriverMode = Literal["auto", "embedded", "external"]
_GRACE_MARGIN_S = 1.0
"""After the client thread itself did not run for a while (a keep-alive tick a whole interval late: its
process was stopped, the machine slept), the driver gets a keep-alive interval plus this to beat again
before its heartbeat is judged: it may have been stopped too, and not have run yet."""


T = TypeVar("T")
_Removal = type[cmd.RemovePublication] | type[cmd.RemoveSubscription] | type[cmd.RemoveCounter]
"""The command that takes back what a registration added."""


@dataclass(slots=True)
class _Pending:
    event: threading.Event
    response: cmd.DriverMessage | None = None
    error: DriverError | None = None
    callbacks: list[Callable[[], object]] = field(default_factory=list)

    def settle(self, response: cmd.DriverMessage | None, error: DriverError | None) -> None:
        """The answer (or the loss of the driver), from the client thread: waiters wake."""
        self.response, self.error = response, error
        self.event.set()
        for callback in self.callbacks:
            try:
                callback()
            except Exception:
                log.exception("registration callback failed")


class Registration(Generic[T]):
    """A command on its way to the driver (Aeron's ``asyncAddPublication`` / ``asyncAddSubscription``):
    :meth:`poll` returns None until the driver has answered, then the publication or subscription,
    or raises what the driver answered. An asyncio caller sends its commands and polls between awaits,
    so that its event loop goes on while the driver works (an invoker-mode driver works only inside
    ``Context.invoke``); :meth:`wait` is the blocking form, which ``add_*`` use."""

    __slots__ = (
        "_build",
        "_deadline",
        "_error",
        "_pending",
        "_remove",
        "_result",
        "_undo",
        "context",
        "registration_id",
    )

    def __init__(
        self,
        context: Context,
        registration_id: int,
        message: cmd.ClientMessage,
        build: Callable[[cmd.DriverMessage], T],
        *,
        remove: _Removal | None = None,
        undo: Callable[[], None] | None = None,
    ) -> None:
        self.context = context
        """The context the command went through."""
        self._remove = remove
        self.registration_id = registration_id
        """The command's correlation id: the registration id of what it adds."""
        self._build = build
        self._undo = undo
        self._result: T | None = None
        self._error: DriverError | None = None
        self._pending = _Pending(threading.Event())
        self._deadline = time.monotonic() + context.driver_timeout_s
        context._pending[registration_id] = self._pending
        try:
            context._send(message)
        except OSError as exc:
            self._fail(DriverLostError(f"cannot reach the media driver in {context.directory}: {exc}"))

    @property
    def done(self) -> bool:
        """True once the driver answered (or was lost), or the registration failed or was cancelled:
        :meth:`poll` then returns the stream or raises. (Past ``driver_timeout_s`` without an answer it
        is still False, and :meth:`poll` raises ``DriverUnavailableError``.)"""
        return self._result is not None or self._error is not None or self._pending.event.is_set()

    @property
    def remaining_s(self) -> float:
        """Seconds until the driver is given up on (``driver_timeout_s`` from the command; 0 past it)."""
        return max(0.0, self._deadline - time.monotonic())

    def add_done_callback(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once the driver answered (or was lost): on the client thread, or here if
        that happened already. It may be called twice, and must be quick and thread-safe (an asyncio
        waiter uses ``loop.call_soon_threadsafe``); it does not run when the driver never answers."""
        self._pending.callbacks.append(callback)
        if self._pending.event.is_set():
            callback()

    def poll(self) -> T | None:
        """What was added, once the driver answered; None before. Raises ``RegistrationError`` for the
        driver's refusal, ``DriverLostError`` / ``DriverUnavailableError`` when it went away or did not
        answer within the context's ``driver_timeout_s``."""
        if self._result is not None:
            return self._result
        if self._error is None:
            pending = self._pending
            if not pending.event.is_set():
                if time.monotonic() <= self._deadline:
                    return None
                self._fail(
                    DriverUnavailableError(
                        f"the media driver in {self.context.directory} did not answer within "
                        f"{self.context.driver_timeout_s:.1f} s"
                    )
                )
            elif pending.error is not None:
                self._fail(pending.error)
            elif isinstance(pending.response, cmd.ErrorResponse):
                self._fail(RegistrationError(pending.response.code, pending.response.message))
            else:
                assert pending.response is not None
                self.context._pending.pop(self.registration_id, None)
                self._result = self._build(pending.response)
                return self._result
        assert self._error is not None
        raise renewed(self._error)

    def wait(self) -> T:
        """Block until the driver answered (running an invoker-mode driver meanwhile); as :meth:`poll`."""
        context = self.context
        event = self._pending.event
        try:
            while (result := self.poll()) is None:
                if not context.is_invoker:
                    event.wait(max(0.0, self._deadline - time.monotonic()) + 1e-3)
                elif context.invoke() == 0:
                    event.wait(0.0002)
        except BaseException:
            self.cancel()  # interrupted: nothing half-added stays behind (a no-op after a refusal)
            raise
        return result

    def cancel(self) -> None:
        """Give up on the command (the caller was cancelled or failed meanwhile): what it added, now or
        once the driver gets to it, is removed again, and :meth:`poll` raises ``DriverError``."""
        if self._error is not None:
            return
        cancelled = DriverError(f"registration {self.registration_id} was cancelled")
        if self._result is not None:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
            self._result, self._error = None, cancelled
            return
        pending = self._pending
        refused = pending.event.is_set() and (
            pending.error is not None or isinstance(pending.response, cmd.ErrorResponse)
        )
        self._fail(cancelled)
        if not refused and self._remove is not None:
            self.context._remove(self._remove, self.registration_id)

    def _fail(self, error: DriverError) -> None:
        self._error = error
        self.context._pending.pop(self.registration_id, None)
        if self._undo is not None:
            self._undo()
            self._undo = None


class Context:
    """Entry point of the transport API: ``add_publication``, ``add_exclusive_publication`` and
    ``add_subscription``. Use it as a context manager; closing it closes everything it made.

    ``driver``: ``"auto"`` attaches to a running driver or starts an embedded one; ``"embedded"``
    always starts one here (and fails if the directory is in use); ``"external"`` only attaches.
    An embedded driver configured with ``threading_mode="invoker"`` has no thread: call
    :meth:`invoke` from the application's loop, or UDP traffic does not move. An embedded driver
    removes its directory when the context closes (``DriverConfig.dir_delete_on_shutdown``). With
    ``DriverConfig.unique_directory`` the context starts its driver in a directory of its own (``directory``).
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        driver: DriverMode = "auto",
        driver_config: DriverConfig | None = None,
        driver_timeout_s: float = 10.0,
        on_driver_lost: Callable[[DriverError], object] | None = None,
    ) -> None:
        if driver not in ("auto", "embedded", "external"):
            raise InvalidArgumentError(f"driver must be 'auto', 'embedded' or 'external': {driver!r}")
        if isinstance(driver_timeout_s, bool) or not isinstance(driver_timeout_s, int | float):
            raise InvalidArgumentTypeError(f"driver_timeout_s must be a number of seconds: {driver_timeout_s!r}")
        if not 0 < driver_timeout_s <= 86_400:
            raise InvalidArgumentError(f"driver_timeout_s must be in (0, 86400] seconds: {driver_timeout_s}")
        check_callable("on_driver_lost", on_driver_lost)
        if driver_config is not None and not isinstance(driver_config, DriverConfig):
            raise InvalidArgumentTypeError(f"driver_config must be a DriverConfig: {type(driver_config).__name__}")
        if directory is None:
            directory = driver_config.directory if driver_config is not None else default_directory()
        elif not isinstance(directory, str | Path):
            raise InvalidArgumentTypeError(f"directory must be a str or Path: {type(directory).__name__}")
        self.directory = Path(directory)
        if (
            driver_config is not None
            and driver_config.directory.absolute() != self.directory.absolute()
            and driver_config.directory != default_directory()  # a config that names no directory takes ours
        ):
            raise DriverConfigError(
                f"directory {self.directory} contradicts driver_config.directory {driver_config.directory}; "
                "give one of them (or the same directory)"
            )
        if driver_config is not None and driver_config.unique_directory:  # its own directory, so its own driver
            if driver == "external":
                raise InvalidArgumentError("driver_config.unique_directory needs a driver started here, not 'external'")
            driver_config = replace(driver_config, directory=self.directory).made_unique()
            self.directory, driver = driver_config.directory, "embedded"
        self.driver_timeout_s = driver_timeout_s
        self.on_driver_lost = on_driver_lost
        raise_open_file_limit()  # every log this context maps holds a descriptor
        self._driver_config = replace(driver_config or DriverConfig(), directory=self.directory)
        self._embedded: MediaDriver | None = None
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ignored: set[int] = set()  # correlation ids of commands whose answers nobody waits for
        self._publications: dict[int, ExclusivePublication] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._own_counters: dict[int, Counter] = {}
        self._closed = False
        self._undrained = False  # a publication closed since the embedded driver last drained
        self._driver_error: DriverError | None = None
        self._doorbell: Doorbell | None = None
        if driver == "embedded":
            self._embedded = self._launch_embedded()
        try:
            self._link, self._cnc = self._attach(driver)
            self.client_id = self._link.client_id
            self.driver_pid = self._link.driver_pid
            liveness_ns = self._link.client_liveness_timeout_ns
            self._keepalive_s = max(0.05, liveness_ns / 1e9 / 5)
            self._liveness_ms = max(1000, liveness_ns // 1_000_000)
        except BaseException:
            self._stop_embedded()
            raise
        self._counters = self._cnc.counters_reader()
        self._values = self._counters.values_i64
        self._thread = threading.Thread(target=self._run, name=f"slipstream-client:{self.client_id}", daemon=True)
        self._thread.start()

    # -- connection -------------------------------------------------------------------------------

    def _launch_embedded(self) -> MediaDriver:
        from ..driver.media_driver import MediaDriver  # the driver loads only in a process that starts one

        return MediaDriver(self._driver_config).launch_embedded()

    def _attach(self, mode: DriverMode) -> tuple[DriverLink, CncFile]:
        """The link to the driver serving the directory, and its CnC file: the reference Aeron driver's
        when its ``cnc.dat`` is there (not for ``"embedded"``), else a slipstream driver's socket."""
        aeron = None if mode == "embedded" else self._aeron_cnc(mode)
        if aeron is not None:
            from .aeron_link import AeronLink  # loads only for a context on aeronmd

            try:
                return AeronLink(aeron, self.driver_timeout_s), aeron
            except BaseException:
                aeron.close()
                raise
        sock = self._connect(mode)
        invoke = self.invoke if self.is_invoker else None  # then the driver answers only while we invoke it
        link = SocketLink(sock, self.directory, self.driver_timeout_s, invoke)
        try:
            return link, CncFile.open(self.directory)
        except BaseException:
            link.close()
            raise

    def _aeron_cnc(self, mode: DriverMode) -> CncFile | None:
        """The CnC file of a running reference Aeron driver in the directory, or None when the directory
        is a slipstream driver's (or empty: ``"auto"`` then starts one). A stopped Aeron driver's file is
        an error for ``"external"``; ``"auto"`` starts a slipstream driver in its place."""
        deadline = time.monotonic() + self.driver_timeout_s
        while True:
            if not (self.directory / CNC_FILE).is_file() or (self.directory / SOCKET_FILE).exists():
                return None
            try:
                cnc = CncFile.open(self.directory)
            except CncStartingError:  # a driver (either kind) is writing it: its version comes last
                cnc = None
            except CncError:
                if mode == "external":
                    raise
                return None
            if cnc is not None and (cnc.flavour != "aeron" or cnc.heartbeat_ms != 0 or time.monotonic() >= deadline):
                break
            if cnc is not None:
                cnc.close()  # aeronmd has not beaten yet: it is starting
            elif time.monotonic() >= deadline:
                return None  # the socket wait says what is missing
            time.sleep(0.01)
        if cnc.flavour != "aeron":
            cnc.close()
            return None
        age_ms = time.time_ns() // 1_000_000 - cnc.heartbeat_ms
        if age_ms <= cnc.header.client_liveness_timeout_ns // 1_000_000:
            return cnc
        cnc.close()
        if mode == "external":
            raise DriverUnavailableError(
                f"the Aeron media driver in {self.directory} is not running: its heartbeat is {age_ms} ms old"
            )
        return None

    def _connect(self, mode: DriverMode) -> socket.socket:
        deadline = time.monotonic() + self.driver_timeout_s
        last_error: OSError | None = None
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                handle = DirectoryHandle(self.directory) if self.directory.is_dir() else None
                if handle is None:
                    raise FileNotFoundError(self.directory)
                try:
                    sock.connect(handle.socket_path())
                finally:
                    handle.close()
                return sock
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                last_error = exc
                if mode == "auto" and self._embedded is None:
                    try:
                        self._embedded = self._launch_embedded()
                        continue
                    except DriverAlreadyRunningError:
                        pass  # another process is starting one: wait for its socket
            except PermissionError as exc:
                sock.close()
                raise directory_error(self.directory, exc) from None
            except OSError as exc:
                sock.close()
                last_error = exc
            if mode == "external" and isinstance(last_error, ConnectionRefusedError) and not self._driver_alive():
                raise DriverUnavailableError(
                    f"no media driver runs in {self.directory}: its socket refuses connections and the driver "
                    "that made it is gone; start one with `slipstream driver --dir DIR`"
                )
            if time.monotonic() >= deadline:
                hint = "start one with `slipstream driver --dir DIR`" if mode == "external" else "check its log"
                raise DriverUnavailableError(
                    f"no media driver answers in {self.directory} after {self.driver_timeout_s:.1f} s "
                    f"({last_error}); {hint}"
                )
            time.sleep(0.01)

    def _driver_running(self) -> bool:
        """Whether the driver still runs: its process exists and its heartbeat is fresh."""
        try:
            os.kill(self.driver_pid, 0)
            age_ms = time.time_ns() // 1_000_000 - self._cnc.heartbeat_ms
        except ProcessLookupError:
            return False
        except (OSError, ValueError, CncError):
            return True  # another user's process; a heartbeat we cannot read is no evidence
        return age_ms <= self._liveness_ms

    def _driver_alive(self) -> bool:
        """Whether the process named in the directory's lock file still exists (a starting driver writes it
        before it opens its socket, so a refused connection with no such process means a dead driver)."""
        try:
            pid_text = (self.directory / LOCK_FILE).read_text().strip()
        except OSError:
            return False
        if not pid_text.isdigit():
            return False
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True  # exists, owned by another user
        return True

    # -- client thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        link = self._link
        last_tick, last_tick_wall = time.monotonic(), time.time()
        last_gap = 0.0  # between the last two keep-alive ticks: long if this thread was stopped in between
        next_keepalive = last_tick + self._keepalive_s
        judge_after = 0.0  # the driver's heartbeat is not judged before this (a grace after our own stall)
        while not self._closed:
            try:
                messages = link.receive(max(0.0, next_keepalive - time.monotonic()))
            except ValueError as exc:  # cmd.CommandError, AeronProtocolError
                if not self._closed:
                    self._lose_driver(DriverLostError(f"garbled message from the driver: {exc}"))
                return
            if messages is None:
                if not self._closed:
                    silent_s = max(time.monotonic() - last_tick, last_gap)
                    self._lose_driver(DriverLostError(link.closed_reason() or self._went_away(silent_s)))
                return
            for message in messages:
                try:
                    self._dispatch(message)
                except Exception:
                    log.exception("error while handling %r", message)
            now = time.monotonic()
            if now >= next_keepalive:
                wall = time.time()
                last_gap = max(now - last_tick, wall - last_tick_wall)
                if last_gap > 2 * self._keepalive_s:
                    # This thread did not run for a while (wall time covers a machine that slept). A
                    # heartbeat read now may look old only because the driver has not run since either
                    # (an embedded one stopped with us): give it an interval and a margin to beat again.
                    judge_after = now + self._keepalive_s + _GRACE_MARGIN_S
                last_tick, last_tick_wall = now, wall
                next_keepalive = now + self._keepalive_s
                if not self._send_keepalive():
                    next_keepalive = now + 0.01  # a command was being sent: try again soon
                # (An invoker-mode driver beats only when the application invokes it.)
                if now >= judge_after and not self.is_invoker:
                    age_ms = int(wall * 1000) - self._cnc.heartbeat_ms
                    if age_ms > self._liveness_ms:
                        # Alive enough to keep its socket open, but its conductor stopped (hung, stopped).
                        self._lose_driver(
                            DriverLostError(
                                f"the media driver in {self.directory} stopped its heartbeat {age_ms} ms ago"
                            )
                        )
                        return

    def _went_away(self, silent_s: float) -> str:
        """Why the driver's socket closed. ``silent_s``: the longest this thread went lately without a
        keep-alive; past the liveness timeout with the driver still running, the driver dropped us."""
        if self.driver_pid != os.getpid() and silent_s > self._liveness_ms / 1000 and self._driver_running():
            return (
                f"the media driver (pid {self.driver_pid}) in {self.directory} closed this client's connection: "
                f"this process sent no keep-alive for {silent_s:.1f} s (stopped?), more than the driver's "
                f"client liveness timeout ({self._liveness_ms / 1000:.1f} s), so the driver released what it held"
            )
        where = "this process" if self.driver_pid == os.getpid() else f"pid {self.driver_pid}"
        text = f"the media driver ({where}) in {self.directory} went away"
        if self.driver_pid != os.getpid():
            text += (
                "; if it was the embedded driver of another process, that process ended: for several processes, "
                f"run a standalone driver (`slipstream driver --dir {self.directory}`) and attach with "
                'driver="external"'
            )
        return text

    def _dispatch(self, message: cmd.DriverMessage) -> None:
        match message:
            case cmd.ImageAvailable():
                self._on_image_available(message)
            case cmd.ImageUnavailable():
                subscription = self._subscriptions.get(message.subscription_registration_id)
                if subscription is not None:
                    subscription._remove_image(message.correlation_id)
                    self._ring_doorbell()
            case (
                cmd.PublicationReady()
                | cmd.SubscriptionReady()
                | cmd.CounterReady()
                | cmd.OperationSuccess()
                | cmd.ErrorResponse()
            ):
                pending = self._pending.get(message.correlation_id)
                if pending is not None:
                    pending.settle(message, None)
                elif message.correlation_id in self._ignored:
                    self._ignored.discard(message.correlation_id)
                    if isinstance(message, cmd.ErrorResponse):
                        log.warning("the driver refused a removal: %s %s", message.code, message.message)
                elif isinstance(message, cmd.ErrorResponse):
                    log.warning("driver error: %s %s", message.code, message.message)
            case _:
                log.warning("unexpected message from the driver: %r", message)

    def _on_image_available(self, message: cmd.ImageAvailable) -> None:
        subscription = self._subscriptions.get(message.subscription_registration_id)
        if subscription is None or subscription.is_closed:
            return
        try:
            mapping = map_file(Path(message.log_file), writable=False)
        except (OSError, ValueError) as exc:
            log.warning("cannot map image log %s: %s", message.log_file, exc)
            return
        image = Image(
            subscription_registration_id=message.subscription_registration_id,
            correlation_id=message.correlation_id,
            session_id=message.session_id,
            stream_id=message.stream_id,
            source_identity=message.source_identity,
            mapping=mapping,
            position_values=self._values,
            position_index=self._counters.value_index(message.subscriber_position_counter_id),
            join_position=message.join_position,
            log_path=Path(message.log_file),
            parking_slot=message.parking_slot,
        )
        subscription._add_image(image)
        self._ring_doorbell()  # a reader parked on this subscription should poll the new image now

    def _lose_driver(self, error: DriverError) -> None:
        with self._state_lock:
            if self._driver_error is not None:
                return
            self._driver_error = error
        log.error("%s", error)
        for pending in list(self._pending.values()):
            pending.settle(None, error)
        for publication in list(self._publications.values()):
            publication._lose(error)
        for subscription in list(self._subscriptions.values()):
            subscription._lose(error)
        self._ring_doorbell()  # parked readers raise DriverLostError now, not after their timeout
        if self.on_driver_lost is not None:
            try:
                self.on_driver_lost(error)
            except Exception:
                log.exception("on_driver_lost handler failed")

    # -- invoker mode -----------------------------------------------------------------------------

    @property
    def is_invoker(self) -> bool:
        """True when this context's embedded driver runs only inside :meth:`invoke`."""
        embedded = self._embedded
        return embedded is not None and embedded.is_invoker

    def invoker_fileno(self) -> int | None:
        """For an invoker-mode embedded driver: a descriptor readable while it has input (datagrams,
        commands) that only :meth:`invoke` will take in; a parked event loop waits on it. Else None."""
        embedded = self._embedded
        return embedded.input_fileno() if embedded is not None else None

    def invoker_busy(self) -> bool:
        """For an invoker-mode embedded driver: whether some stream has data in flight, so
        :meth:`invoke` is due again within a millisecond or so even if :meth:`invoker_fileno` stays
        quiet (a parked loop's cue not to sleep long). False otherwise."""
        embedded = self._embedded
        return embedded is not None and embedded.data_in_flight()

    def invoker_carries_network(self) -> bool:
        """For an invoker-mode embedded driver: whether some stream goes over UDP, so datagrams may wait
        for :meth:`invoke` at any moment (over IPC alone, what it does can wait a little: publication
        limits, commands). False otherwise."""
        embedded = self._embedded
        return embedded is not None and embedded.carries_network()

    def invoker_deadline_ns(self) -> int | None:
        """For an invoker-mode embedded driver: the monotonic time (ns) its streams' timers (heartbeats,
        status messages, NAKs) next want :meth:`invoke`, even if no input arrives; None otherwise."""
        embedded = self._embedded
        return embedded.streams_deadline_ns() if embedded is not None else None

    def invoke(self) -> int:
        """Run one duty cycle of an invoker-mode embedded driver on this thread and return the work it
        did; 0 (and nothing done) when the driver has its own thread or process, so a loop may call it
        unconditionally. Call it from one thread: the one that polls and offers."""
        embedded = self._embedded
        if embedded is None or not embedded.is_invoker:
            return 0
        return embedded.invoke()

    def send_now(self, publication: Publication | ExclusivePublication) -> int:
        """For an invoker-mode embedded driver: send what ``publication`` (a UDP one) holds now, from
        this thread, instead of at the next :meth:`invoke`; the datagrams sent. 0 (nothing done) when
        the driver has its own thread or process, or for IPC."""
        embedded = self._embedded
        if embedded is None or not embedded.is_invoker:
            return 0
        return embedded.send_now(publication.registration_id)

    # -- commands ---------------------------------------------------------------------------------

    def _send(self, message: cmd.ClientMessage) -> None:
        """Send a command whole, one sender at a time (see the link's ``send``)."""
        with self._send_lock:
            self._link.send(message)

    def _send_keepalive(self) -> bool:
        """From the client thread, which must never wait to send (in invoker mode only the application's
        thread makes room): a keep-alive, or none now. False when a command was being sent."""
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            return self._link.send_keepalive()
        finally:
            self._send_lock.release()

    def _next_correlation_id(self) -> int:
        with self._state_lock:
            return self._link.next_correlation_id()

    def _check_usable(self) -> None:
        if self._driver_error is not None:
            raise renewed(self._driver_error)
        if self._closed:
            raise RuntimeError("the context is closed")

    def _request(self, correlation_id: int, message: cmd.ClientMessage) -> cmd.DriverMessage:
        return Registration(self, correlation_id, message, _answer).wait()

    def add_publication(self, channel: str, stream_id: int) -> Publication:
        """A publication that several threads of this process may offer to."""
        publication = self.async_add_publication(channel, stream_id).wait()
        assert isinstance(publication, Publication)
        return publication

    def add_exclusive_publication(self, channel: str, stream_id: int) -> ExclusivePublication:
        """A publication for one writer thread: the fastest way to offer."""
        return self.async_add_exclusive_publication(channel, stream_id).wait()

    def async_add_publication(self, channel: str, stream_id: int) -> Registration[ExclusivePublication]:
        """``add_publication`` without waiting for the driver: poll the registration for a ``Publication``."""
        return self._add_publication(channel, stream_id, exclusive=False)

    def async_add_exclusive_publication(self, channel: str, stream_id: int) -> Registration[ExclusivePublication]:
        """``add_exclusive_publication`` without waiting for the driver: poll the registration."""
        return self._add_publication(channel, stream_id, exclusive=True)

    def _add_publication(self, channel: str, stream_id: int, *, exclusive: bool) -> Registration[ExclusivePublication]:
        channel = _check_channel_args(channel, stream_id)
        self._check_usable()
        correlation_id = self._next_correlation_id()

        def build(response: cmd.DriverMessage) -> ExclusivePublication:
            assert isinstance(response, cmd.PublicationReady)
            mapping = map_file(Path(response.log_file))
            cls = ExclusivePublication if exclusive else Publication
            publication = cls(
                channel=channel,
                stream_id=stream_id,
                session_id=response.session_id,
                registration_id=response.registration_id,
                mapping=mapping,
                limit_values=self._values,
                limit_index=self._counters.value_index(response.publication_limit_counter_id),
                on_close=self._close_publication,
                manage_destination=self._manage_destination,
                # A driver that sends UDP may park; an invoker-mode one only runs when this process invokes it.
                doorbell=(self._cnc.header_i64, PARKED_INDEX, self._ring)
                if channel.startswith("aeron:udp") and self._link.parks and not self.is_invoker
                else None,
            )
            self._publications[response.registration_id] = publication
            return publication

        message = cmd.AddPublication(correlation_id, channel, stream_id, exclusive)
        return Registration(self, correlation_id, message, build, remove=cmd.RemovePublication)

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        *,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
    ) -> Subscription:
        """Subscribe; images of matching publishers appear (and the callbacks run, on the client's
        thread) as publishers come and go.

        Raises ``TypeError``/``ValueError`` (both ``SlipstreamError``) naming a bad argument before
        anything reaches the driver; ``UnsupportedChannelError`` for a channel feature the driver lacks."""
        return self.async_add_subscription(
            channel, stream_id, on_available_image=on_available_image, on_unavailable_image=on_unavailable_image
        ).wait()

    def async_add_subscription(
        self,
        channel: str,
        stream_id: int,
        *,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
    ) -> Registration[Subscription]:
        """``add_subscription`` without waiting for the driver: poll the registration for the
        subscription (images that come meanwhile are kept for it)."""
        channel = _check_channel_args(channel, stream_id)
        check_callable("on_available_image", on_available_image)
        check_callable("on_unavailable_image", on_unavailable_image)
        self._check_usable()
        correlation_id = self._next_correlation_id()
        subscription = Subscription(
            channel=channel,
            stream_id=stream_id,
            registration_id=correlation_id,
            on_available_image=on_available_image,
            on_unavailable_image=on_unavailable_image,
            on_close=self._close_subscription,
            doorbell=lambda: self.doorbell,
        )
        self._subscriptions[correlation_id] = subscription

        def undo() -> None:
            self._subscriptions.pop(correlation_id, None)
            subscription._release_all()

        message = cmd.AddSubscription(correlation_id, channel, stream_id)
        return Registration(
            self, correlation_id, message, lambda _: subscription, remove=cmd.RemoveSubscription, undo=undo
        )

    def add_counter(self, type_id: int, label: str, key: bytes = b"") -> Counter:
        """A counter of this client's own in the driver's counters file (Aeron's ``addCounter``):
        ``slipstream stat`` and every reader of the file see it under ``label``; this process writes its
        value. ``type_id`` from ``APPLICATION_TYPE_ID_MIN`` (1000) on: lower ones are the driver's. It is
        freed by ``Counter.close``, with this context, or when this process goes away."""
        return self.async_add_counter(type_id, label, key).wait()

    def async_add_counter(self, type_id: int, label: str, key: bytes = b"") -> Registration[Counter]:
        """``add_counter`` without waiting for the driver: poll the registration for the counter."""
        if isinstance(type_id, bool) or not isinstance(type_id, int):
            raise InvalidArgumentTypeError(f"type_id must be an int: {type_id!r}")
        if not APPLICATION_TYPE_ID_MIN <= type_id < 1 << 31:
            raise InvalidArgumentError(f"type_id must be in [{APPLICATION_TYPE_ID_MIN}, 2**31): {type_id}")
        if not isinstance(label, str):
            raise InvalidArgumentTypeError(f"label must be a str: {label!r}")
        if not isinstance(key, bytes):
            raise InvalidArgumentTypeError(f"key must be bytes: {key!r}")
        if len(key) > MAX_KEY_LENGTH:
            raise InvalidArgumentError(f"key must be at most {MAX_KEY_LENGTH} bytes, not {len(key)}")
        self._check_usable()
        correlation_id = self._next_correlation_id()

        def build(response: cmd.DriverMessage) -> Counter:
            assert isinstance(response, cmd.CounterReady)
            counter = Counter(
                counter_id=response.counter_id,
                registration_id=correlation_id,
                type_id=type_id,
                label=label,
                values=self._values,
                index=self._counters.value_index(response.counter_id),
                on_close=self._close_counter,
            )
            self._own_counters[correlation_id] = counter
            return counter

        message = cmd.AddCounter(correlation_id, type_id, label, key)
        return Registration(self, correlation_id, message, build, remove=cmd.RemoveCounter)

    def _close_counter(self, counter: Counter) -> None:
        self._own_counters.pop(counter.registration_id, None)
        self._remove(cmd.RemoveCounter, counter.registration_id)

    @property
    def doorbell(self) -> Doorbell:
        """This context's doorbell (made on first use, closed with the context): asyncio readers park on
        it, and writers of the logs they read ring it (see ``slipstream.files.doorbell``)."""
        bell = self._doorbell
        if bell is None:
            with self._state_lock:
                bell = self._doorbell
                if bell is None:
                    if self._closed:
                        raise RuntimeError("the context is closed")
                    bell = self._doorbell = Doorbell()
        return bell

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The subscriptions this context made that are still open (a snapshot)."""
        return tuple(s for s in list(self._subscriptions.values()) if not s.is_closed)

    def _ring_doorbell(self) -> None:
        """Wake this context's parked readers: their images changed or the driver went away."""
        bell = self._doorbell
        if bell is not None:
            ring(bell.number)

    def _ring(self) -> None:
        """Wake a parked driver: it has datagrams to send for us."""
        with contextlib.suppress(OSError):
            self._send(WAKE)

    def _manage_destination(self, registration_id: int, channel: str, add: bool) -> None:
        channel = str(check_channel("channel", channel))
        self._check_usable()
        correlation_id = self._next_correlation_id()
        kind = cmd.AddDestination if add else cmd.RemoveDestination
        self._request(correlation_id, kind(correlation_id, registration_id, channel))

    def _close_publication(self, publication: ExclusivePublication) -> None:
        self._publications.pop(publication.registration_id, None)
        self._remove(cmd.RemovePublication, publication.registration_id)
        publication._release()

    def _close_subscription(self, subscription: Subscription) -> None:
        self._subscriptions.pop(subscription.registration_id, None)
        self._remove(cmd.RemoveSubscription, subscription.registration_id)
        subscription._release_all()
        self._ring_doorbell()

    def _remove(self, kind: _Removal, registration_id: int) -> None:
        """Tell the driver, without waiting for its answer (as Aeron's clients close): commands are
        handled in order, so whatever this context asks next sees the removal done. A refusal is logged."""
        if kind is cmd.RemovePublication and self._driver_error is None and not self._closed:
            self._undrained = True
        self._tell(lambda correlation_id: kind(correlation_id, registration_id), f"closing {registration_id}")

    def reject_image(self, image: Image, reason: str) -> None:
        """Refuse an image of one of our UDP subscriptions (Aeron's ``Image.reject``): the driver sends its
        publisher an ERR frame carrying ``reason`` and removes the image (``ImageUnavailable`` follows).
        Not awaited; a refusal (an image already gone) is logged."""
        self._tell(lambda correlation_id: cmd.RejectImage(correlation_id, image.correlation_id, reason[:256]), "reject")

    def _tell(self, build: Callable[[int], cmd.ClientMessage], what: str) -> None:
        """Send a command without waiting for its answer (a refusal is logged when it comes)."""
        if self._driver_error is not None or self._closed:
            return
        correlation_id = self._next_correlation_id()
        self._ignored.add(correlation_id)
        try:
            self._send(build(correlation_id))
        except OSError as exc:
            self._ignored.discard(correlation_id)  # no answer is coming: a drain must not wait for it
            log.warning("%s: %s", what, exc)

    # -- observation ------------------------------------------------------------------------------

    def counters(self) -> CountersReader:
        """The driver's counters, read live from shared memory."""
        return self._counters

    @property
    def driver_error(self) -> DriverError | None:
        """Why the driver is gone, once it is."""
        return self._driver_error

    @property
    def is_embedded(self) -> bool:
        """True when this context started the driver it uses."""
        return self._embedded is not None

    # -- closing ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every publication and subscription, detach from the driver, stop an embedded driver."""
        if self._closed:
            return
        for publication in list(self._publications.values()):
            publication.close()
        if self._embedded is not None and self._driver_error is None and self._undrained:
            # Our own subscriptions stay open meanwhile: they answer end of stream, which ends a linger.
            for _ in self._removals():
                if self.invoke() == 0:
                    time.sleep(0.0002)
            self._embedded.drain()
        for subscription in list(self._subscriptions.values()):
            subscription.close()
        for counter in self._own_counters.values():
            counter._release()  # the driver frees them with this client
        self._own_counters.clear()
        self._closed = True
        with self._send_lock:
            self._link.shutdown()
        self._thread.join(self.driver_timeout_s)
        self._link.close()
        with contextlib.suppress(CncError, BufferError):
            self._cnc.close()
        self._stop_embedded()
        if self._doorbell is not None:
            self._doorbell.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "driver lost" if self._driver_error is not None else "open"
        return f"Context(directory={str(self.directory)!r}, embedded={self.is_embedded}, {state})"

    def _stop_embedded(self) -> None:
        if self._embedded is not None:
            self._embedded.close(drain=False)  # close() drained already, with our subscriptions open
            self._embedded = None

    def drain_steps(self) -> Iterator[None]:
        """The first half of ``close`` as steps: every publication closes and the embedded driver
        drains (see ``MediaDriver.drain_steps``); none without one. ``close`` drains by itself; an
        asyncio caller drains first, awaiting between steps, so that closing does not stop its event
        loop for up to a second, and ``close`` then does not wait again for what just finished (or
        could not: a publication whose receiver went away is given up on once)."""
        if self._embedded is None or self._driver_error is not None or self._closed:
            return
        for publication in list(self._publications.values()):
            publication.close()
        yield from self._removals()
        yield from self._embedded.drain_steps()
        self._undrained = False

    def _removals(self) -> Iterator[None]:
        """Yields until the driver answered every removal sent (at most ``driver_timeout_s``): a drain
        must see the closed publications closing, not still active."""
        deadline = time.monotonic() + self.driver_timeout_s
        while self._ignored and self._driver_error is None and time.monotonic() < deadline:
            yield

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _answer(response: cmd.DriverMessage) -> cmd.DriverMessage:
    return response


def _check_channel_args(channel: object, stream_id: object) -> str:
    """Check ``add_*`` arguments at the call, before anything is sent: a bad one raises here, naming it."""
    uri: ChannelUri = check_channel("channel", channel)
    check_supported(uri)
    check_stream_id("stream_id", stream_id)
    return channel if isinstance(channel, str) else str(uri)
