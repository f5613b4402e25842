"""The ``slipstream`` sink: Spark rows published onto a slipstream stream, each applied once by its receiver.

``df.write.format("slipstream").option("channel", ...).option("stream", ...).save()`` (and
``writeStream``) publishes each row as one msgpack message: a map of the row's columns, a type tag
(what a tagged ``msgspec.Struct`` decodes) and an envelope, ``_query``, ``_batch``, ``_seq``,
``_count`` (:mod:`slipstream.telemetry.sinkfeed`). Tasks only encode; the commit on the Spark driver
publishes, after every task succeeded, so a retried task publishes nothing twice.

Exactly once, end to end, is the sink and the receiver together. A streaming query's id is the one in
its checkpoint (``<checkpointLocation>/metadata``), stable across restarts, and a batch Spark replays
after a crash keeps its batch id; the commit writes the batch's messages to the retained file in the
driver directory before publishing, and a replay publishes those same bytes again. A receiver that
drops what it applied before (:class:`~slipstream.telemetry.sinkfeed.SinkSubscriber`) so applies each
record once, even when the query was killed halfway through a publish. A batch write has no query:
it takes the options ``queryId`` and ``batchId`` (default: a fresh uuid, batch 0).

A commit waits up to ``connectTimeout`` for a subscriber, then reconnects and waits again, up to
``receiverTimeout`` in all; then it goes on without publishing (the query lives on, the batch stays
retained for subscribers that start later, and the status file beside it says so) rather than fail
the query because a server is restarting.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from ..files.directory import default_directory
from ..telemetry.segments import atomic_file
from ..telemetry.sinkfeed import (
    BATCH_FIELD,
    COUNT_FIELD,
    ENVELOPE_FIELDS,
    QUERY_FIELD,
    SEQ_FIELD,
    Retained,
    read_retained,
    retained_path,
    write_retained,
)

log = logging.getLogger(__name__)


class SlipstreamSinkError(ValueError):
    """A bad write option of the ``slipstream`` data source; the message names it."""


DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_RECEIVER_TIMEOUT_S = 60.0
"""How long a commit keeps trying to reach a subscriber before it goes on with the batch retained only."""


def _seconds(options: Mapping[str, str], name: str, default: float) -> float:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SlipstreamSinkError(f"option {name!r}: expected seconds, got {text!r}") from None
    if value < 0:
        raise SlipstreamSinkError(f"option {name!r}: must be >= 0 seconds, got {text!r}")
    return value


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise SlipstreamSinkError(f"option {name!r}: expected true or false, got {text!r}")


def checkpoint_query_id(checkpoint: str | Path) -> str | None:
    """The streaming query id Spark keeps in ``checkpoint/metadata`` (stable across restarts from it);
    None when there is no such file yet, or it is not on a local file system."""
    path = Path(str(checkpoint).removeprefix("file:"))
    try:
        query_id = json.loads((path / "metadata").read_text()).get("id")
    except (OSError, ValueError):
        return None
    return str(query_id) if query_id else None


@dataclass(frozen=True)
class _SinkOptions:
    channel: str
    stream_id: int
    directory: str | None
    type_name: str
    tag_field: str
    connect_timeout_s: float
    receiver_timeout_s: float
    state_path: str | None
    retain: bool
    query_id: str | None
    batch_id: int
    checkpoint: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _SinkOptions:
        channel = options.get("channel")
        if not channel:
            raise SlipstreamSinkError("option 'channel': give the channel URI to publish on, e.g. aeron:ipc")
        stream = options.get("stream")
        try:
            stream_id = int(stream)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SlipstreamSinkError(f"option 'stream': expected an integer stream id, got {stream!r}") from None
        batch = options.get("batchId", "0")
        try:
            batch_id = int(batch)
        except ValueError:
            raise SlipstreamSinkError(f"option 'batchId': expected an integer, got {batch!r}") from None
        return cls(
            channel,
            stream_id,
            options.get("dir") or None,
            options.get("type", "Row"),
            options.get("tagField", "type"),
            _seconds(options, "connectTimeout", DEFAULT_CONNECT_TIMEOUT_S),
            _seconds(options, "receiverTimeout", DEFAULT_RECEIVER_TIMEOUT_S),
            options.get("sinkState") or None,
            _flag(options, "retain", True),
            options.get("queryId") or None,
            batch_id,
            options.get("checkpointLocation") or None,
        )

    @property
    def retained(self) -> Path:
        """The retained batch's file in the driver directory."""
        return retained_path(self.directory or default_directory(), self.channel, self.stream_id)

    def stream_query_id(self) -> str:
        """The streaming query's id: option ``queryId``, else the one in the checkpoint."""
        if self.query_id is not None:
            return self.query_id
        found = checkpoint_query_id(self.checkpoint) if self.checkpoint else None
        if found is None:
            raise SlipstreamSinkError(
                "option 'queryId': the sink needs the streaming query's id to number what it publishes; "
                f"it reads it from checkpointLocation's metadata ({self.checkpoint!r}), which was not found "
                "(set option 'checkpointLocation' to a local path, or option 'queryId')"
            )
        return found


