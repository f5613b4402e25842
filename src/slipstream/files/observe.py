"""What a media driver is doing, read from its files by any process: status, counters, loss, errors, backlog.

The files are Aeron's (CnC 0.2.0, the loss report, the error log), so all of this reads the directory of
the reference ``aeronmd`` as well as a slipstream driver's (``DriverStatus.flavour`` tells them apart).

The Python face of ``slipstream stat | loss | errors | backlog | settings``. Each function opens the driver's
files, copies what it needs and closes them again, so a monitor that polls never pins the mappings of
a driver that has since restarted (a restart recreates the files), and works just as well after the
driver has stopped (the files stay until the next driver starts in the directory).

Positions that the driver owns (pub-pos, snd-pos, snd-lmt, rcv-hwm, rcv-pos) are refreshed on the
driver's timer (``timer_interval_ns``, 100 ms by default); subscriber positions (sub-pos) and publisher
limits move live. A backlog is therefore exact only for a quiet stream, and otherwise approximate by
at most one timer tick of traffic.
"""

from __future__ import annotations

import os
import re
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ..errors import DriverError
from ..wire.uri import ChannelUri, ChannelUriError, udp_channel
from .cnc import STATE_CLOSED, STATE_RUNNING, STATE_STARTING, CncError, CncFile, Flavour
from .counters import (
    NETWORK_ERRORS_TYPE_ID,
    NETWORK_RECORDS_DROPPED_TYPE_ID,
    PUBLISHER_LIMIT_TYPE_ID,
    PUBLISHER_POSITION_TYPE_ID,
    RECEIVER_BYTES_LOST_TYPE_ID,
    RECEIVER_HWM_TYPE_ID,
    RECEIVER_NAKS_SENT_TYPE_ID,
    RECEIVER_POSITION_TYPE_ID,
    SENDER_LIMIT_TYPE_ID,
    SENDER_NAKS_RECEIVED_TYPE_ID,
    SENDER_POSITION_TYPE_ID,
    SENDER_RETRANSMITS_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
    SYSTEM_COUNTER_TYPE_ID,
    CounterInfo,
)
from .directory import CNC_FILE, CONFIG_FILE
from .error_log import ErrorRecord, read_error_log
from .loss_report import LOSS_REPORT_FILE, LossEntry, read_loss_report

__all__ = [
    "TYPE_NAMES",
    "BacklogPublisher",
    "BacklogReceiver",
    "BacklogSender",
    "BacklogSubscriber",
    "DriverStatus",
    "NoDriverError",
    "StreamBacklog",
    "StreamLabel",
    "backlog",
    "build_backlog",
    "settings",
    "counters",
    "driver_status",
    "errors",
    "loss",
    "parse_stream_label",
]

TYPE_NAMES: Final[dict[int, str]] = {
    SYSTEM_COUNTER_TYPE_ID: "system",
    PUBLISHER_LIMIT_TYPE_ID: "pub-lmt",
    SENDER_POSITION_TYPE_ID: "snd-pos",
    RECEIVER_HWM_TYPE_ID: "rcv-hwm",
    SUBSCRIBER_POSITION_TYPE_ID: "sub-pos",
    RECEIVER_POSITION_TYPE_ID: "rcv-pos",
    SENDER_LIMIT_TYPE_ID: "snd-lmt",
    PUBLISHER_POSITION_TYPE_ID: "pub-pos",
    SENDER_NAKS_RECEIVED_TYPE_ID: "snd-naks",
    SENDER_RETRANSMITS_TYPE_ID: "snd-rtx",
    RECEIVER_NAKS_SENT_TYPE_ID: "rcv-naks",
    RECEIVER_BYTES_LOST_TYPE_ID: "rcv-lost",
    NETWORK_RECORDS_DROPPED_TYPE_ID: "net-drop",
    NETWORK_ERRORS_TYPE_ID: "net-err",
}
"""Short names of the counter type ids, as the labels spell them."""

_STATE_NAMES: Final = {STATE_STARTING: "starting", STATE_RUNNING: "running", STATE_CLOSED: "closed"}


class NoDriverError(CncError, DriverError):
    """No media driver has ever run in the directory (no ``cnc.dat``): usually a wrong ``--dir``.

    Both a ``CncError`` and a ``DriverError``, so callers catching either family see it."""


def _require_driver_files(directory: Path) -> None:
    if (directory / CNC_FILE).is_file():
        return
    if not directory.exists():
        raise NoDriverError(f"no media driver has run in {directory}: the directory does not exist")
    raise NoDriverError(
        f"no media driver has run in {directory} (no {CNC_FILE}); "
        f"start one with `slipstream driver --dir {directory}` or check the directory"
    )


