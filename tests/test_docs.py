"""The documentation site (``make docs``): it builds with warnings as errors, every internal link and
cross-reference resolves, the reference covers the public names, its pages open in a browser without
console errors, and every ``python`` block of the guides runs as written and prints what it says."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from .browser import CONSOLE_LOGGING, chromium, console_messages

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDES = sorted((DOCS / "guides").glob("*.md"))
BUILD_TIMEOUT_S = 300

REFERENCED = {
    "slipstream": "api/slipstream.html",
    "slipstream.network": "api/network.html",
    "slipstream.network.rmi": "api/rmi.html",
    "slipstream.telemetry": "api/telemetry.html",
    "slipstream.files.observe": "api/observe.html",
    "slipstream.testing": "api/testing.html",
}
"""Packages whose every public class and function the reference documents, and the page it is on."""


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), flags=re.S | re.M)


SNIPPETS = [(guide, index) for guide in GUIDES for index in range(len(blocks(guide, "python")))]


# -- the build ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as ``make docs`` builds it, into a scratch directory."""
    try:
        import furo  # noqa: F401
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"{exc.name} is missing: `make test` installs the docs extra (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("docs") / "html"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, f"the docs do not build without warnings:\n{done.stderr[-8000:]}"
    print(f"docs built in {time.monotonic() - started:.1f} s")
    return out