@dataclass(frozen=True)
class _Encoded(WriterCommitMessage):
    payloads: list[bytes]


def _encode_rows(rows: Iterator[Any], options: _SinkOptions) -> _Encoded:
    encoder = msgspec.msgpack.Encoder()
    payloads = []
    for row in rows:
        message = row.asDict(recursive=True)
        if options.tag_field in message:
            raise SlipstreamSinkError(
                f"column {options.tag_field!r} clashes with the type tag; rename it or set option 'tagField'"
            )
        clash = [name for name in ENVELOPE_FIELDS if name in message]
        if clash:
            raise SlipstreamSinkError(f"columns {clash} clash with the sink's envelope fields; rename them")
        message[options.tag_field] = options.type_name
        payloads.append(encoder.encode(message))
    return _Encoded(payloads)


def _map_header(payload: bytes) -> tuple[int, int]:
    """(entries, header length) of a msgpack map."""
    first = payload[0]
    if first & 0xF0 == 0x80:
        return first & 0x0F, 1
    if first == 0xDE:
        return int.from_bytes(payload[1:3], "big"), 3
    if first == 0xDF:
        return int.from_bytes(payload[1:5], "big"), 5
    raise SlipstreamSinkError("a row did not encode as a msgpack map")


def with_envelope(payloads: Sequence[bytes], query_id: str, batch_id: int) -> list[bytes]:
    """Each payload (a msgpack map) with the envelope's four entries appended: the map header is
    rewritten, the row's bytes are kept."""
    encoder = msgspec.msgpack.Encoder()
    count = len(payloads)
    out = []
    for seq, payload in enumerate(payloads):
        entries, skip = _map_header(payload)
        tail = encoder.encode({QUERY_FIELD: query_id, BATCH_FIELD: batch_id, SEQ_FIELD: seq, COUNT_FIELD: count})
        total = entries + len(ENVELOPE_FIELDS)
        header = bytes([0x80 | total]) if total < 16 else b"\xde" + total.to_bytes(2, "big")
        out.append(header + payload[skip:] + tail[1:])  # the tail's fixmap header (4 entries) dropped
    return out


class NoReceiverError(RuntimeError):
    """No subscriber could be reached on the sink's stream within ``receiverTimeout``."""


def publish(records: Sequence[bytes], options: _SinkOptions) -> int:
    """Publish ``records`` in order on the sink's channel; returns how many were published.

    An attempt connects to the media driver, waits up to ``connectTimeout`` for a subscriber and
    offers through back-pressure; an attempt that loses its subscriber, its driver or stalls starts
    over from the first record (receivers drop what they have), until ``receiverTimeout`` has passed:
    then :class:`NoReceiverError`."""
    from ..client import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, Context, result_name
    from ..errors import SlipstreamError

    if not records:
        return 0
    give_up = time.monotonic() + options.receiver_timeout_s
    where = f"{options.channel} stream {options.stream_id}"
    why = "no attempt made"
    while True:
        try:
            # A driver that is not there yet (a server restarting with its embedded driver) is given up
            # on within the attempt, not after Context's own 10 s.
            patience = max(1.0, min(options.connect_timeout_s, give_up - time.monotonic()))
            with Context(options.directory, driver="external", driver_timeout_s=patience) as context:
                publication = context.add_exclusive_publication(options.channel, options.stream_id)
                started = time.monotonic()
                deadline = min(started + options.connect_timeout_s, give_up)
                while not publication.is_connected and time.monotonic() < deadline:
                    time.sleep(0.005)
                if not publication.is_connected:
                    why = f"no subscriber (each attempt waits up to {options.connect_timeout_s} s: 'connectTimeout')"
                else:
                    sent = 0
                    stalled = time.monotonic() + options.connect_timeout_s
                    while sent < len(records):
                        result = publication.offer(records[sent])
                        if result >= 0:
                            sent += 1
                            stalled = time.monotonic() + options.connect_timeout_s
                        elif time.monotonic() < stalled and (
                            result in (BACK_PRESSURED, ADMIN_ACTION)
                            or (result == NOT_CONNECTED and publication.is_connected)
                        ):
                            time.sleep(0.0002)
                        else:
                            why = f"offer {result_name(result)} after {sent} of {len(records)} records"
                            break
                    publication.close()
                    if sent == len(records):
                        return sent
        except (SlipstreamError, OSError) as exc:  # no driver (yet), or it went away: try again
            why = f"media driver in {options.directory or default_directory()}: {exc}"
        if time.monotonic() >= give_up:
            waited = f"gave up after {options.receiver_timeout_s} s (option 'receiverTimeout')"
            raise NoReceiverError(f"{where}: {why}; {waited}")
        time.sleep(0.1)


