"""The tour's real servers and clients: what ``make demo`` records about connections, and the live loop.

:func:`record_connections` runs a :class:`~slipstream.network.Server` with recording on and clients
that connect over UDP and over IPC, exchange typed messages (``send``, ``send_sync``, the server
sending every tenth back, pings both ways) and close. Some are refused on purpose: tags the server's
filter refuses (over UDP and IPC), and a client whose message types differ, which refuses the server
itself and records that on its side. The server records the handshakes, connections and statistics
the report turns into its sessions and rejections tables; the run's own counts come back in a
:class:`NetworkSummary` for the tour to print and the tests to compare.

:func:`refuse_listed` is the live half: a server whose admission filter consults the abuse list
that a Spark streaming query publishes, an intruder whose refused attempts the server records, and a
well-behaved client from the same host refused once the list names that host.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..network import (
    Client,
    ClientConfig,
    ClientRejected,
    Connection,
    ConnectionNotPermitted,
    RegistrationMismatch,
    Server,
    ServerConfig,
)
from ..telemetry import RecorderConfig, RecordingConfig

__all__ = ["NetworkSummary", "free_port_pair", "record_connections", "refuse_listed"]

APP_ID = "slipstream-demo"
INTRUDER_TAG = "intruder"
"""Clients whose tag starts with this are refused by the demo server's filter."""
SERVER_PINGS = 120
"""Pings the server sends each connection, ``PING_GAP_S`` apart (its RTT samples for the report: a
p99 needs 100). A server in service samples with ``RecordingConfig.rtt_interval_s`` instead; the
demo pings itself so that every ping is answered before the client goes (its byte counts are exact)."""
PING_GAP_S = 0.01
REPLY_EVERY = 10
"""The server sends back the 1st, 11th, 21st... message each client sends it (traffic both ways)."""