@contextmanager
def _open_cnc(directory: Path) -> Iterator[CncFile]:
    _require_driver_files(directory)
    try:
        cnc = CncFile.open(directory)
    except CncError:
        _require_driver_files(directory)  # removed meanwhile (a driver restarting): say so plainly
        raise
    try:
        yield cnc
    finally:
        cnc.close()


def _read_counters(cnc: CncFile) -> tuple[CounterInfo, ...]:
    reader = cnc.counters_reader()
    try:
        return tuple(reader)
    finally:
        reader.values_i64.release()  # lets cnc.close() unmap at once instead of at garbage collection


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- status and counters ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriverStatus:
    """A driver's identity and liveness, and a snapshot of every counter, read in one go."""

    directory: Path
    pid: int
    start_timestamp_ms: int
    """Wall-clock time (ms since the epoch) the driver started."""
    heartbeat_ms: int
    """Wall-clock time of the driver's last heartbeat; it beats on every timer tick."""
    heartbeat_age_ms: int
    client_liveness_timeout_ns: int
    state: str
    """``starting``, ``running`` or ``closed`` (a clean stop); a killed driver stays ``running``."""
    alive: bool
    """Running, its process exists, and its heartbeat is younger than the client liveness timeout."""
    counters: tuple[CounterInfo, ...] = field(repr=False)
    process_exists: bool = True
    """Whether process ``pid`` exists (seen from this pid namespace): a SIGKILLed driver shows at once,
    before its heartbeat ages past the liveness timeout."""
    cnc_version: int = 0
    """The CnC version of ``cnc.dat``: Aeron's semantic version (``major << 16 | minor << 8 | patch``,
    0.2.0 for both drivers; ``files.cnc.version_text`` spells it)."""
    flavour: Flavour = "slipstream"
    """Who wrote the directory: ``slipstream`` (its driver) or ``aeron`` (the reference ``aeronmd``), which
    records no run state: its ``state`` reads ``running`` and ``alive`` rests on its pid and heartbeat."""


def driver_status(directory: Path | str) -> DriverStatus:
    """Status and counters of the driver of ``directory``; raises ``NoDriverError`` if none ever ran."""
    directory = Path(directory)
    with _open_cnc(directory) as cnc:
        header = cnc.header
        heartbeat_ms = cnc.heartbeat_ms
        state = cnc.state
        flavour = cnc.flavour
        snapshot = _read_counters(cnc)
    age_ms = _now_ms() - heartbeat_ms
    exists = _process_exists(header.pid)
    return DriverStatus(
        directory=directory,
        pid=header.pid,
        start_timestamp_ms=header.start_timestamp_ms,
        heartbeat_ms=heartbeat_ms,
        heartbeat_age_ms=age_ms,
        client_liveness_timeout_ns=header.client_liveness_timeout_ns,
        state=_STATE_NAMES.get(state, f"unknown ({state})"),
        alive=exists and state == STATE_RUNNING and age_ms * 1_000_000 <= header.client_liveness_timeout_ns,
        counters=snapshot,
        process_exists=exists,
        cnc_version=header.version,
        flavour=flavour,
    )


