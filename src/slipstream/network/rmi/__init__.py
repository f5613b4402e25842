"""Remote objects (RMI), sans-I/O: interfaces, object tables, calls and the host-side dispatcher.

One idea per module: :mod:`.wire` (the frames' layout), :mod:`.registry` (interfaces a peer may call),
:mod:`.objects` (references, proxies as the core sees them, object tables), :mod:`.pending` (calls in
flight), :mod:`.endpoint` (one connection's calls, both sides), :mod:`.files` (``Path`` arguments and
results as streamed files), :mod:`.calls` (all of it as the connection machine composes it) and
:mod:`.machine` (the machine's own remote-objects methods).
Events are in :mod:`..events`, errors in :mod:`..errors`; the awaitable proxies are the adapter's.

How a connection composes it: one :class:`RemoteCalls` per connection (over an :class:`RmiEndpoint`;
the server passes its global :class:`ObjectTable`), given to the connection machine at construction:
RMI frames and RMI-marked file streams go in, frames (in call order) and pure-data events come out,
its deadline joins the connection's, and it closes with the connection.
"""

from ..errors import (
    InterfaceError,
    ObjectIdInUse,
    RemoteError,
    RemoteObjectMissing,
    RmiCallTimeout,
    RmiConnectionClosed,
    RmiError,
    RmiRequestRefused,
)
from ..events import RmiCallCompleted, RmiCallFailed, RmiEvent, RmiFailure, RmiObjectReceived, RmiOnewayFailed
from .calls import RemoteCalls
from .endpoint import RmiEndpoint, RmiStats, exception_from
from .files import FileChannel, RmiFiles, StreamsChannel
from .invocation import Invocation
from .objects import ObjectTable, ProxyBase, RemoteRef
from .pending import IdPool
from .registry import InterfaceSpec, MethodSpec, RmiRegistry
from .wire import DEFAULT_TIMEOUT_NS, FILE_STREAM_MARK, ONEWAY_REQUEST_ID, FileRef, OutFrame

__all__ = [
    "DEFAULT_TIMEOUT_NS",
    "FILE_STREAM_MARK",
    "ONEWAY_REQUEST_ID",
    "FileChannel",
    "FileRef",
    "IdPool",
    "InterfaceError",
    "InterfaceSpec",
    "Invocation",
    "MethodSpec",
    "ObjectIdInUse",
    "ObjectTable",
    "OutFrame",
    "ProxyBase",
    "RemoteCalls",
    "RemoteError",
    "RemoteObjectMissing",
    "RemoteRef",
    "RmiCallCompleted",
    "RmiCallFailed",
    "RmiCallTimeout",
    "RmiConnectionClosed",
    "RmiEndpoint",
    "RmiError",
    "RmiEvent",
    "RmiFailure",
    "RmiFiles",
    "RmiObjectReceived",
    "RmiOnewayFailed",
    "RmiRegistry",
    "RmiRequestRefused",
    "RmiStats",
    "StreamsChannel",
    "exception_from",
]
