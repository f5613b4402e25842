"""Echo take 1 and take 2 as a user runs them: ``python -m slipstream echo ...`` processes on loopback.

Servers and clients are real processes, each with its own driver directory. Where a test needs to
say something a well-behaved client never would (malformed lines, a wrong session id, a HELLO it
never follows up), it speaks the protocol itself through a ``Context`` in the test process.
"""

from __future__ import annotations

import random
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slipstream import Context, ExclusivePublication, FragmentAssembler, Header, Subscription
from slipstream.echo.messages import ECHO_STREAM_ID, ConnectResponse, decrypt_session, parse_initial_response
from slipstream.testing import Namespace

pytestmark = pytest.mark.timeout(60)

HOST = "127.0.0.1"


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive UDP ports that are free on loopback right now."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 60000 - count)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sockets.append(s)
                s.bind((HOST, port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError("no block of free UDP ports found")


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


class EchoProcess:
    """``python -m slipstream echo ...`` with its output in a file we can wait on (never a full pipe)."""

    def __init__(self, tmp_path: Path, name: str, *args: str, namespace: Namespace | None = None) -> None:
        self.log_path = tmp_path / f"{name}.log"
        self.directory = Path("/dev/shm") / f"slipstream-echo-test-{uuid.uuid4().hex[:12]}"
        self._log = self.log_path.open("w")
        argv = [sys.executable, "-m", "slipstream", "echo", *args, "--dir", str(self.directory)]
        if namespace is None:
            self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, text=True)
        else:
            self.proc = namespace.popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for_output(self, pattern: str, timeout: float = 15.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.output)
            if match is not None:
                return match
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} in the output (exit {self.proc.poll()}):\n{self.output}")
            time.sleep(0.01)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"still running after {timeout} s:\n{self.output}") from None

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[..., EchoProcess]]:
    made: list[EchoProcess] = []

    def start(name: str, *args: str, namespace: Namespace | None = None) -> EchoProcess:
        process = EchoProcess(tmp_path, name, *args, namespace=namespace)
        made.append(process)
        return process

    yield start
    for process in made:  # all at once: each driver may linger a second over its closed publications
        process.terminate()
    for process in made:
        process.stop()


def take2_server(start: Callable[..., EchoProcess], *extra: str) -> tuple[EchoProcess, int, int, int]:
    """A take 2 server on fresh ports; returns it with its data, control and duologue base ports."""
    base = free_port_block(20)
    data, control, clients = base, base + 1, base + 2
    server = start(
        "server", "server", "--take", "2", "--local-address", HOST, "--local-initial-data-port", str(data),
        "--local-initial-control-port", str(control), "--local-clients-base-port", str(clients), *extra,
    )
    server.wait_for_output(r"echo server \(take 2\)")
    return server, data, control, clients


def take2_client(start: Callable[..., EchoProcess], name: str, data: int, control: int, *extra: str) -> EchoProcess:
    return start(
        name, "client", "--take", "2", "--remote-address", HOST, "--remote-data-port", str(data),
        "--remote-control-port", str(control), "--interval", "0.1", "--timeout", "10", *extra,
    )


class RawClient:
    """The echo protocol spoken by hand: what a modified (or broken) client could send."""

    def __init__(self, ctx: Context, data_port: int, control_port: int) -> None:
        self.ctx = ctx
        self.data_port = data_port
        self.sub = ctx.add_subscription(
            f"aeron:udp?control={HOST}:{control_port}|control-mode=dynamic|reliable=true", ECHO_STREAM_ID
        )
        self.lines: list[str] = []
        self._assembler = FragmentAssembler(self._on_line)
        wait_until(lambda: self.sub.image_count > 0, 10, "the all-clients channel")

    def _on_line(self, payload: memoryview, header: Header) -> None:
        self.lines.append(bytes(payload).decode("utf-8", "replace"))

    def publication(self) -> ExclusivePublication:
        """A new all-clients publication: a new session, as another client process would have."""
        pub = self.ctx.add_exclusive_publication(f"aeron:udp?endpoint={HOST}:{self.data_port}", ECHO_STREAM_ID)
        wait_until(lambda: pub.is_connected, 10, "the all-clients publication")
        return pub

    def reply_to(self, pub: ExclusivePublication, message: bytes, timeout: float = 10.0) -> str:
        """Send ``message`` on ``pub`` and return the next line addressed to its session."""
        offer(pub, message)
        prefix = f"{pub.session_id} "
        deadline = time.monotonic() + timeout
        while True:
            self.sub.poll(self._assembler, 10)
            for i, line in enumerate(self.lines):
                if line.startswith(prefix):
                    del self.lines[i]
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"no reply to {message[:40]!r} within {timeout} s; heard {self.lines}")
            time.sleep(0.002)


