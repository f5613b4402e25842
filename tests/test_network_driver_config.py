"""Driver tuning from the endpoint's config (issue 34, item 1): ``ServerConfig(driver_config=DriverConfig(...))``
over real sockets, checked against what the running driver reports it runs with (its ``driver.toml``), not only
against the config object."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from slipstream import DriverConfig
from slipstream.driver.config_file import running_config
from slipstream.driver.media_driver import MediaDriver
from slipstream.files import observe
from slipstream.network import (
    Client,
    ConfigError,
    ConfigTypeError,
    Connection,
    DriverSettingsIgnored,
    Server,
    ServerConfig,
)
from slipstream.network.tuning import IDLE_DATAGRAM_MAX_NS

from .test_network_aio import Quote, client_config, free_ports, run, server_config, wait_for

MS = 1_000_000
TUNING = DriverConfig(
    receiver_window=256 * 1024,
    so_sndbuf=1024 * 1024,
    so_rcvbuf=4 * 1024 * 1024,
    publication_linger_ns=2000 * MS,
    idle_strategy="sleep",
    idle_heartbeat_max_ns=500 * MS,  # set: wins over the network layer's 1 s
)


def test_driver_config_is_checked_when_built(driver_dir: Path) -> None:
    with pytest.raises(ConfigTypeError, match="driver_config"):
        ServerConfig(app_id="a", driver_config={"receiver_window": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unique_directory.*external"):
        ServerConfig(app_id="a", driver="external", enable_ipc=False, driver_config=DriverConfig(unique_directory=True))
    with pytest.raises(ConfigError, match=r"unique_directory.*enable_ipc"):
        ServerConfig(app_id="a", driver_config=DriverConfig(unique_directory=True))
    with pytest.raises(ConfigError, match="threading_mode"):
        ServerConfig(app_id="a", driver_config=DriverConfig(threading_mode="invoker"))
    with pytest.raises(ConfigError, match="reserved_session_id_high"):
        ServerConfig(app_id="a", driver_config=DriverConfig(reserved_session_id_high=2000))
    with pytest.raises(ConfigError, match=r"contradicts driver_config\.directory"):
        ServerConfig(app_id="a", driver_directory=driver_dir, driver_config=DriverConfig(directory=driver_dir / "x"))
    with pytest.raises(ValueError, match="receiver_window"):  # DriverConfig's own checks, at its line
        DriverConfig(receiver_window=10)


def test_an_embedded_driver_runs_the_endpoints_tuning(driver_dir: Path, tmp_path: Path) -> None:
    client_dir = driver_dir.with_name(driver_dir.name + "-client")

    async def main() -> None:
        port = free_ports(50)
        server = Server(server_config(driver_dir, driver="embedded", driver_config=TUNING))
        client = Client(client_config(client_dir, driver="invoker", driver_config=DriverConfig(so_sndbuf=512 * 1024)))
        async with server, client:
            got: list[Quote] = []

            @server.on_message(Quote)
            def on_quote(connection: Connection, quote: Quote) -> None:
                got.append(quote)

            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.send(Quote(1, 2.5, "X"))
            await wait_for(lambda: len(got) == 1)
            # What the running drivers say they run with, read from their directories as another process would.
            raw = observe.settings(driver_dir)
            assert raw["receiver_window"] == "256k" and raw["so_sndbuf"] == "1m" and raw["idle_strategy"] == "sleep"
            running = running_config(driver_dir)
            assert running.so_rcvbuf == 4 * 1024 * 1024 and running.publication_linger_ns == 2000 * MS
            assert running.idle_heartbeat_max_ns == 500 * MS  # the user's value won
            assert running.idle_status_message_max_ns == IDLE_DATAGRAM_MAX_NS  # left at default: the network's
            assert (running.reserved_session_id_low, running.reserved_session_id_high) == (-1, 65535)
            assert running.threading_mode == "dedicated"
            other = running_config(client_dir)
            assert other.so_sndbuf == 512 * 1024 and other.threading_mode == "invoker"
            out = subprocess.run(
                [sys.executable, "-m", "slipstream", "settings", "--dir", str(driver_dir)],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout  # fmt: skip
            assert "receiver_window" in out and '"256k"' in out

    try:
        run(main())
    finally:
        shutil.rmtree(client_dir, ignore_errors=True)


def test_attaching_to_a_driver_started_elsewhere_names_what_differs(driver_dir: Path) -> None:
    standalone = MediaDriver(DriverConfig(directory=driver_dir, dir_delete_on_shutdown=True)).launch_embedded()

    async def main() -> None:
        config = server_config(driver_dir, driver="external", driver_config=TUNING)
        async with Server(config) as server:
            with pytest.warns(DriverSettingsIgnored, match=r"receiver_window=262144 \(runs with 1048576\)") as seen:
                await server.bind(free_ports(50))
        text = str(seen[0].message)
        assert "so_sndbuf" in text and "idle_strategy" in text and "publication_linger_ns" in text
        assert "so_rcvbuf" in text  # 4 MiB asked, 2 MiB runs
        # Asking for what the driver runs with anyway warns about nothing.
        quiet = server_config(driver_dir, driver="auto", driver_config=DriverConfig(receiver_window=1024 * 1024))
        async with Server(quiet) as server:
            await server.bind(free_ports(50))  # (pytest's -W error would fail on a stray warning)

    try:
        run(main())
    finally:
        standalone.close()


def test_unique_directory_gives_each_endpoint_its_own_driver(driver_dir: Path) -> None:
    unique = DriverConfig(unique_directory=True, receiver_window=512 * 1024)

    async def main() -> None:
        port = free_ports(50)
        server = Server(server_config(driver_dir, driver="embedded", driver_config=unique))
        client = Client(client_config(driver_dir, driver="embedded", driver_config=unique))
        async with server, client:  # both "embedded" in one directory: without unique ones, the second would fail
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            await connection.ping(timeout=5)
            mine = sorted(driver_dir.parent.glob(f"{driver_dir.name}-*"))
            assert len(mine) == 2 and not driver_dir.exists()
            for directory in mine:
                assert running_config(directory).receiver_window == 512 * 1024
        assert not list(driver_dir.parent.glob(f"{driver_dir.name}-*"))  # each embedded driver removed its own

    run(main())


class Unheard(msgspec.Struct):
    n: int


def test_error_filter_keeps_chosen_errors_from_on_error_and_counts_them(driver_dir: Path) -> None:
    """The seed's ``aeronErrorFilter``: errors the filter refuses reach neither ``on_error`` nor the log,
    and are still counted in ``errors``; a filter that raises lets the error through."""
    from slipstream.network import ConfigTypeError
    from slipstream.network.errors import MessageDispatchError

    with pytest.raises(ConfigTypeError, match="error_filter must be callable"):
        server_config(driver_dir, error_filter=3)

    async def main() -> None:
        heard: list[BaseException] = []
        messages = [Quote, Unheard]

        def keep(error: BaseException) -> bool:
            if isinstance(error, MessageDispatchError) and "Unheard" in str(error):
                return False
            raise RuntimeError("a broken filter")

        async with (
            Server(server_config(driver_dir, messages=messages, error_filter=keep)) as server,
            Client(client_config(driver_dir, messages=messages)) as client,
        ):
            server.on_error(lambda connection, error: heard.append(error))
            port = free_ports(50)
            await server.bind(port)
            connection = await client.connect("127.0.0.1", port, timeout=10)
            for n in range(5):
                await connection.send(Unheard(n))  # nobody listens: filtered out
            await connection.send(Quote(1, 1.0, "x"))  # nobody listens either: the filter raises, so it is told
            await wait_for(lambda: server.errors == 6)
            await wait_for(lambda: len(heard) == 1)
            assert isinstance(heard[0], MessageDispatchError) and "Quote" in str(heard[0])

    run(main(), 60)
