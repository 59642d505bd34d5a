"""The public API is pinned, documented, and the generated docs are up to date."""

import inspect
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import ragged

ROOT = Path(__file__).resolve().parent.parent


def test_all_names_exist_and_have_examples():
    for name in ragged.__all__:
        obj = getattr(ragged, name)
        doc = inspect.getdoc(obj)
        assert doc, f"ragged.{name} has no docstring"
        if inspect.isfunction(obj):
            assert ">>>" in doc, f"ragged.{name} has no runnable example"


def test_no_duplicate_public_names():
    assert len(ragged.__all__) == len(set(ragged.__all__))


PUBLIC_MODULES = ["nn", "data", "distributed", "testing", "func", "interop"]


def test_api_lists_every_public_name():
    import importlib

    api = (ROOT / "docs" / "api.md").read_text()
    missing = [name for name in ragged.__all__ if f"[`{name}`](" not in api]
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(f"ragged.{module}")
        for name in mod.__all__:
            top_level = getattr(ragged, name, None) is getattr(mod, name)
            if f"[`ragged.{module}.{name}`](" not in api and not (
                top_level and f"[`{name}`](" in api
            ):
                missing.append(f"ragged.{module}.{name}")
    assert not missing, f"docs/api.md does not list {missing} (python tools/generate.py)"


PRIVATE = re.compile(r"(?<![\w.])(?:[A-Za-z]\w*\.)*_[A-Za-z]\w*")


class _Text(HTMLParser):
    """The text of a page outside code blocks (``<pre>``), and the paths of its base classes."""

    def __init__(self) -> None:
        super().__init__()
        self.skip = 0
        self.text: list[str] = []
        self.titles: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("pre", "script", "style"):
            self.skip += 1
        title = dict(attrs).get("title")
        if tag == "span" and title and self.text and "Bases:" in self.text[-1]:
            self.titles.append(title)

    def handle_endtag(self, tag):
        if tag in ("pre", "script", "style"):
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.text.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_reference_pages_show_no_private_names(site):
    pages = sorted((site / "reference").glob("*/index.html"))
    assert len(pages) > 10
    for page in pages:
        parser = _Text()
        parser.feed(page.read_text())
        shown = sorted(set(PRIVATE.findall(" ".join(parser.text))))
        assert not shown, f"{page.parent.name}: private names outside code blocks: {shown}"
        internal = [t for t in parser.titles if t.startswith("ragged.") and "._" in t]
        assert not internal, f"{page.parent.name}: internal base classes shown: {internal}"


def test_reference_pages_put_the_api_first(site):
    transforms = (site / "reference" / "transforms" / "index.html").read_text()
    assert transforms.index('id="ragged.map"') < transforms.index('id="ragged.psum"')
    assert transforms.index('id="ragged.vmap"') < transforms.index('id="ragged.pmean"')
    scans = (site / "reference" / "scans" / "index.html").read_text()
    assert scans.index('id="ragged.cumsum"') < scans.index('id="rules-and-design-notes-scans"')
