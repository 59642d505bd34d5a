"""Segment kernels: reductions and normalisations of rows grouped by a segment id.

Every kernel has two implementations with the same semantics:

* a *composite* one made of differentiable torch ops (``index_add``, ``scatter_reduce``,
  ``index_select``): it works under every ``torch.func`` transform (grad, vjp, jvp, jacfwd,
  hessian, vmap) and under ``torch.compile``, where Inductor fuses it; and
* an *eager fast path* for large inputs, an ``autograd.Function`` whose forward and backward
  are streaming kernels over sorted segments (``ragged.kernels._native``: one pass over the rows
  in order, the segment's accumulators in cache, each output written once) where the segments
  are contiguous runs of float32/float64 CPU rows and a C compiler is available. Elsewhere (no
  compiler, other dtypes or devices, strided groups) the Functions run torch ops that avoid the
  large temporaries the composite allocates: on CPU with the default allocator every fresh
  tensor over ~32 MB is page-faulted on first touch, which costs far more than the arithmetic
  (``index_select`` into a fresh 256 MB tensor 140 ms, into an existing one 11 ms), so they
  allocate one output, work in place on it, and feed ``index_add_``/``scatter_reduce_`` in
  chunks of ~16 MB (one 256 MB ``index_add_`` call: 35 ms; in 16 MB chunks: 15 ms). Large
  outputs are allocated on transparent huge pages where the OS allows it
  (:func:`ragged.kernels._native.empty`: a fresh 256 MB output costs 30 ms instead of 140).
  Backward passes run the native kernels only on plain gradients outside double backward;
  batched gradients (``jacrev``, ``hessian``, ``is_grads_batched``) and graphs of the gradient
  (double backward) take torch ops that only update buffers derived from the incoming
  gradient, and the Functions define ``jvp`` and ``vmap`` rules, so every transform still works.

Accuracy. Sums accumulate float32 (and half) rows in float64 on every path: the native kernels
keep double accumulators, the composite and torch paths accumulate in a float64 buffer for
segments that can be long (more than 512 rows in eager mode; always under ``torch.compile``,
where the conversion fuses into the scatter). A float32 segment of 10^6 rows is then summed as
accurately as ``torch.sum`` does it (``docs/semantics.md``, "Accuracy").

``torch.compile`` does not trace ``autograd.Function``s that define ``jvp``, so compiled code
always takes the composite path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .._dtypes import highest, lowest
from . import _native as native

_FAST_MIN_NUMEL = 1 << 18  # below this the composite path is faster (fixed overheads dominate)
# With the native kernels the fast path pays from smaller sizes (measured, one thread, segments
# of 64 rows): a sum or max of 2^17 elements 67 us native against 150 us composite (2^15: 47
# against 40); softmax and the scans of 2^12 elements 50-80 us against 100-200 us, where the
# composite's many small ops dominate.
_NATIVE_MIN_NUMEL = {"reduce": 1 << 17, "rows": 1 << 12}
_CHUNK_BYTES = 16 << 20
_LONG_ROWS = 512  # eager composite sums of more rows accumulate float32 in float64


@dataclasses.dataclass(frozen=True, eq=False)
class Segments:
    """How the rows of a values tensor group for an op along a ragged axis.

    Attributes:
        ids: int64 ``[rows]``, the group of each row (sorted when groups are contiguous runs).
        num: number of groups (the size of the reduced output's first axis).
        counts: int64 ``[num]``, rows per group.
        offsets: int64 ``[num + 1]`` when every group is a contiguous run of rows, else ``None``.
    """

    ids: Tensor
    num: int
    counts: Tensor
    offsets: Tensor | None = None


def use_fast_path(values: Tensor, kind: str = "reduce") -> bool:
    """Whether to take the eager fast path for ``values`` (never while compiling).

    ``kind`` is "reduce" (one output row per segment) or "rows" (one per row: softmax, scans,
    and logsumexp, whose composite is as long), for the size from which the native kernels pay.
    """
    # Check compiling first: the size may be data-dependent (unbacked) inside a compiled graph.
    if torch.compiler.is_compiling():
        return False
    numel = values.numel()
    if numel >= _FAST_MIN_NUMEL:
        return True
    return numel >= _NATIVE_MIN_NUMEL[kind] and native.usable(values)


def _native_rows(values: Tensor, offsets: Tensor | None, *others: Tensor | None) -> bool:
    """Whether the native kernels run: contiguous groups and plain float CPU tensors."""
    return offsets is not None and native.usable(values, *others)


def _direct(values: Tensor, offsets: Tensor | None) -> Tensor | None:
    """The offsets, if the native kernel can run without an ``autograd.Function``: nothing to
    differentiate (no grad, no tangent, no functorch wrapper). The Function costs 20-50 us per
    call (``apply`` binds its arguments with ``inspect``)."""
    if offsets is not None and native.usable(values) and not native.differentiable(values):
        return offsets
    return None


def _chunks(rows: int, row_numel: int, itemsize: int) -> Iterator[slice]:
    step = max(4096, _CHUNK_BYTES // max(1, row_numel * itemsize))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def _row_numel(values: Tensor) -> int:
    return values[0].numel() if values.shape[0] else 0


def _expand_ids(ids: Tensor, like: Tensor) -> Tensor:
    return ids.view(-1, *[1] * (like.dim() - 1)).expand_as(like)


def _fill_tensor(like: Tensor, num: int, fill: float | int | bool) -> Tensor:
    return like.new_full((num, *like.shape[1:]), fill)


def _gather_rows(per_segment: Tensor, ids: Tensor) -> Tensor:
    """``per_segment[ids]``; a plain CPU result outside autograd goes into a huge-page buffer."""
    if native.plain(per_segment) and not native.differentiable(per_segment):
        out = native.empty((ids.shape[0], *per_segment.shape[1:]), per_segment.dtype)
        return torch.index_select(per_segment, 0, ids, out=out)
    return per_segment.index_select(0, ids)


# --- vmap support shared by the Functions -----------------------------------------------------


def _rows_first(values: Tensor, batch_dim: int | None) -> tuple[Tensor, int | None]:
    """Move a vmap batch dim behind the row dim: row-wise segment ops treat it as inner."""
    if batch_dim is None:
        return values, None
    return values.movedim(batch_dim, 1), 1


# --- segment sum ------------------------------------------------------------------------------


def _accumulator(values: Tensor) -> torch.dtype:
    """The dtype sums of ``values`` accumulate in: float64 for float32 and half (not on MPS,
    which has no float64), else the values' own."""
    low = values.dtype in (torch.float32, torch.float16, torch.bfloat16)
    return torch.float64 if low and values.device.type != "mps" else values.dtype


def _index_add_chunked(out: Tensor, ids: Tensor, values: Tensor) -> Tensor:
    for part in _chunks(values.shape[0], _row_numel(values), values.element_size()):
        out.index_add_(0, ids[part], values[part].to(out.dtype))
    return out


def _sum_out_of_place(values: Tensor, ids: Tensor, num: int, parts: list[slice]) -> Tensor:
    """Chunked segment sum without in-place updates (safe on batched gradients)."""
    acc = _accumulator(values)
    total = values.new_zeros((num, *values.shape[1:]), dtype=acc)
    for part in parts:
        total = total.index_add(0, ids[part], values[part].to(acc))
    return total.to(values.dtype)


def segment_sum(values: Tensor, segments: Segments) -> Tensor:
    """Per-group sums, ``[num, *inner]``; empty groups give 0.

    >>> ids = torch.tensor([0, 0, 2])
    >>> segment_sum(torch.tensor([1.0, 2.0, 3.0]), Segments(ids, 3, torch.tensor([2, 0, 1])))
    tensor([3., 0., 3.])
    """
    if use_fast_path(values):
        if (offsets := _direct(values, segments.offsets)) is not None:
            return native.segment_sum(values, offsets)
        return _SegmentSum.apply(values, segments.ids, segments.num, segments.offsets)
    acc = values.dtype
    if torch.compiler.is_compiling() or values.shape[0] > _LONG_ROWS:
        acc = _accumulator(values)
    zeros = values.new_zeros((segments.num, *values.shape[1:]), dtype=acc)
    return zeros.index_add(0, segments.ids, values.to(acc)).to(values.dtype)


class _SegmentSum(torch.autograd.Function):
    @staticmethod
    def forward(values: Tensor, ids: Tensor, num: int, offsets: Tensor | None) -> Tensor:
        if _native_rows(values, offsets):
            assert offsets is not None
            return native.segment_sum(values, offsets)
        total = values.new_zeros((num, *values.shape[1:]), dtype=_accumulator(values))
        return _index_add_chunked(total, ids, values).to(values.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        _, ids, num, offsets = inputs
        ctx.save_for_backward(ids)
        ctx.save_for_forward(ids)
        ctx.num = num
        ctx.offsets = offsets

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (ids,) = ctx.saved_tensors
        return _gather_rows(grad, ids), None, None, None

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        (ids,) = ctx.saved_tensors
        return segment_sum(tangent, Segments(ids, ctx.num, ids.new_empty(0), ctx.offsets))

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, ids: Tensor, num: int, offsets: Any) -> Any:
        values, out_dim = _rows_first(values, in_dims[0])
        return _SegmentSum.apply(values, ids, num, offsets), out_dim


# --- segment max / min ------------------------------------------------------------------------


def segment_amax(values: Tensor, segments: Segments, fill: float | int | bool) -> Tensor:
    """Per-group maxima, ``[num, *inner]``; empty groups give ``fill``.

    The gradient is split evenly among the rows that attain a group's maximum (ties), as for
    ``torch.amax``.

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_amax(torch.tensor([1.0, 2.0, 3.0]), s, float("nan"))
    tensor([2., nan, 3.])
    """
    return _extreme(values, segments, fill, largest=True)


def segment_amin(values: Tensor, segments: Segments, fill: float | int | bool) -> Tensor:
    """Per-group minima, ``[num, *inner]``; empty groups give ``fill``.

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_amin(torch.tensor([1.0, 2.0, 3.0]), s, float("nan"))
    tensor([1., nan, 3.])
    """
    return _extreme(values, segments, fill, largest=False)


def _extreme(values: Tensor, segments: Segments, fill: Any, largest: bool) -> Tensor:
    if use_fast_path(values):
        if (offsets := _direct(values, segments.offsets)) is not None:
            return native.segment_extreme(values, offsets, float(fill), largest)
        return _SegmentExtreme.apply(
            values, segments.ids, segments.counts, segments.offsets, fill, largest
        )
    out = _fill_tensor(values, segments.num, fill)
    how = "amax" if largest else "amin"
    return out.scatter_reduce(0, _expand_ids(segments.ids, values), values, how, include_self=False)


class _SegmentExtreme(torch.autograd.Function):
    @staticmethod
    def forward(
        values: Tensor,
        ids: Tensor,
        counts: Tensor,
        offsets: Tensor | None,
        fill: float | int | bool,
        largest: bool,
    ) -> Tensor:
        if _native_rows(values, offsets):
            assert offsets is not None
            return native.segment_extreme(values, offsets, float(fill), largest)
        identity = lowest(values.dtype) if largest else highest(values.dtype)
        out = _fill_tensor(values, counts.shape[0], identity)
        how = "amax" if largest else "amin"
        for part in _chunks(values.shape[0], _row_numel(values), values.element_size()):
            chunk = values[part]
            out.scatter_reduce_(0, _expand_ids(ids[part], chunk), chunk, how)
        empty = (counts == 0).view(-1, *[1] * (values.dim() - 1))
        return out.masked_fill_(empty, fill)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        values, ids, counts, offsets, _, _ = inputs
        ctx.save_for_backward(values, ids, counts, output)
        ctx.save_for_forward(values, ids, counts, output)
        ctx.offsets = offsets

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        values, ids, _counts, output = (t.detach() for t in ctx.saved_tensors)
        none = (None,) * 5
        if not torch.is_grad_enabled() and _native_rows(values, ctx.offsets, output, grad):
            return native.segment_extreme_backward(values, ctx.offsets, output, grad), *none
        parts = list(_chunks(values.shape[0], _row_numel(values), values.element_size()))
        attained = torch.empty(values.shape, dtype=torch.bool, device=values.device)
        ties = torch.zeros_like(output)
        for part in parts:  # saved tensors only: never batched; the mask is piecewise constant
            torch.eq(values[part], output.index_select(0, ids[part]), out=attained[part])
            ties.index_add_(0, ids[part], attained[part].to(ties.dtype))
        result = (grad / ties.clamp_min_(1)).index_select(0, ids)
        return result.mul_(attained), *none

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        values, ids, counts, output = ctx.saved_tensors
        weights = _tie_weights(values, ids, counts.shape[0], output)
        return segment_sum(tangent * weights, Segments(ids, counts.shape[0], counts, ctx.offsets))

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, *args: Any) -> Any:
        values, out_dim = _rows_first(values, in_dims[0])
        return _SegmentExtreme.apply(values, *args), out_dim


