"""Pair maps: arrays with two ragged axes over the same segments, ``(B, N*, M*, *inner)``.

Axis rule: **add one**. ``outer(x, y)`` of ``(B, N*, ...)`` and ``(B, M*, ...)`` creates the
ragged axis ``M*`` after ``N*``: segment ``b`` becomes a dense ``N_b x M_b`` block, stored
row-major in ``values`` (the product partition, ``Partition.outer``). The same result comes from
broadcasting two differently named ragged axes (``x.rename(seq="i") + x.rename(seq="j")``) or,
positionally, ``x[:, :, None] + y[:, None]``. Reductions over either ragged axis consume it;
``transpose`` swaps the two.

The sizes are static when the two ragged axes are the same partition object and the partition
knows ``sum(lengths ** 2)`` (factories record it from host data); otherwise building the product
partition reads ``sum(N_b * M_b)`` once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import type_error, value_error
from .._partition import Partition, RowPartition

__all__ = ["outer", "pair_dot", "transpose"]


def _one_level(func: str, param: str, x: Any) -> RaggedArray:
    if not isinstance(x, RaggedArray):
        raise type_error(func, param, "must be a RaggedArray", type(x).__name__)
    if x.ragged_ndim != 1:
        raise value_error(func, param, "must have one ragged axis", f"{x.ragged_ndim} ragged axes")
    return x


@dataclasses.dataclass
class PairIndex:
    """For every entry ``(b, i, j)`` of a pair map: the value rows ``i`` and ``j`` it pairs."""

    partition: Partition
    left: Tensor  # row of x (level 0's children) for every pair
    right: Tensor  # row of y for every pair


def pair_index(rows: RowPartition, columns: RowPartition) -> PairIndex:
    """The product partition of ``rows`` x ``columns`` and the rows each pair combines."""
    partition = Partition.outer(rows, columns)
    cells = partition.levels[1]
    left = cells.row_ids  # the children of level 0 are the rows of x
    segment = rows.row_ids.index_select(0, left)
    right = columns.offsets.index_select(0, segment) + cells.positions()
    return PairIndex(partition, left, right)


def outer(
    x: RaggedArray, y: RaggedArray, op: Callable[[Tensor, Tensor], Tensor] = torch.add
) -> RaggedArray:
    """All pairs within each segment: ``out[b, i, j] = op(x[b, i], y[b, j])``.

    Args:
        x: ``(B, N*, *inner_x)``.
        y: ``(B, M*, *inner_y)`` with the same ``B``.
        op: a broadcasting binary torch function of two row batches (default ``torch.add``).

    Returns:
        The pair map ``(B, N*, M*, *broadcast(inner_x, inner_y))``; its level 0 is ``x``'s
        (the same object). Axis names: ``x``'s, then ``y``'s ragged axis name, when both are
        named and the ragged names differ.

    >>> import ragged, torch
    >>> x = ragged.array([[1, 2], [3]])
    >>> ragged.outer(x, x).to_list()
    [[[2, 3], [3, 4]], [[6]]]
    >>> ragged.outer(x, x, torch.mul).shape
    RaggedShape(2, [2, 1], [[2, 2], [1]])
    """
    func = "ragged.outer"
    _one_level(func, "x", x)
    _one_level(func, "y", y)
    if x.num_segments != y.num_segments:
        raise value_error(func, "y", f"must have {x.num_segments} segments like x", y.num_segments)
    index = pair_index(x.partition.levels[0], y.partition.levels[0])
    values = op(x.values.index_select(0, index.left), y.values.index_select(0, index.right))
    names = None
    if (
        x.axes is not None
        and y.axes is not None
        and x.axes[1] != y.axes[1]
        and values.dim() == x.values.dim()
    ):
        names = (x.axes[0], x.axes[1], y.axes[1], *x.axes[2:])
    return RaggedArray(values, index.partition, names)


def pair_dot(x: RaggedArray, y: RaggedArray, *, scale: float | None = None) -> RaggedArray:
    """Per-segment ``x @ y.T`` over the last axis: ``out[b, i, j] = <x[b, i], y[b, j]>``.

    The ragged "dot" that attention scores and bilinear pair features are made of; also written
    ``ragged.matmul(x, y.mT)`` or ``x @ y.mT``. Axes ``(B, N*, ..., D)`` and ``(B, M*, ..., D)``
    give ``(B, N*, M*, ...)``.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 0.0], [0.0, 2.0]], [[1.0, 1.0]]])
    >>> (x @ x.mT).to_list()
    [[[1.0, 0.0], [0.0, 4.0]], [[2.0]]]
    """
    product = outer(x, y, lambda a, b: (a * b).sum(-1))
    if scale is not None:
        product = product.with_values(product.values * scale)
    return product


def transpose(x: RaggedArray, axis0: int = 1, axis1: int = 2) -> RaggedArray:
    """Swap the two ragged axes of a pair map: ``(B, N*, M*, ...) -> (B, M*, N*, ...)``.

    Only product partitions (pair maps) can swap their ragged axes; for a square map the result
    shares the input's partition object.

    >>> import ragged, torch
    >>> z = ragged.outer(ragged.array([[1, 2], [3]]), ragged.array([[10, 20, 30], []]))
    >>> ragged.transpose(z).to_list()
    [[[11, 12], [21, 22], [31, 32]], []]
    """
    func = "ragged.transpose"
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", type(x).__name__)
    if sorted((axis0, axis1)) != [1, 2] or x.ragged_ndim != 2:
        raise value_error(
            func, "axis0, axis1", "must be the two ragged axes (1, 2) of a pair map", (axis0, axis1)
        )
    rows, cells = x.partition.levels
    columns = cells.columns
    if columns is None:
        raise value_error(
            func, "x", "must be a pair map (a product partition)", "a nested partition"
        )
    swapped = pair_index(columns, rows)
    # Entry (b, j, i) of the result is entry (b, i, j) of x: `right` is x's row (b, i) and
    # `left` the column (b, j) as a child of `columns`.
    j = swapped.left - columns.offsets.index_select(
        0, columns.row_ids.index_select(0, swapped.left)
    )
    flat = cells.offsets.index_select(0, swapped.right) + j
    partition = x.partition if columns is rows else swapped.partition
    names = None if x.axes is None else (x.axes[0], x.axes[2], x.axes[1], *x.axes[3:])
    return RaggedArray(x.values.index_select(0, flat), partition, names)


@dataclasses.dataclass(frozen=True)
class RaggedTranspose:
    """``x.mT`` of a RaggedArray ``(B, M*, ..., D)``: only a right operand of ``matmul``.

    ``ragged.matmul(x, y.mT)`` (or ``x @ y.mT``) is :func:`pair_dot` ``(x, y)``.
    """

    array: RaggedArray
