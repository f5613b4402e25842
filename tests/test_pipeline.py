"""slipstream.pipeline on a real local Spark (one session for the run): the report over a real recorded
run, the ``slipstream`` source (batch, typed columns, streaming restart), the sink onto a real
subscription, the live abuse-list loop, the report in headless Chromium, and a standalone cluster."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

from slipstream import Context, DriverConfig, RegistrationError
from slipstream.files import observe
from slipstream.files.loss_report import LossReport
from slipstream.pipeline.connections import SERVER_PINGS
from slipstream.pipeline.demo import RunSummary, abuse_loop, record_run
from slipstream.pipeline.jobs import TABLES
from slipstream.pipeline.options import ReportOptions
from slipstream.pipeline.report import PLOTS
from slipstream.pipeline.run import ReportOutcome, generate_report
from slipstream.pipeline.submit import SUBMIT_SCRIPT
from slipstream.telemetry import DriverSampler, Recorder, RecorderConfig, Recording, StreamStats
from slipstream.telemetry.reader import segment_ranges

from .browser import chromium

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("SLIPSTREAM_ARTIFACTS", ROOT / "test-artifacts"))
MESSAGES = 3000


BAD_REGISTRATIONS = 3
UNBINDABLE = "203.0.113.7:40555"  # TEST-NET-3 (RFC 5737): never an address of this machine
GARBAGE_DATAGRAMS = 4


def _record_driver_errors_and_loss(recording: Path, driver_dir: Path) -> None:
    """A second driver's files in the same recording: real errors (refused registrations, garbage
    datagrams on a receive endpoint) and loss-report entries (refilled after it stopped, as the
    observe tests do: loopback loses nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Recorder(recording, writer_id="errors") as recorder:
        sampler = DriverSampler(recorder, driver_dir)
        # The files outlive this embedded driver: the loss report is refilled and sampled after it stopped.
        keep = DriverConfig(dir_delete_on_shutdown=False)
        with Context(driver_dir, driver="embedded", driver_config=keep) as context:
            for _ in range(BAD_REGISTRATIONS):
                with pytest.raises(RegistrationError):  # not an address of this host: the driver cannot bind
                    context.add_subscription(f"aeron:udp?endpoint={UNBINDABLE}", 1)
            context.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 5)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                for _ in range(GARBAGE_DATAGRAMS):
                    sock.sendto(b"\xff" * 7, ("127.0.0.1", port))
            deadline = time.monotonic() + 20
            expected = BAD_REGISTRATIONS + GARBAGE_DATAGRAMS
            while sum(e.observation_count for e in observe.errors(driver_dir)) < expected:
                assert time.monotonic() < deadline, observe.errors(driver_dir)
                time.sleep(0.05)
            sampler.sample()
        report = LossReport(driver_dir)
        try:
            report.record("image", 64, 1_000, 77, 1001, "aeron:udp?endpoint=127.0.0.1:40121", "127.0.0.1:43450")
            report.record("image", 32, 2_000, 77, 1001, "aeron:udp?endpoint=127.0.0.1:40121", "127.0.0.1:43450")
        finally:
            report.close()
        sampler.sample()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunSummary]:
    """A real IPC + UDP run through an embedded driver, recorded; a real server recording its clients
    (over UDP and IPC, some refused); and a second driver's real errors and loss entries."""
    recording = tmp_path_factory.mktemp("run") / "recording"
    summary = record_run(recording, messages=MESSAGES)
    driver_dir = Path("/dev/shm") / f"slipstream-test-errors-{os.getpid()}"
    try:
        _record_driver_errors_and_loss(recording, driver_dir)
    finally:
        shutil.rmtree(driver_dir, ignore_errors=True)
    return recording, summary


@pytest.fixture(scope="module")
def report(spark: Any, recorded: tuple[Path, RunSummary], tmp_path_factory: pytest.TempPathFactory) -> ReportOutcome:
    out = tmp_path_factory.mktemp("report")
    return generate_report(recorded[0], out, options=ReportOptions(abuse_threshold=3), show_progress=False)


