"""Settings for every test run (doctests in ragged/, docs/ and README.md, and tests/)."""

import sys

import pytest
import torch

import ragged

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _main_module_globals(monkeypatch):
    """Markdown doctests run with ``__name__ == "__main__"`` in their own namespace, but Dynamo
    resolves the globals of compiled code through ``sys.modules["__main__"]``: mirror the modules
    the pages import there, as they are in a real ``python`` session."""
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "ragged", ragged, raising=False)
    monkeypatch.setattr(main, "torch", torch, raising=False)
