"""Observability from outside the driver: stat, backlog, errors, loss (CLI and Python API), and
driver configuration files. The CLI runs in a subprocess against a real driver, as a user would."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slipstream import Context, DriverConfig, ExclusivePublication, MediaDriver, RegistrationError, Subscription
from slipstream.cli import main as cli_main
from slipstream.cli.observe import LOSS_HEADER
from slipstream.driver.config_file import KINDS, ConfigFileError, apply_config_file, format_config, load_config
from slipstream.errors import DriverError
from slipstream.files import observe
from slipstream.files.cnc import CncError
from slipstream.files.commands import AddPublication
from slipstream.files.loss_report import LossReport

TIMER_NS = 10_000_000  # positions and system counters refresh every 10 ms, so waits stay short


def cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slipstream", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.005)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def offer(pub: ExclusivePublication, message: bytes, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while (result := pub.offer(message)) < 0:
        assert time.monotonic() < deadline, f"offer refused: {result}"
        time.sleep(0.0001)
    return result


def connect(pub: ExclusivePublication, sub: Subscription) -> None:
    wait_for(lambda: pub.is_connected and sub.image_count == 1, what="publication connected")


@pytest.fixture
def driver(driver_dir: Path) -> Iterator[MediaDriver]:
    config = DriverConfig(
        directory=driver_dir, timer_interval_ns=TIMER_NS, ipc_term_length=1 << 20, udp_term_length=1 << 20
    )
    media_driver = MediaDriver(config).launch_embedded()
    yield media_driver
    media_driver.close()


@pytest.fixture
def ctx(driver: MediaDriver) -> Iterator[Context]:
    with Context(driver.directory, driver="external") as context:
        yield context


# -- stat ---------------------------------------------------------------------------------------------


def test_stat_once_shows_system_and_per_stream_counters(ctx: Context, driver_dir: Path) -> None:
    ipc_sub = ctx.add_subscription("aeron:ipc", 1001)
    ipc_pub = ctx.add_exclusive_publication("aeron:ipc", 1001)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    udp_sub = ctx.add_subscription(channel, 1002)
    udp_pub = ctx.add_exclusive_publication(channel, 1002)
    connect(ipc_pub, ipc_sub)
    connect(udp_pub, udp_sub)
    got: list[bytes] = []
    for _ in range(5):
        offer(ipc_pub, b"i" * 100)
        offer(udp_pub, b"u" * 100)

    def received_all() -> bool:
        for sub in (ipc_sub, udp_sub):
            sub.poll(lambda b, h: got.append(bytes(b)), 10)
        return len(got) == 10

    wait_for(received_all, what="messages received")
    wait_for(lambda: observe.counters(driver_dir)[0].value > 0, what="Bytes sent counted")

    done = cli("stat", "--dir", str(driver_dir), "--once")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(
        rf"\S+ - slipstream stat, pid {os.getpid()}, heartbeat age \d+ms, CnC v0\.2\.0 \(slipstream driver\)", lines[0]
    ), lines[0]
    by_label = {
        m[3]: int(m[2].replace(",", ""))
        for m in (re.fullmatch(r" *(\d+): +([\d,-]+) - (.*)", x) for x in lines[2:])
        if m
    }
    assert len(by_label) == len(lines) - 2, "every line after the header is `id: value - label`"
    assert by_label["Bytes sent"] > 0 and by_label["Bytes received"] > 0 and "Errors" in by_label
    ipc = f"{ipc_pub.session_id} 1001 aeron:ipc"
    assert by_label[f"pub-lmt: {ipc_pub.registration_id} {ipc}"] > 0
    assert by_label[f"pub-pos: {ipc_pub.registration_id} {ipc}"] == ipc_pub.position
    assert f"sub-pos: {ipc_sub.registration_id} {ipc} @0" in by_label
    udp = f"{udp_pub.session_id} 1002 {channel}"
    assert {f"{name}: {udp_pub.registration_id} {udp}" for name in ("pub-lmt", "pub-pos", "snd-pos", "snd-lmt")} <= set(
        by_label
    )
    image_id = udp_sub.images[0].correlation_id
    assert by_label[f"rcv-hwm: {image_id} {udp}"] == udp_pub.position
    assert f"sub-pos: {udp_sub.registration_id} {udp} @0" in by_label

    filtered = cli("stat", "--dir", str(driver_dir), "--once", "--filter", "^sub-pos")
    assert filtered.returncode == 0, filtered.stderr
    assert [line.split(" - ", 1)[1].split(":")[0] for line in filtered.stdout.splitlines()[2:]] == ["sub-pos"] * 2


def test_stat_json_parses_and_names_types(ctx: Context, driver_dir: Path) -> None:
    sub = ctx.add_subscription("aeron:ipc", 7)
    pub = ctx.add_exclusive_publication("aeron:ipc", 7)
    connect(pub, sub)
    done = cli("stat", "--dir", str(driver_dir), "--once", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["pid"] == os.getpid() and data["alive"] is True and data["state"] == "running"
    assert 0 <= data["heartbeat_age_ms"] < 5000
    assert (data["cnc_version"], data["flavour"]) == ("0.2.0", "slipstream")
    types = {c["label"]: c["type_name"] for c in data["counters"]}
    assert types["Bytes sent"] == "system"
    assert types[f"pub-lmt: {pub.registration_id} {pub.session_id} 7 aeron:ipc"] == "pub-lmt"
    sub_pos = next(c for c in data["counters"] if c["type_name"] == "sub-pos")
    assert sub_pos["registration_id"] == sub.registration_id and sub_pos["reference_id"] == pub.registration_id


def test_stat_refreshes_until_duration(driver: MediaDriver) -> None:
    done = cli("stat", "--dir", str(driver.directory), "--interval", "0.1", "--duration", "0.6", timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("- slipstream stat, pid") >= 2
    watched = cli("stat", "--dir", str(driver.directory), "--json", "--interval", "0.1", "--duration", "0.35")
    assert watched.returncode == 0, watched.stderr
    frames = [json.loads(line) for line in watched.stdout.splitlines()]
    assert len(frames) >= 2 and all(frame["alive"] for frame in frames)


def test_driver_status_api_and_stopped_driver(driver_dir: Path) -> None:
    config = DriverConfig(
        directory=driver_dir, timer_interval_ns=TIMER_NS, client_liveness_timeout_ns=10**9, dir_delete_on_shutdown=False
    )  # an embedded driver would remove them: keep them, as a standalone driver does
    with MediaDriver(config).launch_embedded():
        status = observe.driver_status(driver_dir)
        assert status.alive and status.pid == os.getpid() and status.state == "running"
        assert status.client_liveness_timeout_ns == 10**9
        assert status.start_timestamp_ms <= time.time_ns() // 1_000_000
        assert [c.label for c in status.counters[:2]] == ["Bytes sent", "Bytes received"]
    stopped = observe.driver_status(driver_dir)  # the files outlive the driver, for post-mortems
    assert not stopped.alive and stopped.state == "closed"
    done = cli("stat", "--dir", str(driver_dir), "--once")
    assert done.returncode == 0 and "(driver not alive: closed)" in done.stdout.splitlines()[0]


# -- backlog ------------------------------------------------------------------------------------------


def test_backlog_ipc_subscriber_that_has_not_polled(ctx: Context, driver_dir: Path) -> None:
    sub = ctx.add_subscription("aeron:ipc", 1001)
    pub = ctx.add_exclusive_publication("aeron:ipc", 1001)
    connect(pub, sub)
    join = sub.images[0].join_position
    for _ in range(10):
        offer(pub, b"x" * 100)
    expected = pub.position - join
    assert expected == 10 * 160  # 32-byte header + 100, aligned to 32

    def stream() -> observe.StreamBacklog:
        return next(s for s in observe.backlog(driver_dir) if s.session_id == pub.session_id)

    wait_for(lambda: (p := stream().publisher) is not None and p.position == pub.position, what="pub-pos refreshed")
    found = stream()
    assert (found.stream_id, found.channel, found.sender, found.receivers) == (1001, "aeron:ipc", None, ())
    assert found.publisher is not None and found.publisher.registration_id == pub.registration_id
    assert found.publisher.window == pub.position_limit - pub.position
    (subscriber,) = found.subscribers
    assert (subscriber.registration_id, subscriber.position, subscriber.join_position) == (
        sub.registration_id,
        join,
        join,
    )
    assert subscriber.behind == expected

    done = cli("backlog", "--dir", str(driver_dir))
    assert done.returncode == 0, done.stderr
    assert f"stream 1001 session {pub.session_id} aeron:ipc" in done.stdout
    assert f"  sub {sub.registration_id} position {join} joined {join} behind {expected}" in done.stdout
    as_json = json.loads(cli("backlog", "--dir", str(driver_dir), "--json").stdout)
    assert [s["subscribers"][0]["behind"] for s in as_json] == [expected]

    got: list[int] = []
    wait_for(lambda: sub.poll(lambda b, h: got.append(len(b)), 100) == 0 and len(got) == 10, what="drained")
    assert stream().subscribers[0].behind == 0  # sub-pos moves live, no timer needed


def test_backlog_udp_stream_has_sender_receiver_and_subscriber(ctx: Context, driver_dir: Path) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    sub = ctx.add_subscription(channel, 1002)
    pub = ctx.add_exclusive_publication(channel, 1002)
    connect(pub, sub)
    join = sub.images[0].join_position
    for _ in range(8):
        offer(pub, b"y" * 200)

    def stream() -> observe.StreamBacklog:
        return next(s for s in observe.backlog(driver_dir) if s.session_id == pub.session_id)

    wait_for(lambda: [r.high_water_mark for r in stream().receivers] == [pub.position], what="receiver caught up")
    found = stream()
    assert found.channel == channel
    assert found.publisher is not None and found.publisher.position == pub.position
    assert found.sender is not None and found.sender.position == pub.position and found.sender.behind == 0
    (receiver,) = found.receivers
    assert receiver.correlation_id == sub.images[0].correlation_id and receiver.behind == 0
    (subscriber,) = found.subscribers
    assert subscriber.producer_position == pub.position and subscriber.behind == pub.position - join == 8 * 256
    text = cli("backlog", "--dir", str(driver_dir)).stdout
    assert f"  snd {pub.registration_id} position {pub.position}" in text
    assert f"  rcv {receiver.correlation_id} hwm {pub.position} position {pub.position} behind 0" in text


def test_parse_stream_label() -> None:
    label = observe.parse_stream_label("sub-pos: 42 -7 1001 aeron:udp?endpoint=127.0.0.1:4000|mtu=1408 @4096")
    assert label == observe.StreamLabel("sub-pos", 42, -7, 1001, "aeron:udp?endpoint=127.0.0.1:4000|mtu=1408", 4096)
    assert observe.parse_stream_label("pub-lmt: 1 2 3 aeron:ipc") == observe.StreamLabel(
        "pub-lmt", 1, 2, 3, "aeron:ipc"
    )
    assert observe.parse_stream_label("Bytes sent") is None
    assert observe.parse_stream_label("sub-pos: 1 2 3 aeron:ipc @") == observe.StreamLabel(
        "sub-pos", 1, 2, 3, "aeron:ipc @"
    )


# -- errors and loss ----------------------------------------------------------------------------------


def test_errors_are_deduplicated_with_counts(ctx: Context, driver_dir: Path) -> None:
    for _ in range(3):
        # The client API now refuses a bad channel itself; send the command as another client could.
        correlation_id = ctx._next_correlation_id()
        with pytest.raises(RegistrationError) as raised:
            ctx._request(correlation_id, AddPublication(correlation_id, "aeron:bogus", 1, False))
        assert raised.value.code == "INVALID_CHANNEL"
    (record,) = observe.errors(driver_dir)
    assert record.observation_count == 3 and record.first_observation_ms <= record.last_observation_ms
    assert record.text == "INVALID_CHANNEL: unknown media 'bogus' (expected udp or ipc)"

    done = cli("errors", "--dir", str(driver_dir))
    assert done.returncode == 0, done.stderr
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"
    assert re.fullmatch(
        rf"3 observations from {iso} to {iso} for:\n INVALID_CHANNEL: unknown media 'bogus' \(expected udp or ipc\)\n"
        r"\n1 distinct error observed\.\n",
        done.stdout,
    ), done.stdout
    (as_json,) = json.loads(cli("errors", "--dir", str(driver_dir), "--json").stdout)
    assert as_json["observation_count"] == 3 and as_json["text"] == record.text
    wait_for(lambda: next(c.value for c in observe.counters(driver_dir) if c.label == "Errors") == 3)


def test_loss_without_loss_prints_only_the_header(driver: MediaDriver) -> None:
    done = cli("loss", "--dir", str(driver.directory))
    assert done.returncode == 0, done.stderr
    assert done.stdout == LOSS_HEADER + "\n"
    assert json.loads(cli("loss", "--dir", str(driver.directory), "--json").stdout) == []


def test_loss_entries_as_csv(driver_dir: Path) -> None:
    with MediaDriver(DriverConfig(directory=driver_dir, dir_delete_on_shutdown=False)).launch_embedded():
        pass
    report = LossReport(driver_dir)  # the stopped driver's file, refilled as a driver would
    try:
        channel = "aeron:udp?endpoint=127.0.0.1:40121"
        report.record("image", 64, 1_000, 84968302, 1001, channel, "127.0.0.1:43450")
        report.record("image", 32, 2_000, 84968302, 1001, channel, "127.0.0.1:43450")
    finally:
        report.close()
    (entry,) = observe.loss(driver_dir)
    assert (entry.observation_count, entry.total_bytes_lost, entry.last_observation_ms) == (2, 96, 2_000)
    done = cli("loss", "--dir", str(driver_dir))
    assert done.stdout.splitlines() == [LOSS_HEADER, f"2,96,1000,2000,84968302,1001,{channel},127.0.0.1:43450"]


@pytest.mark.parametrize("command", ["stat", "loss", "errors", "backlog"])
def test_no_driver_files_exit_2(command: str, driver_dir: Path) -> None:
    missing = cli(command, "--dir", str(driver_dir), *(["--once"] if command == "stat" else []))
    assert missing.returncode == 2 and missing.stdout == ""
    assert f"slipstream {command}: no media driver has run in {driver_dir}" in missing.stderr
    driver_dir.mkdir()
    empty = cli(command, "--dir", str(driver_dir))  # without --once too: a watch needs a driver to start
    assert empty.returncode == 2 and "no cnc.dat" in empty.stderr


def test_no_driver_error_is_both_kinds(driver_dir: Path) -> None:
    for read in (observe.driver_status, observe.counters, observe.loss, observe.errors, observe.backlog):
        with pytest.raises(observe.NoDriverError) as raised:
            read(driver_dir)
        assert isinstance(raised.value, CncError) and isinstance(raised.value, DriverError)


# -- configuration files ------------------------------------------------------------------------------


def test_kinds_cover_every_config_field() -> None:
    assert list(KINDS) == list(DriverConfig.__dataclass_fields__)


def test_toml_with_field_names_and_aeron_aliases(tmp_path: Path) -> None:
    path = tmp_path / "driver.toml"
    path.write_text(
        """
