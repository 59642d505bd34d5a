"""Settings for every test run (doctests in ragged/, docs/ and README.md, and tests/)."""

import importlib.util
import sys

import pytest
import torch
from _pytest.doctest import DoctestItem

import ragged

torch.set_num_threads(1)

# docs/contributing.md's `>>>` lines are docstrings inside the recipe's code blocks (the ops the
# recipe adds): tests/test_recipe.py applies the recipe and runs those doctests.
collect_ignore = ["docs/contributing.md"]


@pytest.fixture(autouse=True)
def _main_module_globals(monkeypatch):
    """Markdown doctests run with ``__name__ == "__main__"`` in their own namespace, but Dynamo
    resolves the globals of compiled code through ``sys.modules["__main__"]``: mirror the modules
    the pages import there, as they are in a real ``python`` session."""
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "ragged", ragged, raising=False)
    monkeypatch.setattr(main, "torch", torch, raising=False)


@pytest.fixture(autouse=True)
def _skip_optional_doctests(request):
    # DanLing is an optional extra: its conversion examples run only where it is installed.
    if (
        isinstance(request.node, DoctestItem)
        and "danling" in request.node.name
        and importlib.util.find_spec("danling") is None
    ):
        pytest.skip("danling is not installed (pip install torch-ragged[danling])")


def pytest_sessionfinish(session, exitstatus):
    # Drop compiled code while pytest still handles the "Exception ignored" that Dynamo's weakref
    # cleanup raises in torch 2.13 (filtered in pyproject.toml); at interpreter exit it would be
    # printed to stderr instead.
    torch._dynamo.reset()
