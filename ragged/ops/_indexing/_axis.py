"""Indexing along any ragged axis of a multi-level array.

Along the innermost ragged axis the one-level ops run on the view of the last level (each row of
the axis above is a segment) and the outer levels go back on top (``ragged.ops._levels``). Along
an outer ragged axis ``k`` the entries are whole rows with their subtrees (a sentence with its
tokens): picking, dropping or reordering them gathers their subtrees, whose sizes are read once
(one host sync for all levels together) unless they are known statically.

An out-of-range entry along an outer axis is an **empty row** (the fill of a ragged row), as
``fill_value`` is for the innermost axis; ``"clip"`` and ``"wrap"`` apply as for rows of values.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import normalize_axis, remove
from ..._errors import Func, name_of, type_error, typename, value_error
from ..._partition import Partition, RowPartition, length_stats
from ...kernels._segment import Segments, segment_sum
from .._levels import gather_items, read, regular, subtree_stats, view
from ._slicing import keeps_all, reverses_all, slice_bounds, slice_int


def same_upper(func: Func, param: str, x: RaggedArray, other: RaggedArray, depth: int) -> None:
    """``other``'s first ``depth`` levels must equal ``x``'s (identity, else one comparison)."""
    mine, theirs = x.partition.levels[:depth], other.partition.levels[:depth]
    if len(theirs) == depth and all(
        a is b or a.equals(b) for a, b in zip(mine, theirs, strict=True)
    ):
        return
    raise value_error(
        func,
        param,
        f"must have the first {depth} ragged levels of x (one list per row of ragged axis "
        f"{depth} of x)",
        f"{other.ragged_ndim} ragged axes with other lengths",
    )


def _names_without(x: RaggedArray, axis: int) -> Any:
    return remove(x.axes, [axis])


# --- take -------------------------------------------------------------------------------------


def take_ragged(
    func: Func,
    x: RaggedArray,
    dim: int,
    indices: RaggedArray,
    resolve: Any,
    take_rows_or_fill: Any,
    mode: str,
    fill: Tensor,
) -> RaggedArray:
    """``take`` along ragged axis ``dim`` with per-row RaggedArray ``indices`` of ``dim`` levels."""
    same_upper(func, "indices", x, indices, dim - 1)
    level = x.partition.levels[dim - 1]
    picks = indices.partition.levels[-1]
    parent = picks.row_ids
    position, valid = resolve(func, indices.values, level.lengths[parent], mode)
    rows = level.offsets[parent] + position
    if dim == x.ragged_ndim:
        values = take_rows_or_fill(x.values, rows, valid, fill)
        return RaggedArray(values, indices.partition, x.axes)
    partition, rows = whole_rows(x, dim, indices.partition.levels[:-1], picks, rows, valid)
    return RaggedArray(x.values.index_select(0, rows), partition, x.axes)


def whole_rows(
    x: RaggedArray,
    dim: int,
    upper: Any,
    picks: RowPartition | None,
    rows: Tensor,
    valid: Tensor | None,
    extra: list[Tensor] | None = None,
) -> tuple[Partition, Tensor]:
    """Whole rows of outer axis ``dim`` with their subtrees (reads their sizes once)."""
    levels = x.partition.levels
    safe = rows if valid is None else torch.where(valid, rows, 0)
    weight = None if valid is None else valid.to(torch.int64)
    if levels[dim].num_rows == 0:  # nothing to pick from: every pick is empty
        stats = [safe.new_zeros(()) for _ in range(2 * (len(levels) - dim))]
    else:
        stats = subtree_stats(levels, dim, safe, weight)
    sizes = read(stats)
    return gather_items(x, dim, upper, picks, rows, sizes, valid)


def take_dense(
    func: Func,
    x: RaggedArray,
    dim: int,
    indices: Tensor,
    resolve: Any,
    take_rows_or_fill: Any,
    mode: str,
    fill: Tensor,
) -> RaggedArray:
    """``take`` along ragged axis ``dim`` of a multi-level ``x`` with dense ``(R, *extra)``
    indices, ``R`` the number of rows of axis ``dim - 1`` (``B`` for axis 1)."""
    level = x.partition.levels[dim - 1]
    num = level.num_rows
    if indices.dim() == 0 or indices.shape[0] != num:
        expected = f"must have shape ({num}, ...) (one row per row of axis {dim - 1})"
        raise value_error(func, "indices", expected, tuple(indices.shape))
    extra = indices.dim() - 1
    if extra > 1 and (x.axes is not None or dim < x.ragged_ndim):
        raise value_error(
            func,
            "indices",
            f"must be ({num},) or ({num}, K) along ragged axis {dim} of a multi-level "
            + ("named array" if x.axes is not None else "array (an outer axis)"),
            tuple(indices.shape),
        )
    shape = (num, *[1] * extra)
    position, valid = resolve(func, indices, level.lengths.view(shape), mode)
    rows = level.offsets[:-1].view(shape) + position
    names = x.axes if extra == 1 else _names_without(x, dim)
    if dim == x.ragged_ndim:
        values = take_rows_or_fill(x.values, rows, valid, fill)
        return RaggedArray(values, Partition(x.partition.levels[: dim - 1]), names)
    flat_valid = None if valid is None else valid.reshape(-1)
    picks = regular(num, indices.shape[1], x.device) if extra else None
    upper = x.partition.levels[: dim - 1]
    partition, rows = whole_rows(x, dim, upper, picks, rows.reshape(-1), flat_valid)
    return RaggedArray(x.values.index_select(0, rows), partition, names)


# --- filter -----------------------------------------------------------------------------------


def filter_plan(x: RaggedArray, dim: int, keep: Tensor) -> tuple[Partition, Tensor] | None:
    """Keep the entries of outer axis ``dim`` where ``keep`` (one flag per entry); ``None``
    when every entry is kept. One host sync (the new sizes)."""
    levels = x.partition.levels
    level = levels[dim - 1]
    segments = Segments(level.row_ids, level.num_rows, level.lengths, level.offsets)
    counts = segment_sum(keep.to(torch.int64), segments)
    items = torch.arange(keep.shape[0], device=keep.device)
    zero = counts.new_zeros(())
    stats = [
        counts.sum(),
        counts.max() if counts.numel() else zero,
        (counts * counts).sum(),
        *subtree_stats(levels, dim, items, keep.to(torch.int64)),
    ]
    total, longest, squares, *sizes = read(stats)  # the one host sync
    if total == keep.shape[0]:
        return None
    # Destination of each kept entry: its rank among the kept ones; others go to a dump slot.
    destination = torch.where(keep, torch.cumsum(keep, 0) - 1, total)
    source = items.new_zeros(total + 1).index_put((destination,), items)[:total]
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    picks = RowPartition(offsets, counts, level.row_ids[source], longest, squares)
    return gather_items(x, dim, levels[: dim - 1], picks, source, sizes)


# --- slices -----------------------------------------------------------------------------------


def slice_plan(
    func: Func, x: RaggedArray, dim: int, start: Any, stop: Any, step: Any
) -> tuple[Partition, Tensor] | None:
    """``[start:stop:step]`` of every row along ragged axis ``dim``: the new partition and the
    value rows to gather; ``None`` when every entry is kept. One host sync (the new sizes),
    except where the result provably keeps every entry or reverses every row, and for the
    slices of known size of a level with no empty row (``_static_total``)."""
    start, stop, step = (slice_int(func, v) for v in (start, stop, step))
    step = 1 if step is None else step
    if step == 0:
        raise ValueError(f"{name_of(func)}: slice step cannot be zero.")
    levels = x.partition.levels
    level = levels[dim - 1]
    known = level.max_length
    if keeps_all(start, stop, step, known):
        return None
    low, count = slice_bounds(level.lengths, start, stop, step)
    inner = dim == len(levels)
    reverse = reverses_all(start, stop, step, known)
    static = _static_total(level, start, stop, step) if inner else None
    if reverse:
        new, sizes = level, None
    elif static is not None:  # no read: the rows are known non-empty (RowPartition.nonempty)
        total, one = static
        if one:  # one entry of every row: a unit level
            new = RowPartition.units(level.num_rows, level.offsets.device)
        else:
            longest = None if known is None else known - 1
            new = RowPartition.from_lengths(count, total, longest)
    else:
        stats = [*_stats(count)]
        if not inner:
            stats += subtree_stats(levels, dim, *_members(level, low, count, step))
        total, longest, squares, *sizes = read(stats)  # the one host sync
        new = RowPartition.from_lengths(count, total, longest, squares)
    rows = new.row_ids
    source = level.offsets[rows] + low[rows] + new.positions() * step
    upper = levels[: dim - 1]
    if inner:
        partition = x.partition if reverse else Partition((*upper, new))
        return partition, source
    if sizes is None:  # a reversal keeps the sizes below: the levels are the input's
        return gather_items(x, dim, upper, new, source, _unchanged(levels, dim))
    return gather_items(x, dim, upper, new, source, sizes)


def _static_total(
    level: RowPartition, start: int | None, stop: int | None, step: int
) -> tuple[int, bool] | None:
    """The size of a slice that takes one entry of every row (``[:1]``, ``[-1:]``) or all but
    one (``[1:]``, ``[:-1]``) of a level whose rows are known non-empty, and whether it takes
    one; None for any other slice (its size depends on the lengths)."""
    first = start in (None, 0)
    one = (first and stop == 1) or (start == -1 and stop is None)
    all_but_one = (start == 1 and stop is None) or (first and stop == -1)
    # The flag is read for these slices only: compiled code guards on what it reads.
    if step != 1 or not (one or all_but_one) or not level.nonempty:
        return None
    if one:
        return level.num_rows, True
    return level.num_children - level.num_rows, False


def _unchanged(levels: Any, dim: int) -> list[int | None]:
    """The sizes below axis ``dim`` when every entry is kept (maxima unknown: not read)."""
    return [v for j in range(dim, len(levels)) for v in (levels[j].num_children, None)]


def _stats(lengths: Tensor) -> list[Tensor]:
    zero = lengths.new_zeros(())
    return [lengths.sum(), lengths.max() if lengths.numel() else zero, (lengths * lengths).sum()]


def _members(level: RowPartition, low: Tensor, count: Tensor, step: int) -> tuple[Tensor, Tensor]:
    """Every entry of ``level`` and whether the slice keeps it (for the sizes below)."""
    items = torch.arange(level.num_children, device=level.offsets.device)
    parent = level.row_ids
    offset = (level.positions() - low[parent]) * (1 if step > 0 else -1)
    size = abs(step)
    member = (offset >= 0) & (offset % size == 0) & (offset // size < count[parent])
    return items, member.to(torch.int64)


def sliced(func: Func, x: RaggedArray, dim: int, start: Any, stop: Any, step: Any) -> RaggedArray:
    """``x`` sliced along ragged axis ``dim``."""
    plan = slice_plan(func, x, dim, start, stop, step)
    if plan is None:
        return x
    partition, rows = plan
    return RaggedArray(x.values.index_select(0, rows), partition, x.axes)


# --- pad --------------------------------------------------------------------------------------


def _with_empty_rows(x: RaggedArray, dim: int, new: RowPartition, destination: Tensor) -> Any:
    """``x`` with level ``dim - 1`` replaced by ``new``, whose children are the entries of axis
    ``dim`` (at ``destination``) and empty rows elsewhere: the values and the levels below stay
    as they are."""
    levels = x.partition.levels
    items = levels[dim]
    lengths = items.lengths.new_zeros(new.num_children).index_copy(0, destination, items.lengths)
    children = RowPartition.from_lengths(
        lengths, items.num_children, items.max_length, items.sum_squares
    )
    partition = Partition((*levels[: dim - 1], new, children, *levels[dim + 1 :]))
    return RaggedArray(x.values, partition, x.axes)


def pad_outer(x: RaggedArray, dim: int, before: int, after: int) -> RaggedArray:
    """``before`` and ``after`` empty rows around the entries of outer axis ``dim`` (sync-free)."""
    level = x.partition.levels[dim - 1]
    extra = before + after
    num = level.num_rows
    device = x.device
    total = level.num_children + num * extra
    lengths = level.lengths + extra
    offsets = level.offsets + extra * torch.arange(num + 1, device=device)
    row_ids = torch.repeat_interleave(torch.arange(num, device=device), lengths, output_size=total)
    longest = None if level.max_length is None else level.max_length + extra
    new = RowPartition(offsets, lengths, row_ids, longest)
    destination = torch.arange(level.num_children, device=device) + level.row_ids * extra + before
    return _with_empty_rows(x, dim, new, destination)


def _padded_level(level: RowPartition, length: int, clip: bool) -> RowPartition:
    """Lengths ``max(L, length)`` (``length`` with ``clip``): static sizes when ``clip`` or
    when every row is known to fit, else one host sync."""
    num = level.num_rows
    target = torch.full_like(level.lengths, length)
    lengths = target if clip else torch.maximum(level.lengths, target)
    if clip or (level.max_length is not None and level.max_length <= length):
        total, longest, squares = num * length, length if num else 0, num * length * length
    else:
        total, longest, squares = length_stats(lengths)  # the one host sync
    return RowPartition.from_lengths(lengths, total, longest, squares)


def pad_to_outer(x: RaggedArray, dim: int, length: int, clip: bool) -> RaggedArray:
    """Every row along outer axis ``dim`` padded with empty rows to ``length`` (and cut to it
    with ``clip``)."""
    levels = x.partition.levels
    level = levels[dim - 1]
    new = _padded_level(level, length, clip)
    if not clip:  # nothing dropped: the entries move, the levels below stay
        destination = new.offsets[level.row_ids] + level.positions()
        return _with_empty_rows(x, dim, new, destination)
    parent = new.row_ids
    position = new.positions()
    valid = position < level.lengths[parent]
    rows = level.offsets[parent] + position
    partition, rows = whole_rows(x, dim, levels[: dim - 1], new, rows, valid)
    return RaggedArray(x.values.index_select(0, rows), partition, x.axes)


def pad_to_inner(
    x: RaggedArray, length: int, clip: bool, fill: Tensor, take_rows_or_fill: Any
) -> Any:
    """Every row along the innermost ragged axis padded with ``fill`` to ``length``."""
    v = view(x)
    level = v.array.partition.levels[0]
    new = _padded_level(level, length, clip)
    parent = new.row_ids
    position = new.positions()
    valid = position < level.lengths[parent]
    values = take_rows_or_fill(x.values, level.offsets[parent] + position, valid, fill)
    return v.wrap(RaggedArray(values, Partition((new,)), v.array.axes))


def ragged_axis(func: Func, x: RaggedArray, axis: Any) -> int:
    """``axis`` (an int or a name) as a non-negative int; it must be a ragged axis."""
    dim = normalize_axis(func, x, axis)
    if not 1 <= dim <= x.ragged_ndim:
        raise value_error(
            func, "axis", f"must be a ragged axis (1 to {x.ragged_ndim}, or a name)", repr(axis)
        )
    return dim


def checked_array(func: Func, x: Any, param: str = "x") -> RaggedArray:
    """``x``, which must be a RaggedArray (else a ``TypeError`` that describes what came)."""
    if not isinstance(x, RaggedArray):
        raise type_error(func, param, "must be a RaggedArray", typename(x))
    return x


def one_level_array(func: Func, x: Any, param: str = "x") -> RaggedArray:
    """``x``, which must be a RaggedArray with one ragged axis (the conversions and collectives
    of one-level batches)."""
    x = checked_array(func, x, param)
    if x.ragged_ndim != 1:
        raise value_error(func, param, "must have one ragged axis", f"{x.ragged_ndim} ragged axes")
    return x


def check_flag(func: Func, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise type_error(func, name, "must be a bool", type(value).__name__)
