"""The driver's side of an IPC publication: its log file, its publisher limit and its subscribers.

The data path never passes through here. The driver only turns subscriber positions (written by
subscribers into shared counters) into the publisher limit (read by the publisher), and handles
end of stream when the publication closes or its client dies.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

from ..files.counters import CountersManager
from ..files.directory import release_log_file
from ..logbuffer import LogBuffers, unblock
from ..protocol.lifecycle import ACTIVE, DONE, DRAINING, Lifecycle

PublicationState = Lifecycle
"""A driver publication's lifecycle: active, draining once closed, done (an IPC one has no linger)."""


@dataclass(slots=True, eq=False)
class DriverPublication:
    """What every publication the driver runs has: identity, its log file and its publisher limit."""

    registration_id: int
    client_id: int
    session_id: int
    stream_id: int
    channel: str
    exclusive: bool
    log_path: Path
    mapping: mmap.mmap
    log: LogBuffers
    limit_counter_id: int

    def release_log(self) -> None:
        """Release the mapping and delete the file; mapped readers keep their pages until they unmap."""
        self.log.close()
        release_log_file(self.log_path, self.mapping)


@dataclass(slots=True, eq=False)
class IpcPublication(DriverPublication):
    window: int
    state: PublicationState = ACTIVE
    subscribers: dict[int, int] = field(default_factory=dict)
    """Subscription registration id -> subscriber position counter id."""
    parking: dict[int, int] = field(default_factory=dict)
    """Subscription registration id -> its slot in the log's parking table (doorbells)."""
    position_counters: dict[int, int] = field(default_factory=dict)
    """Type id -> counter id of the per-stream position counters the driver keeps current."""
    stuck_position: int = -1
    stuck_since_ns: int = 0
    connected: bool = False
    """What the log's is-connected flag was last set to (read here without touching the mapping)."""

    def producer_position(self) -> int:
        return self.log.producer_position()

    def update_limit(self, counters: CountersManager) -> int:
        """Set the publisher limit from the slowest subscriber.

        Returns 1 (work done, so the driver keeps spinning) only if the publisher had used more than
        half its window: a limit that moves while the publisher is far from it needs no urgency, and
        an embedded driver that spun on every move would fight the application for the GIL.
        """
        producer: int | None = None  # read only when needed: this runs every duty cycle, per publication
        if self.subscribers and self.state is ACTIVE:
            limit = counters.min_value(self.subscribers.values()) + self.window
        else:
            producer = limit = self.log.producer_position()  # nothing more may be appended once closing
        if self.subscribers:
            if not self.connected:
                self.connected = self.log.is_connected = True
        elif self.connected:
            self.connected = self.log.is_connected = False
        old_limit = counters.get(self.limit_counter_id)
        if old_limit != limit:
            counters.set(self.limit_counter_id, limit)
            if producer is None:
                producer = self.log.producer_position()
            return 1 if producer > old_limit - (self.window >> 1) else 0
        return 0

    def min_subscriber_position(self, counters: CountersManager) -> int | None:
        if not self.subscribers:
            return None
        return counters.min_value(self.subscribers.values())

    def start_draining(self, now_ns: int) -> None:
        if self.state is ACTIVE:
            self.state = DRAINING
            self.log.end_of_stream_position = self.producer_position()

    def is_drained(self, counters: CountersManager) -> bool:
        position = self.min_subscriber_position(counters)
        return position is None or position >= self.log.end_of_stream_position

    def unblock(self, counters: CountersManager, now_ns: int, timeout_ns: int) -> bool:
        """Pad a claimed-but-never-committed frame that stops subscribers of a closed publication.

        A frame being written carries its length negated; if subscribers sit at such a frame for
        ``timeout_ns`` after the publisher went away, it becomes padding so they reach end of stream.
        """
        position = self.min_subscriber_position(counters)
        if position is None or position >= self.log.end_of_stream_position:
            return False
        if position != self.stuck_position:
            self.stuck_position = position
            self.stuck_since_ns = now_ns
            return False
        if now_ns - self.stuck_since_ns < timeout_ns or not unblock(self.log, position):
            return False
        self.stuck_since_ns = now_ns
        return True

    def close(self) -> None:
        self.state = DONE
        self.release_log()
