"""The driver's UDP data path in C against the pure-Python reference.

``cut_datagrams`` (the sender's cut of new data into datagrams, as slices of the log) and
``send_datagrams`` (a connected socket's send: GSO runs and single datagrams, system calls without the
GIL) are driven with the same inputs as the Python code they replace: random message sizes, runs of
equal frames with a smaller frame after, term rollovers, windows opening and shutting, corrupt and
hostile logs, datagrams of every size and buffer kind, and sockets that fail. Datagrams are compared
as they arrive on a real loopback socket (with UDP_GRO, so each GSO call arrives as the batch it was,
with its segment size), along with positions and counters.
"""

from __future__ import annotations

import contextlib
import errno
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slipstream.driver import udp_channel
from slipstream.driver.udp_channel import SOL_UDP, UDP_GRO, UdpSocket, open_socket
from slipstream.logbuffer import ADMIN_ACTION, ExclusiveAppender, LogBuffers, compute_log_length
from slipstream.logbuffer.fastpath import FAST
from slipstream.protocol import NetworkPublicationSender, SenderConfig
from slipstream.protocol import sender as sender_module
from slipstream.wire.constants import TERM_MIN_LENGTH
from slipstream.wire.frames import StatusMessage
from slipstream.wire.positions import compute_term_id
from tests.extension import require_extension

require_extension(FAST, "the C fast path")

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TERM = 4 * TERM_MIN_LENGTH
BITS = TERM.bit_length() - 1
SESSION, STREAM, INITIAL = 7, 1001, 100
MS = 1_000_000
LINUX_GSO = hasattr(FAST, "send_datagrams")


@contextlib.contextmanager
def pure_sender() -> Iterator[None]:
    """Run the sender's Python cut instead of the C one for the duration."""
    saved = sender_module._c_cut_datagrams
    sender_module._c_cut_datagrams = None
    try:
        yield
    finally:
        sender_module._c_cut_datagrams = saved


@contextlib.contextmanager
def pure_socket() -> Iterator[None]:
    """Send with the Python grouping and ``socket.sendmsg`` instead of ``send_datagrams``."""
    saved = udp_channel._c_send_datagrams
    udp_channel._c_send_datagrams = None
    try:
        yield
    finally:
        udp_channel._c_send_datagrams = saved


# -- a loopback pair that shows what went on the wire --------------------------------------------------


class Wire:
    """A UdpSocket connected to a receiving socket with UDP_GRO: each received item is what one system
    call sent (loopback keeps a GSO batch whole), with its segment size."""

    def __init__(self, *, gso: bool = True) -> None:
        self.receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.receiver.bind(("127.0.0.1", 0))
        self.receiver.setblocking(False)
        self.gro = True
        try:
            self.receiver.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError:
            self.gro = False
        self.sock = UdpSocket(open_socket(socket.AF_INET, connect=self.receiver.getsockname()), offload=gso)

    def take(self) -> list[tuple[bytes, int]]:
        got: list[tuple[bytes, int]] = []
        while True:
            try:
                data, ancillary, _, _ = self.receiver.recvmsg(1 << 16, socket.CMSG_SPACE(4))
            except BlockingIOError:
                return got
            segment = len(data)
            for level, kind, value in ancillary:
                if level == SOL_UDP and kind == UDP_GRO:
                    segment = struct.unpack("<i", value[:4])[0]
            got.append((data, segment))

    def reset(self, gso: bool = True) -> None:
        """Forget what earlier examples sent and counted."""
        self.take()
        s = self.sock
        s.short_sends = s.send_errors = 0
        s.last_send_error = ""
        s.gso = gso and self.gro

    def counters(self) -> tuple[int, int, str, bool]:
        s = self.sock
        return s.short_sends, s.send_errors, s.last_send_error, s.gso

    def close(self) -> None:
        self.sock.close()
        self.receiver.close()


@pytest.fixture(scope="module")
def wires() -> Iterator[tuple[Wire, Wire]]:
    pair = (Wire(), Wire())
    yield pair
    for wire in pair:
        wire.close()


# -- the sender's cut ------------------------------------------------------------------------------


def make_sender(
    term_id: int, term_offset: int, mtu: int, budget: int
) -> tuple[NetworkPublicationSender, ExclusiveAppender]:
    log = LogBuffers(bytearray(compute_log_length(TERM)), TERM)
    log.initialize(
        initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM, mtu=mtu, term_id=term_id, term_offset=term_offset
    )
    config = SenderConfig(max_messages_per_send=budget)
    return NetworkPublicationSender(log, config), ExclusiveAppender(log)


