"""Media driver configuration: every default in one place."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from .._extras import require_extra
from ..errors import DriverConfigError
from ..files.directory import default_directory
from ..files.idle import idle_strategy
from ..protocol.defaults import (
    IMAGE_LIVENESS_TIMEOUT_NS,
    PUBLICATION_CONNECTION_TIMEOUT_NS,
    PUBLICATION_HEARTBEAT_TIMEOUT_NS,
    STATUS_MESSAGE_TIMEOUT_NS,
)
from ..wire.constants import IPC_TERM_DEFAULT_LENGTH, MTU_DEFAULT, TERM_DEFAULT_LENGTH
from ..wire.positions import check_mtu, check_term_length, max_message_length

RESERVED_SESSION_ID_LOW_DEFAULT: Final = -1
RESERVED_SESSION_ID_HIGH_DEFAULT: Final = 1000
"""Session ids the driver never picks by itself, as Aeron's reserved range (explicit ids go there)."""

MS = 1_000_000
S = 1_000_000_000
THREADING_MODES = ("dedicated", "invoker")
STALL_THRESHOLD_MAX_DEFAULT_NS: Final = 2 * S
"""The default stall threshold's ceiling: a peer's silence before a stall plus it stays under the streams'
own timeouts (a status message at most 2.5 s apart against a 5 s connection timeout)."""
_UNIQUE = itertools.count(1)
MAX_DURATION_NS: Final = 365 * 24 * 3600 * S
"""Longest duration setting: well inside the 64-bit fields the driver stores durations in."""