@dataclass
class NetworkSummary:
    """What the network run did, counted by the run itself (the report must agree)."""

    sessions: dict[int, dict[str, object]] = field(default_factory=dict)
    """Per connection id: transport, tag, messages (with the ``send_sync`` one) the client sent
    (``sent``), what the server's listeners got (``received``), the record bytes the client handed to
    the transport (``bytes_sent``); the other way, the messages the server sent back (``replied``),
    what the client's listeners got of them (``replies``) and the record bytes the client received
    (``bytes_received``: the server's pings, acknowledgements and replies)."""
    rejected: dict[str, dict[str, int]] = field(default_factory=dict)
    """Handshakes the server refused: host (``ipc`` for IPC) -> reason -> attempts."""
    types: dict[str, int] = field(default_factory=dict)
    """Messages the clients sent, by type name (the server captures each with its fields as columns)."""
    client_refusals: dict[str, int] = field(default_factory=dict)
    """Handshakes a client abandoned itself (its message types differ), by reason."""


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A UDP port ``p`` with ``p + 1`` free too (a server's handshake and control ports)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as first:
            first.bind((host, 0))
            port = int(first.getsockname()[1])
            if port >= 65000:
                continue
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as second:
                    second.bind((host, port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no free pair of UDP ports on this host")


def recording_config(directory: Path, *, capture_messages: bool = False) -> RecordingConfig:
    """Recording as the tour sets it: short flushes and segments, so readers see the run at once."""
    return RecordingConfig(
        directory=directory,
        recorder=RecorderConfig(flush_interval_s=0.2, segment_max_age_s=0.5),
        stats_interval_s=0.25,
        capture_messages=capture_messages,
    )


def server_config(
    messages: Sequence[type], driver_dir: Path, recording: RecordingConfig, admit: Callable[[str], bool]
) -> ServerConfig:
    """The demo server: loopback only, refuses intruders' tags and whatever ``admit`` refuses."""

    def filter_(address: str | None, tag: str) -> bool:
        return not tag.startswith(INTRUDER_TAG) and (address is None or admit(address))

    return ServerConfig(
        app_id=APP_ID,
        messages=messages,
        settings_store=":memory:",
        listen_address="127.0.0.1",
        enable_ipv6=False,
        max_clients=32,
        driver_directory=driver_dir,
        filter=filter_,
        recording=recording,
    )


def client_config(
    messages: Sequence[type], driver_dir: Path, tag: str, *, ipc: bool, recording: RecordingConfig | None = None
) -> ClientConfig:
    """A demo client: over IPC (same host, both sides enable it) or forced onto UDP."""
    return ClientConfig(
        app_id=APP_ID,
        messages=messages,
        settings_store=":memory:",
        enable_ipv6=False,
        enable_ipc=ipc,
        driver_directory=driver_dir,
        tag=tag,
        recording=recording,
    )


def _refused(summary: NetworkSummary, host: str, reason: str) -> None:
    reasons = summary.rejected.setdefault(host, {})
    reasons[reason] = reasons.get(reason, 0) + 1


def record_connections(
    recording: Path,
    driver_dir: Path,
    messages: Sequence[type],
    make_message: Callable[[int], object],
    *,
    clients: int = 4,
    per_client: int = 500,
    intruders: int = 3,
    say: Callable[[str], object] = print,
    timeout_s: float = 60.0,
) -> NetworkSummary:
    """A recorded server and ``clients`` clients (even: UDP, odd: IPC), plus ``intruders`` refused
    attempts and one client whose message types differ; everything bounded by ``timeout_s``."""
    return asyncio.run(
        asyncio.wait_for(
            _record_connections(recording, driver_dir, messages, make_message, clients, per_client, intruders, say),
            timeout_s,
        )
    )


async def _record_connections(
    recording: Path,
    driver_dir: Path,
    messages: Sequence[type],
    make_message: Callable[[int], object],
    clients: int,
    per_client: int,
    intruders: int,
    say: Callable[[str], object],
) -> NetworkSummary:
    summary = NetworkSummary()
    record = recording_config(recording, capture_messages=True)
    received: dict[int, int] = {}
    replied: dict[int, int] = {}
    pinged: dict[int, int] = {}
    port = free_port_pair()
    async with Server(server_config(messages, driver_dir, record, lambda address: True)) as server:
        # The server also captures every message it receives (typed.Quote, typed.Chat tables).

        @server.on_connect
        async def ping_back(connection: Connection) -> None:
            for _ in range(SERVER_PINGS):
                await connection.ping(timeout=5.0)
                pinged[connection.id] = pinged.get(connection.id, 0) + 1
                await asyncio.sleep(PING_GAP_S)

        async def reply(connection: Connection, message: object) -> None:
            await connection.send(message)
            replied[connection.id] = replied.get(connection.id, 0) + 1

        def count(connection: Connection, message: object) -> Coroutine[None, None, None] | None:
            received[connection.id] = n = received.get(connection.id, 0) + 1
            # The server sends some back (a task the server runs): messages and bytes flow both ways.
            return reply(connection, message) if n % REPLY_EVERY == 1 else None

        for kind in messages:
            server.on_message(kind)(count)
        await server.bind(port)
        say(f"  server: listening on 127.0.0.1:{port} (UDP) and IPC, recording into {recording}")
        for i in range(clients):
            ipc = i % 2 == 1
            tag = f"{'ipc' if ipc else 'udp'}-client-{i}"
            replies = 0

            def got_reply(connection: Connection, message: object) -> None:
                nonlocal replies
                replies += 1

            async with Client(client_config(messages, driver_dir, tag, ipc=ipc)) as client:
                for kind in messages:
                    client.on_message(kind)(got_reply)
                connection = await client.connect("127.0.0.1", port, timeout=20.0)
                for n in range(per_client):
                    message = make_message(n)
                    await connection.send(message)
                    summary.types[type(message).__name__] = summary.types.get(type(message).__name__, 0) + 1
                message = make_message(per_client)
                await connection.send_sync(message, timeout=10.0)
                summary.types[type(message).__name__] = summary.types.get(type(message).__name__, 0) + 1
                rtt = await connection.ping(timeout=5.0)
                # Everything arrived and the server's pings are done before the client goes.
                cid = connection.id
                await _until(lambda: received.get(cid, 0) > per_client)  # noqa: B023 (awaited here)
                await _until(lambda: pinged.get(cid, 0) >= SERVER_PINGS)  # noqa: B023
                expected_replies = len(range(1, per_client + 2, REPLY_EVERY))
                await _until(lambda: replies >= expected_replies)  # noqa: B023
                summary.sessions[cid] = {"transport": "ipc" if connection.is_ipc else "udp", "tag": tag,
                                         "sent": per_client + 1, "replies": replies}  # fmt: skip
                say(f"  {tag}: connection {cid} over {'IPC' if connection.is_ipc else 'UDP'}, "
                    f"{per_client + 1} typed messages, {replies} back, ping {rtt.round_trip * 1e6:.0f} µs")  # fmt: skip
            await _until(lambda: all(c.id != cid for c in server.connections))  # noqa: B023
            summary.sessions[cid]["bytes_sent"] = connection.stats["bytes_sent"]  # with its CLOSE record
            summary.sessions[cid]["bytes_received"] = connection.stats["bytes_received"]
        for i in range(intruders + 1):  # the last one over IPC: the filter sees its tag, no address
            ipc = i == intruders
            try:
                async with Client(client_config(messages, driver_dir, f"{INTRUDER_TAG}-{i}", ipc=ipc)) as client:
                    await client.connect("127.0.0.1", port, timeout=20.0)
            except ConnectionNotPermitted:
                _refused(summary, "ipc" if ipc else "127.0.0.1", "not_permitted")
        # Other message types: the fingerprints differ, so the server, once the client is admitted, refuses
        # it with the difference (recorded on its side), and the client records its refusal too.
        old = client_config(list(messages)[:1], driver_dir, "old-version", ipc=True, recording=record)
        try:
            async with Client(old) as client:
                await client.connect("127.0.0.1", port, timeout=20.0)
        except RegistrationMismatch:
            _refused(summary, "ipc", "registration_mismatch")
            refusals = summary.client_refusals
            refusals["registration_mismatch"] = refusals.get("registration_mismatch", 0) + 1
        refused = sum(sum(reasons.values()) for reasons in summary.rejected.values())
        say(f"  server: refused {refused} handshakes on purpose (intruder tags: {intruders} over UDP, 1 over IPC; "
            "a client with other message types: RegistrationMismatch)")  # fmt: skip
        for connection_id, session in summary.sessions.items():
            session["received"] = received.get(connection_id, 0)
            session["replied"] = replied.get(connection_id, 0)
    return summary


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``condition()`` holds (TimeoutError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the demo waited {timeout_s:g} s for a condition that did not come")
        await asyncio.sleep(0.005)


def refuse_listed(
    driver_dir: Path,
    recording: Path,
    messages: Sequence[type],
    admit: Callable[[str], bool],
    *,
    attempts: int,
    say: Callable[[str], object] = print,
    timeout_s: float = 120.0,
) -> bool:
    """The live loop's network half: an intruder is refused ``attempts`` times (recorded), then a
    well-behaved client from the same host keeps trying until the server refuses it because the
    abuse list (consulted through ``admit``) names the host. True when that happened in time."""
    return asyncio.run(_refuse_listed(driver_dir, recording, messages, admit, attempts, say, timeout_s))


async def _refuse_listed(
    driver_dir: Path,
    recording: Path,
    messages: Sequence[type],
    admit: Callable[[str], bool],
    attempts: int,
    say: Callable[[str], object],
    timeout_s: float,
) -> bool:
    config = server_config(messages, driver_dir, recording_config(recording), admit)
    port = free_port_pair()
    deadline = time.monotonic() + timeout_s
    async with Server(config) as server:
        await server.bind(port)
        for i in range(attempts):
            try:
                async with Client(client_config(messages, driver_dir, f"{INTRUDER_TAG}-live-{i}", ipc=False)) as c:
                    await c.connect("127.0.0.1", port, timeout=20.0)
            except ConnectionNotPermitted:
                pass
        say(f"  server: refused {attempts} handshakes from intruders on 127.0.0.1 (recorded as they happen)")
        good = client_config(messages, driver_dir, "regular-client", ipc=False)
        while time.monotonic() < deadline:
            try:
                async with Client(good) as client:
                    connection = await client.connect("127.0.0.1", port, timeout=20.0)
                    await connection.close()
            except ClientRejected as exc:
                say(f"  regular-client from 127.0.0.1: REFUSED ({exc}): its host is on the abuse list")
                break
            await asyncio.sleep(0.5)
        else:
            say("  the abuse list did not reach the server in time")
            return False
        async with Client(client_config(messages, driver_dir, "ipc-client", ipc=True)) as client:
            connection = await client.connect("127.0.0.1", port, timeout=20.0)
            say(f"  ipc-client: connected over IPC as connection {connection.id} (IPC is never IP-filtered)")
    return True
