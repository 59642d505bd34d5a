"""Reductions: over the ragged axis, over inner axes, or over everything.

Axis rules (docs/semantics.md, "Axis names"): reducing the ragged axis **consumes** it (the result is a dense
``(B, *inner)`` tensor); reducing only inner axes **keeps** the partition (a RaggedArray);
reducing the batch axis alone is an error (segments have different lengths, so there is no
common ragged row to reduce into); reducing batch and ragged axes together is a **global**
reduction over all values (a dense tensor of the remaining inner axes). ``axis=None`` reduces
everything. ``keepdims=True`` keeps reduced axes as size 1, so ``(B, 1, *inner)`` for the ragged
axis, which broadcasts back against the input.

Empty segments get the reduction's identity where it has one (sum 0, prod 1, max -inf, min
+inf, logsumexp -inf, any False, all True, count_nonzero 0, norm 0) and NaN where it has none
(mean, var, std); argmax/argmin give -1. ``fill_value=`` overrides. No gradient is ever NaN for
a non-empty segment because of an empty one: per-segment results only flow back to their own
rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import REDUCE, normalize_axis
from ..._dtypes import highest, lowest
from ..._errors import Func, type_error, value_error
from ..._partition import Partition, RowPartition
from ..._registry import op
from ..._versions import check_unchanged
from ...kernels._segment import Segments, segment_amax, segment_amin, segment_mean, segment_sum
from ...kernels._segment_stats import segment_prod
from .._grouping import Grouping, group
from ._typing import reduction

Axis = int | str | Sequence[int | str] | None
SegmentFn = Callable[..., Tensor]  # (rows, segments[, positions]) -> [num, *rest]
DenseFn = Callable[[Tensor, tuple[int, ...], bool], Tensor]
REDUCTION_ARGS = "x: ragged, axis: axes?, keepdims: bool?, fill_value: number?"
# torch's spelling (``torch.sum(input, dim=None, keepdim=False, *, dtype=None)``).
TORCH_ARGS = "input, dim=None, keepdim=False, *, dtype=None"


def _normalize_axes(func: Func, x: RaggedArray, axis: Axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    if type(axis) is int and 0 <= axis < x.ndim:  # the common case, without the general checks
        return (axis,)
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = tuple(sorted({normalize_axis(func, x, a) for a in items}))
    if len(axes) != len(items):
        raise value_error(func, "axis", "must not repeat an axis", repr(axis))
    return axes


def _fold(values: Tensor, dims: tuple[int, ...], segments: Segments) -> tuple[Tensor, Segments]:
    """Move reduced inner ``dims`` of ``values`` into the row axis (each row becomes several)."""
    rest = [d for d in range(1, values.dim()) if d not in dims]
    moved = values.permute(0, *dims, *rest)
    factor = 1
    for d in dims:
        factor *= values.shape[d]
    rows = moved.reshape(values.shape[0] * factor, *[values.shape[d] for d in rest])
    ids = segments.ids[:, None].expand(values.shape[0], factor).reshape(-1)
    # Row i becomes rows i * factor .. (i + 1) * factor - 1: contiguous groups stay contiguous.
    offsets = None if segments.offsets is None else segments.offsets * factor
    return rows, Segments(ids, segments.num, segments.counts * factor, offsets)


def _fill_empty(out: Tensor, counts: Tensor, fill: Any) -> Tensor:
    empty = (counts == 0).view(-1, *[1] * (out.dim() - 1))
    return torch.where(empty, torch.as_tensor(fill, dtype=out.dtype, device=out.device), out)


def reduce(
    func: Func,
    x: RaggedArray,
    axis: Axis,
    keepdims: bool,
    fill_value: Any,
    *,
    segment_fn: SegmentFn,
    dense_fn: DenseFn,
    empty: Any,
    kernel_fills: bool = True,
    floating: bool = False,
    positions: bool = False,
) -> Tensor | RaggedArray:
    """Drive a reduction: check the arguments once, pick the case from ``axis`` and apply the
    matching kernel. Every reduction goes through here (``x`` is checked nowhere else).

    The common case (the one ragged axis of a one-level array, no ``keepdims`` and no
    ``fill_value``) goes straight to ``segment_fn`` on the partition's own rows, without the
    general grouping: tiny inputs then cost little more than the kernel call
    (docs/benchmarks.md, "Eager overhead of reductions").

    Args:
        func: public name, for errors.
        segment_fn: ``(rows, segments) -> [num, *rest]``, the reduction over the ragged axis.
        dense_fn: ``(tensor, dims, keepdim) -> tensor``, the reduction over dense dims; it must
            handle zero rows.
        empty: default result for an empty segment (``fill_value`` overrides it), or a function
            of the dtype that gives it.
        kernel_fills: ``segment_fn`` already gives ``empty`` for empty segments.
        floating: refuse integer and bool arrays.
        positions: ``segment_fn`` takes a third argument, a function that gives each row's
            position along the one reduced ragged axis (argmax and argmin).
    """
    check_arguments(func, x, keepdims, floating=floating)
    if keepdims is False and fill_value is None and kernel_fills:
        levels = x.partition.levels
        if len(levels) == 1 and (axis == 1 if type(axis) is int else _names_ragged(x, axis)):
            level = levels[0]
            segments = Segments(level.row_ids, level.num_rows, level.lengths, level.offsets)
            if positions:
                return segment_fn(x.values, segments, level.positions)
            return segment_fn(x.values, segments)
    if callable(empty):
        empty = empty(x.dtype)
    axes = _normalize_axes(func, x, axis)
    nr = x.ragged_ndim
    ragged = [a for a in axes if 1 <= a <= nr]
    inner = tuple(a - nr for a in axes if a > nr)  # dims of `values`
    if 0 in axes and len(ragged) != nr:
        raise value_error(
            func,
            "axis",
            "cannot reduce the batch axis without the ragged axis: segments have different "
            "lengths, so there is no common row to reduce into (reduce axes (0, 1) together for "
            "a global reduction, or the ragged axis 1 first)",
            repr(axis),
        )
    if not ragged:
        out = dense_fn(x.values, inner, keepdims)
        names = x.axes
        if names is not None and not keepdims:
            names = tuple(n for i, n in enumerate(names) if i - nr not in inner)
        return RaggedArray(out, x.partition, names)
    values = x.values
    grouping = None
    if 0 in axes:
        if values.shape[0]:
            return _with_kept_axes(
                dense_fn(values, (0, *inner), False), x, inner, keepdims, batch=True
            )
        # No values at all: one empty group gives the empty result with the right dtype.
        none = values.new_zeros(0, dtype=torch.int64)
        segments = Segments(none, 1, none.new_zeros(1), none.new_zeros(2))
    else:
        grouping = group(x, tuple(ragged))
        segments = grouping.segments
    if inner:
        values, segments = _fold(values, inner, segments)
    if positions:
        out = segment_fn(values, segments, cast(Grouping, grouping).positions)
    else:
        out = segment_fn(values, segments)
    if fill_value is not None or not kernel_fills:
        out = _fill_empty(out, segments.counts, empty if fill_value is None else fill_value)
    if grouping is not None and grouping.partition is not None:
        return _ragged_result(out, x, grouping.partition, ragged, inner, keepdims)
    if 0 in axes:
        out = out[0]
    return _with_kept_axes(out, x, inner, keepdims, batch=0 in axes)


def check_arguments(func: Func, x: Any, keepdims: Any, *, floating: bool = False) -> None:
    """The checks every reduction makes, once: ``x`` a RaggedArray not edited in place (the ops
    declare ``checks=True``), of a floating dtype if ``floating``, and ``keepdims`` a bool (as
    torch's ``keepdim``: ``keepdims=0`` is refused, not read as ``False``).

    >>> import ragged
    >>> check_arguments("ragged.f", ragged.array([[1.0]]), 0)
    Traceback (most recent call last):
    TypeError: ragged.f: `keepdims` must be a bool, got int.
    """
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", type(x).__name__)
    check_unchanged(func, x)
    if floating and not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise type_error(func, "x", "must have a floating-point dtype", x.dtype)
    if type(keepdims) is not bool:
        raise type_error(func, "keepdims", "must be a bool", type(keepdims).__name__)


def _names_ragged(x: RaggedArray, axis: Any) -> bool:
    """Whether ``axis`` is the name of the (first) ragged axis of ``x``."""
    names = x.axes
    return type(axis) is str and names is not None and names[1] == axis


def _with_kept_axes(
    out: Tensor, x: RaggedArray, inner: tuple[int, ...], keepdims: bool, batch: bool
) -> Tensor:
    if not keepdims:
        return out
    sizes = [1 if d in inner else s for d, s in enumerate(x.values.shape[1:], 1)]
    return out.reshape(1 if batch else x.num_segments, *[1] * x.ragged_ndim, *sizes)


def _ragged_result(
    out: Tensor,
    x: RaggedArray,
    partition: Partition,
    ragged: list[int],
    inner: tuple[int, ...],
    keepdims: bool,
) -> RaggedArray:
    """A reduction that keeps some ragged axes: ``out`` has one row per group."""
    nr = x.ragged_ndim
    if keepdims:
        # Reduced inner axes stay as size-1 axes; a reduced ragged axis before a kept one becomes
        # a size-1 level (one child per row), one after every kept one a size-1 inner axis.
        sizes = [1 if d in inner else s for d, s in enumerate(x.values.shape[1:], 1)]
        last_kept = [a for a in range(1, nr + 1) if a not in ragged][-1]
        kept = iter(partition.levels)
        levels: list[RowPartition] = []
        rows = x.num_segments
        for a in range(1, last_kept + 1):
            if a in ragged:
                levels.append(RowPartition.units(rows, out.device))
            else:
                levels.append(next(kept))
                rows = levels[-1].num_children
        trailing = [1] * (nr - last_kept)
        values = out.reshape(out.shape[0], *trailing, *sizes)
        return RaggedArray(values, Partition(tuple(levels)), x.axes)
    names = None
    if x.axes is not None:
        dropped = {*ragged, *(d + nr for d in inner)}
        names = tuple(n for i, n in enumerate(x.axes) if i not in dropped)
    return RaggedArray(out, partition, names)


# --- sum, mean, prod --------------------------------------------------------------------------


def _promoted(values: Tensor) -> Tensor:
    """Integer and bool sums accumulate in int64, as torch.sum does."""
    if values.dtype == torch.bool or not (values.is_floating_point() or values.is_complex()):
        return values.to(torch.int64)
    return values


def _segment_sum(values: Tensor, segments: Segments) -> Tensor:
    if values.is_floating_point():  # the common case, without a call to _promoted
        return segment_sum(values, segments)
    return segment_sum(_promoted(values), segments)


def _dense_sum(values: Tensor, dims: tuple[int, ...], keepdim: bool) -> Tensor:
    return torch.sum(values, dims, keepdim=keepdim)


def _dense_mean(values: Tensor, dims: tuple[int, ...], keepdim: bool) -> Tensor:
    return torch.mean(values, dims, keepdim=keepdim)


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=REDUCTION_ARGS,
    torch=(torch.sum,),
    methods=("sum",),
    torch_args=TORCH_ARGS,
    checks=True,
)
def sum(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Sum over ``axis`` (int, name or tuple; ``None``: everything).

    Args:
        x: the array.
        axis: axes to reduce; see the module docstring for the rules.
        keepdims: keep reduced axes as size 1.
        fill_value: result for empty segments (default 0).

    Returns:
        A dense tensor when the ragged axis is reduced, else a RaggedArray.

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0], [], [3.0]])
    >>> ragged.sum(x, axis=1)
    tensor([3., 0., 3.])
    >>> ragged.sum(x, axis=1, fill_value=-1.0)
    tensor([ 3., -1.,  3.])
    >>> ragged.sum(x)
    tensor(6.)
    """
    return reduce(
        sum,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=_segment_sum,
        dense_fn=_dense_sum,
        empty=0,
    )


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=REDUCTION_ARGS,
    torch=(torch.mean,),
    methods=("mean",),
    torch_args=TORCH_ARGS,
    checks=True,
)
def mean(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Arithmetic mean over ``axis``; empty segments give NaN (or ``fill_value``).

    >>> import ragged
    >>> ragged.mean(ragged.array([[1.0, 2.0], [], [3.0]]), axis=1)
    tensor([1.5000,    nan, 3.0000])
    """
    return reduce(
        mean,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=segment_mean,  # an empty segment gives 0 / 0 = NaN, the documented default
        dense_fn=_dense_mean,
        empty=float("nan"),
        floating=True,
    )


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=REDUCTION_ARGS,
    torch=(torch.prod,),
    methods=("prod",),
    torch_args=TORCH_ARGS,
    checks=True,
)
def prod(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Product over ``axis``; empty segments give 1.

    >>> import ragged
    >>> ragged.prod(ragged.array([[2.0, 3.0], [], [4.0]]), axis=1)
    tensor([6., 1., 4.])
    """

    def dense_fn(v: Tensor, dims: tuple[int, ...], keep: bool) -> Tensor:
        v = _promoted(v)
        for d in sorted(dims, reverse=True):
            v = torch.prod(v, d, keepdim=keep)
        return v

    return reduce(
        prod,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=lambda v, s: segment_prod(_promoted(v), s),
        dense_fn=dense_fn,
        empty=1,
    )


# --- max, min ---------------------------------------------------------------------------------


def _extreme(
    func: Func, x: RaggedArray, axis: Axis, keepdims: bool, fill_value: Any, largest: bool
) -> Any:
    identity = lowest if largest else highest
    kernel = segment_amax if largest else segment_amin
    dense = torch.amax if largest else torch.amin
    return reduce(
        func,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=lambda v, s: kernel(v, s, identity(v.dtype)),
        dense_fn=lambda v, d, k: dense(v, d, keepdim=k),
        empty=identity,
    )


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=REDUCTION_ARGS,
    torch=(torch.amax,),
    methods=("amax",),
    torch_args="input, dim=None, keepdim=False",
    checks=True,
)
def amax(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Maximum over ``axis``; empty segments give ``-inf`` (the dtype's minimum for integers).

    Gradient: split evenly among the elements that attain the maximum (as ``torch.amax``).

    >>> import ragged
    >>> ragged.amax(ragged.array([[1.0, 5.0], [], [3.0]]), axis=1)
    tensor([5., -inf, 3.])
    """
    return _extreme(amax, x, axis, keepdims, fill_value, largest=True)


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=REDUCTION_ARGS,
    torch=(torch.amin,),
    methods=("amin",),
    torch_args="input, dim=None, keepdim=False",
    checks=True,
)
def amin(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Minimum over ``axis``; empty segments give ``+inf`` (the dtype's maximum for integers).

    >>> import ragged
    >>> ragged.amin(ragged.array([[1.0, 5.0], [], [3.0]]), axis=1)
    tensor([1., inf, 3.])
    """
    return _extreme(amin, x, axis, keepdims, fill_value, largest=False)


@reduction
@op("reductions", rule=REDUCE, args=REDUCTION_ARGS, checks=True)
def max(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Maximum over ``axis``: the same as [`amax`][ragged.amax] (values only, as ``jnp.max``).

    >>> import ragged
    >>> ragged.max(ragged.array([[1, 5], [3]]), axis=1)
    tensor([5, 3])
    """
    return _extreme(max, x, axis, keepdims, fill_value, largest=True)


@reduction
@op("reductions", rule=REDUCE, args=REDUCTION_ARGS, checks=True)
def min(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """Minimum over ``axis``: the same as [`amin`][ragged.amin].

    >>> import ragged
    >>> ragged.min(ragged.array([[1, 5], [3]]), axis=1)
    tensor([1, 3])
    """
    return _extreme(min, x, axis, keepdims, fill_value, largest=False)
