"""Every field of the config classes is documented where ``help()`` and editors look: the class docstring
(issue 30, item 13). The per-field docs are written once, as attribute docstrings under the fields; Python
drops those, so each class docstring carries a generated ``Attributes:`` section (``slipstream._fielddocs``).

The doc texts expected here are read from the source by this test's own few lines of ``ast``, not by the
generator, so a generator that lost or garbled them fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import pydoc
import textwrap

import pytest

from slipstream import DriverConfig
from slipstream.network import ClientConfig, ServerConfig
from slipstream.telemetry import RecorderConfig, RecordingConfig

CONFIGS = [ServerConfig, ClientConfig, RecordingConfig, RecorderConfig, DriverConfig]


def _attribute_docs(cls: type) -> dict[str, str]:
    """``{field: its attribute docstring, whitespace collapsed}`` over ``cls`` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for statement, following in itertools.pairwise(body):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
            ):
                docs[statement.target.id] = " ".join(str(following.value.value).split())
    return docs


def _help(cls: type) -> str:
    """``help(cls)``'s text, its `` | `` gutter removed and whitespace collapsed."""
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    return " ".join(" ".join(line.lstrip().removeprefix("|") for line in text.splitlines()).split())


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_field_is_in_help_with_its_doc(cls: type) -> None:
    text = _help(cls)
    docs = _attribute_docs(cls)
    missing = []
    for field in dataclasses.fields(cls):
        doc = docs.get(field.name, "")
        if not doc:
            missing.append(f"{field.name}: no attribute docstring in the source")
        elif f"{field.name} (" not in text or doc not in text:
            missing.append(f"{field.name}: not in help() with its doc")
    assert not missing, f"{cls.__name__}:\n" + "\n".join(missing)


def test_help_shows_each_default() -> None:
    text = _help(ServerConfig)
    assert "max_clients (int): Clients connected at once" in text and "Default ``256``." in text
    assert "app_id (str): Names the application" in text and "Required." in text
    text = _help(DriverConfig)
    assert "client_liveness_timeout_ns (int):" in text and "Default ``5 * S`` (5000000000)." in text


def test_the_generated_sections_are_current() -> None:
    from slipstream._fielddocs import stale

    assert not stale(), "config docs out of date: run python -m slipstream._fielddocs"
