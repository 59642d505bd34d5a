"""The project's rules for the shape of its code, checked on every run (docs/contributing.md):
modules stay under 500 lines, a helper shared across modules has a public name (no
``from ._x import _helper`` of an underscored name from another module), and the package holds
no dead code (vulture, over the package and everything that calls it)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ragged"
MAX_LINES = 500
MODULES = sorted(PACKAGE.rglob("*.py"))


def _imported_private_names(path: Path, package: Path = PACKAGE) -> list[str]:
    """``module:line: name`` for each underscored helper ``path`` imports from another module
    of ``package`` (an underscored *module* is fine: ``from . import _pointwise``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0 and not (node.module or "").startswith(package.name):
            continue
        if node.level == 0:
            base = package.parent
        else:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
        target = base.joinpath(*node.module.split(".")) if node.module else base
        for alias in node.names:
            name = alias.name
            if not name.startswith("_") or name.startswith("__"):
                continue
            if (target / f"{name}.py").exists() or (target / name).is_dir():
                continue  # a module, imported by its (private) name
            found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {name}")
    return found


def test_modules_stay_under_the_line_limit() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in MODULES
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def test_no_private_helper_is_shared_across_modules() -> None:
    shared = [line for p in MODULES for line in _imported_private_names(p)]
    assert not shared, (
        "underscored helpers imported from another module (give them a public name in their "
        "module, or one home):\n" + "\n".join(shared)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ._segment import _direct\n", ["_direct"]),
        ("from . import _native\n", []),  # a private module, by its name
        ("from ._segment import segment_sum\n", []),
        ("from torch._C import _get_tracing_state\n", []),  # another package's business
    ],
)
def test_the_private_import_check_can_fail(
    tmp_path: Path, source: str, expected: list[str]
) -> None:
    package = tmp_path / "ragged"
    (package / "kernels").mkdir(parents=True)
    for name in ("__init__.py", "kernels/__init__.py", "kernels/_segment.py", "kernels/_native.py"):
        (package / name).write_text("")
    module = package / "kernels" / "_probe.py"
    module.write_text(source)
    found = [line.rsplit(": ", 1)[1] for line in _imported_private_names(module, package)]
    assert found == expected


# What vulture cannot see used: autograd.Function and torch.func hooks torch calls by name, and
# functions registered by a decorator (ops, torch handlers, overloads, tests).
VULTURE_IGNORED_NAMES = "setup_context,backward,jvp,forward,vmap,_"
VULTURE_IGNORED_DECORATORS = (
    "@op,@public,@torch_handler,@torch_function,@register*,@*.register*,@property,"
    "@staticmethod,@overload,@pytest.*,@given,@settings"
)


@pytest.mark.skipif(importlib.util.find_spec("vulture") is None, reason="vulture is not installed")
def test_no_dead_code_in_the_package() -> None:
    # Usage counts from the tests, benchmarks, tools and examples too: a public helper that only
    # they call is API, not dead code. Only findings inside ragged/ fail.
    paths = ["ragged", "tests", "benchmarks", "tools", "examples", "docs/griffe_doctests.py"]
    command = [sys.executable, "-m", "vulture", *paths, "--min-confidence", "60"]
    command += ["--ignore-names", VULTURE_IGNORED_NAMES]
    command += ["--ignore-decorators", VULTURE_IGNORED_DECORATORS]
    found = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    dead = [line for line in found.stdout.splitlines() if line.startswith("ragged")]
    assert not dead, "dead code in ragged/ (remove it, or say why it is used):\n" + "\n".join(dead)
