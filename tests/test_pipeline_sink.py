"""The ``slipstream`` sink and its receivers on a real local Spark and real processes: every record
numbered (query, batch, sequence) and applied once, even when the query is killed (SIGKILL, JVM and
all) in the middle of a publish; no subscriber does not kill the query; the abuse list is a windowed,
versioned snapshot that a server starting after the last batch has within a second."""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("pyspark")

from slipstream import Context
from slipstream.telemetry import Recorder, StreamStats
from slipstream.telemetry.records import handshake_rejected
from slipstream.telemetry.sinkfeed import Dedup, Envelope, SinkSubscriber, read_retained, retained_path

ROOT = Path(__file__).resolve().parent.parent
PEER = str(Path(__file__).with_name("sink_peer.py"))
MINUTE_NS = 60 * 1_000_000_000


class Stat(msgspec.Struct, tag="Stat", tag_field="type"):
    position: int
    messages: int


class Score(msgspec.Struct, tag="Score", tag_field="type"):
    player: str
    points: int


class Peer:
    """A child process in its own process group (a Spark driver takes its JVM and Python workers with
    it when the group is killed); stdout lines read on a thread, so every wait has a bound."""

    def __init__(self, *args: str, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self._log = log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, PEER, *args], stdout=subprocess.PIPE, stderr=self._log, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log = log
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith(prefix):
                return line
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        raise AssertionError(f"peer printed no {prefix!r} within {timeout} s:\n{tail}")

    def kill(self) -> None:
        """SIGKILL to the whole tree: the Python driver, its JVM, and PySpark's worker daemon with the
        workers it forked (the daemon makes a process group of its own, so killing ours is not enough)."""
        if self.proc.poll() is None:
            tree = _descendants(self.proc.pid)
            for pgid in {os.getpgid(pid) for pid in tree if _alive(pid)} | {self.proc.pid}:
                with _suppress():
                    os.killpg(pgid, signal.SIGKILL)
            for pid in tree:
                with _suppress():
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()


def _alive(pid: int) -> bool:
    try:
        os.getpgid(pid)
    except ProcessLookupError:
        return False
    return True


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it, from /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with _suppress():
                stat = (entry / "stat").read_text()
                children[int(stat.rpartition(")")[2].split()[1])].append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


@contextmanager
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    try:
        yield made
    finally:
        for peer in made:
            with _suppress():
                peer.kill()


@contextmanager
def _suppress() -> Iterator[None]:
    with suppress(ProcessLookupError, FileNotFoundError, subprocess.TimeoutExpired):
        yield


