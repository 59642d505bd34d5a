"""Combining arrays: ``concat`` and ``stack``, and taking one apart again with ``split``.

Axis rules (docs/semantics.md, "Axis names"):

* ``concat`` along the batch axis or the ragged axis builds a **new partition**; along an inner
  axis it **keeps** the (shared) partition. All inputs must have the same axis names, or none
  (unnamed inputs take the names of the named ones: names **unify**).
* ``stack`` **adds one** inner axis and keeps the partition object of its first input.
* ``split`` gives each piece a **new partition** (a slice of the input's).

Host syncs: ``concat`` and ``stack`` read nothing from the device (``stack`` compares the
offsets once when its inputs hold equal-valued but distinct partitions, as binary elementwise
ops do). ``split`` reads the offsets at its split points (and each piece's longest segment) in
one transfer, so that the pieces' values are views of the input's.

>>> import ragged
>>> x = ragged.array([[1, 2], [3]])
>>> y = ragged.array([[4], [5, 6]])
>>> ragged.concat([x, y]).to_list()
[[1, 2], [3], [4], [5, 6]]
>>> ragged.concat([x, y], axis=1).to_list()
[[1, 2, 4], [3, 5, 6]]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import NEW, STACK, UNIFY, AxisNames, check_names, normalize_axis
from .._errors import Func, type_error, typename, value_error
from .._format import shape_text
from .._partition import Partition, RowPartition
from .._registry import op
from ._levels import gather_items, view

# --- argument checks shared by concat and stack -----------------------------------------------


def _arrays_arg(func: Func, arrays: Any) -> tuple[RaggedArray, ...]:
    expected = "must be a non-empty sequence of RaggedArrays"
    if isinstance(arrays, (RaggedArray, Tensor, str)) or not isinstance(arrays, Sequence):
        raise type_error(func, "arrays", expected, typename(arrays))
    items = tuple(arrays)
    if not items:
        raise value_error(func, "arrays", expected, "an empty sequence")
    for i, a in enumerate(items):
        if not isinstance(a, RaggedArray):
            raise type_error(
                func, "arrays", "must contain only RaggedArrays", f"{typename(a)} at position {i}"
            )
    return items


def _shapes(arrays: Sequence[RaggedArray]) -> str:
    return ", ".join(shape_text(a) for a in arrays)


def _check_layout(func: Func, arrays: Sequence[RaggedArray]) -> None:
    """Same number of ragged axes and of inner axes."""
    first = arrays[0]
    if any(
        a.ragged_ndim != first.ragged_ndim or a.values.dim() != first.values.dim() for a in arrays
    ):
        raise value_error(
            func,
            "arrays",
            "must have the same number of ragged and inner axes",
            f"shapes {_shapes(arrays)}",
        )


def _check_inner(func: Func, arrays: Sequence[RaggedArray], skip: int | None = None) -> None:
    """Equal inner shapes (``skip``: a dim of ``values`` allowed to differ)."""

    def key(a: RaggedArray) -> tuple[int, ...]:
        return tuple(s for d, s in enumerate(a.values.shape) if d not in (0, skip))

    if any(key(a) != key(arrays[0]) for a in arrays):
        where = "" if skip is None else f" except along the concatenated axis {skip + 1}"
        raise value_error(
            func,
            "arrays",
            f"must have the same inner shape{where}",
            f"shapes {_shapes(arrays)}",
        )


def _unify_names(func: Func, arrays: Sequence[RaggedArray]) -> AxisNames | None:
    """The named inputs' common names (unnamed inputs agree with any); ``None`` if none."""
    named = [a.axes for a in arrays if a.axes is not None]
    if any(n != named[0] for n in named):
        raise value_error(
            func,
            "arrays",
            "must have the same axis names (or none)",
            f"names {[a.axes for a in arrays]}",
        )
    return named[0] if named else None


def _same_partition(func: Func, arrays: Sequence[RaggedArray], what: str) -> Partition:
    first = arrays[0].partition
    for a in arrays[1:]:
        if a.partition is not first and not first.equals(a.partition):
            raise value_error(
                func, "arrays", f"must have equal partitions {what}", f"shapes {_shapes(arrays)}"
            )
    return first


# --- concat -----------------------------------------------------------------------------------


