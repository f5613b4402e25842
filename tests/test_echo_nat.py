"""The guide's NAT experiment, for real: client behind a masquerading router, server on the far side.

Three network namespaces (``NatTopology``): the router forwards the client's traffic, rewrites its
source address, and drops whatever arrives from the public side without a matching mapping. Each
program runs as the user types it, ``python -m slipstream echo ...``, in its namespace with its own
driver directory. Take 1 fails exactly as the guide explains; take 2 gets through.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slipstream.testing import Namespace, NatTopology, NetnsUnavailableError, remove_stale_namespaces, require_netns

from .test_echo import EchoProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def _remove_namespaces_left_by_killed_runs() -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError, NetnsUnavailableError):
        remove_stale_namespaces()


@pytest.fixture
def nat() -> Iterator[NatTopology]:
    require_netns()  # fails (never skips) with the reason when namespaces cannot be made
    with NatTopology() as topology:
        yield topology


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[..., EchoProcess]]:
    """Echo processes inside the topology's namespaces, stopped before the namespaces go."""
    made: list[EchoProcess] = []

    def start(name: str, *args: str, namespace: Namespace) -> EchoProcess:
        process = EchoProcess(tmp_path, name, *args, namespace=namespace)
        made.append(process)
        return process

    yield start
    for process in made:
        process.terminate()
    for process in made:
        process.stop()


def test_take1_echoes_never_get_back_through_the_nat(
    nat: NatTopology, processes: Callable[..., EchoProcess]
) -> None:
    server_address, client_address = str(nat.server_address), str(nat.client_address)
    server = processes(
        "server", "server", "--take", "1", "--local-address", server_address, "--local-port", "9000",
        namespace=nat.server,
    )
    server.wait_for_output(r"echo server \(take 1\)")
    client = processes(
        "client", "client", "--take", "1", "--local-address", client_address, "--local-port", "8000",
        "--remote-address", server_address, "--remote-port", "9000", "--count", "3", "--interval", "0.2",
        "--timeout", "3", namespace=nat.client,
    )
    assert client.wait() == 1, client.output
    assert "no echo for 3 of 3 messages" in client.output
    assert "response:" not in client.output
    # The server heard the client (through the router's public address) and tried to answer...
    assert re.search(rf"onClientConnected: {re.escape(str(nat.router_public_address))}:\d+", server.output)
    assert "HELLO 8000" in server.output
    assert len(re.findall(r"receive \[0x[0-9a-f]+\]: \d+$", server.output, re.M)) == 3
    # ...to the announced port on the router, which had no mapping for it and dropped it.
    assert nat.unsolicited_dropped() > 0


def test_take2_client_connects_and_echoes_through_the_nat(
    nat: NatTopology, processes: Callable[..., EchoProcess]
) -> None:
    server_address = str(nat.server_address)
    server = processes(
        "server", "server", "--take", "2", "--local-address", server_address, "--local-initial-data-port", "9000",
        "--local-initial-control-port", "9001", "--local-clients-base-port", "9010", "--client-count", "4",
        namespace=nat.server,
    )
    server.wait_for_output(r"echo server \(take 2\)")
    client = processes(
        "client", "client", "--take", "2", "--remote-address", server_address, "--remote-data-port", "9000",
        "--remote-control-port", "9001", "--count", "3", "--interval", "0.2", "--timeout", "10",
        namespace=nat.client,
    )
    assert client.wait() == 0, client.output + "\n--- server ---\n" + server.output
    sent = re.findall(r"send: ECHO ([0-9a-f]+)$", client.output, re.M)
    assert len(sent) == 3
    assert re.findall(r"\] ECHO ([0-9a-f]+)$", client.output, re.M) == sent
    router = re.escape(str(nat.router_public_address))
    assert re.search(rf"initial client connected \({router}:\d+\)", server.output)  # seen as the router
    assert re.search(rf"session \d+ for {router}$", server.output, re.M)
    assert "client with correct IP connected" in server.output
