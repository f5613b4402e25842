"""The echo client and server of "Aeron For The Working Programmer", take 1 and take 2.

Take 1 (:mod:`.take1`) is the guide's naive first version: the server publishes back to a port the
client names, which a NAT router drops. Take 2 (:mod:`.take2`, "Echo 2.0") reaches clients behind
NAT with dynamic multi-destination-cast and gives each client its own duologue, with limits, expiry
and a one-time pad protecting the duologue's session id. :mod:`.messages` is the protocol without I/O.
An application of the transport: may import ``telemetry``, ``client`` and the floors below, never its
sibling ``network``; only ``cli`` imports it.
"""

from . import messages, take1, take2
from .common import EchoError, SendError
from .messages import ECHO_STREAM_ID
from .take2 import EchoClientRejectedError, EchoClientTimedOutError, EchoServerConfiguration

__all__ = [
    "ECHO_STREAM_ID",
    "EchoClientRejectedError",
    "EchoClientTimedOutError",
    "EchoError",
    "EchoServerConfiguration",
    "SendError",
    "messages",
    "take1",
    "take2",
]
