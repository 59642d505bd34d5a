"""Reductions with a numerical twist: ``logsumexp``, ``var``, ``std``, ``norm``.

They use the driver of the sums and extrema (same axis rules and empty-segment handling).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import REDUCE
from ..._errors import type_error
from ..._registry import op, refuse
from ...kernels._segment import Segments, segment_amax, segment_amin, segment_sum
from ...kernels._segment_softmax import segment_logsumexp
from ...kernels._segment_stats import segment_var
from ._reduce import _ARGS, Axis, _float_only, reduce
from ._typing import moment, reduction
from ._typing import norm as typed_norm

# var and std: Bessel's correction, and torch's spelling (``unbiased`` is its older flag).
_MOMENT_ARGS = "x: ragged, axis: axes?, correction: number?, keepdims: bool?, fill_value: number?"
_MOMENT_TORCH_ARGS = "input, dim=None, *, correction=1, keepdim=False, unbiased->correction=True"


@reduction
@op(
    "reductions",
    rule=REDUCE,
    args=_ARGS,
    torch=(torch.logsumexp,),
    methods=("logsumexp",),
    torch_args="input, dim, keepdim=False",
    checks=True,
)
def logsumexp(
    x: RaggedArray, axis: Axis = None, *, keepdims: bool = False, fill_value: Any = None
) -> Any:
    """``log(sum(exp(x)))`` over ``axis``, stably; empty segments give ``-inf``.

    >>> import ragged
    >>> ragged.logsumexp(ragged.array([[0.0, 0.0], [], [1.0]]), axis=1)
    tensor([0.6931,   -inf, 1.0000])
    """
    func = logsumexp
    _float_only(func, x)

    return reduce(
        func,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=segment_logsumexp,
        dense_fn=lambda v, d, k: torch.logsumexp(v, d, keepdim=k),
        empty=float("-inf"),
    )


@moment
@op(
    "reductions",
    rule=REDUCE,
    args=_MOMENT_ARGS,
    torch=(torch.var,),
    methods=("var",),
    torch_args=_MOMENT_TORCH_ARGS,
    checks=True,
)
def var(
    x: RaggedArray,
    axis: Axis = None,
    *,
    correction: int | float = 1,
    keepdims: bool = False,
    fill_value: Any = None,
) -> Any:
    """Variance over ``axis`` with Bessel's ``correction`` (1: sample variance, 0: population).

    Two passes (mean, then squared deviations), so it is exact for large offsets. Empty
    segments give NaN, and so do segments with ``length <= correction`` (as ``torch.var``).

    >>> import ragged
    >>> ragged.var(ragged.array([[1.0, 3.0], [], [2.0]]), axis=1)
    tensor([2., nan, nan])
    >>> ragged.var(ragged.array([[1.0, 3.0], [], [2.0]]), axis=1, correction=0)
    tensor([1., nan, 0.])
    """
    func = var
    _float_only(func, x)
    return reduce(
        func,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=lambda v, s: segment_var(v, s, correction),
        dense_fn=lambda v, d, k: _dense_var(v, d, k, correction),
        empty=float("nan"),
    )


def _dense_var(v: Tensor, dims: tuple[int, ...], keep: bool, correction: int | float) -> Tensor:
    """``torch.var`` without its warning on too few values (NaN there, as torch returns)."""
    count = 1
    for d in dims:
        count *= v.shape[d]
    squares = (v - v.mean(dims, keepdim=True)).square().sum(dims, keepdim=keep)
    dof = count - correction
    return squares / dof if dof > 0 else torch.full_like(squares, torch.nan)


@moment
@op(
    "reductions",
    rule=REDUCE,
    args=_MOMENT_ARGS,
    torch=(torch.std,),
    methods=("std",),
    torch_args=_MOMENT_TORCH_ARGS,
    checks=True,
)
def std(
    x: RaggedArray,
    axis: Axis = None,
    *,
    correction: int | float = 1,
    keepdims: bool = False,
    fill_value: Any = None,
) -> Any:
    """Standard deviation over ``axis``: ``sqrt(var(x, axis, correction=correction))``.

    Where the variance is 0 (a constant or one-element segment) the gradient is 0, not NaN as
    for ``torch.std``.

    >>> import ragged
    >>> ragged.std(ragged.array([[1.0, 3.0], [2.0]]), axis=1, correction=0)
    tensor([1., 0.])
    """
    func = std
    _float_only(func, x)
    return reduce(
        func,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=lambda v, s: _safe_root(segment_var(v, s, correction), 2.0),
        dense_fn=lambda v, d, k: _safe_root(_dense_var(v, d, k, correction), 2.0),
        empty=float("nan"),
    )


def _safe_root(total: Tensor, p: float) -> Tensor:
    """``total ** (1/p)`` with a zero (not NaN) gradient where ``total`` is 0 (NaN stays NaN)."""
    positive = total > 0
    root = torch.where(positive, torch.where(positive, total, 1.0) ** (1.0 / p), 0.0)
    return torch.where(torch.isnan(total), total, root)


@typed_norm
@op(
    "reductions",
    rule=REDUCE,
    args="x: ragged, ord: number?, axis: axes?, keepdims: bool?, fill_value: number?",
    torch=(torch.linalg.vector_norm,),
    torch_args="input, ord=2, dim=None, keepdim=False, *, dtype=None",
    checks=True,
)
def norm(
    x: RaggedArray,
    ord: float = 2,
    axis: Axis = None,
    *,
    keepdims: bool = False,
    fill_value: Any = None,
) -> Any:
    """Vector ``ord``-norm over ``axis`` (as ``torch.linalg.vector_norm``); empty segments give 0.

    The gradient at a zero vector is 0, as in ``torch.linalg.vector_norm``.

    >>> import ragged
    >>> x = ragged.array([[3.0, -4.0], [], [1.0]])
    >>> ragged.norm(x, axis=1), ragged.norm(x, 1, axis=1), ragged.norm(x, float("inf"), axis=1)
    (tensor([5., 0., 1.]), tensor([7., 0., 1.]), tensor([4., 0., 1.]))
    """
    func = norm
    _float_only(func, x)
    if not isinstance(ord, (int, float)) or isinstance(ord, bool):
        raise type_error(func, "ord", "must be a number", type(ord).__name__)
    p = float(ord)

    def segment_fn(v: Tensor, s: Segments) -> Tensor:
        magnitude = v.abs()
        if p == float("inf"):
            return segment_amax(magnitude, s, 0.0)
        if p == float("-inf"):
            return segment_amin(magnitude, s, 0.0)
        if p == 0:
            return segment_sum((v != 0).to(v.dtype), s)
        if p == 1:
            return segment_sum(magnitude, s)
        if p == 2:
            return _safe_root(segment_sum(v.square(), s), 2.0)
        return _safe_root(segment_sum(magnitude**p, s), p)

    return reduce(
        func,
        x,
        axis,
        keepdims,
        fill_value,
        segment_fn=segment_fn,
        dense_fn=lambda v, d, k: torch.linalg.vector_norm(v, p, d, keepdim=k),
        empty=0.0,
    )


# torch reductions without a ragged op (declared once: a torch function is supported or refused).
refuse(
    torch.median,
    torch.nanmedian,
    torch.quantile,
    torch.mode,
    torch.nansum,
    torch.nanmean,
    family="reductions",
    hint="no ragged op: per segment, e.g. ragged.vmap(lambda s: torch.median(s, 0).values)(x)",
    see=("ragged.vmap",),
)
refuse(
    torch.nn.functional.cross_entropy,
    torch.nn.functional.nll_loss,
    family="reductions",
    hint="torch puts the classes on dim 1, the ragged axis of a RaggedArray; call it on the "
    "rows: F.cross_entropy(logits.values, target.values)",
)
