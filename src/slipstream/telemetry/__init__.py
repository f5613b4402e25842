"""What slipstream records, and how: typed versioned record schemas, a Parquet recorder, stream
capture, a driver-files sampler and a reader.

A storage floor like a logging library: it knows nothing of connections or Spark. The network layer
turns its own events into these records (``Recorder.record(handshake_rejected(...))``); the pipeline
reads recordings only through :class:`Recording`. Importing this package does not import pyarrow:
the recorder and the reader import it when they first touch a file. May import ``client`` and the
floors below it; ``network``, ``pipeline`` and ``cli`` may import it.
"""

from .capture import Decoder, DriverSampler, StreamCapture, msgspec_decoder
from .config import RecordingConfig
from .convert import recover
from .errors import RecorderClosedError, RecordError, RecordingLockedError, SchemaVersionError, TelemetryError
from .maintenance import CompactResult, MaintenanceError, compact
from .reader import Recording, Segment, read_segment
from .recorder import Recorder, RecorderConfig, default_writer_id
from .records import (
    BUILTIN_SCHEMAS,
    CONNECTION_EVENT_NAMES,
    TYPED_PREFIX,
    CapturedMessage,
    ConnectionEvent,
    ConnectionStats,
    CounterSample,
    ErrorSample,
    KindSchema,
    LossSample,
    Record,
    StreamStats,
    connected,
    disconnected,
    handshake_accepted,
    handshake_rejected,
    typed_schema,
)
from .sampling import StatsSampler

__all__ = [
    "BUILTIN_SCHEMAS",
    "CONNECTION_EVENT_NAMES",
    "TYPED_PREFIX",
    "CapturedMessage",
    "CompactResult",
    "ConnectionEvent",
    "ConnectionStats",
    "CounterSample",
    "Decoder",
    "DriverSampler",
    "ErrorSample",
    "KindSchema",
    "LossSample",
    "MaintenanceError",
    "Record",
    "RecordError",
    "Recorder",
    "RecorderClosedError",
    "RecorderConfig",
    "Recording",
    "RecordingConfig",
    "RecordingLockedError",
    "SchemaVersionError",
    "Segment",
    "StatsSampler",
    "StreamCapture",
    "StreamStats",
    "TelemetryError",
    "compact",
    "connected",
    "default_writer_id",
    "disconnected",
    "handshake_accepted",
    "handshake_rejected",
    "msgspec_decoder",
    "read_segment",
    "recover",
    "typed_schema",
]
