"""Issue 29, item 5: what a peer's flood of bad messages costs the log is a handful of lines, and the
endpoint still counts every one (``errors``, the ``net errors`` counter ``slipstream stat`` shows)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from slipstream.files import observe
from slipstream.files.counters import NETWORK_ERRORS_TYPE_ID
from slipstream.network import Client, ClientConfig

from .hostile_peer import Bounded, Chat, HostileTarget, ICalc, Unheard, bounded_count, common, legitimate_exchange
from .test_observe import free_port

FLOOD = 1000
"""Messages of each bad kind the attacker sends."""


def net_errors(driver_dir: Path) -> dict[str, int]:
    return {c.label: c.value for c in observe.counters(driver_dir) if c.type_id == NETWORK_ERRORS_TYPE_ID}


def test_a_flood_of_undispatched_and_undecodable_messages_logs_a_handful_of_lines_and_counts_all(
    tmp_path: Path,
) -> None:
    """With no ``on_error`` listener, 1,000 messages nobody listens for and 1,000 that fail to decode
    (the attacker's own registrations are the server's: only the values are bad) log each kind once,
    then once as a count when the connection ends; ``errors`` and the counter have all 2,000."""

    async def attack(port: int) -> None:
        with tempfile.TemporaryDirectory(prefix="slipstream-attacker-") as scratch:
            config = ClientConfig(**common(), interfaces=[ICalc], settings_store=":memory:", driver_directory=scratch)
            async with Client(config) as client:
                connection = await client.connect("127.0.0.1", port, timeout=20)
                for n in bounded_count(FLOOD, 60):
                    await connection.send(Unheard(n))
                    await connection.send(Bounded(-1 - n))  # encodes; the server's decoder refuses it
                await connection.send_sync(Chat("done"), timeout=20)  # everything before it was handled
                await connection.close()

    with HostileTarget(tmp_path, free_port(), None, "--log-errors") as target:
        before = target.measure()
        asyncio.run(attack(target.port))
        assert asyncio.run(legitimate_exchange(target.port)) < 20  # the server still serves
        deadline = time.monotonic() + 20  # the ended connection's counts are logged as it goes
        while time.monotonic() < deadline and target.log.read_text().count("ErrorsSuppressed") < 2:
            time.sleep(0.1)
        after = target.measure()
        (label,) = [label for label in net_errors(target.driver_dir) if label.startswith("net errors: server")]
        counted = net_errors(target.driver_dir)[label]
    log = target.log.read_text()
    told = [line for line in log.splitlines() if "(no on_error listener)" in line]
    assert after["errors_met"] - before["errors_met"] == 2 * FLOOD == counted, (after, counted)
    assert after["errors_suppressed"] == 2 * (FLOOD - 1), after
    assert len(told) == 4, told  # each kind once, then each kind's count once
    assert sum("MessageDispatchError" in line for line in told) == 1
    assert sum("MessageDecodeError" in line for line in told) == 1
    assert sum(f"{FLOOD - 1} more" in line for line in told) == 2, told
    assert len(log) < 64 * 1024, len(log)  # tracebacks included