def sm(position: int, window: int) -> bytes:
    term_id = compute_term_id(position, BITS, INITIAL)
    return StatusMessage(SESSION, STREAM, term_id, position & (TERM - 1), window, 1, None, 0).encode()


def state(sender: NetworkPublicationSender) -> tuple[int, ...]:
    return (
        sender.sender_position,
        sender.sender_limit,
        sender.publisher_limit(),
        sender.bytes_sent,
        sender.datagrams_sent,
        sender.heartbeats_sent,
        sender.flow_control_limits,
        int(sender.is_connected),
    )


message_sizes = st.one_of(
    st.integers(0, 3000),  # anything, fragmented past the MTU
    st.sampled_from([0, 32, 100, 1344, 1376, 1377, 4000, TERM // 8 - 64]),
).map(lambda size: min(size, TERM // 8 - 64))
bursts = st.lists(
    st.tuples(message_sizes, st.integers(1, 60)),  # (size, repeat): runs of equal frames, then another size
    min_size=1,
    max_size=8,
)


@SETTINGS
@given(
    bursts=bursts,
    start_term=st.integers(0, 3),
    start_offset=st.integers(0, TERM // 32 - 1).map(lambda v: v * 32),
    mtu_budget=st.sampled_from([(1408, 64), (1408, 64), (1408, 4), (544, 64), (4096, 16), (1408, 1), (8192, 4)]),
    windows=st.lists(st.integers(0, TERM // 2), min_size=1, max_size=6),
    polls=st.integers(1, 6),
)
@example(
    bursts=[(TERM // 8 - 64, 3), (100, 5)],
    start_term=0,
    start_offset=0,
    mtu_budget=(1408, 64),
    windows=[TERM // 2],
    polls=3,
)
def test_cut_and_send_match_the_reference_on_the_wire(
    wires: tuple[Wire, Wire],
    bursts: list[tuple[int, int]],
    start_term: int,
    start_offset: int,
    mtu_budget: tuple[int, int],
    windows: list[int],
    polls: int,
) -> None:
    """A C sender and socket and a Python sender and socket, fed the same appends, status messages and
    times, put the same datagrams on the wire in the same system calls, and agree on every counter."""
    for wire in wires:
        wire.reset()
    fast_wire, pure_wire = wires
    mtu, budget = mtu_budget  # at most 64 KiB or so per poll: what any receive buffer holds
    pairs = [make_sender(INITIAL + start_term, start_offset, mtu, budget) for _ in range(2)]
    (fast, _), (pure, _) = pairs
    now = 0
    for sender, _ in pairs:
        sender.poll(now)
        sender.on_datagram(sm(sender.sender_position, windows[0]), now)
    for step, (size, repeat) in enumerate(bursts, 1):
        for count in range(repeat):
            payload = bytes((i + count) & 0xFF for i in range(size))
            for sender, app in pairs:
                result = app.append(payload, sender.publisher_limit())
                if result == ADMIN_ACTION:
                    app.append(payload, sender.publisher_limit())
        for _ in range(polls):
            now += MS
            with pure_sender():
                pure_out = pure.poll(now)
            fast_out = fast.poll(now)
            assert [bytes(d) for d in fast_out] == [bytes(d) for d in pure_out]
            assert state(fast) == state(pure)
            fast_wire.sock.send(fast_out)
            with pure_socket():
                pure_wire.sock.send(pure_out)
            assert fast_wire.take() == pure_wire.take()
            assert fast_wire.counters() == pure_wire.counters()
        window = windows[step % len(windows)]
        for sender, _ in pairs:
            sender.on_datagram(sm(sender.sender_position, window), now)
    assert fast.log.producer_position() == pure.log.producer_position()


def hostile_term(rng: random.Random, shape: str) -> bytearray:
    """A term a corrupt or hostile client might leave: garbage, or valid-looking frames with lies in them."""
    term = bytearray(TERM)
    if shape == "garbage":
        term[:] = rng.randbytes(TERM)
        return term
    offset = 0
    while offset < TERM - 32:
        kind = rng.random()
        if kind < 0.6:
            length = rng.choice([32, 33, 100, 1376, 1408, 1409, 4000])
        elif kind < 0.7:
            length = rng.choice([-32, -1, 0, 1, 31])
        elif kind < 0.8:
            length = rng.choice([TERM, TERM - offset, TERM - offset + 1, 1 << 30, (1 << 31) - 1])
        else:
            length = rng.randrange(-(1 << 31), 1 << 31)
        frame_type = 0 if rng.random() < 0.15 else rng.choice([1, 1, 1, 2, 0x1234])
        struct.pack_into("<iBBH", term, offset, length, 0, 0xC0, frame_type)
        if rng.random() < 0.05:
            break  # uncommitted from here
        offset += max(32, (length + 31) & -32) if 0 < length < TERM else 32 * rng.randint(1, 8)
    return term


@SETTINGS
@given(
    seed=st.integers(0, 2**32),
    shape=st.sampled_from(["frames", "frames", "garbage"]),
    offset=st.integers(0, TERM // 32 - 1).map(lambda v: v * 32) | st.sampled_from([TERM - 32, 0]),
    window=st.integers(-100, TERM) | st.sampled_from([1 << 40, 0, 31, 32]),
    mtu=st.sampled_from([1408, 32, 64, 4096, 65504]),
    budget=st.integers(0, 70),
)
def test_cut_matches_the_reference_on_hostile_logs(
    seed: int, shape: str, offset: int, window: int, mtu: int, budget: int
) -> None:
    """Whatever a client wrote into its log, the C cut hands out the datagrams the Python cut does and
    never reads past the term (ASan checks the second half under ``make asan``)."""
    rng = random.Random(seed)
    sender, _ = make_sender(INITIAL, 0, 1408, 64)
    sender.mtu = mtu
    term = sender.log.terms[0]
    term[:] = hostile_term(rng, shape)
    sender.log.meta_i64[0] = (INITIAL << 32) | rng.choice([0, offset, TERM, rng.randrange(TERM)])
    pure_out: list[bytes | bytearray | memoryview] = []
    consumed, limited = sender._cut_datagrams(0, offset, window, budget, pure_out)
    pure_sent, sender.bytes_sent = sender.bytes_sent, 0
    fast_out: list[bytes | bytearray | memoryview] = []
    assert FAST.cut_datagrams(term, offset, window, mtu, budget, fast_out) == (consumed, pure_sent, limited)
    assert [bytes(d) for d in fast_out] == [bytes(d) for d in pure_out]
    for datagram in fast_out:
        assert isinstance(datagram, memoryview) and datagram.obj is term.obj  # a view of the log, not a copy


def test_cut_refuses_bad_arguments_and_stays_inside_the_term() -> None:
    term = memoryview(bytearray(4096))
    struct.pack_into("<iBBH", term, 4096 - 32, 1 << 20, 0, 0xC0, 1)  # a frame claiming to run past the end
    out: list[memoryview] = []
    assert FAST.cut_datagrams(term, 4096 - 32, 1 << 40, 1408, 10, out) == (0, 0, True)
    assert FAST.cut_datagrams(term, 4096, 1 << 40, 1408, 10, out) == (0, 0, False)
    assert FAST.cut_datagrams(term, 1 << 40, 1 << 40, 1408, 10, out) == (0, 0, False)
    assert out == []
    with pytest.raises(ValueError):
        FAST.cut_datagrams(term, -32, 100, 1408, 10, out)
    with pytest.raises(TypeError):
        FAST.cut_datagrams(term, 0, 100, 1408, 10, ())
    with pytest.raises(TypeError):
        FAST.cut_datagrams(term, 0, 100, 1408)


# -- the socket's send -----------------------------------------------------------------------------


def datagram_lists() -> st.SearchStrategy[list[tuple[int, str]]]:
    """(size, buffer kind) lists: runs of one size with a shorter one after, and anything else."""
    size = st.one_of(st.integers(1, 1500), st.sampled_from([1408, 1408, 896, 32, 65000 // 2, 30000]))
    run = st.tuples(size, st.integers(1, 70), st.integers(0, 1500) | st.none())
    kind = st.sampled_from(["bytes", "bytearray", "view", "view", "view-i"])

    def expand(runs: list[tuple[int, int, int | None]], kinds: list[str]) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for length, repeat, tail in runs:
            out += [(length, "")] * repeat
            if tail is not None:
                out.append((tail, ""))
        return [(length, kinds[i % len(kinds)]) for i, (length, _) in enumerate(out)][:220]

    return st.builds(expand, st.lists(run, min_size=1, max_size=6), st.lists(kind, min_size=1, max_size=5))


def make_datagrams(spec: list[tuple[int, str]], salt: int) -> list[bytes | bytearray | memoryview]:
    backing = bytearray(sum(size for size, _ in spec) + 8)
    out: list[bytes | bytearray | memoryview] = []
    at = 0
    for number, (size, kind) in enumerate(spec):
        payload = bytes((number * 31 + i + salt) & 0xFF for i in range(size))
        if kind == "bytes":
            out.append(payload)
        elif kind == "bytearray":
            out.append(bytearray(payload))
        elif kind == "view":
            backing[at : at + size] = payload
            out.append(memoryview(backing)[at : at + size])
            at += size
        else:  # not a byte-formatted buffer: the C send leaves it to the Python path
            out.append(memoryview(payload).cast("i") if size % 4 == 0 else payload)
    return out


@pytest.mark.skipif(not LINUX_GSO, reason="send_datagrams is built on Linux only")
@SETTINGS
@given(spec=datagram_lists(), gso=st.booleans(), salt=st.integers(0, 255))
def test_send_puts_the_same_datagrams_on_the_wire_in_the_same_calls(
    wires: tuple[Wire, Wire], spec: list[tuple[int, str]], gso: bool, salt: int
) -> None:
    fast_wire, pure_wire = wires
    for wire in wires:
        wire.reset(gso)
    datagrams = make_datagrams(spec, salt)
    fast_wire.sock.send(datagrams)
    with pure_socket():
        pure_wire.sock.send(datagrams)
    fast, pure = fast_wire.take(), pure_wire.take()
    assert fast == pure
    assert fast_wire.counters() == pure_wire.counters()
    assert b"".join(data for data, _ in fast) == b"".join(bytes(d) for d in datagrams)


@pytest.mark.skipif(not LINUX_GSO, reason="send_datagrams is built on Linux only")
def test_send_failures_are_counted_as_the_python_path_counts_them() -> None:
    """Refused (nobody listens: ECONNREFUSED from the ICMP the first send drew), too large (EMSGSIZE)
    and GSO refused by the kernel: each path counts the same failures and goes on with the rest."""

    def closed_port() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])

    results = []
    for pure in (False, True):
        sock = UdpSocket(open_socket(socket.AF_INET, connect=("127.0.0.1", closed_port())))
        context = pure_socket() if pure else contextlib.nullcontext()
        with context:
            sock.send([b"first"])
            time.sleep(0.01)  # the port-unreachable comes back
            sock.send([b"a" * 1000] * 5 + [b"b" * 10])  # refused as one GSO call: one error
            time.sleep(0.01)
            sock.send([b"x" * 100, b"y" * 70_000, b"z" * 100])  # the middle one is too large for UDP
            sock.send([b"q" * 40_000, b"q" * 40_000])  # singles: each above what one GSO call may carry
        results.append((sock.short_sends, sock.send_errors, sock.last_send_error, sock.gso))
        sock.close()
    assert results[0] == results[1]
    assert results[0][1] >= 2


@pytest.mark.skipif(not LINUX_GSO, reason="send_datagrams is built on Linux only")
def test_send_datagrams_refuses_bad_arguments() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fd = sock.fileno()
        with pytest.raises(TypeError):
            FAST.send_datagrams(fd, (b"x",), 0, True)
        with pytest.raises(ValueError):
            FAST.send_datagrams(fd, [b"x"], 2, True)
        with pytest.raises(ValueError):
            FAST.send_datagrams(-1, [b"x"], 0, True)
        assert FAST.send_datagrams(fd, [b"x", memoryview(b"abcd").cast("i")], 0, True) is None
        assert FAST.send_datagrams(fd, [], 0, True) == (0, 0, 0)
        # An unconnected socket: the kernel refuses (EDESTADDRREQ), which comes back as the errno.
        assert FAST.send_datagrams(fd, [b"x", b"y"], 0, False)[2] != 0


# -- the socket's receive ---------------------------------------------------------------------------


@contextlib.contextmanager
def pure_receive() -> Iterator[None]:
    saved = udp_channel._c_receive_batches
    udp_channel._c_receive_batches = None
    try:
        yield
    finally:
        udp_channel._c_receive_batches = saved


def receivers(family: socket.AddressFamily) -> tuple[UdpSocket, UdpSocket]:
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    fast = UdpSocket(open_socket(family, bind=(host, 0), so_rcvbuf=4 << 20))
    with pure_receive():
        pure = UdpSocket(open_socket(family, bind=(host, 0), so_rcvbuf=4 << 20))
    return fast, pure


def drain(sock: UdpSocket, budget: int, pure: bool) -> list[tuple[bytes, int, object]]:
    with pure_receive() if pure else contextlib.nullcontext():
        return [(bytes(data), segment, source) for data, segment, source in sock.receive_batches(budget)]


@pytest.mark.skipif(not hasattr(FAST, "receive_batches"), reason="receive_batches is built on Linux only")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 1500), st.integers(1, 40), st.integers(0, 1500) | st.none()),
        min_size=1,
        max_size=12,
    ),
    budget=st.integers(1, 70),
    family=st.sampled_from([socket.AF_INET, socket.AF_INET6]),
    gro=st.booleans(),
)
def test_receive_yields_what_the_python_receive_yields(
    calls: list[tuple[int, int, int, int | None]], budget: int, family: socket.AddressFamily, gro: bool
) -> None:
    """Several senders' GSO batches and single datagrams, empty ones too: the C receive loop yields the
    same (data, segment, source) sequence as recvmsg_into, budget for budget, until the socket is dry."""
    if family == socket.AF_INET6 and not socket.has_ipv6:
        return
    fast, pure = receivers(family)
    senders = [UdpSocket(open_socket(family)) for _ in range(3)]
    try:
        for receiver in (fast, pure):
            receiver.gro = gro and receiver.gro
        for who, size, count, tail in calls:
            run = [bytes([who, i % 256]) * (size // 2) + bytes(size % 2) for i in range(count)]
            if tail is not None and tail <= size:
                run.append(b"t" * tail)
            for receiver in (fast, pure):
                senders[who].send(run, receiver.sock.getsockname())
        while True:
            got = drain(fast, budget, pure=False)
            assert got == drain(pure, budget, pure=True)
            if not got:
                break
    finally:
        for sock in (fast, pure, *senders):
            sock.close()


@pytest.mark.skipif(not hasattr(FAST, "receive_batches"), reason="receive_batches is built on Linux only")
def test_receive_batches_refuses_bad_arguments_and_small_buffers() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sock.sendto(b"hello", sock.getsockname())
        with pytest.raises(ValueError):
            FAST.receive_batches(-1, bytearray(1 << 16), 4, False)
        with pytest.raises(BufferError):
            FAST.receive_batches(sock.fileno(), bytes(1 << 16), 4, False)
        assert FAST.receive_batches(sock.fileno(), bytearray((1 << 16) - 1), 4, False) == []  # no room: no call
        buffer = bytearray(1 << 16)
        assert FAST.receive_batches(sock.fileno(), buffer, 4, False) == [(0, 5, 5, sock.getsockname())]
        assert buffer[:5] == b"hello"
        assert FAST.receive_batches(sock.fileno(), buffer, 4, False) == []


# ---- the GIL around the system calls: held for a message's (never blocking), let go for a bulk batch's -------

BLOCK_TIMEOUT = 4.0  # a system call holding the GIL gives up after this (SO_RCVTIMEO / SO_SNDTIMEO)
STALL_LIMIT = 1.5  # the longest this thread may be kept from running Python while the other is blocked


def timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int((seconds % 1) * 1_000_000))


def run_python_while(worker: threading.Thread, until: float) -> float:
    """Run Python in this thread until ``until`` (or the worker ends): the longest gap between two
    iterations. A worker that holds the GIL in a blocking system call stalls this loop until the call
    times out."""
    longest = 0.0
    last = time.monotonic()
    while worker.is_alive() and last < until:
        sum(range(200))  # Python code, not a sleep (which would not need the GIL to pass time)
        now = time.monotonic()
        longest = max(longest, now - last)
        last = now
    return longest


def full_queue() -> tuple[socket.socket, socket.socket, int]:
    """A datagram socket pair whose first socket's peer queue is full, that socket blocking (with a send
    timeout); how many datagrams are queued."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    queued = 0
    with contextlib.suppress(BlockingIOError):
        while queued < 100_000:
            a.send(b"q" * 512)
            queued += 1
    a.setblocking(True)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(BLOCK_TIMEOUT))
    return a, b, queued


@pytest.mark.skipif(not LINUX_GSO, reason="the batched receive is Linux only")
def test_receive_batches_never_waits_even_on_a_blocking_socket() -> None:
    """Its receive calls are non-blocking (the GIL held for a message's worth, see GIL_HELD_BYTES): on a blocking
    socket with nothing queued it comes back empty at once, and never keeps another thread from Python."""
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.bind(("127.0.0.1", 0))
        receiver.setblocking(True)
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(BLOCK_TIMEOUT))
        buffer = bytearray(1 << 16)
        started = time.monotonic()
        assert FAST.receive_batches(receiver.fileno(), buffer, 4, False) == []
        assert time.monotonic() - started < STALL_LIMIT
        sender.sendto(b"ping through the gil", receiver.getsockname())
        deadline = time.monotonic() + BLOCK_TIMEOUT
        got: list[tuple[int, int, int, object]] = []
        while not got and time.monotonic() < deadline:
            got = FAST.receive_batches(receiver.fileno(), buffer, 4, False)
        assert len(got) == 1, got
        start, end, segment, _source = got[0]
        assert bytes(buffer[start:end]) == b"ping through the gil" and segment == end - start
    finally:
        receiver.close()
        sender.close()


@pytest.mark.skipif(not LINUX_GSO, reason="the batched send is Linux only")
def test_send_datagrams_of_a_message_never_waits_even_on_a_blocking_socket() -> None:
    """A message's datagrams go with the GIL held and never block: a full queue is EAGAIN at once (what a
    non-blocking socket says, which the caller retries), not a wait with the GIL held."""
    a, b, _queued = full_queue()
    try:
        started = time.monotonic()
        assert FAST.send_datagrams(a.fileno(), [bytearray(b"one message")], 0, False) == (0, 1, errno.EAGAIN)
        assert time.monotonic() - started < STALL_LIMIT
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not LINUX_GSO, reason="the batched send is Linux only")
def test_send_datagrams_of_a_bulk_batch_releases_the_gil_while_blocked() -> None:
    """A thread blocked in ``send_datagrams`` with a bulk batch (more than GIL_HELD_BYTES; a datagram socket
    whose peer's queue is full) lets this thread run Python, which then drains the queue so the sends complete.
    Held GIL: this thread stalls until the send times out (SO_SNDTIMEO) and the send reports EAGAIN."""
    a, b, queued = full_queue()
    try:
        got: list[object] = []
        payload = [bytearray(b"%05d" % i + b"b" * 1019) for i in range(80)]  # 80 KiB
        worker = threading.Thread(target=lambda: got.append(FAST.send_datagrams(a.fileno(), payload, 0, False)))
        started = time.monotonic()
        worker.start()
        time.sleep(0.1)  # the worker is in send by now
        stall = max(time.monotonic() - started - 0.1, run_python_while(worker, time.monotonic() + 0.3))
        b.settimeout(BLOCK_TIMEOUT)
        drained = []
        with contextlib.suppress(TimeoutError):
            while not drained or drained[-1] != bytes(payload[-1]):
                drained.append(b.recv(2048))
        worker.join(BLOCK_TIMEOUT + 5)
        assert not worker.is_alive()
        assert stall < STALL_LIMIT, f"Python stalled {stall:.2f} s while the send was blocked"
        assert got == [(80, 80, 0)]
        assert drained[queued:] == [bytes(datagram) for datagram in payload]
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not LINUX_GSO or sys.version_info < (3, 12), reason="__buffer__ is Python 3.12+; Linux only")
def test_send_datagrams_survives_a_buffer_that_empties_the_list() -> None:
    """A datagram whose ``__buffer__`` (Python code run while the C send takes its buffer) empties the
    list: each item is held while its buffer is taken and the length read again, so the call is left to
    the Python path (None) instead of reading freed or past-the-end list slots."""
    datagrams: list[object] = []

    class Emptying:
        def __buffer__(self, flags: int) -> memoryview:
            datagrams.clear()
            return memoryview(b"gone")

    datagrams += [b"first", Emptying(), b"third", b"fourth"]
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as s:
        s.connect(("127.0.0.1", 9))
        assert FAST.send_datagrams(s.fileno(), datagrams, 0, False) is None  # type: ignore[arg-type]
