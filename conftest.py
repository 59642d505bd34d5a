"""Root pytest configuration: applies to the doctests under ``ragged/`` as well as ``tests/``."""

import importlib.util

import pytest
from _pytest.doctest import DoctestItem


@pytest.fixture(autouse=True)
def _skip_optional_doctests(request):
    # DanLing is an optional extra: its conversion examples run only where it is installed.
    if (
        isinstance(request.node, DoctestItem)
        and "danling" in request.node.name
        and importlib.util.find_spec("danling") is None
    ):
        pytest.skip("danling is not installed (pip install torch-ragged[danling])")
