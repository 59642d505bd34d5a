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
  large temporaries the composite allocates: on CPU a fresh tensor over ~32 MB is page-faulted
  on first touch, which costs more than the arithmetic, so they allocate one output, work in
  place on it and feed ``index_add_``/``scatter_reduce_`` in chunks of ~16 MB. Outputs come
  from torch's allocator like every torch op's: the kernels do not ask for transparent huge
  pages, which backfired on VMs that report free memory to the host (torch's
  ``THP_MEM_ALLOC_ENABLE=1`` turns them on where they are fast; docs/benchmarks-history.md,
  "Huge pages", has the measurements).
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

Here: ``Segments``, the choice of path, sums, maxima and minima, and ``gather``; softmax,
log-softmax and logsumexp are in ``ragged.kernels._segment_softmax``, variance and product in
``ragged.kernels._segment_stats``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import Tensor

from .._dtypes import highest, lowest
from . import _native as native

_FAST_MIN_NUMEL = 1 << 18  # below this the composite path is faster (fixed overheads dominate)
# With the native kernels the fast path pays from smaller sizes: below these the composite's
# many small ops still cost less than the kernel's fixed cost (a direct call, or more through an
# autograd.Function with its backward); a scan's native kernel pays at every size. The
# thresholds come from tools/small_inputs.py (docs/benchmarks-history.md, "Small inputs").
_NATIVE_MIN_NUMEL = {"reduce": 1 << 17, "rows": 1 << 12, "scan": 0}
_NATIVE_MIN_ROWS = {"reduce": 4096, "rows": 1 << 62, "scan": 0}  # through the Function
_DIRECT_MIN_ROWS = {"reduce": 1024, "rows": 0, "scan": 0}  # called directly
_CHUNK_BYTES = 16 << 20
_LONG_ROWS = 512  # eager composite sums of more rows accumulate float32 in float64


@dataclasses.dataclass(eq=False, slots=True)
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


COMPOSITE = "composite"  # torch ops that every transform and torch.compile see through
FUNCTION = "function"  # the autograd.Function on chunked torch ops (no native kernel)
NATIVE_FUNCTION = "native function"  # the autograd.Function on the native kernels
NATIVE = "native"  # the native kernel called directly: nothing to differentiate


def use_fast_path(values: Tensor, kind: str = "reduce", offsets: Tensor | None = None) -> bool:
    """Whether ``values`` is large enough for the eager fast path (never while compiling).

    ``kind`` is "reduce" (one output row per segment), "rows" (one per row: softmax and
    log-softmax, and logsumexp, whose composite is as long) or "scan" (a scan that the native
    kernel computes), for the size from which the native kernels pay. Pass the groups'
    ``offsets`` (``None`` where they are not contiguous runs of rows) to let smaller inputs
    take the native kernels from a number of rows. Segment kernels ask :func:`eager_path`.
    """
    # Check compiling first: the size may be data-dependent (unbacked) inside a compiled graph.
    if torch.compiler.is_compiling():
        return False
    numel = values.numel()
    if numel >= _FAST_MIN_NUMEL:
        return True
    if numel >= _NATIVE_MIN_NUMEL[kind]:
        return native.usable(values)
    # Fewer rows than either table asks for (the direct one asks for no more): the composite,
    # decided before the checks of usable() and differentiable() (a microsecond on tiny calls).
    rows = values.shape[0]
    if offsets is None or rows < _DIRECT_MIN_ROWS[kind] or not native.usable(values):
        return False
    return rows >= (_NATIVE_MIN_ROWS if native.differentiable(values) else _DIRECT_MIN_ROWS)[kind]


def native_runs(values: Tensor, offsets: Tensor | None, *others: Tensor | None) -> bool:
    """Whether the native kernels can run: contiguous groups (``offsets``) and plain float CPU
    tensors (``values`` and ``others``, the saved output and incoming gradient of a backward)."""
    return offsets is not None and native.usable(values, *others)


