"""Native streaming segment kernels: a small C library compiled on first use, loaded with ctypes.

Why native code and why C through ctypes, the build cache and the fallback without a compiler:
``ragged.kernels._native_build``. This module checks when the kernels can run and calls them.

What it computes. Float32 and float64 CPU tensors ``[N, D]`` whose inner elements are contiguous
(any row stride), grouped by int64 offsets into contiguous segments: sum, max/min, mean and
squared deviations (variance), logsumexp, softmax/log-softmax and the five scans, with their
backward passes. Sums, products and log-sum-exp accumulate in double for both dtypes (sums add
blocks of 16 rows in the input's dtype first, then each block's sum in double: the loop reads at
memory speed and a float32 segment of 10^6 rows keeps the accuracy of a float64 sum); the
float32 ``exp``/``log`` are branch-free Cephes polynomials (about 1 ulp) so that the compiler
vectorises them (with ``-fno-trapping-math``: without it GCC vectorised none of the exp loops,
and logsumexp and softmax ran 3-7x slower).
Every kernel checks that the offsets are non-decreasing and within the rows before reading (a
partition built with ``validate=False`` can be wrong) and raises ``ValueError`` otherwise.
Outputs come from torch's allocator, as every torch op's (``ragged.kernels._segment`` says
why not huge pages). With ``torch.get_num_threads() > 1`` the segments are split into ranges of
about equal rows, one per thread (the calls release the GIL); each segment is still reduced by
one thread in row order, so results do not depend on the thread count.

Callers (``ragged.kernels._segment``, ``ragged.kernels._scan``) decide when to use it: eager mode
only (``torch.compile`` traces the torch composites, which Inductor fuses), CPU, plain tensors
(not functorch wrappers: see :func:`usable`).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from ._native_build import library

__all__ = ["differentiable", "library", "plain", "usable"]

_DTYPES = {torch.float32: "f32", torch.float64: "f64"}
_lock = threading.Lock()  # guards the worker pool


def plain(t: Tensor) -> bool:
    """A CPU tensor with its own storage (not a functorch wrapper, fake or meta tensor)."""
    if type(t) is not Tensor or t.device.type != "cpu" or t.layout != torch.strided:
        return False
    if t.is_neg() or t.is_conj():
        return False
    try:
        t.data_ptr()
    except RuntimeError:
        return False
    return True


def differentiable(t: Tensor) -> bool:
    """Whether a :func:`plain` tensor ``t`` carries a gradient graph or a forward-mode tangent
    (then no ``out=``, and no kernel outside an ``autograd.Function``)."""
    if t.requires_grad and torch.is_grad_enabled():
        return True
    return fwAD.unpack_dual(t).tangent is not None


def usable(values: Tensor, *others: Tensor | None) -> bool:
    """Whether the native kernels can run on ``values`` (and ``others``, same dtype)."""
    if values.dtype not in _DTYPES or not plain(values):
        return False
    if any(o is not None and (o.dtype != values.dtype or not plain(o)) for o in others):
        return False
    return library() is not None


# --- calling the kernels ----------------------------------------------------------------------


def _output_like(t: Tensor) -> Tensor:
    """A fresh contiguous tensor shaped like ``t``, for a kernel to write every element of."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _rows(t: Tensor) -> tuple[Tensor, int, int]:
    """``t`` as ``[N, D]`` rows with contiguous inner elements: (tensor, row stride, D)."""
    n = t.shape[0]
    inner = t.shape[1:]
    d = 1
    for s in inner:
        d *= s
    # Inner elements contiguous among themselves (any row stride): view as [N, D].
    expected = 1
    ok = True
    for size, stride in zip(reversed(inner), reversed(t.stride()[1:]), strict=True):
        if size != 1 and stride != expected:
            ok = False
            break
        expected *= size
    if not ok:
        t = t.contiguous()
    row_stride = t.stride(0) if n > 1 else d
    return t, row_stride, d


def _check(code: int, func: str) -> None:
    if code == 1:
        raise ValueError(
            f"ragged.kernels.{func}: the segment offsets are not non-decreasing within the rows "
            "of the values (was the partition built with validate=False from bad input?)."
        )
    if code:
        raise MemoryError(f"ragged.kernels.{func}: out of memory")


def _offsets(offsets: Tensor) -> Tensor:
    if offsets.dtype == torch.int64 and offsets.is_contiguous():
        return offsets
    return offsets.to(torch.int64).contiguous()


