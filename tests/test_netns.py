"""Real network test hosts: loss that really drops, links that really carry, a NAT that really filters.

These need root and network namespaces. On a machine without them they FAIL with the reason (CI is
root): a skipped loss or NAT test would let a broken test bed pass unnoticed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import queue
import subprocess
import threading

import pytest

from slipstream.testing import (
    Namespace,
    NatTopology,
    NetnsUnavailableError,
    drop_random,
    drop_random_udp,
    link,
    python_command,
    remove_stale_namespaces,
    require_netns,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def _remove_namespaces_left_by_killed_runs() -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError, NetnsUnavailableError):
        remove_stale_namespaces()  # a missing capability is reported by each test instead


_capability_error: str | None = None
_capability_checked = False


def needs_netns() -> None:
    global _capability_error, _capability_checked
    if not _capability_checked:
        _capability_checked = True
        try:
            require_netns()
        except NetnsUnavailableError as exc:
            _capability_error = str(exc)
    if _capability_error is not None:
        pytest.fail(f"network namespace test hosts unavailable: {_capability_error}", pytrace=False)


# Sends COUNT datagrams to itself over loopback, then an end marker on a loss-free port; loopback
# delivery is synchronous, so once the marker is in, every surviving datagram is queued.
LOSSY_LOOPBACK = """
import json, select, socket, sys
port, control_port, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    rx.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE: no drops from a full buffer
except OSError:
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
rx.bind(("127.0.0.1", port))
control = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
control.bind(("127.0.0.1", control_port))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(count):
    tx.sendto(i.to_bytes(4, "big"), ("127.0.0.1", port))
tx.sendto(b"end", ("127.0.0.1", control_port))
if not select.select([control], [], [], 5.0)[0]:
    sys.exit("end marker never arrived")
rx.setblocking(False)
seen = set()
while True:
    try:
        seen.add(int.from_bytes(rx.recv(64), "big"))
    except BlockingIOError:
        break
