"""Receiving what the ``slipstream`` Spark sink publishes: each record applied once, whole batches as snapshots.

The sink (:mod:`slipstream.pipeline.sink`) adds four fields to every message it publishes, after the
row's own columns: ``_query`` (the streaming query's id, stable across restarts from its checkpoint),
``_batch`` (Spark's batch id), ``_seq`` (the record's place in its batch) and ``_count`` (the batch's
records). A batch Spark replays after a crash is republished with the same three numbers, so a receiver
that remembers, per query id, the last ``(batch, seq)`` it applied drops the repeats: :class:`Dedup`
does that, and :class:`SinkSubscriber` wraps it around a subscription. Decoders of the row's own type
ignore the extra fields (msgspec drops unknown fields unless told otherwise).

Spark runs a batch only when new data arrives, and a stream keeps nothing for subscribers that join
later, so the sink also retains its latest batch in the driver directory (:func:`retained_path`,
written atomically before it publishes). A subscriber reads it first, then the stream; the version
``(query, batch)`` on both says which is newer. It lives on this floor so that servers (the network
layer) can use it without importing the pipeline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from ..client import Context, FragmentAssembler, Header, Subscription
from .segments import atomic_file

QUERY_FIELD = "_query"
BATCH_FIELD = "_batch"
SEQ_FIELD = "_seq"
COUNT_FIELD = "_count"
ENVELOPE_FIELDS = (QUERY_FIELD, BATCH_FIELD, SEQ_FIELD, COUNT_FIELD)
"""The fields the sink adds to each message; a column of the same name is refused by the sink."""

RETAINED_DIR = "retained"
"""Subdirectory of the driver directory holding retained batches (a driver never removes what it did not make)."""


class Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Where a record sits: query id, batch id, sequence within the batch, records in the batch."""

    query: str = msgspec.field(name=QUERY_FIELD)
    batch: int = msgspec.field(name=BATCH_FIELD)
    seq: int = msgspec.field(name=SEQ_FIELD)
    count: int = msgspec.field(name=COUNT_FIELD)


class Retained(msgspec.Struct, frozen=True):
    """A batch as retained for late subscribers: its version and the exact messages published."""

    query: str
    batch: int
    written_ns: int
    records: list[bytes]
    channel: str = ""
    stream_id: int = 0


def retained_path(directory: str | Path, channel: str, stream_id: int) -> Path:
    """Where the sink retains the latest batch of ``channel`` / ``stream_id`` in a driver directory.

    Keyed by the channel string as given (publisher and subscriber must spell it the same way)."""
    digest = hashlib.sha256(channel.encode()).hexdigest()[:16]
    return Path(directory) / RETAINED_DIR / f"{stream_id}-{digest}.msgpack"


def read_retained(path: Path) -> Retained | None:
    """The retained batch at ``path``; None when there is none (or it is not one: never raised)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return msgspec.msgpack.decode(data, type=Retained)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_retained(path: Path, retained: Retained) -> None:
    """Replace the retained batch atomically: a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, fsync=False) as sink:  # in the driver directory: shared memory, nothing to sync
        sink.write(msgspec.msgpack.encode(retained))


class Dedup:
    """Remembers, per query id, the last ``(batch, seq)`` applied; :meth:`fresh` says whether a record is new.

    The sink publishes a batch's records in sequence order and republishes a replayed batch from its
    start, so "newer than the last applied" is exactly "not applied before". ``positions`` can be
    saved and passed back to survive a restart of the receiver."""

    def __init__(self, positions: dict[str, tuple[int, int]] | None = None) -> None:
        self.positions: dict[str, tuple[int, int]] = dict(positions or {})
        self.repeats = 0
        """Records dropped because they were applied before."""

    def fresh(self, envelope: Envelope) -> bool:
        """True (and remembered) when ``envelope`` is past the last record applied for its query."""
        position = (envelope.batch, envelope.seq)
        last = self.positions.get(envelope.query)
        if last is not None and position <= last:
            self.repeats += 1
            return False
        self.positions[envelope.query] = position
        return True


RecordCallback = Callable[[memoryview | bytes, Envelope | None], object]
BatchCallback = Callable[[Envelope, list[bytes]], object]


