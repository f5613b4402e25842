"""What a new user meets (issue 30): honest errors and seconds from the network layer's endpoints."""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgspec
import pytest

from slipstream.network import Client, ClientClosedError, ClientConfig, ConnectTimeout
from slipstream.testing import run_async

from .test_network_aio import free_ports


class Note(msgspec.Struct):
    n: int


def test_connecting_a_closed_client_says_it_is_closed(driver_dir: Path) -> None:
    async def main() -> None:
        config = ClientConfig(app_id="tour", messages=[Note], settings_store=":memory:", driver_directory=driver_dir)
        client = Client(config)
        await client.close()
        for attempt in (client.connect("127.0.0.1", free_ports(2), timeout=1), client.connect_ipc(timeout=1)):
            with pytest.raises(ClientClosedError, match="closed"):
                await attempt

    run_async(main(), 30)


def test_a_connect_timeout_names_the_seconds_it_waited_in_all(driver_dir: Path) -> None:
    """With IPC on and a local host the client first probes IPC (0.5 s), then UDP: the message names the
    whole wait, which is the timeout given (the config's ``connect_timeout`` by default)."""

    async def main() -> tuple[float, str]:
        config = ClientConfig(app_id="tour", messages=[Note], settings_store=":memory:", driver_directory=driver_dir)
        async with Client(config) as client:
            started = time.monotonic()
            with pytest.raises(ConnectTimeout) as info:
                await client.connect("127.0.0.1", free_ports(2), timeout=2)
            return time.monotonic() - started, str(info.value)

    waited, message = run_async(main(), 30)
    said = float(re.search(r"within ([0-9.]+) s", message).group(1))  # type: ignore[union-attr]
    assert 1.9 <= waited <= 3.0 and abs(said - waited) <= 0.3, (waited, message)
    assert "connect_timeout" in (Client.connect.__doc__ or "") and "30 s" in (Client.connect.__doc__ or "")