def _tie_weights(values: Tensor, ids: Tensor, num: int, output: Tensor) -> Tensor:
    """Each row's share of its group's extremum: 1 / (number of ties) where attained, else 0."""
    attained = (values == output.index_select(0, ids)).to(values.dtype)
    ties = values.new_zeros((num, *values.shape[1:])).index_add(0, ids, attained)
    return attained / ties.clamp_min(1).index_select(0, ids)


# --- gathering back to rows -------------------------------------------------------------------


def gather(per_segment: Tensor, segments: Segments) -> Tensor:
    """Broadcast per-group values back to the rows, ``per_segment[ids]``."""
    return per_segment.index_select(0, segments.ids)


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
    if use_fast_path(values, "rows") and values.is_floating_point():
        if (offsets := _direct(values, segments.offsets)) is not None:
            return native.segment_softmax(values, offsets, log)
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
        if _native_rows(values, offsets):
            assert offsets is not None
            return native.segment_softmax(values, offsets, log)
        segments = Segments(ids, counts.shape[0], counts, offsets)
        shift = _stable_max(values, segments)
        out = _gather_rows(shift, ids)
        torch.sub(values, out, out=out)
        out.exp_()
        total = _index_add_chunked(torch.zeros_like(shift, dtype=_accumulator(shift)), ids, out)
        total = total.to(shift.dtype)
        parts = _chunks(values.shape[0], _row_numel(values), values.element_size())
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
        if _native_rows(out, ctx.offsets, grad):
            return native.segment_softmax_backward(out, ctx.offsets, grad, ctx.log), *none
        # Buffers written in place derive from `grad`, so this also runs batched (vmap).
        parts = list(_chunks(out.shape[0], _row_numel(out), out.element_size()))
        if ctx.log:  # grad - exp(out) * sum(grad)
            buffer = _sum_out_of_place(grad, ids, counts.shape[0], parts).index_select(0, ids)
            for part in parts:
                buffer[part].mul_(out[part].exp()).neg_().add_(grad[part])
            return buffer, *none
        buffer = grad * out  # out * (grad - sum(grad * out))
        total = _sum_out_of_place(buffer, ids, counts.shape[0], parts)
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
        values, out_dim = _rows_first(values, in_dims[0])
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


