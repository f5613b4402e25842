"""Issue 11: packaging basics a user or a distributor checks first."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_license_file_is_the_apache_license_the_metadata_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_metadata_has_classifiers_and_authors() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["authors"] and any(c.startswith("Programming Language :: Python :: 3.11") for c in
                                      project["classifiers"])
    assert "Typing :: Typed" in project["classifiers"] and (ROOT / "src/slipstream/py.typed").exists()


def test_readme_points_only_inside_the_repository() -> None:
    """The README is the wheel's long description: a path outside the repository is broken there."""
    text = (ROOT / "README.md").read_text()
    assert "../" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        assert target.startswith("http") or (ROOT / target).exists(), target
    for path in re.findall(r"`((?:src|tests|bench|scripts)/[\w./-]+)`", text):
        assert (ROOT / path).exists() or "*" in path or path.startswith("bench/results/"), path
