"""Operators, indexing and ``x.mT`` of RaggedArray, installed from one table after the ops load.

The class (``ragged/_array.py``, core) and its ops never import each other: ``ragged`` calls
``install`` once everything is loaded, as TensorFlow attaches RaggedTensor's operators in
``ragged_operators.py``. The class declares these methods under ``TYPE_CHECKING`` for type
checkers; ``tests/test_registry.py`` checks that the two lists agree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .. import _layout
from .._array import RaggedArray
from . import _elementwise as ew
from . import _torch
from ._indexing._trailing import getitem_any_layout
from ._linalg._matmul import matmul
from ._pairs import RaggedTranspose
from ._ragged_index import RaggedIndex
from ._torch import _flat_rows


def _reflected(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``other <op> self`` for the reflected operator (``__radd__``: ``add(other, self)``)."""

    def reflected(self: Any, other: Any) -> Any:
        return fn(other, self)

    return reflected


def _positive(self: RaggedArray) -> RaggedArray:
    return self


def _not_nested(self: RaggedArray) -> bool:
    """``x.is_nested``: False (not a ``torch.nested`` tensor; torch modules check it)."""
    return False


def _transposed(self: RaggedArray) -> RaggedTranspose | RaggedArray:
    """``x.mT``: the last two axes swapped. Where both are inner axes (``(B, L*, H, D)``), the
    array ``(B, L*, D, H)``, a view of the values (as ``x.transpose(-2, -1)``); where one is
    ragged (``(B, L*, D)``), only for ``x @ y.mT``, the per-segment pair map ``x_b @ y_b^T``.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 2.0]], [[0.0, 1.0], [1.0, 0.0]]])
    >>> (x @ x.mT).shape
    RaggedShape(2, [1, 2], [[1], [2, 2]])
    >>> h = ragged.from_lengths(torch.zeros(3, 2, 4), [1, 2])
    >>> h.mT.shape, h.mT.values.data_ptr() == h.values.data_ptr()
    (RaggedShape(2, [1, 2], 4, 2), True)
    """
    ragged_axes = self.ragged_ndim
    if all(k > ragged_axes for k in _layout.logical_order(self)[-2:]) and self.ndim >= 4:
        n = self.ndim
        return _layout.permute("RaggedArray.mT", self, [*range(n - 2), n - 1, n - 2])
    return RaggedTranspose(self)


# Binary operators: dunder name -> op; each gets its reflected form (``__r<name>__``) too.
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": ew.add,
    "sub": ew.subtract,
    "mul": ew.multiply,
    "truediv": ew.divide,
    "floordiv": ew.floor_divide,
    "mod": ew.remainder,
    "pow": ew.power,
    "and": ew.bitwise_and,
    "or": ew.bitwise_or,
    "xor": ew.bitwise_xor,
    "matmul": matmul,
}
# Comparisons (no reflected forms: Python swaps them itself) and unary operators.
COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "eq": ew.eq,
    "ne": ew.ne,
    "lt": ew.lt,
    "le": ew.le,
    "gt": ew.gt,
    "ge": ew.ge,
}
UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": ew.negative,
    "abs": ew.abs,
    "invert": ew.bitwise_not,
    "pos": _positive,
}


def methods() -> dict[str, Any]:
    """Every method and property ``install`` adds, by attribute name: the operators, and the
    Tensor-style methods generated from the registry (``ragged.ops._torch.method_table``)."""
    table: dict[str, Any] = {
        "__getitem__": getitem_any_layout,
        "mT": property(_transposed),
        "is_nested": property(_not_nested),
    }
    table.update(_torch.method_table())
    # Permuted arrays (ragged._layout) run on their storage order; a RaggedIndex operand is left
    # to the index's reflected operator (it broadcasts into a pair map of its positions).
    lift = functools.partial(_layout.pointwise, defer=RaggedIndex)
    for name, binary in BINARY.items():
        table[f"__{name}__"] = binary if binary is matmul else lift(binary)
        table[f"__r{name}__"] = _reflected(binary) if binary is matmul else lift(_reflected(binary))
    for name, compare in COMPARISONS.items():
        table[f"__{name}__"] = lift(compare)
    for name, unary in UNARY.items():
        table[f"__{name}__"] = lift(unary)
    return table


def tensor_operators() -> dict[Any, Callable[..., Any]]:
    """``t + x`` with a dense tensor ``t`` on the left: torch hands ``Tensor.__add__`` (and the
    other operators of a Tensor) to ``RaggedArray.__torch_function__``."""
    table: dict[Any, Callable[..., Any]] = {}
    for name, binary in BINARY.items():
        table[getattr(torch.Tensor, f"__{name}__")] = binary
        reflected = getattr(torch.Tensor, f"__r{name}__", None)
        if reflected is not None:
            table[reflected] = _reflected(binary)
    for name, compare in COMPARISONS.items():
        table[getattr(torch.Tensor, f"__{name}__")] = compare
    return table


def install() -> None:
    """Add the operators, ``__getitem__``, ``mT`` and the Tensor-style methods to RaggedArray,
    and fill the dispatch table of its ``__torch_function__`` (idempotent)."""
    for name, value in methods().items():
        setattr(RaggedArray, name, value)
    for name, value in _torch.immutable_refusals().items():  # x.add_(1), x[0] = 1: TypeErrors
        if name not in RaggedArray.__dict__:
            setattr(RaggedArray, name, value)
    _torch.install(tensor_operators())
    _flat_rows.install()  # x.view(-1, C): the FlatArray's methods and torch functions
