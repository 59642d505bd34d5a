"""Griffe extension for the docs site: show docstring examples as code.

The docstrings hold bare doctest blocks (``>>>`` lines and their output), which Markdown would
read as nested block quotes and reference links. This wraps every such block in a ``pycon``
code fence before mkdocstrings renders the docstring. Loaded by ``mkdocs.yml``; not a page.
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
