"""The blocking API (issue 32): ``slipstream.network.sync``'s Server, Client and Connection over real
drivers, shared memory and UDP on loopback; threads that wait for answers run the cycles themselves, and
what the blocking API cannot do (a listener waiting, a coroutine) is said, not hung on."""

from __future__ import annotations

import multiprocessing
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slipstream.network import ConnectionClosedError, RmiCallTimeout, ServerConfig, UndeliveredError
from slipstream.network.errors import BlockingListenerError, InboxFull, MessageDispatchError, ReceiveTimeout
from slipstream.network.pacing import Wake
from slipstream.network.sync import INBOX_LIMIT, Client, Connection, Server
from slipstream.network.sync import poller as poller_module

from .test_network_aio import client_config, free_ports, server_config, traced_cycles
from .test_network_rmi import Calc, CalcError, Counter, Factory, ICalc, ICounter, IFactory, Point


class Quote(msgspec.Struct):
    id: int
    price: float
    symbol: str


class Other(msgspec.Struct):
    text: str


MESSAGES = [Quote, Other]


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def echoed(connection: Connection, count: int, symbol: str) -> None:
    """``count`` round trips: a Quote sent, and the server's echo of it received, one at a time."""
    for i in range(count):
        quote = Quote(i, 1.0, symbol)
        connection.send(quote)
        assert connection.receive(timeout=5) == quote


def bind_and_connect(server: Server, client: Client, ipc: bool) -> Connection:
    """Bind ``server`` (over IPC, or UDP on a free port) and connect ``client`` to it."""
    if ipc:
        server.bind_ipc()
        return client.connect_ipc(timeout=10)
    port = free_ports(2)
    server.bind(port)
    return client.connect("127.0.0.1", port, timeout=10)


@contextmanager
def pair(
    driver_dir: Path, transport: str = "ipc", *, busy: bool = False, **kwargs: Any
) -> Iterator[tuple[Server, Client, Connection]]:
    """A blocking server and client in this process, connected over ``transport`` (the server echoes Quotes)."""
    ipc = transport == "ipc"
    server = Server(server_config(driver_dir, messages=MESSAGES, enable_ipc=ipc, **kwargs), busy_poll=busy)
    client_dir = driver_dir if ipc else Path(f"{driver_dir}-client")
    client = Client(client_config(client_dir, messages=MESSAGES, enable_ipc=ipc, **kwargs), busy_poll=busy)
    try:

        @server.on_message(Quote)
        def echo(connection: Connection, quote: Quote) -> None:
            connection.send_nowait(quote)

        connection = bind_and_connect(server, client, ipc)
        wait_until(lambda: server.connections)  # (the server sees it up a moment after the client)
        yield server, client, connection
    finally:
        client.close()
        server.close()
        if client_dir != driver_dir:
            shutil.rmtree(client_dir, ignore_errors=True)


@pytest.mark.parametrize("transport", ["ipc", "udp"])
def test_send_receive_ping_and_send_sync_in_blocking_code(driver_dir: Path, transport: str) -> None:
    with pair(driver_dir, transport) as (server, _client, connection):
        connection.send(Quote(1, 2.5, "ACME"))
        assert connection.receive(timeout=5) == Quote(1, 2.5, "ACME")
        for i in range(200):  # many round trips, in order, nothing lost
            assert connection.send_nowait(Quote(i, 0.5, "X")) or connection.send(Quote(i, 0.5, "X")) is None
        assert [connection.receive(timeout=5) for _ in range(200)] == [Quote(i, 0.5, "X") for i in range(200)]
        connection.send_sync(Quote(7, 1.0, "S"), timeout=5)  # returns once the server's listener ran
        assert connection.receive(timeout=5) == Quote(7, 1.0, "S")
        ping = connection.ping(timeout=5)
        assert 0 < ping.round_trip < 1
        assert len(server.connections) == 1


def test_a_message_no_listener_takes_waits_for_receive_and_receive_times_out(driver_dir: Path) -> None:
    with pair(driver_dir) as (server, _client, connection):
        (peer,) = server.connections
        peer.send(Other("for receive"))
        assert connection.receive(timeout=5) == Other("for receive")
        started = time.monotonic()
        with pytest.raises(ReceiveTimeout):
            connection.receive(timeout=0.2)
        assert 0.15 <= time.monotonic() - started < 2


