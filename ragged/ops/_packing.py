"""Where each row of a one-level RaggedArray goes in ``PackedSequence`` order (segments by
decreasing length, interleaved time step by time step, as ``pack_sequence`` lays them out):
shared by ``ragged.to_packed_sequence`` and the recurrent modules' torch functions."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import Func, value_error
from .._partition import RowPartition


@dataclasses.dataclass(frozen=True)
class PackingPlan:
    """The packed layout of the segments of a one-level array.

    Attributes:
        lengths: the segment lengths, on the host.
        sorted_lengths: ``lengths`` by decreasing length (stable: ties keep their order).
        sorted_indices: the segments in that order (host).
        rank: each segment's position in that order (host).
        batch_sizes: segments longer than ``t``, for each time step ``t`` (host).
        dest: each value row's row in packed data (on the values' device).
    """

    lengths: Tensor
    sorted_lengths: Tensor
    sorted_indices: Tensor
    rank: Tensor
    batch_sizes: Tensor
    dest: Tensor


def packed_index(
    level: RowPartition, batch_sizes: Tensor, rank: Tensor, device: torch.device
) -> Tensor:
    """Row ``(b, t)`` of the segments sits at ``time_offsets[t] + rank[b]`` in packed data."""
    time_offsets = torch.cumsum(batch_sizes, 0) - batch_sizes
    return time_offsets.to(device)[level.positions()] + rank.to(device)[level.row_ids]


def packing_plan(func: Func, x: RaggedArray) -> PackingPlan:
    """The :class:`PackingPlan` of a one-level ``x``: reads the lengths once (``PackedSequence``
    keeps its ``batch_sizes`` on the host). ``x`` needs a segment and no empty one.

    >>> import ragged
    >>> plan = packing_plan("f", ragged.array([[1.0], [2.0, 3.0, 4.0], [5.0, 6.0]]))
    >>> plan.batch_sizes.tolist(), plan.sorted_indices.tolist(), plan.dest.tolist()
    ([3, 2, 1], [1, 2, 0], [2, 0, 3, 5, 1, 4])
    """
    lengths = x.lengths.cpu()
    num = lengths.shape[0]
    if num == 0:
        raise value_error(
            func, "x", "must have at least one segment for a PackedSequence", "0 segments"
        )
    empty = lengths == 0
    if bool(empty.any()):
        b = int(torch.argmax(empty.to(torch.int8)))
        raise value_error(
            func,
            "x",
            "must have no empty segment (PackedSequence cannot hold one)",
            f"lengths[{b}] = 0",
        )
    sorted_lengths, sorted_indices = torch.sort(lengths, descending=True, stable=True)
    longest = int(sorted_lengths[0])
    # batch_sizes[t] = number of segments longer than t.
    per_length = torch.bincount(lengths, minlength=longest + 1)
    batch_sizes = num - torch.cumsum(per_length, 0)[:longest]
    rank = torch.empty_like(sorted_indices)
    rank[sorted_indices] = torch.arange(num)  # the position of each segment in sorted order
    dest = packed_index(x.partition.levels[0], batch_sizes, rank, x.device)
    return PackingPlan(lengths, sorted_lengths, sorted_indices, rank, batch_sizes, dest)
