"""Sans-I/O transport machines: sender, retransmit, flow control, image, loss detection, receive endpoint.

They take datagrams and ``now_ns`` and return datagrams (with addresses), pure-data events
(``events``, through each machine's ``take_events()``) and a public ``deadline_ns``; no sockets,
threads or clocks. One idea per module, as Aeron splits ``LossDetector``, ``RetransmitHandler`` and
``FlowControl`` out of its publication and image classes. May import ``wire`` and ``logbuffer``
(and ``slipstream.errors``); the driver and tests are their adapters.
"""

from .config import ReceiverConfig, SenderConfig
from .events import (
    DestinationAdded,
    DestinationRemoved,
    GapFilled,
    ImageCreated,
    ImageEndOfStream,
    ImageReleased,
    ImageRemoved,
    LossDetected,
    PublicationConnected,
    PublicationDisconnected,
    PublicationEndOfStreamSent,
    PublicationErrorReceived,
    PublicationFinished,
    ReceiverEvent,
    SenderEvent,
)
from .image import ImageLog, ImageParams, LogFactory, Outgoing, PublicationImageReceiver, default_log_factory
from .lifecycle import ImageState, Lifecycle, SenderState
from .receive_endpoint import ReceiveEndpoint
from .sender import NetworkPublicationSender

__all__ = [
    "DestinationAdded",
    "DestinationRemoved",
    "GapFilled",
    "ImageCreated",
    "ImageEndOfStream",
    "ImageLog",
    "ImageParams",
    "ImageReleased",
    "ImageRemoved",
    "ImageState",
    "Lifecycle",
    "LogFactory",
    "LossDetected",
    "NetworkPublicationSender",
    "Outgoing",
    "PublicationConnected",
    "PublicationDisconnected",
    "PublicationEndOfStreamSent",
    "PublicationErrorReceived",
    "PublicationFinished",
    "PublicationImageReceiver",
    "ReceiveEndpoint",
    "ReceiverConfig",
    "ReceiverEvent",
    "SenderConfig",
    "SenderEvent",
    "SenderState",
    "default_log_factory",
]