def test_report_tables_agree_with_what_the_run_counted(
    report: ReportOutcome, recorded: tuple[Path, RunSummary]
) -> None:
    _, summary = recorded
    rows = report.tables.rows
    assert set(rows) == set(TABLES)
    for name in TABLES:
        assert pq.read_table(report.tables.paths[name]).num_rows == len(rows[name])
    # Captured streams: every message each stream sent, with its bytes, by type.
    per_stream: dict[str, list[int]] = {}
    for row in rows["stream_throughput"]:
        counts = per_stream.setdefault(row["channel"], [0, 0])
        counts[0] += row["messages"]
        counts[1] += row["bytes"]
    streams = {channel: per_stream.pop(channel) for channel in summary.messages}
    assert streams == {channel: [summary.messages[channel], summary.bytes[channel]] for channel in summary.messages}
    # What is left: the messages the recorded server captured on its connections' streams.
    network_types = summary.network.types
    assert sum(messages for messages, _ in per_stream.values()) == sum(network_types.values()) == 4 * 501
    types = {row["message_type"]: row["messages"] for row in rows["message_types"]}
    assert types == {"Quote": 2 * MESSAGES * 9 // 10 + network_types["Quote"],
                     "Chat": 2 * MESSAGES // 10 + network_types["Chat"]}  # fmt: skip
    # Refused handshakes as the server refused them, per host and reason, and the abuse list (threshold 3).
    network = summary.network
    reasons = {(row["address"], row["reason"]): row["rejections"] for row in rows["rejected_handshakes"]}
    assert reasons == {(host, why): n for host, counts in network.rejected.items() for why, n in counts.items()}
    # Since issue 29 the server itself refuses other message types (at DONE, once the client is admitted).
    mismatch = {("ipc", "registration_mismatch"): 1}
    assert reasons == {("127.0.0.1", "not_permitted"): 3, ("ipc", "not_permitted"): 1, **mismatch}
    assert [(row["address"], row["rejections"]) for row in rows["abuse_list"]] == [("127.0.0.1", 3)]
    assert network.client_refusals == {"registration_mismatch": 1}  # the client records its refusal too
    # Sessions: one per accepted client, the server's counters against what each client sent.
    sessions = {row["connection_id"]: row for row in rows["sessions"]}
    assert set(sessions) == set(network.sessions) and len(sessions) == summary.connections == 4
    assert sorted(s["transport"] for s in sessions.values()) == ["ipc", "ipc", "udp", "udp"]
    for connection_id, counted in network.sessions.items():
        session = sessions[connection_id]
        assert session["tag"] == counted["tag"] and session["transport"] == counted["transport"]
        assert session["messages_received"] == counted["sent"] == counted["received"] == 501
        assert session["bytes_received"] == counted["bytes_sent"]  # every record, the CLOSE one included
        # The other way: the server sent the 1st, 11th... message back, and the client got each one.
        assert session["messages_sent"] == counted["replied"] == counted["replies"] == 51
        assert session["bytes_sent"] == counted["bytes_received"]  # replies, pings, pongs, acknowledgements
        assert session["cause"] == "peer_closed"
        assert session["duration_s"] > 0 and session["throughput_bytes_per_s"] > 0
        # The server's pings, each a sample: enough for a p99.
        assert session["rtt_samples"] == SERVER_PINGS >= 100
        assert 0 < session["rtt_p50_ns"] <= session["rtt_p95_ns"] <= session["rtt_p99_ns"] < 5e9
        assert session["loss_rate"] == 0.0
    # Per window and server: the sessions' traffic and samples, every window of the run.
    (server,) = {row["server"] for row in rows["server_windows"]}
    assert server == socket.gethostname()
    assert sum(row["messages_in"] for row in rows["server_windows"]) == 4 * 501
    assert sum(row["rtt_samples"] for row in rows["server_windows"]) == 4 * SERVER_PINGS
    links = {row["remote"] for row in rows["link_windows"]}
    assert links == {"127.0.0.1", "ipc"}
    churn: dict[tuple[str, str], int] = {}
    for row in rows["churn"]:
        churn[(row["event"], row["detail"])] = churn.get((row["event"], row["detail"]), 0) + row["events"]
    assert churn[("connected", "")] == churn[("disconnected", "peer_closed")] == 4
    assert churn[("handshake_rejected", "not_permitted")] == 4
    talkers = {row["key"] for row in rows["top_talkers"] if row["dimension"] == "tag"}
    assert talkers == {counted["tag"] for counted in network.sessions.values()}
    counters = {row["label"]: row["last_value"] for row in rows["driver_counters"]}
    assert any(label.startswith("sub-pos") for label in counters)
    assert len({row["driver"] for row in rows["driver_counters"]}) == 3  # streams, network, errors
    # The second driver's real errors and its loss report, as the test caused them.
    errors = {row["text"]: row["observation_count"] for row in rows["errors"]}
    refused = [n for text, n in errors.items() if text.startswith(f"RESOURCE: aeron:udp?endpoint={UNBINDABLE}")]
    assert refused == [BAD_REGISTRATIONS]
    assert sum(n for text, n in errors.items() if text.startswith("invalid datagrams dropped")) == GARBAGE_DATAGRAMS
    (loss,) = rows["loss"]
    assert (loss["observation_count"], loss["total_bytes_lost"], loss["session_id"]) == (2, 96, 77)
    assert report.tables.input_rows["captured"] == 2 * MESSAGES + 4 * 501


def test_batch_source_reads_typed_columns_in_any_partitioning(spark: Any, recorded: tuple[Path, RunSummary]) -> None:
    recording, _ = recorded
    reader = spark.read.format("slipstream").option("kind", "typed.Quote")
    quotes = reader.load(str(recording))
    types = dict(quotes.dtypes)
    assert types["bid"] == "double" and types["sequence"] == "bigint" and types["symbol"] == "string"
    network_quotes = recorded[1].network.types["Quote"]  # captured by the recorded server
    assert quotes.count() == 2 * MESSAGES * 9 // 10 + network_quotes
    small = reader.option("rowsPerPartition", "500").load(str(recording))
    row_groups = [r for s in Recording(recording).segments("typed.Quote") for r in segment_ranges(s)]
    assert 1 < small.rdd.getNumPartitions() <= len(row_groups)  # a row group is never split between tasks
    per_client = [i for i in range(501) if i % 10 != 9]
    assert sorted(r.sequence for r in small.select("sequence").collect()) == sorted(
        2 * [i for i in range(MESSAGES) if i % 10 != 9] + 4 * per_client
    )


def _resolves(session: Any, name: str) -> bool:
    """Whether ``format(name)`` resolves in ``session`` (a Python source registered or found by lookup)."""
    return bool(session._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name))


