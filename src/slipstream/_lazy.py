"""Re-exports that a package resolves on first use (PEP 562).

A package ``__init__`` that imports its re-exports eagerly makes every import of any of its modules pay
for all of them: ``driver.config`` needs three constants of ``protocol.defaults`` and so imported every
protocol machine, and ``import slipstream.network`` imported the whole media driver through the package
root. A lazy package keeps its names (``__all__``, ``dir()``, ``from package import Name``); it imports
the module holding a name when the name is first read. The package lists its names under
``TYPE_CHECKING`` too, so mypy and editors see them as ordinary imports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping


def lazy_exports(
    package: str, modules: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, which re-exports ``{relative module: names}``."""
    exports = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)  # later reads are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
