"""Axis names and axis arguments.

A RaggedArray of logical shape ``(B, L*, *inner)`` is either fully named (one unique string per
axis) or unnamed (``axes is None``). Every op that takes ``axis=`` accepts an int (negative ints
count from the end) or a name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._errors import type_error, value_error

if TYPE_CHECKING:
    from ._array import RaggedArray

AxisNames = tuple[str, ...]


def check_names(func: str, axes: object, ndim: int, param: str = "axes") -> AxisNames | None:
    """Validate axis names for an array with ``ndim`` axes; return them as a tuple.

    >>> check_names("ragged.array", ["batch", "seq", "feat"], 3)
    ('batch', 'seq', 'feat')
    >>> check_names("ragged.array", None, 3) is None
    True
    >>> check_names("ragged.array", ["a", "a", "b"], 3)
    Traceback (most recent call last):
    ValueError: ragged.array: `axes` must be unique names, got ['a', 'a', 'b'].
    """
    if axes is None:
        return None
    if isinstance(axes, str) or not isinstance(axes, Sequence):
        raise type_error(func, param, f"must be a sequence of {ndim} str or None", repr(axes))
    names = tuple(axes)
    if not all(isinstance(name, str) for name in names):
        raise type_error(func, param, "must contain only str", repr(list(names)))
    if len(names) != ndim:
        raise value_error(
            func, param, f"must name all {ndim} axes", f"{len(names)} names {list(names)}"
        )
    if len(set(names)) != len(names):
        raise value_error(func, param, "must be unique names", repr(list(names)))
    return names


def normalize_axis(func: str, x: RaggedArray, axis: int | str, param: str = "axis") -> int:
    """Turn an int or a name into a non-negative axis index of ``x``.

    >>> import ragged
    >>> x = ragged.array([[[1.0, 2.0]], []], axes=("batch", "seq", "feat"))
    >>> normalize_axis("ragged.sum", x, "seq"), normalize_axis("ragged.sum", x, -1)
    (1, 2)
    >>> normalize_axis("ragged.sum", x, "time")
    Traceback (most recent call last):
    ValueError: ragged.sum: `axis` must be one of ('batch', 'seq', 'feat'), got 'time'.
    """
    ndim = x.ndim
    if isinstance(axis, str):
        if x.axes is None:
            raise value_error(func, param, "can be a name only for a named array", repr(axis))
        if axis not in x.axes:
            raise value_error(func, param, f"must be one of {x.axes}", repr(axis))
        return x.axes.index(axis)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise type_error(func, param, "must be an int or an axis name", type(axis).__name__)
    if not -ndim <= axis < ndim:
        raise value_error(func, param, f"must be in [{-ndim}, {ndim})", axis)
    return axis % ndim
