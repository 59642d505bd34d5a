"""The op registry: one declaration per public name, and everything derived from it.

Covers: every public name is declared (ops by ``@op``, the rest by ``@public``) and every op has
an op-table entry; the generated files (``ragged/ops/__init__.py``, ``docs/api.md``, the
reference pages, the docs navigation) are current; the reference renders exactly the declared
names; the import graph of ``ragged/`` runs one way; errors name ops through the registry.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import torch

import ragged
import ragged.data
import ragged.distributed
import ragged.nn
import ragged.testing
from ragged import _registry
from ragged.ops import _methods
from tests.optable import all_ops

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ragged"
NAMESPACES = {
    "ragged": ragged,
    "ragged.nn": ragged.nn,
    "ragged.data": ragged.data,
    "ragged.distributed": ragged.distributed,
    "ragged.testing": ragged.testing,
}


def _generator():
    spec = importlib.util.spec_from_file_location("generate", ROOT / "tools" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("namespace", list(NAMESPACES))
def test_every_public_name_is_declared_once(namespace: str) -> None:
    module = NAMESPACES[namespace]
    declared = {e.name: e for e in _registry.entries(namespace)}
    exported = set(module.__all__) - {"__version__"}
    assert len(module.__all__) == len(set(module.__all__))
    assert exported - set(declared) == set(), "public but neither @op nor @public"
    assert set(declared) - exported == set(), "declared but not exported"
    for name, entry in declared.items():
        assert getattr(module, name) is entry.obj, name


def test_every_op_has_an_op_table_entry() -> None:
    covered = {op.spec.qualname for op in all_ops()}
    missing = [s.qualname for s in _registry.ops() if s.qualname not in covered]
    assert not missing, f"ops without an entry in tests/optable: {missing}"


def test_declarations_are_checked_against_the_signature() -> None:
    with pytest.raises(ValueError, match=re.escape("declared arguments ['x'] != ['x', 'axis']")):
        _registry.op("reductions", rule=ragged._axes.REDUCE, args="x: ragged")(lambda x, axis: x)
    with pytest.raises(ValueError, match="unknown argument kind 'tensors'"):
        _registry.op("reductions", rule=ragged._axes.REDUCE, args="x: tensors")(lambda x: x)
    with pytest.raises(ValueError, match="unknown op family 'misc'"):
        _registry.op("misc", rule=ragged._axes.KEEP, args="x: ragged")


def test_generated_files_are_current() -> None:
    for path, text in _generator().outputs().items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: python tools/generate.py"
        )


def _rendered(page: Path) -> list[tuple[str, str]]:
    """The ``(identifier, options)`` of every ``:::`` block of a page."""
    blocks = re.split(r"^::: ", page.read_text(), flags=re.M)[1:]
    return [(b.split("\n", 1)[0].strip(), b.split("\n", 1)[1].split("\n\n")[0]) for b in blocks]


def test_reference_renders_every_public_name_and_no_other() -> None:
    rendered = set()
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        for identifier, options in _rendered(page):
            heading = re.search(r'heading: "(.+)"', options)
            if "members: false" in options:  # a family module's docstring, as the page intro
                assert identifier.startswith("ragged.ops."), identifier
            elif heading:  # a method-only op (x[...]) under its public name
                rendered.add(heading.group(1))
            else:
                rendered.add(identifier)
    public = {f"{ns}.{name}" for ns, module in NAMESPACES.items() for name in module.__all__}
    public.discard("ragged.__version__")
    methods = {e.qualname for e in _registry.entries() if e.namespace == "RaggedArray"}
    assert rendered == public | methods


def test_methods_table_matches_the_type_stubs() -> None:
    # The operators are declared in the class (under TYPE_CHECKING), the generated Tensor-style
    # methods in ragged/_tensor_methods.pyi (a base class of RaggedArray for type checkers).
    tree = ast.parse((PACKAGE / "_array.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RaggedArray")
    block = next(n for n in cls.body if isinstance(n, ast.If))  # if TYPE_CHECKING:
    stubs = {n.name for n in block.body if isinstance(n, ast.FunctionDef)}
    generated = ast.parse((PACKAGE / "_tensor_methods.pyi").read_text())
    base = next(n for n in generated.body if isinstance(n, ast.ClassDef))
    stubs |= {n.name for n in base.body if isinstance(n, ast.FunctionDef)}
    assert stubs == set(_methods.methods())
    for name in stubs:
        assert getattr(ragged.RaggedArray, name) is not None


def test_errors_are_named_by_the_registry() -> None:
    x = ragged.array([[1.0]])
    with pytest.raises(TypeError, match=r"^ragged\.sum: `x` must be a RaggedArray"):
        ragged.sum(x.values)
    with pytest.raises(ValueError, match=r"^ragged\.softmax: "):
        ragged.softmax(x, 0)
    with pytest.raises(TypeError, match=r"^RaggedArray\.__getitem__: "):
        x[1.5]
    qualnames = {e.qualname for e in _registry.entries()}
    literals = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                body = node.body
                if (
                    body
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                ):
                    body[0].value.value = ""  # docstrings may name ops
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                head = node.value.split(":")[0].strip()
                if head in qualnames and node.value.startswith(head + ":"):
                    literals.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not literals, f"hand-typed error contexts: {literals}"


# --- the import graph -------------------------------------------------------------------------

# Layers, lowest first: a module may import its own layer and the layers below it only.
LAYERS = [
    ("core", lambda m: m.count(".") == 1 and m.split(".")[1].startswith("_")),
    ("kernels", lambda m: m.startswith("ragged.kernels")),
    ("ops", lambda m: m.startswith("ragged.ops")),
    ("top", lambda m: True),  # func, nn, data, interop, distributed, bench, testing, demo
]


def _layer(module: str) -> int:
    return next(i for i, (_, test) in enumerate(LAYERS) if test(module))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        parts = parts if is_package else parts[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    names = [f"{base}.{alias.name}" for alias in node.names]
    return names if node.module is None else [base, *names]


def _imports() -> dict[str, list[tuple[str, int, bool]]]:
    """module -> [(imported ragged module, line, at module level)], TYPE_CHECKING excluded."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, list[tuple[str, int, bool]]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        edges = []
        skipped = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(n) for n in ast.walk(node))
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(module, path.name == "__init__.py", node)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in modules and target != module:
                    edges.append((target, node.lineno, id(node) in top_level))
        graph[module] = edges
    return graph


