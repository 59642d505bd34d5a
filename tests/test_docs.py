"""The public API is pinned, documented, and the generated docs are up to date."""

import importlib.util
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


def test_api_md_is_generated_from_the_table():
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "docs" / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "api.md").read_text() == module.render(), "run: python docs/gen_api.py"
