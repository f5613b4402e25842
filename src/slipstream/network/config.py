"""Typed, validated settings for servers and clients.

Every field is checked when the object is built, and each error names the field and the bad value,
so a mistake surfaces at the line that made it, not as a strange failure at ``bind`` or ``connect``.
Defaults work out of the box: a fresh server accepts remote clients (the seed's default of zero
clients rejected everyone).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..driver.config import DriverConfig
from ..wire.positions import max_message_length
from .errors import NetworkError
from .hooks import ConnectionHooks
from .rmi.registry import RmiRegistry
from .serialization import Serialization
from .tuning import check_driver_config

if TYPE_CHECKING:
    from ..telemetry.config import RecordingConfig  # imported when a config records: telemetry is a feature

__all__ = [
    "LOCALHOST_ALIASES",
    "WILDCARD_ADDRESSES",
    "ClientConfig",
    "ConfigError",
    "ConfigTypeError",
    "ServerConfig",
]

WILDCARD_ADDRESSES = frozenset({"*", "0", "0.0.0.0", "::"})
"""Listen addresses meaning every interface (the seed's set)."""
LOCALHOST_ALIASES = frozenset({"loopback", "localhost", "lo", "127.0.0.1", "::1"})
"""Names of this host's loopback interface (the seed's set)."""

_APP_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,31}")
_MIB = 1024 * 1024


class ConfigError(NetworkError, ValueError):
    """A setting has a bad value; the message names the field."""


class ConfigTypeError(NetworkError, TypeError):
    """A setting has the wrong type; the message names the field."""


DriverMode = Literal["auto", "embedded", "external", "invoker"]
FilterCallback = Callable[[str | None, str], bool]
"""``(address, tag) -> bool``: address is None for IPC connections."""


def _check_type(name: str, value: object, kinds: type | tuple[type, ...]) -> None:
    if isinstance(value, bool) and kinds in (int, float, (int, float)):
        raise ConfigTypeError(f"{name} must be a number, not bool: {value!r}")
    if not isinstance(value, kinds):
        wanted = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
        raise ConfigTypeError(f"{name} must be {wanted}, not {type(value).__name__}: {value!r}")


def _positive(name: str, value: float) -> None:
    _check_type(name, value, (int, float))
    if not value > 0:
        raise ConfigError(f"{name} must be positive: {value!r}")


def _power_of_two_term(name: str, value: int) -> None:
    _check_type(name, value, int)
    if not 65536 <= value <= 1024 * _MIB or value & (value - 1):
        raise ConfigError(f"{name} must be a power of two from 64 KiB to 1 GiB: {value}")


