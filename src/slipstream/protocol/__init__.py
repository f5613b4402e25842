"""Sans-I/O transport machines: sender, retransmit, flow control, image, loss detection, receive endpoint.

They take datagrams and ``now_ns`` and return datagrams (with addresses), pure-data events
(``events``, through each machine's ``take_events()``) and a public ``deadline_ns``; no sockets,
threads or clocks. One idea per module, as Aeron splits ``LossDetector``, ``RetransmitHandler`` and
``FlowControl`` out of its publication and image classes. May import ``wire`` and ``logbuffer``
(and ``slipstream.errors``); the driver and tests are their adapters. The names below load on first use,
so a module that needs one constant of ``protocol.defaults`` (the driver's configuration) does not import
every machine.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .config import ImageLimits, ReceiverConfig, SenderConfig
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
else:  # mypy reads the imports (a module __getattr__ would hide typos from it); a run loads on use
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            ".config": ["ImageLimits", "ReceiverConfig", "SenderConfig"],
            ".events": [
                "DestinationAdded",
                "DestinationRemoved",
                "GapFilled",
                "ImageCreated",
                "ImageEndOfStream",
                "ImageReleased",
                "ImageRemoved",
                "LossDetected",
                "PublicationConnected",
                "PublicationDisconnected",
                "PublicationEndOfStreamSent",
                "PublicationErrorReceived",
                "PublicationFinished",
                "ReceiverEvent",
                "SenderEvent",
            ],
            ".image": [
                "ImageLog",
                "ImageParams",
                "LogFactory",
                "Outgoing",
                "PublicationImageReceiver",
                "default_log_factory",
            ],
            ".lifecycle": ["ImageState", "Lifecycle", "SenderState"],
            ".receive_endpoint": ["ReceiveEndpoint"],
            ".sender": ["NetworkPublicationSender"],
        },
    )

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
    "ImageLimits",
    "ReceiverConfig",
    "ReceiverEvent",
    "SenderConfig",
    "SenderEvent",
    "SenderState",
    "default_log_factory",
]