class SinkSubscriber:
    """A subscription to a stream the ``slipstream`` sink publishes: repeats dropped, batches assembled.

    ``on_record(payload, envelope)`` is called once per record (``envelope`` None for a message
    without one: it cannot be deduplicated). ``on_batch(envelope, records)`` is called once per
    complete batch, in the order they complete, with the batch's messages in sequence order: the
    snapshot a complete-mode query published. With ``retained`` (the default), the retained batch in
    the driver directory is applied first, so a subscriber that starts after the last batch has it at
    once; a batch joined midway is completed from the retained file when it holds that batch.
    Call :meth:`poll` from the application's loop, or :meth:`start` a thread that does.
    """

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        *,
        on_record: RecordCallback | None = None,
        on_batch: BatchCallback | None = None,
        retained: bool = True,
        positions: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        # Subscribe before reading the retained file: a batch written after the read is then on the stream.
        self.subscription: Subscription = context.add_subscription(channel, stream_id)
        self.path = retained_path(context.directory, channel, stream_id)
        self.on_record = on_record
        self.on_batch = on_batch
        self.dedup = Dedup(positions)
        self.messages = 0
        """Messages received, repeats included."""
        self.applied = 0
        """Records passed to ``on_record`` (from the stream or the retained file)."""
        self.incomplete = 0
        """Batches joined midway that the retained file could not complete."""
        self.version: tuple[str, int] | None = None
        """The last batch passed to ``on_batch``: (query id, batch id)."""
        self._envelope = msgspec.msgpack.Decoder(Envelope)
        self._assembler = FragmentAssembler(self._on_fragment)
        self._batch: Envelope | None = None
        self._records: list[bytes] = []
        self._whole = False
        self._last_batch: dict[str, int] = {}
        if retained:
            self.load_retained()

    def load_retained(self, at_least: tuple[str, int] | None = None) -> bool:
        """Apply the retained batch if it is new to this subscriber (and, with ``at_least``, of that
        query at that batch or later); True when it was applied."""
        kept = read_retained(self.path)
        if kept is None or not kept.records:
            return False
        if at_least is not None and (kept.query != at_least[0] or kept.batch < at_least[1]):
            return False
        if kept.batch <= self._last_batch.get(kept.query, -1):
            return False
        first = self._envelope.decode(kept.records[0])
        for record in kept.records:
            envelope = self._envelope.decode(record)
            if self.dedup.fresh(envelope):
                self._apply(record, envelope)
        self._complete(first, list(kept.records))
        return True

    def _on_fragment(self, buffer: memoryview, header: Header) -> None:
        self.messages += 1
        try:
            envelope = self._envelope.decode(buffer)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self._apply(buffer, None)
            return
        current = self._batch
        if current is None or (current.query, current.batch) != (envelope.query, envelope.batch):
            self._batch, self._records, self._whole = envelope, [], envelope.seq == 0
        elif envelope.seq != len(self._records):
            self._whole = self._whole and envelope.seq < len(self._records)  # a repeat keeps it whole
        if self._whole and envelope.seq == len(self._records):
            self._records.append(bytes(buffer))
        if self.dedup.fresh(envelope):
            self._apply(buffer, envelope)
        if envelope.seq == envelope.count - 1:
            self._end_of_batch(envelope)

    def _end_of_batch(self, envelope: Envelope) -> None:
        if envelope.batch <= self._last_batch.get(envelope.query, -1):
            return  # a replay of a batch already assembled
        if self._whole and len(self._records) == envelope.count:
            self._complete(envelope, self._records)
        elif not self.load_retained(at_least=(envelope.query, envelope.batch)):
            self.incomplete += 1
        self._batch, self._records, self._whole = None, [], False

    def _apply(self, payload: memoryview | bytes, envelope: Envelope | None) -> None:
        self.applied += 1
        if self.on_record is not None:
            self.on_record(payload, envelope)

    def _complete(self, envelope: Envelope, records: list[bytes]) -> None:
        self._last_batch[envelope.query] = envelope.batch
        self.version = (envelope.query, envelope.batch)
        if self.on_batch is not None:
            self.on_batch(envelope, records)

    def poll(self, fragment_limit: int = 256) -> int:
        """Read what has arrived; returns the fragments read."""
        return self.subscription.poll(self._assembler, fragment_limit)

    def close(self) -> None:
        """Close the subscription."""
        self.subscription.close()
