"""The driver's system counters: totals over every sender and receiver, as Aeron numbers them.

The sans-I/O state machines keep plain integer counters; the driver mirrors their sums into the
shared counters file on its timer, adding what retired publications and endpoints had counted so
totals never go backwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ..files.counters import SYSTEM_COUNTER_TYPE_ID, CountersManager
from .network_publication import NetworkPublication
from .receive_channel import ReceiveChannel

# (id, label) in Aeron's order; ids above 24 are slipstream's own.
SYSTEM_COUNTERS: Final = (
    (0, "Bytes sent"),
    (1, "Bytes received"),
    (2, "Failed offers to ReceiverProxy"),
    (3, "Failed offers to SenderProxy"),
    (4, "Failed offers to DriverConductorProxy"),
    (5, "NAKs sent"),
    (6, "NAKs received"),
    (7, "Status Messages sent"),
    (8, "Status Messages received"),
    (9, "Heartbeats sent"),
    (10, "Heartbeats received"),
    (11, "Retransmits sent"),
    (12, "Flow control under runs"),
    (13, "Flow control over runs"),
    (14, "Invalid packets"),
    (15, "Errors"),
    (16, "Short sends"),
    (17, "Failed attempts to free log buffers"),
    (18, "Sender flow control limits, i.e. back-pressure events"),
    (19, "Unblocked Publications"),
    (20, "Unblocked Control Commands"),
    (21, "Possible TTL Asymmetry"),
    (22, "ControllableIdleStrategy status"),
    (23, "Loss gap fills"),
    (24, "Client liveness timeouts"),
    (25, "Retransmitted bytes"),
    (26, "Status Messages rejected"),
    (27, "Error Frames received"),
    (28, "Loss observations"),
    (29, "Bytes lost"),
    (30, "Driver stalls"),
    (31, "SETUPs refused"),
    (32, "Images rejected"),
)
BYTES_SENT, BYTES_RECEIVED = 0, 1
NAKS_SENT, NAKS_RECEIVED, SMS_SENT, SMS_RECEIVED, HEARTBEATS_SENT, HEARTBEATS_RECEIVED = 5, 6, 7, 8, 9, 10
RETRANSMITS_SENT, FC_UNDER_RUNS, FC_OVER_RUNS, INVALID_PACKETS, ERRORS, SHORT_SENDS = 11, 12, 13, 14, 15, 16
SENDER_FLOW_CONTROL_LIMITS, LOSS_GAP_FILLS, CLIENT_TIMEOUTS = 18, 23, 24
RETRANSMITTED_BYTES, SMS_REJECTED, ERROR_FRAMES_RECEIVED, LOSS_OBSERVATIONS, BYTES_LOST = 25, 26, 27, 28, 29
DRIVER_STALLS = 30
"""Gaps between duty cycles above ``stall_threshold_ns`` (the process stopped): timeouts left them out."""
SETUPS_REFUSED, IMAGES_REJECTED = 31, 32
"""Valid SETUPs that made no image (beyond a limit or a stream's budget); images a subscriber rejected."""


def _sender_totals(publication: NetworkPublication) -> dict[int, int]:
    s = publication.sender
    return {
        BYTES_SENT: s.bytes_sent,
        NAKS_RECEIVED: s.naks_received,
        SMS_RECEIVED: s.status_messages_received,
        HEARTBEATS_SENT: s.heartbeats_sent,
        RETRANSMITS_SENT: s.retransmits_sent,
        INVALID_PACKETS: s.invalid_packets,
        SHORT_SENDS: publication.short_sends,
        SENDER_FLOW_CONTROL_LIMITS: s.flow_control_limits,
        RETRANSMITTED_BYTES: s.retransmitted_bytes,
        SMS_REJECTED: s.status_messages_rejected,
        ERROR_FRAMES_RECEIVED: s.errors_received,
    }


def _receiver_totals(channel: ReceiveChannel) -> dict[int, int]:
    totals = {
        INVALID_PACKETS: channel.receive.invalid_packets,
        SHORT_SENDS: channel.short_sends,
        SETUPS_REFUSED: channel.receive.setups_rejected,
        IMAGES_REJECTED: channel.receive.images_rejected,
    }
    for image in channel.images.values():
        r = image.receiver
        for key, value in (
            (BYTES_RECEIVED, r.bytes_received),
            (NAKS_SENT, r.naks_sent),
            (SMS_SENT, r.status_messages_sent),
            (HEARTBEATS_RECEIVED, r.heartbeats_received),
            (FC_UNDER_RUNS, r.flow_control_under_runs),
            (FC_OVER_RUNS, r.flow_control_over_runs),
            (LOSS_GAP_FILLS, r.loss_gap_fills),
            (LOSS_OBSERVATIONS, r.loss_observations),
            (BYTES_LOST, r.bytes_lost),
        ):
            totals[key] = totals.get(key, 0) + value
    return totals


class SystemCounters:
    """Allocates the system counters at driver start and keeps them current."""

    def __init__(self, counters: CountersManager) -> None:
        self.counters = counters
        for expected_id, label in SYSTEM_COUNTERS:
            counter_id = counters.allocate(label, SYSTEM_COUNTER_TYPE_ID, key=expected_id.to_bytes(4, "little"))
            if counter_id != expected_id:
                raise RuntimeError(f"system counter {label!r} got id {counter_id}, expected {expected_id}")
        self._retired: dict[int, int] = {}
        self.client_timeouts = 0
        self.errors = 0
        self.stalls = 0

    def _retire(self, totals: dict[int, int]) -> None:
        for key, value in totals.items():
            self._retired[key] = self._retired.get(key, 0) + value

    def retire_sender(self, publication: NetworkPublication) -> None:
        self._retire(_sender_totals(publication))

    def retire_receiver(self, channel: ReceiveChannel) -> None:
        self._retire(_receiver_totals(channel))

    def update(self, publications: Iterable[NetworkPublication], channels: Iterable[ReceiveChannel]) -> None:
        """Write the totals over the live publications and channels plus what retired ones counted."""
        totals = dict(self._retired)
        sources = [_sender_totals(p) for p in publications]
        sources += [_receiver_totals(c) for c in channels]
        for source in sources:
            for key, value in source.items():
                totals[key] = totals.get(key, 0) + value
        totals[CLIENT_TIMEOUTS] = self.client_timeouts
        totals[ERRORS] = self.errors
        totals[DRIVER_STALLS] = self.stalls
        for key, value in totals.items():
            self.counters.set(key, value)