@op(
    "combining",
    rule=UNIFY,
    args="arrays: arrays, axis: axis?",
    torch=(torch.cat, torch.concat, (torch.concatenate, "tensors, axis=0")),
    torch_args="tensors, dim=0",
)
def concat(arrays: Sequence[RaggedArray], axis: int | str = 0) -> RaggedArray:
    """Join arrays along an existing axis.

    * ``axis=0`` (batch): the segments of each array follow those of the previous one. The
      inputs may have any numbers of segments; their inner shapes must match.
    * ``axis=1`` (ragged): segment ``b`` of the result is segment ``b`` of every input joined
      end to end, so lengths add. The inputs must have the same number of segments.
    * an inner axis: the inputs must have equal partitions; their values are joined with
      ``torch.cat`` and the first input's partition object is kept.

    Dtypes promote as in ``torch.cat``. No host sync; the result's total size is static. Its
    maximum length is known when the inputs' are (batch axis), or when every input holds the
    same partition object (ragged axis). Differentiable in every input.

    Args:
        arrays: a non-empty sequence of RaggedArrays with the same number of axes.
        axis: the axis to join along (int or name).

    Returns:
        A RaggedArray; a single input comes back unchanged.

    Raises:
        ValueError: inner shapes, segment counts (ragged axis), partitions (inner axis) or
            axis names do not match; the message lists the inputs' shapes.

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 2.0], [3.0]])
    >>> y = ragged.array([[4.0], []])
    >>> ragged.concat([x, y]).to_list()
    [[1.0, 2.0], [3.0], [4.0], []]
    >>> ragged.concat([x, y], axis=1).to_list()
    [[1.0, 2.0, 4.0], [3.0]]
    >>> a = ragged.from_lengths(torch.zeros(3, 2), [2, 1])
    >>> ragged.concat([a, a.with_values(torch.ones(3, 1))], axis=2)[1]
    tensor([[0., 0., 1.]])
    """
    func = concat
    items = _arrays_arg(func, arrays)
    first = items[0]
    _check_layout(func, items)
    names = _unify_names(func, items)
    dim = normalize_axis(func, RaggedArray(first.values, first.partition, names), axis)
    nr = first.ragged_ndim
    if dim > nr:
        _check_inner(func, items, skip=dim - nr)
        partition = _same_partition(func, items, "to concatenate along an inner axis")
        if len(items) == 1:
            return RaggedArray(first.values, partition, names)
        values = torch.cat([a.values for a in items], dim=dim - nr)
        return RaggedArray(values, partition, names)
    _check_inner(func, items)
    if len(items) == 1:
        return RaggedArray(first.values, first.partition, names)
    if dim == 0:
        return _concat_batch(items, names)
    return _concat_ragged(func, items, names, dim)


def _concat_batch(arrays: Sequence[RaggedArray], names: AxisNames | None) -> RaggedArray:
    """Segments of each array after those of the previous one: shift offsets and ids."""
    levels = []
    for k in range(arrays[0].ragged_ndim):
        parts = [a.partition.levels[k] for a in arrays]
        offsets, row_ids = [], []
        child_shift = row_shift = 0  # static Python ints (tensor sizes): no sync
        for i, level in enumerate(parts):
            last = i == len(parts) - 1
            offsets.append(_shifted(level.offsets if last else level.offsets[:-1], child_shift))
            row_ids.append(_shifted(level.row_ids, row_shift))
            child_shift += level.num_children
            row_shift += level.num_rows
        known = [level.max_length for level in parts]
        longest = None if None in known else max(m for m in known if m is not None)
        levels.append(
            RowPartition(
                torch.cat(offsets),
                torch.cat([level.lengths for level in parts]),
                torch.cat(row_ids),
                longest,
            )
        )
    values = torch.cat([a.values for a in arrays])
    return RaggedArray(values, Partition(tuple(levels)), names)


def _shifted(t: Tensor, shift: Any) -> Tensor:
    # No `if shift` shortcut: the size of a data-dependent length (``x[:, :1]`` under compile)
    # is an unbacked SymInt, which a test of its value would guard on.
    return t + shift


def _known_one(num: Any) -> bool:
    """``num == 1`` known without a guard (compiled code must not branch on a batch of one)."""
    if not torch.compiler.is_compiling():
        return bool(num == 1)
    # A symbolic size, only under tracing (symbolic_shapes loads sympy: not at import time).
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(num == 1))


