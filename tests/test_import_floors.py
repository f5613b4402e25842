"""The house's floors, checked: no module imports a floor above its own, and no import cycle.

Every ``import`` in every module under ``src/slipstream`` counts, including those inside functions and
under ``TYPE_CHECKING``: a type-only cycle is still a cycle for a reader. DESIGN.md lists the floors.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "slipstream"

# Lowest first. A module may import its own package and any floor with a lower number.
FLOORS: dict[str, int] = {
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
    "testing": 10,
    "cli": 11,
    "__main__": 12,
}
ROOT_FLOOR = 11  # the package's own __init__: the public facade over the transport floors


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, name: str) -> Iterator[str]:
    """Absolute names of the slipstream modules ``path`` imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "slipstream":
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "slipstream":
                continue
            for alias in node.names:
                # ``from pkg import module`` imports the module; ``from module import name`` the module.
                candidate = f"{target}.{alias.name}"
                yield candidate if module_path(candidate) is not None else target


def module_path(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def floor_of(name: str) -> tuple[str, int]:
    parts = name.split(".")
    if len(parts) == 1:
        return "slipstream", ROOT_FLOOR
    top = parts[1]
    assert top in FLOORS, f"{name}: package {top!r} has no floor; add it to DESIGN.md and to FLOORS"
    return top, FLOORS[top]


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        graph[name] = {target for target in imported_modules(path, name) if target != name}
    return graph


def test_every_import_goes_down_or_stays_in_its_package() -> None:
    violations = []
    for name, targets in import_graph().items():
        package, floor = floor_of(name)
        for target in targets:
            target_package, target_floor = floor_of(target)
            if target_package == package:
                continue
            if target_package == "testing" or target_floor >= floor:
                violations.append(f"{name} (floor {floor}) imports {target} (floor {target_floor})")
    assert not violations, "imports above their floor:\n" + "\n".join(sorted(violations))


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    # A package's __init__ re-exporting its own modules is not a cycle a reader must untangle.
    real = [c for c in cycles if not any(c[i] == c[i + 1].rpartition(".")[0] for i in range(len(c) - 1))]
    assert not real, "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


def test_the_graph_is_real() -> None:
    """Known edges are seen, relative and absolute, so an empty violation list means something."""
    graph = import_graph()
    assert "slipstream.files.cnc" in graph["slipstream.client.context"]
    assert "slipstream.wire.constants" in graph["slipstream.logbuffer.appender"]
    floors = [floor_of(f"slipstream.{name}")[1] for name in ("cli.demo", "client.context", "wire.uri")]
    assert floors == sorted(floors, reverse=True)
