"""Serving NAKs: Aeron's ``RetransmitHandler``, split out of the sender as Aeron does.

A NAK takes a retransmit action (unicast keeps one, which a non-overlapping NAK takes over; group
channels keep up to ``max_resend``). With no retransmit delay (unicast's default) it is answered as
it arrives, with at most ``max_retransmit_datagrams_per_poll`` datagrams (they leave with the next
``poll``); the rest of a long retransmission (up to 16 receiver windows) follows over successive
polls. An action then lingers, so NAKs overlapping it are ignored (reference: 10 ms linger).
A retransmission never goes beyond the sender position (C may resend log data the sender has not
sent yet, past the flow-control limit), and a NAK outside the resend window is counted and dropped.
"""

from __future__ import annotations

import enum

from ..logbuffer import LogBuffers, scan_term
from ..wire.frames import BytesLike
from ..wire.positions import compute_position, index_by_position, max_message_length
from .config import SenderConfig
from .defaults import (
    RETRANSMIT_MULTICAST_RECEIVER_WINDOW_MULTIPLE,
    RETRANSMIT_UNICAST_MAX_ACTIONS,
    RETRANSMIT_UNICAST_RECEIVER_WINDOW_MULTIPLE,
)

__all__ = ["RetransmitAction", "RetransmitHandler", "RetransmitState"]


class RetransmitState(enum.Enum):
    """Where a retransmit action is: free, waiting out the retransmit delay, or lingering after its resend."""

    INACTIVE = 0
    DELAYED = 1
    LINGERING = 2


_INACTIVE, _DELAYED, _LINGERING = RetransmitState.INACTIVE, RetransmitState.DELAYED, RetransmitState.LINGERING


class RetransmitAction:
    """One NAK being served: delayed, then resent (possibly over several polls), then lingering."""

    __slots__ = ("end", "expiry_ns", "length", "next_position", "started", "state", "term_id", "term_offset")

    def __init__(self) -> None:
        self.state = _INACTIVE
        self.term_id = 0
        self.term_offset = 0
        self.length = 0
        self.expiry_ns = 0
        self.next_position = 0
        self.end = 0
        """Resend still owed: stream positions [next_position, end)."""
        self.started = False

    def overlaps(self, term_id: int, term_offset: int) -> bool:
        """Whether a NAK at (``term_id``, ``term_offset``) falls in this action's range while it is busy."""
        return (
            self.state is not _INACTIVE
            and self.term_id == term_id
            and self.term_offset <= term_offset < self.term_offset + self.length
        )


