"""UDP sockets for channels: address resolution and the socket rules of the reference driver.

A publication's socket binds an ephemeral port and connects to the endpoint (so it only hears the
receiver it sends to); a subscription's socket binds the endpoint and answers each sender from it.
Host names resolve to IPv4, as Aeron does; ``[::1]`` style literals give IPv6.

A Python driver pays more for a system call than for anything else it does per datagram, so
:class:`UdpSocket` uses Linux's UDP segmentation offload both ways when the kernel has it: a run of
equal-sized datagrams leaves in one ``sendmsg`` (``UDP_SEGMENT``) and is still separate datagrams on
the wire, and a receiving socket with ``UDP_GRO`` gets a burst from one sender in one ``recvmsg``,
which this module cuts back into the datagrams the sender made. Peers see plain Aeron datagrams.

With the C fast path (Linux), a connected socket's sends and every receive loop run in C
(``send_datagrams``, ``receive_batches``), several system calls per Python call, the GIL released for bulk only;
the Python code below stays the reference and the fallback (tests/test_fastpath_udp.py).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..logbuffer.fastpath import FAST
from ..wire.address import SocketAddress
from ..wire.frames import BytesLike
from ..wire.uri import ChannelUri, parse_endpoint, udp_channel


@dataclass(frozen=True, slots=True)
class UdpEndpoint:
    family: socket.AddressFamily
    address: SocketAddress

    @property
    def host_port(self) -> str:
        host, port = self.address[0], self.address[1]
        return f"[{host}]:{port}" if self.family == socket.AF_INET6 else f"{host}:{port}"

    @property
    def channel(self) -> str:
        """The channel URI that names this endpoint in counters, the loss report and the error log."""
        return udp_channel(self.host_port)


def resolve(text: str, parameter: str = "endpoint") -> UdpEndpoint:
    """Resolve ``host:port``; raises ValueError naming the parameter when it cannot be resolved."""
    host, port = parse_endpoint(text, parameter)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        info = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    except OSError as exc:
        raise ValueError(f"{parameter}={text}: cannot resolve {host!r}: {exc}") from None
    address = info[0][4]
    return UdpEndpoint(family, address[:2] if family == socket.AF_INET else address[:4])  # type: ignore[arg-type]


def open_socket(
    family: socket.AddressFamily,
    *,
    bind: SocketAddress | None = None,
    connect: SocketAddress | None = None,
    so_rcvbuf: int | None = None,
    so_sndbuf: int | None = None,
) -> socket.socket:
    """A non-blocking UDP socket bound (ephemeral port if ``bind`` is None) and optionally connected."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if so_rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, so_rcvbuf)
        if so_sndbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, so_sndbuf)
        if bind is None:
            bind = ("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0)
        sock.bind(bind)
        if connect is not None:
            sock.connect(connect)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def socket_buffers(
    uri: ChannelUri, default_rcvbuf: int | None, default_sndbuf: int | None
) -> tuple[int | None, int | None]:
    """Socket buffer sizes: the channel's ``so-rcvbuf``/``so-sndbuf``, else the driver's settings."""
    return (uri.so_rcvbuf or default_rcvbuf, uri.so_sndbuf or default_sndbuf)


SOL_UDP = 17
UDP_SEGMENT = 103
"""``setsockopt``/cmsg of linux/udp.h (Linux 4.18+): the segment size of a GSO send."""
UDP_GRO = 104
"""linux/udp.h (Linux 5.0+): coalesce received datagrams; a cmsg tells their size."""
GSO_MAX_SEGMENTS = 64
"""The kernel's UDP_MAX_SEGMENTS: datagrams per GSO send."""
GSO_MAX_BYTES = 65_000
"""Payload of one GSO send: below the 64 KiB an IP packet may carry, IPv4 or IPv6 headers included."""
MAX_DATAGRAM = 65_536
LONE_DATAGRAM = 1024
"""A first datagram this small, not coalesced with others, is likely alone (a ping, a status message):
``receive`` asks epoll whether another is queued instead of trying a receive that raises EAGAIN."""
_GRO_CMSG_SPACE = socket.CMSG_SPACE(4)
_BYTE_ORDER = sys.byteorder
_c_send_datagrams: Callable[[int, list[BytesLike], int, bool], tuple[int, int, int] | None] | None = getattr(
    FAST, "send_datagrams", None
)
"""The C send of a connected socket's datagrams (Linux), or None for the Python one."""
_c_receive_batches: Callable[[int, bytearray, int, bool], list[tuple[int, int, int, SocketAddress]]] | None = getattr(
    FAST, "receive_batches", None
)
"""The C receive loop (Linux): several receive calls in one Python call; or None."""
RECEIVE_SLOTS = 4
"""Receive calls ``receive_batches`` makes per C call, each into its own 64 KiB of the socket's buffer
(pages the kernel never fills, as on a socket that only hears status messages, are never touched)."""
_SHORT = -1
"""``send_datagrams``' error for a datagram the kernel took only part of."""
_RETRY = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, _SHORT})


