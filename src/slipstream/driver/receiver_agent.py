"""The receiver agent: Aeron's ``Receiver``, feeding every subscription endpoint.

Each duty cycle it gives every image its subscribers' consumption position (the slowest one), lets
every receive channel take in datagrams (if its socket is readable) and send what its endpoint
wants sent, and collects the endpoints' image events for the conductor, which links images to
subscriptions and tells clients. It owns no resources: the conductor adds and closes channels.
"""

from __future__ import annotations

from ..files.counters import CountersManager
from ..protocol.events import ReceiverEvent
from .receive_channel import ReceiveChannel
from .udp_channel import UdpEndpoint

__all__ = ["ReceiverAgent"]


class ReceiverAgent:
    """Every receive channel of the driver, by bound endpoint."""

    def __init__(self) -> None:
        self.channels: dict[UdpEndpoint, ReceiveChannel] = {}
        self.image_events: list[tuple[ReceiveChannel, ReceiverEvent]] = []
        """Events of every endpoint since the conductor last took them (``take_image_events``)."""

    def do_work(self, now_ns: int, readable: set[int], counters: CountersManager) -> int:
        """Consumption in, datagrams in, datagrams out, for every channel; events queue for the conductor."""
        work = 0
        get = counters.get
        events = self.image_events
        for channel in self.channels.values():
            for image in channel.images.values():
                subscribers = image.subscribers
                if subscribers and not image.removed:
                    # Every duty cycle: one subscriber (the common case) without building a map and a min.
                    positions = subscribers.values()
                    image.receiver.on_consumption(
                        get(*positions) if len(subscribers) == 1 else min(map(get, positions))
                    )
            work += channel.do_work(now_ns, channel.sock.fd in readable)
            if channel.receive.has_events:
                events.extend((channel, event) for event in channel.receive.take_events())
        return work

    def take_image_events(self) -> list[tuple[ReceiveChannel, ReceiverEvent]]:
        """The image events collected since the last call, each with its channel."""
        events, self.image_events = self.image_events, []
        return events
