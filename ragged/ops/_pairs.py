"""Pair maps: arrays with two ragged axes over the same segments, ``(B, N*, M*, *inner)``.

Axis rule: **add one**. ``outer(x, y)`` of ``(B, N*, ...)`` and ``(B, M*, ...)`` creates the
ragged axis ``M*`` after ``N*``: segment ``b`` becomes a dense ``N_b x M_b`` block, stored
row-major in ``values`` (the product partition, ``Partition.outer``). The same result comes from
broadcasting two differently named ragged axes (``x.rename(seq="i") + x.rename(seq="j")``) or,
positionally, ``x[:, :, None] + y[:, None]``. Reductions over either ragged axis consume it;
``transpose`` swaps the two.

Products over the blocks: ``pair_dot`` (``x_b @ y_b^T``: **add one**), ``pair_matmul``
(``P_b @ V_b``: **remove one**, the second ragged axis is contracted) and ``triangle_multiply``
(``A_b @ B_b^T`` or ``A_b^T @ B_b`` per channel: **keep all**). Eagerly they group segments by
shape (one host read of the lengths) and run one batched dense product per group; under
``torch.compile`` they run in static tiles without a host read (the pair-block kernels of ``ragged/kernels/``).

The sizes are static when the two ragged axes are the same partition object and the partition
knows ``sum(lengths ** 2)`` (factories record it from host data); otherwise building the product
partition reads ``sum(N_b * M_b)`` once.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import OUTER, PAIR_DOT, PAIR_MATMUL, TRANSPOSE
from .._errors import Func, type_error, value_error
from .._pair_index import pair_index
from .._partition import Partition, RowPartition
from .._registry import op
from ..kernels._pairblocks import PairTiles, assemble, group_blocks, length_groups
from ..kernels._segment import Segments, segment_sum
from ._levels import is_multi_level, on_rows

_PAIR_TILE = 16  # pair_dot tiles under torch.compile


def _one_level(func: Func, param: str, x: Any) -> RaggedArray:
    if not isinstance(x, RaggedArray):
        raise type_error(func, param, "must be a RaggedArray", type(x).__name__)
    if x.ragged_ndim != 1:
        raise value_error(func, param, "must have one ragged axis", f"{x.ragged_ndim} ragged axes")
    return x


@op("pairs", rule=OUTER, args="x: ragged, y: ragged, op: callable?")
def outer(
    x: RaggedArray, y: RaggedArray, op: Callable[[Tensor, Tensor], Tensor] = torch.add
) -> RaggedArray:
    """All pairs within each segment: ``out[b, i, j] = op(x[b, i], y[b, j])``.

    ``op`` gets two row batches of the same length (``[rows, *inner_x]``, ``[rows, *inner_y]``,
    size-1 axes prepended to the shorter inner shape so that inner axes broadcast right-aligned)
    and must treat rows independently. Elementwise torch ops (``torch.add``, ``torch.mul``,
    ``torch.sub``, ``torch.div``, ``torch.maximum``, ``torch.minimum``, ``torch.pow``, ... and
    the ``operator`` module's) are recognised and get the blocks ``[n, N, 1, ...]`` and
    ``[n, 1, M, ...]`` instead, so only the result is materialised.

    Cost: segments are grouped by shape (the lengths are read to the host once: one host sync)
    and each group's rows are broadcast against each other; no index per pair. Under
    ``torch.compile`` no host read: the rows of every pair are gathered (``O(pairs * D)``).

    Args:
        x: ``(B, N*, *inner_x)``.
        y: ``(B, M*, *inner_y)`` with the same ``B``.
        op: a binary torch function of two row batches (default ``torch.add``).

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
    func = outer
    if is_multi_level(x, y):  # pairs within every row of the innermost ragged axis
        return on_rows(func, [("x", x, 1), ("y", y, 1)], lambda a, b: outer(a, b, op))
    _one_level(func, "x", x)
    _one_level(func, "y", y)
    if x.num_segments != y.num_segments:
        raise value_error(func, "y", f"must have {x.num_segments} segments like x", y.num_segments)
    rows, columns = x.partition.levels[0], y.partition.levels[0]
    if torch.compiler.is_compiling():
        index = pair_index(rows, columns)
        partition = index.partition
        xv, yv = _same_rank(x.values, y.values)
        values = op(xv.index_select(0, index.left), yv.index_select(0, index.right))
    else:
        partition, values = _outer_grouped(x, y, op)
    names = None
    if (
        x.axes is not None
        and y.axes is not None
        and x.axes[1] != y.axes[1]
        and values.dim() == x.values.dim()
    ):
        names = (x.axes[0], x.axes[1], y.axes[1], *x.axes[2:])
    return RaggedArray(values, partition, names)


# Ops that broadcast their operands elementwise: ``outer`` hands them the blocks as
# ``[n, N, 1, ...]`` and ``[n, 1, M, ...]`` and never materialises the rows of every pair.
_BROADCASTING: frozenset[Any] = frozenset(
    {
        torch.add,
        torch.sub,
        torch.subtract,
        torch.mul,
        torch.multiply,
        torch.div,
        torch.divide,
        torch.true_divide,
        torch.maximum,
        torch.minimum,
        torch.atan2,
        torch.hypot,
        torch.pow,
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.pow,
    }
)


def _insert_ones(t: Tensor, at: int, count: int) -> Tensor:
    for _ in range(count):
        t = t.unsqueeze(at)
    return t


def _same_rank(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of two operands with size-1 inner axes prepended to the shorter inner shape, so
    that their inner axes broadcast right-aligned (not against the row axis)."""
    k = max(x.dim(), y.dim())
    return _insert_ones(x, 1, k - x.dim()), _insert_ones(y, 1, k - y.dim())


def _outer_grouped(
    x: RaggedArray, y: RaggedArray, op: Callable[[Tensor, Tensor], Tensor]
) -> tuple[Partition, Tensor]:
    rows, columns = x.partition.levels[0], y.partition.levels[0]
    partition = Partition.outer(rows, columns)
    groups = length_groups(rows, columns)
    xv, yv = _same_rank(x.values, y.values)
    if not groups.groups:  # no pairs: the op decides the inner shape on empty row batches
        return partition, op(xv[:0], yv[:0])
    try:
        broadcasting = op in _BROADCASTING
    except TypeError:  # an unhashable callable
        broadcasting = False
    pieces = []
    x_blocks = group_blocks(xv, groups, groups.rows)  # [n, N, *inner_x] per group
    y_blocks = group_blocks(yv, groups, groups.cols)  # [n, M, *inner_y]
    for g, xb, yb in zip(groups.groups, x_blocks, y_blocks, strict=True):
        n, nr, nc = len(g.segments), g.rows, g.cols
        if broadcasting:
            pieces.append(op(xb.unsqueeze(2), yb.unsqueeze(1)))  # [n, N, M, *inner]
        else:  # any row-wise op sees row batches, as in the gather it replaces
            xe = xb.unsqueeze(2).expand(n, nr, nc, *xb.shape[2:]).flatten(0, 2)
            ye = yb.unsqueeze(1).expand(n, nr, nc, *yb.shape[2:]).flatten(0, 2)
            pieces.append(op(xe, ye).unflatten(0, (n, nr, nc)))
    return partition, assemble(pieces, groups, xv[:0])


@op("pairs", rule=PAIR_DOT, args="x: ragged, y: ragged, scale: number?")
def pair_dot(x: RaggedArray, y: RaggedArray, *, scale: float | None = None) -> RaggedArray:
    """Per-segment ``x @ y.T`` over the last axis: ``out[b, i, j] = <x[b, i], y[b, j]>``.

    The ragged "dot" that attention scores and bilinear pair features are made of; also written
    ``ragged.matmul(x, y.mT)`` or ``x @ y.mT``. Axes ``(B, N*, ..., D)`` and ``(B, M*, ..., D)``
    give ``(B, N*, M*, ...)``; the inner axes before ``D`` broadcast (e.g. attention heads).

    Cost: one batched matrix product per group of segments of equal shape (the lengths are read
    to the host once: one host sync), with temporaries of the size of the result. Under
    ``torch.compile`` no host read: the pairs run in static ``16 x 16`` tiles whose row operands
    are gathered per tile (``sum N_b M_b * D / 16`` values), not per pair.

    Axis names: ``x``'s batch and ragged names, ``y``'s ragged name, then ``x``'s inner names
    but the last, when both are named, their ragged names differ and the inner axes line up.

    Args:
        x: ``(B, N*, ..., D)``.
        y: ``(B, M*, ..., D)`` with the same ``B`` and dtype.
        scale: multiplies the result (e.g. ``D ** -0.5``).

    Returns:
        The pair map ``(B, N*, M*, ...)``.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 0.0], [0.0, 2.0]], [[1.0, 1.0]]])
    >>> (x @ x.mT).to_list()
    [[[1.0, 0.0], [0.0, 4.0]], [[2.0]]]
    """
    func = pair_dot
    if is_multi_level(x, y):  # pairs within every row of the innermost ragged axis
        views = [("x", x, 1), ("y", y, 1)]
        return on_rows(func, views, lambda a, b: pair_dot(a, b, scale=scale))
    _one_level(func, "x", x)
    _one_level(func, "y", y)
    if x.num_segments != y.num_segments:
        raise value_error(func, "y", f"must have {x.num_segments} segments like x", y.num_segments)
    for name, a in (("x", x), ("y", y)):
        if a.values.dim() < 2:
            raise value_error(func, name, "must have an inner axis to contract", "no inner axes")
    if x.dtype != y.dtype or x.values.shape[-1] != y.values.shape[-1]:
        expected = f"must have the dtype and last axis size of x ({x.dtype}, {x.values.shape[-1]})"
        raise value_error(func, "y", expected, f"({y.dtype}, {y.values.shape[-1]})")
    rows, columns = x.partition.levels[0], y.partition.levels[0]
    partition = Partition.outer(rows, columns)
    if torch.compiler.is_compiling():
        values = _pair_dot_tiled(x.values, y.values, rows, columns, partition.num_values)
    else:
        values = _pair_dot_grouped(x.values, y.values, rows, columns)
    if scale is not None:
        values = values * scale
    names = None
    if (
        x.axes is not None
        and y.axes is not None
        and x.axes[1] != y.axes[1]
        and x.values.dim() == y.values.dim()
    ):
        names = (x.axes[0], x.axes[1], y.axes[1], *x.axes[2:-1])
    return RaggedArray(values, partition, names)


def _row_matmul(xb: Tensor, yb: Tensor) -> Tensor:
    """``[n, N, *inner_x]`` and ``[n, M, *inner_y]`` (last axes ``D``) -> ``[n, N, M, ...]``."""
    kx, ky = xb.dim() - 2, yb.dim() - 2
    k = max(kx, ky)
    xm = _insert_ones(xb, 2, k - kx).movedim(1, -2)  # [n, ..., N, D]
    ym = _insert_ones(yb, 2, k - ky).movedim(1, -1)  # [n, ..., D, M]
    out = torch.matmul(xm, ym)  # [n, ..., N, M]
    return out.movedim(-2, 1).movedim(-1, 2)  # [n, N, M, ...]


def _pair_dot_grouped(x: Tensor, y: Tensor, rows: RowPartition, columns: RowPartition) -> Tensor:
    groups = length_groups(rows, columns)
    x_blocks = group_blocks(x, groups, groups.rows)
    y_blocks = group_blocks(y, groups, groups.cols)
    pieces = [_row_matmul(xb, yb) for xb, yb in zip(x_blocks, y_blocks, strict=True)]
    empty = _row_matmul(x[:0].unsqueeze(0), y[:0].unsqueeze(0)).flatten(0, 2)
    return assemble(pieces, groups, empty)


def _pair_dot_tiled(
    x: Tensor, y: Tensor, rows: RowPartition, columns: RowPartition, pairs: int
) -> Tensor:
    tiles = PairTiles(
        rows.lengths,
        rows.offsets,
        rows.num_children,
        columns.lengths,
        columns.offsets,
        columns.num_children,
        pairs,
        _PAIR_TILE,
    )
    out = _row_matmul(tiles.tile_rows(x, "i"), tiles.tile_rows(y, "j")).flatten(0, 2)
    return out.index_select(0, tiles.back())


@op("pairs", rule=PAIR_MATMUL, args="p: ragged, v: ragged")
def pair_matmul(p: RaggedArray, v: RaggedArray) -> RaggedArray:
    """Per-segment ``P_b @ V_b`` over the second ragged axis of a pair map.

    ``out[b, i, ..., d] = sum_j p[b, i, j, ...] * v[b, j, ..., d]``: the weighted sum of
    attention (``p`` the attention weights per head, ``v`` the values), or a pair map applied
    to the rows of a one-level array. It equals ``ragged.sum(p[..., None] * v[:, None],
    axis=2)`` without building the ``(B, N*, M*, ..., D)`` product.

    Cost: one batched matrix product per group of segments of equal shape (the lengths are read
    to the host once: one host sync), temporaries of the size of ``p`` and the result. Under
    ``torch.compile`` no host read: ``v``'s rows are gathered for every pair and summed with
    ``segment_sum`` (``O(pairs * D)`` temporaries).

    Axis names: ``p``'s batch and first ragged names, then ``v``'s inner names, when both are
    named.

    Args:
        p: a pair map ``(B, N*, M*, *batch)``.
        v: ``(B, M*, *batch, D)``: its ragged axis is ``p``'s second one (equal lengths), and
            the same dtype.

    Returns:
        ``(B, N*, *batch, D)`` with ``p``'s first ragged level (the same object).

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0], [2.0]], [[3.0]]])
    >>> p = ragged.softmax(ragged.pair_dot(x, x), axis=2)  # (B, N*, N*)
    >>> v = ragged.array([[[1.0, 0.0], [0.0, 1.0]], [[5.0, 5.0]]])
    >>> ragged.pair_matmul(p, v).to_list()  # doctest: +ELLIPSIS
    [[[0.268..., 0.731...], [0.119..., 0.880...]], [[5.0, 5.0]]]
    """
    func = pair_matmul
    if not isinstance(p, RaggedArray):
        raise type_error(func, "p", "must be a RaggedArray", type(p).__name__)
    if p.ragged_ndim > 2 or is_multi_level(v):  # within every row of the axis above the pairs
        return on_rows(func, [("p", p, 2), ("v", v, 1)], pair_matmul)
    levels = p.partition.levels
    if len(levels) != 2 or levels[1].columns is None:
        got = f"{len(levels)} ragged axes" if len(levels) != 2 else "a nested partition"
        raise value_error(func, "p", "must be a pair map (B, N*, M*, ...)", got)
    _one_level(func, "v", v)
    rows, columns = levels[0], levels[1].columns
    if not same_lengths(v.partition.levels[0], columns):
        raise value_error(
            func, "v", "must have the lengths of p's second ragged axis", "other lengths"
        )
    if v.values.dim() < 2 or v.values.shape[1:-1] != p.values.shape[1:] or v.dtype != p.dtype:
        expected = f"must have inner shape (*{tuple(p.values.shape[1:])}, D) and dtype {p.dtype}"
        raise value_error(func, "v", expected, f"{tuple(v.values.shape[1:])} and {v.dtype}")
    if torch.compiler.is_compiling():
        values = _pair_matmul_gathered(p, v, columns)
    else:
        values = _pair_matmul_grouped(p, v, columns)
    names = None
    if p.axes is not None and v.axes is not None:
        names = (p.axes[0], p.axes[1], *v.axes[2:])
        names = names if len(set(names)) == len(names) else None
    return RaggedArray(values, Partition((rows,)), names)


def _pair_matmul_grouped(pairs: RaggedArray, rows: RaggedArray, columns: RowPartition) -> Tensor:
    """Per group of equal-shaped segments, one batched matmul (``columns``: the second axis)."""
    groups = length_groups(pairs.partition.levels[0], columns)
    if not groups.groups:  # no pairs: zeros, still a function of the inputs
        return _pair_matmul_gathered(pairs, rows, columns)
    p, v = pairs.values, rows.values
    p_blocks = group_blocks(p, groups, groups.sizes)  # [n, N * M, *batch]
    v_blocks = group_blocks(v, groups, groups.cols)  # [n, M, *batch, D]
    blocks: list[Tensor | None] = [None] * len(groups.sizes)
    pieces = []
    for g, pb, vb in zip(groups.groups, p_blocks, v_blocks, strict=True):
        pm = pb.unflatten(1, (g.rows, g.cols)).movedim(1, -1).movedim(1, -1)  # [n, ..., N, M]
        out = torch.matmul(pm, vb.movedim(1, -2)).movedim(-2, 1)  # [n, N, *batch, D]
        pieces.append(out)
        for b, block in zip(g.segments, out.unbind(0), strict=True):
            blocks[b] = block
    inner = v.shape[1:]
    missing = any(block is None and n for block, n in zip(blocks, groups.rows, strict=True))
    if len(pieces) == 1 and not missing:  # one group covers the batch, in order
        return pieces[0].flatten(0, 1)
    parts = [  # a segment without columns sums nothing: zeros
        block if block is not None else v.new_zeros((n, *inner))
        for block, n in zip(blocks, groups.rows, strict=True)
        if n
    ]
    return torch.cat(parts)


def _pair_matmul_gathered(p: RaggedArray, v: RaggedArray, columns: RowPartition) -> Tensor:
    """Sync-free: ``v``'s row for every pair, weighted, summed per row of ``p``."""
    rows, cells = p.partition.levels
    segment = rows.row_ids.index_select(0, cells.row_ids)
    right = columns.offsets.index_select(0, segment) + cells.positions()
    weighted = p.values.unsqueeze(-1) * v.values.index_select(0, right)
    return segment_sum(weighted, Segments(cells.row_ids, cells.num_rows, cells.lengths))


