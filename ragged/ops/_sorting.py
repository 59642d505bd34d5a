"""Sorting within segments: ``sort``, ``argsort``, ``topk`` and ``unique_consecutive``.

Along the ragged axis every segment is sorted separately, each inner column independently; along
an inner axis the torch op runs on the values. Axis rules (docs/semantics.md, "Axis names"): ``sort`` and
``argsort`` **keep all** (the input's partition object); ``topk`` and ``unique_consecutive``
along the ragged axis build a **new partition** (shorter segments), and ``topk`` along an inner
axis keeps all axes (the sorted axis shrinks to ``min(k, size)``).

Order: ascending, or descending with ``descending=True``; NaN sorts above every number, as in
``torch.sort`` (last ascending, first descending); ``-0.0`` and ``0.0`` tie. Ties always keep
their input order (a stable sort, also when ``stable=False``), so results equal a per-segment
``torch.sort(segment, stable=True)`` exactly, descending included.

How (no host sync): each column is sorted once, stably, by the integer key
``segment * 2**32 + rank(value)``, where ``rank`` maps a value's bits to an order-preserving
32-bit integer (dtypes of at most 32 bits: float32/16, bfloat16, int32/16/8, uint8, bool).
64-bit dtypes (float64, int64) take two stable sorts (by the low half of the rank, then by
segment and the high half). The keys are 1-D int64 runs, which torch sorts with a radix sort:
measured here on ``[2**18, 16]`` float32 values in 2048 segments, 104 ms against 188 ms for one
2-D sort of the same keys and 1980 ms for two stable ``torch.sort`` calls (by value, then by
segment). Batches of more than ``2**17`` rows (on the CPU, eagerly) sort in ranges of whole
segments of about that many rows, so that every sort stays in cache, through warm buffers, and
``sort`` with nothing to differentiate gathers each range's values without holding the whole
permutation (docs/semantics.md has the measurements). ``topk`` and ``unique_consecutive`` along
the ragged axis read the output's size once (it depends on the data).

>>> import ragged
>>> x = ragged.array([[3.0, 1.0, 2.0], [], [5.0, 4.0]])
>>> ragged.sort(x).to_list()
[[1.0, 2.0, 3.0], [], [4.0, 5.0]]
>>> ragged.argsort(x, descending=True).to_list()
[[0, 2, 1], [], [0, 1]]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import KEEP, NEW, normalize_axis
from .._errors import Func, type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import op
from .._versions import check_unchanged
from ..kernels._segment import Segments, segment_sum
from ..kernels._sort import RANK_WIDTH, as_columns, segment_order, segment_sorted, take_columns
from ._grouping import group, positions_along
from ._indexing._axis import slice_plan
from ._levels import gather_items, read, same_as_previous, subtree_stats


def _checked(func: Func, x: Any, axis: int | str) -> int:
    """The sort axis of ``x`` (ragged or inner), after the checks every op here shares."""
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", typename(x))
    check_unchanged(func, x)  # declared checks=True
    if x.dtype not in RANK_WIDTH:
        raise type_error(
            func, "x", f"must have a dtype among {', '.join(map(str, RANK_WIDTH))}", x.dtype
        )
    dim = normalize_axis(func, x, axis)
    if dim == 0:
        raise value_error(
            func, "axis", "cannot be the batch axis (sort within segments: axis 1)", axis
        )
    return dim


def _flag(func: Func, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise type_error(func, name, "must be a bool", typename(value))


def _ragged_perm(x: RaggedArray, dim: int, descending: bool) -> Tensor:
    """The ``[rows, C]`` permutation that sorts every column along ragged axis ``dim``.

    The innermost axis sorts the rows of the last level. An outer axis sorts the columns of
    ``ragged.ops._grouping`` (the entries that share their position below the axis): they are
    made contiguous runs by a stable sort of their ids, sorted, and mapped back.
    """
    columns = as_columns(x.values)
    if dim == x.ragged_ndim:
        level = x.partition.levels[-1]
        return segment_order(columns, level.row_ids, level.num_rows, descending)
    segments = group(x, (dim,), exact=False).segments
    order = torch.argsort(segments.ids, stable=True)
    runs = segments.ids.index_select(0, order)
    perm = segment_order(columns.index_select(0, order), runs, segments.num, descending)
    return torch.empty_like(perm).index_copy(0, order, order[perm])


def _ragged_positions(x: RaggedArray, dim: int, perm: Tensor, rows: Tensor | None = None) -> Tensor:
    """The rows of ``perm`` as positions along ragged axis ``dim`` (``argsort``'s values);
    ``perm``'s rows are the ``rows`` of the sorted order (default: all)."""
    if dim == x.ragged_ndim:
        level = x.partition.levels[-1]
        starts = level.offsets.index_select(0, level.row_ids)
        starts = starts if rows is None else starts.index_select(0, rows)
        return _positions(perm, starts, x.inner_shape)
    position = positions_along(x.partition, dim)
    return position[perm].reshape(perm.shape[0], *x.inner_shape)


def _positions(perm: Tensor, starts: Tensor, inner: torch.Size) -> Tensor:
    """Rows of ``perm`` made positions within their segments (``starts``: segment start)."""
    return (perm - starts[:, None]).reshape(perm.shape[0], *inner)


# --- sort / argsort ---------------------------------------------------------------------------


@op(
    "sorting",
    rule=KEEP,
    args="x: ragged, axis: axis?, descending: bool?, stable: bool?",
    checks=True,
)
def sort(
    x: RaggedArray, axis: int | str = 1, *, descending: bool = False, stable: bool = True
) -> RaggedArray:
    """Sort every segment along ``axis`` (default: the ragged axis), each column separately.

    Equal to ``torch.sort(segment, dim=axis - 1, descending=descending, stable=True).values``
    on every segment; see the module docstring for NaN and ties. No host sync. Differentiable:
    the gradient follows the permutation (as ``torch.sort``'s).

    Args:
        x: the array (real dtype).
        axis: the ragged axis (1) or an inner axis (int or name); not the batch axis.
        descending: largest first.
        stable: accepted for ``torch.sort`` compatibility; the sort is always stable.

    Returns:
        A RaggedArray with ``x``'s partition object and names.

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.tensor([[3, 0], [1, 2], [2, 1]]), [2, 1])
    >>> ragged.sort(x).to_list()
    [[[1, 0], [3, 2]], [[2, 1]]]
    >>> ragged.sort(x, axis=2, descending=True).to_list()
    [[[3, 0], [2, 1]], [[2, 1]]]
    """
    func = sort
    dim = _checked(func, x, axis)
    _flag(func, "descending", descending)
    _flag(func, "stable", stable)
    if dim > x.ragged_ndim:
        out = torch.sort(x.values, dim=dim - x.ragged_ndim, descending=descending, stable=True)
        return x.with_values(out.values)
    if dim == x.ragged_ndim:
        level = x.partition.levels[-1]
        picked = segment_sorted(as_columns(x.values), level.row_ids, level.num_rows, descending)
        return x.with_values(picked.reshape(x.values.shape))
    return x.with_values(take_columns(x.values, _ragged_perm(x, dim, descending)))


@op(
    "sorting",
    rule=KEEP,
    args="x: ragged, axis: axis?, descending: bool?, stable: bool?",
    torch=(torch.argsort,),
    methods=("argsort",),
    torch_args="input, dim=-1, descending=False, *, stable=False",
    checks=True,
)
def argsort(
    x: RaggedArray, axis: int | str = 1, *, descending: bool = False, stable: bool = True
) -> RaggedArray:
    """Positions that sort every segment along ``axis``: ``sort(x) == x[segment][argsort(x)]``.

    Equal to ``torch.argsort(segment, dim=axis - 1, descending=descending, stable=True)`` on
    every segment: int64 positions *within* each segment (not rows of ``x.values``). No host
    sync.

    Args:
        x: the array (real dtype).
        axis: the ragged axis (1) or an inner axis (int or name); not the batch axis.
        descending: largest first.
        stable: accepted for ``torch.argsort`` compatibility; the sort is always stable.

    Returns:
        An int64 RaggedArray with ``x``'s partition object and names.

    >>> import ragged
    >>> ragged.argsort(ragged.array([[2.0, 1.0, 2.0], [7.0]])).to_list()
    [[1, 0, 2], [0]]
    """
    func = argsort
    dim = _checked(func, x, axis)
    _flag(func, "descending", descending)
    _flag(func, "stable", stable)
    if dim > x.ragged_ndim:
        order = torch.argsort(x.values, dim=dim - x.ragged_ndim, descending=descending, stable=True)
        return x.with_values(order)
    if dim == x.ragged_ndim:  # positions straight from the sort: no permutation first
        level = x.partition.levels[-1]
        starts = level.offsets.index_select(0, level.row_ids)
        columns = as_columns(x.values)
        order = segment_order(columns, level.row_ids, level.num_rows, descending, starts)
        return x.with_values(order.reshape(x.values.shape))
    return x.with_values(_ragged_positions(x, dim, _ragged_perm(x, dim, descending)))


# --- topk -------------------------------------------------------------------------------------


@op(
    "sorting",
    rule=NEW,
    args="x: ragged, k: int, axis: axis?, largest: bool?, sorted: bool?",
    checks=True,
)
def topk(
    x: RaggedArray,
    k: int,
    axis: int | str = 1,
    *,
    largest: bool = True,
    sorted: bool = True,
) -> tuple[RaggedArray, RaggedArray]:
    """The ``k`` largest (or smallest) entries of every segment along ``axis``, and their positions.

    Each segment keeps ``min(k, L_b)`` entries (a short segment keeps all of them rather than
    failing as ``torch.topk`` would). Entries come sorted, largest first (smallest first with
    ``largest=False``), ties in input order: the result is the first ``min(k, L_b)`` entries of
    [`sort`][ragged.sort] and [`argsort`][ragged.argsort] (``sorted=False`` is accepted and returns the same).

    Along the ragged axis the output's size depends on the lengths, so this reads it (and the
    longest output segment) back once, one host sync, unless it is known statically: when
    ``k == 0`` or the partition's known maximum length is at most ``k`` (then every segment is
    sorted whole and the result keeps ``x``'s partition object). Along an inner axis no sync.

    Args:
        x: the array (real dtype).
        k: non-negative number of entries to keep per segment (per row, for an inner axis).
        axis: the ragged axis (1) or an inner axis (int or name).
        largest: keep the largest entries (else the smallest).
        sorted: accepted for ``torch.topk`` compatibility; results are always sorted.

    Returns:
        ``(values, indices)``: RaggedArrays with the same new partition; ``indices`` are int64
        positions within each segment. Differentiable in ``values``.

    >>> import ragged
    >>> x = ragged.array([[1.0, 5.0, 3.0], [2.0], []])
    >>> values, indices = ragged.topk(x, 2)
    >>> values.to_list(), indices.to_list()
    ([[5.0, 3.0], [2.0], []], [[1, 2], [0], []])
    """
    func = topk
    dim = _checked(func, x, axis)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise value_error(func, "k", "must be a non-negative int", repr(k))
    _flag(func, "largest", largest)
    _flag(func, "sorted", sorted)
    nr = x.ragged_ndim
    if dim > nr:
        out = torch.sort(x.values, dim=dim - nr, descending=largest, stable=True)
        size = min(k, x.values.shape[dim - nr])
        values = out.values.narrow(dim - nr, 0, size)
        indices = out.indices.narrow(dim - nr, 0, size)
        return x.with_values(values), x.with_values(indices)
    levels = x.partition.levels
    level = levels[dim - 1]
    if k == 0 and dim == nr:  # sync-free: every row empty
        empty = RowPartition(
            torch.zeros_like(level.offsets), torch.zeros_like(level.lengths), level.row_ids[:0], 0
        )
        partition = Partition((*levels[:-1], empty))
        values = x.values[:0]
        indices = torch.zeros(values.shape, dtype=torch.int64, device=x.device)
        return RaggedArray(values, partition, x.axes), RaggedArray(indices, partition, x.axes)
    perm = _ragged_perm(x, dim, largest)
    # The first k entries along the axis of the sorted array (a full sort when all fit).
    plan = slice_plan(func, x, dim, None, k, 1)
    if plan is None:
        return x.with_values(take_columns(x.values, perm)), x.with_values(
            _ragged_positions(x, dim, perm)
        )
    partition, rows = plan
    perm = perm.index_select(0, rows)
    top = RaggedArray(take_columns(x.values, perm), partition, x.axes)
    return top, RaggedArray(_ragged_positions(x, dim, perm, rows), partition, x.axes)


# --- unique_consecutive -----------------------------------------------------------------------


@op("sorting", rule=NEW, args="x: ragged, axis: axis?, return_inverse: bool?, return_counts: bool?")
def unique_consecutive(
    x: RaggedArray,
    axis: int | str = 1,
    *,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> Any:
    """Collapse runs of equal consecutive rows within every segment.

    Equal to ``torch.unique_consecutive(segment, dim=0, ...)`` on every segment: a row is kept
    when it is the first of its segment or differs from the previous row (in any inner entry,
    for rows with inner axes). NaN never equals anything, so NaNs are not collapsed. The
    output's size depends on the data: this reads it (and the longest output segment) back
    once, one host sync. Each output row is the first row of its run, so gradients reach only
    the first row of every run.

    Args:
        x: the array.
        axis: the ragged axis (the only one allowed).
        return_inverse: also return, for each input row, the position of its run in its
            segment's output (an int64 RaggedArray with ``x``'s partition object).
        return_counts: also return the length of each run (int64, the output's partition).

    Returns:
        The deduplicated RaggedArray, or a tuple ``(output, inverse?, counts?)`` as
        ``torch.unique_consecutive``.

    >>> import ragged
    >>> x = ragged.array([[1, 1, 2, 1], [], [3, 3]])
    >>> ragged.unique_consecutive(x).to_list()
    [[1, 2, 1], [], [3]]
    >>> out, counts = ragged.unique_consecutive(x, return_counts=True)
    >>> counts.to_list()
    [[2, 1, 1], [], [2]]
    """
    func = unique_consecutive
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", typename(x))
    dim = normalize_axis(func, x, axis)
    nr = x.ragged_ndim
    if not 1 <= dim <= nr:
        raise value_error(
            func,
            "axis",
            f"must be a ragged axis (1 to {nr}: runs are collapsed within the rows of the axis "
            "above)",
            axis,
        )
    _flag(func, "return_inverse", return_inverse)
    _flag(func, "return_counts", return_counts)
    levels = x.partition.levels
    level = levels[dim - 1]
    values = x.values
    if dim == nr:  # rows of values: a row starts a run unless it equals the previous one
        rows = values.shape[0]
        data = as_columns(values.detach())
        changed = (data[1:] != data[:-1]).any(dim=1)
        new_row = level.row_ids[1:] != level.row_ids[:-1]
        head = torch.ones(min(rows, 1), dtype=torch.bool, device=values.device)
        keep = torch.cat([head, changed | new_row])
    else:  # whole rows with their subtrees
        keep = ~same_as_previous(x, dim)
        rows = keep.shape[0]
    lengths = segment_sum(
        keep.to(torch.int64), Segments(level.row_ids, level.num_rows, level.lengths)
    )
    items = torch.arange(rows, device=values.device)
    stats = [lengths.sum(), lengths.max() if lengths.numel() else lengths.new_zeros(())]
    if dim < nr:
        stats += subtree_stats(levels, dim, items, keep.to(torch.int64))
    total, longest, *sizes = read(stats)  # the one host sync
    new = RowPartition.from_lengths(lengths, total, longest)
    heads = torch.nonzero_static(keep, size=total).squeeze(1)  # size known: no further sync
    if dim == nr:
        partition = Partition((*levels[:-1], new))
        out = RaggedArray(values.index_select(0, heads), partition, x.axes)
    else:
        partition, source = gather_items(x, dim, levels[: dim - 1], new, heads, sizes)
        out = RaggedArray(values.index_select(0, source), partition, x.axes)
    names = None if x.axes is None else x.axes[: dim + 1]
    extras: list[RaggedArray] = []
    if return_inverse:
        run = torch.cumsum(keep, 0) - 1  # each entry's run, numbered over all rows
        inverse = run - new.offsets.index_select(0, level.row_ids)
        upper = x.partition if dim == nr else Partition(levels[:dim])
        extras.append(RaggedArray(inverse, upper, names))
    if return_counts:
        ends = torch.cat([heads[1:], heads.new_full((min(total, 1),), rows)])
        per_run = partition if dim == nr else Partition(partition.levels[:dim])
        extras.append(RaggedArray(ends - heads, per_run, names))
    return (out, *extras) if extras else out