def eager_path(values: Tensor, kind: str = "reduce", offsets: Tensor | None = None) -> str:
    """The one decision of how a segment kernel runs on ``values``: :data:`COMPOSITE` (small
    inputs, and always while compiling), :data:`NATIVE` (the native kernel called directly:
    nothing to differentiate, no grad, tangent or functorch wrapper; an ``autograd.Function``
    costs 20-50 us per call, ``apply`` binds its arguments with ``inspect``),
    :data:`NATIVE_FUNCTION` (the Function, whose passes run the native kernels) or
    :data:`FUNCTION` (the Function on chunked torch ops). ``kind`` and ``offsets`` as for
    :func:`use_fast_path`.

    >>> eager_path(torch.zeros(4, 8), "reduce", torch.tensor([0, 4]))
    'composite'
    """
    if torch.compiler.is_compiling():
        return COMPOSITE
    # Tiny inputs, decided first: this runs on every eager call of a segment kernel.
    if values.numel() < _NATIVE_MIN_NUMEL[kind] and (
        offsets is None or values.shape[0] < _DIRECT_MIN_ROWS[kind]
    ):
        return COMPOSITE
    if not use_fast_path(values, kind, offsets):
        return COMPOSITE
    if not native_runs(values, offsets):
        return FUNCTION
    return NATIVE_FUNCTION if native.differentiable(values) else NATIVE


def row_chunks(rows: int, row_numel: int, itemsize: int) -> Iterator[slice]:
    step = max(4096, _CHUNK_BYTES // max(1, row_numel * itemsize))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def row_numel(values: Tensor) -> int:
    return values[0].numel() if values.shape[0] else 0


def expand_ids(ids: Tensor, like: Tensor) -> Tensor:
    return ids.view(-1, *[1] * (like.dim() - 1)).expand_as(like)


def _fill_tensor(like: Tensor, num: int, fill: float | int | bool) -> Tensor:
    return like.new_full((num, *like.shape[1:]), fill)


# --- vmap support shared by the Functions -----------------------------------------------------


def rows_first(values: Tensor, batch_dim: int | None) -> tuple[Tensor, int | None]:
    """Move a vmap batch dim behind the row dim: row-wise segment ops treat it as inner."""
    if batch_dim is None:
        return values, None
    return values.movedim(batch_dim, 1), 1


# --- segment sum ------------------------------------------------------------------------------


def sum_dtype(values: Tensor) -> torch.dtype:
    """The dtype sums of ``values`` accumulate in: float64 for float32 and half (not on MPS,
    which has no float64), else the values' own."""
    low = values.dtype in (torch.float32, torch.float16, torch.bfloat16)
    return torch.float64 if low and values.device.type != "mps" else values.dtype


def index_add_chunked(out: Tensor, ids: Tensor, values: Tensor) -> Tensor:
    for part in row_chunks(values.shape[0], row_numel(values), values.element_size()):
        out.index_add_(0, ids[part], values[part].to(out.dtype))
    return out


def sum_out_of_place(values: Tensor, ids: Tensor, num: int, parts: list[slice]) -> Tensor:
    """Chunked segment sum without in-place updates (safe on batched gradients)."""
    acc = sum_dtype(values)
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
    return sum_on_path(eager_path(values, "reduce", segments.offsets), values, segments)


def sum_on_path(path: str, values: Tensor, segments: Segments) -> Tensor:
    """:func:`segment_sum` on a ``path`` that :func:`eager_path` chose for ``values``."""
    if path is NATIVE:
        return native.segment_sum(values, cast(Tensor, segments.offsets))
    if path is not COMPOSITE:
        return _SegmentSum.apply(values, segments.ids, segments.num, segments.offsets)
    dtype = values.dtype
    acc = dtype
    if torch.compiler.is_compiling() or values.shape[0] > _LONG_ROWS:
        acc = sum_dtype(values)
    if acc == dtype:  # no-op .to() calls and a dtype argument: half a tiny sum's time
        # Sizes as ints, not a tuple: a third of a tiny sum's time goes to parsing them.
        if values.dim() == 2:
            zeros = values.new_zeros(segments.num, values.shape[1])
        else:
            zeros = values.new_zeros(segments.num, *values.shape[1:])
        # In place on the fresh zeros (half a microsecond less than a copy): new_zeros of a
        # functorch-wrapped tensor is wrapped alike (vmap batches it), so every transform
        # accepts the in-place add.
        return zeros.index_add_(0, segments.ids, values)
    zeros = values.new_zeros((segments.num, *values.shape[1:]), dtype=acc)
    return zeros.index_add(0, segments.ids, values.to(acc)).to(values.dtype)


def segment_mean(values: Tensor, segments: Segments) -> Tensor:
    """Per-group means, ``[num, *inner]``; empty groups give NaN (0 / 0).

    Without a gradient to record, the native kernel divides each double sum by its count
    before the one rounding (one pass, one output: no second tensor for the quotient).

    >>> s = Segments(torch.tensor([0, 0, 2]), 3, torch.tensor([2, 0, 1]))
    >>> segment_mean(torch.tensor([1.0, 2.0, 3.0]), s)
    tensor([1.5000,    nan, 3.0000])
    """
    path = eager_path(values, "reduce", segments.offsets)
    if path is NATIVE:
        return native.segment_sum(values, cast(Tensor, segments.offsets), mean=True)
    # An empty group's (infinite) local derivative reaches no row: it has none.
    counts = segments.counts
    if values.dim() == 2:
        counts = counts.view(-1, 1)
    elif values.dim() > 2:
        counts = counts.view(-1, *[1] * (values.dim() - 1))
    return sum_on_path(path, values, segments) / counts


class _SegmentSum(torch.autograd.Function):
    @staticmethod
    def forward(values: Tensor, ids: Tensor, num: int, offsets: Tensor | None) -> Tensor:
        if native_runs(values, offsets):
            return native.segment_sum(values, cast(Tensor, offsets))
        total = values.new_zeros((num, *values.shape[1:]), dtype=sum_dtype(values))
        return index_add_chunked(total, ids, values).to(values.dtype)

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
        return gather_rows(grad, ids), None, None, None

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        (ids,) = ctx.saved_tensors
        return segment_sum(tangent, Segments(ids, ctx.num, ids.new_empty(0), ctx.offsets))

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, ids: Tensor, num: int, offsets: Any) -> Any:
        values, out_dim = rows_first(values, in_dims[0])
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
    path = eager_path(values, "reduce", segments.offsets)
    if path is NATIVE:
        return native.segment_extreme(values, cast(Tensor, segments.offsets), float(fill), largest)
    if path is not COMPOSITE:
        return _SegmentExtreme.apply(
            values, segments.ids, segments.counts, segments.offsets, fill, largest
        )
    out = _fill_tensor(values, segments.num, fill)
    how = "amax" if largest else "amin"
    return out.scatter_reduce(0, expand_ids(segments.ids, values), values, how, include_self=False)


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
        if native_runs(values, offsets):
            return native.segment_extreme(values, cast(Tensor, offsets), float(fill), largest)
        identity = lowest(values.dtype) if largest else highest(values.dtype)
        out = _fill_tensor(values, counts.shape[0], identity)
        how = "amax" if largest else "amin"
        for part in row_chunks(values.shape[0], row_numel(values), values.element_size()):
            chunk = values[part]
            out.scatter_reduce_(0, expand_ids(ids[part], chunk), chunk, how)
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
        if not torch.is_grad_enabled() and native_runs(values, ctx.offsets, output, grad):
            return native.segment_extreme_backward(values, ctx.offsets, output, grad), *none
        parts = list(row_chunks(values.shape[0], row_numel(values), values.element_size()))
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
        values, out_dim = rows_first(values, in_dims[0])
        return _SegmentExtreme.apply(values, *args), out_dim