def _status(options: _SinkOptions, query_id: str, batch_id: int, records: int, note: str) -> None:
    """One line about the last commit beside the retained file: what an operator (or a test) reads."""
    path = options.retained.with_suffix(".status")
    line = {"query": query_id, "batch": batch_id, "records": records, "note": note, "time_ns": time.time_ns()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, fsync=False) as sink:
        sink.write((json.dumps(line) + "\n").encode())


def _read_status(options: _SinkOptions) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = json.loads(options.retained.with_suffix(".status").read_text())
    except (OSError, ValueError):
        return None
    return status


def read_status(options: Mapping[str, str]) -> dict[str, Any] | None:
    """The last commit's status for a sink's options (``dir``, ``channel``, ``stream``), or None."""
    return _read_status(_SinkOptions.parse(options))


def _published_before(options: _SinkOptions, query_id: str, batch_id: int) -> bool:
    if options.state_path is None:
        status = _read_status(options)
        if status is None or status["note"] != "published":
            return False
        return bool((status["query"], status["batch"]) == (query_id, batch_id))
    try:
        text = Path(options.state_path).read_text().split()
    except FileNotFoundError:
        return False
    if len(text) == 2:  # "<query id> <batch id>"
        return text[0] == query_id and int(text[1]) >= batch_id
    return bool(text) and int(text[0]) >= batch_id  # a state file of before the envelope: a batch id alone


def _remember_published(options: _SinkOptions, query_id: str, batch_id: int) -> None:
    if options.state_path is None:
        return
    path = Path(options.state_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, fsync=False) as sink:
        sink.write(f"{query_id} {batch_id}\n".encode())


def commit_batch(payloads: Sequence[bytes], options: _SinkOptions, query_id: str, batch_id: int) -> None:
    """Publish one batch, exactly once for a deduplicating receiver: retained first (a replay
    republishes the retained bytes, so every record keeps its sequence number), then published."""
    if _published_before(options, query_id, batch_id):
        return  # the whole batch went out before a restart: nothing to repeat
    records: list[bytes] | None = None
    if options.retain:
        kept = read_retained(options.retained)
        if kept is not None and (kept.query, kept.batch) == (query_id, batch_id):
            records = kept.records  # a replay: the same bytes, the same sequence numbers
    if records is None:
        records = with_envelope(payloads, query_id, batch_id)
        if options.retain:
            write_retained(
                options.retained,
                Retained(query_id, batch_id, time.time_ns(), records, options.channel, options.stream_id),
            )
    try:
        publish(records, options)
    except NoReceiverError as exc:
        note = f"not published: {exc}" + ("; retained for subscribers that start later" if options.retain else "")
        log.warning("slipstream sink, batch %s of query %s: %s", batch_id, query_id, note)
        _status(options, query_id, batch_id, len(records), note)
        return
    _remember_published(options, query_id, batch_id)
    _status(options, query_id, batch_id, len(records), "published")


def _payloads(messages: list[WriterCommitMessage | None]) -> list[bytes]:
    return [p for m in messages if isinstance(m, _Encoded) for p in m.payloads]


class _BatchWriter(DataSourceWriter):
    def __init__(self, options: _SinkOptions) -> None:
        self.options = options
        # A batch write is its own query unless the caller names one (a foreachBatch, say, passing its batch id).
        self.query_id = options.query_id or str(uuid.uuid4())

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _encode_rows(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(_payloads(messages), self.options, self.query_id, self.options.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing was published: tasks only encode."""


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: _SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _encode_rows(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(_payloads(messages), self.options, self.options.stream_query_id(), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was published: tasks only encode."""