class Polled:
    """A :class:`SinkSubscriber` polled on a thread: records applied per key, batches completed."""

    def __init__(self, context: Context, stream_id: int, key: Any, *, retained: bool = True) -> None:
        self.applied: collections.Counter[Any] = collections.Counter()
        self.batches: list[tuple[str, int, int]] = []
        self.feed = SinkSubscriber(
            context, "aeron:ipc", stream_id, on_record=lambda p, e: self.applied.update([key(p)]),
            on_batch=lambda e, records: self.batches.append((e.query, e.batch, len(records))), retained=retained,
        )  # fmt: skip
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._paused.is_set() or self.feed.poll(1024) == 0:
                time.sleep(0.0005)

    def pause(self) -> None:
        """Take no more records in (after the poll under way): a publisher held by the transport's flow
        control then gets at most its window ahead of what was read."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def wait(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{what}: applied {sum(self.applied.values())}, {self.batches}"
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.feed.close()


def _record_stats(recording: Path, rows: int) -> None:
    with Recorder(recording, writer_id="stats") as recorder:
        for i in range(rows):
            recorder.record(StreamStats(1_000 + i, "aeron:ipc", 1, 7, "pub", i, i + 1, 32))


# -- the envelope and the receiver's bookkeeping ---------------------------------------------------------


def test_every_record_is_numbered_and_a_repeat_is_not_fresh() -> None:
    from slipstream.pipeline.sink import with_envelope

    rows = [msgspec.msgpack.encode({"player": f"p{i}", "points": i, "type": "Score"}) for i in range(20)]
    records = with_envelope(rows, "q1", 7)
    assert [msgspec.msgpack.decode(r, type=Score) for r in records] == [Score(f"p{i}", i) for i in range(20)]
    envelopes = [msgspec.msgpack.decode(r, type=Envelope) for r in records]
    assert [(e.query, e.batch, e.seq, e.count) for e in envelopes] == [("q1", 7, i, 20) for i in range(20)]
    dedup = Dedup()
    assert [dedup.fresh(e) for e in envelopes[:5]] == [True] * 5
    assert [dedup.fresh(e) for e in envelopes] == [False] * 5 + [True] * 15  # a replay from its start
    assert dedup.fresh(Envelope("q2", 0, 0, 1)) and dedup.repeats == 5  # another query has its own numbers


def test_a_batch_write_repeated_with_the_same_ids_is_applied_once(spark: Any, driver: Any, driver_dir: Path) -> None:
    """A batch write named by ``queryId`` / ``batchId`` (what a ``foreachBatch`` retry repeats): the
    second write of the same batch reaches the subscriber and is dropped by it."""
    df = spark.createDataFrame([(f"player{i}", i) for i in range(500)], "player string, points long").repartition(3)
    options = {"channel": "aeron:ipc", "stream": "2101", "dir": str(driver_dir), "type": "Score", "queryId": "job-1"}
    with Context(driver_dir, driver="external") as context:
        polled = Polled(context, 2101, lambda p: msgspec.msgpack.decode(p, type=Score).points, retained=False)
        try:
            for _ in range(2):
                df.write.format("slipstream").mode("append").options(**options).option("batchId", "3").save()
            polled.wait(lambda: polled.feed.messages >= 500, 30, "first write")
            time.sleep(0.3)
        finally:
            polled.close()
    assert polled.applied == collections.Counter(range(500))
    assert polled.batches == [("job-1", 3, 500)]


# -- exactly once across a kill during a publish ---------------------------------------------------------


@pytest.mark.slow
def test_query_killed_during_a_publish_and_restarted_applies_each_row_once(
    driver: Any, driver_dir: Path, tmp_path: Path
) -> None:
    """The issue's reproduction: a streaming query in a child process (its own JVM) publishes a
    120,000-row batch; it is killed with SIGKILL, whole process group, once the receiver has part of the
    batch (the commit has not finished: no ``published`` status), and restarted from its checkpoint.
    Spark replays the batch; the receiver applies every row exactly once."""
    rows = 120_000
    recording, checkpoint = tmp_path / "rec", tmp_path / "checkpoint"
    _record_stats(recording, rows)
    args = ("query", str(recording), str(checkpoint), str(driver_dir), "2102")
    status = retained_path(driver_dir, "aeron:ipc", 2102).with_suffix(".status")
    with Context(driver_dir, driver="external") as context, peers() as running:
        polled = Polled(context, 2102, lambda p: msgspec.msgpack.decode(p, type=Stat).position, retained=False)
        try:
            running.append(Peer(*args, log=tmp_path / "query-1.log"))
            running[0].expect("started", 120)
            polled.wait(lambda: polled.feed.applied >= 10_000, 120, "first run")
            # The receiver stops reading while the process tree is walked and killed: the publisher, held by
            # flow control, gets at most the publication's window (half the test driver's 1 MiB IPC term)
            # ahead of it and cannot finish the batch meanwhile. (Reading on, it once did, in a slow phase of
            # the VM: the commit ended before the kill.)
            polled.pause()
            seen_before_kill = polled.feed.messages
            running[0].kill()
            assert seen_before_kill < rows, "the publish finished before the kill: nothing was tested"
            assert not status.exists(), status.read_text()  # killed before the commit finished
            polled.resume()
            kept = read_retained(retained_path(driver_dir, "aeron:ipc", 2102))
            assert kept is not None and kept.batch == 0 and len(kept.records) == rows
            running.append(Peer(*args, log=tmp_path / "query-2.log"))
            running[1].expect("done", 180)
            polled.wait(lambda: polled.feed.applied >= rows, 60, "after the restart")
            time.sleep(0.5)  # a repeat applied would show now
        finally:
            polled.close()
    assert len(polled.applied) == rows and set(polled.applied.values()) == {1}, "a row applied twice or never"
    assert polled.feed.messages > rows, "the replay republished the batch: the receiver dropped the repeats"
    assert polled.feed.dedup.repeats == polled.feed.messages - rows
    assert json.loads(status.read_text())["note"] == "published"
    print(f"received {polled.feed.messages} messages for {rows} rows; applied each once "
          f"({seen_before_kill} before the kill)")  # fmt: skip


# -- no subscriber ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_no_subscriber_does_not_kill_the_query(spark: Any, driver: Any, driver_dir: Path, tmp_path: Path) -> None:
    """A subscriber that comes back within ``receiverTimeout`` gets the batch over the stream; a batch
    nobody receives in time is retained (the status says so), the query goes on, and a subscriber that
    starts afterwards gets that batch from the retained file."""
    recording, checkpoint = tmp_path / "rec", tmp_path / "checkpoint"
    _record_stats(recording, 100)
    options = {"channel": "aeron:ipc", "stream": "2103", "dir": str(driver_dir), "type": "Stat",
               "connectTimeout": "1", "receiverTimeout": "4"}  # fmt: skip
    status = retained_path(driver_dir, "aeron:ipc", 2103).with_suffix(".status")
    query = (
        spark.readStream.format("slipstream").option("kind", "stream_stats").load(str(recording))
        .select("position", "messages").writeStream.format("slipstream").options(**options)
        .option("checkpointLocation", str(checkpoint)).trigger(processingTime="0.5 seconds").start()
    )  # fmt: skip
    try:
        time.sleep(2.5)  # the first batch's commit is waiting, past connectTimeout
        assert query.exception() is None and query.isActive
        with Context(driver_dir, driver="external") as context:
            late = Polled(context, 2103, lambda p: msgspec.msgpack.decode(p, type=Stat).position, retained=False)
            try:
                late.wait(lambda: late.feed.applied >= 100, 20, "a subscriber back within receiverTimeout")
            finally:
                late.close()
        assert late.applied == collections.Counter(range(100))
        deadline = time.monotonic() + 20
        while not any(progress["batchId"] == 0 for progress in query.recentProgress):
            assert time.monotonic() < deadline, "batch 0 did not complete"
            time.sleep(0.05)
        _record_more(recording, 100, 150)  # batch 1: nobody subscribes
        deadline = time.monotonic() + 30
        while not (status.exists() and json.loads(status.read_text())["batch"] == 1):
            assert query.exception() is None, query.exception()  # the old sink failed the query here
            assert time.monotonic() < deadline, "batch 1 was not committed"
            time.sleep(0.1)
        note = json.loads(status.read_text())["note"]
        assert note.startswith("not published") and "receiverTimeout" in note and "retained" in note, note
        assert query.exception() is None and query.isActive
        with Context(driver_dir, driver="external") as context:
            afterwards = Polled(context, 2103, lambda p: msgspec.msgpack.decode(p, type=Stat).position)
            afterwards.close()
        assert afterwards.applied == collections.Counter(range(100, 150))
        assert afterwards.batches and afterwards.batches[0][1:] == (1, 50)
    finally:
        query.stop()


def test_publish_outlasts_a_media_driver_restart_and_gives_up_after_receiver_timeout(driver_dir: Path) -> None:
    """A server restarting takes its embedded driver with it: the commit retries the driver as well as
    the subscriber, and only ``receiverTimeout`` ends the wait (with an error naming it)."""
    from slipstream import DriverConfig, MediaDriver
    from slipstream.pipeline.sink import NoReceiverError, _SinkOptions, publish, with_envelope

    options = {"channel": "aeron:ipc", "stream": "2105", "dir": str(driver_dir), "connectTimeout": "0.5"}
    records = with_envelope([msgspec.msgpack.encode({"n": i}) for i in range(10)], "q", 0)
    started = time.monotonic()
    with pytest.raises(NoReceiverError, match="receiverTimeout"):
        publish(records, _SinkOptions.parse({**options, "receiverTimeout": "1"}))
    assert 1 <= time.monotonic() - started < 5
    received: list[int] = []
    up = threading.Event()

    def server_comes_back() -> None:
        time.sleep(1.5)  # longer than connectTimeout
        driver = MediaDriver(DriverConfig(directory=driver_dir)).launch_embedded()
        try:
            with Context(driver_dir, driver="external") as context:
                subscription = context.add_subscription("aeron:ipc", 2105)
                up.set()
                deadline = time.monotonic() + 20
                while len(received) < 10 and time.monotonic() < deadline:
                    subscription.poll(lambda b, h: received.append(msgspec.msgpack.decode(b)["n"]), 10)
                    time.sleep(0.001)
        finally:
            driver.close()

    thread = threading.Thread(target=server_comes_back, daemon=True)
    thread.start()
    assert publish(records, _SinkOptions.parse({**options, "receiverTimeout": "20"})) == 10
    thread.join(30)
    assert up.is_set() and received == list(range(10))


def _record_more(recording: Path, start: int, stop: int) -> None:
    with Recorder(recording, writer_id=f"more-{start}") as recorder:
        for i in range(start, stop):
            recorder.record(StreamStats(1_000 + i, "aeron:ipc", 1, 7, "pub", i, i + 1, 32))


# -- the abuse list: windowed, versioned, retained -------------------------------------------------------


def _refusals(recording: Path, refusals: list[tuple[str, int]], writer: str = "server") -> None:
    with Recorder(recording, writer_id=writer) as recorder:
        for address, timestamp_ns in refusals:
            recorder.record(handshake_rejected(timestamp_ns, address=f"{address}:40000", reason="ip_filter"))


def test_abuse_list_counts_the_window_not_all_time_and_says_when_entries_expire(spark: Any, tmp_path: Path) -> None:
    """Threshold 3, window 10 min (1-min buckets), the latest refusal at minute 30: a host with 5
    refusals at minute 0-4 and 2 now is not listed (all-time it would be); a host with refusals at
    minutes 22, 25, 28 and 30 is, until its second-newest needed minute (25) leaves the window."""
    recording = tmp_path / "rec"
    t0 = 1_700_000_000 * 1_000_000_000 // MINUTE_NS * MINUTE_NS
    old = [("10.0.0.1", t0 + m * MINUTE_NS) for m in range(5)] + [("10.0.0.1", t0 + 29 * MINUTE_NS)] * 2
    recent = [("10.0.0.2", t0 + m * MINUTE_NS + 5) for m in (22, 25, 28, 30)]
    _refusals(recording, old + recent)
    from slipstream.pipeline.jobs import abuse_list, load

    rows = [r.asDict() for r in abuse_list(load(spark, recording, "connection_events"), 3).collect()]
    assert [(r["address"], r["rejections"]) for r in rows] == [("10.0.0.2", 4)]
    # Needed to reach 3, newest first: minutes 30, 28, 25; minute 25 leaves a 10-min window at minute 36.
    assert rows[0]["expires_ns"] == t0 + 36 * MINUTE_NS
    assert rows[0]["last_ns"] == t0 + 30 * MINUTE_NS + 5


@pytest.mark.slow
def test_a_server_starting_after_the_last_batch_has_the_abuse_list_within_a_second(
    spark: Any, driver: Any, driver_dir: Path, tmp_path: Path
) -> None:
    """The live query publishes the abuse list and stops having new data; a server process started
    afterwards (an ``AbuseListSubscriber``) refuses the listed host within a second, and so does the
    same server restarted."""
    from slipstream.pipeline.live import start_abuse_list_query
    from slipstream.pipeline.sink import read_status

    recording = tmp_path / "rec"
    now = time.time_ns()
    _refusals(recording, [("10.1.1.1", now - i * 1_000_000_000) for i in range(6)] + [("10.2.2.2", now)])
    query = start_abuse_list_query(
        spark, recording, channel="aeron:ipc", stream_id=2104, checkpoint=tmp_path / "checkpoint",
        driver_dir=driver_dir, threshold=5, trigger_s=0.5, receiver_timeout_s=1.0,
    )  # fmt: skip
    try:
        query.processAllAvailable()
        assert query.exception() is None
        status = read_status({"dir": str(driver_dir), "channel": "aeron:ipc", "stream": "2104"})
        assert status is not None and status["batch"] == 0 and status["note"].startswith("not published"), status
    finally:
        query.stop()
    with peers() as running:
        for run in range(2):  # a server, then the same server restarted
            running.append(Peer("server", str(driver_dir), "2104", "10.1.1.1:5555", log=tmp_path / f"server-{run}.log"))
            got = json.loads(running[-1].expect("{", 60))
            running[-1].kill()
            assert "error" not in got, got
            print(
                f"server run {run}: listed {got['seconds']:.3f} s after its subscriber was made "
                f"({got['since_start']:.3f} s from start-up, imports included), version {got['version']}"
            )
            assert got["seconds"] < 1.0, got
            assert got["version"][1] == 0 and list(got["entries"]) == ["10.1.1.1"]
            rejections, expires_ns = got["entries"]["10.1.1.1"]
            assert rejections == 6 and expires_ns > now