def test_import_graph_runs_one_way() -> None:
    graph = _imports()
    upward = [
        f"{m} -> {t} (line {line})"
        for m, edges in graph.items()
        for t, line, _ in edges
        if m != "ragged" and _layer(t) > _layer(m)
    ]
    assert not upward, f"imports from a higher layer: {upward}"
    # No cycle among modules (a package __init__ re-exporting its children is not one).
    adjacency = {
        m: {t for t, _, top in edges if top and graph.get(t) is not None}
        for m, edges in graph.items()
    }

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in adjacency.get(start, ()):
            if nxt == goal:
                return True
            if nxt not in seen and not _is_reexport_hub(nxt):
                seen.add(nxt)
                if reaches(nxt, goal, seen):
                    return True
        return False

    cycles = [m for m in graph if not _is_reexport_hub(m) and reaches(m, m, set())]
    assert not cycles, f"modules on an import cycle: {cycles}"


def _is_reexport_hub(module: str) -> bool:
    path = PACKAGE.joinpath(*module.split(".")[1:], "__init__.py")
    return path.exists()


def test_no_function_level_imports_of_ragged_modules() -> None:
    late = [
        f"{m} -> {t} (line {line})"
        for m, edges in _imports().items()
        for t, line, top in edges
        if not top
    ]
    assert not late, f"imports inside functions: {late}"


# --- one declaration per torch spelling --------------------------------------------------------


def test_a_second_declaration_of_a_torch_spelling_names_both_places() -> None:
    claims = _registry.claims()
    first = claims[torch.exp]
    with pytest.raises(ValueError, match="declared twice") as caught:
        _registry.refuse(torch.exp, family="elementwise", hint="none")
    message = str(caught.value)
    assert message.startswith("torch.exp is declared twice: ")
    assert f"as {first[0]} at {first[1]}" in message
    here = Path(__file__).name
    assert re.search(rf"as a refusal \(elementwise\) at .*{here}:\d+;", message)
    assert _registry.claims() == claims  # nothing was entered


def test_a_second_declaration_of_a_method_or_an_op_spelling_raises() -> None:
    def nansum_twice(x):  # an op answering torch.sum, which ragged.sum already answers
        return x

    declare = _registry.op(
        "reductions",
        rule=_registry.get("ragged.sum").rule,
        args="x: ragged",
        torch=(torch.sum,),
        torch_args="input",
        name="sum_twice_for_the_test",
    )
    with pytest.raises(ValueError, match=r"torch\.sum is declared twice: as the op ragged\.sum "):
        declare(nansum_twice)
    assert "ragged.sum_twice_for_the_test" not in {e.qualname for e in _registry.entries()}
    with pytest.raises(ValueError, match=r"RaggedArray\.exp is declared twice"):
        _registry.torch_function(family="elementwise", meaning="x", methods=("exp",))(len)


def test_file_and_line_of_each_declaration_are_recorded() -> None:
    for key, (what, where) in _registry.claims().items():
        path, _, line = where.rpartition(":")
        assert (PACKAGE / path).is_file(), (key, where)
        assert line.isdigit() and what, (key, where)