# --- segment variance -------------------------------------------------------------------------


def segment_var(values: Tensor, segments: Segments, correction: int | float) -> Tensor:
    """Per-group variance with Bessel's ``correction``, in two passes (the mean, then squared
    deviations from it: no cancellation); NaN where a group has ``correction`` rows or fewer.

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_var(torch.tensor([1.0, 3.0, 2.0]), s, 0)
    tensor([1., nan, 0.])
    """
    if use_fast_path(values) and _native_rows(values, segments.offsets):
        if (offsets := _direct(values, segments.offsets)) is not None:
            _, squares = native.segment_moments(values, offsets)
            return _per_dof(squares, _counts_like(segments.counts, values), correction)
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
        values, out_dim = _rows_first(values, in_dims[0])
        return _SegmentVar.apply(values, *args), (out_dim, out_dim)


# --- segment product --------------------------------------------------------------------------


def segment_prod(values: Tensor, segments: Segments) -> Tensor:
    """Per-group products, ``[num, *inner]``; empty groups give 1.

    Exact gradients with zeros (the derivative for element ``i`` is the product of the others).
    ``scatter_reduce(..., "prod")`` alone is not enough: its forward-mode derivative is zero in
    torch 2.13 (a silent error), so this is an ``autograd.Function`` with its own ``jvp``.
    Under ``torch.compile`` (which cannot trace a custom ``jvp``) the variant without ``jvp``
    runs: forward-mode AD of compiled code then fails loudly instead of silently.

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_prod(torch.tensor([2.0, 3.0, 4.0]), s)
    tensor([6., 1., 4.])
    """
    if not (values.is_floating_point() or values.is_complex()):
        ids = _expand_ids(segments.ids, values)
        return values.new_ones((segments.num, *values.shape[1:])).scatter_reduce(
            0, ids, values, "prod"
        )
    cls = _SegmentProd if torch.compiler.is_compiling() else _SegmentProdWithJvp
    return cls.apply(values, segments.ids, segments.num)


