"""Real network test hosts: Linux network namespaces, veth links and nftables loss and NAT.

The in-memory network proves protocol logic; these hosts prove the real thing — real sockets, real
kernel UDP, real packet loss and a real stateful NAT — without touching the machine's own network.
Every address, route, rule and ``ip_forward`` setting lives inside namespaces created here, and each
namespace is deleted (with any process still running in it) when its context manager exits.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables); ``scripts/ensure-system-deps.sh`` installs the
latter two. :func:`require_netns` says clearly what is missing, so a test fails with a reason
instead of an obscure ``CalledProcessError``.

Typical use::

    with Namespace() as ns:
        rule = drop_random_udp(ns, 40123, 20)
        ns.run(python_command(SENDER_AND_RECEIVER), timeout=10)
        assert rule.dropped() > 0
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, Self

__all__ = [
    "DEFAULT_TIMEOUT",
    "Link",
    "Namespace",
    "NamespaceCommandError",
    "NatTopology",
    "NetnsUnavailableError",
    "UdpDropRule",
    "DropRule",
    "drop_random",
    "drop_random_udp",
    "link",
    "python_command",
    "remove_stale_namespaces",
    "require_netns",
]

DEFAULT_TIMEOUT = 10.0
"""Seconds any command run by this module may take; nothing here waits without a bound."""

_NAME_PREFIX = "slip"
_STALE_NAME = re.compile(rf"^{_NAME_PREFIX}-(\d+)-[0-9a-f]+(?:-[a-z0-9]+)?$")
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


class NetnsUnavailableError(RuntimeError):
    """This machine (or user) cannot make network namespaces with nftables rules."""


class NamespaceCommandError(subprocess.CalledProcessError):
    """A command failed; unlike the base class, its message carries the command's stderr."""

    def __str__(self) -> str:
        stderr = self.stderr if isinstance(self.stderr, str) else (self.stderr or b"").decode(errors="replace")
        cmd = " ".join(self.cmd) if isinstance(self.cmd, list | tuple) else str(self.cmd)
        return f"command {cmd!r} exited with {self.returncode}: {stderr.strip() or '(no stderr)'}"


def _tool(name: str) -> str:
    """Absolute path of a system tool; root's tools live in sbin, which a plain PATH may lack."""
    path = os.environ.get("PATH", "")
    found = shutil.which(name, path=os.pathsep.join([path, *_SBIN]))
    if found is None:
        raise NetnsUnavailableError(
            f"'{name}' not found: install iproute2 and nftables (run scripts/ensure-system-deps.sh as root)"
        )
    return found


def _host(cmd: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, input: str | None = None) -> str:
    """Run a command in the caller's namespace (only ever to manage namespaces made here)."""
    result = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise NamespaceCommandError(result.returncode, list(cmd), result.stdout, result.stderr)
    return result.stdout


def require_netns() -> None:
    """Raise :class:`NetnsUnavailableError` with the reason if namespaces with nftables can't be made.

    Checks by doing: creates a throwaway namespace and loads a rule into it, because being root is not
    enough inside some containers (no CAP_SYS_ADMIN, no nf_tables module).
    """
    if not sys.platform.startswith("linux"):
        raise NetnsUnavailableError(f"network namespaces need Linux, not {sys.platform}")
    if os.geteuid() != 0:
        raise NetnsUnavailableError("network namespace tests need root (CI runs as root); run them with sudo")
    _tool("ip")
    _tool("nft")
    try:
        with Namespace(label="probe") as ns:
            ns.nft("table inet slip_probe {\n chain input {\n type filter hook input priority filter;\n }\n}\n")
    except (OSError, subprocess.SubprocessError) as exc:
        raise NetnsUnavailableError(f"cannot create a network namespace with nftables rules: {exc}") from exc


