"""UDP sockets for channels: address resolution and the socket rules of the reference driver.

A publication's socket binds an ephemeral port and connects to the endpoint (so it only hears the
receiver it sends to); a subscription's socket binds the endpoint and answers each sender from it.
Host names resolve to IPv4, as Aeron does; ``[::1]`` style literals give IPv6.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

from ..protocol.uri import ChannelUri, parse_endpoint

Address = tuple[str, int] | tuple[str, int, int, int]


@dataclass(frozen=True, slots=True)
class UdpEndpoint:
    family: socket.AddressFamily
    address: Address

    @property
    def host_port(self) -> str:
        host, port = self.address[0], self.address[1]
        return f"[{host}]:{port}" if self.family == socket.AF_INET6 else f"{host}:{port}"


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
    bind: Address | None = None,
    connect: Address | None = None,
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


def receive_datagrams(sock: socket.socket, budget: int) -> Iterator[tuple[bytes, Address]]:
    """Up to ``budget`` datagrams waiting on a non-blocking socket. Errors end the batch: on a connected
    socket an ICMP port-unreachable surfaces here as ECONNREFUSED, which only means nobody listens yet."""
    for _ in range(budget):
        try:
            data, source = sock.recvfrom(65536)
        except OSError:
            return
        yield data, source
