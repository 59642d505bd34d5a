"""``torch.cat((x, y))`` of RaggedArrays under ``torch.compile``: Dynamo looks into tuples too.

Eager torch finds ``__torch_function__`` overrides inside the list *and* tuple arguments of a
torch function. Dynamo (torch 2.13, ``torch._dynamo.variables.torch_function._flatten_vts``)
opens lists only, so ``torch.cat((x, y))`` or ``torch.stack((x, y))`` of RaggedArrays never
reaches ``RaggedArray.__torch_function__`` while tracing: Dynamo hands the arrays to
``torch.cat`` itself and fails rebuilding them (``InternalTorchDynamoError: Partition.__init__()
takes 2 positional arguments but 6 were given``). ``install`` wraps that function so that it
also opens tuples (named tuples and ``torch.Size`` included, whose items carry no override), as
eager torch does; the list spelling ``torch.cat([x, y])`` traced already.

``import ragged`` does not import Dynamo (seconds of import time): when Dynamo is not loaded
yet, an import hook waits for its module and wraps the function as soon as it has run.
``tests/test_trust.py`` compiles both spellings in one graph: re-check this module on a torch
upgrade (it is a no-op once Dynamo opens tuples itself, and is skipped if the function is gone).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["install"]

TARGET = "torch._dynamo.variables.torch_function"
_FUNCTION = "_flatten_vts"
_MARK = "__ragged_opens_tuples__"


def _wrap(module: ModuleType) -> None:
    original = getattr(module, _FUNCTION, None)
    if original is None or getattr(original, _MARK, False):
        return
    from torch._dynamo.variables.lists import TupleVariable

    def flatten_vts(vts: Any) -> list[Any]:
        out: list[Any] = []
        for vt in original(vts):  # lists (and dicts) opened, lazy tuples realised
            if isinstance(vt, TupleVariable):
                out.extend(flatten_vts(vt.items))
            else:
                out.append(vt)
        return out

    setattr(flatten_vts, _MARK, True)
    setattr(module, _FUNCTION, flatten_vts)


class _Loader(importlib.abc.Loader):
    """Runs the module with its own loader, then wraps the function."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create: Callable[..., ModuleType | None] | None = getattr(
            self.loader, "create_module", None
        )
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _wrap(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Waits for Dynamo's torch-function module; finds nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Make Dynamo look for ``__torch_function__`` overrides inside tuple arguments: now if it
    is loaded, else when it loads (idempotent)."""
    module = sys.modules.get(TARGET)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
