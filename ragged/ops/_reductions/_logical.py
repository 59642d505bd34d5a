"""Reductions to booleans, counts and indices: ``any``, ``all``, ``count_nonzero``, ``count``,
``argmax``, ``argmin``.

They use the driver of the sums and extrema (same axis rules); argmax/argmin give the first
index of the extreme along one axis, -1 for empty segments; a segment holding NaN gives the
index of its first NaN, as ``torch.argmax``/``torch.argmin`` (NaN counts as the extreme).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import DENSE_RESULT, REDUCE, normalize_axis
from ..._errors import Func, type_error, value_error
from ..._registry import op
from ..._versions import check_unchanged
from ...kernels._segment import Segments, gather, segment_amax, segment_amin, segment_sum
from .._grouping import group
from ._reduce import _ARGS, Axis, _ragged_result, reduce
from ._typing import arg_reduction, reduction


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=_ARGS,
    torch=(torch.any,),
    methods=("any",),
    torch_args="input, dim=None, keepdim=False",
    checks=True,
)
def any(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Whether any element is nonzero over ``axis``; empty segments give False.

    >>> import ragged
    >>> ragged.any(ragged.array([[0, 2], [], [0]]), axis=1)
    tensor([ True, False, False])
    """
    return reduce(
        any,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=lambda v, s: segment_sum((v != 0).to(torch.int32), s) > 0,
        dense_fn=lambda v, d, k: _dense_bool(torch.any, v, d, k),
        empty=False,
    )


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=_ARGS,
    torch=(torch.all,),
    methods=("all",),
    torch_args="input, dim=None, keepdim=False",
    checks=True,
)
def all(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Whether every element is nonzero over ``axis``; empty segments give True.

    >>> import ragged
    >>> ragged.all(ragged.array([[1, 2], [], [0]]), axis=1)
    tensor([ True,  True, False])
    """

    def segment_fn(v: Tensor, s: Segments) -> Tensor:
        zeros = segment_sum((v == 0).to(torch.int32), s)
        return zeros == 0

    return reduce(
        all,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=segment_fn,
        dense_fn=lambda v, d, k: _dense_bool(torch.all, v, d, k),
        empty=True,
    )


def _dense_bool(op: Callable[..., Tensor], v: Tensor, dims: tuple[int, ...], keep: bool) -> Tensor:
    out = v != 0
    for d in sorted(dims, reverse=True):
        out = op(out, d, keepdim=keep)
    return out


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=_ARGS,
    torch=(torch.count_nonzero,),
    methods=("count_nonzero",),
    torch_args="input, dim=None",
    checks=True,
)
def count_nonzero(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Number of nonzero elements over ``axis`` (int64).

    >>> import ragged
    >>> ragged.count_nonzero(ragged.array([[0, 2, 3], [], [0]]), axis=1)
    tensor([2, 0, 0])
    """
    return reduce(
        count_nonzero,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=lambda v, s: segment_sum((v != 0).to(torch.int64), s),
        dense_fn=lambda v, d, k: torch.sum(v != 0, d, keepdim=k),
        empty=0,
    )


@op("reductions", rule=DENSE_RESULT, args="x: ragged")
def count(x: RaggedArray) -> Tensor:
    """Number of rows of each segment: the lengths of the first ragged axis, int64 ``[B]``.

    >>> import ragged
    >>> ragged.count(ragged.array([[1, 2], [], [3]]))
    tensor([2, 0, 1])
    """
    if not isinstance(x, RaggedArray):
        raise type_error(count, "x", "must be a RaggedArray", type(x).__name__)
    return x.lengths


# --- argmax, argmin ---------------------------------------------------------------------------


def _arg(
    func: Func,
    x: RaggedArray,
    axis: int | str | None,
    keepdims: bool,
    fill_value: Any,
    largest: bool,
) -> Any:
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", type(x).__name__)
    check_unchanged(func, x)  # declared checks=True
    pick = torch.argmax if largest else torch.argmin
    if axis is None:
        return pick(x.values)  # flat index into values
    if isinstance(axis, (tuple, list)):
        raise type_error(func, "axis", "must be one axis (int or name) or None", repr(axis))
    dim = normalize_axis(func, x, axis)
    nr = x.ragged_ndim
    if dim == 0:
        raise value_error(
            func, "axis", "cannot be the batch axis (segments differ in length)", axis
        )
    if dim > nr:
        out = pick(x.values, dim - nr, keepdim=keepdims)
        names = x.axes if keepdims or x.axes is None else x.axes[:dim] + x.axes[dim + 1 :]
        return RaggedArray(out, x.partition, names)
    values = x.values.detach()
    if values.dtype == torch.bool:
        values = values.to(torch.int8)
    grouping = group(x, (dim,))
    segments = grouping.segments
    best = (segment_amax if largest else segment_amin)(values, segments, 0)
    hit = values == gather(best, segments)
    if values.is_floating_point():
        # The extreme of a segment holding NaN is NaN (it propagates), and NaN equals nothing:
        # mark the NaNs, so that the first of them is the answer, as in torch.argmax.
        hit = hit | torch.isnan(values)
    positions = cast(Tensor, grouping.positions()).view(-1, *[1] * (values.dim() - 1))
    sentinel = torch.iinfo(torch.int64).max
    candidates = torch.where(hit, positions, sentinel)
    first = segment_amin(candidates, segments, -1 if fill_value is None else fill_value)
    if grouping.partition is None:
        return first.unsqueeze(1) if keepdims else first
    return _ragged_result(first, x, grouping.partition, [dim], (), keepdims)


@arg_reduction
@op(
    "reductions",
    rule=REDUCE,
    args="x: ragged, axis: axis?, keepdims: bool?, fill_value: number?",
    torch=(torch.argmax,),
    methods=("argmax",),
    torch_args="input, dim=None, keepdim=False",
    checks=True,
)
def argmax(
    x: RaggedArray, axis: int | str | None = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Index of the first maximum along ``axis`` (within each segment for the ragged axis).

    Empty segments give -1 (or ``fill_value``); ``axis=None`` gives a flat index into values.

    >>> import ragged
    >>> ragged.argmax(ragged.array([[1.0, 5.0, 5.0], [], [3.0]]), axis=1)
    tensor([ 1, -1,  0])
    """
    return _arg(argmax, x, axis, keepdims, fill_value, largest=True)


@arg_reduction
@op(
    "reductions",
    rule=REDUCE,
    args="x: ragged, axis: axis?, keepdims: bool?, fill_value: number?",
    torch=(torch.argmin,),
    methods=("argmin",),
    torch_args="input, dim=None, keepdim=False",
    checks=True,
)
def argmin(
    x: RaggedArray, axis: int | str | None = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Index of the first minimum along ``axis``; empty segments give -1.

    >>> import ragged
    >>> ragged.argmin(ragged.array([[4.0, 1.0, 1.0], [], [3.0]]), axis=1)
    tensor([ 1, -1,  0])
    """
    return _arg(argmin, x, axis, keepdims, fill_value, largest=False)
