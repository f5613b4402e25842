"""Servers and clients with ``recording`` on: what each side writes, read back from the Parquet segments."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")

from slipstream.network import Client, Connection, ConnectionNotPermitted, Server
from slipstream.network.config import ConfigTypeError, ServerConfig
from slipstream.telemetry import RecorderConfig, Recording, RecordingConfig, read_segment
from tests.test_network_aio import Base, Derived, Quote, client_config, free_ports, run, server_config, wait_for


def rows(root: Path, kind: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for segment in Recording(root).segments(kind):
        found.extend(read_segment(segment).to_pylist())
    return sorted(found, key=lambda row: row["timestamp_ns"])


def test_server_and_client_record_their_side_of_each_connection(driver_dir: Path, tmp_path: Path) -> None:
    recording = RecordingConfig(
        directory=tmp_path / "rec", recorder=RecorderConfig(flush_interval_s=0.1), stats_interval_s=0.05
    )
    sent = 40

    async def main() -> dict[str, int]:
        port = free_ports(50)
        config = server_config(driver_dir, recording=recording, filter=lambda address, tag: tag != "intruder")
        async with Server(config) as server:
            received: list[Quote] = []
            server.on_message(Quote)(lambda connection, quote: received.append(quote))
            await server.bind(port)
            async with Client(client_config(driver_dir, tag="alice", recording=recording)) as client:
                connection = await client.connect("127.0.0.1", port, timeout=10)
                for i in range(sent):
                    await connection.send(Quote(i, 1.5, "SLIP"))
                await connection.ping(timeout=5)
                await wait_for(lambda: len(received) == sent)
                await asyncio.sleep(0.2)  # a few periodic samples while the connection is up
            client_stats = connection.stats
            await wait_for(lambda: not server.connections)
            with pytest.raises(ConnectionNotPermitted):
                async with Client(client_config(driver_dir, tag="intruder", recording=recording)) as intruder:
                    await intruder.connect("127.0.0.1", port, timeout=10)
        return client_stats

    client_stats = run(main())
    root = tmp_path / "rec"
    assert [w.startswith("net-") for w in Recording(root).writers()] == [True]  # one shared writer, closed
    events = rows(root, "connection_events")
    seen = [(e["side"], e["event"], e["tag"], e["reason"] or e["cause"]) for e in events]
    # Both sides' "connected" race each other; everything else happens in this order.
    assert seen[0] == ("server", "handshake_accepted", "alice", None)
    assert set(seen[1:3]) == {("server", "connected", "alice", None), ("client", "connected", "alice", None)}
    assert seen[3:] == [
        ("client", "disconnected", "alice", "closed"),
        ("server", "disconnected", "alice", "peer_closed"),
        ("server", "handshake_rejected", "intruder", "not_permitted"),
        ("client", "handshake_rejected", "intruder", "not_permitted"),
    ]
    accepted = events[0]
    assert accepted["transport"] == "udp" and accepted["address"].startswith("127.0.0.1:")
    connection_id = accepted["connection_id"]
    assert {e["connection_id"] for e in events if e["event"] != "handshake_rejected"} == {connection_id}
    refused = [e for e in events if e["event"] == "handshake_rejected"]
    assert {e["address"] for e in refused} == {"127.0.0.1"} and {e["connection_id"] for e in refused} == {None}

    stats = rows(root, "connection_stats")
    server_rows = [s for s in stats if s["side"] == "server"]
    client_rows = [s for s in stats if s["side"] == "client"]
    assert len(server_rows) >= 3 and len(client_rows) >= 3  # periodic samples plus the final one
    final_server, final_client = server_rows[-1], client_rows[-1]
    assert final_server["messages_received"] == sent and final_client["messages_sent"] == sent
    assert final_client["bytes_sent"] == client_stats["bytes_sent"] == final_server["bytes_received"]
    assert [s["rtt_ns"] for s in client_rows if s["rtt_ns"] is not None] != []  # the client's ping
    assert all(s["rtt_ns"] is None for s in server_rows)  # the server pinged no one
    for side in (server_rows, client_rows):  # counters are cumulative
        assert [s["messages_received"] + s["messages_sent"] for s in side] == sorted(
            s["messages_received"] + s["messages_sent"] for s in side
        )
    assert rows(root, "driver_counters")  # the driver they share, sampled once per interval


def test_recording_off_by_default_and_checked(driver_dir: Path, tmp_path: Path) -> None:
    assert ServerConfig(app_id="a").recording is None
    with pytest.raises(ConfigTypeError, match="recording"):
        ServerConfig(app_id="a", recording=str(tmp_path))  # type: ignore[arg-type]

    async def main() -> None:
        port = free_ports(50)
        async with Server(server_config(driver_dir)) as server:
            await server.bind(port)
            async with Client(client_config(driver_dir)) as client:
                connection: Connection = await client.connect("127.0.0.1", port, timeout=10)
                await connection.ping(timeout=5)
                assert server._recording is None and client._recording is None

    run(main())


def test_captured_messages_come_out_with_their_fields_as_typed_columns(driver_dir: Path, tmp_path: Path) -> None:
    recording = RecordingConfig(directory=tmp_path / "rec", capture_messages=True)
    note = tmp_path / "note.txt"
    note.write_text("a file")
    sent = [Quote(i, i / 2, f"S{i}") for i in range(30)] + [Derived(7, "seven"), Base(3)]

    async def main() -> dict[str, Any]:
        port = free_ports(50)
        async with Server(server_config(driver_dir, recording=recording)) as server:
            got: list[object] = []
            for kind in (Quote, Base, Path):
                server.on_message(kind)(lambda connection, message: got.append(message))
            await server.bind(port)
            async with Client(client_config(driver_dir)) as client:  # the client records nothing
                connection = await client.connect("127.0.0.1", port, timeout=10)
                for message in sent:
                    await connection.send(message)
                await wait_for(lambda: len(got) == len(sent))
                await connection.send(note)  # a file: captured as an event without message bytes
                await wait_for(lambda: len(got) == len(sent) + 1)
                (server_side,) = server.connections
                return {"channel": server_side.subscription.channel, "stream": server_side.subscription.stream_id}

    where = run(main())
    root = tmp_path / "rec"
    captured = rows(root, "captured")
    assert [row["message_type"] for row in captured] == [type(m).__name__ for m in sent] + ["PosixPath"]
    assert captured[-1]["size"] == 0
    captured = captured[:-1]
    assert {(row["channel"], row["stream_id"]) for row in captured} == {(where["channel"], where["stream"])}
    assert all(row["size"] == len(row["payload"]) > 0 for row in captured)
    positions = [row["position"] for row in captured]
    assert positions == sorted(positions) and positions[0] > 0  # the records' stream positions
    quotes = rows(root, "typed.Quote")
    assert [(q["id"], q["price"], q["symbol"]) for q in quotes] == [(m.id, m.price, m.symbol) for m in sent[:30]]
    (derived,) = rows(root, "typed.Derived")
    assert (derived["n"], derived["label"]) == (7, "seven")
    assert [b["n"] for b in rows(root, "typed.Base")] == [3]


LOSSY_PORT = 40611
LOSSY_SCRIPT = """
import asyncio, sys
from pathlib import Path
import msgspec
from slipstream.network import Client, ClientConfig, Server, ServerConfig
from slipstream.telemetry import RecorderConfig, RecordingConfig