def _concat_ragged(
    func: Func, arrays: Sequence[RaggedArray], names: AxisNames | None, dim: int
) -> RaggedArray:
    """Every row of ragged axis ``dim - 1`` of every array joined end to end along ``dim``.

    The rows along ``dim`` are views' segments (the innermost axis: rows of values; an outer
    axis: whole rows with their subtrees, gathered from the arrays' rows pooled along the batch
    axis of their views). Sizes are static: no host sync.
    """
    first = arrays[0]
    depth = first.ragged_ndim - dim + 1
    upper = first.partition.levels[: dim - 1]
    for a in arrays[1:]:
        if not all(
            p is q or p.equals(q) for p, q in zip(upper, a.partition.levels[: dim - 1], strict=True)
        ):
            raise value_error(
                func,
                "arrays",
                f"must have equal ragged levels above the concatenated axis {dim}",
                f"shapes {_shapes(arrays)}",
            )
    views = [view(a, depth).array for a in arrays]
    num = views[0].num_segments
    if any(v.num_segments != num for v in views):
        raise value_error(
            func,
            "arrays",
            "must have the same number of segments to concatenate along the ragged axis",
            f"shapes {_shapes(arrays)}",
        )
    levels = [v.partition.levels[0] for v in views]
    same = all(v.partition.levels[0] is levels[0] for v in views)
    level, source = _joined(levels, same)
    if depth == 1:
        values = torch.cat([v.values for v in views])
        if source is not None:
            values = values.index_select(0, source)
        return RaggedArray(values, Partition((*upper, level)), names)
    pool = _concat_batch(views, None)
    if source is None:
        source = torch.arange(level.num_children, device=pool.device)
    sizes = []
    for j in range(1, depth):
        known = [v.partition.levels[j].max_length for v in views]
        longest = None if None in known else max(m for m in known if m is not None)
        sizes += [pool.partition.levels[j].num_children, longest]
    partition, rows = gather_items(pool, 1, (), level, source, sizes)
    return RaggedArray(
        pool.values.index_select(0, rows), Partition((*upper, *partition.levels)), names
    )


def _joined(levels: Sequence[RowPartition], same: bool) -> tuple[RowPartition, Tensor | None]:
    """The level whose row ``b`` joins row ``b`` of every level end to end, and the source of
    each joined child among the levels' children concatenated (``None``: in order).

    Child ``r`` of level ``i`` (in row ``b``, at position ``r - offsets_i[b]``) goes to
    ``new_offsets[b] + before_i[b] + r - offsets_i[b]``, where ``before_i`` sums the lengths of
    the earlier levels. These destinations form a permutation; its inverse, built with one
    integer scatter, gathers the joined children into place (an ``index_select``,
    differentiable under every transform).
    """
    num = levels[0].num_rows
    total = sum(level.num_children for level in levels)
    lengths = levels[0].lengths
    for level in levels[1:]:
        lengths = lengths + level.lengths
    # A unit level gives every row a child (`torch.diff(x, prepend=x[:, :1] - 1)`). The inputs'
    # `nonempty` flags are not read: compiled code would guard on them (one graph per flag).
    nonempty = any(level.unit for level in levels)
    if _known_one(num):  # one row: joining it is joining the children
        return RowPartition.from_lengths(lengths, total, total, nonempty=nonempty), None
    known = levels[0].max_length
    longest = len(levels) * known if same and known is not None else None
    # A unit level adds 1 to every row (its maximum: 1, or 0 without rows): with one other
    # level at most, the sum of the maxima is exact.
    maxima = [level.max_length for level in levels]
    if longest is None and sum(not lv.unit for lv in levels) <= 1 and None not in maxima:
        longest = sum(n for n in maxima if n is not None)
    joined = RowPartition.from_lengths(lengths, total, longest, nonempty=nonempty)
    start = joined.offsets[:-1]
    shifts = []
    base = 0
    for source in levels:
        # destination of joined child c = base + r:  c + start[b] - offsets_i[b] - base
        shift = start - source.offsets[:-1]
        shifts.append(_shifted(shift.index_select(0, source.row_ids), -base))
        start = start + source.lengths
        base += source.num_children
    rows = torch.arange(total, device=lengths.device)
    destination = rows + torch.cat(shifts)
    return joined, torch.empty_like(rows).scatter(0, destination, rows)


# --- stack ------------------------------------------------------------------------------------


@op("combining", rule=STACK, args="arrays: arrays, axis: int?, name: str?")
def stack(arrays: Sequence[RaggedArray], axis: int = -1, *, name: str | None = None) -> RaggedArray:
    """Stack arrays with equal partitions along a new inner axis.

    Args:
        arrays: a non-empty sequence of RaggedArrays with equal partitions (the same object,
            or equal offsets: one comparison) and equal inner shapes.
        axis: position of the new axis in the result; it must be an inner axis (after the
            ragged axes). Negative values count from the end of the result.
        name: name of the new axis; required when the inputs are named, refused otherwise.

    Returns:
        A RaggedArray with the first input's partition object. Dtypes promote as in
        ``torch.stack``. Differentiable in every input.

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0], [3.0]])
    >>> y = x * 10
    >>> s = ragged.stack([x, y])
    >>> s.shape, s.partition is x.partition
    (RaggedShape(2, [2, 1], 2), True)
    >>> s[0]
    tensor([[ 1., 10.],
            [ 2., 20.]])
    """
    func = stack
    items = _arrays_arg(func, arrays)
    first = items[0]
    _check_layout(func, items)
    _check_inner(func, items)
    names = _unify_names(func, items)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise type_error(
            func, "axis", "must be an int (the new axis has no name yet)", typename(axis)
        )
    ndim = first.ndim + 1
    nr = first.ragged_ndim
    if not -ndim <= axis < ndim or axis % ndim <= nr:
        raise value_error(
            func,
            "axis",
            f"must place the new axis among the inner axes of the {ndim}-axis result "
            f"(from {nr + 1} to {ndim - 1}, or from {nr + 1 - ndim} to -1)",
            axis,
        )
    dim = axis % ndim
    if names is not None:
        if name is None:
            raise type_error(func, "name", "must name the new axis of named arrays", None)
        if name in names:
            raise value_error(
                func, "name", f"must differ from the inputs' axis names {names}", repr(name)
            )
        names = check_names(func, (*names[:dim], name, *names[dim:]), ndim, param="name")
    elif name is not None:
        raise type_error(func, "name", "can name the new axis of named arrays only", repr(name))
    partition = _same_partition(func, items, "to stack")
    values = torch.stack([a.values for a in items], dim=dim - nr)
    return RaggedArray(values, partition, names)