@dataclass(frozen=True, kw_only=True)
class _EndpointConfig:
    """What servers and clients share. Durations are seconds."""

    app_id: str
    """Names the application; both sides must use the same (1-31 of ``A-Za-z0-9_.-``)."""
    messages: Sequence[type] = ()
    """Registered message types (msgspec Structs, dataclasses), compared during the handshake."""
    interfaces: Sequence[type | tuple[type, type]] = ()
    """RMI interfaces (Protocols or abstract bases), each optionally paired with the class that
    implements it on this side: ``[ICalc, (IChat, Chat)]``. Both sides list the same interfaces in
    the same order (compared during the handshake); only registered methods can ever be called."""
    exceptions: Sequence[type[Exception]] = ()
    """Exception types a remote call re-raises as themselves (others arrive as ``RemoteError``)."""
    rmi_timeout: float = 3.0
    """Default timeout of each remote call in seconds (0 = forever; per proxy: ``proxy.rmi_timeout``)."""
    max_stream_size: int = 4 * 1024**3
    """Largest large message or file accepted from the peer (announced sizes above it are refused
    before anything is allocated)."""
    max_message_size: int = 16 * _MIB
    """Largest message (or remote call, or response) from the peer decoded in memory: one announced above
    it is refused before anything is allocated (``MaxMessageSizeExceeded`` on both sides); send larger
    payloads as files (a ``Path`` is not decoded). At least 64 KiB (a record)."""
    max_pending_calls: int = 1024
    """Remote calls running plus async listener tasks per connection: a call beyond it is refused at once
    (``RmiRequestRefused``, ``reason == "busy"``); a message beyond it waits, unread, until one finishes
    (back-pressure on the sender, never dropped)."""
    rmi_tracebacks: bool = False
    """Send the traceback of an exception a remote call raised here to the caller (off: type and
    message only, so a peer learns nothing of this side's code)."""
    spill_threshold: int = 16 * _MIB
    """Incoming large messages are kept in memory up to this many bytes in all, then written to a
    temporary file (removed when handled); files always go to a temporary file."""
    temp_directory: str | os.PathLike[str] | None = None
    """Where those temporary files go (None: the system's temporary directory)."""
    settings_store: str | os.PathLike[str] | None = None
    """Where the identity key (and, on clients, pinned server keys) live: a file path, ``":memory:"``,
    or None for ``<per-user data dir>/slipstream/<app_id>-<role>.db``."""
    enable_ipv4: bool = True
    """UDP over IPv4: a server listens on it, a client connects to IPv4 addresses."""
    enable_ipv6: bool = True
    """UDP over IPv6, likewise."""
    enable_ipc: bool = True
    """Shared-memory connections within this host: a server's ``bind`` serves IPC too, and a client tries
    IPC first when the host is this one."""
    encrypt_ipc: bool = True
    """IPC connections are encrypted too unless this is False (shared memory is readable by the user)."""
    network_mtu: int = 1408
    """Largest datagram of each UDP connection's publications (a multiple of 32 in 1024..65504); longer
    records are fragmented."""
    term_length: int = 256 * 1024
    """Term length of each UDP connection's publications (three terms are mapped per publication)."""
    ipc_term_length: int = 1 * _MIB
    """Term length of each IPC connection's publications (a power of two from 64 KiB to 1 GiB)."""
    reliable: bool = True
    """Reliable UDP streams (retransmission); with False, lost records are simply missing."""
    handshake_timeout: float = 10.0
    """How long a half-open handshake may last (server) / one connect attempt waits (client)."""
    close_timeout: float = 2.0
    """How long ``close`` waits for the CLOSE frame to leave before tearing the streams down, and (asyncio)
    for coroutine listeners still running, ``on_disconnect`` among them, before cancelling them."""
    connection_expiry: float = 4.0
    """A peer silent this long is gone (shorter blips do not disconnect)."""
    send_timeout: float = 5.0
    """How long ``send`` waits out back-pressure before raising SendTimeout."""
    driver_directory: str | os.PathLike[str] | None = None
    """The media driver's directory (None: the default, shared by the host's processes)."""
    driver: DriverMode = "auto"
    """``auto`` attaches to a running driver or embeds one; ``embedded``; ``external``; ``invoker``:
    an embedded driver run by the endpoint's own asyncio loop (no driver thread competing for the
    GIL: the lowest UDP latency)."""
    driver_config: DriverConfig | None = None
    """Tuning of a media driver this endpoint starts (idle strategy, socket buffers, receiver window, linger,
    ``unique_directory``...): fields left at their defaults take the network layer's; a driver that runs already
    keeps its settings, and a ``DriverSettingsIgnored`` warning names what differs (``network.tuning``)."""
    recording: RecordingConfig | None = None
    """Record handshakes, connections and per-connection statistics (and the driver's counters) as
    Parquet telemetry for ``slipstream pipeline report``; None (the default) records nothing."""
    connection_class: type[Any] | None = None
    """A subclass of ``slipstream.network.Connection`` to make every connection of (its ``outgoing`` and
    ``dispatch`` see each message sent and received); None: ``Connection`` itself."""
    error_filter: Callable[[BaseException], bool] | None = None
    """Which errors ``on_error`` (or the log) hears: False keeps one quiet, counted in ``errors`` only."""

    def __post_init__(self) -> None:
        _check_type("app_id", self.app_id, str)
        if self.error_filter is not None and not callable(self.error_filter):
            raise ConfigTypeError(f"error_filter must be callable (error) -> bool: {self.error_filter!r}")
        if not _APP_ID_RE.fullmatch(self.app_id):
            raise ConfigError(f"app_id must be 1-31 characters of A-Za-z0-9_.-: {self.app_id!r}")
        if isinstance(self.messages, (str, bytes)) or not isinstance(self.messages, Sequence):
            raise ConfigTypeError(f"messages must be a sequence of types: {self.messages!r}")
        for index, kind in enumerate(self.messages):
            if not isinstance(kind, type):
                raise ConfigTypeError(f"messages[{index}] must be a type: {kind!r}")
        object.__setattr__(self, "messages", tuple(self.messages))
        if isinstance(self.interfaces, (str, bytes)) or not isinstance(self.interfaces, Sequence):
            raise ConfigTypeError(f"interfaces must be a sequence of classes or (interface, class) pairs: "
                                  f"{self.interfaces!r}")  # fmt: skip
        for index, item in enumerate(self.interfaces):
            pair = item if isinstance(item, tuple) else (item,)
            if not 1 <= len(pair) <= 2 or not all(isinstance(kind, type) for kind in pair):
                raise ConfigTypeError(f"interfaces[{index}] must be a class or an (interface, class) pair: {item!r}")
        object.__setattr__(self, "interfaces", tuple(self.interfaces))
        for index, kind in enumerate(self.exceptions):
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                raise ConfigTypeError(f"exceptions[{index}] must be an Exception subclass: {kind!r}")
        object.__setattr__(self, "exceptions", tuple(self.exceptions))
        try:  # registered as an endpoint registers them, so a bad type fails here, not in Server()/Client()
            messages = Serialization(self.messages)
        except TypeError as exc:
            raise ConfigTypeError(f"messages: {exc}") from None
        try:
            RmiRegistry(self.interfaces, messages=messages, exceptions=self.exceptions)
        except TypeError as exc:  # (InterfaceError is a TypeError)
            raise ConfigTypeError(f"interfaces: {exc}") from None
        _check_type("rmi_timeout", self.rmi_timeout, (int, float))
        if self.rmi_timeout < 0:
            raise ConfigError(f"rmi_timeout must not be negative (0 = forever): {self.rmi_timeout!r}")
        for name in ("max_stream_size", "spill_threshold", "max_message_size", "max_pending_calls"):
            _check_type(name, getattr(self, name), int)
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative: {getattr(self, name)}")
        if self.max_message_size < 64 * 1024:
            raise ConfigError(f"max_message_size must be at least 64 KiB (a record): {self.max_message_size}")
        if self.max_pending_calls < 1:
            raise ConfigError(f"max_pending_calls must be at least 1: {self.max_pending_calls}")
        _check_type("rmi_tracebacks", self.rmi_tracebacks, bool)
        if self.temp_directory is not None:
            _check_type("temp_directory", self.temp_directory, (str, os.PathLike))
        if self.settings_store is not None:
            _check_type("settings_store", self.settings_store, (str, os.PathLike))
        for name in ("enable_ipv4", "enable_ipv6", "enable_ipc", "encrypt_ipc", "reliable"):
            _check_type(name, getattr(self, name), bool)
        if not (self.enable_ipv4 or self.enable_ipv6 or self.enable_ipc):
            raise ConfigError("enable_ipv4, enable_ipv6 and enable_ipc are all False: enable at least one")
        _check_type("network_mtu", self.network_mtu, int)
        if not 1024 <= self.network_mtu <= 65504 or self.network_mtu % 32:
            raise ConfigError(f"network_mtu must be a multiple of 32 in 1024..65504: {self.network_mtu}")
        _power_of_two_term("term_length", self.term_length)
        _power_of_two_term("ipc_term_length", self.ipc_term_length)
        if self.network_mtu > (largest := max_message_length(self.term_length)):  # (a longer frame is refused)
            raise ConfigError(f"network_mtu must be at most term_length / 8 ({largest}): {self.network_mtu}")
        for name in ("handshake_timeout", "close_timeout", "connection_expiry", "send_timeout"):
            _positive(name, getattr(self, name))
        if self.driver_directory is not None:
            _check_type("driver_directory", self.driver_directory, (str, os.PathLike))
        if self.driver not in ("auto", "embedded", "external", "invoker"):
            raise ConfigError(f"driver must be 'auto', 'embedded', 'external' or 'invoker': {self.driver!r}")
        if self.driver_config is not None:
            _check_type("driver_config", self.driver_config, DriverConfig)
            if problem := check_driver_config(self.driver_config, driver=self.driver,
                                              directory=self.driver_directory, enable_ipc=self.enable_ipc):  # fmt: skip
                raise ConfigError(problem)
        if self.recording is not None:
            from ..telemetry.config import RecordingConfig

            _check_type("recording", self.recording, RecordingConfig)
        if self.connection_class is not None and not (
            isinstance(self.connection_class, type) and issubclass(self.connection_class, ConnectionHooks)
        ):
            raise ConfigTypeError(f"connection_class must subclass network.Connection: {self.connection_class!r}")

    def store_path(self, role: str) -> str:
        """The settings store to open: the configured one, or the per-user default for ``role``."""
        if self.settings_store is not None:
            return os.fspath(self.settings_store)
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return str(Path(base) / "slipstream" / f"{self.app_id}-{role}.db")


