"""The public API is pinned, documented, and the generated docs are up to date."""

import inspect
from pathlib import Path

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
