"""Slicing the ragged axis: ``segment[start:stop:step]`` in every segment."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._errors import Func, name_of
from ..._partition import Partition, RowPartition, length_stats


def _slice_int(func: Func, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name_of(func)}: slice bounds must be ints or None, got {value!r}.")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name_of(func)}: slice bounds must be ints or None, got {type(value).__name__}."
        ) from None


def slice_segments(func: Func, x: RaggedArray, start: Any, stop: Any, step: Any) -> RaggedArray:
    """``segment[start:stop:step]`` for every segment (Python slice semantics per segment).

    Reads the new total and maximum length once (one host sync), except where the result keeps
    every row (``x`` itself) or only reverses the segments (the same partition, sync-free).
    """
    start, stop, step = (_slice_int(func, v) for v in (start, stop, step))
    step = 1 if step is None else step
    if step == 0:
        raise ValueError(f"{name_of(func)}: slice step cannot be zero.")
    level = x.partition.levels[0]
    known = level.max_length
    if _keeps_all(start, stop, step, known):
        return x
    low, count = _bounds(level.lengths, start, stop, step)
    if _reverses_all(start, stop, step, known):
        new, partition = level, x.partition
    else:
        total, longest, squares = length_stats(count)  # the one host sync
        new = RowPartition.from_lengths(count, total, longest, squares)
        partition = Partition((new,))
    rows = new.row_ids
    source = level.offsets[rows] + low[rows] + new.positions() * step
    return RaggedArray(x.values.index_select(0, source), partition, x.axes)


def _keeps_all(start: int | None, stop: int | None, step: int, known: int | None) -> bool:
    """Whether ``[start:stop:step]`` keeps every row of every segment, known without data."""
    if known == 0:
        return True
    if step != 1:
        return False
    from_first = (
        start is None or start == 0 or (known is not None and start < 0 and -start >= known)
    )
    to_last = stop is None or (known is not None and stop >= known)
    return from_first and to_last


def _reverses_all(start: int | None, stop: int | None, step: int, known: int | None) -> bool:
    """Whether ``[start:stop:step]`` reverses every segment whole (lengths unchanged)."""
    if step != -1:
        return False
    from_last = start is None or start == -1 or (known is not None and start >= known - 1)
    to_first = stop is None or (known is not None and stop < -known)
    return from_last and to_first


def _bounds(
    lengths: Tensor, start: int | None, stop: int | None, step: int
) -> tuple[Tensor, Tensor]:
    """Per-segment first position and row count of ``[start:stop:step]`` (``slice.indices``)."""

    def clip(bound: int, lowest: int, top: Tensor) -> Tensor:
        # negative bounds count from the end and stop at `lowest`; others stop at `top`
        return (lengths + bound).clamp_min(lowest) if bound < 0 else top.clamp_max(bound)

    if step > 0:
        low = torch.zeros_like(lengths) if start is None else clip(start, 0, lengths)
        high = lengths if stop is None else clip(stop, 0, lengths)
        count = torch.div(high - low + (step - 1), step, rounding_mode="floor")
    else:
        top = lengths - 1
        low = top if start is None else clip(start, -1, top)
        high = torch.full_like(lengths, -1) if stop is None else clip(stop, -1, top)
        count = torch.div(low - high + (-step - 1), -step, rounding_mode="floor")
    return low, count.clamp_min(0)
