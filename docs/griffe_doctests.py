"""Griffe extensions for the docs site: docstring examples as code, public base classes only.

The docstrings hold bare doctest blocks (``>>>`` lines and their output), which Markdown would
read as nested block quotes and reference links. ``DoctestFences`` wraps every such block in a
``pycon`` code fence before mkdocstrings renders the docstring. ``PublicBases`` shows a class's
public bases only: an internal base (``ragged._partition.Pickled``) is replaced by its own
bases. Loaded by ``mkdocs.yml``; not a page.
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
