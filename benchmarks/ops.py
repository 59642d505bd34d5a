"""Op benchmarks: ragged ops against padding and the best plain-torch composition.

Data: ``values`` ``[2**20, 64]`` float32 in 8192 segments with log-normal lengths (the spread
chosen so that max/mean length = 7.65, sigma about 0.6; rounding distributed so the lengths sum
exactly to the rows). torch runs on one thread with the default allocator.

For every op (``ragged.<op>(x, axis=1)``), forward and forward+backward:

* **ragged**: the op on a RaggedArray whose partition is built once;
* **padded**: ``ragged.to_padded`` with the fill that masks the op (0 for sums, -inf for max,
  logsumexp and softmax, +inf for sort), the dense op over the padded axis, and for row-wise
  outputs (softmax, cumsum, sort) the gather back to rows; the gradient flows through all of it;
* **plain torch**: several compositions over ``values`` and the precomputed segment ids / offsets
  (``index_add_``, ``scatter_reduce``, ``torch.segment_reduce``, a sparse CSR matmul,
  ``embedding_bag``, cumsum tricks, stable double sorts, a Python loop over segments); the
  fastest one that matches the ragged result is reported;
* **JAX** (optional peer, skipped with a note when ``jax`` is not installed): ``jax.jit`` of
  ``jax.ops.segment_sum`` / ``segment_max`` / ``segment_min`` with ``num_segments`` and
  ``indices_are_sorted=True`` on the same data in the same process (the same memory, through
  DLPack), XLA on one thread; softmax
  and logsumexp as segment_max (under ``stop_gradient``), exp, segment_sum and a gather; the
  scans as ``jax.lax.associative_scan`` with segment-start flags (exact), and for cumsum also
  the usual trick of a global ``cumsum`` minus its value at each segment start (lossy in
  float32: reported, marked "wrong"); forward+backward through ``jax.value_and_grad`` of
  ``sum(op(values) * grad)``.

Ratios are *other time / ragged time* (above 1: ragged is faster). GB/s counts the bytes an op
must read and write at least (stated per op; index tensors not counted), against a same-run
copy of ``values`` (``out.copy_(values)`` into an existing tensor, the ratio's reference, and
``values.clone()``, which also pays the page faults of a fresh 256 MB tensor).

The eager-overhead table times tiny inputs (B=4, lengths <= 8, D=8): ``x + y`` and
``ragged.sum(x, axis=1)`` against the same plain torch op on ``values`` (target: at most 3x).

cumprod runs on ``1 + values / 64`` (products of thousands of N(0, 1) factors leave float32's
range); every other op on ``values``.

With ``--device cuda`` the data lives on the GPU and every timed call is followed by a
synchronisation (wall time; ``ragged.bench.use_device``).

Usage: ``python benchmarks/ops.py [--quick] [--metric cpu|wall] [--device cpu|cuda] [--ops a,b]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ragged
from ragged.bench import (
    Table,
    add_device_option,
    compare,
    per_call,
    pin_cpu,
    use_device,
    write_result,
)

SCANS = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]
REDUCTIONS = ["sum", "mean", "max", "min"]  # read the values once: the copy floor applies
COPY = "out.copy_(values)"


def head_rounds(repeat: int) -> int:
    """Rounds of the head-to-head group (ragged, the copy, JAX) of a forward reduction: a round
    takes about 50 ms, so more of them than the suite's ``repeat`` cost little."""
    return max(3 * repeat, 21)


OPS = ["sum", "mean", "max", "min", "logsumexp", "softmax", *SCANS, "sort"]
ROW_WISE = {"softmax", "sort", *SCANS}  # outputs one row per input row
MAX_OVER_MEAN = 7.65


# --- data -------------------------------------------------------------------------------------


def lognormal_lengths(
    num: int, total: int, *, max_over_mean: float | None = None, sigma: float = 0.6, seed: int = 0
) -> list[int]:
    """``num`` log-normal lengths summing exactly to ``total`` (each at least 1 if it fits).

    With ``max_over_mean`` the spread ``sigma`` is solved (by bisection) so that the rounded
    lengths have that max/mean ratio. Rounding goes to the largest remainders.
    """
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(num, generator=gen, dtype=torch.float64)
    floor_at = 1 if total >= num else 0

    def rounded(s: float) -> torch.Tensor:
        raw = torch.exp(s * z)
        scaled = raw * (total - floor_at * num) / raw.sum()
        base = scaled.floor()
        lengths = (base + floor_at).long()
        order = torch.argsort(scaled - base, descending=True)
        lengths[order[: total - int(lengths.sum())]] += 1
        return lengths

    if max_over_mean is not None:
        sigma = 0.0
        if max_over_mean > 1.0:
            lo, hi = 0.0, 8.0
            for _ in range(50):
                mid = (lo + hi) / 2
                lengths = rounded(mid)
                if float(lengths.max()) * num / total < max_over_mean:
                    lo = mid
                else:
                    hi = mid
            sigma = hi
    lengths = rounded(sigma)
    assert int(lengths.sum()) == total
    return lengths.tolist()