"aeron.dir" = "/dev/shm/slipstream-from-toml"
client-liveness-timeout = "2s"
publication_linger_ns = 1000
ipc-term-length = "128k"
udp_mtu = 4096
so_sndbuf = "256k"
so_rcvbuf = 0
idle_strategy = "sleep"
reserved-session-id-low = -5

[aeron.rcv.initial.window]
length = "1m"
"""
    )
    config = load_config(path)
    assert config.directory == Path("/dev/shm/slipstream-from-toml")
    assert config.client_liveness_timeout_ns == 2_000_000_000 and config.publication_linger_ns == 1000
    assert (config.ipc_term_length, config.udp_mtu, config.receiver_window) == (128 * 1024, 4096, 1 << 20)
    assert (config.so_sndbuf, config.so_rcvbuf) == (256 * 1024, None)  # 0 means the OS default, as in Aeron
    assert (config.idle_strategy, config.reserved_session_id_low) == ("sleep", -5)
    assert config.udp_term_length == DriverConfig().udp_term_length


def test_properties_with_aeron_aliases(tmp_path: Path) -> None:
    path = tmp_path / "driver.properties"
    path.write_text(
        """# Aeron-style settings
! another comment
aeron.dir=/dev/shm/slipstream-from-props
aeron.client.liveness.timeout = 3s
aeron.ipc.term.buffer.length: 256k
aeron.term.buffer.length=2m
aeron.mtu.length=8k
aeron.socket.so_rcvbuf=64k
aeron.socket.so_sndbuf = 1m
aeron.rcv.initial.window.length=\\
    256k