def python_command(code: str, *args: str) -> list[str]:
    """``[this interpreter, "-c", code, *args]``: the same Python (and venv) inside a namespace."""
    return [sys.executable, "-c", code, *args]


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces this module made in processes that have since died (e.g. a killed test run).

    Returns their names. Namespaces of live processes are left alone, so parallel runs are safe.
    """
    removed = []
    for name in _list_namespaces():
        match = _STALE_NAME.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _kill_namespace_processes(name)
        _host([_tool("ip"), "netns", "delete", name])
        removed.append(name)
    return removed


def _list_namespaces() -> list[str]:
    out = _host([_tool("ip"), "-j", "netns", "list"])
    return [str(entry["name"]) for entry in json.loads(out or "[]")]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespace_pids(name: str) -> list[int]:
    out = _host([_tool("ip"), "netns", "pids", name])
    return [int(token) for token in out.split()]


def _kill_namespace_processes(name: str, *, timeout: float = 5.0) -> None:
    """SIGKILL everything in the namespace, repeatedly, since a dying parent may still fork."""
    deadline = time.monotonic() + timeout
    while True:
        pids = _namespace_pids(name)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {pids} in namespace {name} survived SIGKILL for {timeout} s")
        time.sleep(0.01)


class Namespace:
    """A network namespace: an isolated host with its own interfaces, routes, sockets and nftables.
    Needs root and ``ip``/``nft`` (call :func:`require_netns` first for a clear reason if not).

    Only ``lo`` exists at first (brought up, so 127.0.0.1 works inside); add links with :func:`link`.
    Use as a context manager: exit kills every process still inside and deletes the namespace, so a
    failing test leaves nothing behind.
    """

    def __init__(self, label: str = "") -> None:
        if label and not re.fullmatch(r"[a-z0-9]{1,12}", label):
            raise ValueError(f"label must be 1-12 lowercase letters or digits: {label!r}")
        suffix = f"-{label}" if label else ""
        self.name = f"{_NAME_PREFIX}-{os.getpid()}-{secrets.token_hex(4)}{suffix}"
        self._created = False
        self._children: list[subprocess.Popen[str]] = []
        self._interface_numbers: dict[str, itertools.count[int]] = {}
        self._table_numbers = itertools.count()

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"

    def __enter__(self) -> Self:
        self.create()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def create(self) -> None:
        """Create the namespace and bring ``lo`` up (a new namespace's loopback starts down)."""
        if self._created:
            return
        _host([_tool("ip"), "netns", "add", self.name])
        self._created = True
        try:
            self.ip("link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill processes still inside, reap the ones started here, and delete the namespace."""
        if not self._created:
            return
        try:
            _kill_namespace_processes(self.name)
            for child in self._children:
                try:
                    child.wait(timeout=DEFAULT_TIMEOUT)
                except subprocess.TimeoutExpired:
                    child.kill()
                for stream in (child.stdin, child.stdout, child.stderr):
                    if stream is not None:
                        stream.close()
            self._children.clear()
        finally:
            _host([_tool("ip"), "netns", "delete", self.name])
            self._created = False

    def _exec_prefix(self) -> list[str]:
        if not self._created:
            raise RuntimeError(f"{self!r} is not created (use it as a context manager)")
        return [_tool("ip"), "netns", "exec", self.name]

    def run(
        self,
        cmd: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside the namespace and wait for it, never longer than ``timeout`` seconds.

        Output is captured as text. With ``check`` a non-zero exit raises
        :class:`NamespaceCommandError` (message includes stderr); a timeout kills the command and
        raises :class:`subprocess.TimeoutExpired`.
        """
        if not timeout > 0:
            raise ValueError(f"timeout must be positive: {timeout}")
        argv = [*self._exec_prefix(), *cmd]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        if check and result.returncode != 0:
            raise NamespaceCommandError(result.returncode, list(cmd), result.stdout, result.stderr)
        return result

    def popen(
        self,
        cmd: Sequence[str],
        *,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
        stdout: int | IO[Any] | None = subprocess.PIPE,
        stderr: int | IO[Any] | None = subprocess.PIPE,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """Start ``cmd`` inside the namespace (text mode, line-buffered pipes) and return at once.

        The caller bounds its waits; :meth:`close` kills the process if it is still running.
        """
        argv = [*self._exec_prefix(), *cmd]
        child = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, text=True, bufsize=1)
        self._children.append(child)
        return child

    def ip(self, *args: str, timeout: float = DEFAULT_TIMEOUT) -> str:
        """Run ``ip -n <ns> ARGS`` (iproute2 enters the namespace itself) and return its stdout."""
        if not self._created:
            raise RuntimeError(f"{self!r} is not created (use it as a context manager)")
        return _host([_tool("ip"), "-n", self.name, *args], timeout=timeout)

    def nft(self, ruleset: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Load nftables rules (``nft -f -`` syntax) into this namespace's own ruleset, atomically."""
        self.run([_tool("nft"), "-f", "-"], input=ruleset, timeout=timeout)

    def nft_json(self, *args: str, timeout: float = DEFAULT_TIMEOUT) -> list[dict[str, Any]]:
        """``nft -j ARGS`` inside the namespace, e.g. ``("list", "ruleset")``: the ``nftables`` array."""
        out = self.run([_tool("nft"), "-j", *args], timeout=timeout).stdout
        items: list[dict[str, Any]] = json.loads(out)["nftables"]
        return items

    def counter_packets(self, family: str, table: str, counter: str) -> int:
        """Packets counted so far by the named nftables counter ``counter`` in ``family table``."""
        for item in self.nft_json("list", "counter", family, table, counter):
            if "counter" in item:
                return int(item["counter"]["packets"])
        raise LookupError(f"no counter {counter!r} in table {family} {table} of {self!r}")

    def sysctl(self, key: str, value: str) -> None:
        """Set a per-namespace sysctl (``net.*``) here only, e.g. ``net.ipv4.ip_forward``."""
        if not key.startswith("net."):
            raise ValueError(f"only per-namespace net.* sysctls may be set from a namespace: {key}")
        path = "/proc/sys/" + key.replace(".", "/")
        self.run(["tee", path], input=f"{value}\n")

    def new_interface_name(self, stem: str = "eth") -> str:
        """A fresh interface name in this namespace (``eth0``, ``eth1``...); at most 15 bytes."""
        numbers = self._interface_numbers.setdefault(stem, itertools.count())
        name = f"{stem}{next(numbers)}"
        if len(name) > 15:
            raise ValueError(f"interface name too long for Linux (15 bytes max): {name}")
        return name

    def new_table_name(self, stem: str) -> str:
        """A fresh nftables table name, so several helpers can add rules to one namespace."""
        return f"{stem}_{next(self._table_numbers)}"


@dataclass(frozen=True, slots=True)
class DropRule:
    """Handle on a random-loss rule: read its counters, or remove it to heal the link."""

    namespace: Namespace
    table: str
    dport: int
    percent: int
    protocol: str = "udp"

    def dropped(self) -> int:
        """Packets to ``dport`` this rule has dropped (an nftables counter, so it is the truth)."""
        return self.namespace.counter_packets("inet", self.table, "dropped")

    def seen(self) -> int:
        """Packets to ``dport`` that reached the rule, dropped or not."""
        return self.namespace.counter_packets("inet", self.table, "seen")

    def remove(self) -> None:
        """Delete the rule's table; later datagrams pass untouched."""
        self.namespace.nft(f"delete table inet {self.table}\n")


UdpDropRule = DropRule
"""The rule ``drop_random_udp`` returns (the name it had before TCP rules existed)."""


def drop_random_udp(ns: Namespace, dport: int, percent: int) -> DropRule:
    """Drop a random ``percent`` % of UDP datagrams arriving for port ``dport`` in ``ns`` (root, nftables).

    The rule sits on the input hook, so it also hits traffic a namespace sends itself over its own
    loopback — one namespace is enough for a lossy sender/receiver pair. Loss is independent per
    packet (``numgen random mod 100 < percent``), the kind NAK-based repair must handle. A sender
    using UDP segmentation offload (the driver's ``udp_gso``, on by default) hands loopback a batch of
    datagrams as one packet, which this rule drops or passes whole: bursts of loss. With it off, each
    datagram is a packet.
    """
    return drop_random(ns, "udp", dport, percent)


def drop_random(ns: Namespace, protocol: str, dport: int, percent: int) -> DropRule:
    """(Root, nftables.) Drop a random ``percent`` % of the ``protocol`` ("udp" or "tcp") packets arriving for port
    ``dport`` in ``ns`` (see :func:`drop_random_udp`). For TCP that is the data a sender sends to the
    listening port; its acknowledgements pass. Loopback carries TCP in segments of up to 64 KiB."""
    if protocol not in ("udp", "tcp"):
        raise ValueError(f"protocol must be 'udp' or 'tcp': {protocol!r}")
    if not 0 < dport < 65536:
        raise ValueError(f"dport must be a port 1..65535: {dport}")
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise ValueError(f"percent must be an integer 0..100: {percent!r}")
    table = ns.new_table_name("slip_loss")
    ns.nft(
        f"""
        table inet {table} {{
            counter seen {{ }}
            counter dropped {{ }}
            chain input {{
                type filter hook input priority filter; policy accept;
                {protocol} dport {dport} counter name "seen"
                {protocol} dport {dport} numgen random mod 100 < {percent} counter name "dropped" drop
            }}
        }}
        """
    )
    return DropRule(namespace=ns, table=table, dport=dport, percent=percent, protocol=protocol)


@dataclass(frozen=True, slots=True)
class Link:
    """Two ends of a veth pair: ``a_interface`` with ``a_address`` in ``a``, and likewise ``b``."""

    a: Namespace
    b: Namespace
    a_interface: str
    b_interface: str
    a_address: ipaddress.IPv4Address
    b_address: ipaddress.IPv4Address
    network: ipaddress.IPv4Network


def link(
    a: Namespace,
    b: Namespace,
    subnet: str,
    *,
    a_interface: str | None = None,
    b_interface: str | None = None,
) -> Link:
    """Join ``a`` and ``b`` with a veth pair; ``a`` gets the subnet's first host address, ``b`` the second.

    The pair is created directly inside the namespaces (never in the caller's), and it vanishes when
    either namespace is deleted. ``subnet`` must not be a globally routed range (use e.g.
    ``10.99.0.0/30``, or TEST-NET ``192.0.2.0/24`` for a stand-in "public" side).
    """
    network = ipaddress.IPv4Network(subnet, strict=True)
    if network.is_global:
        raise ValueError(f"subnet {subnet} is globally routed; use a private or documentation range")
    hosts = network.hosts()
    try:
        a_address, b_address = next(hosts), next(hosts)
    except StopIteration:
        raise ValueError(f"subnet {subnet} has fewer than two host addresses") from None
    a_if = a_interface or a.new_interface_name()
    b_if = b_interface or b.new_interface_name()
    a.ip("link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b.name)
    for ns, ifname, address in ((a, a_if, a_address), (b, b_if, b_address)):
        ns.ip("address", "add", f"{address}/{network.prefixlen}", "dev", ifname)
        ns.ip("link", "set", ifname, "up")
    for ns, ifname in ((a, a_if), (b, b_if)):
        _wait_until_up(ns, ifname)
    return Link(a, b, a_if, b_if, a_address, b_address, network)


def _wait_until_up(ns: Namespace, ifname: str, timeout: float = 5.0) -> None:
    """Wait for operstate UP: until the kernel's link watcher (rate-limited to about once a second)
    activates the device, it drops every packet, which would look like loss to a test."""
    deadline = time.monotonic() + timeout
    while True:
        (info,) = json.loads(ns.ip("-j", "link", "show", "dev", ifname))
        if info.get("operstate") == "UP":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ifname} in {ns!r} still {info.get('operstate')} after {timeout} s")
        time.sleep(0.01)


class NatTopology:
    """Client behind a NAT router, server on the "public" side: the NAT traversal test bed (root, ip, nft).

    ``client`` (private network, default route via the router) — ``router`` (forwards, masquerades
    on its public interface, drops unsolicited inbound traffic: only ``ct state
    established,related`` comes back in) — ``server`` (public network, default route via the
    router, so a datagram it sends to the client's private address really reaches the router and is
    dropped there rather than failing locally). The router behaves like a typical home NAT:
    address-and-port-dependent filtering, so only the exact server address and port the client sent
    to can answer through the mapping.
    """

    ROUTER_PRIVATE_IF = "lan0"
    ROUTER_PUBLIC_IF = "wan0"

    def __init__(self, private_subnet: str = "10.99.1.0/24", public_subnet: str = "192.0.2.0/24") -> None:
        self.client = Namespace("client")
        self.router = Namespace("router")
        self.server = Namespace("server")
        self._private_subnet = private_subnet
        self._public_subnet = public_subnet
        self._private: Link | None = None
        self._public: Link | None = None

    def __enter__(self) -> Self:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self) -> None:
        for ns in (self.client, self.router, self.server):
            ns.create()
        self._private = link(self.router, self.client, self._private_subnet, a_interface=self.ROUTER_PRIVATE_IF)
        self._public = link(self.router, self.server, self._public_subnet, a_interface=self.ROUTER_PUBLIC_IF)
        self.client.ip("route", "add", "default", "via", str(self._private.a_address))
        self.server.ip("route", "add", "default", "via", str(self._public.a_address))
        self.router.sysctl("net.ipv4.ip_forward", "1")
        lan, wan = self.ROUTER_PRIVATE_IF, self.ROUTER_PUBLIC_IF
        self.router.nft(
            f"""
            table inet slip_nat_filter {{
                counter unsolicited {{ }}
                chain forward {{
                    type filter hook forward priority filter; policy drop;
                    ct state established,related accept
                    iifname "{lan}" oifname "{wan}" accept
                    counter name "unsolicited" drop
                }}
                chain input {{
                    type filter hook input priority filter; policy accept;
                    iifname "{wan}" ct state established,related accept
                    iifname "{wan}" counter name "unsolicited" drop
                }}
            }}
            table ip slip_nat {{
                chain postrouting {{
                    type nat hook postrouting priority srcnat; policy accept;
                    oifname "{wan}" masquerade
                }}
            }}
            """
        )

    def close(self) -> None:
        """Delete all three namespaces (and so the links, rules and processes in them)."""
        errors: list[BaseException] = []
        for ns in (self.client, self.router, self.server):
            try:
                ns.close()
            except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _links(self) -> tuple[Link, Link]:
        if self._private is None or self._public is None:
            raise RuntimeError("NatTopology is not built (use it as a context manager)")
        return self._private, self._public

    @property
    def client_address(self) -> ipaddress.IPv4Address:
        """The client's private address (unreachable from the public side)."""
        return self._links()[0].b_address

    @property
    def router_private_address(self) -> ipaddress.IPv4Address:
        """The router on the private network: the client's gateway."""
        return self._links()[0].a_address

    @property
    def router_public_address(self) -> ipaddress.IPv4Address:
        """The router's public address: what the server sees as the client's source address."""
        return self._links()[1].a_address

    @property
    def server_address(self) -> ipaddress.IPv4Address:
        """The server's public address."""
        return self._links()[1].b_address

    @property
    def private_network(self) -> ipaddress.IPv4Network:
        return self._links()[0].network

    @property
    def public_network(self) -> ipaddress.IPv4Network:
        return self._links()[1].network

    def unsolicited_dropped(self) -> int:
        """Inbound packets from the public side the router dropped (no NAT mapping / conntrack state)."""
        return self.router.counter_packets("inet", "slip_nat_filter", "unsolicited")
