"""What the transport machines tell their adapter: pure data, ids and values, never live objects.

Every machine queues these and hands them out through ``take_events()``; the adapter (the media
driver, a simulation) reacts by id (``image_id`` for images, session and stream for a sender), so
nothing outside a machine keys anything by object identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from ..wire.address import Address

__all__ = [
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
]


# -- receive endpoint and images --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageCreated:
    """A SETUP created image ``image_id`` (``ReceiveEndpoint.image_by_id``); subscribers start at ``join_position``."""

    session_id: int
    stream_id: int
    source: Address
    join_position: int
    image_id: int


@dataclass(frozen=True, slots=True)
class ImageEndOfStream:
    """The sender signalled end-of-stream at ``position`` (also written to the log metadata)."""

    session_id: int
    stream_id: int
    position: int


@dataclass(frozen=True, slots=True)
class ImageRemoved:
    """The image left the endpoint (``reason``: end_of_stream, liveness_timeout or unsubscribed);
    subscribers should see it become unavailable. Its log lingers until :class:`ImageReleased`."""

    session_id: int
    stream_id: int
    reason: str
    image_id: int


@dataclass(frozen=True, slots=True)
class ImageReleased:
    """The image's linger ended: its log may be unmapped and deleted."""

    session_id: int
    stream_id: int
    image_id: int


@dataclass(frozen=True, slots=True)
class LossDetected:
    """A gap was found (first time, or grown): one loss-report observation of ``bytes_lost`` new bytes."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    bytes_lost: int
    timestamp_ns: int


@dataclass(frozen=True, slots=True)
class GapFilled:
    """``reliable=False``: a gap was padded so delivery continues; those bytes are gone for good."""

    session_id: int
    stream_id: int
    position: int
    length: int


ReceiverEvent: TypeAlias = ImageCreated | ImageEndOfStream | ImageRemoved | ImageReleased | LossDetected | GapFilled
"""Everything a :class:`~slipstream.protocol.receive_endpoint.ReceiveEndpoint` reports."""


# -- sender -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublicationConnected:
    """A receiver's status message arrived: the publication may be appended to (``pub-lmt`` opens)."""

    session_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class PublicationDisconnected:
    """No receiver sent a status message within the connection timeout (or the last one left)."""

    session_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class PublicationErrorReceived:
    """A receiver sent an ERR frame (e.g. it rejected the image)."""

    session_id: int
    stream_id: int
    receiver_id: int
    error_code: int
    error_text: str


@dataclass(frozen=True, slots=True)
class PublicationEndOfStreamSent:
    """Everything appended was sent; heartbeats now carry end-of-stream at ``position``."""

    session_id: int
    stream_id: int
    position: int


@dataclass(frozen=True, slots=True)
class PublicationFinished:
    """Lingering ended: the adapter may retire the publication and release its log."""

    session_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class DestinationAdded:
    """Dynamic MDC: a status message from a new address made it a destination."""

    session_id: int
    stream_id: int
    destination: Address


@dataclass(frozen=True, slots=True)
class DestinationRemoved:
    """Dynamic MDC: a destination sent no status message for the destination timeout and was dropped."""

    session_id: int
    stream_id: int
    destination: Address


SenderEvent: TypeAlias = (
    PublicationConnected
    | PublicationDisconnected
    | PublicationErrorReceived
    | PublicationEndOfStreamSent
    | PublicationFinished
    | DestinationAdded
    | DestinationRemoved
)
"""Everything a :class:`~slipstream.protocol.sender.NetworkPublicationSender` reports."""