class Blob(msgspec.Struct):
    n: int
    data: bytes

async def main(root: str, port: int, count: int) -> None:
    recording = RecordingConfig(directory=root, recorder=RecorderConfig(flush_interval_s=0.1), stats_interval_s=0.1)
    common = dict(app_id="lossy", messages=[Blob], settings_store=":memory:", enable_ipc=False, enable_ipv6=False,
                  recording=recording)
    received = []
    async with Server(ServerConfig(listen_address="127.0.0.1", driver_directory=Path(root) / "server-driver",
                                   **common)) as server:
        server.on_message(Blob)(lambda connection, blob: received.append(blob.n))
        await server.bind(port)
        async with Client(ClientConfig(driver_directory=Path(root) / "client-driver", **common)) as client:
            connection = await client.connect("127.0.0.1", port, timeout=60)
            for n in range(count):
                await connection.send(Blob(n, bytes(1000)))
            await connection.send_sync(Blob(-1, b""), timeout=60)
            await asyncio.sleep(0.3)  # a few samples after the last repair
    assert received == [*range(count), -1], "every message, once, in order"
    print("done", flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def test_a_connection_over_a_lossy_link_records_its_naks_retransmissions_and_losses(tmp_path: Path) -> None:
    """Loss on the server's port (client to server data) inside a namespace: the server's side records
    the NAKs it sent and the bytes it found lost, the client's the NAKs it heard and what it resent,
    per connection and per stream (the report's loss rate is built on these)."""
    from slipstream.testing import Namespace, drop_random_udp, python_command, require_netns

    require_netns()
    root = tmp_path / "rec"
    with Namespace("netloss") as ns:
        rule = drop_random_udp(ns, LOSSY_PORT, 5)
        done = ns.run(python_command(LOSSY_SCRIPT, str(root), str(LOSSY_PORT), "3000"), timeout=120, check=False)
        assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]
        assert rule.dropped() > 0
    stats = rows(root, "connection_stats")
    server_side = [s for s in stats if s["side"] == "server"][-1]
    client_side = [s for s in stats if s["side"] == "client"][-1]
    assert server_side["naks_sent"] > 0 and server_side["bytes_lost"] > 0
    assert client_side["naks_received"] > 0 and client_side["retransmits"] > 0
    assert client_side["bytes_lost"] == 0  # nothing is dropped on the way back
    streams = rows(root, "stream_stats")
    received = [s for s in streams if s["direction"] == "sub" and s["naks"] > 0]
    sent = [s for s in streams if s["direction"] == "pub" and s["retransmits"] > 0]
    assert received and received[-1]["bytes_lost"] > 0 and received[-1]["messages"] > 0
    assert sent and sent[-1]["naks"] > 0 and sent[-1]["position"] > 3000 * 1000
