"""Stream capture (an Aeron-Archive-like recording of any stream) and the driver-files sampler.

A capture has two halves that never share a CPU's time slice if they can help it. The hot side,
:class:`~slipstream.telemetry.rawcapture.RawCapture`, writes the stream's term bytes to raw files and
does nothing else. :class:`RawConverter` turns raw files into ``captured`` rows (and ``typed.<Type>``
rows with a decoder) for a recorder, vectorized with numpy, wherever CPU is cheap: the recorder's writer
thread (:class:`StreamCapture`, one process), a low-priority process (``slipstream record``), or the
recovery after a kill (:func:`recover_raw`). A raw file is deleted only once its rows are durable.

``DriverSampler`` reads the driver's files (counters, loss report, error log) on a thread at a
fixed interval: every counter each time, loss and error entries when their count changed.
"""

from __future__ import annotations

import logging
import threading
import time
import typing
from pathlib import Path
from typing import Any

from ..client import Context, Subscription
from ..files.observe import TYPE_NAMES as COUNTER_TYPE_NAMES
from ..files.observe import NoDriverError, counters, errors, loss, parse_stream_label
from .convert import Decoder, RawConverter, load_decoder
from .rawcapture import RAW_DIR, RawCapture
from .recorder import Recorder
from .records import CounterSample, ErrorSample, LossSample

log = logging.getLogger("slipstream.telemetry")

__all__ = ["Decoder", "DriverSampler", "RawConverter", "StreamCapture", "load_decoder", "msgspec_decoder"]


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
    decoder, recognised messages also go to ``typed.<Type>`` with their fields as typed columns.

    One process: a :class:`RawCapture` writes the term bytes into ``<writer_dir>/.raw/capture-<n>/``
    and the recorder's writer thread converts them before each flush (:class:`RawConverter`). Call
    :meth:`poll` (or :meth:`run`) from your thread. Nothing read is lost: a kill leaves raw files that
    the next recorder on the same root converts. When ``max_pending_bytes`` of raw files wait for
    conversion the capture stops reading, so a recorder that cannot keep up slows the publisher
    through flow control (like any slow subscriber). ``direct_io`` writes the raw files with
    ``O_DIRECT`` (see :mod:`~slipstream.telemetry.rawcapture`). ``slipstream record`` runs the same two
    halves in two processes, the converter at idle priority.
    """

    def __init__(
        self,
        context: Context,
        channel: str,
        stream_id: int,
        recorder: Recorder,
        *,
        decoder: Decoder | None = None,
        block_length_limit: int = 8 << 20,
        max_pending_bytes: int = 1 << 30,
        direct_io: bool = False,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.recorder = recorder
        self.decoder = decoder
        self.raw = RawCapture(
            context, channel, stream_id, new_capture_dir(recorder.writer_dir),
            block_length_limit=block_length_limit, max_pending_bytes=max_pending_bytes,
            flush_interval_s=recorder.config.flush_interval_s, fsync=recorder.config.fsync, direct_io=direct_io,
            on_rotate=lambda seq: recorder.request_flush(),
        )  # fmt: skip
        self.converter = RawConverter(self.raw.raw_dir, recorder, decoder=decoder)
        self.subscription: Subscription = self.raw.subscription
        recorder.add_flush_hook(self._flush_hook, after=self.converter.durable)

    @property
    def messages(self) -> int:
        """Messages converted and handed to the recorder so far (lags the stream by up to a flush)."""
        return self.converter.messages

    @property
    def bytes(self) -> int:
        return self.converter.bytes

    @property
    def dropped(self) -> int:
        """Messages the recorder refused."""
        return self.converter.dropped

    @property
    def backlogged_polls(self) -> int:
        """Polls skipped because ``max_pending_bytes`` of raw files waited for conversion."""
        return self.raw.backlogged_polls

    def poll(self, fragment_limit: int = 0) -> int:
        """Write what every image has new to the raw file; returns the bytes read (0 while backlogged)."""
        return self.raw.poll(fragment_limit)

    def _flush_hook(self) -> None:
        self.raw.rotate(notify=False)
        self.converter.flush_hook()

    def convert(self) -> None:
        """Convert what was read so far (the recorder's writer thread does this before each flush; call
        it yourself to see ``messages`` up to date)."""
        self.raw.rotate()
        self.converter.convert()

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set (see :meth:`RawCapture.run`: large polls, sleeps sized to the window)."""
        self.raw.run(stop)

    def close(self) -> None:
        """Stop capturing; what was read is converted and flushed now (unless the recorder is closed
        already: then the raw files stay for the next recorder's recovery)."""
        self.raw.close()
        if not self.recorder.closed:
            self.recorder.flush()
        self.recorder.remove_flush_hook(self._flush_hook)


def new_capture_dir(writer_dir: Path) -> Path:
    """A fresh ``<writer_dir>/.raw/capture-<n>`` for one capture."""
    base = writer_dir / RAW_DIR
    base.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        path = base / f"capture-{n}"
        try:
            path.mkdir()
        except FileExistsError:
            n += 1
            continue
        return path


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
        driver = str(self.driver_dir)
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
                    driver,
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
                        driver,
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
                        now,
                        driver,
                        error.observation_count,
                        error.first_observation_ms,
                        error.last_observation_ms,
                        error.text,
                    )
                )
        self.samples += 1

    def start(self) -> DriverSampler:
        """Sample every ``interval_s`` on a daemon thread until :meth:`stop`."""
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