def _tie_weights(values: Tensor, ids: Tensor, num: int, output: Tensor) -> Tensor:
    """Each row's share of its group's extremum: 1 / (number of ties) where attained, else 0."""
    attained = (values == output.index_select(0, ids)).to(values.dtype)
    ties = values.new_zeros((num, *values.shape[1:])).index_add(0, ids, attained)
    return attained / ties.clamp_min(1).index_select(0, ids)


# --- gathering back to rows -------------------------------------------------------------------


def gather_rows(grad: Tensor, ids: Tensor) -> Tensor:
    """An incoming gradient's rows ``grad[ids]``, for a backward pass.

    ``index_select`` copies each row of a contiguous source at once but walks a strided or
    expanded one element by element, and ``out.sum().backward()`` hands the backward an
    expanded gradient (measured, one thread: 1.0 ms against 0.30 from ``[2048, 8]`` to 16384
    rows). The gradient has one row per segment, so a contiguous copy of it is cheap.

    >>> gather_rows(torch.ones(1, 2).expand(2, 2), torch.tensor([0, 0, 1]))
    tensor([[1., 1.],
            [1., 1.],
            [1., 1.]])
    """
    return grad.contiguous().index_select(0, ids)


def gather(per_segment: Tensor, segments: Segments) -> Tensor:
    """Broadcast per-group values back to the rows, ``per_segment[ids]``."""
    return per_segment.index_select(0, segments.ids)