class UdpSocket:
    """A non-blocking UDP socket of the driver, with batched sends and receives and its error counts.

    ``receive`` hands out views of one reusable buffer: each datagram must be consumed (copied,
    decoded) before the next one is taken. Send failures are counted, never raised: to a reliable
    stream a datagram the kernel refused is a lost datagram, which NAKs repair.
    """

    __slots__ = (
        "_buffer",
        "_queued",
        "_view",
        "fd",
        "gro",
        "gso",
        "last_send_error",
        "send_errors",
        "short_sends",
        "sock",
    )

    def __init__(self, sock: socket.socket, *, offload: bool = True) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.gso = offload and sys.platform == "linux"
        self.gro = False
        if self.gso:
            try:
                sock.setsockopt(SOL_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                self.gro = False
        self._buffer = bytearray(MAX_DATAGRAM * (RECEIVE_SLOTS if _c_receive_batches is not None else 1))
        self._view = memoryview(self._buffer)
        self._queued = select.epoll()
        """This socket alone: ``poll(0)`` says whether a datagram is queued, for a quarter of the cost
        of the receive call that fails with EAGAIN (an exception, in Python)."""
        self._queued.register(self.fd, select.EPOLLIN)
        self.short_sends = 0
        self.send_errors = 0
        self.last_send_error = ""

    def fileno(self) -> int:
        return self.fd

    def receive_batches(self, budget: int) -> Iterator[tuple[memoryview, int, SocketAddress]]:
        """Up to ``budget`` receive calls' worth of what waits on the socket: ``(data, segment, source)``,
        where ``data`` holds datagrams from ``source`` back to back, each ``segment`` bytes but the last
        (several only when the kernel coalesced them, GRO). Errors end the batch: on a connected socket
        an ICMP port-unreachable surfaces here as ECONNREFUSED, which only means nobody listens yet."""
        sock, view = self.sock, self._view
        gro = self.gro
        receive = _c_receive_batches
        if receive is not None:
            while budget > 0:
                batches = receive(self.fd, self._buffer, min(budget, RECEIVE_SLOTS), gro)
                for start, end, segment, source in batches:
                    yield view[start:end], segment, source
                if len(batches) < RECEIVE_SLOTS:
                    return  # the socket ran dry (or failed) before the slots were used
                budget -= RECEIVE_SLOTS
            return
        for calls in range(budget):
            try:
                if gro:
                    size, ancillary, _, source = sock.recvmsg_into((view,), _GRO_CMSG_SPACE)
                else:
                    size, source = sock.recvfrom_into(view)
                    ancillary = []
            except OSError:
                return
            segment = size
            for level, kind, data in ancillary:
                if level == SOL_UDP and kind == UDP_GRO and len(data) >= 4:
                    segment = min(int.from_bytes(data[:4], _BYTE_ORDER) or size, size)
            yield view[:size], segment, source
            if calls == 0 and size < LONE_DATAGRAM and not self._queued.poll(0):
                return

    def receive(self, budget: int) -> Iterator[tuple[memoryview, SocketAddress]]:
        """Like ``receive_batches``, one datagram at a time."""
        for data, segment, source in self.receive_batches(budget):
            size = len(data)
            if segment >= size:
                yield data, source
                continue
            for start in range(0, size, segment):
                yield data[start : start + segment], source

    def send(self, datagrams: list[BytesLike], destination: SocketAddress | None = None) -> None:
        """Send datagrams in order: runs of equal size (the last one may be shorter) in one GSO call each.
        ``destination`` None sends on the connected socket (in C when the fast path is there: one call, the GIL
        held for a message's few datagrams, released for a bulk batch's)."""
        if destination is None and _c_send_datagrams is not None:
            self._send_connected(datagrams)
        else:
            self._send_from(datagrams, 0, destination)

    def _send_connected(self, datagrams: list[BytesLike]) -> None:
        """``send`` for the connected peer through ``send_datagrams``, which stops at each failed call and
        says which; the failure is counted here as the Python path counts it, and sending goes on."""
        send = _c_send_datagrams
        assert send is not None
        count = len(datagrams)
        start = 0
        while start < count:
            result = send(self.fd, datagrams, start, self.gso)
            if result is None:  # something other than a plain byte buffer: the Python path decides
                self._send_from(datagrams, start, None)
                return
            begin, end, error = result
            if not error:
                start = end
            elif error in _RETRY:
                self.short_sends += 1
                start = end
            elif end - begin > 1 and error in _GSO_REFUSED:
                self.gso = False  # as _send_segmented: these one by one, and every later batch too
                start = begin
            else:
                self._failed(OSError(error, os.strerror(error)))
                start = end

    def _send_from(self, datagrams: list[BytesLike], index: int, destination: SocketAddress | None) -> None:
        count = len(datagrams)
        if count - index == 1:
            self._send_one(datagrams[index], destination)
            return
        while index < count:
            size = len(datagrams[index])
            end = index + 1
            if self.gso:
                limit = min(count, index + min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // max(size, 1)))
                while end < limit and len(datagrams[end]) == size:
                    end += 1
                if end < limit and len(datagrams[end]) < size:
                    end += 1  # GSO allows a shorter last segment
            if end - index > 1 and self._send_segmented(datagrams[index:end], size, destination):
                index = end
                continue
            for datagram in datagrams[index:end]:
                self._send_one(datagram, destination)
            index = end

    def _send_segmented(self, run: list[BytesLike], size: int, destination: SocketAddress | None) -> bool:
        """One GSO send; False when the kernel or route refuses GSO (then it stays off for this socket)."""
        control = [(SOL_UDP, UDP_SEGMENT, size.to_bytes(2, _BYTE_ORDER))]
        try:
            if destination is None:
                self.sock.sendmsg(run, control)
            else:
                self.sock.sendmsg(run, control, 0, destination)
        except (BlockingIOError, InterruptedError):
            self.short_sends += 1
        except OSError as exc:
            if exc.errno in _GSO_REFUSED:
                # No GSO here (old kernel, a device without it, a segment above the route's MTU):
                # send these one by one, and every later batch too.
                self.gso = False
                return False
            self._failed(exc)
        return True

    def _send_one(self, datagram: BytesLike, destination: SocketAddress | None) -> None:
        try:
            sent = self.sock.send(datagram) if destination is None else self.sock.sendto(datagram, destination)
        except (BlockingIOError, InterruptedError):
            self.short_sends += 1
            return
        except OSError as exc:
            self._failed(exc)
            return
        if sent < len(datagram):
            self.short_sends += 1

    def _failed(self, exc: OSError) -> None:
        self.send_errors += 1
        self.last_send_error = str(exc)

    def close(self) -> None:
        self._queued.close()
        self.sock.close()


_GSO_REFUSED = frozenset({errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EMSGSIZE})
