"""Argument checks shared by the conversions."""

from __future__ import annotations

from .._array import RaggedArray
from .._errors import Func, type_error, typename, value_error


def _ragged_arg(func: Func, x: object) -> RaggedArray:
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", typename(x))
    if x.ragged_ndim != 1:
        raise value_error(func, "x", "must have one ragged axis", f"{x.ragged_ndim} ragged axes")
    return x
