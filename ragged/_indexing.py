"""Indexing along the batch axis: ``x[i]``, ``x[i:j]``, ``x[index]``, ``x[mask]``.

A RaggedArray index (``x[r]``) indexes within the segments instead, like ``x[:, r]``.

Every result here has a size that depends on the lengths of the chosen segments, so each reads
those lengths back once (one host sync; an unbacked size under ``torch.compile``). Indexing the
ragged and inner axes (``x[:, a:b]``, ``x[..., 0]``) lives in ``ragged.ops``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._errors import type_error, value_error
from ._partition import Partition, RowPartition

if TYPE_CHECKING:
    from ._array import RaggedArray

_FUNC = "RaggedArray.__getitem__"


def getitem(x: RaggedArray, index: Any) -> Any:
    """Dispatch ``x[index]`` on the kind of index."""
    from ._array import RaggedArray

    if isinstance(index, RaggedArray):  # per-segment positions or flags: x[:, index]
        index = (slice(None), index)
    if isinstance(index, tuple):
        if len(index) == 1:
            return getitem(x, index[0])
        from .ops import _slicing  # the ragged/inner-axis indexing lives with the ops

        return _slicing.getitem_tuple(x, index)
    if isinstance(index, bool):
        raise type_error(_FUNC, "index", "must be an int, slice or tensor", "bool")
    if isinstance(index, int):
        return segment(x, index)
    if isinstance(index, slice):
        return select_slice(x, index)
    if isinstance(index, (list, range)):
        index = torch.as_tensor(list(index), dtype=torch.int64, device=x.device)
    if isinstance(index, Tensor):
        return select(x, index)
    raise type_error(
        _FUNC, "index", "must be an int, slice, int/bool tensor or tuple", type(index).__name__
    )


def segment(x: RaggedArray, index: int) -> Any:
    """Segment ``index`` as a dense ``(L, *inner)`` tensor (a RaggedArray with one fewer
    ragged axis when ``x`` has several)."""
    num = x.num_segments
    if not -num <= index < num:
        raise IndexError(f"{_FUNC}: index {index} is out of range for {num} segments.")
    index %= num
    if x.ragged_ndim == 1:
        start, end = x.offsets[index : index + 2].tolist()
        return x.values[start:end]
    from ._array import RaggedArray

    # Dropping the batch axis: the chosen segment's rows become the segments.
    picked = select(x, torch.tensor([index], device=x.device))
    axes = None if x.axes is None else x.axes[1:]
    return RaggedArray(picked.values, Partition(picked.partition.levels[1:]), axes)


def select_slice(x: RaggedArray, index: slice) -> RaggedArray:
    """Segments ``index`` (a Python slice) as a RaggedArray; a view of the values for step 1."""
    start, stop, step = index.indices(x.num_segments)
    if step != 1 or x.ragged_ndim != 1:
        rows = list(range(start, stop, step))
        return select(x, torch.tensor(rows, dtype=torch.int64, device=x.device))
    from ._array import RaggedArray

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


def select(x: RaggedArray, index: Tensor) -> RaggedArray:
    """Segments picked by an int64 index tensor (repeats allowed) or a boolean mask."""
    from ._array import RaggedArray

    if index.dtype == torch.bool:
        if index.shape != (x.num_segments,):
            expected = f"must have shape ({x.num_segments},) as a boolean mask"
            raise value_error(_FUNC, "index", expected, tuple(index.shape))
        index = torch.nonzero(index).squeeze(1)  # data-dependent size: documented sync
    elif index.dtype.is_floating_point or index.dtype.is_complex:
        raise type_error(_FUNC, "index", "must be an integer or boolean tensor", index.dtype)
    if index.dim() != 1:
        raise value_error(_FUNC, "index", "must be 1-D", tuple(index.shape))
    if index.device != x.device:
        raise value_error(_FUNC, "index", f"must be on {x.device}", index.device)
    num = x.num_segments
    if index.numel():
        low, high = torch.stack(torch.aminmax(index)).tolist()
        if not -num <= low <= high < num:
            raise IndexError(f"{_FUNC}: index out of range for {num} segments.")
    rows = torch.remainder(index.to(torch.int64), max(num, 1))
    segments = rows
    levels: list[RowPartition] = []
    for level in x.partition.levels:
        lengths = level.lengths[rows]
        total, longest, squares = _stats(lengths)
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
    total, longest, squares = _stats(lengths)
    return RowPartition.from_lengths(lengths, total, longest, squares)


def _stats(lengths: Tensor) -> tuple[int, int, int]:
    """Sum, max and sum of squares of ``lengths``, read in one transfer."""
    if lengths.numel() == 0:
        return 0, 0, 0
    total, longest, squares = torch.stack(
        [lengths.sum(), lengths.max(), (lengths * lengths).sum()]
    ).tolist()
    return total, longest, squares
