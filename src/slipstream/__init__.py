"""slipstream: fast, secure messaging between processes and machines.

The transport API (Aeron's vocabulary, Python's spelling) is re-exported here:
``Context``, publications, subscriptions, images, ``FragmentAssembler``, idle strategies and the
offer result codes. The media driver's own classes (``MediaDriver``, ``ConfigFileError``) load when first
used: a process that attaches to a driver, or whose ``Context`` has not started one, never imports them.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .client import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    AsyncBackoff,
    BackoffIdleStrategy,
    BlockHandler,
    BufferClaim,
    BusySpinIdleStrategy,
    Context,
    Counter,
    DriverAlreadyRunningError,
    DriverError,
    DriverLostError,
    DriverUnavailableError,
    ExclusivePublication,
    FragmentAssembler,
    FragmentHandler,
    Header,
    IdleStrategy,
    Image,
    Publication,
    Registration,
    RegistrationError,
    SleepingIdleStrategy,
    Subscription,
    YieldingIdleStrategy,
    block_frames,
    fast_path_active,
    offer_async,
    poll_async,
    registered,
    result_name,
)
from .driver.config import DriverConfig
from .errors import (
    DriverConfigError,
    DriverDirectoryError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SlipstreamError,
)
from .files.cnc import CncError
from .wire.uri import ChannelUri, ChannelUriError, UnsupportedChannelError

if TYPE_CHECKING:
    from .driver.config_file import ConfigFileError
    from .driver.media_driver import MediaDriver
else:  # mypy reads the imports (a module __getattr__ would hide typos from it); a run loads on use
    __getattr__, __dir__ = lazy_exports(
        __name__, {".driver.config_file": ["ConfigFileError"], ".driver.media_driver": ["MediaDriver"]}
    )

__version__ = "0.1.0"

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "AsyncBackoff",
    "BackoffIdleStrategy",
    "BlockHandler",
    "BufferClaim",
    "BusySpinIdleStrategy",
    "ChannelUri",
    "ChannelUriError",
    "CncError",
    "ConfigFileError",
    "Context",
    "Counter",
    "DriverAlreadyRunningError",
    "DriverConfig",
    "DriverConfigError",
    "DriverDirectoryError",
    "DriverError",
    "DriverLostError",
    "DriverUnavailableError",
    "ExclusivePublication",
    "FragmentAssembler",
    "FragmentHandler",
    "block_frames",
    "fast_path_active",
    "Header",
    "IdleStrategy",
    "Image",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "MediaDriver",
    "Publication",
    "Registration",
    "RegistrationError",
    "SleepingIdleStrategy",
    "SlipstreamError",
    "Subscription",
    "UnsupportedChannelError",
    "YieldingIdleStrategy",
    "__version__",
    "offer_async",
    "poll_async",
    "registered",
    "result_name",
]
