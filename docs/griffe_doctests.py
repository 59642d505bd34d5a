"""Griffe extensions for the docs site: docstring examples as code, public base classes only.

The docstrings hold bare doctest blocks (``>>>`` lines and their output), which Markdown would
read as nested block quotes and reference links. ``DoctestFences`` wraps every such block in a
``pycon`` code fence before mkdocstrings renders the docstring. ``PublicBases`` shows a class's
public bases only: an internal base (``ragged._partition.Pickled``) is replaced by its own
bases. ``TypedReductions`` shows the reductions' signatures by axis: the overloads of their
typing protocols (``axis=None`` or ``1``: a Tensor; other axes: a Tensor or a RaggedArray)
above the implementation's signature. Loaded by ``mkdocs.yml``; not a page.
"""

from __future__ import annotations

from typing import Any

try:
    from griffe import Extension
except ImportError:  # the docs extra is not installed: only mkdocs imports this file
    Extension = object  # type: ignore[assignment,misc]


def fence_doctests(text: str) -> str:
    """Wrap each doctest block (from a ``>>>`` line to the next blank line) in a fence.

    >>> fence_doctests("Sum.\\n\\n>>> 1 + 1\\n2\\n\\nMore.").splitlines()
    ['Sum.', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
    """
    out: list[str] = []
    inside = False
    fenced = False  # inside a fence the docstring already has
    indent = ""
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```") and not inside:
            fenced = not fenced
        if not fenced and not inside and stripped.startswith(">>>"):
            inside = True
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
        elif inside and not stripped:
            out.append(f"{indent}```")
            inside = False
        out.append(line)
    if inside:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(Extension):  # type: ignore[misc]
    """Fence the doctest blocks of every docstring griffe loads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if getattr(obj, "docstring", None) is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)


def is_public_path(path: str, exported: set[str]) -> bool:
    """Whether a base class at ``path`` may be shown: outside ragged, or exported by it.

    >>> is_public_path("torch.nn.Module", set()), is_public_path("ragged._x.Pickled", set())
    (True, False)
    >>> is_public_path("ragged._partition.Partition", {"ragged.Partition"})
    True
    """
    if not path.startswith("ragged."):
        return True
    return any(name.rsplit(".", 1)[-1] == path.rsplit(".", 1)[-1] for name in exported)


class PublicBases(Extension):  # type: ignore[misc]
    """Show the public bases of every class: internal ones give way to their own bases."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        if pkg.path != "ragged":
            return
        exported = {
            f"{module.path}.{name}" for module in _modules(pkg) for name in _exports(module)
        }
        for cls in _classes(pkg):
            cls.bases = _public_bases(pkg, cls.bases, exported, depth=0)


def _modules(module: Any) -> list[Any]:
    found = [module]
    for member in module.members.values():
        if not member.is_alias and member.is_module and member.is_public:
            found += _modules(member)
    return found


def _exports(module: Any) -> list[str]:
    return [str(name) for name in module.exports or ()]


def _classes(obj: Any) -> list[Any]:
    found = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            found.append(member)
        if member.is_module or member.is_class:
            found += _classes(member)
    return found


def _public_bases(pkg: Any, bases: list[Any], exported: set[str], depth: int) -> list[Any]:
    kept: list[Any] = []
    for base in bases:
        path = str(getattr(base, "canonical_path", base))
        if is_public_path(path, exported) or depth > 5:
            kept.append(base)
            continue
        try:
            inner = pkg.modules_collection[path]
        except KeyError:
            continue  # an internal base griffe cannot see: nothing to show
        kept += _public_bases(pkg, list(getattr(inner, "bases", ())), exported, depth + 1)
    return kept


# Decorator of a reduction -> its typing protocol (``ragged/ops/_reductions/_typing.py``).
PROTOCOLS = {
    "reduction": "Reduction",
    "moment": "Moment",
    "norm": "Norm",
    "arg_reduction": "ArgReduction",
}


class TypedReductions(Extension):  # type: ignore[misc]
    """Give each reduction the overloads of its protocol, so the docs show its type by axis."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        if pkg.path != "ragged":
            return
        try:
            typing_module = pkg.modules_collection["ragged.ops._reductions._typing"]
        except KeyError:
            return
        for func in _functions(pkg):
            paths = [_decorator_path(d.value) for d in func.decorators]
            names = {p.rsplit(".", 1)[-1] for p in paths if p.startswith(typing_module.path)}
            protocol = next((PROTOCOLS[n] for n in names if n in PROTOCOLS), None)
            if protocol is None or protocol not in typing_module.members:
                continue
            calls = typing_module[protocol].overloads.get("__call__", [])
            func.overloads = [_as_overload(func, call) for call in calls]
            if calls and str(func.returns) == "Any":
                func.returns = calls[-1].returns


def _decorator_path(value: Any) -> str:
    """``norm`` for ``@typed_norm`` (imported ``as``), ``op`` for ``@op(...)``."""
    try:
        return str(value.canonical_path)
    except Exception:  # a call or an unresolvable name: its own spelling
        return str(value).split("(")[0]


def _functions(obj: Any) -> list[Any]:
    found = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_function:
            found.append(member)
        elif member.is_module:
            found += _functions(member)
    return found


def _as_overload(func: Any, call: Any) -> Any:
    """``call`` (a protocol's ``__call__`` overload) as an overload of ``func``."""
    from griffe import Function, Parameter, Parameters

    defaults = {p.name: p.default for p in func.parameters}
    parameters = [
        Parameter(
            p.name,
            annotation=p.annotation,
            kind=p.kind,
            default=defaults.get(p.name, p.default) if str(p.default) == "..." else p.default,
        )
        for p in call.parameters
        if p.name != "self"
    ]
    overload = Function(
        func.name,
        lineno=func.lineno,
        endlineno=func.endlineno,
        parameters=Parameters(*parameters),
        returns=call.returns,
    )
    overload.parent = func.parent
    return overload
