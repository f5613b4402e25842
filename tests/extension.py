"""The one rule for test modules that exercise a C module of the fast path: skipped when it is not built,
unless ``SLIPSTREAM_REQUIRE_EXTENSIONS=1`` (``make test``), where a missing build is a failure."""

from __future__ import annotations

import os

import pytest


def require_extension(module: object, what: str) -> None:
    """Skip the calling test module when ``module`` (a loaded C module, or None) is None; raise instead
    when the build is required."""
    if module is not None:
        return
    if os.environ.get("SLIPSTREAM_REQUIRE_EXTENSIONS") == "1":
        raise RuntimeError(f"SLIPSTREAM_REQUIRE_EXTENSIONS=1 but {what} did not load")
    pytest.skip(f"{what} is not built (or SLIPSTREAM_NO_EXTENSIONS is set)", allow_module_level=True)
