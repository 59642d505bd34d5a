"""The structure of ragged levels: ``flatten``, ``unflatten``, ``local_index``, ``combinations``.

Axis rules: ``flatten`` **merges** an axis into the next one (the merged axis keeps the inner
name: ``(B, S*, T*) -> (B, T*)``, tokens per document); ``unflatten`` **adds one** axis (named
by ``name``) before the one it splits; ``local_index`` keeps the axes down to ``axis`` (one
entry per row of that axis); ``combinations`` builds a **new partition** with the input's names.

Host syncs: ``flatten``, ``unflatten`` (with ``validate=False``, or under ``torch.compile``) and
``local_index`` are sync-free; ``unflatten`` checks the counts by reading one flag otherwise.
``combinations`` reads its output sizes once, except for pairs (``n=2``) of a partition that
knows ``sum(L**2)`` and its maximum length (arrays from the factories); along an outer axis it
reads the sizes of the levels below once more.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import FLATTEN, NEW, ROWS, STACK, check_names, normalize_axis, remove
from .._errors import Func, type_error, typename, value_error
from .._factory_checks import validating
from .._partition import Partition, RowPartition
from .._registry import op
from ..kernels._segment import Segments, segment_sum
from ._indexing._axis import checked_array, ragged_axis, same_upper, whole_rows
from ._levels import read

# --- flatten, unflatten -----------------------------------------------------------------------


@op("structure", rule=FLATTEN, args="x: ragged, axis: axis?")
def flatten(x: RaggedArray, axis: int | str = 1) -> Any:
    """Merge ``axis`` with the axis after it (awkward's ``flatten``, TF's ``merge_dims``).

    * ``axis=0``: the segments' rows become the segments: ``(B, S*, T*) -> (sum S, T*)``; a
      one-level ``(B, L*, *inner)`` gives its values, a dense ``(total, *inner)`` tensor.
    * a ragged axis with a ragged axis after it: every row's children are joined end to end,
      ``(B, S*, T*) -> (B, (S*T)*)``: the tokens of each document.
    * the innermost ragged axis and the first inner axis: ``(B, L*, D, ...) -> (B, (L*D)*, ...)``.
    * two inner axes: ``values.flatten`` on them.

    The values are not copied (but for merging a ragged axis with a non-contiguous inner one)
    and nothing is read from the device. The merged axis keeps the name of the inner axis of
    the two. Undone by [`unflatten`][ragged.unflatten].

    >>> import ragged
    >>> x = ragged.array([[[1, 2], [3]], [], [[4], [5, 6]]])
    >>> ragged.flatten(x).to_list()
    [[1, 2, 3], [], [4, 5, 6]]
    >>> ragged.flatten(x, axis=0).to_list()
    [[1, 2], [3], [4], [5, 6]]
    """
    func = flatten
    checked_array(func, x)
    dim = normalize_axis(func, x, axis)
    if dim == x.ndim - 1:
        raise value_error(
            func, "axis", f"must have an axis after it to merge with (at most {x.ndim - 2})", axis
        )
    nr = x.ragged_ndim
    levels = x.partition.levels
    names = remove(x.axes, [dim])
    if dim == 0:
        if nr == 1:
            return x.values
        return RaggedArray(x.values, Partition(levels[1:]), names)
    if dim < nr:
        outer, inner = levels[dim - 1], levels[dim]
        offsets = inner.offsets.index_select(0, outer.offsets)
        row_ids = outer.row_ids.index_select(0, inner.row_ids)
        merged = RowPartition(offsets, torch.diff(offsets), row_ids, None)
        partition = Partition((*levels[: dim - 1], merged, *levels[dim + 1 :]))
        return RaggedArray(x.values, partition, names)
    if dim == nr:
        size = x.values.shape[1]
        level = levels[-1]
        values = x.values.reshape(x.values.shape[0] * size, *x.values.shape[2:])
        row_ids = level.row_ids[:, None].expand(-1, size).reshape(-1)
        longest = None if level.max_length is None else level.max_length * size
        squares = None if level.sum_squares is None else level.sum_squares * size * size
        merged = RowPartition(level.offsets * size, level.lengths * size, row_ids, longest, squares)
        return RaggedArray(values, Partition((*levels[:-1], merged)), names)
    return RaggedArray(x.values.flatten(dim - nr, dim - nr + 1), x.partition, names)


@op(
    "structure",
    rule=STACK,
    args="x: ragged, counts: any, axis: axis?, name: str?, validate: bool?",
)
def unflatten(
    x: RaggedArray,
    counts: RaggedArray | Tensor | int,
    axis: int | str = 1,
    *,
    name: str | None = None,
    validate: bool = True,
) -> RaggedArray:
    """Split ``axis`` into groups of consecutive entries: a new ragged axis before it.

    * ``axis=0``: ``counts`` is a 1-D integer tensor of group sizes summing to ``B``; the
      segments are grouped into ``len(counts)`` new segments.
    * a ragged axis ``k``: ``counts`` is an integer RaggedArray with ``k`` ragged axes (the first
      ``k - 1`` those of ``x``): the sizes of the groups of every row of axis ``k - 1``, which
      sum to that row's length (for ``k = 1``: ``(B, G*)``, the groups of every segment). A
      list of group sizes per row is unambiguous where one flat list is not (an empty group at
      the end of a row or at the start of the next).
    * an int ``counts`` splits the innermost ragged axis into rows of a new dense axis of that
      size (every row's length must be a multiple of it): the inverse of ``flatten`` with the
      first inner axis.

    The values are not copied. The new axis comes at position ``axis``; on a named array it is
    called ``name``. ``validate`` checks the counts (one host read; skipped under
    ``torch.compile``).

    >>> import ragged, torch
    >>> x = ragged.array([[1, 2, 3], [], [4, 5, 6]])
    >>> ragged.unflatten(x, ragged.array([[2, 1], [], [1, 0, 2]])).to_list()
    [[[1, 2], [3]], [], [[4], [], [5, 6]]]
    >>> ragged.unflatten(x, torch.tensor([1, 2]), axis=0).to_list()
    [[[1, 2, 3]], [[], [4, 5, 6]]]
    """
    func = unflatten
    checked_array(func, x)
    if not isinstance(validate, bool):
        raise type_error(func, "validate", "must be a bool", typename(validate))
    dim = normalize_axis(func, x, axis)
    nr = x.ragged_ndim
    if dim > nr:
        raise value_error(
            func, "axis", f"must be the batch axis or a ragged axis (0 to {nr})", axis
        )
    names = None
    if x.axes is not None:
        if name is None:
            raise type_error(func, "name", "must name the new axis of a named array", None)
        names = check_names(func, (*x.axes[:dim], name, *x.axes[dim:]), x.ndim + 1, "name")
    elif name is not None:
        raise type_error(func, "name", "can name the new axis of a named array only", repr(name))
    levels = x.partition.levels
    if isinstance(counts, int) and not isinstance(counts, bool):
        return _unflatten_inner(func, x, counts, dim, names, validate)
    if dim == 0:
        return _unflatten_batch(func, x, counts, names, validate)
    if not isinstance(counts, RaggedArray):
        raise type_error(
            func,
            "counts",
            "must be a RaggedArray of group sizes for a ragged axis",
            typename(counts),
        )
    if counts.values.dtype.is_floating_point or counts.values.dtype in (torch.bool,):
        raise type_error(func, "counts", "must have an integer dtype", counts.values.dtype)
    if counts.ragged_ndim != dim or counts.values.dim() != 1:
        raise value_error(
            func,
            "counts",
            f"must have {dim} ragged axes and no inner axes (group sizes per row of axis "
            f"{dim - 1})",
            f"{counts.ragged_ndim} ragged axes, {counts.ndim} axes",
        )
    same_upper(func, "counts", x, counts, dim - 1)
    level = levels[dim - 1]
    groups = counts.partition.levels[-1]
    sizes = counts.values.to(torch.int64)
    if validating(validate):
        per_row = segment_sum(sizes, Segments(groups.row_ids, groups.num_rows, groups.lengths))
        if not bool(((per_row == level.lengths).all() & (sizes >= 0).all()).item()):
            raise value_error(
                func,
                "counts",
                f"must be non-negative and sum to the length of every row of axis {dim}",
                "other sums",
            )
    members = RowPartition.from_lengths(sizes, level.num_children)
    partition = Partition((*levels[: dim - 1], groups, members, *levels[dim:]))
    return RaggedArray(x.values, partition, names)


def _unflatten_batch(
    func: Func, x: RaggedArray, counts: Any, names: Any, validate: bool
) -> RaggedArray:
    if not isinstance(counts, Tensor) or counts.dim() != 1 or counts.dtype.is_floating_point:
        raise type_error(
            func,
            "counts",
            "must be a 1-D integer tensor of group sizes for axis 0",
            typename(counts),
        )
    sizes = counts.to(device=x.device, dtype=torch.int64)
    if validating(validate) and not bool(
        ((sizes.sum() == x.num_segments) & (sizes >= 0).all()).item()
    ):
        raise value_error(
            func, "counts", f"must be non-negative and sum to {x.num_segments} (B)", "other sums"
        )
    groups = RowPartition.from_lengths(sizes, x.num_segments)
    return RaggedArray(x.values, Partition((groups, *x.partition.levels)), names)


def _unflatten_inner(
    func: Func, x: RaggedArray, size: int, dim: int, names: Any, validate: bool
) -> RaggedArray:
    nr = x.ragged_ndim
    if dim != nr or size <= 0:
        raise value_error(
            func,
            "counts",
            f"can be an int only for the innermost ragged axis {nr}, and positive (rows of a "
            "new dense axis)",
            f"{size} for axis {dim}",
        )
    level = x.partition.levels[-1]
    if validating(validate) and not bool((level.lengths % size == 0).all().item()):
        raise value_error(
            func, "counts", "must divide the length of every row of the innermost axis", size
        )
    values = x.values.reshape(x.values.shape[0] // size, size, *x.values.shape[1:])
    rows = RowPartition.from_lengths(
        level.lengths // size,
        values.shape[0],
        None if level.max_length is None else level.max_length // size,
    )
    return RaggedArray(values, Partition((*x.partition.levels[:-1], rows)), names)


# --- local_index ------------------------------------------------------------------------------


@op("structure", rule=ROWS, args="x: ragged, axis: axis?")
def local_index(x: RaggedArray, axis: int | str | None = None) -> RaggedArray:
    """Each entry's position within its row along a ragged ``axis`` (awkward's ``local_index``).

    The result is an int64 RaggedArray with the ragged axes of ``x`` down to ``axis`` and no
    inner axes: ``[0, 1, ..., L - 1]`` in every row. ``axis=None`` means the innermost ragged
    axis (the result has ``x``'s partition object). Sync-free.

    >>> import ragged
    >>> x = ragged.array([[[1, 2], [3]], [], [[4, 5, 6]]])
    >>> ragged.local_index(x).to_list()
    [[[0, 1], [0]], [], [[0, 1, 2]]]
    >>> ragged.local_index(x, axis=1).to_list()
    [[0, 1], [], [0]]
    """
    func = local_index
    checked_array(func, x)
    dim = x.ragged_ndim if axis is None else ragged_axis(func, x, axis)
    levels = x.partition.levels
    partition = x.partition if dim == x.ragged_ndim else Partition(levels[:dim])
    names = None if x.axes is None else x.axes[: dim + 1]
    return RaggedArray(levels[dim - 1].positions(), partition, names)


# --- combinations -----------------------------------------------------------------------------


def _choose(lengths: Tensor, n: int, replacement: bool) -> list[Tensor]:
    """``C(L, m)`` (``C(L + m - 1, m)`` with replacement) for ``m = 1 .. n``, exactly in int64."""
    out, count = [], torch.ones_like(lengths)
    for m in range(1, n + 1):
        top = lengths + (m - 1) if replacement else (lengths - (m - 1)).clamp_min(0)
        count = count * top // m  # C(L, m - 1) * (L - m + 1) is m * C(L, m)
        out.append(count)
    return out


def _sizes(level: RowPartition, counts: list[Tensor], n: int, replacement: bool) -> list[int]:
    """The number of partial tuples of each size 1 .. n, and the longest row of n-tuples."""
    total, squares, longest = level.num_children, level.sum_squares, level.max_length
    if n == 1 and longest is not None:
        return [total, longest]
    if n == 2 and squares is not None and longest is not None:  # static: sum L^2 is known
        pairs = (squares + total) // 2 if replacement else (squares - total) // 2
        top = longest * (longest + 1) // 2 if replacement else longest * (longest - 1) // 2
        return [total, pairs, top]
    zero = counts[-1].new_zeros(())
    stats = [c.sum() for c in counts[1:]] + [counts[-1].max() if counts[-1].numel() else zero]
    return [total, *read(stats)]  # the one host sync: the sizes depend on the data


@op(
    "structure",
    rule=NEW,
    args="x: ragged, n: int, axis: axis?, replacement: bool?",
)
def combinations(
    x: RaggedArray, n: int, axis: int | str = 1, *, replacement: bool = False
) -> tuple[RaggedArray, ...]:
    """The ``n``-tuples of entries ``i1 < i2 < ... < in`` of every row along ``axis``.

    awkward's ``combinations`` (``unzip``-ped): returns ``n`` aligned RaggedArrays, one per
    position in the tuple, all with one new partition along ``axis`` (``C(L, n)`` entries per
    row, in lexicographic order of the indices) and the names of ``x``. ``replacement=True``
    allows repeats (``i1 <= ... <= in``, ``C(L + n - 1, n)`` entries). Along an outer ragged
    axis the entries are whole rows with their subtrees. Stack them with
    [`ragged.stack`][ragged.stack] for one ``(..., n, *inner)`` array; pairs feed pair features
    (``a - b`` of ``a, b = combinations(x, 2)``).

    The output size depends on the lengths: it is read once (one host sync), except for pairs
    of a partition that knows ``sum(L**2)`` and its maximum length (arrays from the factories);
    along an outer axis the sizes of the levels below are read once more. Differentiable.

    Args:
        x: the array.
        n: the tuple size, at least 1.
        axis: the ragged axis whose entries combine (default 1).
        replacement: allow an entry to repeat within a tuple.

    >>> import ragged
    >>> a, b = ragged.combinations(ragged.array([[1, 2, 3], [4], []]), 2)
    >>> a.to_list(), b.to_list()
    ([[1, 1, 2], [], []], [[2, 3, 3], [], []])
    """
    func = combinations
    checked_array(func, x)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise value_error(func, "n", "must be an int >= 1", repr(n))
    if not isinstance(replacement, bool):
        raise type_error(func, "replacement", "must be a bool", typename(replacement))
    dim = ragged_axis(func, x, axis)
    levels = x.partition.levels
    level = levels[dim - 1]
    counts = _choose(level.lengths, n, replacement)
    sizes = _sizes(level, counts, n, replacement)
    # Grow the tuples of each row one position at a time, in lexicographic order: a tuple
    # ending at position q extends with every q' > q (q' >= q with replacement).
    parent = level.row_ids
    positions = [level.positions()]
    step = 0 if replacement else 1
    for m in range(1, n):
        last = positions[-1]
        more = (level.lengths.index_select(0, parent) - last - step).clamp_min(0)
        grown = torch.repeat_interleave(
            torch.arange(last.shape[0], device=x.device), more, output_size=sizes[m]
        )
        starts = torch.nn.functional.pad(torch.cumsum(more, 0), (1, 0))
        within = torch.arange(sizes[m], device=x.device) - starts.index_select(0, grown)
        positions = [p.index_select(0, grown) for p in positions]
        positions.append(positions[-1] + step + within)
        parent = parent.index_select(0, grown)
    new = RowPartition.from_lengths(counts[-1], sizes[n - 1], sizes[n])
    first = level.offsets.index_select(0, parent)
    if dim == x.ragged_ndim:
        partition = Partition((*levels[:-1], new))
        return tuple(
            RaggedArray(x.values.index_select(0, first + p), partition, x.axes) for p in positions
        )
    out = []
    for p in positions:
        part, rows = whole_rows(x, dim, levels[: dim - 1], new, first + p, None)
        out.append(RaggedArray(x.values.index_select(0, rows), part, x.axes))
    return tuple(out)