class RetransmitHandler:
    """The retransmit actions of one sender and the datagrams they resend from its log."""

    def __init__(self, log: LogBuffers, config: SenderConfig) -> None:
        self.log = log
        self.config = config
        self._bits = log.bits
        self._mask = log.term_length - 1
        self.term_length = log.term_length
        self.initial_term_id = log.initial_term_id
        self.mtu = log.mtu
        self._max_message_length = max_message_length(log.term_length)
        if config.group:
            multiple = RETRANSMIT_MULTICAST_RECEIVER_WINDOW_MULTIPLE
        else:
            multiple = RETRANSMIT_UNICAST_RECEIVER_WINDOW_MULTIPLE
        self._max_retransmit_length = min(config.receiver_window, log.term_length // 2) * multiple
        actions = config.max_resend if config.group else RETRANSMIT_UNICAST_MAX_ACTIONS
        self._actions = tuple(RetransmitAction() for _ in range(actions))
        self.active = False
        """Some retransmit action is not inactive (so ``process`` has work)."""

        # Counters.
        self.retransmits_sent = 0
        self.retransmitted_bytes = 0
        self.naks_ignored = 0
        """NAKs overlapping a retransmission in progress or lingering (reference: 10 ms linger)."""
        self.naks_outside_window = 0
        """Valid NAKs for data no longer (or not yet) in the resend window: nothing to resend."""
        self.retransmit_overflows = 0

    def on_nak(
        self, term_id: int, offset: int, length: int, snd_pos: int, now_ns: int, resends: list[BytesLike]
    ) -> None:
        """Serve a valid, non-empty NAK: take an action and, with no delay, resend into ``resends`` now."""
        position = compute_position(term_id, offset, self._bits, self.initial_term_id)
        if not self._in_resend_window(position, snd_pos):
            self.naks_outside_window += 1
            return
        action = self._assign_action(term_id, offset)
        if action is None:
            return
        action.term_id = term_id
        action.term_offset = offset
        action.length = min(length, self._max_retransmit_length)
        self.active = True
        config = self.config
        if config.retransmit_delay_ns == 0:
            # Answered now, as the C driver does: NAKs for several gaps in one batch are all served,
            # and a NAK taking over the action cannot cancel the previous one's retransmission.
            self._start_resend(action, snd_pos, now_ns)
            room = config.max_retransmit_datagrams_per_poll * 4 - len(resends)
            if action.next_position < action.end and room > 0:
                self._resend(action, snd_pos, resends, min(room, config.max_retransmit_datagrams_per_poll))
        else:
            action.state = _DELAYED
            action.expiry_ns = now_ns + config.retransmit_delay_ns
            action.next_position = action.end = 0

    def _assign_action(self, term_id: int, term_offset: int) -> RetransmitAction | None:
        """A free action for this NAK, or None when one overlapping it is active (or none is free).

        Unicast keeps one action and a NAK that does not overlap it simply takes it over; group
        channels keep several and count an overflow when all are busy.
        """
        available: RetransmitAction | None = None
        for action in self._actions:
            if action.overlaps(term_id, term_offset):
                self.naks_ignored += 1
                return None
            if action.state is _INACTIVE and available is None:
                available = action
        if available is None:
            if self.config.group:
                self.retransmit_overflows += 1
                return None
            available = self._actions[0]
        return available

    def _in_resend_window(self, position: int, snd_pos: int) -> bool:
        bottom = snd_pos - self.term_length // 2 - self._max_message_length
        return bottom <= position < snd_pos

    def _start_resend(self, action: RetransmitAction, snd_pos: int, now_ns: int) -> None:
        position = compute_position(action.term_id, action.term_offset, self._bits, self.initial_term_id)
        action.state = _LINGERING
        action.expiry_ns = now_ns + self.config.retransmit_linger_ns
        action.started = False
        if self._in_resend_window(position, snd_pos):
            action.next_position = position
            # Never resend beyond what was sent: that data is still subject to flow control.
            action.end = min(position + action.length, snd_pos)
        else:
            action.next_position = action.end = 0

    def deadline(self, now_ns: int) -> tuple[bool, int]:
        """(True, now) if a resend is owed, else (False, when the earliest delay or linger ends)."""
        wake = 1 << 63
        for action in self._actions:
            if action.next_position < action.end:
                return True, now_ns
            if action.state is not _INACTIVE:
                wake = min(wake, action.expiry_ns + 1)
        return False, wake

    def process(self, now_ns: int, snd_pos: int, out: list[BytesLike]) -> None:
        """Start delayed actions that are due, continue resends within the budget, end lingers."""
        budget = self.config.max_retransmit_datagrams_per_poll
        busy = False
        for action in self._actions:
            if action.state is _DELAYED and now_ns > action.expiry_ns:
                self._start_resend(action, snd_pos, now_ns)
            if action.next_position < action.end and budget > 0:
                budget = self._resend(action, snd_pos, out, budget)
            if action.state is _LINGERING and now_ns > action.expiry_ns and action.next_position >= action.end:
                action.state = _INACTIVE
            busy = busy or action.state is not _INACTIVE
        self.active = busy

    def _resend(self, action: RetransmitAction, snd_pos: int, out: list[BytesLike], budget: int) -> int:
        """Send the next datagrams of a retransmission from the log; return the budget left.

        A retransmission longer than the budget continues at the next poll; it is abandoned when the
        log has nothing to send there or the range fell out of the resend window meanwhile.
        """
        position = action.next_position
        bottom = snd_pos - self.term_length // 2 - self._max_message_length
        while position < action.end:
            if budget == 0:
                action.next_position = position
                return 0
            if position < bottom:
                break
            index = index_by_position(position, self._bits)
            offset = position & self._mask
            term = self.log.terms[index]
            max_length = min(self.mtu, action.end - position)
            available, padding = scan_term(term, self.log.terms_i32[index], offset, max_length)
            if available <= 0:
                break
            out.append(bytes(term[offset : offset + available]))
            if not action.started:
                action.started = True
                self.retransmits_sent += 1
            self.retransmitted_bytes += available
            position += available + padding
            budget -= 1
        action.next_position = action.end = position
        return budget