class _Page(HTMLParser):
    """A built page's ids, the links it makes, and its cross-references that resolved to nothing."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.unresolved: list[str] = []
        self._anchors = 0
        self._xref: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for name in ("id", "name"):
            if found.get(name) and (name == "id" or tag == "a"):
                self.ids.add(str(found[name]))
        for name in ("href", "src"):
            if found.get(name):
                self.links.append(str(found[name]))
        if tag == "a":
            self._anchors += 1
        if tag == "code" and "xref" in (found.get("class") or "").split() and not self._anchors:
            self._xref = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._anchors = max(0, self._anchors - 1)
        if tag == "code" and self._xref is not None:
            self.unresolved.append("".join(self._xref))
            self._xref = None

    def handle_data(self, data: str) -> None:
        if self._xref is not None:
            self._xref.append(data)


def _pages(site: Path) -> dict[Path, _Page]:
    pages = {}
    for path in sorted(site.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text())
        pages[path] = page
    return pages


def test_every_internal_link_resolves(site: Path) -> None:
    """Every relative ``href``/``src`` names a file of the site, and every fragment an id on its page."""
    pages = _pages(site)
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{path.relative_to(site)}: {link} (no file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(site)}: {link} (no id {parts.fragment!r})")
    assert not broken, "\n".join(broken)
    assert len(pages) >= 10, sorted(str(p.relative_to(site)) for p in pages)


def test_every_reference_in_the_guides_resolves(site: Path) -> None:
    """A ``{class}`` or ``{func}`` role that names nothing renders as plain code: a silent dead link."""
    unresolved = {
        str(path.relative_to(site)): page.unresolved
        for path, page in _pages(site).items()
        if page.unresolved and path.relative_to(site).parts[0] not in ("api", "_modules")
    }
    assert not unresolved, unresolved


def test_the_reference_documents_every_public_name(site: Path) -> None:
    """Every class and function in each package's ``__all__``, under that name or where it is defined
    (the network layer's errors are documented in ``slipstream.network.errors``). docs/api/network.rst
    lists the servers, clients, connections and configs by hand, in sections: a new one needs a line
    there. Constants and type aliases are left out: their docstrings sit where they are defined, which
    autodoc does not see from a package that re-exports them."""
    ids = {i for page in REFERENCED.values() for i in _pages(site)[site / page].ids}
    missing = []
    for package in REFERENCED:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if not (inspect.isclass(value) or inspect.isroutine(value)):
                continue
            if {f"{package}.{name}", f"{value.__module__}.{value.__qualname__}"} & ids:
                continue
            missing.append(f"{package}.{name}")
    assert not missing, f"not in the API reference (docs/api/*.rst): {missing}"


# -- in a browser ------------------------------------------------------------------------------------


def test_index_and_the_server_page_open_in_chromium_without_console_errors(site: Path, tmp_path: Path) -> None:
    index = chromium([*CONSOLE_LOGGING, "--dump-dom", (site / "index.html").as_uri()], tmp_path / "p1", timeout=60)
    assert index.returncode == 0, index.stderr[-2000:]
    assert not console_messages(index.stderr), console_messages(index.stderr)
    for guide in GUIDES:
        assert f'href="guides/{guide.stem}.html"' in index.stdout, guide.stem
    assert 'href="api/index.html"' in index.stdout

    url = (site / "api" / "network.html").as_uri() + "#slipstream.network.Server"
    server = chromium([*CONSOLE_LOGGING, "--dump-dom", url], tmp_path / "p2", timeout=60)
    assert server.returncode == 0, server.stderr[-2000:]
    assert not console_messages(server.stderr), console_messages(server.stderr)
    dom = server.stdout
    assert 'id="slipstream.network.Server"' in dom
    for method in ("bind", "bind_ipc", "close", "on_message", "on_connect", "on_disconnect", "on_error"):
        assert f'id="slipstream.network.Server.{method}"' in dom, method
        assert re.search(rf'<span class="pre">{method}</span>', dom), method


def test_console_messages_are_caught(tmp_path: Path) -> None:
    """The check above would see a page's error: a page that logs one, through the same flags."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('docs-check'); missing();</script></body></html>")
    run = chromium([*CONSOLE_LOGGING, "--dump-dom", page.as_uri()], tmp_path / "p", timeout=60)
    messages = console_messages(run.stderr)
    assert any("docs-check" in m for m in messages) and any("missing" in m for m in messages), run.stderr[-2000:]


# -- the guides' code --------------------------------------------------------------------------------


def _expected_output(block: str) -> Iterator[str]:
    """What each ``print(...)  # comment`` line of a block says it prints (``...``/``<name>``: anything)."""
    for line in block.splitlines():
        found = re.match(r"\s*print\(.*\)  # (.*)$", line)
        if found:
            yield found.group(1)


def _pattern(expected: str) -> re.Pattern[str]:
    parts = re.split(r"(\.\.\.|<[a-z ]+>)", expected)
    return re.compile("".join(".*" if p == "..." or p.startswith("<") else re.escape(p) for p in parts))


@pytest.mark.parametrize(("guide", "index"), SNIPPETS, ids=[f"{g.stem}-{i}" for g, i in SNIPPETS])
def test_guide_snippet_runs_and_prints_what_it_says(guide: Path, index: int, driver_dir: Path) -> None:
    block = blocks(guide, "python")[index]
    env = {**os.environ, "SLIPSTREAM_DIR": str(driver_dir)}
    done = subprocess.run([sys.executable, "-c", block], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    at = 0
    for expected in _expected_output(block):
        pattern = _pattern(expected)
        while at < len(lines) and not pattern.fullmatch(lines[at].strip()):
            at += 1
        assert at < len(lines), f"{guide.name} block {index} should print {expected!r}:\n{done.stdout}"
        at += 1


def test_the_guides_have_snippets() -> None:
    """Each guide is found and has code that runs (the parametrization above could be empty)."""
    assert len(GUIDES) == 6 and all(blocks(g, "python") for g in GUIDES), [g.name for g in GUIDES]


def test_spark_block_reads_a_recording(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pipeline guide's ``py`` block (Spark starts too slowly for a subprocess per snippet): on the
    suite's session, with a recording of its own as ``RECORDING``."""
    from slipstream.telemetry import Recorder, connected, handshake_rejected

    with Recorder(tmp_path / "rec") as recorder:
        recorder.record(handshake_rejected(1, address="192.0.2.1:9", reason="not_permitted"))
        recorder.record(handshake_rejected(2, address="192.0.2.1:9", reason="not_permitted"))
        recorder.record(connected(3, connection_id=7, address="127.0.0.1:9"))
    (block,) = blocks(DOCS / "guides" / "recording-and-pipeline.md", "py")
    block, n = re.subn(r"^RECORDING = .*$", f"RECORDING = {str(tmp_path / 'rec')!r}", block, flags=re.M)
    assert n == 1
    exec(compile(block, "recording-and-pipeline.md", "exec"), {})
    shown = capsys.readouterr().out
    assert re.search(r"\|\s*connected\|\s*1\|", shown) and re.search(r"\|handshake_rejected\|\s*2\|", shown), shown