def same_lengths(a: RowPartition, b: RowPartition) -> bool:
    """Whether two levels have equal lengths (under ``torch.compile`` the comparison, which reads
    device memory, is skipped and the caller's structure is trusted)."""
    return torch.compiler.is_compiling() or a.equals(b)


@op("pairs", rule=TRANSPOSE, args="x: ragged, axis0: int?, axis1: int?")
def transpose(x: RaggedArray, axis0: int | None = None, axis1: int | None = None) -> RaggedArray:
    """Swap the two ragged axes of a pair map: ``(B, N*, M*, ...) -> (B, M*, N*, ...)``.

    Only product partitions (pair maps) can swap their ragged axes; for a square map the result
    shares the input's partition object. The axes are the last two ragged axes (by default;
    ``(1, 2)`` for ``(B, N*, M*)``): with more, ``(B, S*, N*, M*)`` holds a pair map per row of
    axis 1, and each is transposed.

    >>> import ragged, torch
    >>> z = ragged.outer(ragged.array([[1, 2], [3]]), ragged.array([[10, 20, 30], []]))
    >>> ragged.transpose(z).to_list()
    [[[11, 12], [21, 22], [31, 32]], []]
    """
    func = transpose
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", type(x).__name__)
    nr = x.ragged_ndim
    axes = (nr - 1 if axis0 is None else axis0, nr if axis1 is None else axis1)
    if sorted(axes) != [nr - 1, nr] or nr < 2:
        raise value_error(
            func,
            "axis0, axis1",
            f"must be the last two ragged axes ({nr - 1}, {nr}) of a pair map",
            (axis0, axis1),
        )
    if nr > 2:  # a pair map per row of the axis above
        return on_rows(func, [("x", x, 2)], transpose)
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

    ``ragged.matmul(x, y.mT)`` (or ``x @ y.mT``) is [`pair_dot`][ragged.pair_dot] ``(x, y)``.
    """

    array: RaggedArray
