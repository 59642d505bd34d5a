"""Segment softmax, log-softmax and logsumexp: the kernels shifted by each segment's maximum.

Built on the sums and gathers of ``ragged.kernels._segment`` (whose docstring states the two
implementations every kernel has, the eager fast path and accuracy), with native kernels where
they run.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from . import _native as native
from ._segment import (
    COMPOSITE,
    NATIVE,
    Segments,
    eager_path,
    gather,
    gather_rows,
    index_add_chunked,
    native_runs,
    row_chunks,
    row_numel,
    rows_first,
    segment_amax,
    segment_sum,
    sum_dtype,
    sum_out_of_place,
)

# --- segment softmax --------------------------------------------------------------------------


def _stable_max(values: Tensor, segments: Segments) -> Tensor:
    """A per-group shift for exp: the detached maximum, 0 where it is not finite.

    Softmax is invariant to any per-group constant shift, so its gradient with respect to the
    shift is exactly zero: detaching it is exact in every order of differentiation and avoids the
    ``amax`` scatter backward.
    """
    peak = segment_amax(values.detach(), segments, 0.0)
    return torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))


def segment_softmax(values: Tensor, segments: Segments, *, log: bool = False) -> Tensor:
    """Softmax (or log-softmax) of the rows within each group, elementwise over inner axes.

    >>> s = Segments(torch.tensor([0, 0, 1]), 2, torch.tensor([2, 1]))
    >>> segment_softmax(torch.tensor([0.0, 0.0, 5.0]), s)
    tensor([0.5000, 0.5000, 1.0000])
    """
    path = eager_path(values, "rows", segments.offsets)
    if path is not COMPOSITE and values.is_floating_point():
        if path is NATIVE:
            return native.segment_softmax(values, cast(Tensor, segments.offsets), log)
        return _SegmentSoftmax.apply(values, segments.ids, segments.counts, segments.offsets, log)
    shifted = values - gather(_stable_max(values, segments), segments)
    exp = shifted.exp()
    total = segment_sum(exp, segments)
    if log:
        return shifted - gather(total.log(), segments)
    return exp / gather(total, segments)


class _SegmentSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        values: Tensor, ids: Tensor, counts: Tensor, offsets: Tensor | None, log: bool
    ) -> Tensor:
        if native_runs(values, offsets):
            return native.segment_softmax(values, cast(Tensor, offsets), log)
        segments = Segments(ids, counts.shape[0], counts, offsets)
        shift = _stable_max(values, segments)
        out = shift.index_select(0, ids)
        torch.sub(values, out, out=out)
        out.exp_()
        total = index_add_chunked(torch.zeros_like(shift, dtype=sum_dtype(shift)), ids, out)
        total = total.to(shift.dtype)
        parts = row_chunks(values.shape[0], row_numel(values), values.element_size())
        if log:
            shift.add_(total.log_())
            for part in parts:
                torch.sub(values[part], shift.index_select(0, ids[part]), out=out[part])
        else:
            for part in parts:
                out[part].div_(total.index_select(0, ids[part]))
        return out

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        _, ids, counts, offsets, log = inputs
        ctx.save_for_backward(ids, counts, output)
        ctx.save_for_forward(ids, counts, output)
        ctx.offsets = offsets
        ctx.log = log

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        ids, counts, out = ctx.saved_tensors
        segments = Segments(ids, counts.shape[0], counts, ctx.offsets)
        none = (None,) * 4
        if torch.is_grad_enabled():  # double backward: build the graph from composite ops
            return _softmax_vjp(grad, out, segments, ctx.log), *none
        if native_runs(out, ctx.offsets, grad):
            return native.segment_softmax_backward(out, ctx.offsets, grad, ctx.log), *none
        # Buffers written in place derive from `grad`, so this also runs batched (vmap).
        parts = list(row_chunks(out.shape[0], row_numel(out), out.element_size()))
        if ctx.log:  # grad - exp(out) * sum(grad)
            buffer = sum_out_of_place(grad, ids, counts.shape[0], parts).index_select(0, ids)
            for part in parts:
                buffer[part].mul_(out[part].exp()).neg_().add_(grad[part])
            return buffer, *none
        buffer = grad * out  # out * (grad - sum(grad * out))
        total = sum_out_of_place(buffer, ids, counts.shape[0], parts)
        for part in parts:
            buffer[part].copy_(grad[part]).sub_(total.index_select(0, ids[part])).mul_(out[part])
        return buffer, *none

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        ids, counts, out = ctx.saved_tensors
        segments = Segments(ids, counts.shape[0], counts, ctx.offsets)
        return _softmax_jvp(tangent, out, segments, ctx.log)

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, *args: Any) -> Any:
        values, out_dim = rows_first(values, in_dims[0])
        return _SegmentSoftmax.apply(values, *args), out_dim


def _softmax_jvp(tangent: Tensor, out: Tensor, segments: Segments, log: bool) -> Tensor:
    """Jacobian-vector product of softmax (``out``) or log-softmax (``out`` = log-probs)."""
    if log:
        return tangent - gather(segment_sum(tangent * out.exp(), segments), segments)
    return out * (tangent - gather(segment_sum(tangent * out, segments), segments))


def _softmax_vjp(grad: Tensor, out: Tensor, segments: Segments, log: bool) -> Tensor:
    """Vector-Jacobian product; softmax's Jacobian is symmetric, log-softmax's is not."""
    if log:
        return grad - gather(segment_sum(grad, segments), segments) * out.exp()
    return _softmax_jvp(grad, out, segments, log)


# --- segment logsumexp ------------------------------------------------------------------------


def segment_logsumexp(values: Tensor, segments: Segments) -> Tensor:
    """Per-group ``log(sum(exp(rows)))``, stably; empty groups give ``-inf``.

    The eager fast path never materialises ``exp(values - max)`` whole: the exponentials are
    summed chunk by chunk (``ragged.logsumexp`` was slower than a Python loop over segments
    when it built three full-size temporaries).

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_logsumexp(torch.tensor([0.0, 0.0, 5.0]), s)
    tensor([0.6931,   -inf, 5.0000])
    """
    path = eager_path(values, "rows", segments.offsets)
    if path is not COMPOSITE and values.is_floating_point():
        if path is NATIVE:
            return native.segment_logsumexp(values, cast(Tensor, segments.offsets))
        return _SegmentLogsumexp.apply(values, segments.ids, segments.counts, segments.offsets)
    peak = _stable_max(values, segments)
    return segment_sum((values - gather(peak, segments)).exp(), segments).log() + peak


class _SegmentLogsumexp(torch.autograd.Function):
    @staticmethod
    def forward(values: Tensor, ids: Tensor, counts: Tensor, offsets: Tensor | None) -> Tensor:
        if native_runs(values, offsets):
            return native.segment_logsumexp(values, cast(Tensor, offsets))
        peak = _stable_max(values, Segments(ids, counts.shape[0], counts, offsets))
        total = torch.zeros_like(peak, dtype=sum_dtype(peak))
        for part in row_chunks(values.shape[0], row_numel(values), values.element_size()):
            shifted = values[part] - peak.index_select(0, ids[part])
            total.index_add_(0, ids[part], shifted.exp_().to(total.dtype))
        return total.log_().to(peak.dtype).add_(peak)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        values, ids, counts, offsets = inputs
        ctx.save_for_backward(values, ids, counts, output)
        ctx.save_for_forward(values, ids, counts, output)
        ctx.offsets = offsets

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        values, ids, _counts, output = ctx.saved_tensors
        none = (None,) * 3
        if torch.is_grad_enabled():  # double backward: build the graph from composite ops
            weights = (values - output.index_select(0, ids)).exp()
            return weights * gather_rows(grad, ids), *none
        values, output = values.detach(), output.detach()
        if native_runs(values, ctx.offsets, output, grad):
            return native.segment_logsumexp_backward(values, ctx.offsets, output, grad), *none
        # d lse / d x = softmax(x): scale the gathered gradient in place, chunk by chunk. The
        # buffer derives from `grad`, so this also runs batched (vmap over gradients).
        result = gather_rows(grad, ids)
        for part in row_chunks(values.shape[0], row_numel(values), values.element_size()):
            weights = (values[part] - output.index_select(0, ids[part])).exp_()
            result[part].mul_(weights)
        return result, *none

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        values, ids, counts, output = ctx.saved_tensors
        weights = (values - output.index_select(0, ids)).exp()
        return segment_sum(tangent * weights, Segments(ids, counts.shape[0], counts, ctx.offsets))

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, *args: Any) -> Any:
        values, out_dim = rows_first(values, in_dims[0])
        return _SegmentLogsumexp.apply(values, *args), out_dim
