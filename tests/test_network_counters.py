"""Records a connection drops unopened (tampered, replayed, forged, malformed) are counted per endpoint,
readable from Python (``server.records_dropped``) and in the driver's counters file, which
``slipstream stat`` prints: an operator sees an attack without the application's help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from slipstream.files import observe
from slipstream.files.counters import NETWORK_RECORDS_DROPPED_TYPE_ID
from slipstream.network import Client, Server

from .test_network_aio import Base, client_config, free_ports, run, server_config


def dropped_counters(driver_dir: Path) -> dict[str, int]:
    return {c.label: c.value for c in observe.counters(driver_dir) if c.type_id == NETWORK_RECORDS_DROPPED_TYPE_ID}


def test_dropped_records_are_counted_per_endpoint_and_shown_by_stat(driver_dir: Path) -> None:
    async def main() -> None:
        port = free_ports(50)
        got: list[int] = []
        async with Server(server_config(driver_dir)) as server, Client(client_config(driver_dir)) as client:
            server.on_message(Base)(lambda c, m: got.append(m.n))
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            counters = dropped_counters(driver_dir)
            assert len(counters) == 2 and set(counters.values()) == {0}  # the server's and the client's
            (server_label,) = [label for label in counters if label.startswith("net records dropped: server")]
            records: list[bytes] = []
            publication = connection._publication
            original = publication.offer

            def capture(message: Any, reserved_value: int = 0) -> int:
                records.append(bytes(message))
                return original(message, reserved_value)

            publication.offer = capture  # type: ignore[method-assign]
            await connection.send_sync(Base(1), timeout=5)
            publication.offer = original  # type: ignore[method-assign]
            tampered = bytearray(records[0])
            tampered[-1] ^= 0x01
            for bad in (records[0], bytes(tampered), b"short", records[0]):  # replayed twice, tampered, malformed
                assert original(bad) > 0
            await connection.send_sync(Base(2), timeout=5)
            assert got == [1, 2]
            assert server.records_dropped == 4 and client.records_dropped == 0
            assert dropped_counters(driver_dir)[server_label] == 4

            done = subprocess.run(
                [sys.executable, "-m", "slipstream", "stat", "--dir", str(driver_dir), "--once", "--json"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            shown = {c["label"]: c for c in json.loads(done.stdout)["counters"]}
            assert shown[server_label]["value"] == 4 and shown[server_label]["type_name"] == "net-drop"
        assert dropped_counters(driver_dir) == {}  # freed with the endpoints

    run(main())
