"""The three implementations of the segment kernels, for tests that run each of them."""

import pytest

from ragged.kernels import _native, _native_build, _segment

PATHS = ["composite", "torch", "native"]


def use_path(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Route segment kernels through ``name``: the composite ops (any size), the eager fast
    path's torch kernels (native library off), or its native kernels (skipped without a C
    compiler)."""
    smallest = 1 << 62 if name == "composite" else 0
    monkeypatch.setattr(_segment, "_FAST_MIN_NUMEL", smallest)
    every_kind = dict.fromkeys(_segment._NATIVE_MIN_NUMEL, smallest)
    for table in ("_NATIVE_MIN_NUMEL", "_NATIVE_MIN_ROWS", "_DIRECT_MIN_ROWS"):
        monkeypatch.setattr(_segment, table, every_kind)
    if name == "torch":
        monkeypatch.setitem(_native_build._state, "lib", None)
    if name == "native" and _native.library() is None:
        pytest.skip("no C compiler here: the native kernels cannot be built")
    return name
