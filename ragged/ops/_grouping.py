"""Which rows of ``values`` an op along ragged axes combines, and what shape the result has.

For an array of logical shape ``(B, N*, M*, *inner)`` (two ragged levels) an op along

* the innermost ragged axis (``M*``) combines the entries of each row: the groups are the rows
  of the last level, contiguous runs of values; a reduction leaves ``(B, N*, *inner)``;
* the outer ragged axis (``N*``) combines, for each segment ``b`` and column ``j``, the entries
  ``(b, i, j)`` over ``i``: strided groups. For a product level (a pair map, whose rows in a
  segment all have ``M_b`` entries) there are ``M_b`` groups per segment and a reduction leaves
  ``(B, M*, *inner)`` with the columns' partition. For a general nested level the rows differ in
  length; columns align left, as in TensorFlow and Awkward, and segment ``b`` has
  ``max_i M_{b,i}`` groups (counting them reads the total once);
* both ragged axes combine every entry of a segment: a reduction leaves ``(B, *inner)``.

One ragged axis (``(B, L*, *inner)``) is the first case with ``B`` groups and a dense result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from .._array import RaggedArray
from .._partition import Partition, RowPartition
from ..kernels._segment import Segments, segment_amax


@dataclasses.dataclass
class Grouping:
    """The groups of an op along some ragged axes.

    Attributes:
        segments: the group of every value row.
        partition: the partition of the result of a reduction (``None``: a dense result).
        kept_axes: the ragged axes (1-based) a reduction keeps, in order.
        position_fn: computes each row's position along the (single) reduced ragged axis
            (``None`` when several are reduced together); only argmax/argmin need it.
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

    With ``exact=False`` (ops that keep the structure: softmax, scans) the outer axis of a
    general nested array needs no host sync: groups are numbered within a static upper bound
    (unused ones are empty) and no result partition is built.
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
    if nr == 2 and axes == (1,):
        return _outer_axis(levels[0], levels[1], exact)
    raise NotImplementedError(
        f"ops over ragged axes {axes} of an array with {nr} ragged axes (supported: the innermost "
        "axis, all of them, or axis 1 of two)"
    )


def _outer_axis(rows: RowPartition, cells: RowPartition, exact: bool) -> Grouping:
    """Groups ``(b, j)`` over ``i`` for ``(B, N*, M*)``: column ``j`` of every segment."""
    row_of_cell = cells.row_ids
    segment = rows.row_ids.index_select(0, row_of_cell)
    column = cells.positions()
    position = rows.positions().index_select(0, row_of_cell)
    if cells.columns is not None:
        out: RowPartition | None = cells.columns
        starts, num = cells.columns.offsets, cells.columns.num_children
    else:  # columns align left: segment b has as many as its longest row
        widest = segment_amax(cells.lengths, Segments(rows.row_ids, rows.num_rows, rows.lengths), 0)
        starts = torch.nn.functional.pad(torch.cumsum(widest, 0), (1, 0))
        if exact:
            num = int(starts[-1])  # the one host sync: the result size depends on the data
            out = RowPartition.from_offsets(starts, num)
        else:
            num, out = cells.num_children, None  # a static bound: every group has an entry
    ids = starts.index_select(0, segment) + column
    counts = torch.zeros(num, dtype=torch.int64, device=ids.device)
    counts = counts.index_add(0, ids, torch.ones_like(ids))
    partition = None if out is None else Partition((out,))
    return Grouping(Segments(ids, num, counts), partition, (2,), lambda: position)