def offer(pub: ExclusivePublication, message: bytes, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (result := pub.offer(message)) < 0:
        assert time.monotonic() < deadline, f"offer refused: {result}"
        time.sleep(0.001)


def poll_lines(sub: Subscription, seconds: float, expect: int | None = None) -> list[str]:
    """Lines heard on ``sub`` within ``seconds`` (sooner once ``expect`` lines arrived)."""
    got: list[str] = []
    assembler = FragmentAssembler(lambda payload, header: got.append(bytes(payload).decode("utf-8", "replace")))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (expect is None or len(got) < expect):
        if sub.poll(assembler, 10) == 0:
            time.sleep(0.005)
    return got


def join_duologue(ctx: Context, connect: ConnectResponse, session_id: int) -> tuple[Subscription, ExclusivePublication]:
    """The client's ``t`` and ``u`` for a CONNECT, presenting ``session_id`` (right or wrong)."""
    t = ctx.add_subscription(
        f"aeron:udp?control={HOST}:{connect.control_port}|control-mode=dynamic|session-id={session_id}",
        ECHO_STREAM_ID,
    )
    u = ctx.add_exclusive_publication(
        f"aeron:udp?endpoint={HOST}:{connect.port}|session-id={session_id}", ECHO_STREAM_ID
    )
    return t, u


def echo_over(t: Subscription, u: ExclusivePublication, line: str, timeout: float = 10.0) -> str:
    wait_until(lambda: t.image_count > 0 and u.is_connected, timeout, "the duologue")
    offer(u, line.encode())
    got: list[str] = []
    assembler = FragmentAssembler(lambda payload, header: got.append(bytes(payload).decode()))
    wait_until(lambda: t.poll(assembler, 10) > 0 or bool(got), timeout, f"the answer to {line!r}")
    return got[0]


@pytest.fixture
def ctx(driver_dir: Path) -> Iterator[Context]:
    with Context(driver_dir) as context:
        yield context


# -- take 1 -----------------------------------------------------------------------------------------


def test_take1_client_gets_its_numbers_echoed(processes: Callable[..., EchoProcess], ctx: Context) -> None:
    server_port, client_port = free_port_block(1), free_port_block(1)
    server = processes("server1", "server", "--take", "1", "--local-address", HOST, "--local-port", str(server_port))
    server.wait_for_output(r"echo server \(take 1\)")
    junk = ctx.add_exclusive_publication(f"aeron:udp?endpoint={HOST}:{server_port}", ECHO_STREAM_ID)
    wait_until(lambda: junk.is_connected, 10, "a connection to the take 1 server")
    for message in (b"HELLO nonsense", b"\xff\xfe", b"HELLO 0"):  # take 1 has no error reply: logged, survived
        offer(junk, message)
    client = processes(
        "client1", "client", "--take", "1", "--local-address", HOST, "--local-port", str(client_port),
        "--remote-address", HOST, "--remote-port", str(server_port), "--count", "3", "--interval", "0.1",
    )
    assert client.wait() == 0, client.output
    sent = re.findall(r"send: (\d+)$", client.output, re.MULTILINE)
    assert len(sent) == 3 and all(0 <= int(n) < 2**32 for n in sent)
    assert re.findall(r"response: (\d+)$", client.output, re.MULTILINE) == sent
    assert f"HELLO {client_port}" in server.output
    assert server.output.count("client sent malformed HELLO message") == 2
    assert server.proc.poll() is None


# -- take 2 -----------------------------------------------------------------------------------------


def test_take2_clients_get_their_messages_echoed(processes: Callable[..., EchoProcess]) -> None:
    server, data, control, base = take2_server(processes)
    clients = [take2_client(processes, f"client{i}", data, control, "--count", "3") for i in range(2)]
    for client in clients:
        assert client.wait() == 0, client.output
        sent = re.findall(r"send: ECHO ([0-9a-f]+)$", client.output, re.MULTILINE)
        assert len(sent) == 3
        assert re.findall(r"\] ECHO ([0-9a-f]+)$", client.output, re.MULTILINE) == sent
        port, control_port = map(int, re.search(r"CONNECT (\d+) (\d+) [0-9A-F]+$", client.output, re.M).groups())
        assert base <= port < base + 8 and base <= control_port < base + 8  # default 4 clients: 8 ports
    assert server.output.count("client with correct IP connected") == 2
    wait_until(lambda: server.output.count("deleted duologue") == 2, 15, "both duologues to be deleted")


def test_per_ip_limit_is_answered_with_the_exact_error(processes: Callable[..., EchoProcess], ctx: Context) -> None:
    server, data, control, _ = take2_server(processes, "--max-connections-per-address", "1", "--expiry", "30")
    raw = RawClient(ctx, data, control)
    first = raw.publication()
    assert " CONNECT " in raw.reply_to(first, b"HELLO 1234ABCD")  # holds this address's only duologue
    second = raw.publication()
    assert raw.reply_to(second, b"HELLO 1") == f"{second.session_id} ERROR too many connections for IP address"
    client = take2_client(processes, "limited", data, control, "--count", "1")
    assert client.wait() == 1
    assert re.search(r"ERROR .*server returned an error: too many connections for IP address$", client.output, re.M)
    assert server.proc.poll() is None


def test_a_full_server_answers_server_full(processes: Callable[..., EchoProcess], ctx: Context) -> None:
    server, data, control, _ = take2_server(processes, "--client-count", "2", "--per-ip-limit", "5", "--expiry", "30")
    raw = RawClient(ctx, data, control)
    pub = raw.publication()
    ports: set[int] = set()
    for key in (b"HELLO A", b"HELLO B"):
        connect = parse_initial_response(raw.reply_to(pub, key))
        assert isinstance(connect, ConnectResponse)
        ports |= {connect.port, connect.control_port}
    assert len(ports) == 4  # [base, base + 2 * 2), no port handed out twice
    assert raw.reply_to(pub, b"HELLO C") == f"{pub.session_id} ERROR server full"
    client = take2_client(processes, "too-late", data, control, "--count", "1")
    assert client.wait() == 1
    assert re.search(r"server returned an error: server full$", client.output, re.M)
    assert server.proc.poll() is None


def test_a_wrong_session_id_hears_nothing_from_the_duologue(
    processes: Callable[..., EchoProcess], ctx: Context
) -> None:
    server, data, control, _ = take2_server(processes, "--expiry", "30")
    raw = RawClient(ctx, data, control)
    pub = raw.publication()
    key = 0x5EC2E7
    connect = parse_initial_response(raw.reply_to(pub, b"HELLO %X" % key))
    assert isinstance(connect, ConnectResponse)
    session = connect.duologue_session(key)
    assert 1 <= session <= 2**31 - 1  # from the guide's reserved range
    wrong_t, wrong_u = join_duologue(ctx, connect, session ^ 1)
    deadline = time.monotonic() + 2.0
    heard: list[str] = []
    while time.monotonic() < deadline:
        wrong_u.offer(b"ECHO from an impostor")  # refused or not, the server never sees it
        heard += poll_lines(wrong_t, 0.1)
    assert heard == [] and wrong_t.image_count == 0
    assert "impostor" not in server.output and "client with correct IP connected" not in server.output
    t, u = join_duologue(ctx, connect, decrypt_session(connect.encrypted_session, key))
    assert echo_over(t, u, "ECHO from the real client") == "ECHO from the real client"
    assert server.proc.poll() is None


def test_an_unjoined_duologue_expires_and_frees_its_ports_and_session(
    processes: Callable[..., EchoProcess], ctx: Context
) -> None:
    # One client, one session id: a second duologue can only exist once the first is gone.
    server, data, control, base = take2_server(
        processes, "--client-count", "1", "--expiry", "1", "--reserved-session-id-low", "7",
        "--reserved-session-id-high", "7",
    )
    raw = RawClient(ctx, data, control)
    pub = raw.publication()
    connect = parse_initial_response(raw.reply_to(pub, b"HELLO 600DF00D"))
    assert isinstance(connect, ConnectResponse)
    assert connect.duologue_session(0x600DF00D) == 7
    assert {connect.port, connect.control_port} == {base, base + 1}
    assert raw.reply_to(pub, b"HELLO 1") == f"{pub.session_id} ERROR server full"
    server.wait_for_output(r"duologue expired", timeout=10)
    server.wait_for_output(rf"deleted duologue \(session 7, ports {connect.port}, {connect.control_port}\)")
    again = parse_initial_response(raw.reply_to(pub, b"HELLO 2"))
    assert isinstance(again, ConnectResponse)
    assert again.duologue_session(2) == 7 and {again.port, again.control_port} == {base, base + 1}
    t, u = join_duologue(ctx, again, 7)  # and the reused ports and session work
    assert echo_over(t, u, "ECHO reused") == "ECHO reused"


def test_malformed_lines_get_error_replies_and_never_crash_the_server(
    processes: Callable[..., EchoProcess], ctx: Context
) -> None:
    server, data, control, _ = take2_server(processes, "--expiry", "30")
    raw = RawClient(ctx, data, control)
    pub = raw.publication()
    bad_hellos = [b"HELLO", b"HELLO ", b"HELLO XYZ", b"hello 1", b"HELLO 123456789", b"HELLO 1 2", b"HELLO 1\n",
                  b"", b"\xff\xfe\xfd", b"ECHO hi", b"HELLO " + b"F" * 5000]
    for line in bad_hellos:
        assert raw.reply_to(pub, line) == f"{pub.session_id} ERROR bad message", line
    key = 0xC0FFEE
    connect = parse_initial_response(raw.reply_to(pub, b"HELLO C0FFEE"))
    assert isinstance(connect, ConnectResponse)
    t, u = join_duologue(ctx, connect, connect.duologue_session(key))
    assert echo_over(t, u, "ECHO ") == "ECHO "  # an empty message is still a message
    assert echo_over(t, u, "ECHO two\nlines") == "ECHO two\nlines"
    assert echo_over(t, u, "HELLO AB") == "ERROR bad message"  # and the duologue is closed
    server.wait_for_output(r"deleted duologue")
    u.offer(b"ECHO anyone there?")  # refused or unheard: the duologue is gone
    assert poll_lines(t, 0.5) == []
    for line in (b"\xc3\x28", b"ECHO"):  # the server still serves: a fresh duologue, another bad line
        connect = parse_initial_response(raw.reply_to(pub, b"HELLO 1"))
        assert isinstance(connect, ConnectResponse)
        t, u = join_duologue(ctx, connect, connect.duologue_session(1))
        wait_until(lambda t=t, u=u: t.image_count > 0 and u.is_connected, 10, "the duologue")  # type: ignore[misc]
        offer(u, line)
        assert poll_lines(t, 5.0, expect=1) == ["ERROR bad message"]
    assert server.proc.poll() is None
    assert "Traceback" not in server.output


def test_a_client_without_a_server_logs_a_timeout_and_exits(processes: Callable[..., EchoProcess]) -> None:
    base = free_port_block(2)
    client = take2_client(processes, "alone", base, base + 1, "--timeout", "1")
    assert client.wait() == 1
    assert re.search(r"ERROR .*timed out making the initial subscription to the server$", client.output, re.M)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["server", "--take", "1", "--local-address", HOST, "--client-count", "3"], "--client-count: not an option"),
        (["server", "--take", "2", "--local-address", HOST, "--local-port", "9000"], "--local-port: not an option"),
        (["client", "--take", "2", "--remote-address", HOST, "--remote-port", "9000"], "--remote-port: not an"),
        (["client", "--take", "1", "--remote-address", HOST], "take 1 needs --local-address"),
        (["server", "--take", "2", "--local-address", HOST, "--base-port", "9000"], "local_initial_port 9000 lies"),
    ],
)
def test_options_of_the_other_take_are_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from slipstream.cli import main

    assert main(["echo", *args, "--dir", str(tmp_path / "driver")]) == 2
    assert message in capsys.readouterr().err
