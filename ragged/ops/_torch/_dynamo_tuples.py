"""``torch.cat((x, y))`` of RaggedArrays under ``torch.compile``: Dynamo looks into tuples too.

Eager torch finds ``__torch_function__`` overrides inside the list *and* tuple arguments of a
torch function. Dynamo (torch 2.13, ``torch._dynamo.variables.torch_function._flatten_vts``)
opens lists only, so ``torch.cat((x, y))`` or ``torch.stack((x, y))`` of RaggedArrays never
reaches ``RaggedArray.__torch_function__`` while tracing: Dynamo hands the arrays to
``torch.cat`` itself and fails rebuilding them (``InternalTorchDynamoError: Partition.__init__()
takes 2 positional arguments but 6 were given``). ``install`` wraps that function so that it
also opens tuples (named tuples and ``torch.Size`` included, whose items carry no override), as
eager torch does; the list spelling ``torch.cat([x, y])`` traced already.

The same hook teaches Dynamo ``@`` between two objects that define ``__matmul__`` (torch 2.13's
``BuiltinVariable._binops`` lists ``pow`` only, its note saying SymInt lacks ``__matmul__``; a
RaggedArray has it): nanoGPT's hand-written attention ``q @ k.transpose(-2, -1)`` then traces
into one graph instead of breaking it at every ``@`` (``tests/test_manual_attention.py``).

``import ragged`` does not import Dynamo (seconds of import time): when Dynamo is not loaded
yet, an import hook waits for its module and wraps the function as soon as it has run.
``tests/test_trust.py`` compiles both spellings in one graph: re-check this module on a torch
upgrade (it is a no-op once Dynamo opens tuples itself, and is skipped if the function is gone).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import operator
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


def _wrap_matmul(module: ModuleType) -> None:
    binops = getattr(getattr(module, "BuiltinVariable", None), "_binops", None)
    if binops is not None:  # a cached dict, read when Dynamo first traces a binary operator
        binops().setdefault(operator.matmul, (_MATMUL, operator.imatmul))
    # `x @ w` with a tensor `w` on the right goes to __torch_function__ with the operands
    # swapped, and torch 2.13 then calls Tensor.__matmul__(w, x), which is `w @ x`, because its
    # table of reversed methods skips matmul: give it Tensor.__rmatmul__ (which is `x @ w`).
    populate = getattr(module, "populate_builtin_to_tensor_fn_map", None)
    reversed_methods = getattr(module, "BUILTIN_TO_TENSOR_RFN_MAP", None)
    if populate is not None and isinstance(reversed_methods, dict):
        import torch

        populate()
        reversed_methods.setdefault(operator.matmul, torch.Tensor.__rmatmul__)


_MATMUL = ["__matmul__", "__rmatmul__", "__imatmul__"]
# Dynamo's modules to amend, each as soon as it has run.
_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    TARGET: _wrap,
    "torch._dynamo.variables.builtin": _wrap_matmul,
}


class _Loader(importlib.abc.Loader):
    """Runs the module with its own loader, then wraps the function."""

    def __init__(self, loader: Any, amend: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.amend = amend

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create: Callable[..., ModuleType | None] | None = getattr(
            self.loader, "create_module", None
        )
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.amend(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Waits for Dynamo's torch-function module; finds nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        amend = _TARGETS.get(fullname)
        if amend is None:
            return None
        if all(name == fullname or name in sys.modules for name in _TARGETS):
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, amend)
        return spec


def install() -> None:
    """Make Dynamo look for ``__torch_function__`` overrides inside tuple arguments, and trace
    ``@`` between objects with ``__matmul__``: now if it is loaded, else when it loads
    (idempotent)."""
    waiting = False
    for name, amend in _TARGETS.items():
        module = sys.modules.get(name)
        if module is not None:
            amend(module)
        else:
            waiting = True
    if waiting and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
