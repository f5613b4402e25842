"""The driver's side of a UDP subscription endpoint: one bound socket, its ``ReceiveEndpoint``,
the images it rebuilds (log files clients map and read) and the subscriptions fed by them.

The sans-I/O endpoint decides everything (which SETUPs make images, when to NAK, what status to
report); this adapter feeds it datagrams and the subscribers' positions, sends what it returns,
and maps image logs into files under the driver directory so subscribers in other processes can
read them like IPC logs.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ..files.directory import map_file, release_log_file
from ..files.doorbell import ring_parked
from ..logbuffer import LogBuffers, compute_log_length
from ..logbuffer.layout import PARKED_WORD_INDEX
from ..protocol.config import ReceiverConfig
from ..protocol.image import ImageLog, ImageParams, PublicationImageReceiver
from ..protocol.receive_endpoint import ReceiveEndpoint
from ..wire.address import SocketAddress
from .udp_channel import UdpEndpoint, UdpSocket

_RECV_BUDGET = 64


@dataclass(frozen=True, slots=True)
class ImageLogFile:
    """The log factory's handle for an image log: the file subscribers map and the driver's mapping."""

    path: Path
    mapping: mmap.mmap


@dataclass(slots=True, eq=False)
class DriverImage:
    """An image's log file and who reads it."""

    correlation_id: int
    receiver: PublicationImageReceiver
    log_path: Path
    mapping: mmap.mmap
    source_identity: str
    subscribers: dict[int, int] = field(default_factory=dict)
    """Subscription registration id -> subscriber position counter id."""
    parking: dict[int, int] = field(default_factory=dict)
    """Subscription registration id -> its slot in the log's parking table (doorbells)."""
    rung_position: int = -1
    """Rebuild position when parked subscribers were last rung: a datagram that added nothing rings no one."""
    removed: bool = False
    position_counters: dict[int, int] = field(default_factory=dict)

    def close(self) -> None:
        self.receiver.log.close()
        release_log_file(self.log_path, self.mapping)


class ReceiveChannel:
    """One bound UDP endpoint shared by every subscription on it."""

    def __init__(
        self,
        endpoint: UdpEndpoint,
        sock: UdpSocket,
        config: ReceiverConfig,
        images_dir: Path,
        control: UdpEndpoint | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.control = control
        """Dynamic MDC: the publication's control address, where this endpoint registers and reports."""
        self.sock = sock
        self.images_dir = images_dir
        self._name = f"{os.getpid()}-{endpoint.address[1]}-{id(self):x}"
        self._pending_logs: dict[Path, ImageLogFile] = {}
        """Logs mapped for images the driver has not taken over yet (or whose SETUP failed after all)."""
        self.receive = ReceiveEndpoint(
            config, log_factory=self._map_log, control=control.address if control is not None else None
        )
        self.subscriptions: set[int] = set()
        self.images: dict[int, DriverImage] = {}
        """By the endpoint's image id, as its events carry it."""

    def _map_log(self, params: ImageParams) -> ImageLog:
        """Image logs are files, so subscriber processes can map them."""
        path = self.images_dir / f"{self._name}-{params.image_id}.logbuffer"
        mapping = map_file(path, compute_log_length(params.term_length), create=True)
        handle = ImageLogFile(path, mapping)
        self._pending_logs[path] = handle
        return ImageLog(LogBuffers(memoryview(mapping), params.term_length), handle)

    def claim_log(self, image: PublicationImageReceiver) -> ImageLogFile:
        """The file of a new image's log, which the driver now owns."""
        handle = image.log_handle
        assert isinstance(handle, ImageLogFile)
        del self._pending_logs[handle.path]
        return handle

    def do_work(self, now_ns: int, readable: bool = True) -> int:
        """Datagrams in (if the socket has any), then what the endpoint wants sent."""
        work = 0
        receive = self.receive
        for data, segment, source in self.sock.receive_batches(_RECV_BUDGET) if readable else ():
            receive.on_datagrams(data, segment, now_ns, source)
            work += 1
        if work:
            self._ring_parked()
        if receive.poll_due(now_ns):
            for datagram, destination in receive.poll(now_ns):
                self.sock.send([datagram], cast(SocketAddress, destination))
                work += 1
        return work

    def _ring_parked(self) -> None:
        """After a batch of datagrams: ring the parked subscribers of each image whose log grew (once per
        batch, not per frame); an image nobody is parked on costs one 8-byte read."""
        for image in self.images.values():
            meta = image.receiver.log.meta_i64
            if meta[PARKED_WORD_INDEX]:
                position = image.receiver.rebuild_position
                if position != image.rung_position:
                    image.rung_position = position
                    ring_parked(meta)

    @property
    def short_sends(self) -> int:
        return self.sock.short_sends

    @property
    def send_errors(self) -> int:
        return self.sock.send_errors

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        for image in self.images.values():
            image.close()
        self.images.clear()
        for pending in self._pending_logs.values():
            release_log_file(pending.path, pending.mapping)
