"""The ``Attributes:`` section of the config classes' docstrings, generated from their fields.

Each setting is documented once, in the attribute docstring under its field, where it is edited. Python
drops attribute docstrings when it compiles, so ``help(ServerConfig)``, an editor's hover and signature
help, and the API reference never saw them. The class docstring therefore ends with a Google-style
``Attributes:`` section listing every field (inherited ones too) with its type, its default and its doc,
written into the source by ``python -m slipstream._fielddocs`` (``--check`` only reports) and held current
by ``tests/test_config_docs.py``. Generated in the source rather than at import, so editors read it too and
importing slipstream costs nothing more. Nothing imports this module at run time.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import textwrap
from pathlib import Path

CONFIG_CLASSES = (
    "slipstream.network.config:ServerConfig",
    "slipstream.network.config:ClientConfig",
    "slipstream.telemetry.config:RecordingConfig",
    "slipstream.telemetry.recorder:RecorderConfig",
    "slipstream.driver.config:DriverConfig",
)
"""Every class whose docstring carries the generated section, as ``module:Class``."""
HEADING = "Attributes:"
WIDTH = 120
"""ruff's line length: generated lines stay within it."""


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One field as its section entry shows it: source text of its type and default, and its doc."""

    name: str
    type: str
    default: str | None
    """None: the field is required."""
    doc: str

    def entry(self, indent: str) -> str:
        """``name (type): doc Default ``x``.``, wrapped under ``indent``."""
        default = "Required." if self.default is None else f"Default {self.default}."
        return textwrap.fill(
            f"{self.name} ({self.type}): {self.doc} {default}",
            width=WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + "    ",
            break_long_words=False,
            break_on_hyphens=False,
        )


def config_classes() -> list[type]:
    """The classes of :data:`CONFIG_CLASSES`, imported."""
    classes = []
    for spec in CONFIG_CLASSES:
        module, _, name = spec.partition(":")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


def field_docs(cls: type) -> list[FieldDoc]:
    """Every field of dataclass ``cls`` in ``__init__`` order, each from the class that declares it."""
    declared: dict[str, FieldDoc] = {}
    for klass in reversed(cls.__mro__):  # bases first, so a subclass's own declaration wins
        if dataclasses.is_dataclass(klass):
            declared.update((doc.name, doc) for doc in _declared(klass))
    result = []
    for field in dataclasses.fields(cls):
        doc = declared[field.name]
        if not doc.doc:
            raise ValueError(f"{cls.__qualname__}.{field.name} has no docstring: write one under the field")
        result.append(doc)
    return result


def _declared(klass: type) -> list[FieldDoc]:
    source = textwrap.dedent(inspect.getsource(klass))
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ClassDef)
    docs = []
    for statement, following in zip(node.body, [*node.body[1:], None], strict=True):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        doc = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            doc = " ".join(str(following.value.value).split())
        annotation = ast.get_source_segment(source, statement.annotation) or ""
        default = None if statement.value is None else _default_text(source, statement.value, klass)
        docs.append(FieldDoc(statement.target.id, " ".join(annotation.split()), default, doc))
    return docs


def _default_text(source: str, value: ast.expr, klass: type) -> str:
    """The default as written, in ``code`` (``field(default_factory=f)`` reads ``f()``), and the number it
    stands for when that differs (``5 * S`` (5000000000)); a private constant's value alone."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
        for keyword in value.keywords:
            if keyword.arg == "default_factory":
                return f"``{ast.get_source_segment(source, keyword.value)}()``"
            if keyword.arg == "default":
                value = keyword.value
    text = " ".join((ast.get_source_segment(source, value) or "").split())
    if isinstance(value, ast.Constant) or not all(isinstance(node, _ARITHMETIC) for node in ast.walk(value)):
        return f"``{text}``"
    namespace = dict(vars(sys.modules[klass.__module__]))
    number = eval(compile(ast.Expression(value), "<default>", "eval"), namespace)  # numbers and module constants
    if any(isinstance(node, ast.Name) and node.id.startswith("_") for node in ast.walk(value)):
        return f"``{number!r}``"
    if isinstance(number, int | float) and not isinstance(number, bool) and repr(number) != text:
        return f"``{text}`` ({number!r})"
    return f"``{text}``"


_ARITHMETIC = (ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.expr_context)
"""What a default may contain to have its number shown: arithmetic of numbers and module constants."""


def render_source(path: Path, classes: list[type]) -> str:
    """The text of ``path`` with the section of each of ``classes`` (defined there) regenerated."""
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    nodes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    edits = []
    for cls in classes:
        node = nodes[cls.__name__]
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
            raise ValueError(f"{cls.__qualname__} needs a docstring to carry its section")
        indent = " " * first.col_offset
        raw = "".join(lines[first.lineno - 1 : first.end_lineno])
        text = raw.strip()
        if not (text.startswith('"""') and text.endswith('"""')):
            raise ValueError(f"{cls.__qualname__}'s docstring must be a plain triple-quoted string")
        prose = text[3:-3].split(f"\n\n{indent}{HEADING}\n")[0].rstrip()
        entries = "\n".join(doc.entry(indent + "    ") for doc in field_docs(cls))
        docstring = f'{indent}"""{prose}\n\n{indent}{HEADING}\n{entries}\n{indent}"""\n'
        edits.append((first.lineno - 1, first.end_lineno or first.lineno, docstring))
    for start, end, docstring in sorted(edits, reverse=True):
        lines[start:end] = [docstring]
    return "".join(lines)


def stale() -> list[Path]:
    """The source files whose sections are not what :func:`render_source` writes."""
    return [path for path, classes in _by_file().items() if render_source(path, classes) != path.read_text()]


def _by_file() -> dict[Path, list[type]]:
    files: dict[Path, list[type]] = {}
    for cls in config_classes():
        files.setdefault(Path(inspect.getfile(cls)), []).append(cls)
    return files


def main(argv: list[str]) -> int:
    """Write the sections (``--check``: list the files that need it and exit 1)."""
    if "--check" in argv:
        outdated = stale()
        for path in outdated:
            print(f"{path}: config docs out of date (python -m slipstream._fielddocs)")
        return 1 if outdated else 0
    for path, classes in _by_file().items():
        text = render_source(path, classes)
        if text != path.read_text():
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