def test_a_full_inbox_stops_reading_and_nothing_is_lost(driver_dir: Path) -> None:
    """A reader that leaves its inbox full for longer than the connection's expiry keeps its connection
    (its peer is not silent, only unread) and then receives every message, in order. What it holds is
    bounded: INBOX_LIMIT messages, plus those of the records one poll took in."""
    count = 6000
    text = "x" * 1000
    with pair(driver_dir, connection_expiry=1.0) as (server, client, connection):
        (peer,) = server.connections

        def send() -> None:
            for i in range(count):
                peer.send(Other(f"{i} {text}"))

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(2.5)  # the client's poll thread reads until its inbox is full, then leaves the rest unread
        held = connection.stats["messages_received"]
        assert INBOX_LIMIT <= held < count // 2, held
        with pytest.raises(InboxFull):  # the pong could not be read: said at once, not after the timeout
            connection.ping(timeout=5)
        got = [connection.receive(timeout=10) for _ in range(count)]
        sender.join(10)
        assert got == [Other(f"{i} {text}") for i in range(count)]
        assert client.connection is connection and not connection.is_closed


def test_listeners_connect_and_disconnect_run_once_each(driver_dir: Path) -> None:
    seen: list[str] = []
    server = Server(server_config(driver_dir, messages=MESSAGES, enable_ipc=True))
    client = Client(client_config(driver_dir, messages=MESSAGES, enable_ipc=True))
    server.on_connect(lambda connection: seen.append("server connect"))
    server.on_disconnect(lambda connection: seen.append("server disconnect"))
    client.on_disconnect(lambda connection: seen.append("client disconnect"))
    try:
        server.bind_ipc()
        connection = client.connect_ipc(timeout=10)
        wait_until(lambda: "server connect" in seen)
        connection.close()
        assert connection.is_closed
        wait_until(lambda: "server disconnect" in seen)
        assert sorted(seen) == ["client disconnect", "server connect", "server disconnect"]
        with pytest.raises(ConnectionClosedError):
            connection.receive(timeout=1)
    finally:
        client.close()
        server.close()


class Interrupted(BaseException):
    """A KeyboardInterrupt's stand-in: raised inside a close's wait (a real one would end the test run)."""


def test_a_close_interrupted_in_its_wait_still_tells_the_peer_and_releases_the_driver(driver_dir: Path) -> None:
    """A server's close first waits for starting connections that are half up; a client's, for its
    connection's closing. An exception thrown into either wait (Ctrl-C) used to skip the rest of the close:
    the clients found out by their expiry, and the driver outlived the endpoint. Now the peers hear CLOSE and
    everything is released before the exception goes on; a second close is a no-op."""
    with pair(driver_dir, "udp", close_timeout=5.0) as (server, client, connection):
        ended: list[tuple[bool, bool, str]] = []
        hears = client.connection_ended

        def connection_ended(conn: Any, event: Any) -> None:
            ended.append((event.by_peer, event.expired, event.reason))
            hears(conn, event)

        def interrupted(*_: object) -> bool:
            raise Interrupted

        client.connection_ended = connection_ended  # type: ignore[method-assign]
        server._half_up = interrupted  # type: ignore[method-assign]
        with pytest.raises(Interrupted):
            server.close()
        assert connection.wait_closed(timeout=10)
        assert ended == [(True, False, "server closing")]
        assert server.context is None and not server.connections
        server.close()  # (done already)
        client._wait_closings = interrupted  # type: ignore[method-assign]
        with pytest.raises(Interrupted):
            client.close()
        assert client.context is None
        client.close()  # (done already)