print(json.dumps({"received": len(seen)}))
"""


def test_random_udp_loss_on_loopback_is_real_and_counted() -> None:
    needs_netns()
    sent, port, control_port = 2000, 40123, 40124
    with Namespace() as ns:
        rule = drop_random_udp(ns, port, 20)
        result = ns.run(python_command(LOSSY_LOOPBACK, str(port), str(control_port), str(sent)), timeout=15)
        received = json.loads(result.stdout)["received"]
        dropped = rule.dropped()

        assert rule.seen() == sent
        assert received + dropped == sent, "every datagram either arrived or was dropped by the rule"
        # 20 % of 2000 has a standard deviation of ~18; 14-26 % is more than 6 sigma each way.
        assert 0.74 * sent <= received <= 0.86 * sent, f"received {received} of {sent}"

        rule.remove()
        result = ns.run(python_command(LOSSY_LOOPBACK, str(port), str(control_port), "200"), timeout=15)
        assert json.loads(result.stdout)["received"] == 200, "removing the rule heals the loopback"


# Sends argv[2] bytes over TCP loopback to port argv[1] in small writes; prints what the listener got.
LOSSY_TCP = """
import hashlib, json, socket, sys, threading
port, size = int(sys.argv[1]), int(sys.argv[2])
listener = socket.create_server(("127.0.0.1", port))
payload = bytes(range(256)) * (size // 256)
got = bytearray()
def serve():
    conn, _ = listener.accept()
    conn.settimeout(20)
    while len(got) < len(payload):
        chunk = conn.recv(65536)
        if not chunk:
            break
        got.extend(chunk)
reader = threading.Thread(target=serve)
reader.start()
with socket.create_connection(("127.0.0.1", port), timeout=20) as tx:
    tx.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for start in range(0, len(payload), 1000):
        tx.sendall(payload[start:start + 1000])
    reader.join(30)
print(json.dumps({"same": hashlib.sha256(got).digest() == hashlib.sha256(payload).digest(), "bytes": len(got)}))
"""


def test_random_tcp_loss_is_dropped_by_the_rule_and_repaired_by_tcp() -> None:
    needs_netns()
    with Namespace() as ns:
        rule = drop_random(ns, "tcp", 40125, 20)
        result = ns.run(python_command(LOSSY_TCP, "40125", str(1 << 20)), timeout=60)
        assert json.loads(result.stdout) == {"same": True, "bytes": 1 << 20}
        assert rule.protocol == "tcp" and rule.dropped() > 0 and rule.seen() > rule.dropped()
    with pytest.raises(ValueError, match="protocol"):
        drop_random(ns, "sctp", 40125, 5)


# A UDP endpoint driven by lines on stdin: "send HOST PORT TEXT" and "recv TIMEOUT".
UDP_AGENT = """
import select, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", s.getsockname()[1], flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "send":
        try:
            s.sendto(args[2].encode(), (args[0], int(args[1])))
            print("sent", flush=True)
        except OSError as exc:
            print("error", exc.errno, flush=True)
    elif cmd == "recv":
        if select.select([s], [], [], float(args[0]))[0]:
            data, (host, port) = s.recvfrom(2048)
            print("got", host, port, data.decode(), flush=True)
        else:
            print("timeout", flush=True)
"""


class UdpAgent:
    """Test-side handle on a UDP_AGENT process; every reply is awaited with a deadline."""

    def __init__(self, ns: Namespace, bind_host: str, port: int = 0) -> None:
        self.process = ns.popen(python_command(UDP_AGENT, bind_host, str(port)), stdin=subprocess.PIPE)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        ready, port_text = self._reply(timeout=10).split()
        assert ready == "ready"
        self.port = int(port_text)

    def _pump(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # the namespace's close() may close the pipe first
            for line in self.process.stdout:
                self._lines.put(line.strip())
        self._lines.put("<exited>")

    def _reply(self, timeout: float) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"UDP agent gave no answer within {timeout} s") from None
        if line == "<exited>":
            assert self.process.stderr is not None
            raise AssertionError(f"UDP agent exited: {self.process.stderr.read()}")
        return line

    def _command(self, line: str, timeout: float) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._reply(timeout)

    def send(self, host: ipaddress.IPv4Address | str, port: int, text: str) -> None:
        assert self._command(f"send {host} {port} {text}", timeout=5) == "sent"

    def recv(self, wait: float) -> tuple[str, int, str] | None:
        """(source host, source port, text), or None if nothing came within ``wait`` seconds."""
        reply = self._command(f"recv {wait}", timeout=wait + 5)
        if reply == "timeout":
            return None
        _, host, port, text = reply.split()
        return host, int(port), text


def test_veth_link_carries_udp_both_ways_and_stays_inside_the_namespaces() -> None:
    needs_netns()
    with Namespace() as a, Namespace() as b:
        veth = link(a, b, "10.99.0.0/30")
        assert (str(veth.a_address), str(veth.b_address)) == ("10.99.0.1", "10.99.0.2")

        receiver = UdpAgent(b, str(veth.b_address))
        sender = UdpAgent(a, str(veth.a_address))
        sender.send(veth.b_address, receiver.port, "hello")
        assert receiver.recv(wait=5) == (str(veth.a_address), sender.port, "hello")
        receiver.send(veth.a_address, sender.port, "back")
        assert sender.recv(wait=5) == (str(veth.b_address), receiver.port, "back")

        host_addresses = subprocess.run(["ip", "-o", "address"], capture_output=True, text=True, timeout=10).stdout
        assert "10.99.0." not in host_addresses, "link addresses must not appear in the host's namespace"
        names = (a.name, b.name)

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert not any(name in listed for name in names), "namespaces are deleted on exit"


def test_namespace_exit_kills_processes_left_inside() -> None:
    needs_netns()
    with Namespace() as ns:
        sleeper = ns.popen(["sleep", "600"])
        assert sleeper.poll() is None
    assert sleeper.wait(timeout=5) != 0


def test_nat_lets_replies_in_and_drops_unsolicited_inbound() -> None:
    needs_netns()
    with NatTopology() as nat:
        assert nat.client_address in nat.private_network
        assert nat.server_address in nat.public_network
        assert nat.router_public_address in nat.public_network
        client = UdpAgent(nat.client, "0.0.0.0")
        server = UdpAgent(nat.server, "0.0.0.0")
        stranger = UdpAgent(nat.server, "0.0.0.0")  # same public host, another port

        # Nothing the public side sends first reaches the client: not to its private address (the
        # router does not forward it), not to the router's public address (no mapping exists yet).
        server.send(nat.client_address, client.port, "unsolicited-private")
        server.send(nat.router_public_address, client.port, "unsolicited-public")
        assert client.recv(wait=0.5) is None
        assert nat.unsolicited_dropped() >= 2

        # The client speaks first: the server sees the router's public address (masquerade) ...
        client.send(nat.server_address, server.port, "hello")
        got = server.recv(wait=5)
        assert got is not None and got[0] == str(nat.router_public_address) and got[2] == "hello", got
        mapped_port = got[1]
        # ... and its reply comes back through the mapping (conntrack: established).
        server.send(nat.router_public_address, mapped_port, "reply")
        assert client.recv(wait=5) == (str(nat.server_address), server.port, "reply")

        # The mapping admits only the peer the client spoke to: another port on the same host is dropped.
        dropped_before = nat.unsolicited_dropped()
        stranger.send(nat.router_public_address, mapped_port, "stranger")
        assert client.recv(wait=0.5) is None
        assert nat.unsolicited_dropped() > dropped_before


def test_nat_router_forwards_only_inside_its_namespace() -> None:
    needs_netns()
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        host_forward_before = f.read()
    with NatTopology() as nat:
        forward = nat.router.run(["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip()
        client_forward = nat.client.run(["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip()
        assert (forward, client_forward) == ("1", "0")
        with open("/proc/sys/net/ipv4/ip_forward") as f:
            assert f.read() == host_forward_before, "the host's own forwarding setting is untouched"