def test_a_plain_session_finds_the_source_without_register(spark: Any, recorded: tuple[Path, RunSummary]) -> None:
    """PySpark's lookup of installed ``pyspark_*`` modules registers ``slipstream`` in every session.
    A new session of the suite's Spark (the same JVM: no second start-up) has none of what register()
    did in the suite's session, as a source registered there only shows; it reads all the same."""
    from pyspark.sql.datasource import DataSource

    class Probe(DataSource):
        @classmethod
        def name(cls) -> str:
            return "slipstream_test_probe"

    plain = spark.newSession()
    spark.dataSource.register(Probe)
    assert _resolves(spark, "slipstream_test_probe") and not _resolves(plain, "slipstream_test_probe")
    assert _resolves(plain, "slipstream")
    recording, summary = recorded
    quotes = plain.read.format("slipstream").option("kind", "typed.Quote").load(str(recording))
    assert quotes.count() == 2 * MESSAGES * 9 // 10 + summary.network.types["Quote"]
    events = plain.readStream.format("slipstream").option("kind", "connection_events").load(str(recording))
    assert events.isStreaming and "reason" in events.columns


LOOKUP = """
import io
from pyspark.serializers import CPickleSerializer, UTF8Deserializer, read_int
from pyspark.sql.worker.lookup_data_sources import _main
out = io.BytesIO()
_main(None, out)  # what the Spark driver's Python worker runs to find data sources
out.seek(0)
found = {}
for _ in range(read_int(out)):
    name = UTF8Deserializer().loads(out)
    source = CPickleSerializer()._read_with_length(out)
    found[name] = f"{source.__module__}.{source.__qualname__}"
print(found)
"""


