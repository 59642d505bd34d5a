"""Which rows of ``values`` an op along ragged axes combines, and what shape the result has.

A value row of an array with ragged axes ``1 .. n`` has coordinates ``(b, i_1, ..., i_n)``. An op
along a set ``R`` of ragged axes combines the rows that agree on every coordinate outside ``R``:
the group of a row is ``(b, i_k for k not in R)``. For ``(B, N*, M*, *inner)`` (two levels):

* the innermost ragged axis (``M*``) combines the entries of each row: the groups are the rows
  of the last level, contiguous runs of values; a reduction leaves ``(B, N*, *inner)``;
* the outer ragged axis (``N*``) combines, for each segment ``b`` and column ``j``, the entries
  ``(b, i, j)`` over ``i``: strided groups. For a product level (a pair map, whose rows in a
  segment all have ``M_b`` entries) there are ``M_b`` groups per segment and a reduction leaves
  ``(B, M*, *inner)`` with the columns' partition. For a general nested level the rows differ in
  length; columns align left, as in TensorFlow and Awkward, and segment ``b`` has
  ``max_i M_{b,i}`` groups (counting them reads the total once);
* both ragged axes combine every entry of a segment: a reduction leaves ``(B, *inner)``.

Any other combination at any depth follows the same rule: the result of a reduction keeps the
axes outside ``R``, and along each kept axis that comes after a reduced one the entries align
left (a parent has as many children as the longest of the rows it merges). The result's
partition is exact only after reading its sizes (one host read for all its levels together);
ops that keep the structure (softmax, normalize, scans, sorts) number the groups within a
static bound instead and read nothing.

One ragged axis (``(B, L*, *inner)``) is the first case with ``B`` groups and a dense result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from .._array import RaggedArray
from .._partition import Partition, RowPartition
from ..kernels._segment import Segments


@dataclasses.dataclass
class Grouping:
    """The groups of an op along some ragged axes.

    Attributes:
        segments: the group of every value row.
        partition: the partition of the result of a reduction (``None``: a dense result, or
            not computed for ``exact=False``).
        kept_axes: the ragged axes (1-based) a reduction keeps, in order.
        position_fn: computes each row's position along the (single) reduced ragged axis
            (``None`` when several are reduced together); argmax/argmin and argsort need it.
    """

    segments: Segments
    partition: Partition | None
    kept_axes: tuple[int, ...]
    position_fn: Callable[[], Tensor] | None = None

    def positions(self) -> Tensor | None:
        """Each row's position along the reduced ragged axis (computed on demand)."""
        return None if self.position_fn is None else self.position_fn()


def group(x: RaggedArray, axes: tuple[int, ...], *, exact: bool = True) -> Grouping:
    """The grouping of an op over the ragged ``axes`` (1-based, sorted) of ``x``.

    With ``exact=False`` (ops that keep the structure: softmax, scans, sorts) no result partition
    is built and nothing is read from the device: groups are numbered within a static upper
    bound (unused ones are empty).
    """
    levels = x.partition.levels
    nr = len(levels)
    last = levels[-1]
    if axes == (nr,):  # rows of the last level (for one level: the segments)
        segments = Segments(last.row_ids, last.num_rows, last.lengths, last.offsets)
        partition = Partition(levels[:-1]) if nr > 1 else None
        return Grouping(segments, partition, tuple(range(1, nr)), last.positions)
    if axes == tuple(range(1, nr + 1)):
        ids = x.partition.segment_ids()
        counts = torch.zeros(x.num_segments, dtype=torch.int64, device=ids.device)
        counts = counts.index_add(0, ids, torch.ones_like(ids))
        offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
        return Grouping(Segments(ids, x.num_segments, counts, offsets), None, ())
    if nr == 2 and axes == (1,) and levels[1].columns is not None:
        return _pair_map_rows(levels[0], levels[1])
    return _group_any_axes(x.partition, axes, exact)


def positions_along(partition: Partition, axis: int) -> Tensor:
    """Each value row's position along ragged ``axis`` (1-based), int64 ``[num_values]``.

    >>> import ragged
    >>> x = ragged.array([[[1, 2], [3]], [[4, 5, 6]]])
    >>> positions_along(x.partition, 1).tolist(), positions_along(x.partition, 2).tolist()
    ([0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 1, 2])
    """
    levels = partition.levels
    position = levels[axis - 1].positions()
    for level in levels[axis:]:
        position = position.index_select(0, level.row_ids)
    return position


