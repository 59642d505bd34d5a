"""Products of two RaggedArrays in any layout: attention written by hand.

torch code computes attention scores as ``q @ k.transpose(-2, -1)`` on ``(B, H, L*, Dh)``
arrays (the head-first layout, a permuted view of the storage ``(B, L*, H, Dh)``; see
``ragged._layout``) and applies them with ``att @ v``. On RaggedArrays both are the library's
pair-map products on the storage order, and the result gets the logical order back:

* ``a @ b`` with ``a`` of logical shape ``(B, *batch, N*, D)`` and ``b`` of ``(B, *batch, D,
  M*)`` (a transposed ragged array) is [`pair_dot`][ragged.pair_dot] of the two storages
  ``(B, N*, *batch, D)`` and ``(B, M*, *batch, D)``: the pair map ``(B, N*, M*, *batch)``,
  shown as ``(B, *batch, N*, M*)`` (``sum_b N_b * M_b * prod(batch)`` values, never padded).
* ``p @ v`` with a pair map ``p`` of logical shape ``(B, *batch, N*, M*)`` and ``v`` of
  ``(B, *batch, M*, D)`` is [`pair_matmul`][ragged.pair_matmul] on the storages: ``(B, N*,
  *batch, D)``, shown as ``(B, *batch, N*, D)``.

With no ``batch`` axes these are ``x @ x.transpose(1, 2)`` of ``(B, L*, C)`` and ``(B, L*, L*)
@ (B, L*, C)``, the shapes ``torch.bmm`` takes. ``axis_on_storage`` runs an op with an axis
argument (``softmax(dim=-1)``) on the storage order, and ``pair_triangle`` is ``torch.tril`` /
``torch.triu`` of a pair map: the causal mask of hand-written attention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._array import RaggedArray
from .._layout import build, is_sequence_first, logical_dim, logical_order
from .._versions import refuse_permuted
from ._pairs import pair_dot, pair_matmul

__all__ = ["axis_on_storage", "pair_triangle", "ragged_product", "rows_times", "storage_view"]


def storage_view(x: RaggedArray) -> RaggedArray:
    """``x`` in its storage order (the same values; names moved with their axes)."""
    if x.order is None:
        return x
    names = None
    if x.axes is not None:
        moved: list[Any] = [x.axes[0], *([None] * (x.ndim - 1))]
        for position, k in enumerate(x.order):
            moved[k] = x.axes[position + 1]
        names = tuple(moved)
    return RaggedArray._trusted(x.values, x.partition, names)


def _distinct(names: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    return names if names is not None and len(set(names)) == len(names) else None


def _is_pair_map(x: RaggedArray) -> bool:
    levels = x.partition.levels
    return len(levels) == 2 and levels[1].columns is not None


def ragged_product(a: RaggedArray, b: RaggedArray) -> RaggedArray | None:
    """``a @ b`` of two RaggedArrays (see the module docstring), or ``None`` when their layouts
    are not one of the two products (the caller raises its error)."""
    n = a.ndim
    if n != b.ndim or n < 3 or b.ragged_ndim != 1:
        return None
    oa, ob = logical_order(a), logical_order(b)
    k = n - 3  # batch axes (heads) before the two matrix axes
    if a.ragged_ndim == 1 and oa[-2] == 1 and ob[-1] == 1:  # (.., N*, D) @ (.., D, M*)
        if a.values.shape[1:-1] != b.values.shape[1:-1]:
            raise ValueError(
                f"ragged.matmul: the axes before the matrix axes (heads) of `a` "
                f"{tuple(a.shape)} and `b` {tuple(b.shape)} must be equal; repeat the "
                "key/value heads for grouped-query attention (or use "
                "F.scaled_dot_product_attention with enable_gqa=True)."
            )
        out = pair_dot(storage_view(a), storage_view(b))
        names = None
        if a.axes is not None and b.axes is not None:
            names = _distinct((*a.axes[:-1], b.axes[-1]))
        return build(out, out.values, names, (*range(3, 3 + k), 1, 2))
    if a.ragged_ndim == 2 and _is_pair_map(a) and oa[-2:] == (1, 2) and ob[-2] == 1:
        out = pair_matmul(storage_view(a), storage_view(b))  # (.., N*, M*) @ (.., M*, D)
        names = None
        if a.axes is not None and b.axes is not None:
            names = _distinct((*a.axes[:-1], b.axes[-1]))
        return build(out, out.values, names, (*range(2, 2 + k), 1, k + 2))
    return None


def rows_times(
    func: Any, x: RaggedArray, w: Any, fn: Callable[[Any, RaggedArray, Any], RaggedArray]
) -> RaggedArray:
    """``fn(func, x, w)`` (``x @ w`` on the last axis) for a permuted ``x`` whose last logical
    axis is an inner one (so also its last storage axis) and a 2-D ``w``: the layout is kept.
    Other cases refuse with the permuted-layout error."""
    if w.dim() != 2 or logical_order(x)[-1] <= x.ragged_ndim:
        raise refuse_permuted(func, "a")
    out = fn(func, storage_view(x), w)
    return build(out, out.values, x.axes, logical_order(x))


def axis_on_storage(
    func: Any, x: RaggedArray, axis: Any, fn: Callable[[RaggedArray, int], RaggedArray]
) -> RaggedArray:
    """``fn(x, axis)`` for an op that keeps the shape, on a permuted ``x``: run on the storage
    order with ``axis`` (an int or a name, logical) moved along, and the logical order given
    back."""
    if is_sequence_first(x):
        raise refuse_permuted(func, "x", sequence_first=True)
    if isinstance(axis, str) and x.axes is not None and axis in x.axes:
        axis = x.axes.index(axis)  # names are in the logical order
    d = logical_dim(func, axis, x.ndim, "axis")
    storage = d if d == 0 else logical_order(x)[d - 1]
    out = fn(storage_view(x), storage)
    return build(out, out.values, x.axes, logical_order(x))


def pair_triangle(x: RaggedArray, diagonal: int, upper: bool) -> RaggedArray | None:
    """``torch.tril`` (``upper`` False) or ``torch.triu`` of every block of a pair map whose two
    ragged axes are its last two logical axes: entry ``(i, j)`` of a segment's ``N_b x M_b``
    block is kept where ``j - i <= diagonal`` (``>=`` for ``triu``) and zeroed elsewhere, as
    torch does per segment. ``None`` when ``x`` is not such a pair map."""
    if x.ragged_ndim != 2 or not _is_pair_map(x) or logical_order(x)[-2:] != (1, 2):
        return None
    rows, cells = x.partition.levels
    i = rows.positions().index_select(0, cells.row_ids)  # the row of every pair in its block
    j = cells.positions()  # its column
    keep = (j - i >= diagonal) if upper else (j - i <= diagonal)
    keep = keep.view(-1, *([1] * (x.values.dim() - 1)))
    values = torch.where(keep, x.values, torch.zeros((), dtype=x.dtype, device=x.device))
    return build(x, values, x.axes, logical_order(x))