def test_a_listener_that_waits_for_an_answer_is_told_so_and_an_async_listener_is_refused(driver_dir: Path) -> None:
    errors: list[BaseException] = []
    with pair(driver_dir) as (server, client, connection):
        server.on_error(lambda connection, error: errors.append(error))

        @server.on_message(Other)
        def waits(peer: Connection, message: Other) -> None:
            peer.ping(timeout=1)  # would wait inside the cycle that takes the pong in

        connection.send(Other("x"))
        wait_until(lambda: errors)
        assert isinstance(errors[0], BlockingListenerError)

        @connection.on_message(Quote)  # the client's own listener for the echo: a coroutine
        async def coroutine(peer: Connection, message: Quote) -> None:
            pass

        client_errors: list[BaseException] = []
        client.on_error(lambda connection, error: client_errors.append(error))
        connection.send(Quote(1, 1.0, "echoed"))
        wait_until(lambda: client_errors)
        assert isinstance(client_errors[0], TypeError) and "plain function" in str(client_errors[0])
        assert connection.ping(timeout=5).round_trip > 0  # the connection goes on


def test_a_message_for_a_file_nobody_listens_to_is_reported_not_kept(driver_dir: Path, tmp_path: Path) -> None:
    errors: list[BaseException] = []
    with pair(driver_dir) as (server, _client, connection):
        server.on_error(lambda connection, error: errors.append(error))
        source = tmp_path / "f.bin"
        source.write_bytes(b"x" * 1000)
        connection.send_sync(source, timeout=10)
        wait_until(lambda: errors)
        assert isinstance(errors[0], MessageDispatchError)


def test_connection_class_must_be_the_blocking_connection(driver_dir: Path) -> None:
    from slipstream.network import Connection as AsyncConnection

    class Mine(AsyncConnection):
        pass

    with pytest.raises(TypeError, match=r"sync\.Connection"):
        Server(server_config(driver_dir, messages=MESSAGES, connection_class=Mine))


@pytest.mark.parametrize("busy", [False, True])
def test_threads_share_one_connection(driver_dir: Path, busy: bool) -> None:
    """Four threads each send and wait (send_sync, ping) on one connection at once; every wait ends."""
    with pair(driver_dir, busy=busy) as (_server, _client, connection):
        failures: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(100):
                    connection.send_sync(Other(f"{n}-{i}"), timeout=10) if i % 2 else connection.ping(timeout=10)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert failures == [] and not any(thread.is_alive() for thread in threads)


# -- remote objects --------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["ipc", "udp"])
def test_blocking_proxies_call_remote_objects(driver_dir: Path, transport: str) -> None:
    interfaces = [(ICalc, Calc), (ICounter, Counter), (IFactory, Factory)]
    ipc = transport == "ipc"
    server = Server(
        server_config(driver_dir, messages=[Point], interfaces=interfaces, exceptions=[CalcError], enable_ipc=ipc)
    )
    client_dir = driver_dir if ipc else Path(f"{driver_dir}-client")
    client = Client(
        client_config(
            client_dir, messages=[Point], interfaces=[ICalc, ICounter, IFactory], exceptions=[CalcError], enable_ipc=ipc
        )
    )
    try:
        calc_id = server.rmi.save(Calc())
        connection = bind_and_connect(server, client, ipc)
        calc = connection.rmi.get_global(ICalc, calc_id)
        assert calc.add(2, 3) == 5
        assert [calc.add(i, i) for i in range(300)] == [2 * i for i in range(300)]
        with pytest.raises(CalcError, match="boom"):
            calc.fail("boom")
        with pytest.raises(TypeError, match="async"):
            calc.slow(1)  # an async def method cannot run on a blocking host
        counter = connection.rmi.create(ICounter, 5, timeout=5)
        assert counter.increment(2) == 7
        factory = connection.rmi.create(IFactory, timeout=5)
        made = factory.make_counter(10)
        assert made.increment(1) == 11
        calc.rmi_async().bump()  # fire and forget: returns None at once
        assert calc.add(1, 1) == 2  # (after the bump: calls run in order)
    finally:
        client.close()
        server.close()
        shutil.rmtree(client_dir, ignore_errors=True)


class Slow(Calc):
    def add(self, a: int, b: int) -> int:
        time.sleep(1.0)
        return a + b


