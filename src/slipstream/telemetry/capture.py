"""Stream capture (an Aeron-Archive-like recording of any stream) and the driver-files sampler.

``StreamCapture`` is one more subscriber on the stream: it copies each whole message into a row and
hands the poll's rows to the recorder in one call; Arrow and disk happen on the recorder's thread.
A capture that falls behind holds the publisher back only as any slow subscriber would (flow
control), which is what the recording-overhead benchmark measures.

``DriverSampler`` reads the driver's files (counters, loss report, error log) on a thread at a
fixed interval: every counter each time, loss and error entries when their count changed.
"""

from __future__ import annotations

import logging
import threading
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..client import Context, FragmentAssembler, Header, Subscription
from ..files.observe import TYPE_NAMES as COUNTER_TYPE_NAMES
from ..files.observe import NoDriverError, counters, errors, loss, parse_stream_label
from .recorder import Recorder
from .records import CapturedMessage, CounterSample, ErrorSample, KindSchema, LossSample, typed_schema

log = logging.getLogger("slipstream.telemetry")

Decoder = Callable[[bytes], object | None]
"""Payload -> a registered message (msgspec Struct or dataclass), or None when it is not one."""

_CAPTURED = CapturedMessage.SCHEMA


def msgspec_decoder(*types: type[Any]) -> Decoder:
    """A decoder for msgpack payloads of tagged msgspec Structs; anything else decodes to None."""
    import msgspec

    if not types:
        raise ValueError("msgspec_decoder needs at least one message type")
    decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
        typing.Union[types] if len(types) > 1 else types[0]  # noqa: UP007 - a runtime union of types
    )

    def decode(payload: bytes) -> object | None:
        try:
            message: object = decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        return message

    return decode


class StreamCapture:
    """Records every message of ``channel``/``stream_id`` into ``recorder`` (kind ``captured``); with a
    decoder, recognised messages also go to ``typed.<Type>`` with their fields as typed columns."""

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        recorder: Recorder,
        *,
        decoder: Decoder | None = None,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.recorder = recorder
        self.decoder = decoder
        self.messages = 0
        self.bytes = 0
        self.dropped = 0
        """Messages the recorder refused (its pending-row bound was reached)."""
        self._typed: dict[type[Any], tuple[KindSchema, tuple[str, ...]]] = {}
        self._rows: list[tuple[object, ...]] = []
        self._now = 0
        self.subscription: Subscription = context.add_subscription(channel, stream_id)
        self._assembler = FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, header: Header) -> None:
        payload = bytes(buffer)
        self._rows.append(
            (self._now, self.channel, self.stream_id, header.session_id, header.position, len(payload), payload, None)
        )

    def poll(self, fragment_limit: int = 256) -> int:
        """Poll once; returns the fragments read. Rows go to the recorder in one batch."""
        self._now = time.time_ns()
        fragments = self.subscription.poll(self._assembler, fragment_limit)
        if self._rows:
            rows, self._rows = self._rows, []
            self.messages += len(rows)
            self.bytes += sum(typing.cast(int, row[5]) for row in rows)
            if self.decoder is not None:
                rows = self._decode(rows)
            if not self.recorder.extend(_CAPTURED, rows):
                self.dropped += len(rows)
        return fragments

    def _decode(self, rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
        assert self.decoder is not None
        out: list[tuple[object, ...]] = []
        for row in rows:
            message = self.decoder(typing.cast(bytes, row[6]))
            if message is None:
                out.append(row)
                continue
            typed = self._typed.get(type(message))
            if typed is None:
                schema = typed_schema(type(message))
                typed = (schema, schema.names[6:])  # after the six capture columns
                self._typed[type(message)] = typed
            schema, fields = typed
            self.recorder.append(schema, (*row[:6], *(getattr(message, name) for name in fields)))
            out.append((*row[:7], schema.kind.removeprefix("typed.")))
        return out

    def run(self, stop: threading.Event, *, idle_s: float = 0.0005) -> None:
        """Poll until ``stop`` is set, sleeping ``idle_s`` when there was nothing to read."""
        while not stop.is_set():
            if self.poll() == 0:
                stop.wait(idle_s)

    def close(self) -> None:
        self.subscription.close()


class DriverSampler:
    """Samples a driver's counters, loss report and error log into a recorder every ``interval_s``."""

    def __init__(self, recorder: Recorder, driver_dir: str | Path, *, interval_s: float = 1.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive: {interval_s}")
        self.recorder = recorder
        self.driver_dir = Path(driver_dir)
        self.interval_s = interval_s
        self.samples = 0
        self._loss_seen: dict[tuple[int, int, str, str], int] = {}
        self._errors_seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Take one sample now (the thread calls this; tests may too)."""
        now = time.time_ns()
        try:
            snapshot = counters(self.driver_dir)
            losses = loss(self.driver_dir)
            logged = errors(self.driver_dir)
        except NoDriverError:
            return
        rows: list[tuple[object, ...]] = []
        for info in snapshot:
            label = parse_stream_label(info.label)
            rows.append(
                CounterSample(
                    now,
                    info.counter_id,
                    info.type_id,
                    COUNTER_TYPE_NAMES.get(info.type_id, str(info.type_id)),
                    info.label,
                    info.value,
                    info.registration_id,
                    label.session_id if label else None,
                    label.stream_id if label else None,
                    label.channel if label else None,
                ).row()
            )
        self.recorder.extend(CounterSample.SCHEMA, rows)
        for entry in losses:
            key = (entry.session_id, entry.stream_id, entry.channel, entry.source)
            if self._loss_seen.get(key) != entry.observation_count:
                self._loss_seen[key] = entry.observation_count
                self.recorder.record(
                    LossSample(
                        now,
                        entry.observation_count,
                        entry.total_bytes_lost,
                        entry.first_observation_ms,
                        entry.last_observation_ms,
                        entry.session_id,
                        entry.stream_id,
                        entry.channel,
                        entry.source,
                    )
                )
        for error in logged:
            if self._errors_seen.get(error.text) != error.observation_count:
                self._errors_seen[error.text] = error.observation_count
                self.recorder.record(
                    ErrorSample(
                        now, error.observation_count, error.first_observation_ms, error.last_observation_ms, error.text
                    )
                )
        self.samples += 1

    def start(self) -> DriverSampler:
        self._thread = threading.Thread(target=self._run, name="slipstream-driver-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:
                log.exception("driver sampler: sample failed")

    def stop(self) -> None:
        """Stop the thread after one last sample, so a short run still records the final values."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.sample()
        except Exception:
            log.exception("driver sampler: last sample failed")
