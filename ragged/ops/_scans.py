"""Scans: cumulative sums, products, extrema and log-sum-exps within each segment.

Axis rule: **keep all**. The result has the input's partition (the same object) and axis names.
A scan along the ragged axis runs within each segment separately; a scan along an inner axis is
the torch op on that dim of ``values``.

Every scan takes ``reverse=`` (scan from the end of each segment) and ``exclusive=`` (the result
at a position combines the elements strictly before it; the first position gets the op's
identity: 0, 1, ``-inf``, ``+inf``, ``-inf``; the dtype's extremes for integers).

The ragged-axis scan: a blocked scan, exact per segment
------------------------------------------------------

The result for a segment depends on that segment's rows only: no global prefix is subtracted
(``cumsum(values)`` minus its value at the segment start loses a segment of small numbers after
a segment of large ones to rounding), and every combination happens within one segment.

1. **Blocks.** Segment ``b`` owns ``ceil(L_b / K)`` consecutive blocks of ``K`` rows, so no block
   crosses a segment boundary. The rows are copied into a buffer of ``N // K + B`` blocks (a
   static bound on the number of blocks used) and scanned within each block: with the torch
   scan over a block-major ``[blocks, K, *inner]`` buffer (cumsum, cumprod), or with ``K - 1``
   combines of contiguous rows of a position-major ``[K, blocks, *inner]`` buffer (max, min,
   logaddexp: ``torch.cummax`` and ``torch.logcumsumexp`` are slow on many short lines). Slots
   past a segment's end are never read by a real row: a scan is causal.
2. **Block prefixes.** The last row of each scanned block is the block's total. The totals form a
   ragged array with ``ceil(L_b / K)`` blocks per segment, scanned within segments into the
   exclusive prefix that each block combines with its rows, in one of two exact ways:

   * *padded*: the totals padded to ``[B, ceil(max_length / K), *inner]``, scanned over dim 1.
     Its shapes are symbolic in the lengths, so this is the path under ``torch.compile`` (one
     graph for all batches). In eager mode it runs when that grid is no larger than the blocks.
   * *doubling*: a Hillis-Steele scan over the blocks in ``ceil(log2(max_length / K))`` steps of
     block-sized work. Memory stays linear in ``N`` however long the longest segment (the grid
     would take ``B * max_length / K`` rows). Its step count is a Python loop over the maximum
     length, so under ``torch.compile`` it would add a graph per power of two: eager mode only,
     except for training ``cumprod`` (see ``docs/semantics.md``, "Scans").
3. **Combine and gather.** Each block's prefix is combined (``+``, ``*``, max, min, logaddexp)
   into its rows, which are gathered back to the order of ``values``.

``reverse=True`` maps position ``p`` of a segment of length ``L`` to slot ``L - 1 - p``;
``exclusive=True`` reads the slot before a row's own (the identity for the first row), which is
not "inclusive minus x" (that breaks cumprod with zeros, and extrema). ``K`` is 16 under
``torch.compile``; in eager mode it is the largest power of two up to the mean length, between
1 and 32, so the buffer holds at most ``N + B * K <= 2 N`` rows (``N >= B``).

Large inputs in eager mode take one autograd Function (with backward, jvp and vmap rules) over
the native streaming scans (the C kernels of ``ragged/kernels/``: each segment scanned in order with a float64 accumulator, forward and backward, one pass, no
buffer), or, where those cannot run, over in-place torch kernels (cumsum, cummax, cummin:
buffer and output are the only large allocations) or the composite scan (cumprod,
logcumsumexp). ``cummax``/``cummin`` route the gradient of each output to the element
attaining its running extremum (the last one at ties, as ``torch.cummax``): the composite path
gathers the values at that index, the fast path finds it only for the gradient.

Sizes are static (no host sync, one graph under ``torch.compile(dynamic=True)``) when the
partition knows its maximum length, as arrays from the factories do. Otherwise a ragged-axis scan
reads the maximum length once (one host sync).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import KEEP, normalize_axis
from .._errors import Func, type_error, value_error
from .._partition import RowPartition
from .._registry import op, refuse
from .._versions import check_unchanged
from ..kernels._monoids import LOGSUMEXP, MAX, MIN, PROD, SUM, Monoid, dense_scan
from ..kernels._scan import scan_rows
from ._grouping import group

# --- public ops -------------------------------------------------------------------------------


def _scan(
    func: Func,
    m: Monoid,
    x: RaggedArray,
    axis: int | str,
    reverse: bool,
    exclusive: bool,
    *,
    float_only: bool = False,
) -> RaggedArray:
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", type(x).__name__)
    check_unchanged(func, x)  # declared checks=True
    for name, flag in (("reverse", reverse), ("exclusive", exclusive)):
        if not isinstance(flag, bool):
            raise type_error(func, name, "must be a bool", type(flag).__name__)
    if float_only and not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise type_error(func, "x", "must have a floating-point dtype", x.dtype)
    dim = normalize_axis(func, x, axis)
    nr = x.ragged_ndim
    if dim == 0:
        raise value_error(
            func, "axis", "cannot be the batch axis (segments differ in length)", repr(axis)
        )
    if dim > nr:
        return RaggedArray(
            dense_scan(m, x.values, dim - nr, reverse, exclusive), x.partition, x.axes
        )
    if dim < nr:  # an outer axis: scan each column's entries, in row order
        return _scan_outer_axis(x, dim, m, reverse, exclusive)
    level, max_length = x.partition.levels[-1], x.partition.max_length(nr - 1)
    return RaggedArray(
        _scan_level(m, x.values, level, max_length, reverse, exclusive),
        x.partition,
        x.axes,
    )


def _scan_outer_axis(
    x: RaggedArray, dim: int, m: Any, reverse: bool, exclusive: bool
) -> RaggedArray:
    """Scan along outer axis ``dim`` (over ``i`` of ``(B, N*, M*)``): gather each column
    (``(b, j)``) into a contiguous run (a stable sort of the column ids keeps row order), scan
    the runs, scatter back."""
    grouping = group(x, (dim,), exact=False)
    ids = grouping.segments.ids
    order = torch.argsort(ids, stable=True)
    runs = RowPartition.from_lengths(grouping.segments.counts, ids.shape[0])
    # A run has at most one entry per row along the axis: their count bounds its length.
    bound = x.partition.max_length(dim - 1)
    scanned = _scan_level(m, x.values.index_select(0, order), runs, bound, reverse, exclusive)
    out = torch.empty_like(scanned).index_copy(0, order, scanned)
    return RaggedArray(out, x.partition, x.axes)


def _scan_level(
    m: Any,
    values: Tensor,
    level: RowPartition,
    max_length: int,
    reverse: bool,
    exclusive: bool,
) -> Tensor:
    """The segmented scan of ``values`` whose runs are the rows of ``level``."""
    # torch.cumprod's backward reads the size of its scanned dim (guard_int): on the padded
    # grid under compile that would be one graph per width, so training takes doubling (one
    # graph per power of two of the width); inference keeps the padded grid.
    method = "auto"
    if m is PROD and values.requires_grad and torch.compiler.is_compiling():
        method = "doubling"
    return scan_rows(
        m, values, level, max_length, reverse=reverse, exclusive=exclusive, method=method
    )


@op(
    "scans",
    rule=KEEP,
    args="x: ragged, axis: axis?, reverse: bool?, exclusive: bool?",
    torch=(torch.cumsum,),
    methods=("cumsum",),
    torch_args="input, dim, *, dtype=None",
    checks=True,
)
def cumsum(
    x: RaggedArray, axis: int | str = 1, *, reverse: bool = False, exclusive: bool = False
) -> RaggedArray:
    """Cumulative sum along ``axis``, within each segment for the ragged axis.

    Exact per segment: a segment's result depends on its own rows only. Integer and bool
    inputs accumulate in int64, as ``torch.cumsum``.

    Args:
        x: the array.
        axis: the ragged axis (default) or an inner axis; an int or a name.
        reverse: scan from the end of each segment.
        exclusive: each position gets the sum of the elements strictly before it (0 first).

    Returns:
        A RaggedArray with the partition of ``x``.

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0, 3.0], [], [4.0, 5.0]])
    >>> ragged.cumsum(x).to_list()
    [[1.0, 3.0, 6.0], [], [4.0, 9.0]]
    >>> ragged.cumsum(x, reverse=True, exclusive=True).to_list()
    [[5.0, 3.0, 0.0], [], [5.0, 0.0]]
    """
    return _scan(cumsum, SUM, x, axis, reverse, exclusive)


@op(
    "scans",
    rule=KEEP,
    args="x: ragged, axis: axis?, reverse: bool?, exclusive: bool?",
    torch=(torch.cumprod,),
    methods=("cumprod",),
    torch_args="input, dim, *, dtype=None",
    checks=True,
)
def cumprod(
    x: RaggedArray, axis: int | str = 1, *, reverse: bool = False, exclusive: bool = False
) -> RaggedArray:
    """Cumulative product along ``axis``, within each segment for the ragged axis.

    Gradients are exact with zeros (``torch.cumprod``'s rule within each block of rows).

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0, 3.0], [4.0, 0.0, 5.0]])
    >>> ragged.cumprod(x).to_list()
    [[1.0, 2.0, 6.0], [4.0, 0.0, 0.0]]
    >>> ragged.cumprod(x, exclusive=True).to_list()
    [[1.0, 1.0, 2.0], [1.0, 4.0, 0.0]]
    """
    return _scan(cumprod, PROD, x, axis, reverse, exclusive)


@op(
    "scans", rule=KEEP, args="x: ragged, axis: axis?, reverse: bool?, exclusive: bool?", checks=True
)
def cummax(
    x: RaggedArray, axis: int | str = 1, *, reverse: bool = False, exclusive: bool = False
) -> RaggedArray:
    """Running maximum along ``axis`` (values only, like ``jax.lax.cummax``).

    NaN propagates. The gradient of each output goes to the element ``torch.cummax`` would
    name: the last one (in scan order) attaining the running maximum. ``exclusive`` puts
    ``-inf`` (the dtype's minimum for integers) first.

    >>> import ragged
    >>> x = ragged.array([[1.0, 3.0, 2.0], [], [0.0, 5.0]])
    >>> ragged.cummax(x).to_list()
    [[1.0, 3.0, 3.0], [], [0.0, 5.0]]
    >>> ragged.cummax(x, reverse=True).to_list()
    [[3.0, 3.0, 2.0], [], [5.0, 5.0]]
    """
    return _scan(cummax, MAX, x, axis, reverse, exclusive)


@op(
    "scans", rule=KEEP, args="x: ragged, axis: axis?, reverse: bool?, exclusive: bool?", checks=True
)
def cummin(
    x: RaggedArray, axis: int | str = 1, *, reverse: bool = False, exclusive: bool = False
) -> RaggedArray:
    """Running minimum along ``axis`` (values only); see [`cummax`][ragged.cummax].

    >>> import ragged
    >>> ragged.cummin(ragged.array([[3.0, 1.0, 2.0], [4.0]])).to_list()
    [[3.0, 1.0, 1.0], [4.0]]
    """
    return _scan(cummin, MIN, x, axis, reverse, exclusive)


@op(
    "scans",
    rule=KEEP,
    args="x: ragged, axis: axis?, reverse: bool?, exclusive: bool?",
    torch=(torch.logcumsumexp,),
    methods=("logcumsumexp",),
    torch_args="input, dim, *, dtype=None",
    checks=True,
)
def logcumsumexp(
    x: RaggedArray, axis: int | str = 1, *, reverse: bool = False, exclusive: bool = False
) -> RaggedArray:
    """``log(cumsum(exp(x)))`` along ``axis``, computed stably; ``exclusive`` puts ``-inf`` first.

    >>> import ragged
    >>> x = ragged.array([[0.0, 0.0, 0.0], [1.0]])
    >>> ragged.logcumsumexp(x).to_list()  # doctest: +ELLIPSIS
    [[0.0, 0.693..., 1.098...], [1.0]]
    """
    return _scan(logcumsumexp, LOGSUMEXP, x, axis, reverse, exclusive, float_only=True)


refuse(
    torch.cummax,
    torch.cummin,
    family="scans",
    hint="torch's returns the indices too; ragged.cummax(x, axis) and ragged.cummin give the "
    "running values",
    see=("ragged.cummax", "ragged.cummin"),
)
