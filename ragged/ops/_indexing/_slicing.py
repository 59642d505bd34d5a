"""Slicing a ragged axis: ``row[start:stop:step]`` in every row (the bounds of each row's slice,
and when a slice provably keeps or reverses every row). ``ragged.ops._indexing._axis`` applies
them along any ragged axis."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import Tensor

from ..._errors import Func, name_of


def slice_int(func: Func, value: Any) -> int | None:
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


def keeps_all(start: int | None, stop: int | None, step: int, known: int | None) -> bool:
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


def reverses_all(start: int | None, stop: int | None, step: int, known: int | None) -> bool:
    """Whether ``[start:stop:step]`` reverses every segment whole (lengths unchanged)."""
    if step != -1:
        return False
    from_last = start is None or start == -1 or (known is not None and start >= known - 1)
    to_first = stop is None or (known is not None and stop < -known)
    return from_last and to_first


def slice_bounds(
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
