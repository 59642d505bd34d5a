"""docs/contributing.md's recipe for a new op runs as written.

In a temporary copy of the package (``ragged/``, ``tools/``, the op table, ``docs/``,
``mkdocs.yml``), the marked blocks of the recipe are applied (``<!-- recipe: new|append|delete
PATH -->`` followed by a code block), ``tools/generate.py`` runs once, and a fresh interpreter
imports the result and calls the new ops through every spelling: ``ragged.nanmean``,
``torch.nanmean``, ``x.nanmean()``, ``ragged.logaddexp``, ``torch.logaddexp``, ``x.logaddexp``.

``ragged.nanmean`` has since landed (``ragged/ops/_reductions/_statistics.py``): the copy is first
put back in the state the recipe starts from (that op removed, ``torch.nanmean`` refused), so
the worked example stays the one the docs show.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"<!-- recipe: (new|append|delete) (\S+) -->\n```(?:python|text)\n(.*?)```", re.S
)

CHECK = """
import math
import doctest
import torch
import ragged
import ragged.testing
from ragged.ops._reductions import _nan
from ragged.ops import _elementwise

x = ragged.array([[1.0, float("nan"), 3.0], [], [float("nan")], [4.0, 6.0]])
for got in (ragged.nanmean(x, 1), torch.nanmean(x, dim=1), x.nanmean(1)):
    expected = torch.stack([torch.nanmean(s) for s in x.unbind()])
    torch.testing.assert_close(got, expected, equal_nan=True)
y = ragged.array([[0.0, 1.0], [2.0]])
for got in (ragged.logaddexp(y, y), torch.logaddexp(y, y), y.logaddexp(y), ragged.logaddexp(y, 1.0)):
    assert got.partition is y.partition
ragged.testing.assert_close(torch.logaddexp(y, y), y.with_values(torch.logaddexp(y.values, y.values)))
assert "nanmean" in ragged.ops.__all__ and "logaddexp" in ragged.ops.__all__
for module in (_nan, _elementwise):
    assert doctest.testmod(module).failed == 0
page = open("docs/torch.md").read()
supported, refused = page.split("## Not supported")
assert "torch.nanmean" in supported and "torch.nanmean" not in refused
assert "def nanmean" in open("ragged/_tensor_methods.pyi").read()
print("recipe ok")
"""


def _copy(tmp: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "build")
    for name in ("ragged", "tools", "docs"):
        shutil.copytree(ROOT / name, tmp / name, ignore=ignore)
    (tmp / "tests").mkdir()
    for name in ("optable", "strategies.py", "torchtable.py", "paths.py", "devices.py"):
        source = ROOT / "tests" / name
        if source.is_dir():
            shutil.copytree(source, tmp / "tests" / name, ignore=ignore)
        elif source.exists():
            shutil.copy(source, tmp / "tests" / name)
    for name in ("mkdocs.yml", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp / name)
    _before_nanmean(tmp)


# The landed ragged.nanmean, from its decorators to the end of its function, and the refusal
# list of the reductions family that held torch.nanmean before it.
LANDED_NANMEAN = re.compile(
    r"\n@reduction\n@op\((?:(?!\n\n\n).)*?\ndef nanmean\(.*?(?=\n\n\n)", re.S
)
REFUSED_REDUCTIONS = "    torch.mode,\n"


def _before_nanmean(tmp: Path) -> None:
    path = tmp / "ragged" / "ops" / "_reductions" / "_statistics.py"
    text = path.read_text()
    found = LANDED_NANMEAN.findall(text)
    assert len(found) == 1, "the landed ragged.nanmean is not where the recipe test expects it"
    assert text.count(REFUSED_REDUCTIONS) == 1, "the reductions' refusal list moved"
    text = text.replace(found[0], "").replace(
        REFUSED_REDUCTIONS, REFUSED_REDUCTIONS + "    torch.nanmean,\n"
    )
    path.write_text(text)
    # ... and the generated re-exports that name it (tools/generate.py imports the package).
    init = tmp / "ragged" / "ops" / "__init__.py"
    lines = init.read_text().splitlines(keepends=True)
    kept = [line for line in lines if "import nanmean as nanmean" not in line]
    kept = [line for line in kept if line.strip() != '"nanmean",']
    assert len(lines) - len(kept) == 2, "the generated ragged/ops/__init__.py changed shape"
    init.write_text("".join(kept))


def _apply(tmp: Path, recipe: str) -> list[str]:
    done = []
    # Lines to delete are a ``text`` block (ruff formats ``python`` blocks in markdown).
    for action, path, code in BLOCK.findall(recipe):
        target = tmp / path
        if action == "new":
            assert not target.exists(), f"{path} exists already"
            target.write_text(code)
        elif action == "append":
            target.write_text(target.read_text().rstrip() + "\n\n\n" + code)
        else:
            text = target.read_text()
            assert text.count(code) == 1, (
                f"{path}: the recipe deletes {code!r}, found {text.count(code)}"
            )
            target.write_text(text.replace(code, ""))
        done.append(f"{action} {path}")
    return done


def _run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tmp), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_contributing_recipe_adds_ops_in_one_pass(tmp_path: Path) -> None:
    _copy(tmp_path)
    recipe = (ROOT / "docs" / "contributing.md").read_text()
    done = _apply(tmp_path, recipe)
    assert len(done) == 6, done  # two ops, two deletions, two op-table entries

    generated = _run(tmp_path, "tools/generate.py")
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert "wrote ragged/ops/__init__.py" in generated.stdout

    checked = _run(tmp_path, "-c", CHECK)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert "recipe ok" in checked.stdout


def test_a_recipe_declaration_without_its_deletion_names_both_places(tmp_path: Path) -> None:
    """Skipping step 2: the import stops with both declarations of torch.nanmean."""
    _copy(tmp_path)
    recipe = (ROOT / "docs" / "contributing.md").read_text()
    first = BLOCK.search(recipe)
    assert first is not None and first.group(2) == "ragged/ops/_reductions/_nan.py"
    (tmp_path / first.group(2)).write_text(first.group(3))
    result = _run(tmp_path, "-c", "import ragged.ops._reductions._nan")
    assert result.returncode != 0
    assert re.search(
        r"torch\.nanmean is declared twice: as a refusal \(reductions\) at "
        r"ops/_reductions/_statistics\.py:\d+ and as the op ragged\.nanmean at "
        r"ops/_reductions/_nan\.py:\d+",
        result.stderr,
    ), result.stderr[-2000:]
