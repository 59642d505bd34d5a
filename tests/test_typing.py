"""A user's first hour, typed: type checkers find the installed package, and shapes print short.

The precise return types themselves (reductions, collate, ``ragged.nn`` layers, the
Tensor-style methods) are checked by ``mypy`` on ``tests/typing_check.py`` (``[tool.mypy]
files``), which fails when one comes back as ``Any`` or as the wrong type.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ragged

ROOT = Path(__file__).resolve().parent.parent


def test_long_shapes_are_summarised_as_torch_prints_long_tensors() -> None:
    x = ragged.from_lengths(torch.zeros(3000, 2), torch.arange(1000) % 5 + 1)
    text = repr(x.shape)
    assert text == "RaggedShape(1000, [1, 2, 3, ..., 3, 4, 5], 2)"
    small = ragged.from_lengths(torch.zeros(6, 2), [1, 2, 3])
    assert repr(small.shape) == "RaggedShape(3, [1, 2, 3], 2)"
    rows = ragged.from_lengths(torch.zeros(50), [2] * 25)
    pairs = ragged.outer(rows, rows)  # (25, [2, ...], [[2, 2], ...]): nested lists cut too
    assert repr(pairs.shape) == (
        "RaggedShape(25, [2, 2, 2, ..., 2, 2, 2], [[2, 2], [2, 2], [2, 2], ..., [2, 2], [2, 2], "
        "[2, 2]])"
    )


def _finder_editable_install() -> bool:
    """torch-ragged installed by setuptools' default editable mode (an import hook)."""
    files = importlib.metadata.distribution("torch-ragged").files or []
    return any(f.name.startswith("__editable___") and f.name.endswith("_finder.py") for f in files)


def test_the_readme_install_is_visible_to_type_checkers(tmp_path: Path) -> None:
    for path in (ROOT / "README.md", ROOT / ".ci" / "run"):
        assert "--config-settings editable_mode=compat" in path.read_text(), path
    pytest.importorskip("mypy")
    if _finder_editable_install():
        pytest.skip("installed with setuptools' import-hook editable mode: reinstall with README")
    script = tmp_path / "user_script.py"
    script.write_text("import ragged\n\nx = ragged.array([[1.0, 2.0], [3.0]])\n")
    result = subprocess.run(  # outside the checkout: only the installed package can be found
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=skip", script.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert "import-not-found" not in result.stdout, result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