class _PerSegment(NamedTuple):
    """A pointer to per-segment rows: a call on segments ``b0:b1`` starts ``b0`` rows later."""

    ptr: int
    row_bytes: int  # 0 for a row broadcast to every segment


_OFFSETS, _NUM = object(), object()  # where the (shifted) offsets and the segment count go
_PARALLEL_MIN_NUMEL = 1 << 18
_pool_state: dict[str, Any] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    """The worker threads, made afresh when their count changes."""
    with _lock:
        pool = _pool_state.get("pool")
        if pool is None or _pool_state["workers"] != workers:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = ThreadPoolExecutor(workers, thread_name_prefix="ragged-native")
            _pool_state.update(pool=pool, workers=workers)
    return pool


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: forget the pool (and a held lock)."""
    global _lock
    _lock = threading.Lock()
    _pool_state.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _ranges(off: Tensor, numel: int) -> list[tuple[int, int]]:
    """Segment ranges with about equal rows, one per torch thread (the kernels release the GIL:
    each range runs on its own thread, as torch's own ops use ``torch.get_num_threads()``)."""
    num = off.shape[0] - 1
    threads = torch.get_num_threads()
    if threads <= 1 or num < 2 or numel < _PARALLEL_MIN_NUMEL:
        return [(0, num)]
    rows = int(off[-1])
    targets = torch.arange(1, threads, dtype=torch.int64) * rows // threads
    cuts = torch.searchsorted(off, targets).clamp(0, num).tolist()
    bounds = sorted({0, num, *cuts})
    return list(itertools.pairwise(bounds))


def _launch(name: str, dtype: torch.dtype, offsets: Tensor, numel: int, *args: Any) -> None:
    """Call kernel ``name`` for ``dtype`` over all segments, split across threads."""
    fn = getattr(library(), f"{name}_{_DTYPES[dtype]}")
    off = _offsets(offsets)

    def call(bounds: tuple[int, int]) -> int:
        b0, b1 = bounds
        real = []
        for a in args:
            if a is _OFFSETS:
                real.append(off.data_ptr() + 8 * b0)
            elif a is _NUM:
                real.append(b1 - b0)
            elif isinstance(a, _PerSegment):
                real.append(a.ptr + b0 * a.row_bytes)
            else:
                real.append(a)
        return int(fn(*real))

    ranges = _ranges(off, numel)
    run = map if len(ranges) == 1 else _pool(len(ranges)).map
    for code in list(run(call, ranges)):
        _check(code, name)


def _per_segment(t: Tensor) -> _PerSegment:
    """A ``[B, *inner]`` tensor (contiguous) as per-segment rows."""
    return _PerSegment(t.data_ptr(), math.prod(t.shape[1:]) * t.element_size())


def _grad_rows(grad: Tensor, shape: Any) -> tuple[Tensor, int]:
    """A gradient as rows of contiguous inner elements: (tensor, row stride; 0 if broadcast)."""
    g, gs, _ = _rows(grad.expand(shape))
    return g, gs


def _reduced(values: Tensor, offsets: Tensor) -> Tensor:
    return values.new_empty((offsets.shape[0] - 1, *values.shape[1:]))


def _launch_rows(name: str, values: Tensor, offsets: Tensor, *args: Any) -> None:
    """:func:`_launch` of a kernel whose leading arguments are the rows of ``values`` (pointer,
    row stride, row size), the offsets, the segment count and the row count; then ``args``."""
    v, rs, d = _rows(values)
    _launch(
        name, v.dtype, offsets, v.numel(), v.data_ptr(), rs, d, _OFFSETS, _NUM, v.shape[0], *args
    )


def _reduction_backward(
    name: str, values: Tensor, offsets: Tensor, result: Tensor, grad: Tensor
) -> Tensor:
    """The rows' gradient by kernel ``name``, the backward of a reduction whose per-segment
    ``result`` it reads, from ``grad`` (per segment, possibly broadcast)."""
    result = result.contiguous()
    g, gs = _grad_rows(grad, result.shape)
    out = _output_like(values)
    per_segment_grad = _PerSegment(g.data_ptr(), gs * g.element_size())
    _launch_rows(name, values, offsets, _per_segment(result), per_segment_grad, gs, out.data_ptr())
    return out


def segment_sum(values: Tensor, offsets: Tensor, mean: bool = False) -> Tensor:
    """``[B, *inner]`` sums of the segments ``values[offsets[b]:offsets[b + 1]]``, or with
    ``mean`` their means (divided in double before the one rounding; NaN for empty segments)."""
    out = _reduced(values, offsets)
    _launch_rows("rg_sum", values, offsets, int(mean), _per_segment(out))
    return out


def segment_moments(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """Per-segment mean and sum of squared deviations from it (NaN and 0 for empty ones)."""
    mean = _reduced(values, offsets)
    m2 = torch.empty_like(mean)
    _launch_rows("rg_moments", values, offsets, _per_segment(mean), _per_segment(m2))
    return mean, m2


def affine_rows(values: Tensor, offsets: Tensor, scale: Tensor, centre: Tensor) -> Tensor:
    """``scale[b] * (values - centre[b])`` for the rows of every segment ``b``."""
    scale, centre = scale.contiguous(), centre.contiguous()
    out = _output_like(values)
    _launch_rows(
        "rg_affine_rows", values, offsets, _per_segment(scale), _per_segment(centre), out.data_ptr()
    )
    return out


def segment_extreme(values: Tensor, offsets: Tensor, fill: float, largest: bool) -> Tensor:
    """Per-segment max (``largest``) or min; NaN propagates; empty segments give ``fill``."""
    out = _reduced(values, offsets)
    _launch_rows("rg_extreme", values, offsets, fill, int(largest), _per_segment(out))
    return out


def segment_extreme_backward(values: Tensor, offsets: Tensor, best: Tensor, grad: Tensor) -> Tensor:
    """Gradient of :func:`segment_extreme`: split evenly among the rows attaining it."""
    return _reduction_backward("rg_extreme_bwd", values, offsets, best, grad)


def segment_logsumexp(values: Tensor, offsets: Tensor) -> Tensor:
    """Per-segment ``log(sum(exp(rows)))``, shifted by the segment's finite maximum."""
    out = _reduced(values, offsets)
    _launch_rows("rg_logsumexp", values, offsets, _per_segment(out))
    return out


def segment_logsumexp_backward(
    values: Tensor, offsets: Tensor, out: Tensor, grad: Tensor
) -> Tensor:
    """``grad[b] * exp(values - out[b])`` for the rows of every segment ``b``."""
    return _reduction_backward("rg_logsumexp_bwd", values, offsets, out, grad)


def segment_softmax(values: Tensor, offsets: Tensor, log: bool) -> Tensor:
    """Softmax (or log-softmax) of the rows of every segment, elementwise over inner axes."""
    out = _output_like(values)
    _launch_rows("rg_softmax", values, offsets, int(log), out.data_ptr())
    return out


def segment_softmax_backward(out: Tensor, offsets: Tensor, grad: Tensor, log: bool) -> Tensor:
    """Vector-Jacobian product of :func:`segment_softmax` (``out`` its result)."""
    o, _, d = _rows(out.contiguous())
    g, gs = _grad_rows(grad, out.shape)
    result = _output_like(out)
    n = o.shape[0]
    _launch(
        "rg_softmax_bwd",
        o.dtype,
        offsets,
        o.numel(),
        o.data_ptr(),
        g.data_ptr(),
        gs,
        d,
        _OFFSETS,
        _NUM,
        n,
        int(log),
        result.data_ptr(),
    )
    return result


SCAN_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "logsumexp": 4}


def segment_scan(
    values: Tensor, offsets: Tensor, op: str, reverse: bool, exclusive: bool
) -> Tensor:
    """The scan ``op`` within every segment (from its end with ``reverse``)."""
    out = _output_like(values)
    _launch_rows(
        "rg_scan", values, offsets, SCAN_OPS[op], int(reverse), int(exclusive), out.data_ptr()
    )
    return out


def segment_scan_backward(
    values: Tensor,
    offsets: Tensor,
    out: Tensor,
    grad: Tensor,
    op: str,
    reverse: bool,
    exclusive: bool,
) -> Tensor:
    """Vector-Jacobian product of :func:`segment_scan` for prod, max, min and logsumexp."""
    v, rs, d = _rows(values)
    out = out.contiguous()
    g, gs = _grad_rows(grad, out.shape)
    result = _output_like(values)
    n = v.shape[0]
    _launch(
        "rg_scan_bwd",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        out.data_ptr(),
        g.data_ptr(),
        gs,
        d,
        _OFFSETS,
        _NUM,
        n,
        SCAN_OPS[op],
        int(reverse),
        int(exclusive),
        result.data_ptr(),
    )
    return result