# --- split ------------------------------------------------------------------------------------


def _sizes_arg(func: Func, sizes: Any, num: int) -> list[int]:
    expected = f"must be a positive int or a sequence of ints summing to {num} (the segments)"
    if isinstance(sizes, int) and not isinstance(sizes, bool):
        if sizes <= 0:
            raise value_error(func, "sizes", expected, sizes)
        if num == 0:
            return [0]  # as torch.split: one empty piece
        return [sizes] * (num // sizes) + ([num % sizes] if num % sizes else [])
    if isinstance(sizes, (Tensor, str)) or not isinstance(sizes, Sequence):
        raise type_error(func, "sizes", expected, typename(sizes))
    pieces = list(sizes)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in pieces):
        raise value_error(func, "sizes", expected, repr(pieces))
    if not pieces or sum(pieces) != num:
        raise value_error(func, "sizes", expected, f"{pieces} (sum {sum(pieces)})")
    return pieces


@op(
    "combining",
    rule=NEW,
    args="x: ragged, sizes: sizes",
)
def split(x: RaggedArray, sizes: int | Sequence[int]) -> tuple[RaggedArray, ...]:
    """Split the batch axis into consecutive groups of segments.

    Reads the offsets at the split points and each piece's longest segment back to the host in
    one transfer (one host sync; an unbacked size under ``torch.compile``), so that every
    piece's values are a view of ``x.values`` and every piece knows its maximum length.

    Args:
        x: the array.
        sizes: the number of segments of each piece (ints summing to ``B``), or an int chunk
            size: pieces of that many segments, the last one smaller (as ``torch.split``).

    Returns:
        A tuple of RaggedArrays with ``x``'s axis names; ``(x,)`` itself for one piece.

    >>> import ragged
    >>> x = ragged.array([[1, 2], [], [3], [4, 5, 6]])
    >>> [p.to_list() for p in ragged.split(x, [1, 3])]
    [[[1, 2]], [[], [3], [4, 5, 6]]]
    >>> [p.num_segments for p in ragged.split(x, 3)]
    [3, 1]
    """
    func = split
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", typename(x))
    num = x.num_segments
    pieces = _sizes_arg(func, sizes, num)
    if len(pieces) == 1:
        return (x,)
    levels = x.partition.levels
    device = x.device
    counts = torch.tensor(pieces, dtype=torch.int64, device=device)
    bounds = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    piece = torch.repeat_interleave(
        torch.arange(len(pieces), device=device), counts, output_size=num
    )
    parts = []
    for level in levels:  # the children bounds and each piece's longest row, level by level
        longest = level.lengths.new_zeros(len(pieces)).scatter_reduce(
            0, piece, level.lengths, "amax"
        )
        bounds = level.offsets.index_select(0, bounds)
        parts += [bounds, longest]
        piece = piece.index_select(0, level.row_ids)
    host = torch.cat(parts).tolist()  # the one sync
    n = len(pieces)
    rows = [0, *itertools.accumulate(pieces)]  # segment bounds, on the host already
    per_piece: list[list[RowPartition]] = [[] for _ in pieces]
    for j, level in enumerate(levels):
        at = j * (2 * n + 1)
        children, maxima = host[at : at + n + 1], host[at + n + 1 : at + 2 * n + 1]
        for i in range(n):
            s, e, a, b = rows[i], rows[i + 1], children[i], children[i + 1]
            per_piece[i].append(
                RowPartition(
                    _shifted(level.offsets[s : e + 1], -a),
                    level.lengths[s:e],
                    _shifted(level.row_ids[a:b], -s),
                    maxima[i],
                )
            )
        rows = children
    return tuple(
        RaggedArray(x.values[rows[i] : rows[i + 1]], Partition(tuple(per_piece[i])), x.axes)
        for i in range(n)
    )
