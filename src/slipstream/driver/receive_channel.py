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

from ..files.directory import close_mapping, map_file
from ..logbuffer import LogBuffers, compute_log_length
from ..protocol.config import ReceiverConfig
from ..protocol.image import ImageLog, ImageParams, PublicationImageReceiver
from ..protocol.receive_endpoint import ReceiveEndpoint
from ..wire.address import SocketAddress
from ..wire.constants import SM_SEND_SETUP_FLAG
from ..wire.frames import StatusMessage
from .udp_channel import UdpEndpoint, UdpSocket

_RECV_BUDGET = 64
MDC_REGISTRATION_INTERVAL_NS = 1_000_000_000
"""How often a dynamic MDC subscription (re)registers at the publication's control address."""


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
    removed: bool = False
    position_counters: dict[int, int] = field(default_factory=dict)

    def close(self) -> None:
        self.receiver.log.close()
        close_mapping(self.mapping)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.log_path)


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
        self._next_registration_ns = 0
        self.sock = sock
        self.images_dir = images_dir
        self._name = f"{os.getpid()}-{endpoint.address[1]}-{id(self):x}"
        self._pending_logs: dict[Path, ImageLogFile] = {}
        """Logs mapped for images the driver has not taken over yet (or whose SETUP failed after all)."""
        self.receive = ReceiveEndpoint(config, log_factory=self._map_log)
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
        control = self.control
        if control is not None:
            if now_ns >= self._next_registration_ns:
                # Sent from the data socket, so the NAT on the way learns the mapping the data comes back on.
                self._next_registration_ns = now_ns + MDC_REGISTRATION_INTERVAL_NS
                registration = StatusMessage(0, 0, 0, 0, 0, receive.receiver_id, flags=SM_SEND_SETUP_FLAG)
                self.sock.send([registration.encode()], control.address)
            for image in receive.images:
                image.control_address = control.address  # image SMs and NAKs go to the control address too
        if receive.poll_due(now_ns):
            for datagram, destination in receive.poll(now_ns):
                self.sock.send([datagram], cast(SocketAddress, destination))
                work += 1
        return work

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
            close_mapping(pending.mapping)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pending.path)
