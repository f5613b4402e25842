"""An endpoint's ``driver_config``: how it meets the driver settings the network layer chooses, and a driver
that already runs.

The rules, in one place:

1. A ``DriverConfig`` given to ``ServerConfig`` / ``ClientConfig`` (``driver_config=``) tunes only a driver the
   endpoint starts (``driver="embedded"`` or ``"invoker"``, or ``"auto"`` finding none running). Endpoints of one
   process that name the same directory share one driver (``transport.SharedContexts``): the first one starts it.
2. Fields left at ``DriverConfig``'s defaults take the network layer's choices (:data:`NETWORK_DEFAULTS`: idle
   streams heartbeat and acknowledge at most once a second; session ids 1..65535 reserved for servers to
   allocate); a field set to anything else wins. ``driver="invoker"`` sets ``threading_mode="invoker"``.
3. Attaching to a driver that runs already (another process's, ``driver="external"``, or the one another
   endpoint of this process started), an endpoint reads that driver's effective settings (its ``driver.toml``)
   and warns with :class:`DriverSettingsIgnored`, naming each field it set that the driver runs otherwise.
   ``warnings.simplefilter("error", DriverSettingsIgnored)`` turns that into an error.
4. ``unique_directory=True`` gives the endpoint a driver of its own in a directory of its own (never shared, so
   rule 3 never applies); it needs ``enable_ipc=False`` (nobody else can reach that driver's shared memory), as
   the seed's ``uniqueAeronDirectory`` excludes IPC.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Final

from ..driver.config import DriverConfig
from ..driver.config_file import ConfigFileError, effective_config, running_config
from ..files.directory import default_directory

__all__ = [
    "IDLE_DATAGRAM_MAX_NS",
    "NETWORK_DEFAULTS",
    "DriverSettingsIgnored",
    "check_driver_config",
    "endpoint_driver_config",
    "warn_if_ignored",
]

IDLE_DATAGRAM_MAX_NS: Final = 1_000_000_000
"""The longest period of an idle stream's heartbeats and status messages in drivers the network layer
starts (Aeron: 100 ms and 200 ms; see ``DriverConfig.idle_heartbeat_max_ns``)."""
SERVER_SESSION_IDS: Final = (1, 65535)
"""Session ids a server allocates: a driver the network layer starts never picks them by itself."""
NETWORK_DEFAULTS: Final[dict[str, object]] = {
    # An idle connection's streams heartbeat and acknowledge less and less often (up to once a second):
    # each datagram costs both hosts a system call and wakes an idle peer.
    "idle_heartbeat_max_ns": IDLE_DATAGRAM_MAX_NS,
    "idle_status_message_max_ns": IDLE_DATAGRAM_MAX_NS,
    "reserved_session_id_low": -1,
    "reserved_session_id_high": SERVER_SESSION_IDS[1],
}
"""What a driver the network layer starts runs with where the endpoint's ``driver_config`` keeps
``DriverConfig``'s default."""
_NOT_COMPARED: Final = frozenset({"directory", "unique_directory", "record_directory", "record_interval_ns"})
"""Fields that describe where a driver is or what its standalone process records, not how it runs."""


class DriverSettingsIgnored(UserWarning):
    """An endpoint's ``driver_config`` sets something the driver it attached to (started elsewhere) runs
    otherwise: the message names each field, what was asked and what runs."""


def _explicit(config: DriverConfig) -> dict[str, object]:
    """The fields of ``config`` set to something other than ``DriverConfig``'s defaults."""
    defaults = DriverConfig(directory=config.directory)
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.name not in _NOT_COMPARED and getattr(config, f.name) != getattr(defaults, f.name)
    }


def check_driver_config(
    config: DriverConfig, *, driver: str, directory: str | os.PathLike[str] | None, enable_ipc: bool
) -> str | None:
    """What is wrong with ``config`` as an endpoint's ``driver_config`` (the message names the field), or None."""
    if config.unique_directory and driver == "external":
        return "driver_config.unique_directory needs a driver the endpoint starts, not driver='external'"
    if config.unique_directory and enable_ipc:
        return "driver_config.unique_directory needs enable_ipc=False (no other endpoint reaches a unique driver)"
    if config.threading_mode == "invoker" and driver != "invoker":
        return "driver_config.threading_mode='invoker' is driver='invoker' (the endpoint's loop runs the driver)"
    if directory is not None and config.directory != default_directory() and Path(directory) != config.directory:
        return f"driver_directory {os.fspath(directory)!r} contradicts driver_config.directory {config.directory}"
    explicit = _explicit(config)
    low, high = SERVER_SESSION_IDS
    if "reserved_session_id_low" in explicit and config.reserved_session_id_low > low:
        return f"driver_config.reserved_session_id_low must be at most {low} (servers allocate {low}..{high})"
    if "reserved_session_id_high" in explicit and config.reserved_session_id_high < high:
        return f"driver_config.reserved_session_id_high must be at least {high} (servers allocate {low}..{high})"
    return None


def endpoint_driver_config(config: DriverConfig | None, *, driver: str) -> DriverConfig:
    """The settings of a driver an endpoint starts (rule 2 of the module)."""
    base = config if config is not None else DriverConfig()
    explicit = _explicit(base)
    changes = {name: value for name, value in NETWORK_DEFAULTS.items() if name not in explicit}
    if driver == "invoker":
        changes["threading_mode"] = "invoker"
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def warn_if_ignored(config: DriverConfig | None, directory: Path, *, driver: str) -> list[str]:
    """Rule 3: compare what ``config`` sets with what the driver in ``directory`` runs; warn (and return)
    one line per field that differs. Nothing to compare (no config, or a driver that wrote no settings): []."""
    if config is None:
        return []
    try:
        running = running_config(directory)
    except ConfigFileError:
        return []  # a driver without driver.toml (older, or not yet written): nothing to compare against
    wanted = effective_config(endpoint_driver_config(config, driver=driver), embedded=True)
    lines = [
        f"{name}={getattr(wanted, name)!r} (runs with {getattr(running, name)!r})"
        for name in _explicit(config)
        if name != "dir_delete_on_shutdown" and getattr(wanted, name) != getattr(running, name)
    ]
    if lines:
        warnings.warn(
            DriverSettingsIgnored(
                f"the media driver in {directory} was started elsewhere with other settings; driver_config "
                f"applies only to a driver the endpoint starts, so these are not in effect: {'; '.join(lines)}"
            ),
            stacklevel=4,
        )
    return lines