def _prod_forward(values: Tensor, ids: Tensor, num: int) -> Tensor:
    ones = values.new_ones((num, *values.shape[1:]))
    return ones.scatter_reduce(0, _expand_ids(ids, values), values, "prod")


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
        return grad.index_select(0, ids) * others, None, None

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, ids: Tensor, num: int) -> Any:
        values, out_dim = _rows_first(values, in_dims[0])
        return _SegmentProdWithJvp.apply(values, ids, num), out_dim


class _SegmentProdWithJvp(_SegmentProd):
    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        values, ids, output = ctx.saved_tensors
        others = _prod_of_others(values, ids, ctx.num, output)
        return segment_sum(tangent * others, Segments(ids, ctx.num, ids.new_empty(0)))


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
    if use_fast_path(values, "rows") and values.is_floating_point():
        if (offsets := _direct(values, segments.offsets)) is not None:
            return native.segment_logsumexp(values, offsets)
        return _SegmentLogsumexp.apply(values, segments.ids, segments.counts, segments.offsets)
    peak = _stable_max(values, segments)
    return segment_sum((values - gather(peak, segments)).exp(), segments).log() + peak


class _SegmentLogsumexp(torch.autograd.Function):
    @staticmethod
    def forward(values: Tensor, ids: Tensor, counts: Tensor, offsets: Tensor | None) -> Tensor:
        if _native_rows(values, offsets):
            assert offsets is not None
            return native.segment_logsumexp(values, offsets)
        peak = _stable_max(values, Segments(ids, counts.shape[0], counts, offsets))
        total = torch.zeros_like(peak, dtype=_accumulator(peak))
        for part in _chunks(values.shape[0], _row_numel(values), values.element_size()):
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
            return weights * grad.index_select(0, ids), *none
        values, output = values.detach(), output.detach()
        if _native_rows(values, ctx.offsets, output, grad):
            return native.segment_logsumexp_backward(values, ctx.offsets, output, grad), *none
        # d lse / d x = softmax(x): scale the gathered gradient in place, chunk by chunk. The
        # buffer derives from `grad`, so this also runs batched (vmap over gradients).
        result = grad.index_select(0, ids)
        for part in _chunks(values.shape[0], _row_numel(values), values.element_size()):
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
        values, out_dim = _rows_first(values, in_dims[0])
        return _SegmentLogsumexp.apply(values, *args), out_dim
