"""The sender agent: Aeron's ``Sender``, moving every network publication's datagrams.

Each duty cycle it lets every UDP publication take in control datagrams (if its socket is readable)
and send what its sans-I/O sender wants sent, then reads what the senders reported. It owns no
resources: the conductor adds publications, and retires those this agent reports finished.
"""

from __future__ import annotations

from ..files.counters import CountersManager
from ..protocol.events import (
    DestinationAdded,
    DestinationRemoved,
    PublicationConnected,
    PublicationDisconnected,
    PublicationEndOfStreamSent,
    PublicationErrorReceived,
    PublicationFinished,
)
from .network_publication import NetworkPublication

__all__ = ["SenderAgent"]


class SenderAgent:
    """Every network publication of the driver, by registration id."""

    def __init__(self) -> None:
        self.publications: dict[int, NetworkPublication] = {}

    def do_work(
        self, now_ns: int, readable: set[int], counters: CountersManager
    ) -> tuple[int, list[NetworkPublication]]:
        """One duty cycle over every publication; returns the work done and the publications that finished."""
        work = 0
        finished: list[NetworkPublication] = []
        # Nothing here adds or removes publications (the conductor retires them afterwards), so this
        # iterates the dict itself.
        for network in self.publications.values():
            work += network.do_work(now_ns, network.sock.fd in readable, counters)
            if network.sender.has_events and _finished(network):
                finished.append(network)
        return work, finished


def _finished(network: NetworkPublication) -> bool:
    """React to what a sender reported; True when it finished and the publication can be retired."""
    done = False
    for event in network.sender.take_events():
        match event:
            case PublicationFinished():
                done = True
            case PublicationConnected() | PublicationDisconnected():
                pass  # the sender already set the log's connected flag, which clients' offers read
            case PublicationErrorReceived():
                pass  # kept as the sender's last_error; a receiver refusing the image is its business
            case PublicationEndOfStreamSent():
                pass  # the end of stream is the subscribers' news, carried by the heartbeats themselves
            case DestinationAdded() | DestinationRemoved():
                pass  # the sender's destinations already reflect them; the socket sends to those
    return done