def test_the_installed_package_is_what_pysparks_lookup_registers(tmp_path: Path) -> None:
    """PySpark's own lookup code, in this interpreter without PYTHONPATH (only what is installed, as a
    plain session's Python worker sees it): ``slipstream`` maps to the data source class."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", LOOKUP], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = eval(proc.stdout.strip().splitlines()[-1])
    assert found.get("slipstream") == "slipstream.pipeline.source.SlipstreamDataSource", found


T = TypeVar("T")


@contextlib.contextmanager
def collected(driver_dir: Path, stream_id: int, kind: type[T], expected: int, timeout_s: float) -> Iterator[list[T]]:
    """Messages of ``kind`` arriving on ``aeron:ipc`` ``stream_id``, decoded by a polling thread while the
    block runs; on leaving it waits up to ``timeout_s`` for ``expected`` of them, then a moment more for
    any extra one (a duplicate) before it stops."""
    received: list[T] = []
    decoder = msgspec.msgpack.Decoder(kind)
    with Context(driver_dir, driver="external") as context:
        subscription = context.add_subscription("aeron:ipc", stream_id)
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                if subscription.poll(lambda buffer, header: received.append(decoder.decode(buffer)), 100) == 0:
                    time.sleep(0.001)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            yield received
            deadline = time.monotonic() + timeout_s
            while len(received) < expected and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.4)  # a duplicate would arrive now
        finally:
            stop.set()
            poller.join(5)


def _readme_stream_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Recording and the Spark pipeline", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```py\n(.*?)```", section, flags=re.S)  # `py`: test_readme runs `python` blocks
    return str(block)


class Received(msgspec.Struct, tag="Received", tag_field="type"):
    connection_id: int
    messages: int


def test_readme_streaming_snippet_publishes_what_it_read(
    spark: Any, recorded: tuple[Path, RunSummary], driver: Any, driver_dir: Path, tmp_path: Path
) -> None:
    """The README's readStream / writeStream block, on the suite's session (its getOrCreate returns it)
    with this run's recording and driver: every connection's count arrives once at a subscription."""
    recording, summary = recorded
    snippet = _readme_stream_snippet()
    for name, value in (("RECORDING", f"{recording}/"), ("DRIVER_DIR", str(driver_dir)),
                        ("CHECKPOINTS", f"{tmp_path}/")):  # fmt: skip
        snippet, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", snippet, flags=re.M)
        assert n == 1, name
    with collected(driver_dir, 3001, Received, len(summary.network.sessions), 10) as received:
        exec(compile(snippet, "README.md", "exec"), {})
    assert sorted((r.connection_id, r.messages) for r in received) == sorted(
        (cid, counted["received"]) for cid, counted in summary.network.sessions.items()
    )
    assert int((tmp_path / "received-sink").read_text().split()[1]) >= 0  # sinkState: "<query id> <last batch>"


def test_streaming_restart_from_checkpoint_matches_batch(spark: Any, tmp_path: Path) -> None:
    """A live, growing recording; the query stops midway and restarts from its checkpoint: every row
    exactly once, and the same totals as a batch read."""
    recording, out, checkpoint = tmp_path / "rec", tmp_path / "out", tmp_path / "checkpoint"
    total = 6000
    config = RecorderConfig(flush_interval_s=0.1, segment_max_age_s=0.3)
    half = threading.Event()
    done = threading.Event()

    def produce() -> None:
        with Recorder(recording, writer_id="live", config=config) as recorder:
            for i in range(total):
                recorder.record(StreamStats(time.time_ns(), "aeron:ipc", 1, 7, "pub", i, i + 1, 32 * (i + 1)))
                if i == total // 2:
                    half.set()
                if i % 200 == 0:
                    time.sleep(0.05)
        done.set()

    def start() -> Any:
        stream = spark.readStream.format("slipstream").option("kind", "stream_stats").option(
            "maxRecordsPerTrigger", "1500").load(str(recording))  # fmt: skip
        return (
            stream.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="0.5 seconds")
            .start()
        )

    Recorder(recording, writer_id="live").close()  # the directory exists before the query starts
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    assert half.wait(60)
    query = start()
    deadline = time.monotonic() + 90
    while sum(p["numInputRows"] for p in query.recentProgress) < 3000:  # two batches committed
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the first query processed nothing"
        time.sleep(0.1)
    query.stop()  # possibly in the middle of the third batch
    first_run = spark.read.parquet(str(out)).count()
    assert 0 < first_run < total, first_run
    assert done.wait(60)
    producer.join(10)
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    streamed = sorted(r.position for r in spark.read.parquet(str(out)).select("position").collect())
    assert streamed == list(range(total)), "duplicates or gaps across the restart"
    batch = spark.read.format("slipstream").option("kind", "stream_stats").load(str(recording))
    totals = ["count(*) AS n", "sum(bytes) AS bytes", "sum(messages) AS messages"]
    assert spark.read.parquet(str(out)).selectExpr(*totals).collect() == batch.selectExpr(*totals).collect()


class Score(msgspec.Struct, tag="Score", tag_field="type"):
    player: str
    points: int


def test_sink_publishes_each_row_exactly_once_onto_a_real_subscription(
    spark: Any, driver: Any, driver_dir: Path
) -> None:
    rows = [(f"player{i}", i) for i in range(1000)]
    df = spark.createDataFrame(rows, "player string, points long").repartition(4)
    with collected(driver_dir, 2001, Score, len(rows), 30) as received:
        (df.write.format("slipstream").mode("append").option("channel", "aeron:ipc").option("stream", "2001")
         .option("dir", str(driver_dir)).option("type", "Score").save())  # fmt: skip
    assert len(received) == len(rows)
    assert sorted((s.player, s.points) for s in received) == sorted(rows)


def test_abuse_list_loop_refuses_a_new_offender(spark: Any, recorded: tuple[Path, RunSummary], tmp_path: Path) -> None:
    """The shipped example: the streaming query publishes the abuse list from the recording, a running
    server's filter consults it, and a regular client from a listed host is refused."""
    recording = tmp_path / "recording"
    shutil.copytree(recorded[0], recording)
    assert abuse_loop(tmp_path, recording, master=None, threshold=5, timeout_s=90)