@dataclass
class Data:
    """A ragged batch plus everything the plain-torch compositions precompute from it."""

    x: ragged.RaggedArray
    lengths_list: list[int]
    ids: Tensor  # row -> segment
    offsets: Tensor
    lengths: Tensor
    starts_rows: Tensor  # row -> first row of its segment
    flat: Tensor  # row -> position in the flattened [B * Lmax] padded grid
    csr: Tensor  # [B, N] sparse CSR matrix of ones: csr @ values = segment sums
    num: int
    max_length: int
    cache: dict[str, Tensor] = field(default_factory=dict)

    @property
    def values(self) -> Tensor:
        return self.x.values


def make_data(
    rows: int,
    num: int,
    dim: int,
    *,
    max_over_mean: float,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Data:
    lengths_list = lognormal_lengths(num, rows, max_over_mean=max_over_mean, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    values = torch.randn(rows, dim, generator=gen).to(device)
    x = ragged.from_lengths(values, lengths_list)
    level = x.partition.levels[0]
    max_length = max(lengths_list)
    arange = torch.arange(rows, device=values.device)
    positions = arange - level.offsets.index_select(0, level.row_ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        csr = torch.sparse_csr_tensor(
            level.offsets, arange, torch.ones_like(arange, dtype=values.dtype), size=(num, rows)
        )
    return Data(
        x=x,
        lengths_list=lengths_list,
        ids=level.row_ids,
        offsets=level.offsets,
        lengths=level.lengths,
        starts_rows=level.offsets.index_select(0, level.row_ids),
        flat=level.row_ids * max_length + positions,
        csr=csr,
        num=num,
        max_length=max_length,
    )


# --- the variants of each job: functions of a values tensor -----------------------------------

Variant = Callable[[Tensor], Tensor]


def ragged_variant(op: str, d: Data) -> Variant | None:
    fn = getattr(ragged, op, None)
    if fn is None:
        return None
    if op in ROW_WISE:
        return lambda v: fn(d.x.with_values(v), axis=1).values
    return lambda v: fn(d.x.with_values(v), axis=1)


def padded_variant(op: str, d: Data) -> Variant:
    B, L = d.num, d.max_length
    counts = d.lengths.clamp_min(1).to(torch.float32)[:, None]

    def pad(v: Tensor, fill: float) -> Tensor:
        return ragged.to_padded(d.x.with_values(v), fill)

    def unpad(p: Tensor) -> Tensor:
        return p.reshape(B * L, *p.shape[2:]).index_select(0, d.flat)

    inf = math.inf
    table: dict[str, Variant] = {
        "sum": lambda v: pad(v, 0.0).sum(1),
        "mean": lambda v: pad(v, 0.0).sum(1) / counts,
        "max": lambda v: pad(v, -inf).amax(1),
        "min": lambda v: pad(v, inf).amin(1),
        "logsumexp": lambda v: pad(v, -inf).logsumexp(1),
        "softmax": lambda v: unpad(pad(v, -inf).softmax(1)),
        "cumsum": lambda v: unpad(pad(v, 0.0).cumsum(1)),
        "cumprod": lambda v: unpad(pad(v, 1.0).cumprod(1)),
        "cummax": lambda v: unpad(pad(v, -inf).cummax(1).values),
        "cummin": lambda v: unpad(pad(v, inf).cummin(1).values),
        "logcumsumexp": lambda v: unpad(pad(v, -inf).logcumsumexp(1)),
        "sort": lambda v: unpad(pad(v, inf).sort(dim=1, stable=True).values),
    }
    return table[op]


def _zeros(d: Data, v: Tensor) -> Tensor:
    return v.new_zeros((d.num, *v.shape[1:]))


def _index_add(d: Data, v: Tensor) -> Tensor:
    return _zeros(d, v).index_add_(0, d.ids, v)


def _scatter(d: Data, v: Tensor, reduce: str) -> Tensor:
    fill = {"sum": 0.0, "amax": -math.inf, "amin": math.inf}[reduce]
    out = v.new_full((d.num, *v.shape[1:]), fill)
    return out.scatter_reduce(0, d.ids[:, None].expand_as(v), v, reduce, include_self=False)


def _segred(d: Data, v: Tensor, reduce: str) -> Tensor:
    return torch.segment_reduce(v, reduce, lengths=d.lengths, axis=0)


def _loop(d: Data, v: Tensor, per_segment: Callable[[Tensor], Tensor], rows: bool) -> Tensor:
    parts = [per_segment(s) for s in v.split(d.lengths_list)]
    return torch.cat(parts) if rows else torch.stack(parts)


def _csr_sum(d: Data, v: Tensor) -> Tensor:
    return d.csr @ v


def _embedding_bag(d: Data, v: Tensor, mode: str) -> Tensor:
    rows = d.cache.setdefault("arange", torch.arange(v.shape[0]))
    return torch.nn.functional.embedding_bag(
        rows, v, d.offsets, mode=mode, include_last_offset=True
    )


def _cumsum_sum(d: Data, v: Tensor) -> Tensor:
    c = torch.cat([v.new_zeros((1, *v.shape[1:])), v.cumsum(0)])
    return c.index_select(0, d.offsets[1:]) - c.index_select(0, d.offsets[:-1])


def _lse(d: Data, v: Tensor, peak_fn: Callable[[Tensor], Tensor], sum_fn: Variant) -> Tensor:
    peak = peak_fn(v.detach())
    return sum_fn((v - peak.index_select(0, d.ids)).exp()).log() + peak


def _softmax(d: Data, v: Tensor, peak_fn: Callable[[Tensor], Tensor], sum_fn: Variant) -> Tensor:
    e = (v - peak_fn(v.detach()).index_select(0, d.ids)).exp()
    return e / sum_fn(e).index_select(0, d.ids)


def _cumsum_global(d: Data, v: Tensor) -> Tensor:
    c = v.cumsum(0)
    before = torch.cat([v.new_zeros((1, *v.shape[1:])), c]).index_select(0, d.offsets[:-1])
    return c - before.index_select(0, d.ids)


def _double_sort(d: Data, v: Tensor) -> Tensor:
    # Stable sort of every column by value, then a stable sort by segment: rows stay in their
    # segment, sorted within it. Columns first, so that every sort runs over contiguous memory.
    columns = v.detach().t().contiguous()
    by_value = columns.argsort(dim=1, stable=True)
    by_segment = d.ids.index_select(0, by_value.reshape(-1)).view_as(by_value)
    perm = by_value.gather(1, by_segment.argsort(dim=1, stable=True))
    return v.gather(0, perm.t())


def torch_variants(op: str, d: Data) -> dict[str, Variant]:
    """Plain-torch compositions for the same job (each a function of the values)."""
    loop = {"loop": lambda v: _loop(d, v, PER_SEGMENT[op], op in ROW_WISE)}
    return {**_compositions(op, d), **loop}


def _compositions(op: str, d: Data) -> dict[str, Variant]:
    mean = d.lengths.clamp_min(1).to(torch.float32)[:, None]
    index_add = lambda v: _index_add(d, v)  # noqa: E731
    scatter_sum = lambda v: _scatter(d, v, "sum")  # noqa: E731
    scatter_max = lambda v: _scatter(d, v, "amax")  # noqa: E731
    segred_sum = lambda v: _segred(d, v, "sum")  # noqa: E731
    segred_max = lambda v: _segred(d, v, "max")  # noqa: E731
    if op == "sum":
        return {
            "index_add_": index_add,
            "scatter_reduce": scatter_sum,
            "segment_reduce": segred_sum,
            "sparse CSR @": lambda v: _csr_sum(d, v),
            "embedding_bag sum": lambda v: _embedding_bag(d, v, "sum"),
            "cumsum difference": lambda v: _cumsum_sum(d, v),
        }
    if op == "mean":
        return {
            "index_add_ / n": lambda v: _index_add(d, v) / mean,
            "scatter_reduce mean": lambda v: _zeros(d, v).scatter_reduce(
                0, d.ids[:, None].expand_as(v), v, "mean", include_self=False
            ),
            "segment_reduce": lambda v: _segred(d, v, "mean"),
            "sparse CSR @ / n": lambda v: _csr_sum(d, v) / mean,
            "embedding_bag mean": lambda v: _embedding_bag(d, v, "mean"),
        }
    if op == "max":
        return {
            "scatter_reduce amax": scatter_max,
            "segment_reduce": segred_max,
            "embedding_bag max": lambda v: _embedding_bag(d, v, "max"),
        }
    if op == "min":
        return {
            "scatter_reduce amin": lambda v: _scatter(d, v, "amin"),
            "segment_reduce": lambda v: _segred(d, v, "min"),
        }
    if op == "logsumexp":
        return {
            "scatter amax + index_add_": lambda v: _lse(d, v, scatter_max, index_add),
            "segment_reduce max + sum": lambda v: _lse(d, v, segred_max, segred_sum),
            "scatter amax + CSR @": lambda v: _lse(d, v, scatter_max, lambda e: _csr_sum(d, e)),
        }
    if op == "softmax":
        return {
            "scatter amax + index_add_": lambda v: _softmax(d, v, scatter_max, index_add),
            "segment_reduce max + sum": lambda v: _softmax(d, v, segred_max, segred_sum),
        }
    if op == "cumsum":
        return {
            "global cumsum - offsets": lambda v: _cumsum_global(d, v),
        }
    if op in SCANS:
        return {}
    if op == "sort":
        return {
            "two stable sorts": lambda v: _double_sort(d, v),
        }
    raise ValueError(op)


PER_SEGMENT: dict[str, Callable[[Tensor], Tensor]] = {
    "sum": lambda s: s.sum(0),
    "mean": lambda s: s.mean(0),
    "max": lambda s: s.amax(0),
    "logsumexp": lambda s: s.logsumexp(0),
    "softmax": lambda s: s.softmax(0),
    "min": lambda s: s.amin(0),
    "cumsum": lambda s: s.cumsum(0),
    "cumprod": lambda s: s.cumprod(0),
    "cummax": lambda s: s.cummax(0).values,
    "cummin": lambda s: s.cummin(0).values,
    "logcumsumexp": lambda s: s.logcumsumexp(0),
    "sort": lambda s: s.sort(dim=0, stable=True).values,
}


def op_values(op: str, values: Tensor) -> Tensor:
    """The input of ``op``: ``1 + values / 64`` for cumprod (products stay in range)."""
    return 1 + values / 64 if op == "cumprod" else values


# Why a composition may fail the check (seen on the benchmark data).
WHY_MISMATCH = {
    "segment_reduce": "its max gives a tie's whole gradient to one row; torch.amax splits it",
    "embedding_bag max": "its max gives a tie's whole gradient to one row; torch.amax splits it",
    "cumsum difference": "float32 prefix sums over all rows lose precision",
    "global cumsum - offsets": "float32 prefix sums over all rows lose precision",
    "JAX cumsum - segment start": "float32 prefix sums over all rows lose precision",
}


def reference(op: str, d: Data, v: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """The per-segment loop in float64, and its gradient: what every variant must match."""
    leaf = v.detach().double().requires_grad_()
    out = _loop(d, leaf, PER_SEGMENT[op], op in ROW_WISE)
    (want_grad,) = torch.autograd.grad(out, leaf, grad.double())
    return out.detach().float(), want_grad.float()


def op_bytes(op: str, d: Data) -> tuple[int, int, str]:
    """Least bytes read + written by the op: forward, forward+backward, and the formula."""
    n, b = d.values.numel() * 4, d.num * d.values.shape[1] * 4
    if op in ("sum", "mean"):
        return n + b, n + b + b + n, "fwd N+B, bwd B+N"
    if op in ("max", "min", "logsumexp"):  # backward also reads the values (ties / exp)
        return n + b, n + b + b + n + n, "fwd N+B, bwd B+2N"
    if op == "softmax":  # backward reads the saved output and the gradient
        return 2 * n, 2 * n + 3 * n, "fwd 2N, bwd 3N"
    return 2 * n, 2 * n + 2 * n, "fwd 2N, bwd 2N"


# --- JAX, the optional peer -------------------------------------------------------------------

JAX_NOTE = 'JAX not installed (`pip install "jax[cpu]"`): the JAX column is skipped.'


def import_jax() -> Any:
    """``jax`` on the CPU with XLA on one thread (as torch here), or ``None`` if absent."""
    os.environ.setdefault(
        "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax
        import jax.dlpack
    except ImportError:
        return None
    return jax


def jax_functions(jax: Any, op: str, d: Data) -> dict[str, Callable[[Any], Any]]:
    """The JAX versions of ``op`` (functions of the values array), as the issue sets them up:
    ``segment_*`` with ``num_segments`` and ``indices_are_sorted=True``."""
    import numpy as np

    jnp = jax.numpy
    ids = jnp.asarray(d.ids.numpy().astype(np.int32))
    starts_np = d.offsets[:-1].numpy().astype(np.int32)
    starts = jnp.asarray(starts_np)
    counts = jnp.asarray(d.lengths.clamp_min(1).to(torch.float32).numpy())[:, None]
    seg = {"num_segments": d.num, "indices_are_sorted": True}

    def ssum(x: Any) -> Any:
        return jax.ops.segment_sum(x, ids, **seg)

    def smax(x: Any) -> Any:
        return jax.ops.segment_max(x, ids, **seg)

    def shift(x: Any) -> Any:  # the finite segment max, a constant (as jax.nn.softmax)
        m = jax.lax.stop_gradient(smax(x))
        return jnp.where(jnp.isfinite(m), m, 0.0)

    def logsumexp(x: Any) -> Any:
        m = shift(x)
        return jnp.log(ssum(jnp.exp(x - m[ids]))) + m

    def softmax(x: Any) -> Any:
        e = jnp.exp(x - shift(x)[ids])
        return e / ssum(e)[ids]

    flags_np = np.zeros(d.ids.shape[0], dtype=bool)
    flags_np[starts_np[d.lengths.numpy() > 0]] = True
    flags = jnp.asarray(flags_np)

    def segmented(combine: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
        def step(a: Any, b: Any) -> Any:  # (starts a segment, value): restart at a start
            return a[0] | b[0], jnp.where(b[0][:, None], b[1], combine(a[1], b[1]))

        return lambda x: jax.lax.associative_scan(step, (flags, x))[1]

    def lossy_cumsum(x: Any) -> Any:
        c = jnp.cumsum(x, 0)
        return c - (c[starts] - x[starts])[ids]

    table: dict[str, dict[str, Callable[[Any], Any]]] = {
        "sum": {"JAX segment_sum": ssum},
        "mean": {"JAX segment_sum / n": lambda x: ssum(x) / counts},
        "max": {"JAX segment_max": smax},
        "min": {"JAX segment_min": lambda x: jax.ops.segment_min(x, ids, **seg)},
        "logsumexp": {"JAX segment_max, exp, segment_sum": logsumexp},
        "softmax": {"JAX segment_max, exp, segment_sum, gather": softmax},
        "cumsum": {
            "JAX associative_scan": segmented(jnp.add),
            "JAX cumsum - segment start": lossy_cumsum,
        },
        "cumprod": {"JAX associative_scan": segmented(jnp.multiply)},
        "cummax": {"JAX associative_scan": segmented(jnp.maximum)},
        "cummin": {"JAX associative_scan": segmented(jnp.minimum)},
        "logcumsumexp": {"JAX associative_scan": segmented(jnp.logaddexp)},
    }
    return table.get(op, {})


def shared(jax: Any, t: Tensor) -> Any:
    """``t`` as a JAX array on the same memory (DLPack, no copy), or a copy where JAX does not
    take it: JAX then reads the very bytes that ragged and the torch variants read. Two buffers
    of the same data are not read equally fast on this VM (5% apart for a reduction, measured
    with both contestants on each buffer: docs/benchmarks.md, "Where the misses come from")."""
    try:
        return jax.dlpack.from_dlpack(t)
    except (TypeError, ValueError, RuntimeError):
        return jax.numpy.asarray(t.cpu().numpy())


def jax_runners(
    jax: Any, op: str, d: Data, v: Tensor, grad: Tensor
) -> dict[str, dict[str, Callable[[], Any]]]:
    """Per JAX variant and mode, a call that runs it to completion (jitted, compiled here):
    forward, and ``jax.value_and_grad`` of ``sum(op(values) * grad)``."""
    jnp = jax.numpy
    x, g = shared(jax, v), shared(jax, grad)
    out: dict[str, dict[str, Callable[[], Any]]] = {}
    for name, fn in jax_functions(jax, op, d).items():
        fwd = jax.jit(fn)
        both = jax.jit(jax.value_and_grad(lambda x, g, fn=fn: jnp.sum(fn(x) * g)))
        out[name] = {
            "fwd": lambda fwd=fwd: jax.block_until_ready(fwd(x)),
            "fwd+bwd": lambda both=both: jax.block_until_ready(both(x, g))[1],
        }
        for run in out[name].values():
            run()  # compile
    return out


def as_torch(result: Any) -> Tensor:
    import numpy as np

    return result if isinstance(result, Tensor) else torch.from_numpy(np.array(result))


# --- running ----------------------------------------------------------------------------------


# Peak memory of the padded variant's forward + backward, in padded grids ``[B, Lmax, *inner]``
# (measured with ``ragged.bench.peak_memory`` on smaller data, rounded up).
PADDED_GRIDS = {
    "sum": 2.5,
    "mean": 2.5,
    "max": 3.5,
    "min": 3.5,
    "logsumexp": 4.5,
    "softmax": 3.5,
    "cumsum": 4.5,
    "cumprod": 7.5,
    "cummax": 5.5,
    "cummin": 5.5,
    "logcumsumexp": 11.5,
    "sort": 4.5,
}


def padded_bytes(op: str, d: Data) -> int:
    """Rough peak memory of the padded variant's forward + backward."""
    grid = d.num * d.max_length * d.values[0].numel() * d.values.element_size()
    return int(grid * PADDED_GRIDS.get(op, 4.5))


def available_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def fwd_bwd(fn: Variant, v: Tensor, grad: Tensor) -> Callable[[], Tensor]:
    leaf = v.detach().requires_grad_()

    def run() -> Tensor:
        return torch.autograd.grad(fn(leaf), leaf, grad)[0]

    return run


def forward(fn: Variant, v: Tensor) -> Callable[[], Tensor]:
    def run() -> Tensor:
        with torch.no_grad():
            return fn(v)

    return run


def matches(got: Tensor, want: Tensor) -> bool:
    return got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)


@dataclass
class OpResult:
    op: str
    mode: str  # "fwd" or "fwd+bwd"
    times: dict[str, float]  # variant -> median seconds
    spread: dict[str, float]
    ok: dict[str, bool]
    errors: dict[str, str]
    # The head-to-head group of a forward reduction: per-round ratios (medians) of
    # (copy_ time / 2) / ragged time, and of each JAX variant's time / ragged time.
    floor: float | None = None
    head: dict[str, float] = field(default_factory=dict)
    head_interval: dict[str, tuple[float, float]] = field(default_factory=dict)  # 95% CIs

    def jax_ratio(self, *, exact: bool) -> tuple[str, float] | None:
        """The fastest JAX variant (``best_jax``) and its time / ragged's: the head-to-head
        group's per-round ratio where there is one, else the ratio of medians."""
        best = self.best_jax(exact=exact)
        if best is None:
            return None
        name, t = best
        return name, self.head.get(name, t / self.times["ragged"])

    def best_torch(self) -> tuple[str, float] | None:
        fine = [
            (t, name)
            for name, t in self.times.items()
            if name not in ("ragged", "padded") and not name.startswith("JAX") and self.ok.get(name)
        ]
        return (min(fine)[1], min(fine)[0]) if fine else None

    def best_jax(self, *, exact: bool) -> tuple[str, float] | None:
        """The fastest JAX variant that matches the reference (``exact``), or that does not."""
        fine = [
            (t, name)
            for name, t in self.times.items()
            if name.startswith("JAX") and bool(self.ok.get(name)) == exact
        ]
        return (min(fine)[1], min(fine)[0]) if fine else None


def run_op(
    op: str, d: Data, repeat: int, metric: str, budget: float | None, jax: Any
) -> list[OpResult]:
    ragged_fn = ragged_variant(op, d)
    assert ragged_fn is not None
    variants: dict[str, Variant] = {"ragged": ragged_fn}
    skipped: dict[str, str] = {}
    need, have = padded_bytes(op, d), available_bytes(d.values.device)
    if have is not None and need > 0.5 * have:  # the machine may be shared: leave room
        skipped["padded"] = f"not run: needs ~{need / 1e9:.0f} GB, {have / 1e9:.0f} GB available"
    else:
        variants["padded"] = padded_variant(op, d)
    variants.update(torch_variants(op, d))
    v = op_values(op, d.values)
    gen = torch.Generator().manual_seed(2)
    rows = v.shape[0] if op in ROW_WISE else d.num
    grad = torch.randn((rows, *v.shape[1:]), generator=gen).to(v.device)
    want, want_grad = reference(op, d, v, grad)
    peers = jax_runners(jax, op, d, v, grad) if jax is not None else {}
    results = []
    for mode in ("fwd", "fwd+bwd"):
        runners, ok, took = {}, {}, {}
        errors = dict(skipped)
        calls = {
            **{
                name: forward(fn, v) if mode == "fwd" else fwd_bwd(fn, v, grad)
                for name, fn in variants.items()
            },
            **{name: modes[mode] for name, modes in peers.items()},
        }
        head = None
        if op in REDUCTIONS and mode == "fwd":
            # Head to head: ragged, the copy floor and JAX in rounds of their own (about 50 ms
            # each, where a main round lasts seconds), in alternating order; the targets read
            # per-round ratios, so the machine's drift in memory speed between rounds cancels.
            buffer = torch.empty_like(v)
            group = {"ragged": calls["ragged"], COPY: lambda b=buffer: b.copy_(v)}
            group.update({name: calls[name] for name in peers})
            head = compare(group, repeat=head_rounds(repeat), alternate=True)
        for name, run in calls.items():
            print(f"{op:<10}{mode:<8}checking {name}", flush=True)  # progress
            try:
                start = time.perf_counter()
                got = run()
                took[name] = time.perf_counter() - start
            except (RuntimeError, NotImplementedError) as err:
                errors[name] = "error: " + str(err).splitlines()[0][:120]
                continue
            ok[name] = matches(as_torch(got), want if mode == "fwd" else want_grad)
            del got
            # A wrong result is not a contender (save the time), except ragged's own and JAX's
            # (its lossy cumsum trick is a target to beat).
            if ok[name] or name == "ragged" or name.startswith("JAX"):
                runners[name] = run
            if not ok[name]:
                why = WHY_MISMATCH.get(name, "")
                errors[name] = "wrong: does not match the reference" + (f" ({why})" if why else "")
        # The checked call was the warm-up; slow variants get fewer timed calls (at least 3).
        times = compare(runners, repeat=repeat, warmup=0, budget=budget, estimates=took)
        result = OpResult(
            op,
            mode,
            {k: t.median(metric) for k, t in times.items()},
            {k: t.spread(metric) for k, t in times.items()},
            ok,
            errors,
        )
        if head is not None:
            mine = head.pop("ragged")
            result.floor = mine.paired(head.pop(COPY), metric) / 2
            result.head = {name: mine.paired(t, metric) for name, t in head.items()}
            result.head_interval = {
                name: mine.paired_interval(t, metric) for name, t in head.items()
            }
        results.append(result)
    return results


def copy_bandwidth(d: Data, repeat: int, metric: str) -> dict[str, float]:
    v = d.values
    out = torch.empty_like(v)
    times = compare({"copy_": lambda: out.copy_(v), "clone": lambda: v.clone()}, repeat=repeat)
    moved = 2 * v.numel() * v.element_size()
    return {k: moved / t.median(metric) / 1e9 for k, t in times.items()}


def tiny_cases(
    device: torch.device,
) -> list[tuple[str, Callable[[], Any], str, Callable[[], Any], Any]]:
    """The eager-overhead cases: ``(label, ragged job, torch label, torch job, extra)`` on tiny
    inputs (B=4, lengths [3, 8, 1, 5], D=8); ``extra`` is a second, looser torch baseline."""
    gen = torch.Generator().manual_seed(3)
    lengths = [3, 8, 1, 5]
    values = torch.randn(sum(lengths), 8, generator=gen).to(device)
    other = torch.randn(sum(lengths), 8, generator=gen).to(device)
    x = ragged.from_lengths(values, lengths)
    y = x.with_values(other)
    ids = x.partition.levels[0].row_ids
    return [
        ("x + y (same partition)", lambda: x + y, "values + other", lambda: values + other, None),
        (
            "ragged.sum(x, axis=1)",
            lambda: ragged.sum(x, axis=1),
            "zeros(4, 8).index_add_(0, ids, values)",
            lambda: values.new_zeros(4, 8).index_add_(0, ids, values),
            ("values.sum(0)", lambda: values.sum(0)),
        ),
    ]


def eager_overhead(number: int, repeat: int, metric: str, device: torch.device) -> Table:
    cases = tiny_cases(device)
    table = Table(
        "Eager overhead on tiny inputs (B=4, lengths [3, 8, 1, 5], D=8)",
        ["op", "ragged us", "plain torch", "torch us", "ratio", "target <= 3x"],
    )
    for label, fn, torch_label, torch_fn, extra in cases:
        t_ragged = per_call(fn, number=number, repeat=repeat).median(metric)
        t_torch = per_call(torch_fn, number=number, repeat=repeat).median(metric)
        ratio = t_ragged / t_torch
        table.rows.append(
            [
                label,
                f"{t_ragged * 1e6:.1f}",
                f"`{torch_label}`",
                f"{t_torch * 1e6:.1f}",
                f"{ratio:.2f}x",
                "met" if ratio <= 3 else "missed",
            ]
        )
        if extra is not None:
            t_extra = per_call(extra[1], number=number, repeat=repeat).median(metric)
            table.rows.append(
                [
                    label,
                    f"{t_ragged * 1e6:.1f}",
                    f"`{extra[0]}` (not the same job: ignores segments)",
                    f"{t_extra * 1e6:.1f}",
                    f"{t_ragged / t_extra:.2f}x",
                    "-",
                ]
            )
    table.notes.append(
        f"Median per-call {metric} time over {repeat} batches of {number} calls; ratio = ragged / "
        "plain torch."
    )
    return table


def jax_cell(res: OpResult, jax: Any) -> str:
    """JAX / ragged for the fastest exact JAX variant, and for a lossy one where it is faster."""
    if jax is None:
        return "n/a"
    exact, lossy = res.jax_ratio(exact=True), res.jax_ratio(exact=False)
    parts = [f"{exact[1]:.2f}x"] if exact else []
    if lossy and (exact is None or lossy[1] < exact[1]):
        parts.append(f"{lossy[1]:.2f}x ({lossy[0].removeprefix('JAX ')}, lossy)")
    return "; ".join(parts) if parts else "n/a"


def target_table(measured: dict[str, dict[str, OpResult]]) -> Table:
    """The speed targets of issue 12, checked on this run's numbers."""
    table = Table(
        "Targets (ratios from this run; above 1: ragged is faster; the copy floor is half the "
        "time of `out.copy_(values)` into a warm buffer; for the forward reductions the floor "
        "and JAX ratios come from the head-to-head rounds, the JAX ratio with a 95% confidence "
        'interval of its median (distribution-free); "tie" where the interval reaches the bar)',
        ["target", "op", "mode", "measured", "status"],
    )

    def add(
        target: str,
        op: str,
        mode: str,
        value: float | None,
        bar: float,
        fmt: str,
        interval: tuple[float, float] | None = None,
    ) -> None:
        if value is None or not math.isfinite(value):
            return
        shown, status = fmt.format(value), "met" if value >= bar else "missed"
        if interval is not None:  # a head-to-head ratio: say how precisely it was measured
            low, high = (fmt.format(v) for v in interval)
            shown += f" (95% CI {low}-{high})"
            if value < bar <= interval[1]:
                status = "tie: the CI reaches it"
        table.rows.append([target, op, mode, shown, status])

    def ratio(res: OpResult, name: str | None) -> float | None:
        return res.times[name] / res.times["ragged"] if name in res.times else None

    for op, modes in measured.items():
        for mode, res in modes.items():
            t = res.times["ragged"]
            if res.floor is not None:
                add(">= 90% of the copy floor", op, mode, res.floor, 0.9, "{:.0%}")
            exact, lossy = res.jax_ratio(exact=True), res.jax_ratio(exact=False)
            wants_jax = (op in REDUCTIONS and mode == "fwd") or (
                op == "softmax" and mode == "fwd+bwd"
            )
            if wants_jax or op in SCANS:
                interval = res.head_interval.get(exact[0]) if exact else None
                add("no slower than JAX", op, mode, exact and exact[1], 1.0, "{:.2f}x", interval)
            if op in SCANS and lossy:
                add("ahead of JAX's lossy trick", op, mode, lossy[1], 1.0, "{:.2f}x")
            best = res.best_torch()
            add(
                ">= the best plain-torch composition",
                op,
                mode,
                best and best[1] / t,
                1.0,
                "{:.2f}x",
            )
            if op in SCANS or (op in ("logsumexp", "softmax") and mode == "fwd"):
                add("ahead of the per-segment loop", op, mode, ratio(res, "loop"), 1.0, "{:.2f}x")
    return table


def cpu_option(text: str) -> str:
    """``--cpu``: a CPU number, ``last`` or ``none``."""
    if text in ("last", "none") or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected a CPU number, 'last' or 'none', got {text!r}")


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small data")
    parser.add_argument("--metric", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset")
    parser.add_argument("--json", help="write the result document here")
    parser.add_argument(
        "--repeat", type=int, help="timed calls per variant (default 7; 3 with --quick)"
    )
    parser.add_argument(
        "--cpu",
        default="last",
        type=cpu_option,
        help="the one CPU every thread runs on (JAX's worker and torch's caller alike): a "
        "number, 'last' (default: the last CPU this process may use) or 'none' (not pinned)",
    )
    add_device_option(parser)
    args = parser.parse_args()
    device = use_device(args.device)
    if args.cpu != "none":
        pin_cpu(None if args.cpu == "last" else int(args.cpu))
    pinned = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if device.type != "cpu":
        args.metric = "wall"  # the host's CPU time does not count the device's kernels
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.quick:
        rows, num, dim, repeat, number, small_repeat = 1 << 14, 128, 16, 3, 200, 5
    else:
        rows, num, dim, repeat, number, small_repeat = 1 << 20, 8192, 64, 7, 2000, 15
    repeat = args.repeat or repeat
    d = make_data(rows, num, dim, max_over_mean=MAX_OVER_MEAN, device=device)
    lengths = torch.tensor(d.lengths_list, dtype=torch.float64)
    shape = (
        f"values [{rows}, {dim}] float32, {num} log-normal segments: lengths "
        f"{int(lengths.min())}-{int(lengths.max())}, mean {lengths.mean():.1f}, "
        f"max/mean {lengths.max() / lengths.mean():.2f}; padded to {num} x {d.max_length} "
        f"({num * d.max_length / rows:.2f}x the rows)"
    )
    print(shape, flush=True)
    bandwidth = copy_bandwidth(d, repeat, args.metric)
    print(
        f"copy bandwidth: out.copy_(values) {bandwidth['copy_']:.2f} GB/s, "
        f"values.clone() {bandwidth['clone']:.2f} GB/s",
        flush=True,
    )
    jax = import_jax() if device.type == "cpu" else None  # JAX's column is a CPU peer
    if jax is not None:
        print(f"JAX {jax.__version__} on {jax.devices()[0].platform}", flush=True)
    main_table = Table(
        "Ops: ragged vs padded, the best plain-torch composition and JAX",
        [
            "op",
            "fwd ms",
            "padded / ragged",
            "best torch / ragged",
            "JAX / ragged",
            "GB/s (% of copy_)",
            "fwd+bwd ms",
            "padded / ragged",
            "best torch / ragged",
            "JAX / ragged",
            "bytes (N=values, B=output)",
        ],
    )
    detail = Table(
        "Every variant (ms; ratio = variant / ragged). Each is checked against a float64 "
        "per-segment loop first; one that does not match is not timed (JAX's are: a lossy "
        "trick is a baseline to beat)",
        ["op", "mode", "variant", "ms", "ratio", "spread", "check"],
    )
    plots: dict[str, dict[str, dict[str, float]]] = {"speedup": {}}
    measured: dict[str, dict[str, OpResult]] = {}
    wanted = [op.strip() for op in args.ops.split(",") if op.strip()]
    for op in wanted:
        if ragged_variant(op, d) is None:
            main_table.notes.append(f"`ragged.{op}` does not exist on this branch: skipped.")
            print(f"{op}: ragged.{op} missing, skipped", flush=True)
            continue
        results = run_op(op, d, repeat, args.metric, None if args.quick else 20.0, jax)
        measured[op] = {res.mode: res for res in results}
        fwd_bytes, _, formula = op_bytes(op, d)
        cells = [op]
        plots["speedup"][op] = {}
        for res in results:
            t = res.times["ragged"]
            best = res.best_torch()
            padded = res.times.get("padded")
            cells.append(fmt_ms(t))
            cells.append(f"{padded / t:.1f}x" if padded else "n/a")
            cells.append(f"{best[1] / t:.2f}x ({best[0]})" if best else "n/a")
            cells.append(jax_cell(res, jax))
            if res.mode == "fwd":
                rate = fwd_bytes / t / 1e9
                cells.append(f"{rate:.2f} ({100 * rate / bandwidth['copy_']:.0f}%)")
            plots["speedup"][op][res.mode + " padded"] = padded / t if padded else math.nan
            plots["speedup"][op][res.mode + " torch"] = best[1] / t if best else math.nan
            exact = res.jax_ratio(exact=True)
            plots["speedup"][op][res.mode + " jax"] = exact[1] if exact else math.nan
            for name, tv in sorted(res.times.items(), key=lambda kv: kv[1]):
                detail.rows.append(
                    [
                        op,
                        res.mode,
                        name,
                        fmt_ms(tv),
                        f"{tv / t:.2f}",
                        f"{100 * res.spread[name]:.0f}%",
                        "ok" if res.ok.get(name) else "wrong",
                    ]
                )
            for name, err in res.errors.items():
                if name not in res.times:
                    detail.rows.append([op, res.mode, name, "-", "-", "-", err])
            print(
                f"{op:<13}{res.mode:<8}"
                + "  ".join(f"{k}={fmt_ms(v)}" for k, v in res.times.items()),
                flush=True,
            )
        cells.append(formula)
        main_table.rows.append(cells)
    main_table.notes += [
        shape + ".",
        f"Median {args.metric} time of {repeat} calls after a warm-up call (at least 3 for "
        "variants slower than 4 s), variants timed round-robin; ratios = other / ragged (above "
        "1: ragged is faster). "
        + (f"Every thread ran on CPU {pinned[0]} (`--cpu`)." if len(pinned) == 1 else "")
        + (
            ""
            if jax is None
            else " Forward reductions, JAX column: ragged, `out.copy_(values)` and the JAX "
            f"variants timed again on their own, {head_rounds(repeat)} rounds in alternating "
            "order; the median of per-round ratios (the detail table keeps the main rounds)."
        ),
        "padded = `ragged.to_padded` with a masking fill (0 / -inf / +inf) + the dense op "
        "(+ gather back to rows for row-wise outputs); best torch = fastest matching "
        "composition (see the detail table); cumprod runs on `1 + values / 64`.",
        f"GB/s against the same run's copy: `out.copy_(values)` {bandwidth['copy_']:.2f} GB/s "
        f"(the % column's reference: for a reduction, which reads the values once, it is the "
        f"share of the copy floor, half a copy's time), `values.clone()` "
        f"{bandwidth['clone']:.2f} GB/s (fresh 256 MB tensor: page faults).",
        "JAX: `jax.jit` of `jax.ops.segment_*` (`num_segments`, `indices_are_sorted=True`), XLA "
        "on one thread, same data, memory (DLPack) and process; fwd+bwd through "
        "`jax.value_and_grad`; the fastest variant that matches the reference, and the lossy "
        "cumsum trick where it exists."
        if jax is not None
        else JAX_NOTE,
    ]
    targets = target_table(measured)
    overhead = eager_overhead(number, small_repeat, args.metric, device)
    for table in (main_table, targets, detail, overhead):
        print()
        print(table.text())
    if args.json:
        write_result(
            args.json,
            "ops",
            [main_table, targets, overhead, detail],
            quick=args.quick,
            metric=args.metric,
            plots={**plots, "copy_gbps": bandwidth},
        )


if __name__ == "__main__":
    main()
