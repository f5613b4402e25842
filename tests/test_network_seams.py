"""The network layer's seams hold (issue 27), read from the source as ``test_import_floors`` reads imports:
no module under ``network/`` reads another object's underscore attribute (an adapter talks to a machine,
a connection to its owner, through public surfaces), no file there grows past 600 lines, and the asyncio
adapter stays thin."""

from __future__ import annotations

import ast
from pathlib import Path

import slipstream.network

NETWORK = Path(slipstream.network.__file__).parent
MAX_LINES = 600
AIO_MAX_LINES = 2400
_OWN = frozenset({"self", "cls"})
_REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    """``_name``, but not a dunder (``__qualname__``) nor an enum's sunder (``_value2member_map_``)."""
    return name.startswith("_") and not name.endswith("_")


def _own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: an object reading its own attributes."""
    if isinstance(node, ast.Name):
        return node.id in _OWN
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _foreign_reads(source: str, filename: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            reflective = (isinstance(func, ast.Name) and func.id in _REFLECTION) or (
                isinstance(func, ast.Attribute) and func.attr in ("__getattribute__", "__setattr__")
            )
            name = node.args[1]
            if (
                reflective
                and isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and _private(name.value)
                and not _own(node.args[0])
            ):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_rule_sees_what_it_forbids() -> None:
    sample = """
class A:
    def f(self, other):
        self._mine = other._theirs
        object.__getattribute__(other, "_slot")
        getattr(other, "_hidden", None)
        super()._parent()
        object.__getattribute__(self, "_own")
        return other.__class__, Kind._value2member_map_
"""
    assert [text for _, text in _foreign_reads(sample, "<sample>")] == [
        "other._theirs",
        "object.__getattribute__(other, '_slot')",
        "getattr(other, '_hidden', None)",
    ]


def test_no_module_under_network_reads_another_objects_underscore_attribute() -> None:
    offenders = [
        f"{path.relative_to(NETWORK.parent)}:{line}: {text}"
        for path in sorted(NETWORK.rglob("*.py"))
        for line, text in _foreign_reads(path.read_text(), str(path))
    ]
    assert offenders == [], "\n".join(offenders)


def test_no_file_under_network_exceeds_600_lines_and_the_asyncio_adapter_stays_thin() -> None:
    sizes = {path: len(path.read_text().splitlines()) for path in NETWORK.rglob("*.py")}
    too_long = {str(path.relative_to(NETWORK)): lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert too_long == {}
    aio = sum(lines for path, lines in sizes.items() if path.parent.name == "aio")
    assert aio <= AIO_MAX_LINES, f"network/aio/ holds {aio} lines"
