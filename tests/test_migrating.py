"""docs/migrating.md: every ragged spelling of its tables runs in the page's doctests.

The page itself runs as a doctest in the suite (``--doctest-glob='*.md'``, ``testpaths`` holds
``docs``); these tests check that the tables and the sessions below them say the same thing.
"""

import doctest
import re
from pathlib import Path

import pytest
import torch

import ragged

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "migrating.md"
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def sections():
    """(title, table rows, doctest source) for each ``## `` section of the page."""
    text = PAGE.read_text()
    parser = doctest.DocTestParser()
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title = part.splitlines()[0]
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in part.splitlines()
            if line.startswith("|") and not line.startswith("|---")
        ]
        source = "".join(example.source for example in parser.get_examples(part))
        yield title, rows[1:], source


def spellings(cell):
    """The code spans of a table cell, e.g. ``ragged.sum(x, 1)``."""
    return re.findall(r"`([^`]+)`", cell)


def test_page_is_linked_and_collected():
    assert "migrating.md" in (ROOT / "mkdocs.yml").read_text()
    assert "docs/migrating.md" in (ROOT / "README.md").read_text()
    examples = doctest.DocTestParser().get_examples(PAGE.read_text())
    assert len(examples) > 60


@pytest.mark.parametrize("title", [title for title, rows, _ in sections() if rows])
def test_every_ragged_spelling_runs_in_its_section(title):
    ((rows, source),) = [(rows, source) for t, rows, source in sections() if t == title]
    assert source, f"section {title!r} has a table but no doctest session"
    names_run = set(DOTTED.findall(source))
    for row in rows:
        codes = spellings(row[-1])
        assert codes, f"{title}: row {row[0]!r} has no ragged spelling"
        for code in codes:
            if code in source:
                continue
            names = DOTTED.findall(code)
            missing = [name for name in names if name not in names_run]
            assert names and not missing, (
                f"{title}: row {row[0]!r}: `{code}` does not run in the section's session"
                f" (missing: {missing or code})"
            )


def test_to_nested_prints_no_torch_warning(capfd):
    fx = pytest.importorskip("torch.fx._symbolic_trace")
    warning = getattr(fx, "is_fx_tracing_warning", None)
    if warning is not None and hasattr(warning, "cache_clear"):
        warning.cache_clear()  # torch logs it once per process: make this call the first
    capfd.readouterr()
    nt = ragged.array([[1.0, 2.0], [3.0]]).to_nested()
    out, err = capfd.readouterr()
    assert nt.is_nested and torch.equal(nt.values(), torch.tensor([1.0, 2.0, 3.0]))
    assert "is_fx_tracing" not in out + err
