"""Ops along any ragged axis of a multi-level array: views of inner levels, moving whole rows.

Two mechanisms carry the one-level ops to every ragged axis of ``(B, L1*, ..., Ln*, *inner)``:

* **Views.** The last ``depth`` levels alone form an array whose segments are the rows of axis
  ``n - depth`` (``view``): for the innermost axis (``depth=1``), each row of axis ``n - 1`` is a
  segment of a one-level array, so a one-level op along its ragged axis is the op along axis
  ``n`` in every row. ``View.wrap`` puts the outer levels back on top of the result (the input's
  partition object when the op kept the view's).
* **Whole rows.** Along an outer axis ``k < n`` the entries are rows with everything below them
  (a sentence with its tokens). Selecting, repeating or reordering them (``take``, slices,
  ``filter``, ``concat``) gathers their subtrees level by level (``gather_items``); the sizes of
  the levels below are read once (``subtree_stats``: one host sync for all of them together),
  unless the caller knows them.

Ops that combine entries across rows along an outer axis (reductions, softmax, scans, sorts)
use the column groups of ``ragged.ops._grouping`` instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import AxisNames
from .._errors import type_error, typename, value_error
from .._format import shape_text
from .._partition import Partition, RowPartition


@dataclasses.dataclass(frozen=True)
class View:
    """The last ``depth`` ragged levels of ``x`` as an array of their own.

    Attributes:
        x: the multi-level array.
        depth: how many levels the view keeps.
        array: the view: its segments are the rows of axis ``x.ragged_ndim - depth`` of ``x``;
            its names are the names of those axes (the first one names its batch axis).
    """

    x: RaggedArray
    depth: int
    array: RaggedArray

    @property
    def cut(self) -> int:
        """The number of outer levels the view leaves out."""
        return self.x.ragged_ndim - self.depth

    def wrap(self, out: Any, names: AxisNames | None = None) -> Any:
        """The result of an op on the view as a result on ``x``: the outer levels on top.

        A RaggedArray result keeps its names after the outer axes' (``x``'s partition object
        when it kept the view's). A dense result ``(rows, ...)`` has one entry per row of axis
        ``cut``; ``names`` are its names as a result of the view (batch axis first).
        """
        if self.cut == 0:
            return out
        x = self.x
        outer = x.partition.levels[: self.cut]
        head = None if x.axes is None else x.axes[: self.cut]
        if isinstance(out, RaggedArray):
            if out.partition is self.array.partition:
                partition = x.partition
            else:
                partition = Partition((*outer, *out.partition.levels))
            axes = None if head is None or out.axes is None else (*head, *out.axes)
            return RaggedArray(out.values, partition, axes)
        axes = None if head is None or names is None else (*head, *names)
        return RaggedArray(out, Partition(outer), axes)


def view(x: RaggedArray, depth: int = 1) -> View:
    """The last ``depth`` levels of ``x`` (see ``View``); ``x`` itself when it has no more.

    >>> import ragged
    >>> x = ragged.array([[[1, 2], [3]], [[4]]])
    >>> v = view(x)
    >>> v.array.to_list(), v.wrap(ragged.cumsum(v.array)).to_list()
    ([[1, 2], [3], [4]], [[[1, 3], [3]], [[4]]])
    """
    nr = x.ragged_ndim
    if depth >= nr:
        return View(x, nr, x)
    names = None if x.axes is None else x.axes[nr - depth :]
    array = RaggedArray(x.values, Partition(x.partition.levels[nr - depth :]), names)
    return View(x, depth, array)


# --- moving whole rows along an outer axis ----------------------------------------------------


def subtree_stats(
    levels: Sequence[RowPartition], axis: int, rows: Tensor, weight: Tensor | None = None
) -> list[Tensor]:
    """Sizes of the levels below the picked rows of axis ``axis``, as 0-d tensors (no sync).

    ``rows`` are rows of ``levels[axis]`` (entries of axis ``axis``, 1-based: the children of
    ``levels[axis - 1]``); ``weight`` (0/1 per pick) masks some out. For every level ``j`` from
    ``axis`` down, the result holds the total number of children the picks bring and the
    longest such row: ``[total_j, max_j, ...]``, to be read in one transfer with the caller's
    own sizes and passed to ``gather_items``.
    """
    out = []
    start, end = levels[axis].offsets.index_select(0, rows), levels[axis].offsets[1:][rows]
    num = levels[axis].num_rows
    ancestor = torch.arange(num, device=rows.device)  # the picked row above each row of level j
    for j in range(axis, len(levels)):
        level = levels[j]
        if j > axis:
            start = level.offsets.index_select(0, start)
            end = level.offsets.index_select(0, end)
            ancestor = ancestor.index_select(0, levels[j - 1].row_ids)
        count = end - start
        longest = level.lengths.new_zeros(num).scatter_reduce(0, ancestor, level.lengths, "amax")
        longest = longest.index_select(0, rows)
        if weight is not None:
            count, longest = count * weight, longest * weight
        zero = count.new_zeros(())
        out += [count.sum(), longest.max() if longest.numel() else zero]
    return out


def read(stats: list[Tensor]) -> list[int]:
    """Read a list of 0-d int64 tensors to the host in one transfer (one host sync)."""
    return torch.stack(stats).tolist() if stats else []


def gather_items(
    x: RaggedArray,
    axis: int,
    upper: Sequence[RowPartition],
    picks: RowPartition | None,
    rows: Tensor,
    sizes: Sequence[int | None],
    valid: Tensor | None = None,
) -> tuple[Partition, Tensor]:
    """Entries of outer axis ``axis`` picked with their subtrees: the new partition and the
    value rows to gather (``values.index_select(0, rows)`` on any values of ``x``'s layout).

    Args:
        x: the array (``axis < x.ragged_ndim``).
        axis: the ragged axis (1-based) whose entries are picked.
        upper: the result's levels above the picks (``axis - 1`` of them).
        picks: the result's level ``axis - 1``, whose children are the picks; ``None`` when
            each parent picks exactly one entry and the axis goes away (``x[:, i]``).
        rows: the picked entries, as rows of ``x.partition.levels[axis]``.
        sizes: ``[total_j, max_j, ...]`` for the levels below (``subtree_stats``, read); a
            ``max_j`` may be ``None``.
        valid: False for a pick that is out of range: it brings an empty row.
    """
    levels = x.partition.levels
    if valid is not None:  # out-of-range picks point at one extra, empty row
        rows = torch.where(valid, rows, levels[axis].num_rows)
    out = [*upper] if picks is None else [*upper, picks]
    for k, j in enumerate(range(axis, len(levels))):
        level = levels[j]
        lengths = level.lengths
        if valid is not None and j == axis:
            lengths = torch.cat([lengths, lengths.new_zeros(1)])
        new = RowPartition.from_lengths(
            lengths.index_select(0, rows), int(sizes[2 * k] or 0), sizes[2 * k + 1]
        )
        out.append(new)
        rows = level.offsets.index_select(0, rows).index_select(0, new.row_ids) + new.positions()
    return Partition(tuple(out)), rows


def regular(num: int, size: int, device: torch.device) -> RowPartition:
    """``num`` rows of ``size`` children each (a dense axis written as a ragged level).

    >>> regular(2, 3, torch.device("cpu")).offsets
    tensor([0, 3, 6])
    """
    lengths = torch.full((num,), size, dtype=torch.int64, device=device)
    squares = num * size * size
    return RowPartition.from_lengths(lengths, num * size, size if num else 0, squares)


def same_as_previous(x: RaggedArray, axis: int) -> Tensor:
    """For every entry of outer axis ``axis``: whether it equals the previous entry of its row
    (the same subtree: equal lengths at every level below and equal values; NaN is never
    equal). The first entry of a row has no previous one (False). Sync-free.
    """
    levels = x.partition.levels
    parent_level, items = levels[axis - 1], levels[axis]
    num = items.num_rows
    device = x.device
    parent = parent_level.row_ids
    same = torch.zeros(num, dtype=torch.bool, device=device)
    if num > 1:
        same[1:] = parent[1:] == parent[:-1]
    previous = (torch.arange(num, device=device) - 1).clamp_min(0)
    # Rows of level j that belong to each entry: [start, end); entries start as their own row.
    start = torch.arange(num, device=device)
    end = start + 1
    ancestor = start
    differs = torch.zeros(num, dtype=torch.int64, device=device)
    for j in range(axis, len(levels) + 1):
        if j > axis:
            offsets = levels[j - 1].offsets
            start, end = offsets.index_select(0, start), offsets.index_select(0, end)
            ancestor = ancestor.index_select(0, levels[j - 1].row_ids)
        count = end - start
        differs = differs + (count != count.index_select(0, previous)).to(torch.int64)
        rows = x.values if j == len(levels) else levels[j].lengths
        if rows.shape[0] == 0:
            continue
        # Each row against the row at the same place in the previous entry (where it has one).
        relative = torch.arange(rows.shape[0], device=device) - start.index_select(0, ancestor)
        partner = start.index_select(0, previous.index_select(0, ancestor)) + relative
        partner = partner.clamp(0, rows.shape[0] - 1)
        unequal = rows != rows.index_select(0, partner)
        if unequal.dim() > 1:
            unequal = unequal.flatten(1).any(1)
        differs = differs.index_add(0, ancestor, unequal.to(torch.int64))
    return same & (differs == 0)


def is_multi_level(*arrays: Any) -> bool:
    """Whether any of ``arrays`` is a RaggedArray with more than one ragged axis."""
    return any(isinstance(a, RaggedArray) and a.ragged_ndim > 1 for a in arrays)


def on_rows(
    func: Any,
    arrays: Sequence[tuple[str, Any, int]],
    call: Any,
) -> Any:
    """``call(*views)`` on the last ``depth`` levels of every ``(param, array, depth)``: an op of
    one-level arrays (or pair maps) run in every row of the axis above them. The arrays must
    share the levels above their views; arrays that share a partition object share their
    view's (so ops still see a self-pair as one). The result gets the first array's outer
    levels back on top.
    """
    param, first, depth = arrays[0]
    if not isinstance(first, RaggedArray) or first.ragged_ndim < depth:
        raise value_error(
            func, param, f"must be a RaggedArray with {depth} ragged axes or more", typename(first)
        )
    cut = first.ragged_ndim - depth
    upper = first.partition.levels[:cut]
    shared: list[tuple[Partition, Partition]] = []  # by identity (no id(): compile guards it)
    views = []
    for name, x, d in arrays:
        if not isinstance(x, RaggedArray):
            raise type_error(func, name, "must be a RaggedArray", typename(x))
        levels = x.partition.levels
        if x.ragged_ndim - d != cut or not all(
            a is b or a.equals(b) for a, b in zip(upper, levels[:cut], strict=True)
        ):
            raise value_error(
                func,
                name,
                f"must have the {cut} outer ragged levels of `{param}` (the op runs in every row "
                f"of ragged axis {cut})",
                shape_text(x),
            )
        partition = next((v for p, v in shared if p is x.partition), None)
        if partition is None:
            partition = Partition(levels[cut:])
            shared.append((x.partition, partition))
        names = None if x.axes is None else x.axes[cut:]
        views.append(RaggedArray(x.values, partition, names))
    out = call(*views)
    return View(first, depth, views[0]).wrap(out)
