"""Errors of the telemetry floor: each names the bad field, file or value so a user can act on it."""

from __future__ import annotations

from ..errors import SlipstreamError


class TelemetryError(SlipstreamError):
    """Base of the telemetry floor's errors."""


class RecordError(TelemetryError, ValueError):
    """A record or a schema is malformed (bad kind name, unsupported column type, clashing fields)."""


class SchemaVersionError(TelemetryError):
    """A segment was written with a newer schema version than this reader knows: upgrade slipstream."""


class RecorderClosedError(TelemetryError):
    """A record was given to a recorder that is closed."""


class RecordingLockedError(TelemetryError):
    """Another live recorder already writes into this writer directory."""
