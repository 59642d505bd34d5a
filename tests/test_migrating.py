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


def test_tree_map_with_a_non_tensor_result_prints():
    import optree
    import torch.utils._pytree as pytree

    x = ragged.array([[1.0, 2.0], [], [3.0]], axes=("b", "l"))
    shapes = optree.tree_map(lambda v: v.shape, x, namespace="ragged")
    assert repr(shapes) == "RaggedArray(values=torch.Size([3]), lengths=[2, 0, 1], axes=('b', 'l'))"
    total = pytree.tree_map(lambda v: float(v.sum()), x)
    assert repr(total) == "RaggedArray(values=6.0, lengths=[2, 0, 1], axes=('b', 'l'))"
    docs = ragged.array([[[1.0], [2.0, 3.0]], [[4.0]]])
    assert repr(optree.tree_map(lambda v: len(v), docs, namespace="ragged")) == (
        "RaggedArray(values=4, lengths=[[2, 1], [1, 2, 1]])"
    )


def test_segment_ids_is_a_property_and_the_old_call_warns():
    import copy
    import io

    x = ragged.array([[1.0, 2.0], [], [3.0]])
    ids = x.segment_ids
    assert torch.equal(ids, x.partition.segment_ids()) and ids.dtype == torch.int64
    assert repr(ids) == "tensor([0, 0, 2])"
    assert (
        type(ids + 1) is torch.Tensor and type(torch.repeat_interleave(x.lengths)) is torch.Tensor
    )
    assert type(copy.deepcopy(ids)) is torch.Tensor
    buffer = io.BytesIO()
    torch.save(ids, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer)) is torch.Tensor
    with pytest.warns(DeprecationWarning, match="x.segment_ids instead of x.segment_ids"):
        called = x.segment_ids()
    assert type(called) is torch.Tensor and torch.equal(called, ids)


def test_segment_ids_under_compile():
    x = ragged.array([[1.0, 2.0], [], [3.0]])
    f = torch.compile(lambda x: x.values * x.segment_ids, backend="eager", fullgraph=True)
    assert torch.equal(f(x), torch.tensor([0.0, 0.0, 6.0]))