def _process_exists(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, but belongs to another user
    return True


def counters(directory: Path | str) -> list[CounterInfo]:
    """Every allocated counter, system counters first (ids 0-29), then per-stream ones by id."""
    with _open_cnc(Path(directory)) as cnc:
        return list(_read_counters(cnc))


def loss(directory: Path | str) -> list[LossEntry]:
    """The loss report: one entry per image that saw a gap, with how often and how many bytes."""
    directory = Path(directory)
    if not (directory / LOSS_REPORT_FILE).is_file():
        _require_driver_files(directory)
    return list(read_loss_report(directory))


def errors(directory: Path | str) -> list[ErrorRecord]:
    """The distinct error log: each different error once, with its count and first/last time."""
    with _open_cnc(Path(directory)) as cnc:
        data = bytes(cnc.error_log)
    return list(read_error_log(data))


def settings(directory: Path | str) -> dict[str, object]:
    """The settings the driver runs (or last ran) with, from the ``driver.toml`` it writes when it starts:
    each ``DriverConfig`` field and its effective value as written there (durations and sizes as text, such as
    ``"5s"`` or ``"2m"``; ``slipstream.driver.config_file.running_config`` gives a ``DriverConfig``)."""
    directory = Path(directory)
    try:
        text = (directory / CONFIG_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        _require_driver_files(directory)
        raise NoDriverError(f"the driver in {directory} wrote no {CONFIG_FILE} (it predates it)") from None
    return dict(tomllib.loads(text))


# -- backlog ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamLabel:
    """The parts of a per-stream counter label ``name: registrationId sessionId streamId channel[ @join]``."""

    name: str
    registration_id: int
    session_id: int
    stream_id: int
    channel: str
    join_position: int | None = None
    """Only sub-pos labels carry it."""


_LABEL_RE: Final = re.compile(r"([a-z-]+): (-?\d+) (-?\d+) (-?\d+) (\S.*)", re.ASCII | re.DOTALL)
_JOIN_RE: Final = re.compile(r"(.*) @(-?\d+)", re.DOTALL)


def parse_stream_label(label: str) -> StreamLabel | None:
    """Split a per-stream label; None for system counters and labels that were cut short."""
    match = _LABEL_RE.fullmatch(label)
    if match is None:
        return None
    name, registration_id, session_id, stream_id, channel = match.groups()
    join: int | None = None
    if name == "sub-pos" and (joined := _JOIN_RE.fullmatch(channel)) is not None:
        channel, join = joined[1], int(joined[2])
    return StreamLabel(name, int(registration_id), int(session_id), int(stream_id), channel, join)


@dataclass(frozen=True, slots=True)
class BacklogPublisher:
    """The producer: how far it has written (pub-pos) and may write (pub-lmt)."""

    registration_id: int
    position: int | None
    limit: int | None
    window: int | None
    """limit - position: bytes it may still offer before back-pressure."""


@dataclass(frozen=True, slots=True)
class BacklogSender:
    """A UDP publication's sender: what it has sent (snd-pos) and may send (snd-lmt, from flow control)."""

    registration_id: int
    position: int
    limit: int | None
    behind: int | None
    """pub-pos - snd-pos: written but not yet sent."""


@dataclass(frozen=True, slots=True)
class BacklogReceiver:
    """An image this driver rebuilds from UDP: highest byte seen (rcv-hwm), contiguous up to (rcv-pos)."""

    correlation_id: int
    channel: str
    high_water_mark: int | None
    position: int | None
    behind: int | None
    """rcv-hwm - rcv-pos: bytes beyond a gap, waiting for repair."""


@dataclass(frozen=True, slots=True)
class BacklogSubscriber:
    """One subscription's reader of the stream (sub-pos)."""

    registration_id: int
    counter_id: int
    channel: str
    position: int
    join_position: int | None
    producer_position: int | None
    """What it reads from: pub-pos for IPC, the image's rcv-hwm for UDP."""
    behind: int | None
    """producer_position - position: bytes it has not consumed yet."""


@dataclass(frozen=True, slots=True)
class StreamBacklog:
    """Every position this driver knows for one stream, producer first, then each consumer."""

    session_id: int
    stream_id: int
    channel: str
    publisher: BacklogPublisher | None
    sender: BacklogSender | None
    receivers: tuple[BacklogReceiver, ...]
    subscribers: tuple[BacklogSubscriber, ...]


def _channel_key(channel: str) -> str:
    """What makes two labels the same stream: media and endpoint, not the other URI parameters."""
    try:
        uri = ChannelUri.parse(channel)
    except ChannelUriError:
        return channel
    if uri.is_ipc:
        return "aeron:ipc"
    endpoint = uri.endpoint
    return udp_channel(endpoint) if endpoint is not None else channel


def _behind(ahead: int | None, behind: int | None) -> int | None:
    """Bytes between two positions; never negative, since a timer-refreshed producer may lag a live reader."""
    if ahead is None or behind is None:
        return None
    return max(0, ahead - behind)


@dataclass(slots=True)
class _Stream:
    session_id: int
    stream_id: int
    channel: str
    publication_id: int | None = None
    positions: dict[int, int] = field(default_factory=dict)
    """Publication-side counter values by type id."""
    images: dict[int, tuple[str, dict[int, int]]] = field(default_factory=dict)
    """Image correlation id -> (channel, rcv counter values by type id)."""
    subscribers: list[BacklogSubscriber] = field(default_factory=list)


_PUBLICATION_TYPES: Final = (
    PUBLISHER_LIMIT_TYPE_ID,
    PUBLISHER_POSITION_TYPE_ID,
    SENDER_POSITION_TYPE_ID,
    SENDER_LIMIT_TYPE_ID,
)
_IMAGE_TYPES: Final = (RECEIVER_HWM_TYPE_ID, RECEIVER_POSITION_TYPE_ID)


def build_backlog(snapshot: tuple[CounterInfo, ...] | list[CounterInfo]) -> list[StreamBacklog]:
    """Group a counters snapshot into streams (see ``backlog``); useful on snapshots taken elsewhere."""
    streams: list[_Stream] = []
    by_key: dict[tuple[int, int, str], _Stream] = {}
    by_publication: dict[int, _Stream] = {}
    by_image: dict[int, _Stream] = {}

    def stream_for(label: StreamLabel) -> _Stream:
        key = (label.session_id, label.stream_id, _channel_key(label.channel))
        found = by_key.get(key)
        if found is None:
            found = _Stream(label.session_id, label.stream_id, label.channel)
            by_key[key] = found
            streams.append(found)
        return found

    labelled = [(info, label) for info in snapshot if (label := parse_stream_label(info.label)) is not None]
    for info, label in labelled:  # producers and receivers first: subscribers refer to them
        if info.type_id in _PUBLICATION_TYPES:
            stream = by_publication.get(info.registration_id)
            if stream is None:
                stream = stream_for(label)
                if stream.publication_id is not None:  # a second publication with the same identity
                    stream = _Stream(label.session_id, label.stream_id, label.channel)
                    streams.append(stream)
                stream.publication_id = info.registration_id
                stream.channel = label.channel  # the publisher's spelling of the channel
                by_publication[info.registration_id] = stream
            stream.positions[info.type_id] = info.value
        elif info.type_id in _IMAGE_TYPES:
            stream = by_image.get(info.registration_id)
            if stream is None:
                stream = stream_for(label)
                by_image[info.registration_id] = stream
            stream.images.setdefault(info.registration_id, (label.channel, {}))[1][info.type_id] = info.value
    for info, label in labelled:
        if info.type_id != SUBSCRIBER_POSITION_TYPE_ID:
            continue
        producer: int | None = None
        if _channel_key(label.channel) == "aeron:ipc":
            stream = by_publication.get(info.reference_id) or stream_for(label)
            if stream.publication_id == info.reference_id:
                producer = stream.positions.get(PUBLISHER_POSITION_TYPE_ID)
        else:
            stream = by_image.get(info.reference_id) or stream_for(label)
            image = stream.images.get(info.reference_id)
            if image is not None:
                producer = image[1].get(RECEIVER_HWM_TYPE_ID)
        stream.subscribers.append(
            BacklogSubscriber(
                info.registration_id,
                info.counter_id,
                label.channel,
                info.value,
                label.join_position,
                producer,
                _behind(producer, info.value),
            )
        )
    return [_finish(stream) for stream in streams]


def _finish(stream: _Stream) -> StreamBacklog:
    positions = stream.positions
    publisher = sender = None
    pub_pos = positions.get(PUBLISHER_POSITION_TYPE_ID)
    if stream.publication_id is not None and (pub_pos is not None or PUBLISHER_LIMIT_TYPE_ID in positions):
        limit = positions.get(PUBLISHER_LIMIT_TYPE_ID)
        publisher = BacklogPublisher(stream.publication_id, pub_pos, limit, _behind(limit, pub_pos))
    snd_pos = positions.get(SENDER_POSITION_TYPE_ID)
    if stream.publication_id is not None and snd_pos is not None:
        sender = BacklogSender(
            stream.publication_id, snd_pos, positions.get(SENDER_LIMIT_TYPE_ID), _behind(pub_pos, snd_pos)
        )
    receivers = tuple(
        BacklogReceiver(
            correlation_id,
            channel,
            values.get(RECEIVER_HWM_TYPE_ID),
            values.get(RECEIVER_POSITION_TYPE_ID),
            _behind(values.get(RECEIVER_HWM_TYPE_ID), values.get(RECEIVER_POSITION_TYPE_ID)),
        )
        for correlation_id, (channel, values) in stream.images.items()
    )
    return StreamBacklog(
        stream.session_id,
        stream.stream_id,
        stream.channel,
        publisher,
        sender,
        receivers,
        tuple(sorted(stream.subscribers, key=lambda s: s.registration_id)),
    )


def backlog(directory: Path | str) -> list[StreamBacklog]:
    """Per stream (session, stream, channel): the producer's position, the sender's and receiver's
    for UDP, each subscriber's, and how many bytes each consumer is behind what feeds it.

    A UDP publication and the image of it in the same driver are one stream when their channels name
    the same endpoint text; images of remote publishers appear with receivers and subscribers only.
    """
    return build_backlog(counters(directory))
