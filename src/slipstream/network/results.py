"""What a connection's calls give back, whatever the adapter: a ping's times and a streamed transfer's
progress. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ping", "Transfer"]


@dataclass(frozen=True, slots=True)
class Transfer:
    """A large message or file on its way: bytes so far of ``total`` (``name``: a file's name)."""

    stream_id: int
    incoming: bool
    done: int
    total: int
    name: str = ""


@dataclass(frozen=True, slots=True)
class Ping:
    """A ping's result, as the seed's ``Ping``: seconds. ``outbound``/``inbound`` use each side's
    wall clock, so they include the difference between the two clocks."""

    round_trip: float
    outbound: float
    inbound: float
