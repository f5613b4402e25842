"""Aeron-style client API: context, publications, subscriptions, images, assembler, idle strategies.

May import ``files``, ``logbuffer``, ``wire`` and ``slipstream.errors``; ``driver`` only to start an
embedded driver (``Context(driver="embedded")``). ``telemetry``, ``echo``, ``network`` and above use it.
"""

from ..files.idle import (
    BackoffIdleStrategy,
    BusySpinIdleStrategy,
    IdleStrategy,
    SleepingIdleStrategy,
    YieldingIdleStrategy,
)
from ..logbuffer import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    BlockHandler,
    BufferClaim,
    FragmentHandler,
    Header,
    block_frames,
    fast_path_active,
    result_name,
)
from .aio import AsyncBackoff, offer_async, poll_async, registered
from .assembler import FragmentAssembler
from .context import Context, Registration
from .counter import Counter
from .errors import DriverAlreadyRunningError, DriverError, DriverLostError, DriverUnavailableError, RegistrationError
from .image import Image
from .publication import ExclusivePublication, Publication
from .subscription import Subscription

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
    "Context",
    "Counter",
    "DriverAlreadyRunningError",
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
    "Publication",
    "Registration",
    "RegistrationError",
    "SleepingIdleStrategy",
    "Subscription",
    "YieldingIdleStrategy",
    "offer_async",
    "poll_async",
    "registered",
    "result_name",
]