aeron.timer.interval=50ms
counters_capacity=1024
"""
    )
    config = load_config(path)
    assert config.directory == Path("/dev/shm/slipstream-from-props")
    assert config.client_liveness_timeout_ns == 3_000_000_000 and config.timer_interval_ns == 50_000_000
    assert (config.ipc_term_length, config.udp_term_length, config.udp_mtu) == (256 << 10, 2 << 20, 8 << 10)
    assert (config.so_rcvbuf, config.so_sndbuf, config.receiver_window) == (64 << 10, 1 << 20, 256 << 10)
    assert config.counters_capacity == 1024


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.toml", "udp_mtu = 1408\nudp_mtuu = 1408\n", "unknown key 'udp_mtuu'; did you mean 'udp_mtu'?"),
        ("a.properties", "aeron.mtu.length=8k\nnot.a.key=1\n", "a.properties:2: unknown key 'not.a.key'"),
        ("a.properties", "aeron.mtu.length=lots\n", "a.properties:1: aeron.mtu.length: expected a size like 64k"),
        ("a.toml", "client-liveness-timeout = 2.5\n", "client-liveness-timeout: expected a duration, got float"),
        ("a.toml", 'aeron.client.liveness.timeout = "5 s"\n', "aeron.client.liveness.timeout: expected a duration"),
        ("a.toml", 'counters_capacity = "8k"\n', "counters_capacity: expected an integer"),
        ("a.toml", "directory = 3\n", "directory: expected a string"),
        (
            "a.properties",
            "aeron.mtu.length=1000\n",
            "udp_mtu: mtu must be a multiple of 32 in (32, 65504]: 1000 (set by 'aeron.mtu.length')",
        ),
        ("a.properties", "idle=sometimes\n", "idle_strategy:"),
        ("a.properties", "aeron.dir=/a\ndirectory=/b\n", "a.properties:2: 'directory' sets directory again"),
        ("a.toml", "udp_mtu = [1]\n", "udp_mtu: expected a size, got list"),
        ("a.toml", "udp_mtu = \n", "not valid TOML"),
        ("a.properties", "just-a-key\n", "a.properties:1: expected key=value"),
        ("a.properties", "udp_gso=maybe\n", "udp_gso: expected true or false, got 'maybe'"),
        ("a.toml", 'threading_mode = "shared"\n', "threading_mode must be one of dedicated, invoker"),
    ],
)
def test_bad_config_files_name_the_key(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigFileError) as raised:
        load_config(path)
    assert message in str(raised.value)


@pytest.mark.parametrize(("name", "text"), [("a.toml", "udp_gso = false\n"), ("a.properties", "udp-gso=off\n")])
def test_boolean_settings_from_files(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert load_config(path).udp_gso is False


def test_config_file_leaves_its_base_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.properties"
    path.write_text("aeron.mtu.length=4k\n")
    base = DriverConfig(ipc_term_length=1 << 20)
    updated = apply_config_file(base, path)
    assert (updated.udp_mtu, updated.ipc_term_length, base.udp_mtu) == (4096, 1 << 20, DriverConfig().udp_mtu)
    with pytest.raises(ConfigFileError, match="cannot read configuration file"):
        load_config(tmp_path / "missing.toml")


def test_command_line_overrides_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "driver.toml"
    path.write_text('ipc-term-length = "4m"\nudp-term-length = "2m"\nidle_strategy = "sleep"\n')
    assert cli_main(["driver", "--config", str(path), "--ipc-term-length", "128k", "--print-config"]) == 0
    printed = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in capsys.readouterr().out.splitlines()[1:])
    )
    assert printed["ipc_term_length"] == '"128k"'  # the option wins
    assert printed["udp_term_length"] == '"2m"' and printed["idle_strategy"] == '"sleep"'  # the file's
    assert list(printed) == list(KINDS)  # every setting is shown


def test_print_config_is_a_valid_config_file(tmp_path: Path) -> None:
    done = cli("driver", "--print-config", "--dir", str(tmp_path / "d"), "--client-liveness-timeout", "1.5")
    assert done.returncode == 0, done.stderr
    assert 'client_liveness_timeout_ns     = "1500ms"' in done.stdout
    saved = tmp_path / "effective.toml"
    saved.write_text(done.stdout)
    assert format_config(load_config(saved)) == done.stdout.rstrip("\n")
    assert not (tmp_path / "d").exists()  # printing starts no driver


def test_driver_command_rejects_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("aeron.term.buffer.length=100k\n")
    done = cli("driver", "--config", str(path))
    assert done.returncode == 2
    assert (
        "udp_term_length: term length must be a power of 2" in done.stderr and "aeron.term.buffer.length" in done.stderr
    )


# -- clients' own counters ------------------------------------------------------------------------------


def test_a_clients_counter_shows_in_stat_and_is_freed_with_it(ctx: Context, driver_dir: Path) -> None:
    counter = ctx.add_counter(5000, "requests served: worker 1", b"k1")
    assert counter.increment() == 1 and counter.increment(41) == 42
    assert ctx.counters().get(counter.counter_id) == counter.value == 42
    done = cli("stat", "--dir", str(driver_dir), "--once", "--json")
    assert done.returncode == 0, done.stderr
    (mine,) = [c for c in json.loads(done.stdout)["counters"] if c["label"] == "requests served: worker 1"]
    assert mine["value"] == 42 and mine["type_id"] == 5000 and mine["registration_id"] == counter.registration_id
    assert mine["key"] == b"k1".hex() and mine["owner_id"] == ctx.client_id
    text = cli("stat", "--dir", str(driver_dir), "--once", "--filter", "requests served")
    assert text.stdout.splitlines()[2:] == [f"{counter.counter_id:3}: {42:20,} - requests served: worker 1"]
    counter.close()
    counter.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        counter.increment()
    wait_for(lambda: all(c.label != "requests served: worker 1" for c in observe.counters(driver_dir)), what="freed")

    # Another client's counters go with it, whether it closes or just goes away (SIGKILL).
    with Context(driver_dir, driver="external") as other:
        kept = other.add_counter(5001, "other client")
        kept.set(7)
        assert any(c.label == "other client" and c.value == 7 for c in observe.counters(driver_dir))
    wait_for(lambda: all(c.label != "other client" for c in observe.counters(driver_dir)), what="freed with its client")
    script = (
        "import sys, time; from slipstream import Context\n"
        f"ctx = Context({str(driver_dir)!r}, driver='external')\n"
        "ctx.add_counter(5002, 'killed client').set(9); print('ready', flush=True); time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            assert any(c.label == "killed client" and c.value == 9 for c in observe.counters(driver_dir))
            proc.kill()
            proc.wait(10)
            wait_for(lambda: all(c.label != "killed client" for c in observe.counters(driver_dir)), what="freed")
        finally:
            proc.kill()


def test_add_counter_refuses_bad_arguments(ctx: Context) -> None:
    from slipstream.errors import InvalidArgumentError, InvalidArgumentTypeError

    with pytest.raises(InvalidArgumentError, match="type_id"):
        ctx.add_counter(12, "a driver type id")  # the driver's own range
    with pytest.raises(InvalidArgumentTypeError, match="label"):
        ctx.add_counter(5000, b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="key"):
        ctx.add_counter(5000, "long key", bytes(113))


def test_the_driver_refuses_a_counter_outside_the_application_range(ctx: Context) -> None:
    """A client that skips the checks (an older or foreign one) is refused by the driver itself."""
    from slipstream.client import Registration
    from slipstream.files.commands import AddCounter

    correlation_id = ctx._next_correlation_id()
    registration = Registration(ctx, correlation_id, AddCounter(correlation_id, 4, "sneaky"), lambda r: r)
    with pytest.raises(RegistrationError, match=r"INVALID_COMMAND.*type id 4"):
        registration.wait()