def _slow_host(pipe: Pipe, directory: str) -> None:
    config = server_config(Path(directory), messages=[Point], interfaces=[(ICalc, Slow)], enable_ipc=True)
    with Server(config) as server:
        pipe.send(server.rmi.save(Slow()))
        server.bind_ipc()
        pipe.send("ready")
        pipe.poll(60)


def test_a_remote_call_times_out_by_the_connection_s_timer(driver_dir: Path) -> None:
    """The host (another process) takes 1 s; the proxy's 0.3 s timeout ends the call with RmiCallTimeout."""
    with child(_slow_host, driver_dir) as pipe:
        calc_id = pipe.recv()
        assert pipe.recv() == "ready"
        config = client_config(driver_dir, messages=[Point], interfaces=[ICalc], enable_ipc=True, driver="external")
        with Client(config) as client:
            calc = client.connect_ipc(timeout=10).rmi.get_global(ICalc, calc_id)
            calc.rmi_timeout = 0.3
            started = time.monotonic()
            with pytest.raises(RmiCallTimeout):
                calc.add(1, 2)
            assert 0.25 <= time.monotonic() - started < 0.9


# -- across processes --------------------------------------------------------------------------------


def _echo_server(pipe: Pipe, directory: str, busy: bool) -> None:
    with Server(
        server_config(Path(directory), messages=MESSAGES, enable_ipc=True, driver="invoker"), busy_poll=busy
    ) as server:

        @server.on_message(Quote)
        def echo(connection: Connection, quote: Quote) -> None:
            connection.send_nowait(quote)

        server.bind_ipc()
        pipe.send("ready")
        pipe.poll(60)


@contextmanager
def child(target: Any, driver_dir: Path, *args: Any) -> Iterator[Pipe]:
    """``target(pipe, directory, *args)`` in a spawned process; told to stop (and joined) at the end."""
    context = multiprocessing.get_context("spawn")
    parent, end = context.Pipe()
    process = context.Process(target=target, args=(end, str(driver_dir), *args), daemon=True)
    process.start()
    try:
        assert parent.poll(30), "the child did not start"
        yield parent
    finally:
        parent.send("stop")
        process.join(30)
        if process.is_alive():
            process.kill()
    assert process.exitcode == 0


@contextmanager
def warm_busy_client(driver_dir: Path) -> Iterator[tuple[Client, Connection]]:
    """A busy_poll client in this process, connected over IPC to a busy echo server in a child process, warmed up
    by 50 round trips."""
    with child(_echo_server, driver_dir, True) as pipe:
        assert pipe.recv() == "ready"
        config = client_config(driver_dir, messages=MESSAGES, enable_ipc=True, driver="external")
        with Client(config, busy_poll=True) as client:
            connection = client.connect_ipc(timeout=10)
            echoed(connection, 50, "WARM")
            yield client, connection


@pytest.mark.parametrize("busy", [False, True])
def test_a_blocking_client_and_server_in_two_processes(driver_dir: Path, busy: bool) -> None:
    with child(_echo_server, driver_dir, busy) as pipe:
        assert pipe.recv() == "ready"
        config = client_config(driver_dir, messages=MESSAGES, enable_ipc=True, driver="external")
        with Client(config, busy_poll=busy) as client:
            echoed(client.connect_ipc(timeout=10), 2000, "RT")


def test_a_caller_takes_a_udp_answer_in_with_the_driver_s_cycle_not_behind_the_endpoint_s_chores(
    driver_dir: Path,
) -> None:
    """A caller waiting for an answer over UDP watches its invoker-mode driver's socket. When a datagram
    comes, the driver's cycle takes it in and the connections' part of the duty cycle follows at once:
    the endpoint's chores (a whole duty cycle, several microseconds) do not run in front of it."""
    port = free_ports(2)
    client_dir = Path(f"{driver_dir}-client")
    rounds = 300
    try:
        with child(_udp_echo_server, driver_dir, port, ":memory:") as pipe:
            assert pipe.recv() == "ready"
            with Client(client_config(client_dir, messages=MESSAGES, driver="invoker"), busy_poll=True) as client:
                connection = client.connect("127.0.0.1", port, timeout=10)
                echoed(connection, 50, "WARM")
                with traced_cycles(client) as trace:
                    echoed(connection, rounds, "RT")
    finally:
        shutil.rmtree(client_dir, ignore_errors=True)
    taken = "".join(trace.order)
    answers = taken.count("DC")  # a datagram taken in by the driver, then by a connection
    behind_chores = taken.count("WDC")  # ... with the endpoint's whole cycle in front of it
    assert answers >= rounds // 2, taken[:300]
    assert behind_chores <= answers // 4, (answers, behind_chores)


