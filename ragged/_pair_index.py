"""The rows that each entry of a pair map ``(B, N*, M*)`` combines (for broadcasting into a pair
map, ``outer`` and the pair-map transpose)."""

from __future__ import annotations

import dataclasses

from torch import Tensor

from ._partition import Partition, RowPartition


@dataclasses.dataclass
class PairIndex:
    """For every entry ``(b, i, j)`` of a pair map: the value rows ``i`` and ``j`` it pairs."""

    partition: Partition
    left: Tensor  # the row i (a child of ``rows``) of every pair
    right: Tensor  # the row j (a child of ``columns``) of every pair


def pair_index(rows: RowPartition, columns: RowPartition) -> PairIndex:
    """The product partition of ``rows`` x ``columns`` and the rows each pair combines.

    >>> import torch
    >>> level = RowPartition.from_lengths(torch.tensor([2, 1]), total=3)
    >>> index = pair_index(level, level)
    >>> index.left.tolist(), index.right.tolist()
    ([0, 0, 1, 1, 2], [0, 1, 0, 1, 2])
    """
    partition = Partition.outer(rows, columns)
    cells = partition.levels[1]
    left = cells.row_ids  # the children of level 0 are the rows of x
    segment = rows.row_ids.index_select(0, left)
    right = columns.offsets.index_select(0, segment) + cells.positions()
    return PairIndex(partition, left, right)