@dataclass(slots=True)
class DriverConfig:
    """Settings of a media driver. Durations are nanoseconds, sizes bytes.

    Attributes:
        directory (Path): The driver directory (cnc.dat, the log buffers, the command socket): ``$SLIPSTREAM_DIR``, else
            ``/dev/shm/slipstream-<user>``. Default ``default_directory()``.
        client_liveness_timeout_ns (int): A client that sent nothing (not even a keep-alive) for this long is considered
            dead. Default ``5 * S`` (5000000000).
        publication_linger_ns (int): How long a closed UDP publication stays to answer NAKs for its tail before it is
            freed (a channel's ``linger`` overrides it). Default ``5 * S`` (5000000000).
        publication_unblock_timeout_ns (int): A closed publication whose last claim was never committed is padded after
            this long. Default ``5 * S`` (5000000000).
        stall_threshold_ns (int | None): A gap between two duty cycles longer than this is the driver's own stall (its
            process was stopped, or an invoker-mode application did not invoke): the timeouts above, and the streams'
            (image liveness, a publication's connection), count it as this long only, so a stopped process does not find
            its own clients dead on resume (see ``driver.clock``). A peer's silence just before a stall plus this must
            stay under those timeouts. None: a third of the client liveness timeout, at most 2 s (1.67 s by default).
            Idle cycles of a driver thread are a millisecond apart; an idle invoker-mode application invokes at least
            once a second (its keep-alives wake it). Default ``None``.
        ipc_term_length (int): Term length of IPC publications: a power of two from 64 KiB to 1 GiB (a channel's
            ``term-length`` overrides it). Default ``IPC_TERM_DEFAULT_LENGTH`` (67108864).
        ipc_mtu (int): Largest frame of an IPC publication, a multiple of 32 (a channel's ``mtu`` overrides it); longer
            messages are fragmented. Default ``MTU_DEFAULT`` (1408).
        ipc_publication_window (int | None): Bytes a publisher may run ahead of its slowest subscriber; None means half
            a term. Default ``None``.
        udp_term_length (int): Term length of UDP publications and images, as ``ipc_term_length``. Default
            ``TERM_DEFAULT_LENGTH`` (16777216).
        udp_mtu (int): Largest datagram of a UDP publication, header included, as ``ipc_mtu``. Default ``MTU_DEFAULT``
            (1408).
        receiver_window (int): Receiver window of UDP images, capped at half a term (``rcv-wnd`` overrides it per
            channel). Aeron's default is 128 KiB; a Python driver repairs a gap in about a millisecond rather than
            microseconds, so a larger window keeps data flowing while gaps are repaired (at 5 % loss this doubles
            throughput). Default ``1024 * 1024`` (1048576).
        so_rcvbuf (int | None): SO_RCVBUF of UDP sockets (``so-rcvbuf`` overrides it); None keeps the OS default. Sized
            for the receiver window (the kernel may grant less: ``net.core.rmem_max``); a window is never larger than
            the buffer the socket really got, as the reference requires. Default ``2 * 1024 * 1024`` (2097152).
        so_sndbuf (int | None): SO_SNDBUF of UDP sockets; None keeps the OS default. Default ``None``.
        udp_gso (bool): Linux UDP segmentation and receive offload (UDP_SEGMENT, UDP_GRO): up to 64 datagrams per system
            call each way, still separate Aeron datagrams on the wire. Turned off by itself where the kernel or the
            route refuses it. Default ``True``.
        counters_capacity (int): Counters cnc.dat has room for: the system counters, each stream's positions,
            applications' own. Default ``8192``.
        error_log_length (int): Bytes of the distinct-error log in cnc.dat (a multiple of 8). Default ``1024 * 1024``
            (1048576).
        idle_strategy (str): How the driver thread waits when it has nothing to do: ``backoff`` (spin, yield, then
            park), ``busy-spin`` (``spin``), ``yield`` or ``sleep``. Default ``"backoff"``.
        threading_mode (str): ``dedicated``: an embedded driver runs on a thread of its own. ``invoker``: it has no
            thread; the application runs its duty cycle by calling ``Context.invoke()`` from its own loop (Aeron's
            INVOKER mode). In CPython a driver thread shares the GIL with the application, so for the lowest latency the
            application's polling loop drives the driver itself. Ignored by ``slipstream driver``. Default
            ``"dedicated"``.
        reserved_session_id_low (int): Lowest of the session ids the driver never picks by itself (Aeron's reserved
            range, where a channel's explicit ``session-id`` goes). Default ``RESERVED_SESSION_ID_LOW_DEFAULT`` (-1).
        reserved_session_id_high (int): Highest of those session ids. Default ``RESERVED_SESSION_ID_HIGH_DEFAULT``
            (1000).
        timer_interval_ns (int): How often the conductor runs its chores: heartbeats, client liveness, the error log and
            counters. Default ``100 * MS`` (100000000).
        idle_heartbeat_max_ns (int | None): While a publication sends nothing new, its heartbeats after the first come
            this far apart (at most 5 s; None: every 100 ms, as Aeron). The first heartbeat after data is never delayed
            (it reveals a lost tail); later ones only keep the receiver's image alive. Default ``None``.
        idle_status_message_max_ns (int | None): While an image's position stays put, its timed status messages after
            the first come this far apart (at most 2.5 s, half the sender's connection timeout; None: every 200 ms, as
            Aeron). Default ``None``.
        record_directory (Path | None): The standalone driver (``slipstream driver``, whose ``--record DIR`` overrides
            it) records its counters, loss report and error log into this directory as Parquet segments (the
            ``telemetry`` extra); None records nothing. An embedded driver ignores it: a process records its own
            endpoints with ``RecordingConfig``. Default ``None``.
        record_interval_ns (int): Time between two samples of that recording. Default ``1 * S`` (1000000000).
        dir_delete_on_shutdown (bool | None): Remove the directory when the driver closes cleanly (Aeron's
            ``dirDeleteOnShutdown``): its own files (cnc.dat, the loss report, the log buffers, socket and lock), then
            the directory if that left it empty. None: yes for an embedded driver (``Context``, ``launch_embedded``),
            whose directory is a detail of one process; no for ``slipstream driver``, whose counters, error log and loss
            report stay readable (``slipstream stat | errors | loss``) after it stopped. Removed even while clients of
            other processes are attached, as Aeron does: they lost their driver either way, and what they mapped stays
            valid (files are unlinked, never truncated). A crashed driver removes nothing; the next one to claim the
            directory cleans it. Default ``None``.
        unique_directory (bool): Run in a directory of this driver's own, ``<directory>-<pid>-<n>``, instead of
            ``directory`` itself, so two processes (or two endpoints of one) never collide over one directory. Only a
            driver started here can be there: a ``Context`` with it starts an embedded driver (``driver="external"`` is
            refused), and no other process attaches to it (no shared IPC with them). Default off: one directory per
            host, shared. Default ``False``.
    """

    directory: Path = field(default_factory=default_directory)
    """The driver directory (cnc.dat, the log buffers, the command socket): ``$SLIPSTREAM_DIR``, else
    ``/dev/shm/slipstream-<user>``."""
    client_liveness_timeout_ns: int = 5 * S
    """A client that sent nothing (not even a keep-alive) for this long is considered dead."""
    publication_linger_ns: int = 5 * S
    """How long a closed UDP publication stays to answer NAKs for its tail before it is freed (a channel's
    ``linger`` overrides it)."""
    publication_unblock_timeout_ns: int = 5 * S
    """A closed publication whose last claim was never committed is padded after this long."""
    stall_threshold_ns: int | None = None
    """A gap between two duty cycles longer than this is the driver's own stall (its process was
    stopped, or an invoker-mode application did not invoke): the timeouts above, and the streams'
    (image liveness, a publication's connection), count it as this long only, so a stopped process
    does not find its own clients dead on resume (see ``driver.clock``). A peer's silence just before
    a stall plus this must stay under those timeouts. None: a third of the client liveness timeout, at
    most 2 s (1.67 s by default). Idle cycles of a driver thread are a millisecond apart; an idle
    invoker-mode application invokes at least once a second (its keep-alives wake it)."""
    ipc_term_length: int = IPC_TERM_DEFAULT_LENGTH
    """Term length of IPC publications: a power of two from 64 KiB to 1 GiB (a channel's ``term-length``
    overrides it)."""
    ipc_mtu: int = MTU_DEFAULT
    """Largest frame of an IPC publication, a multiple of 32 (a channel's ``mtu`` overrides it); longer
    messages are fragmented."""
    ipc_publication_window: int | None = None
    """Bytes a publisher may run ahead of its slowest subscriber; None means half a term."""
    udp_term_length: int = TERM_DEFAULT_LENGTH
    """Term length of UDP publications and images, as ``ipc_term_length``."""
    udp_mtu: int = MTU_DEFAULT
    """Largest datagram of a UDP publication, header included, as ``ipc_mtu``."""
    receiver_window: int = 1024 * 1024
    """Receiver window of UDP images, capped at half a term (``rcv-wnd`` overrides it per channel).
    Aeron's default is 128 KiB; a Python driver repairs a gap in about a millisecond rather than
    microseconds, so a larger window keeps data flowing while gaps are repaired (at 5 % loss this
    doubles throughput)."""
    so_rcvbuf: int | None = 2 * 1024 * 1024
    """SO_RCVBUF of UDP sockets (``so-rcvbuf`` overrides it); None keeps the OS default. Sized for the
    receiver window (the kernel may grant less: ``net.core.rmem_max``); a window is never larger than
    the buffer the socket really got, as the reference requires."""
    so_sndbuf: int | None = None
    """SO_SNDBUF of UDP sockets; None keeps the OS default."""
    udp_gso: bool = True
    """Linux UDP segmentation and receive offload (UDP_SEGMENT, UDP_GRO): up to 64 datagrams per system
    call each way, still separate Aeron datagrams on the wire. Turned off by itself where the kernel or
    the route refuses it."""
    counters_capacity: int = 8192
    """Counters cnc.dat has room for: the system counters, each stream's positions, applications' own."""
    error_log_length: int = 1024 * 1024
    """Bytes of the distinct-error log in cnc.dat (a multiple of 8)."""
    idle_strategy: str = "backoff"
    """How the driver thread waits when it has nothing to do: ``backoff`` (spin, yield, then park),
    ``busy-spin`` (``spin``), ``yield`` or ``sleep``."""
    threading_mode: str = "dedicated"
    """``dedicated``: an embedded driver runs on a thread of its own. ``invoker``: it has no thread;
    the application runs its duty cycle by calling ``Context.invoke()`` from its own loop (Aeron's
    INVOKER mode). In CPython a driver thread shares the GIL with the application, so for the lowest
    latency the application's polling loop drives the driver itself. Ignored by ``slipstream driver``."""
    reserved_session_id_low: int = RESERVED_SESSION_ID_LOW_DEFAULT
    """Lowest of the session ids the driver never picks by itself (Aeron's reserved range, where a
    channel's explicit ``session-id`` goes)."""
    reserved_session_id_high: int = RESERVED_SESSION_ID_HIGH_DEFAULT
    """Highest of those session ids."""
    timer_interval_ns: int = 100 * MS
    """How often the conductor runs its chores: heartbeats, client liveness, the error log and counters."""
    idle_heartbeat_max_ns: int | None = None
    """While a publication sends nothing new, its heartbeats after the first come this far apart (at
    most 5 s; None: every 100 ms, as Aeron). The first heartbeat after data is never delayed (it reveals
    a lost tail); later ones only keep the receiver's image alive."""
    idle_status_message_max_ns: int | None = None
    """While an image's position stays put, its timed status messages after the first come this far
    apart (at most 2.5 s, half the sender's connection timeout; None: every 200 ms, as Aeron)."""
    record_directory: Path | None = None
    """The standalone driver (``slipstream driver``, whose ``--record DIR`` overrides it) records its
    counters, loss report and error log into this directory as Parquet segments (the ``telemetry``
    extra); None records nothing. An embedded driver ignores it: a process records its own endpoints
    with ``RecordingConfig``."""
    record_interval_ns: int = 1 * S
    """Time between two samples of that recording."""
    dir_delete_on_shutdown: bool | None = None
    """Remove the directory when the driver closes cleanly (Aeron's ``dirDeleteOnShutdown``): its own files
    (cnc.dat, the loss report, the log buffers, socket and lock), then the directory if that left it
    empty. None: yes for an embedded driver (``Context``, ``launch_embedded``), whose directory is a
    detail of one process; no for ``slipstream driver``, whose counters, error log and loss report stay
    readable (``slipstream stat | errors | loss``) after it stopped. Removed even while clients of other
    processes are attached, as Aeron does: they lost their driver either way, and what they mapped stays
    valid (files are unlinked, never truncated). A crashed driver removes nothing; the next one to
    claim the directory cleans it."""

    unique_directory: bool = False
    """Run in a directory of this driver's own, ``<directory>-<pid>-<n>``, instead of ``directory`` itself, so
    two processes (or two endpoints of one) never collide over one directory. Only a driver started here can
    be there: a ``Context`` with it starts an embedded driver (``driver="external"`` is refused), and no other
    process attaches to it (no shared IPC with them). Default off: one directory per host, shared."""

    def made_unique(self) -> DriverConfig:
        """A copy whose ``directory`` is a fresh one of its own (``unique_directory`` set) or ``self``."""
        if not self.unique_directory:
            return self
        name = f"{self.directory.name}-{os.getpid()}-{next(_UNIQUE)}"
        return replace(self, directory=self.directory.with_name(name), unique_directory=False)

    def deletes_directory(self, *, embedded: bool) -> bool:
        """``dir_delete_on_shutdown``, or the default it stands for (``embedded``: started inside an
        application) when None."""
        return embedded if self.dir_delete_on_shutdown is None else self.dir_delete_on_shutdown

    def effective_stall_threshold_ns(self) -> int:
        """``stall_threshold_ns``, or the default it stands for when None."""
        if self.stall_threshold_ns is not None:
            return self.stall_threshold_ns
        return min(STALL_THRESHOLD_MAX_DEFAULT_NS, self.client_liveness_timeout_ns // 3)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.validate()  # a bad setting fails where it is written, not when a driver starts

    def validate(self) -> None:
        """Raise ``DriverConfigError`` (a ValueError) naming the first bad setting. Runs at construction
        and when a driver starts (fields may be assigned in between)."""
        try:
            self._validate()
        except DriverConfigError:
            raise
        except ValueError as exc:
            raise DriverConfigError(str(exc)) from None

    def _validate(self) -> None:
        for name in (
            "client_liveness_timeout_ns",
            "publication_linger_ns",
            "publication_unblock_timeout_ns",
            "timer_interval_ns",
            "record_interval_ns",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int (nanoseconds): {value!r}")
            if not 0 < value <= MAX_DURATION_NS:
                raise ValueError(f"{name} must be in (0, {MAX_DURATION_NS}] ns (at most a year): {value}")
        stall = self.stall_threshold_ns
        if stall is not None:
            if isinstance(stall, bool) or not isinstance(stall, int):
                raise ValueError(f"stall_threshold_ns must be an int (nanoseconds) or None: {stall!r}")
            if not 0 < stall < self.client_liveness_timeout_ns:
                raise ValueError(
                    f"stall_threshold_ns must be positive and below client_liveness_timeout_ns "
                    f"({self.client_liveness_timeout_ns}), well below it: {stall}"
                )
        try:
            check_term_length(self.ipc_term_length)
        except ValueError as exc:
            raise ValueError(f"ipc_term_length: {exc}") from None
        try:
            check_term_length(self.udp_term_length)
        except ValueError as exc:
            raise ValueError(f"udp_term_length: {exc}") from None
        for name in ("ipc_mtu", "udp_mtu"):
            try:
                check_mtu(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            largest = max_message_length(self.ipc_term_length if name == "ipc_mtu" else self.udp_term_length)
            if getattr(self, name) > largest:  # (as each publication is checked)
                raise ValueError(f"{name} must be at most a term's largest message, {largest}: {getattr(self, name)}")
        if self.receiver_window < self.udp_mtu:
            raise ValueError(f"receiver_window must be at least the mtu: {self.receiver_window}")
        for name in ("so_rcvbuf", "so_sndbuf"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None: {value}")
        if self.ipc_publication_window is not None and self.ipc_publication_window < self.ipc_mtu:
            raise ValueError(f"ipc_publication_window must be at least the mtu: {self.ipc_publication_window}")
        if self.dir_delete_on_shutdown is not None and not isinstance(self.dir_delete_on_shutdown, bool):
            raise ValueError(f"dir_delete_on_shutdown must be True, False or None: {self.dir_delete_on_shutdown!r}")
        if self.record_directory is not None and not isinstance(self.record_directory, Path):
            raise ValueError(f"record_directory must be a Path or None: {self.record_directory!r}")
        if self.record_directory is not None:  # refused here, before a driver starts and records nothing
            require_extra("telemetry", "record_directory (the driver's recording)")
        if self.counters_capacity < 16:
            raise ValueError(f"counters_capacity must be at least 16: {self.counters_capacity}")
        if self.error_log_length < 0 or self.error_log_length % 8:
            raise ValueError(f"error_log_length must be a non-negative multiple of 8: {self.error_log_length}")
        for name, low, high in (
            ("idle_heartbeat_max_ns", PUBLICATION_HEARTBEAT_TIMEOUT_NS, IMAGE_LIVENESS_TIMEOUT_NS // 2),
            ("idle_status_message_max_ns", STATUS_MESSAGE_TIMEOUT_NS, PUBLICATION_CONNECTION_TIMEOUT_NS // 2),
        ):
            value = getattr(self, name)
            if value is not None and not low <= value <= high:
                raise ValueError(f"{name} must be None or in [{low}, {high}]: {value}")
        if self.reserved_session_id_low > self.reserved_session_id_high:
            raise ValueError("reserved_session_id_low must not exceed reserved_session_id_high")
        try:
            idle_strategy(self.idle_strategy)
        except ValueError as exc:
            raise ValueError(f"idle_strategy: {exc}") from None
        if not isinstance(self.unique_directory, bool):
            raise ValueError(f"unique_directory must be True or False: {self.unique_directory!r}")
        if self.threading_mode not in THREADING_MODES:
            raise ValueError(f"threading_mode must be one of {', '.join(THREADING_MODES)}: {self.threading_mode!r}")