def test_a_caller_keeps_its_watch_across_round_trips_and_a_kick_drops_it(
    driver_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that waited for one answer leaves its watch to the next: the next round trip's answer is taken
    in by the connections' part of the duty cycle alone, with no whole cycle (and no new watch) in front of
    it. A kick (new work, a new timer from another thread) drops the watch: a whole cycle comes first."""
    monkeypatch.setattr(poller_module, "_WATCH_NS", 200_000_000)  # (whole cycles only when the watch is dropped)
    rounds = 300
    with warm_busy_client(driver_dir) as (client, connection):
        with traced_cycles(client) as trace:
            echoed(connection, rounds, "RT")
        answers = trace.order.count("C")
        assert answers >= rounds * 3 // 4, "".join(trace.order)[:300]
        assert trace.counts["whole"] <= rounds // 10, "".join(trace.order)[:300]
        with traced_cycles(client) as trace:
            client.poller.kick()
            echoed(connection, 1, "KICKED")
        assert trace.order[0] == "W", trace.order


def test_a_busy_poll_thread_wakes_rarely_while_a_caller_drives_and_takes_over_when_it_stops(
    driver_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a busy_poll caller drives the cycles (round trip after round trip), the poll thread stays aside and
    wakes at most once per half DRIVEN_GRACE_NS to see whether the caller stopped (each wake takes the GIL from
    the spinning caller). Once the caller stops, the poll thread takes the cycles back: an answer that comes
    then reaches its listener with no caller driving."""
    grace_s = poller_module.DRIVEN_GRACE_NS / 1e9
    with warm_busy_client(driver_dir) as (client, connection):
        resumed = client.poller._resumed
        waits: list[float] = []
        real_wait = resumed.wait

        def counted_wait(timeout: float | None = None) -> bool:
            waits.append(-1.0 if timeout is None else timeout)
            return real_wait(timeout)

        monkeypatch.setattr(resumed, "wait", counted_wait)
        started = time.monotonic()
        while time.monotonic() - started < 0.6:
            echoed(connection, 10, "RT")
        elapsed = time.monotonic() - started
        assert waits, "the poll thread ran the cycles beside the caller instead of stepping aside"
        assert len(waits) <= elapsed / (grace_s / 2) + 3, (len(waits), elapsed, waits[:20])  # (half-grace slices)

        arrived = threading.Event()

        @connection.on_message(Quote)
        def taken(_connection: Connection, _quote: Quote) -> None:
            arrived.set()

        connection.send_nowait(Quote(1, 1.0, "AFTER"))  # (no caller waits: only the poll thread cycles)
        assert arrived.wait(5), "the poll thread did not take the cycles back"


def test_the_connections_part_of_a_cycle_leaves_their_timers_to_the_whole_cycle(driver_dir: Path) -> None:
    """What a spinning poller runs between whole cycles (and a caller whose watch saw a frame) takes frames
    in and sends; the connections' timers (here the peer's expiry) wait for the endpoint's next whole cycle."""
    with pair(driver_dir) as (_server, client, connection), client.poller.lock:
        later_ns = time.monotonic_ns() + 3_600 * 10**9  # past every timer of the connection
        connection.poll(later_ns, timers=False)
        client.poll_connections(later_ns)
        assert not connection.is_closed
        client.duty_cycle(later_ns)
        assert connection.is_closed  # expired: the peer was silent for an hour


def _forked_child(directory: str, done: Any) -> None:
    """In a child forked after the parent's poll thread started: a blocking endpoint still gets polled."""
    try:
        with pair(Path(directory + "-forked")) as (_server, _client, connection):
            connection.send(Quote(1, 1.0, "FORK"))
            done.put(connection.receive(timeout=5) == Quote(1, 1.0, "FORK"))
    except BaseException as exc:
        done.put(repr(exc))
    finally:
        shutil.rmtree(directory + "-forked", ignore_errors=True)


def test_a_forked_child_polls_its_own_endpoints(driver_dir: Path) -> None:
    with pair(driver_dir) as (_server, _client, connection):  # the parent's poll thread is running
        connection.send(Quote(0, 1.0, "PARENT"))
        assert connection.receive(timeout=5) == Quote(0, 1.0, "PARENT")
        context = multiprocessing.get_context("fork")
        done = context.Queue()
        process = context.Process(target=_forked_child, args=(str(driver_dir), done))
        process.start()
        try:
            assert done.get(timeout=30) is True
        finally:
            process.join(30)
            if process.is_alive():
                process.kill()


def _udp_echo_server(pipe: Pipe, directory: str, port: int, store: str) -> None:
    config = ServerConfig(
        app_id="test", messages=MESSAGES, settings_store=store, driver_directory=directory, connection_expiry=1.0
    )
    with Server(config) as server:

        @server.on_message(Quote)
        def echo(connection: Connection, quote: Quote) -> None:
            connection.send_nowait(quote)

        server.bind(port)
        pipe.send("ready")
        pipe.poll(60)


def test_a_blocking_client_reconnects_to_a_server_that_was_killed_and_restarted(
    driver_dir: Path, tmp_path: Path
) -> None:
    """The server process is SIGKILLed and started again (same identity, same port): the client's reconnect
    thread connects again, and the connection the application holds sends and receives on the new one."""
    port = free_ports(2)
    store = str(tmp_path / "server.db")
    context = multiprocessing.get_context("spawn")
    config = client_config(
        Path(f"{driver_dir}-client"), messages=MESSAGES, connection_expiry=1.0, reconnect_max_delay=0.5
    )
    reconnected: list[Connection] = []
    try:
        with Client(config) as client:
            for run in range(2):
                parent, end = context.Pipe()
                process = context.Process(
                    target=_udp_echo_server, args=(end, f"{driver_dir}-{run}", port, store), daemon=True
                )
                process.start()
                assert parent.poll(30) and parent.recv() == "ready"
                if run == 0:
                    connection = client.connect("127.0.0.1", port, timeout=10)
                    client.on_connect(reconnected.append)
                else:
                    wait_until(lambda: reconnected, timeout=20)
                connection.send(Quote(run, 1.0, "AGAIN"))  # the first connection's successor carries it
                assert connection.receive(timeout=10) == Quote(run, 1.0, "AGAIN")
                if run == 0:
                    process.kill()
                    process.join(10)
                else:
                    assert client.connection is reconnected[0] and client.connection is not connection
                    parent.send("stop")
                    process.join(30)
    finally:
        for path in (f"{driver_dir}-client", f"{driver_dir}-0", f"{driver_dir}-1"):
            shutil.rmtree(path, ignore_errors=True)


def test_a_signal_set_by_one_thread_wakes_a_thread_blocked_on_it_every_time() -> None:
    """``Signal`` makes its event only for a waiter: a set racing with a first wait must never be missed."""
    from slipstream.network.sync.poller import Signal

    missed = 0
    for round_ in range(500):
        signal = Signal()
        woke: list[float] = []
        waiter = threading.Thread(target=lambda s=signal, w=woke: w.append(time.monotonic() if s.wait(5.0) else -1.0))
        set_at = time.monotonic()
        if round_ % 3 == 0:
            signal.set()  # before anyone waits: the event made later must not miss it
        waiter.start()
        if round_ % 3 == 1:
            time.sleep(0.0001)  # the waiter is likely blocked already
        if round_ % 3:
            signal.set()
        waiter.join(10)
        assert woke and woke[0] >= 0, "the wait timed out: a set was missed"
        missed += woke[0] - set_at > 1.0
        assert signal.is_set()
        signal.clear()
        assert not signal.is_set() and not signal.wait(0.001)
    assert missed == 0


def test_with_busy_poll_a_waiting_caller_lets_other_threads_send_time_out_and_close(driver_dir: Path) -> None:
    """A busy_poll caller spins with the poller's lock held until its answer comes (which may be never): another
    thread that sends, waits for an answer of its own (with a timeout) or closes gets the lock from it within a
    few turns, not after the first caller's whole wait."""
    with pair(driver_dir, busy=True) as (server, client, connection):
        (peer,) = server.connections
        got: list[object] = []

        def waiter(timeout: float | None) -> None:
            try:
                got.append(connection.receive(timeout=timeout))
            except (ReceiveTimeout, ConnectionClosedError) as exc:
                got.append(exc)

        first = threading.Thread(target=waiter, args=(20.0,), daemon=True)
        first.start()
        time.sleep(0.2)  # (the waiter spins now, the lock held)
        started = time.monotonic()
        with pytest.raises(ReceiveTimeout):
            peer.receive(timeout=0.2)  # another thread's wait keeps its own deadline
        assert time.monotonic() - started < 5
        started = time.monotonic()
        peer.send(Other("for the waiter"))  # another thread's send goes at once, and ends the first wait
        assert time.monotonic() - started < 5
        first.join(10)
        assert got == [Other("for the waiter")]

        second = threading.Thread(target=waiter, args=(None,), daemon=True)  # waits forever for nothing
        second.start()
        time.sleep(0.2)
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < 10
        second.join(10)
        assert len(got) == 2 and isinstance(got[1], ConnectionClosedError)


def test_with_busy_poll_a_thread_that_only_sends_does_not_hold_the_listeners_off(driver_dir: Path) -> None:
    """A busy poll thread steps aside for a moment after each send (the sender's next wait takes the answer in
    without fighting it for the GIL); a thread that sends more often than that and never waits must not keep
    every listener waiting for as long as it goes on: they run while it sends."""
    with pair(driver_dir, busy=True) as (server, _client, connection):
        arrived: list[int] = []

        @server.on_message(Other)
        def taken(_peer: Connection, message: Other) -> None:
            arrived.append(int(message.text))

        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < 1.0 and sent < 2000:
            connection.send(Other(str(sent)))
            sent += 1
            time.sleep(0.0005)
        during = len(arrived)
        wait_until(lambda: len(arrived) == sent)
        assert arrived == list(range(sent))
        assert during >= sent // 2, f"only {during} of {sent} reached the listener while the sender went on"


def test_a_kick_that_comes_before_the_pause_begins_ends_it() -> None:
    """The poll thread decides on a pause, then parks: a kick between the two (new work, a burst's tail, a
    caller's new timer) ends the pause at once instead of being lost until the pause's end."""
    backoff = poller_module.ThreadBackoff()
    started = time.monotonic()
    backoff.kick()  # (nobody parked yet)
    assert backoff.park((), 5.0) is Wake.KICK
    backoff.kick(long_only=True)  # only for a long pause: a short one ends soon anyway
    assert backoff.park((), backoff.max_sleep_s / 2) is Wake.TIMEOUT
    backoff.kick(long_only=True)
    assert backoff.park((), 5.0) is Wake.KICK
    assert time.monotonic() - started < 2.5
    started = time.monotonic()
    assert backoff.park((), 0.05) is Wake.TIMEOUT  # nothing left over: a pause lasts
    assert time.monotonic() - started >= 0.04


def test_close_from_a_listener_closes_without_error(driver_dir: Path) -> None:
    """``close`` waits for the cycles (the peers hear CLOSE, streams are released), which a listener runs inside:
    from a listener a connection's close returns at once and an endpoint's goes on in a thread of its own."""
    with pair(driver_dir) as (server, client, connection):
        errors: list[BaseException] = []
        server.on_error(lambda _connection, error: errors.append(error))
        client.on_error(lambda _connection, error: errors.append(error))

        @server.on_message(Other)
        def close_it(peer: Connection, message: Other) -> None:
            if message.text == "connection":
                peer.close()
            else:
                server.close()

        connection.send(Other("connection"))
        assert connection.wait_closed(timeout=10)
        second = client.connect_ipc(timeout=10)
        second.send(Other("server"))
        assert server.serve_forever(timeout=10), "the server did not close"
        assert second.wait_closed(timeout=10)
        assert server.context is None and not server.connections and not server._closings
        assert errors == []


def test_a_listener_that_closes_during_a_close_does_not_close_twice(driver_dir: Path) -> None:
    """A close runs the listeners (the connections' on_disconnect); one that calls close then has nothing to do:
    the endpoint is closed once, by the first caller, and that caller returns when it is done."""
    with pair(driver_dir) as (server, _client, _connection):
        finished: list[str] = []
        errors: list[BaseException] = []
        server.on_error(lambda _connection, error: errors.append(error))
        real_close_last = server._close_last

        def counted_close_last() -> None:
            finished.append(threading.current_thread().name)
            real_close_last()

        server._close_last = counted_close_last  # type: ignore[method-assign]

        @server.on_disconnect
        def again(_peer: Connection) -> None:
            server.close()

        server.close()
        assert finished == [threading.current_thread().name]
        assert server.context is None and errors == []
        server.close()  # (done already)
        assert len(finished) == 1


@pytest.mark.parametrize("closer", ["server", "client"])
def test_messages_that_cross_the_peer_s_close_are_reported_undelivered_never_lost(
    driver_dir: Path, closer: str
) -> None:
    """One side closes the connection while the other's messages are on their way: what reached the closing
    side's listeners before its CLOSE was acknowledged in it; the rest was dropped there, and the sender's
    on_error gets it back (UndeliveredError), each message in exactly one of the two, once."""
    with pair(driver_dir) as (server, client, connection):
        (peer,) = server.connections
        closing, sending = (server, client) if closer == "server" else (client, server)
        sender = connection if closer == "server" else peer
        delivered: list[int] = []
        undelivered: list[int] = []

        @closing.on_message(Other)
        def take(receiver: Connection, message: Other) -> None:
            delivered.append(int(message.text))
            if len(delivered) == 1:
                receiver.close()

        @sending.on_error
        def reported(_connection: Connection | None, error: BaseException) -> None:
            if isinstance(error, UndeliveredError):
                undelivered.extend(int(m.text) for m in error.messages)  # type: ignore[attr-defined]

        accepted = 0
        for i in range(400):
            if not sender.send_nowait(Other(str(i))):
                break  # closed (or back-pressured): refused, so not ours to account for
            accepted += 1
        assert sender.wait_closed(timeout=10)
        wait_until(lambda: len(delivered) + len(undelivered) >= accepted)
        assert sorted(delivered + undelivered) == list(range(accepted)), (delivered, undelivered)


@pytest.mark.parametrize("transport", ["ipc", "udp"])
def test_a_parked_poll_thread_takes_messages_in_while_the_sending_thread_computes(
    driver_dir: Path, transport: str
) -> None:
    """The sender's thread runs Python between sends (it never waits), the poll thread parks (on the doorbell, or
    the invoker-mode driver's sockets) between messages. Each wake-up needs the GIL back from the computing thread:
    ringing and draining a doorbell, and sending and receiving a message's datagrams, hold the GIL (were they to
    let it go for their system calls, the computing thread's every send would reset the woken thread's claim to
    the GIL, and a message waited up to seconds over IPC, a quarter of one over UDP, while the sender went on)."""
    with pair(driver_dir, transport, driver="invoker") as (server, _client, connection):
        sent: dict[int, float] = {}
        late: list[float] = []

        @server.on_message(Other)
        def taken(_peer: Connection, message: Other) -> None:
            late.append(time.monotonic() - sent[int(message.text)])

        started = time.monotonic()
        count = 0
        while time.monotonic() - started < 1.5 and count < 2000:
            sent[count] = time.monotonic()
            connection.send(Other(str(count)))
            count += 1
            computing = time.monotonic()
            while time.monotonic() - computing < 0.0008:  # the application's own work, in Python
                pass
        wait_until(lambda: len(late) == count)
        late.sort()
        assert late[-1] < 0.3, f"a message waited {late[-1]:.3f} s for the poll thread"
        p99 = late[len(late) * 99 // 100]
        assert p99 < 0.06, f"1 % of the messages waited over {p99:.3f} s"
