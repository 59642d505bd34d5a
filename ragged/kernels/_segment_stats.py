"""Segment variance and product, each an ``autograd.Function`` with its own backward.

Built on the sums and gathers of ``ragged.kernels._segment`` (whose docstring states the two
implementations every kernel has, the eager fast path and accuracy); the variance uses the
native moments kernel where it runs.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from . import _native as native
from ._segment import (
    NATIVE,
    NATIVE_FUNCTION,
    Segments,
    eager_path,
    expand_ids,
    gather,
    gather_rows,
    rows_first,
    segment_sum,
)

# --- segment variance -------------------------------------------------------------------------


def segment_var(values: Tensor, segments: Segments, correction: int | float) -> Tensor:
    """Per-group variance with Bessel's ``correction``, in two passes (the mean, then squared
    deviations from it: no cancellation); NaN where a group has ``correction`` rows or fewer.

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_var(torch.tensor([1.0, 3.0, 2.0]), s, 0)
    tensor([1., nan, 0.])
    """
    path = eager_path(values, "reduce", segments.offsets)
    if path is NATIVE:
        _, squares = native.segment_moments(values, cast(Tensor, segments.offsets))
        return _per_dof(squares, _counts_like(segments.counts, values), correction)
    if path is NATIVE_FUNCTION:
        args = (values, segments.ids, segments.counts, segments.offsets, correction)
        return _SegmentVar.apply(*args)[0]
    count = _counts_like(segments.counts, values)
    centre = segment_sum(values, segments) / count.clamp_min(1)
    squares = segment_sum((values - gather(centre, segments)).square(), segments)
    return _per_dof(squares, count, correction)


def _counts_like(counts: Tensor, values: Tensor) -> Tensor:
    return counts.view(-1, *[1] * (values.dim() - 1)).to(values.dtype)


def _per_dof(total: Tensor, count: Tensor, correction: int | float) -> Tensor:
    """``total / (count - correction)``, NaN without degrees of freedom (as ``torch.var``)."""
    dof = count - correction
    return torch.where(dof > 0, total / dof.clamp_min(1e-30), torch.nan)


class _SegmentVar(torch.autograd.Function):
    """Variance from the native two-pass moments; returns ``(var, mean)`` (the mean is not
    differentiable here: it is saved for the gradient ``2 (x - mean) / dof``)."""

    @staticmethod
    def forward(
        values: Tensor, ids: Tensor, counts: Tensor, offsets: Tensor, correction: Any
    ) -> tuple[Tensor, Tensor]:
        mean, squares = native.segment_moments(values, offsets)
        return _per_dof(squares, _counts_like(counts, values), correction), mean

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        values, ids, counts, ctx.offsets, ctx.correction = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(values, ids, counts, output[1])
        ctx.save_for_forward(values, ids, counts, output[1])

    @staticmethod
    def _scale(ctx: Any, grad: Tensor, counts: Tensor, values: Tensor) -> Tensor:
        dof = _counts_like(counts, values) - ctx.correction
        return torch.where(dof > 0, 2 * grad / dof.clamp_min(1e-30), 0.0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _: Any) -> tuple[Tensor | None, ...]:
        values, ids, counts, mean = ctx.saved_tensors
        scale = _SegmentVar._scale(ctx, grad, counts, values)
        none = (None,) * 4
        if torch.is_grad_enabled():  # double backward: the mean depends on the values too
            segments = Segments(ids, counts.shape[0], counts, ctx.offsets)
            centre = segment_sum(values, segments) / _counts_like(counts, values).clamp_min(1)
            return gather(scale, segments) * (values - gather(centre, segments)), *none
        if native.usable(values, scale, mean):
            return native.affine_rows(values, ctx.offsets, scale, mean), *none
        return scale.index_select(0, ids) * (values - mean.index_select(0, ids)), *none

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> tuple[Tensor, None]:
        values, ids, counts, mean = ctx.saved_tensors
        segments = Segments(ids, counts.shape[0], counts, ctx.offsets)
        deviation = values - mean.index_select(0, ids)
        change = segment_sum(deviation * tangent, segments)
        return _SegmentVar._scale(ctx, change, counts, values), None

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, *args: Any) -> Any:
        values, out_dim = rows_first(values, in_dims[0])
        return _SegmentVar.apply(values, *args), (out_dim, out_dim)


# --- segment product --------------------------------------------------------------------------


def segment_prod(values: Tensor, segments: Segments) -> Tensor:
    """Per-group products, ``[num, *inner]``; empty groups give 1.

    Exact gradients with zeros (the derivative for element ``i`` is the product of the others).
    ``scatter_reduce(..., "prod")`` alone is not enough: its forward-mode derivative is zero in
    torch 2.13 (a silent error), so this is an ``autograd.Function`` with its own ``jvp``
    (``tests/test_optable_transforms.py`` checks every op's jvp against finite differences: on
    a torch whose ``scatter_reduce`` has a correct forward derivative, the Function can go).
    Under ``torch.compile`` (which cannot trace a custom ``jvp``) the variant without ``jvp``
    runs: forward-mode AD of compiled code then fails loudly instead of silently.

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_prod(torch.tensor([2.0, 3.0, 4.0]), s)
    tensor([6., 1., 4.])
    """
    if not (values.is_floating_point() or values.is_complex()):
        ids = expand_ids(segments.ids, values)
        return values.new_ones((segments.num, *values.shape[1:])).scatter_reduce(
            0, ids, values, "prod"
        )
    cls = _SegmentProd if torch.compiler.is_compiling() else _SegmentProdWithJvp
    return cls.apply(values, segments.ids, segments.num)


def _prod_forward(values: Tensor, ids: Tensor, num: int) -> Tensor:
    ones = values.new_ones((num, *values.shape[1:]))
    return ones.scatter_reduce(0, expand_ids(ids, values), values, "prod")


def _prod_of_others(values: Tensor, ids: Tensor, num: int, output: Tensor) -> Tensor:
    """For each row, the product of the other rows of its group (exact with zeros)."""
    zero = values == 0
    zeros = values.new_zeros((num, *values.shape[1:])).index_add(0, ids, zero.to(values.dtype))
    nonzero_prod = _prod_forward(torch.where(zero, torch.ones_like(values), values), ids, num)
    zeros_rows = zeros.index_select(0, ids)
    safe = torch.where(zero, torch.ones_like(values), values)
    no_zero = output.index_select(0, ids) / safe
    one_zero = torch.where(zero, nonzero_prod.index_select(0, ids), torch.zeros_like(values))
    return torch.where(zeros_rows == 0, no_zero, torch.where(zeros_rows == 1, one_zero, 0.0))


class _SegmentProd(torch.autograd.Function):
    @staticmethod
    def forward(values: Tensor, ids: Tensor, num: int) -> Tensor:
        return _prod_forward(values, ids, num)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        values, ids, num = inputs
        ctx.save_for_backward(values, ids, output)
        ctx.save_for_forward(values, ids, output)
        ctx.num = num

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        values, ids, output = ctx.saved_tensors
        others = _prod_of_others(values, ids, ctx.num, output)
        return gather_rows(grad, ids) * others, None, None

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, ids: Tensor, num: int) -> Any:
        values, out_dim = rows_first(values, in_dims[0])
        return _SegmentProdWithJvp.apply(values, ids, num), out_dim


class _SegmentProdWithJvp(_SegmentProd):
    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        values, ids, output = ctx.saved_tensors
        others = _prod_of_others(values, ids, ctx.num, output)
        return segment_sum(tangent * others, Segments(ids, ctx.num, ids.new_empty(0)))
