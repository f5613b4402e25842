"""Defaults of the unicast protocol machines: timers, windows and limits (C driver defaults).

Durations are in nanoseconds. Every number comes from the public Aeron protocol (see
shared/reference/aeron-wire-protocol.md, section 2) unless its docstring says slipstream differs.
"""

from __future__ import annotations

from typing import Final

RECEIVER_WINDOW_DEFAULT: Final = 128 * 1024
SO_RCVBUF_DEFAULT: Final = 128 * 1024
PUBLICATION_SETUP_TIMEOUT_NS: Final = 100_000_000
"""SETUP is resent this often until the first status message (or while one is elicited)."""
PUBLICATION_HEARTBEAT_TIMEOUT_NS: Final = 100_000_000
"""An idle sender sends a heartbeat after this long without data."""
STATUS_MESSAGE_TIMEOUT_NS: Final = 200_000_000
"""A receiver sends a status message at least this often."""
PUBLICATION_CONNECTION_TIMEOUT_NS: Final = 5_000_000_000
"""A receiver whose status messages stopped this long ago no longer counts as connected."""
PUBLICATION_LINGER_TIMEOUT_NS: Final = 5_000_000_000
IMAGE_LIVENESS_TIMEOUT_NS: Final = 10_000_000_000
"""An image that received no packet (heartbeats count) for this long is dropped."""
PENDING_SETUP_TIMEOUT_NS: Final = 1_000_000_000
"""A receiver asks an unknown session for SETUP at most once per this period."""
RECEIVE_DESTINATION_TIMEOUT_NS: Final = 5_000_000_000
"""A receiver sends SMs/NAKs to a sender only while packets from it arrived within this period."""
IMAGE_SM_EOS_MULTIPLE: Final = 5
"""A drained end-of-stream image lingers this many status-message timeouts before removal."""
NAK_UNICAST_DELAY_NS: Final = 1_000
NAK_UNICAST_RETRY_DELAY_RATIO: Final = 100
"""The NAK retry delay is the NAK delay times this ratio (100 us by default)."""
NAK_MULTICAST_MAX_BACKOFF_NS: Final = 10_000_000
NAK_MULTICAST_GROUP_SIZE: Final = 10
RETRANSMIT_UNICAST_DELAY_NS: Final = 0
RETRANSMIT_UNICAST_LINGER_NS: Final = 10_000_000
"""NAKs overlapping a retransmission are ignored for this long after it."""
RETRANSMIT_UNICAST_MAX_ACTIONS: Final = 1
MAX_RESEND_DEFAULT: Final = 16
"""Retransmit actions kept at once on group (multicast/MDC) channels."""
MAX_RESEND_MAX: Final = 256
RETRANSMIT_UNICAST_RECEIVER_WINDOW_MULTIPLE: Final = 16
RETRANSMIT_MULTICAST_RECEIVER_WINDOW_MULTIPLE: Final = 4
SENDER_MAX_MESSAGES_PER_SEND: Final = 4
"""Datagrams of new data a sender sends per duty cycle."""
MDC_DESTINATION_TIMEOUT_NS: Final = 5_000_000_000
"""A dynamic MDC destination that sent no status message for this long is dropped (as Aeron)."""
MDC_REGISTRATION_INTERVAL_NS: Final = 1_000_000_000
"""How often a dynamic MDC subscription (re)registers at the publication's control address."""
