"""Sender flow control: how far a sender may send, from its receivers' status messages.

Aeron's ``UnicastFlowControl`` / ``MaxMulticastFlowControl``: the sender limit is the furthest edge
(consumption position + receiver window) any status message announced, and the publication counts as
connected while some receiver sent one within the connection timeout. Receiver liveness is tracked
for at most ``max_tracked_receivers`` receiver ids, whatever ids peers invent.
"""

from __future__ import annotations

from .config import SenderConfig

__all__ = ["FlowControl"]


class FlowControl:
    """The sender limit and the receivers that keep a publication connected."""

    def __init__(self, config: SenderConfig, start_position: int) -> None:
        self.config = config
        self.sender_limit = start_position
        """``snd-lmt``: max(sm_position + receiver_window) over status messages."""
        self.receivers: dict[int, int] = {}
        """receiver_id -> time of its last status message."""
        self.expiry_ns = 1 << 62
        """No tracked receiver can time out before this (checked every poll, so kept cheap)."""

    def on_status_message(self, receiver_id: int, edge: int, eos: bool, now_ns: int) -> None:
        """A receiver reported its window edge; an EOS status message says it left."""
        if eos:
            self.receivers.pop(receiver_id, None)
        else:
            self._track(receiver_id, now_ns)
        if edge > self.sender_limit:
            self.sender_limit = edge

    def remove(self, receiver_id: int) -> None:
        """A receiver said it is gone (an ERR frame)."""
        self.receivers.pop(receiver_id, None)

    def _track(self, receiver_id: int, now_ns: int) -> None:
        receivers = self.receivers
        if receiver_id not in receivers and len(receivers) >= self.config.max_tracked_receivers:
            self.expire(now_ns)
            if len(receivers) >= self.config.max_tracked_receivers:
                del receivers[min(receivers, key=receivers.__getitem__)]
        receivers[receiver_id] = now_ns
        expiry = now_ns + self.config.connection_timeout_ns
        if expiry < self.expiry_ns:
            self.expiry_ns = expiry

    def expire(self, now_ns: int) -> None:
        """Forget receivers whose last status message is older than the connection timeout."""
        if now_ns < self.expiry_ns:
            return
        timeout = self.config.connection_timeout_ns
        deadline = now_ns - timeout
        for receiver_id in [r for r, t in self.receivers.items() if t <= deadline]:
            del self.receivers[receiver_id]
        self.expiry_ns = min(self.receivers.values(), default=(1 << 62) - timeout) + timeout
