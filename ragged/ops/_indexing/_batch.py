"""Indexing along the batch axis: ``x[i]``, ``x[i:j]``, ``x[index]``, ``x[mask]``.

Every result here has a size that depends on the lengths of the chosen segments, so each reads
those lengths back once (one host sync; an unbacked size under ``torch.compile``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._errors import Func, name_of, type_error, value_error
from ..._partition import Partition, RowPartition, length_stats


def segment(func: Func, x: RaggedArray, index: int) -> Any:
    """Segment ``index`` as a dense ``(L, *inner)`` tensor (a RaggedArray with one fewer
    ragged axis when ``x`` has several)."""
    num = x.num_segments
    if not -num <= index < num:
        raise IndexError(f"{name_of(func)}: index {index} is out of range for {num} segments.")
    index %= num
    if x.ragged_ndim == 1:
        start, end = x.offsets[index : index + 2].tolist()
        return x.values[start:end]
    # Dropping the batch axis: the chosen segment's rows become the segments.
    picked = select(func, x, torch.tensor([index], device=x.device))
    axes = None if x.axes is None else x.axes[1:]
    return RaggedArray(picked.values, Partition(picked.partition.levels[1:]), axes)


def select_slice(func: Func, x: RaggedArray, index: slice) -> RaggedArray:
    """Segments ``index`` (a Python slice) as a RaggedArray; a view of the values for step 1."""
    start, stop, step = index.indices(x.num_segments)
    if step != 1 or x.ragged_ndim != 1:
        rows = list(range(start, stop, step))
        return select(func, x, torch.tensor(rows, dtype=torch.int64, device=x.device))
    stop = max(start, stop)
    level = x.partition.levels[0]
    first, last = level.offsets[[start, stop]].tolist()
    new = RowPartition(
        level.offsets[start : stop + 1] - first,
        level.lengths[start:stop],
        level.row_ids[first:last] - start,
        None,
    )
    return RaggedArray(x.values[first:last], Partition((new,)), x.axes)


def select(func: Func, x: RaggedArray, index: Tensor) -> RaggedArray:
    """Segments picked by an int64 index tensor (repeats allowed) or a boolean mask."""
    if index.dtype == torch.bool:
        if index.shape != (x.num_segments,):
            expected = f"must have shape ({x.num_segments},) as a boolean mask"
            raise value_error(func, "index", expected, tuple(index.shape))
        index = torch.nonzero(index).squeeze(1)  # data-dependent size: documented sync
    elif index.dtype.is_floating_point or index.dtype.is_complex:
        raise type_error(func, "index", "must be an integer or boolean tensor", index.dtype)
    if index.dim() != 1:
        raise value_error(func, "index", "must be 1-D", tuple(index.shape))
    if index.device != x.device:
        raise value_error(func, "index", f"must be on {x.device}", index.device)
    num = x.num_segments
    if index.numel():
        low, high = torch.stack(torch.aminmax(index)).tolist()
        if not -num <= low <= high < num:
            raise IndexError(f"{name_of(func)}: index out of range for {num} segments.")
    rows = torch.remainder(index.to(torch.int64), max(num, 1))
    segments = rows
    levels: list[RowPartition] = []
    for level in x.partition.levels:
        lengths = level.lengths[rows]
        total, longest, squares = length_stats(lengths)
        # A product level (pair map) stays one: its columns are the chosen segments' columns.
        columns = _chosen_columns(level, x.partition, levels, segments)
        new = RowPartition.from_lengths(lengths, total, longest, squares, columns)
        levels.append(new)
        rows = level.offsets[rows][new.row_ids] + new.positions()
    return RaggedArray(x.values[rows], Partition(tuple(levels)), x.axes)


def _chosen_columns(
    level: RowPartition, partition: Partition, chosen: list[RowPartition], segments: Tensor
) -> RowPartition | None:
    if level.columns is None:
        return None
    for old, new in zip(partition.levels, chosen, strict=False):
        if level.columns is old:
            return new
    lengths = level.columns.lengths[segments]  # columns of another array: select them too
    total, longest, squares = length_stats(lengths)
    return RowPartition.from_lengths(lengths, total, longest, squares)
