"""Nested Python lists to values plus per-level lengths (``ragged.array`` on list data).

A list of segments is nested ``1 + ragged_ndim + len(inner)`` deep. Axes 1..``ragged_ndim`` are
ragged (their lists may differ in length); the rest are dense (uniform). Unless given,
``ragged_ndim`` is the smallest that fits: the deepest axis whose lists differ in length.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from ._errors import Func, type_error, value_error

try:  # numpy scalars are numbers to torch.tensor
    from numpy import generic as _np_generic

    _SCALARS: tuple[type, ...] = (numbers.Number, _np_generic)
except ImportError:  # pragma: no cover - numpy is optional
    _SCALARS = (numbers.Number,)


def _depth(obj: Any, level: int, depths: set[int], empties: list[int]) -> None:
    """Collect the depth of every scalar (``depths``) and of every empty list (``empties``)."""
    if isinstance(obj, (list, tuple)):
        if not obj:
            empties.append(level)
        for item in obj:
            _depth(item, level + 1, depths, empties)
    else:
        depths.add(level)


def _list_lengths(obj: Any, level: int, found: dict[int, set[int]]) -> None:
    """The set of list lengths at every nesting level."""
    if isinstance(obj, (list, tuple)):
        found.setdefault(level, set()).add(len(obj))
        for item in obj:
            _list_lengths(item, level + 1, found)


def _row_shape(row: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(row, (list, tuple)):
        shape.append(len(row))
        row = row[0] if row else None
    return tuple(shape)


def _split(
    obj: Sequence[Any], depth: int, ragged_ndim: int, levels: list[list[int]], rows: list[Any]
) -> None:
    """Record the lengths of the lists at ``depth`` (1: segments) and collect the value rows."""
    levels[depth - 1].append(len(obj))
    if depth == ragged_ndim:
        rows.extend(obj)
        return
    for child in obj:
        _split(child, depth + 1, ragged_ndim, levels, rows)


def from_lists(
    func: Func, data: Sequence[Any], ragged_ndim: int | None, dtype: torch.dtype | None, device: Any
) -> tuple[Tensor, list[list[int]]]:
    """Values and the host lengths of every ragged level, from nested lists."""
    depths: set[int] = set()
    empties: list[int] = []
    for b, segment in enumerate(data):
        if not isinstance(segment, (list, tuple)):
            raise value_error(
                func,
                "data",
                "must hold one sequence of rows per segment",
                f"data[{b}] = {segment!r}",
            )
        _depth(segment, 1, depths, empties)
    if len(depths) > 1 or (depths and any(level >= min(depths) for level in empties if level > 1)):
        found = sorted(depths | {level + 1 for level in empties if level > 1})
        raise value_error(
            func, "data", "must be nested lists of one consistent depth", f"depths {found}"
        )
    lengths_by_level: dict[int, set[int]] = {}
    for segment in data:
        _list_lengths(segment, 1, lengths_by_level)
    deepest = min(depths) - 1 if depths else 1  # the depth of the innermost lists
    if ragged_ndim is None:
        varying = [lvl for lvl, sizes in lengths_by_level.items() if lvl > 1 and len(sizes) > 1]
        ragged_ndim = max(varying, default=1)
    elif not 1 <= ragged_ndim <= max(deepest, 1):
        raise value_error(
            func, "ragged_ndim", f"must be in [1, {max(deepest, 1)}] for this data", ragged_ndim
        )
    levels: list[list[int]] = [[] for _ in range(ragged_ndim)]
    rows: list[Any] = []
    for segment in data:
        _split(segment, 1, ragged_ndim, levels, rows)
    try:
        values = torch.tensor(rows, dtype=dtype, device=device)
    except (ValueError, TypeError, RuntimeError) as err:
        _explain(func, data, dtype)
        shapes = sorted({_row_shape(row) for row in rows})
        raise value_error(
            func,
            "data",
            f"must have rows of one shape below ragged axis {ragged_ndim} (pass a larger ragged_ndim)",
            f"row shapes {shapes}",
        ) from err
    return values, levels


def _leaves(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, obj


def _explain(func: Func, data: Sequence[Any], dtype: torch.dtype | None) -> None:
    """Raise the error that says why ``torch.tensor`` refused ``data``, when it is not a shape
    mismatch: an entry that is not a number, or an integer beyond int64."""
    for path, leaf in _leaves(data, "data"):
        if isinstance(leaf, _SCALARS):  # bool is a Number
            if isinstance(leaf, int) and dtype is None and not -(2**63) <= leaf < 2**63:
                raise value_error(
                    func,
                    "data",
                    "must hold integers within int64 (pass dtype=torch.float64 for larger ones)",
                    f"{path} = {leaf}",
                )
        elif not (isinstance(leaf, Tensor) and leaf.dim() == 0):
            raise type_error(func, "data", "must hold numbers", f"{path} = {leaf!r}")
