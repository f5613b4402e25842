"""The driver's side of a UDP publication: its log, its sender state machine and its socket.

The sans-I/O ``NetworkPublicationSender`` decides what goes on the wire; this adapter only moves
datagrams between it and a non-blocking socket, and turns its flow-control state into the
publisher limit the application's ``offer`` reads.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from ..logbuffer import LogBuffers
from ..protocol.sender import NetworkPublicationSender
from .counters import CountersManager
from .directory import close_mapping
from .ipc_publication import PublicationState

_RECV_BUDGET = 64


@dataclass(slots=True, eq=False)
class NetworkPublication:
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
    sender: NetworkPublicationSender
    sock: socket.socket
    state: PublicationState = PublicationState.ACTIVE
    position_counters: dict[int, int] = field(default_factory=dict)
    """Type id -> counter id of the per-stream position counters the driver keeps current."""
    short_sends: int = 0
    send_errors: int = 0
    last_send_error: str = ""
    stats: dict[str, int] = field(default_factory=dict)

    def do_work(self, now_ns: int) -> int:
        """Take in control datagrams (SMs, NAKs, RTTMs), then send what the sender wants sent."""
        work = 0
        sender = self.sender
        sock = self.sock
        for _ in range(_RECV_BUDGET):
            try:
                data, source = sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                # ECONNREFUSED from an ICMP port-unreachable: nobody listens yet; SETUP keeps trying.
                break
            sender.on_datagram(data, now_ns, source)
            work += 1
        for datagram in sender.poll(now_ns):
            try:
                sent = sock.send(datagram)
            except (BlockingIOError, InterruptedError):
                self.short_sends += 1
                continue
            except OSError as exc:
                self.send_errors += 1
                self.last_send_error = str(exc)
                continue
            if sent < len(datagram):
                self.short_sends += 1
            work += 1
        return work

    def update_limit(self, counters: CountersManager) -> int:
        limit = self.sender.publisher_limit()
        if self.state is not PublicationState.ACTIVE:
            limit = min(limit, self.log.producer_position())
        if counters.get(self.limit_counter_id) != limit:
            counters.set(self.limit_counter_id, limit)
        return 0

    def start_draining(self, now_ns: int) -> None:
        if self.state is PublicationState.ACTIVE:
            self.state = PublicationState.DRAINING
            self.sender.close()

    @property
    def is_done(self) -> bool:
        return self.sender.is_done

    def close(self) -> None:
        self.state = PublicationState.DONE
        with contextlib.suppress(OSError):
            self.sock.close()
        self.log.close()
        close_mapping(self.mapping)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.log_path)