def test_pipeline_demo_runs_small_on_the_suites_session(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``slipstream pipeline demo`` (what ``make demo`` runs), small: its three steps, in this process so
    the suite's Spark session serves it (the demo's getOrCreate reuses it: no second start-up)."""
    from slipstream.cli import main

    output = tmp_path / "demo"
    started = time.monotonic()
    code = main(["pipeline", "demo", "--output", str(output), "--messages", "300", "--clients", "2",
                 "--per-client", "40", "--abuse-threshold", "3"])  # fmt: skip
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0] == f"1/3 recording a real run into {output / 'recording'}"
    assert "the server recorded 2 connections (it sent 10 messages back)" in lines
    assert f"Spark {spark.sparkContext.master}:" in out  # the suite's session, reused
    (shown,) = [line.removeprefix("report: ") for line in lines if line.startswith("report: ")]
    assert Path(shown) == output / "report" / "report.html" and Path(shown).is_file()
    assert lines[-1].startswith("done in ") and lines[-1].endswith(f"report: {shown}")
    loop = lines[lines.index("3/3 live abuse-list loop") :]
    assert any(line.startswith("abuse list: 127.0.0.1 listed") for line in loop), out
    assert any(line.startswith("regular-client from 127.0.0.1: REFUSED") for line in loop), out
    assert elapsed < 240, f"the small demo took {elapsed:.0f} s"


CHECK_SCRIPT = """
<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const loaded = images.filter((img) => img.complete && img.naturalWidth > 0).length;
  document.body.setAttribute("data-images", loaded + "/" + images.length);
  const wide = Array.from(document.querySelectorAll("table"))
    .filter((t) => t.scrollWidth > t.parentElement.clientWidth)
    .map((t) => t.id || "summary");
  if (document.documentElement.scrollWidth > document.documentElement.clientWidth) wide.push("page");
  document.body.setAttribute("data-wide", wide.join(",") || "none");
});
</script>
"""


def test_report_opens_in_headless_chromium_with_every_plot_loaded(report: ReportOutcome, tmp_path: Path) -> None:
    """Every plot loads, and no table is wider than the page (at 1280 px and at 900 px)."""
    page = report.html.read_text()
    assert page.count("<img ") == len(PLOTS)
    check = report.html.with_name("check.html")
    check.write_text(page.replace("</body>", CHECK_SCRIPT + "</body>"))
    for width in (1280, 900):
        dom = chromium([f"--window-size={width},2400", "--dump-dom", check.as_uri()], tmp_path / f"profile{width}")
        assert f'data-images="{len(PLOTS)}/{len(PLOTS)}"' in dom.stdout, dom.stdout[-2000:] + dom.stderr[-2000:]
        assert 'data-wide="none"' in dom.stdout, re.findall(r'data-wide="[^"]*"', dom.stdout)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "pipeline-report.png"
    shot.unlink(missing_ok=True)
    result = chromium([f"--screenshot={shot}", "--window-size=1280,2400", report.html.as_uri()], tmp_path / "profile2")
    assert shot.is_file() and shot.stat().st_size > 10_000, result.stderr[-2000:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[str]:
    """One Spark master and one worker on 127.0.0.1, started from the installed PySpark."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    port = _free_port()
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_LOG_DIR": str(tmp_path / "logs"), "PYSPARK_PYTHON": sys.executable}  # fmt: skip
    spark_class = str(spark_home / "bin" / "spark-class")
    logs = [open(tmp_path / name, "w") for name in ("master.log", "worker.log")]  # noqa: SIM115
    master = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(_free_port())], env=env, stdout=logs[0], stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host", "127.0.0.1",
         "--cores", "2", "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(tmp_path / "work")],
        env=env, stdout=logs[1], stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "Successfully registered with master" not in (tmp_path / "worker.log").read_text():
            assert master.poll() is None and worker.poll() is None, (tmp_path / "master.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.25)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for proc in (worker, master):
            proc.terminate()
        for proc in (worker, master):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()


def test_standalone_cluster_under_spark_submit_and_the_command_gives_the_same_tables(
    report: ReportOutcome, recorded: tuple[Path, RunSummary], standalone_cluster: str, tmp_path: Path
) -> None:
    """One cluster, two drivers one after the other: spark-submit with the job script, then
    ``slipstream pipeline report --master spark://...``; both give local mode's tables."""
    import pyspark

    out = tmp_path / "cluster-report"
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(ROOT / "src")}  # fmt: skip
    proc = subprocess.run(
        [str(spark_submit), "--master", standalone_cluster, "--conf", "spark.ui.enabled=false",
         "--conf", "spark.executor.memory=512m", "--conf", f"spark.executorEnv.PYTHONPATH={ROOT / 'src'}",
         SUBMIT_SCRIPT, "--input", str(recorded[0]), "--output", str(out), "--abuse-threshold", "3"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"spark: {standalone_cluster}" in proc.stdout
    done = f"[{len(TABLES)}/{len(TABLES)}] errors done"
    assert done in proc.stderr + proc.stdout, proc.stderr[-3000:]  # the progress display
    command_out = tmp_path / "command-report"
    command = subprocess.run(
        [sys.executable, "-m", "slipstream", "pipeline", "report", "--input", str(recorded[0]), "--output",
         str(command_out), "--master", standalone_cluster, "--abuse-threshold", "3"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert command.returncode == 0, command.stdout[-3000:] + command.stderr[-5000:]
    assert f"spark: {standalone_cluster}," in command.stdout, command.stdout
    assert done in command.stderr + command.stdout, command.stderr[-3000:]
    assert f"report: {command_out / 'report.html'}" in command.stdout and (command_out / "report.html").is_file()
    for name in TABLES:
        local = pq.read_table(report.tables.paths[name]).to_pylist()
        assert pq.read_table(out / "tables" / name).to_pylist() == local, f"spark-submit: {name}"
        assert pq.read_table(command_out / "tables" / name).to_pylist() == local, f"--master: {name}"
    assert Recording(recorded[0]).segments("captured")


def test_report_command_names_a_missing_input(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "slipstream", "pipeline", "report", "--input", str(tmp_path / "nope"), "--output",
         str(tmp_path / "out")], capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 2 and "--input" in proc.stderr and "nope" in proc.stderr


def test_streaming_sink_skips_a_batch_replayed_after_a_restart(driver: Any, driver_dir: Path, tmp_path: Path) -> None:
    """The stream writer's commit, as Spark calls it on the driver, with ``sinkState``: a batch id
    published before (Spark replays the last batch when its commit did not reach the checkpoint)
    is not published again."""
    from slipstream.pipeline.source import SlipstreamDataSource

    options = {"channel": "aeron:ipc", "stream": "2002", "dir": str(driver_dir), "type": "Score",
               "sinkState": str(tmp_path / "sink-state"), "queryId": "q"}  # fmt: skip
    writer = SlipstreamDataSource(options).streamWriter(None, False)
    encoder = msgspec.msgpack.Encoder()
    received: list[Score] = []
    decoder = msgspec.msgpack.Decoder(Score)
    with Context(driver_dir, driver="external") as context:
        subscription = context.add_subscription("aeron:ipc", 2002)

        def commit(batch_id: int, *points: int) -> None:
            from slipstream.pipeline.sink import _Encoded

            payloads = [encoder.encode(Score(f"p{p}", p)) for p in points]
            writer.commit([_Encoded(payloads)], batch_id)

        def drain(expected: int) -> None:
            deadline = time.monotonic() + 10
            while len(received) < expected and time.monotonic() < deadline:
                subscription.poll(lambda buffer, header: received.append(decoder.decode(buffer)), 100)
            time.sleep(0.2)
            subscription.poll(lambda buffer, header: received.append(decoder.decode(buffer)), 100)

        commit(0, 1, 2)
        drain(2)
        commit(0, 1, 2)  # replayed after a restart: skipped
        commit(1, 3)
        drain(3)
    assert [s.points for s in received] == [1, 2, 3]
