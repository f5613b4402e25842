"""The optional extras, and one clear error when a feature needs one that is not installed.

``pip install slipstream`` brings the transport and the network layer; recording needs the ``telemetry``
extra (pyarrow, numpy) and the Spark pipeline the ``pipeline`` extra (which includes ``telemetry``), as
``pyproject.toml`` declares them. A feature checks for its extra where it is configured or started, so a
missing one is one line naming the ``pip install`` that fixes it, raised where the feature was asked for,
instead of a ``ModuleNotFoundError`` in the middle of a run (or, for a recording server, at its close).
The check looks the modules up without importing them: pyarrow and pyspark take long to import.
"""

from __future__ import annotations

import importlib.util
from typing import Final

from .errors import MissingExtraError

EXTRAS: Final = {
    "telemetry": ("pyarrow", "numpy"),
    "pipeline": ("pyspark", "matplotlib", "pyarrow", "numpy"),
}
"""Each extra and the top-level modules it installs (``pyproject.toml``'s optional dependencies)."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'slipstream[{extra}]'"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is not a package, a module without a spec
        return False


def require_extra(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` naming ``feature`` and the install command unless ``extra`` is there."""
    missing = [module for module in EXTRAS[extra] if not _installed(module)]
    if missing:
        raise MissingExtraError(
            f"{feature} needs the {extra} extra ({', '.join(missing)} not installed): {install_hint(extra)}",
            extra=extra,
            name=missing[0],
        )


def extra_providing(module: str | None) -> str | None:
    """The smallest extra that installs ``module`` (a dotted name is looked up by its top level), or None."""
    top = (module or "").partition(".")[0]
    for extra, modules in sorted(EXTRAS.items(), key=lambda item: len(item[1])):
        if top in modules:
            return extra
    return None
