"""What a new user meets (issue 30): honest errors and seconds from the network layer's endpoints."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest

from slipstream.network import (
    Client,
    ClientClosedError,
    ClientConfig,
    ConfigTypeError,
    ConnectTimeout,
    Server,
    ServerConfig,
    StreamingError,
)
from slipstream.network.errors import InterfaceError
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


class ICalc(Protocol):
    def add(self, a: int, b: int) -> int: ...


def test_a_remote_call_with_arguments_of_the_wrong_type_fails_before_anything_is_sent(driver_dir: Path) -> None:
    """``await calc.add("2", 3)`` for ``a: int``: InterfaceError here, as the README says, checked with the
    host's own decoder; nothing goes out (the host's method never runs, no record is sent); a
    fire-and-forget call reports it to ``on_error`` instead of raising."""
    calls: list[tuple[int, int]] = []

    class Calc:
        def add(self, a: int, b: int) -> int:
            calls.append((a, b))
            return a + b

    async def main() -> list[BaseException]:
        errors: list[BaseException] = []
        common: dict[str, Any] = dict(app_id="tour", settings_store=":memory:", driver_directory=driver_dir)
        common["enable_ipc"] = True
        server_config = ServerConfig(interfaces=[(ICalc, Calc)], **common)
        async with Server(server_config) as server, Client(ClientConfig(interfaces=[ICalc], **common)) as client:
            client.on_error(lambda connection, error: errors.append(error))
            await server.bind_ipc()
            connection = await client.connect_ipc(timeout=10)
            calc = connection.rmi.get_global(ICalc, server.rmi.save(Calc()))
            assert await calc.add(2, 3) == 5
            sent = connection.stats["records_sent"]
            with pytest.raises(InterfaceError, match=r"ICalc\.add.*Expected `int`, got `str`"):
                await calc.add("2", 3)  # type: ignore[arg-type]
            calc.rmi_async().add(2, "3")  # type: ignore[arg-type]
            await asyncio.sleep(0.2)
            assert connection.stats["records_sent"] == sent and calls == [(2, 3)]
        return errors

    (error,) = run_async(main(), 30)
    assert isinstance(error, InterfaceError) and "got `str`" in str(error)


def test_send_nowait_of_a_missing_file_raises_naming_it(driver_dir: Path, tmp_path: Path) -> None:
    """A file that cannot be read is a mistake to fix, not a refusal to retry: ``send_nowait`` raises
    StreamingError naming it (as ``send`` does, and as the README says); False stays for back-pressure and
    closed connections."""
    missing = tmp_path / "nonexistent.bin"

    async def main() -> None:
        common: dict[str, Any] = dict(app_id="tour", settings_store=":memory:", driver_directory=driver_dir)
        common.update(enable_ipc=True, messages=[Note])
        async with Server(ServerConfig(**common)) as server, Client(ClientConfig(**common)) as client:
            await server.bind_ipc()
            connection = await client.connect_ipc(timeout=10)
            for attempt in (lambda: connection.send_nowait(missing), lambda: connection.send(missing)):
                with pytest.raises(StreamingError, match=r"nonexistent\.bin"):
                    result = attempt()
                    if asyncio.iscoroutine(result):
                        await result
            assert connection.send_nowait(Note(1)) is True

    run_async(main(), 30)


@pytest.mark.parametrize("config", [ServerConfig, ClientConfig])
@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"messages": [int]}, "messages: message types must be msgspec Structs or dataclasses"),
        ({"messages": [Note, Note]}, "messages: message type .*Note is registered twice"),
        ({"interfaces": [int]}, "interfaces: interface int declares no public methods"),
        ({"interfaces": [ICalc, ICalc]}, "interfaces: interface ICalc is registered twice"),
    ],
)
def test_registrations_are_checked_when_the_config_is_built(config: Any, fields: dict[str, Any], said: str) -> None:
    """Not first in ``Server(...)``/``Client(...)``: the config names the field."""
    with pytest.raises(ConfigTypeError, match=said):
        config(app_id="tour", settings_store=":memory:", **fields)