@dataclass(frozen=True, kw_only=True)
class ServerConfig(_EndpointConfig):
    """A server's settings. ``ServerConfig(app_id="chat", messages=[Hello], settings_store=":memory:")``.

    Attributes:
        app_id (str): Names the application; both sides must use the same (1-31 of ``A-Za-z0-9_.-``). Required.
        messages (Sequence[type]): Registered message types (msgspec Structs, dataclasses), compared during the
            handshake. Default ``()``.
        interfaces (Sequence[type | tuple[type, type]]): RMI interfaces (Protocols or abstract bases), each optionally
            paired with the class that implements it on this side: ``[ICalc, (IChat, Chat)]``. Both sides list the same
            interfaces in the same order (compared during the handshake); only registered methods can ever be called.
            Default ``()``.
        exceptions (Sequence[type[Exception]]): Exception types a remote call re-raises as themselves (others arrive as
            ``RemoteError``). Default ``()``.
        rmi_timeout (float): Default timeout of each remote call in seconds (0 = forever; per proxy:
            ``proxy.rmi_timeout``). Default ``3.0``.
        max_stream_size (int): Largest large message or file accepted from the peer (announced sizes above it are
            refused before anything is allocated). Default ``4 * 1024**3`` (4294967296).
        max_message_size (int): Largest message (or remote call, or response) from the peer decoded in memory: one
            announced above it is refused before anything is allocated (``MaxMessageSizeExceeded`` on both sides); send
            larger payloads as files (a ``Path`` is not decoded). At least 64 KiB (a record). Default ``16777216``.
        max_pending_calls (int): Remote calls running plus async listener tasks per connection: a call beyond it is
            refused at once (``RmiRequestRefused``, ``reason == "busy"``); a message beyond it waits, unread, until one
            finishes (back-pressure on the sender, never dropped). Default ``1024``.
        rmi_tracebacks (bool): Send the traceback of an exception a remote call raised here to the caller (off: type and
            message only, so a peer learns nothing of this side's code). Default ``False``.
        spill_threshold (int): Incoming large messages are kept in memory up to this many bytes in all, then written to
            a temporary file (removed when handled); files always go to a temporary file. Default ``16777216``.
        temp_directory (str | os.PathLike[str] | None): Where those temporary files go (None: the system's temporary
            directory). Default ``None``.
        settings_store (str | os.PathLike[str] | None): Where the identity key (and, on clients, pinned server keys)
            live: a file path, ``":memory:"``, or None for ``<per-user data dir>/slipstream/<app_id>-<role>.db``.
            Default ``None``.
        enable_ipv4 (bool): UDP over IPv4: a server listens on it, a client connects to IPv4 addresses. Default
            ``True``.
        enable_ipv6 (bool): UDP over IPv6, likewise. Default ``True``.
        enable_ipc (bool): Shared-memory connections within this host: a server's ``bind`` serves IPC too, and a client
            tries IPC first when the host is this one. Default ``True``.
        encrypt_ipc (bool): IPC connections are encrypted too unless this is False (shared memory is readable by the
            user). Default ``True``.
        network_mtu (int): Largest datagram of each UDP connection's publications (a multiple of 32 in 1024..65504);
            longer records are fragmented. Default ``1408``.
        term_length (int): Term length of each UDP connection's publications (three terms are mapped per publication).
            Default ``256 * 1024`` (262144).
        ipc_term_length (int): Term length of each IPC connection's publications (a power of two from 64 KiB to 1 GiB).
            Default ``1048576``.
        reliable (bool): Reliable UDP streams (retransmission); with False, lost records are simply missing. Default
            ``True``.
        handshake_timeout (float): How long a half-open handshake may last (server) / one connect attempt waits
            (client). Default ``10.0``.
        close_timeout (float): How long ``close`` waits for the CLOSE frame to leave before tearing the streams down,
            and (asyncio) for coroutine listeners still running, ``on_disconnect`` among them, before cancelling them.
            Default ``2.0``.
        connection_expiry (float): A peer silent this long is gone (shorter blips do not disconnect). Default ``4.0``.
        send_timeout (float): How long ``send`` waits out back-pressure before raising SendTimeout. Default ``5.0``.
        driver_directory (str | os.PathLike[str] | None): The media driver's directory (None: the default, shared by the
            host's processes). Default ``None``.
        driver (DriverMode): ``auto`` attaches to a running driver or embeds one; ``embedded``; ``external``;
            ``invoker``: an embedded driver run by the endpoint's own asyncio loop (no driver thread competing for the
            GIL: the lowest UDP latency). Default ``"auto"``.
        driver_config (DriverConfig | None): Tuning of a media driver this endpoint starts (idle strategy, socket
            buffers, receiver window, linger, ``unique_directory``...): fields left at their defaults take the network
            layer's; a driver that runs already keeps its settings, and a ``DriverSettingsIgnored`` warning names what
            differs (``network.tuning``). Default ``None``.
        recording (RecordingConfig | None): Record handshakes, connections and per-connection statistics (and the
            driver's counters) as Parquet telemetry for ``slipstream pipeline report``; None (the default) records
            nothing. Default ``None``.
        connection_class (type[Any] | None): A subclass of ``slipstream.network.Connection`` to make every connection of
            (its ``outgoing`` and ``dispatch`` see each message sent and received); None: ``Connection`` itself. Default
            ``None``.
        error_filter (Callable[[BaseException], bool] | None): Which errors ``on_error`` (or the log) hears: False keeps
            one quiet, counted in ``errors`` only. Default ``None``.
        listen_address (str): Wildcards ``* 0 0.0.0.0 ::``, localhost aliases (``localhost``, ``lo``...), or an IP
            literal. Default ``"*"``.
        max_clients (int): Clients connected at once (UDP and IPC); one more is refused with ``ServerFull``. Default
            ``256``.
        max_connections_per_address (int): Clients connected at once from one IP address
            (``TooManyConnectionsForAddress`` beyond); 0 means ``max_clients``. Loopback clients are exempt, as in the
            seed (this host's own processes; ``max_clients`` still bounds them). Default ``0``.
        connection_ports (tuple[int, int] | None): ``(first, count)`` of the UDP ports the server hands out, one per
            connection (the connection's control port, which a NATed client registers at); None: ``(bind port + 2,
            max_clients)``. Default ``None``.
        ip_filters (Sequence[str]): CIDR allow rules (``"10.0.0.0/8"``, ``"::1/128"``); none means everyone. IPC is
            never filtered. Default ``()``.
        filter (FilterCallback | None): Asked ``filter(address, tag)`` about each client during its handshake (address
            None for IPC): False, or an exception, refuses it (``ConnectionNotPermitted``). Default ``None``.
        allowed_keys (Collection[bytes] | None): When set, only clients whose public key is listed connect. Default
            ``None``.
        max_tag_length (int): Longest tag a client may send, in characters; a longer (or unprintable) tag is refused.
            Default ``32``.
        max_pending_handshakes (int): Half-open handshakes kept at once; beyond it the oldest is dropped (memory stays
            bounded). Default ``256``.
        handshakes_per_second (float): Budget of Diffie-Hellman work for new handshakes; HELLOs beyond it are dropped
            (clients retry). Default ``2000.0``.
        buffered_sessions (bool): Keep a session for a client whose connection is *lost* (it went silent past the
            expiry; a deliberate close ends the session at once): what the application sends to it meanwhile is queued
            and delivered in order, first thing, when the same client (its public key) connects again within
            ``buffered_timeout``; only then, or when the session expires, does ``on_disconnect`` fire. The lost
            connection itself leaves ``server.connections`` (and ``is_closed`` turns True) within the expiry. On by
            default, as the seed's; ``False`` (or a ``buffered_rule`` refusing the connection) reports a lost client's
            ``on_disconnect`` within the connection expiry instead. Default ``True``.
        buffered_rule (FilterCallback | None): With buffered sessions on, which connections get one: ``(address, tag) ->
            bool`` (None: all). Default ``None``.
        buffered_timeout (float): How long a lost client's session waits for it (the seed's 120 s). Default ``120.0``.
        buffered_capacity (int): Messages queued per waiting session; beyond it ``send`` raises UndeliveredError.
            Default ``10_000``.
        rebind (bool): When the media driver is lost, restart the embedded one (or wait for the external one to come
            back) and bind the same UDP ports and IPC streams again (``server.is_bound`` says where it stands); lost
            clients' buffered sessions wait for them meanwhile. Default ``True``.
        spill_quota (int): Bytes of incoming large messages and files on disk at once, over all connections: a stream
            that does not fit is refused (``SpillQuotaExceeded`` on both sides); its room comes back when the file is
            removed or handed to the application. Default ``1024**3`` (1073741824).
    """

    listen_address: str = "*"
    """Wildcards ``* 0 0.0.0.0 ::``, localhost aliases (``localhost``, ``lo``...), or an IP literal."""
    max_clients: int = 256
    """Clients connected at once (UDP and IPC); one more is refused with ``ServerFull``."""
    max_connections_per_address: int = 0
    """Clients connected at once from one IP address (``TooManyConnectionsForAddress`` beyond); 0 means
    ``max_clients``. Loopback clients are exempt, as in the seed (this host's own processes; ``max_clients``
    still bounds them)."""
    connection_ports: tuple[int, int] | None = None
    """``(first, count)`` of the UDP ports the server hands out, one per connection (the connection's
    control port, which a NATed client registers at); None: ``(bind port + 2, max_clients)``."""
    ip_filters: Sequence[str] = ()
    """CIDR allow rules (``"10.0.0.0/8"``, ``"::1/128"``); none means everyone. IPC is never filtered."""
    filter: FilterCallback | None = None
    """Asked ``filter(address, tag)`` about each client during its handshake (address None for IPC):
    False, or an exception, refuses it (``ConnectionNotPermitted``)."""
    allowed_keys: Collection[bytes] | None = None
    """When set, only clients whose public key is listed connect."""
    max_tag_length: int = 32
    """Longest tag a client may send, in characters; a longer (or unprintable) tag is refused."""
    max_pending_handshakes: int = 256
    """Half-open handshakes kept at once; beyond it the oldest is dropped (memory stays bounded)."""
    handshakes_per_second: float = 2000.0
    """Budget of Diffie-Hellman work for new handshakes; HELLOs beyond it are dropped (clients retry)."""
    buffered_sessions: bool = True
    """Keep a session for a client whose connection is *lost* (it went silent past the expiry; a
    deliberate close ends the session at once): what the application sends to it meanwhile is queued
    and delivered in order, first thing, when the same client (its public key) connects again within
    ``buffered_timeout``; only then, or when the session expires, does ``on_disconnect`` fire. The lost
    connection itself leaves ``server.connections`` (and ``is_closed`` turns True) within the expiry.
    On by default, as the seed's; ``False`` (or a ``buffered_rule`` refusing the connection) reports a
    lost client's ``on_disconnect`` within the connection expiry instead."""
    buffered_rule: FilterCallback | None = None
    """With buffered sessions on, which connections get one: ``(address, tag) -> bool`` (None: all)."""
    buffered_timeout: float = 120.0
    """How long a lost client's session waits for it (the seed's 120 s)."""
    buffered_capacity: int = 10_000
    """Messages queued per waiting session; beyond it ``send`` raises UndeliveredError."""
    rebind: bool = True
    """When the media driver is lost, restart the embedded one (or wait for the external one to come
    back) and bind the same UDP ports and IPC streams again (``server.is_bound`` says where it stands);
    lost clients' buffered sessions wait for them meanwhile."""
    spill_quota: int = 1024**3
    """Bytes of incoming large messages and files on disk at once, over all connections: a stream that
    does not fit is refused (``SpillQuotaExceeded`` on both sides); its room comes back when the file is
    removed or handed to the application."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_type("spill_quota", self.spill_quota, int)
        if self.spill_quota < 0:
            raise ConfigError(f"spill_quota must not be negative: {self.spill_quota}")
        _check_type("listen_address", self.listen_address, str)
        address = self.listen_address
        if address not in WILDCARD_ADDRESSES and address not in LOCALHOST_ALIASES:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ConfigError(
                    f"listen_address must be a wildcard, a localhost alias or an IP: {address!r}"
                ) from None
        _check_type("max_clients", self.max_clients, int)
        if not 1 <= self.max_clients <= 65000:
            raise ConfigError(f"max_clients must be in 1..65000: {self.max_clients}")
        _check_type("max_connections_per_address", self.max_connections_per_address, int)
        if self.max_connections_per_address < 0:
            raise ConfigError(f"max_connections_per_address must be >= 0: {self.max_connections_per_address}")
        if self.connection_ports is not None:
            ports = self.connection_ports
            if not (isinstance(ports, tuple) and len(ports) == 2 and all(isinstance(p, int) for p in ports)):
                raise ConfigTypeError(f"connection_ports must be a (first, count) tuple of ints: {ports!r}")
            if ports[1] < 1 or ports[0] < 1 or ports[0] + ports[1] - 1 > 65535:
                raise ConfigError(f"connection_ports must lie within 1..65535: {ports!r}")
        if isinstance(self.ip_filters, str):
            raise ConfigTypeError(f"ip_filters must be a sequence of CIDR strings: {self.ip_filters!r}")
        for index, rule in enumerate(self.ip_filters):
            _check_type(f"ip_filters[{index}]", rule, str)
            try:
                ipaddress.ip_network(rule, strict=False)
            except ValueError as exc:
                raise ConfigError(f"ip_filters[{index}] is not a CIDR network: {rule!r} ({exc})") from None
        object.__setattr__(self, "ip_filters", tuple(self.ip_filters))
        if self.filter is not None and not callable(self.filter):
            raise ConfigTypeError(f"filter must be callable (address, tag) -> bool: {self.filter!r}")
        if self.allowed_keys is not None:
            keys = frozenset(self.allowed_keys)
            for key in keys:
                if not isinstance(key, bytes) or len(key) != 32:
                    raise ConfigError(f"allowed_keys must hold 32-byte public keys: {key!r}")
            object.__setattr__(self, "allowed_keys", keys)
        _check_type("max_tag_length", self.max_tag_length, int)
        if not 0 <= self.max_tag_length <= 1024:
            raise ConfigError(f"max_tag_length must be in 0..1024: {self.max_tag_length}")
        _check_type("max_pending_handshakes", self.max_pending_handshakes, int)
        if not 1 <= self.max_pending_handshakes <= 1_000_000:
            raise ConfigError(f"max_pending_handshakes must be in 1..1000000: {self.max_pending_handshakes}")
        _positive("handshakes_per_second", self.handshakes_per_second)
        _check_type("buffered_sessions", self.buffered_sessions, bool)
        if self.buffered_rule is not None and not callable(self.buffered_rule):
            raise ConfigTypeError(f"buffered_rule must be callable (address, tag) -> bool: {self.buffered_rule!r}")
        _positive("buffered_timeout", self.buffered_timeout)
        _check_type("buffered_capacity", self.buffered_capacity, int)
        if self.buffered_capacity < 0:
            raise ConfigError(f"buffered_capacity must not be negative: {self.buffered_capacity}")
        _check_type("rebind", self.rebind, bool)

    @property
    def per_address_limit(self) -> int:
        """The effective per-address limit (0 in the config means ``max_clients``)."""
        return self.max_connections_per_address or self.max_clients


@dataclass(frozen=True, kw_only=True)
class ClientConfig(_EndpointConfig):
    """A client's settings. ``ClientConfig(app_id="chat", messages=[Hello], settings_store=":memory:")``.

    Attributes:
        app_id (str): Names the application; both sides must use the same (1-31 of ``A-Za-z0-9_.-``). Required.
        messages (Sequence[type]): Registered message types (msgspec Structs, dataclasses), compared during the
            handshake. Default ``()``.
        interfaces (Sequence[type | tuple[type, type]]): RMI interfaces (Protocols or abstract bases), each optionally
            paired with the class that implements it on this side: ``[ICalc, (IChat, Chat)]``. Both sides list the same
            interfaces in the same order (compared during the handshake); only registered methods can ever be called.
            Default ``()``.
        exceptions (Sequence[type[Exception]]): Exception types a remote call re-raises as themselves (others arrive as
            ``RemoteError``). Default ``()``.
        rmi_timeout (float): Default timeout of each remote call in seconds (0 = forever; per proxy:
            ``proxy.rmi_timeout``). Default ``3.0``.
        max_stream_size (int): Largest large message or file accepted from the peer (announced sizes above it are
            refused before anything is allocated). Default ``4 * 1024**3`` (4294967296).
        max_message_size (int): Largest message (or remote call, or response) from the peer decoded in memory: one
            announced above it is refused before anything is allocated (``MaxMessageSizeExceeded`` on both sides); send
            larger payloads as files (a ``Path`` is not decoded). At least 64 KiB (a record). Default ``16777216``.
        max_pending_calls (int): Remote calls running plus async listener tasks per connection: a call beyond it is
            refused at once (``RmiRequestRefused``, ``reason == "busy"``); a message beyond it waits, unread, until one
            finishes (back-pressure on the sender, never dropped). Default ``1024``.
        rmi_tracebacks (bool): Send the traceback of an exception a remote call raised here to the caller (off: type and
            message only, so a peer learns nothing of this side's code). Default ``False``.
        spill_threshold (int): Incoming large messages are kept in memory up to this many bytes in all, then written to
            a temporary file (removed when handled); files always go to a temporary file. Default ``16777216``.
        temp_directory (str | os.PathLike[str] | None): Where those temporary files go (None: the system's temporary
            directory). Default ``None``.
        settings_store (str | os.PathLike[str] | None): Where the identity key (and, on clients, pinned server keys)
            live: a file path, ``":memory:"``, or None for ``<per-user data dir>/slipstream/<app_id>-<role>.db``.
            Default ``None``.
        enable_ipv4 (bool): UDP over IPv4: a server listens on it, a client connects to IPv4 addresses. Default
            ``True``.
        enable_ipv6 (bool): UDP over IPv6, likewise. Default ``True``.
        enable_ipc (bool): Shared-memory connections within this host: a server's ``bind`` serves IPC too, and a client
            tries IPC first when the host is this one. Default ``True``.
        encrypt_ipc (bool): IPC connections are encrypted too unless this is False (shared memory is readable by the
            user). Default ``True``.
        network_mtu (int): Largest datagram of each UDP connection's publications (a multiple of 32 in 1024..65504);
            longer records are fragmented. Default ``1408``.
        term_length (int): Term length of each UDP connection's publications (three terms are mapped per publication).
            Default ``256 * 1024`` (262144).
        ipc_term_length (int): Term length of each IPC connection's publications (a power of two from 64 KiB to 1 GiB).
            Default ``1048576``.
        reliable (bool): Reliable UDP streams (retransmission); with False, lost records are simply missing. Default
            ``True``.
        handshake_timeout (float): How long a half-open handshake may last (server) / one connect attempt waits
            (client). Default ``10.0``.
        close_timeout (float): How long ``close`` waits for the CLOSE frame to leave before tearing the streams down,
            and (asyncio) for coroutine listeners still running, ``on_disconnect`` among them, before cancelling them.
            Default ``2.0``.
        connection_expiry (float): A peer silent this long is gone (shorter blips do not disconnect). Default ``4.0``.
        send_timeout (float): How long ``send`` waits out back-pressure before raising SendTimeout. Default ``5.0``.
        driver_directory (str | os.PathLike[str] | None): The media driver's directory (None: the default, shared by the
            host's processes). Default ``None``.
        driver (DriverMode): ``auto`` attaches to a running driver or embeds one; ``embedded``; ``external``;
            ``invoker``: an embedded driver run by the endpoint's own asyncio loop (no driver thread competing for the
            GIL: the lowest UDP latency). Default ``"auto"``.
        driver_config (DriverConfig | None): Tuning of a media driver this endpoint starts (idle strategy, socket
            buffers, receiver window, linger, ``unique_directory``...): fields left at their defaults take the network
            layer's; a driver that runs already keeps its settings, and a ``DriverSettingsIgnored`` warning names what
            differs (``network.tuning``). Default ``None``.
        recording (RecordingConfig | None): Record handshakes, connections and per-connection statistics (and the
            driver's counters) as Parquet telemetry for ``slipstream pipeline report``; None (the default) records
            nothing. Default ``None``.
        connection_class (type[Any] | None): A subclass of ``slipstream.network.Connection`` to make every connection of
            (its ``outgoing`` and ``dispatch`` see each message sent and received); None: ``Connection`` itself. Default
            ``None``.
        error_filter (Callable[[BaseException], bool] | None): Which errors ``on_error`` (or the log) hears: False keeps
            one quiet, counted in ``errors`` only. Default ``None``.
        tag (str): Sent to the server with the handshake (its filter callback sees it); at most 32 characters. Default
            ``""``.
        port (int | None): Local UDP port of the connection's subscription (None: any free port). Default ``None``.
        allow_key_change (bool): Accept a server whose key differs from the pinned one (and re-pin it). Default
            ``False``.
        connect_timeout (float | None): Default timeout of ``connect`` in seconds; 0 or None waits forever (the seed's
            0). Default ``30.0``.
        reconnect (bool): After a connection is lost (the server went silent past the expiry, its stream ended, or the
            media driver was lost; not after a close), connect again to the same server, waiting 0.05 s, then twice as
            long after each failure up to ``reconnect_max_delay``, until it works or ``close`` is called (an embedded
            driver that died is restarted, an external one waited for). ``await send`` on the lost connection waits (up
            to ``send_timeout``) and goes out on the new one. Default ``True``.
        reconnect_max_delay (float): The longest wait between two reconnection attempts, in seconds. Default ``5.0``.
    """

    tag: str = ""
    """Sent to the server with the handshake (its filter callback sees it); at most 32 characters."""
    port: int | None = None
    """Local UDP port of the connection's subscription (None: any free port)."""
    allow_key_change: bool = False
    """Accept a server whose key differs from the pinned one (and re-pin it)."""
    connect_timeout: float | None = 30.0
    """Default timeout of ``connect`` in seconds; 0 or None waits forever (the seed's 0)."""
    reconnect: bool = True
    """After a connection is lost (the server went silent past the expiry, its stream ended, or the media
    driver was lost; not after a close), connect again to the same server, waiting 0.05 s, then twice as
    long after each failure up to ``reconnect_max_delay``, until it works or ``close`` is called (an
    embedded driver that died is restarted, an external one waited for). ``await send`` on the lost
    connection waits (up to ``send_timeout``) and goes out on the new one."""
    reconnect_max_delay: float = 5.0
    """The longest wait between two reconnection attempts, in seconds."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_type("tag", self.tag, str)
        if len(self.tag) > 32:
            raise ConfigError(f"tag must be at most 32 characters: {self.tag!r}")
        if self.port is not None:
            _check_type("port", self.port, int)
            if not 1 <= self.port <= 65534:
                raise ConfigError(f"port must be in 1..65534: {self.port}")
        _check_type("allow_key_change", self.allow_key_change, bool)
        if self.connect_timeout is not None:
            _check_type("connect_timeout", self.connect_timeout, (int, float))
            if self.connect_timeout < 0:
                raise ConfigError(f"connect_timeout must not be negative (0, None: forever): {self.connect_timeout!r}")
        _check_type("reconnect", self.reconnect, bool)
        _positive("reconnect_max_delay", self.reconnect_max_delay)