def _pair_map_rows(rows: RowPartition, cells: RowPartition) -> Grouping:
    """Groups ``(b, j)`` over ``i`` for a pair map ``(B, N*, M*)``: sync-free, exact."""
    columns = cells.columns
    assert columns is not None
    segment = rows.row_ids.index_select(0, cells.row_ids)
    ids = columns.offsets.index_select(0, segment) + cells.positions()
    num = columns.num_children
    counts = torch.zeros(num, dtype=torch.int64, device=ids.device)
    counts = counts.index_add(0, ids, torch.ones_like(ids))
    partition = Partition((columns,))
    position = rows.positions().index_select(0, cells.row_ids)
    return Grouping(Segments(ids, num, counts), partition, (2,), lambda: position)


def _group_any_axes(partition: Partition, axes: tuple[int, ...], exact: bool) -> Grouping:
    """Any set of ragged axes: walk the levels, mapping every node to its group.

    At depth ``d`` each node (a row of level ``d``) maps to a node of the result. A reduced axis
    maps a child to its parent's result node; a kept axis makes child ``j`` of every parent that
    maps to result node ``q`` the ``j``-th child of ``q`` (columns align left), so ``q`` has as
    many children as its longest parent. Result nodes are numbered compactly (offsets of the
    widths) within a static bound (the number of nodes at that depth); the exact sizes of the
    result levels are read once at the end, and only when ``exact``.
    """
    levels = partition.levels
    reduced = set(axes)
    device = partition.device
    node: Tensor | None = None  # result node of each node at this depth; None: the identity
    bound = partition.num_segments
    kept: list[RowPartition] = []  # result levels, as x's own levels while node is the identity
    built: list[tuple[Tensor, Tensor]] = []  # (widths, offsets) of result levels after a merge
    for depth, level in enumerate(levels):
        if depth + 1 in reduced:
            parent = (
                torch.arange(level.num_rows, device=device) if node is None else node
            ).index_select(0, level.row_ids)
            node = parent
            continue
        if node is None:
            kept.append(level)
            bound = level.num_children
            continue
        zeros = level.lengths.new_zeros(bound)  # lengths are >= 0: including the zeros is exact
        width = zeros.scatter_reduce(0, node, level.lengths, "amax")
        offsets = torch.nn.functional.pad(torch.cumsum(width, 0), (1, 0))
        built.append((width, offsets))
        node = offsets.index_select(0, node).index_select(0, level.row_ids) + level.positions()
        bound = level.num_children
    assert node is not None  # some axis is reduced
    counts = torch.zeros(bound, dtype=torch.int64, device=device)
    counts = counts.index_add(0, node, torch.ones_like(node))
    kept_axes = tuple(a for a in range(1, len(levels) + 1) if a not in reduced)
    position_fn = None
    if len(axes) == 1:
        position_fn = lambda: positions_along(partition, axes[0])  # noqa: E731
    if not exact:
        return Grouping(Segments(node, bound, counts), None, kept_axes, position_fn)
    num, result = _exact_levels(kept, built, partition.num_segments)
    out = Partition(tuple(result)) if result else None
    return Grouping(Segments(node, num, counts[:num]), out, kept_axes, position_fn)


def _exact_levels(
    kept: list[RowPartition], built: list[tuple[Tensor, Tensor]], num_segments: int
) -> tuple[int, list[RowPartition]]:
    """The result levels with exact sizes, read in one transfer (one host sync)."""
    if not built:  # every reduced axis comes after the kept ones: x's own levels
        num = kept[-1].num_children if kept else num_segments
        return num, list(kept)
    stats = []
    for width, offsets in built:
        top = width.max() if width.numel() else width.new_zeros(())
        stats += [offsets[-1], top]
    host = torch.stack(stats).tolist()  # the one host sync: sizes depend on the data
    rows = kept[-1].num_children if kept else num_segments
    result = list(kept)
    for k, (width, _) in enumerate(built):
        total, longest = host[2 * k], host[2 * k + 1]
        result.append(RowPartition.from_lengths(width[:rows], total, longest))
        rows = total
    return rows, result
