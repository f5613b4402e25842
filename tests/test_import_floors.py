"""The floors of DESIGN.md hold: no module imports a package above its own, nothing imports
``slipstream.testing``, ``echo`` and ``network`` do not import each other, and no import cycle exists.

Read from the source (every ``import`` statement, ``TYPE_CHECKING`` ones included), not from what a
run happens to import, so a new upward or circular import fails here before it bites.
"""

from __future__ import annotations

import ast
from pathlib import Path

import slipstream

SRC = Path(slipstream.__file__).parent
FLOORS = {
    "errors": 0,
    "wire": 1,
    "logbuffer": 2,
    "files": 3,
    "protocol": 4,
    "driver": 5,
    "client": 6,
    "telemetry": 7,
    "echo": 8,
    "network": 8,
    "pipeline": 9,
    "cli": 10,
    "testing": 10,
}
"""Rank of each floor, lowest first; ``echo`` and ``network`` are siblings. ``testing`` may use any floor
below ``cli`` and no floor may use it; the package itself (``slipstream``) is the facade over them all."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the slipstream modules (or packages) it imports."""
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                if target.split(".")[0] == "slipstream":
                    targets.add(target)
                    targets.update(f"{target}.{alias.name}" for alias in node.names)  # submodules named
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == "slipstream")
        graph[module] = targets
    return {module: {t for t in targets if t in graph and t != module} for module, targets in graph.items()}


def _floor(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


def test_no_module_imports_a_floor_above_its_own() -> None:
    upward = []
    for module, targets in _imports().items():
        floor = _floor(module)
        if floor is None:
            continue
        for target in targets:
            other = _floor(target)
            if other is None or other == floor:
                continue
            if other == "testing" or (floor != "testing" and FLOORS[other] >= FLOORS[floor]):
                upward.append(f"{module} imports {target}")
    assert upward == []


def test_there_is_no_import_cycle() -> None:
    graph = _imports()
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_check_sees_the_floors() -> None:
    """A guard against a check that cannot fail: the graph has the floors and their real edges."""
    graph = _imports()
    assert "slipstream.protocol.sender" in graph["slipstream.driver.network_publication"]
    assert "slipstream.wire.frames" in graph["slipstream.protocol.sender"]
    assert {_floor(m) for m in graph} >= {"wire", "logbuffer", "files", "protocol", "driver", "client", "testing"}
