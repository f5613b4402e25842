# Sphinx configuration of slipstream's documentation site (`make docs`, into build/docs; warnings are errors).
#
# Why Sphinx + furo + MyST: Sphinx is actively released (9.x in 2026) and its autodoc builds the API
# reference from the docstrings the code already has, while MkDocs 1.x has had no release since 2024 and
# Material's authors moved to a new generator. MyST lets the guides be Markdown, as the README is, so one
# code-block runner (tests/test_docs.py, like tests/test_readme.py) executes every ```python block of both.
from __future__ import annotations

import importlib
import inspect
from typing import Any

import msgspec

import slipstream

project = "slipstream"
author = "The slipstream maintainers"
copyright = "2026, The slipstream maintainers"
release = version = slipstream.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
root_doc = "index"

myst_heading_anchors = 3  # `[text](page.md#a-heading)` links resolve, and are checked
myst_enable_extensions = ["deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "separated"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = f"slipstream {release}"
html_show_sourcelink = False
html_copy_source = False


def _drop_attribute_summaries(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """The config classes' docstrings end with an ``Attributes:`` summary of their fields, generated from
    the fields' own docstrings (for ``help()`` and editors). autodoc documents each field from that docstring
    already, with its type and default, so the summary is left out here rather than shown twice (and
    napoleon, which would render it, is not needed)."""
    if what == "class" and "Attributes:" in lines:
        del lines[lines.index("Attributes:") :]
        while lines and not lines[-1].strip():
            lines.pop()


def _struct_fields(app: object, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    """A ``msgspec.Struct`` (the network layer's events) has no ``__init__`` of its own for autodoc to show
    beside the class, as a dataclass has: its fields, with their types and defaults, are written out instead."""
    if what == "class" and isinstance(obj, type) and issubclass(obj, msgspec.Struct):
        lines += ["", f"Fields: ``{obj.__name__}{inspect.signature(obj)}``"]


PUBLIC_PACKAGES = ("slipstream", "slipstream.network", "slipstream.network.rmi", "slipstream.telemetry",
                   "slipstream.files.observe", "slipstream.testing")  # fmt: skip
"""Packages whose ``__all__`` is their public API: each name in it is documented, docstring or not
(a constant's or alias's docstring sits where it is defined, which autodoc does not see from here)."""


def _keep_public_names(app: object, what: str, name: str, obj: object, skip: bool, options: object) -> bool | None:
    excluded = getattr(options, "exclude_members", None) or ()
    if what != "module" or not skip or name in excluded:
        return None
    return False if any(name in importlib.import_module(p).__all__ for p in PUBLIC_PACKAGES) else None


def setup(app: Any) -> None:
    app.connect("autodoc-process-docstring", _drop_attribute_summaries)
    app.connect("autodoc-process-docstring", _struct_fields)
    app.connect("autodoc-skip-member", _keep_public_names)
