"""Result files, tables and the machine description shared by the suites and the runner.

A suite script writes one JSON document (``--json PATH``)::

    {"suite": "ops", "command": "python benchmarks/ops.py", "quick": false,
     "machine": {...}, "metric": "...", "tables": [Table, ...], "plots": {...}}

where each table is ``{"title", "columns", "rows", "notes"}`` (rows of strings) and ``plots``
holds the raw numbers the runner draws. The runner renders the tables into the marked sections
of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

from . import _timing

__all__ = ["Table", "machine", "replace_section", "write_result"]


@dataclasses.dataclass
class Table:
    """A titled table of preformatted cells, printable as text or Markdown.

    >>> t = Table("demo", ["op", "ms"], [["sum", "1.0"]], ["medians"])
    >>> print(t.text())
    demo
    op   ms
    sum  1.0
      medians
    >>> print(t.markdown())
    | op | ms |
    |---|---|
    | sum | 1.0 |
    <BLANKLINE>
    - medians
    """

    title: str
    columns: list[str]
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def text(self, width: int | None = 100) -> str:
        """The table as aligned text, no line longer than ``width`` (``None``: no limit): the
        widest columns wrap their cells over several lines, and notes wrap.

        >>> t = Table("t", ["name", "note"], [["sum", "a long cell that wraps"]], ["n " * 12])
        >>> print(t.text(width=20))
        t
        name  note
        sum   a long cell
              that wraps
          n n n n n n n n n
          n n n
        """
        cells = [self.columns, *self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        if width is not None:
            # Narrow the widest column that can still wrap at a space until the table fits; a
            # column keeps its longest word (up to 16 characters, longer words are cut).
            floors = [
                min(max(len(w) for row in cells for w in row[i].split() or [""]), 16)
                for i in range(len(widths))
            ]
            while sum(widths) + 2 * (len(widths) - 1) > width:
                narrower = [i for i, w in enumerate(widths) if w > max(floors[i], 4)]
                if not narrower:
                    break
                widths[max(narrower, key=lambda i: widths[i])] -= 1
        lines = [self.title if width is None else textwrap.fill(self.title, width)]
        for row in cells:
            parts = [
                textwrap.wrap(c, w, break_on_hyphens=False) or [""]
                for c, w in zip(row, widths, strict=True)
            ]
            for k in range(max(len(p) for p in parts)):
                pieces = [
                    (p[k] if k < len(p) else "").ljust(w)
                    for p, w in zip(parts, widths, strict=True)
                ]
                lines.append("  ".join(pieces).rstrip())
        for note in self.notes:
            if width is None:
                lines.append(f"  {note}")
            else:
                lines += textwrap.wrap(note, width, initial_indent="  ", subsequent_indent="  ")
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Table:
        return cls(data["title"], data["columns"], data["rows"], data.get("notes", []))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU model, cores, torch threads and versions."""
    info = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }
    device = _timing._device
    if device.type == "cuda":
        info["device"] = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    elif device.type != "cpu":
        info["device"] = str(device)
    return info


def describe(info: dict[str, Any]) -> str:
    """One line for ``machine()``'s result.

    >>> describe({"cpu": "X", "cores": 2, "torch_threads": 1, "torch": "2.13.0", "python": "3.11"})
    'X, 2 cores, torch 2.13.0 on 1 thread, Python 3.11'
    >>> describe({"cpu": "X", "cores": 2, "torch_threads": 1, "torch": "2.13.0", "python": "3.11",
    ...           "device": "NVIDIA H200 (CUDA 12.8)"})
    'NVIDIA H200 (CUDA 12.8) with X, 2 cores, torch 2.13.0 on 1 thread, Python 3.11'
    """
    device = f"{info['device']} with " if info.get("device") else ""
    return (
        f"{device}{info['cpu']}, {info['cores']} cores, torch {info['torch']} on "
        f"{info['torch_threads']} thread{'s' * (info['torch_threads'] != 1)}, "
        f"Python {info['python']}"
    )


def write_result(
    path: str | os.PathLike[str],
    suite: str,
    tables: list[Table],
    *,
    quick: bool,
    metric: str,
    plots: dict[str, Any] | None = None,
    argv: list[str] | None = None,
) -> None:
    """Write a suite's result document (see the module docstring)."""
    args = [a for a in (sys.argv[1:] if argv is None else argv)]
    # The command that reproduces the numbers, without the output flag.
    shown = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--json":
            skip = True
            continue
        if a.startswith("--json="):
            continue
        shown.append(a)
    document = {
        "suite": suite,
        "command": " ".join(["python", f"benchmarks/{suite}.py", *shown]),
        "quick": quick,
        "machine": machine(),
        "metric": metric,
        "tables": [t.to_json() for t in tables],
        "plots": plots or {},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


def replace_section(text: str, name: str, body: str) -> tuple[str, bool]:
    """Replace what lies between ``<!-- bench:NAME:start -->`` and ``<!-- bench:NAME:end -->``.

    Returns the new text and whether the markers were found.

    >>> doc = "a\\n<!-- bench:ops:start -->\\nold\\n<!-- bench:ops:end -->\\nb"
    >>> replace_section(doc, "ops", "new")[0]
    'a\\n<!-- bench:ops:start -->\\nnew\\n<!-- bench:ops:end -->\\nb'
    """
    pattern = re.compile(
        rf"(<!-- bench:{re.escape(name)}:start -->\n).*?(<!-- bench:{re.escape(name)}:end -->)",
        re.DOTALL,
    )
    if not pattern.search(text):
        return text, False
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text), True
