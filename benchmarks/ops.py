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
  (``index_add_``, ``scatter_reduce``, ``torch.segment_reduce``, a sparse CSR matmul, cumsum
  tricks, stable double sorts, a Python loop over segments); the fastest one that matches the
  ragged result is reported.

Ratios are *other time / ragged time* (above 1: ragged is faster). GB/s counts the bytes an op
must read and write at least (stated per op; index tensors not counted), against a same-run
copy of ``values`` (``out.copy_(values)`` into an existing tensor, the ratio's reference, and
``values.clone()``, which also pays the page faults of a fresh 256 MB tensor).

The eager-overhead table times tiny inputs (B=4, lengths <= 8, D=8): ``x + y`` and
``ragged.sum(x, axis=1)`` against the same plain torch op on ``values`` (target: at most 3x).

With ``--device cuda`` the data lives on the GPU and every timed call is followed by a
synchronisation (wall time; ``ragged.bench.use_device``).

Usage: ``python benchmarks/ops.py [--quick] [--metric cpu|wall] [--device cpu|cuda]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import math
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
from ragged.bench import Table, add_device_option, compare, per_call, use_device, write_result

OPS = ["sum", "mean", "max", "logsumexp", "softmax", "cumsum", "sort"]
ROW_WISE = {"softmax", "cumsum", "sort"}  # outputs one row per input row
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
        "logsumexp": lambda v: pad(v, -inf).logsumexp(1),
        "softmax": lambda v: unpad(pad(v, -inf).softmax(1)),
        "cumsum": lambda v: unpad(pad(v, 0.0).cumsum(1)),
        "sort": lambda v: unpad(pad(v, inf).sort(dim=1, stable=True).values),
    }
    return table[op]


def _zeros(d: Data, v: Tensor) -> Tensor:
    return v.new_zeros((d.num, *v.shape[1:]))


def _index_add(d: Data, v: Tensor) -> Tensor:
    return _zeros(d, v).index_add_(0, d.ids, v)


def _scatter(d: Data, v: Tensor, reduce: str) -> Tensor:
    fill = {"sum": 0.0, "amax": -math.inf}[reduce]
    out = v.new_full((d.num, *v.shape[1:]), fill)
    return out.scatter_reduce(0, d.ids[:, None].expand_as(v), v, reduce, include_self=False)


def _segred(d: Data, v: Tensor, reduce: str) -> Tensor:
    return torch.segment_reduce(v, reduce, lengths=d.lengths, axis=0)


def _loop(d: Data, v: Tensor, per_segment: Callable[[Tensor], Tensor], rows: bool) -> Tensor:
    parts = [per_segment(s) for s in v.split(d.lengths_list)]
    return torch.cat(parts) if rows else torch.stack(parts)


def _csr_sum(d: Data, v: Tensor) -> Tensor:
    return d.csr @ v


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
        }
    if op == "max":
        return {
            "scatter_reduce amax": scatter_max,
            "segment_reduce": segred_max,
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
    "cumsum": lambda s: s.cumsum(0),
    "sort": lambda s: s.sort(dim=0, stable=True).values,
}


# Why a composition may fail the check (seen on the benchmark data).
WHY_MISMATCH = {
    "segment_reduce": "its max gives a tie's whole gradient to one row; torch.amax splits it",
    "cumsum difference": "float32 prefix sums over all rows lose precision",
    "global cumsum - offsets": "float32 prefix sums over all rows lose precision",
}


def reference(op: str, d: Data, grad: Tensor) -> tuple[Tensor, Tensor]:
    """The per-segment loop in float64, and its gradient: what every variant must match."""
    leaf = d.values.detach().double().requires_grad_()
    out = _loop(d, leaf, PER_SEGMENT[op], op in ROW_WISE)
    (want_grad,) = torch.autograd.grad(out, leaf, grad.double())
    return out.detach().float(), want_grad.float()


def op_bytes(op: str, d: Data) -> tuple[int, int, str]:
    """Least bytes read + written by the op: forward, forward+backward, and the formula."""
    n, b = d.values.numel() * 4, d.num * d.values.shape[1] * 4
    if op in ("sum", "mean"):
        return n + b, n + b + b + n, "fwd N+B, bwd B+N"
    if op in ("max", "logsumexp"):  # backward also reads the values (ties / exp)
        return n + b, n + b + b + n + n, "fwd N+B, bwd B+2N"
    if op == "softmax":  # backward reads the saved output and the gradient
        return 2 * n, 2 * n + 3 * n, "fwd 2N, bwd 3N"
    return 2 * n, 2 * n + 2 * n, "fwd 2N, bwd 2N"


# --- running ----------------------------------------------------------------------------------


def padded_bytes(op: str, d: Data) -> int:
    """Rough peak memory of the padded variant's forward + backward."""
    grid = d.num * d.max_length * d.values.shape[1]
    # The padded input, the dense result or its gradient, the padded gradient; sort adds its
    # int64 indices.
    return grid * (4 * 3 + 8) if op == "sort" else grid * 4 * 3


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

    def best_torch(self) -> tuple[str, float] | None:
        fine = [
            (t, name)
            for name, t in self.times.items()
            if name not in ("ragged", "padded") and self.ok.get(name)
        ]
        return (min(fine)[1], min(fine)[0]) if fine else None


def run_op(op: str, d: Data, repeat: int, metric: str, budget: float | None) -> list[OpResult]:
    ragged_fn = ragged_variant(op, d)
    assert ragged_fn is not None
    variants: dict[str, Variant] = {"ragged": ragged_fn}
    skipped: dict[str, str] = {}
    need, have = padded_bytes(op, d), available_bytes(d.values.device)
    if have is not None and need > 0.6 * have:
        skipped["padded"] = f"not run: needs ~{need / 1e9:.0f} GB, {have / 1e9:.0f} GB available"
    else:
        variants["padded"] = padded_variant(op, d)
    variants.update(torch_variants(op, d))
    v = d.values
    gen = torch.Generator().manual_seed(2)
    rows = v.shape[0] if op in ROW_WISE else d.num
    grad = torch.randn((rows, *v.shape[1:]), generator=gen).to(v.device)
    want, want_grad = reference(op, d, grad)
    results = []
    for mode in ("fwd", "fwd+bwd"):
        runners, ok, took = {}, {}, {}
        errors = dict(skipped)
        for name, fn in variants.items():
            print(f"{op:<10}{mode:<8}checking {name}", flush=True)  # progress
            run = forward(fn, v) if mode == "fwd" else fwd_bwd(fn, v, grad)
            try:
                start = time.perf_counter()
                got = run()
                took[name] = time.perf_counter() - start
            except (RuntimeError, NotImplementedError) as err:
                errors[name] = "error: " + str(err).splitlines()[0][:120]
                continue
            ok[name] = matches(got, want if mode == "fwd" else want_grad)
            del got
            if ok[name] or name == "ragged":
                runners[name] = run
            else:  # a wrong result is not a contender: save the time
                why = WHY_MISMATCH.get(name, "")
                errors[name] = "wrong: does not match the reference" + (f" ({why})" if why else "")
        # The checked call was the warm-up; slow variants get fewer timed calls (at least 3).
        times = compare(runners, repeat=repeat, warmup=0, budget=budget, estimates=took)
        results.append(
            OpResult(
                op,
                mode,
                {k: t.median(metric) for k, t in times.items()},
                {k: t.spread(metric) for k, t in times.items()},
                ok,
                errors,
            )
        )
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


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small data")
    parser.add_argument("--metric", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset")
    parser.add_argument("--json", help="write the result document here")
    add_device_option(parser)
    args = parser.parse_args()
    device = use_device(args.device)
    if device.type != "cpu":
        args.metric = "wall"  # the host's CPU time does not count the device's kernels
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.quick:
        rows, num, dim, repeat, number, small_repeat = 1 << 14, 128, 16, 3, 200, 5
    else:
        rows, num, dim, repeat, number, small_repeat = 1 << 20, 8192, 64, 5, 2000, 15
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
    main_table = Table(
        "Ops: ragged vs padded and vs the best plain-torch composition",
        [
            "op",
            "fwd ms",
            "padded / ragged",
            "best torch / ragged",
            "GB/s (% of copy_)",
            "fwd+bwd ms",
            "padded / ragged",
            "best torch / ragged",
            "bytes (N=values, B=output)",
        ],
    )
    detail = Table(
        "Every variant (ms; ratio = variant / ragged). Each is checked against a float64 "
        "per-segment loop first; one that does not match is not timed",
        ["op", "mode", "variant", "ms", "ratio", "spread", "check"],
    )
    plots: dict[str, dict[str, dict[str, float]]] = {"speedup": {}}
    wanted = [op.strip() for op in args.ops.split(",") if op.strip()]
    for op in wanted:
        if ragged_variant(op, d) is None:
            main_table.notes.append(f"`ragged.{op}` does not exist on this branch: skipped.")
            print(f"{op}: ragged.{op} missing, skipped", flush=True)
            continue
        results = run_op(op, d, repeat, args.metric, None if args.quick else 20.0)
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
            if res.mode == "fwd":
                rate = fwd_bytes / t / 1e9
                cells.append(f"{rate:.2f} ({100 * rate / bandwidth['copy_']:.0f}%)")
            plots["speedup"][op][res.mode + " padded"] = padded / t if padded else math.nan
            plots["speedup"][op][res.mode + " torch"] = best[1] / t if best else math.nan
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
                detail.rows.append([op, res.mode, name, "-", "-", "-", err])
            print(
                f"{op:<10}{res.mode:<8}"
                + "  ".join(f"{k}={fmt_ms(v)}" for k, v in res.times.items()),
                flush=True,
            )
        cells.append(formula)
        main_table.rows.append(cells)
    main_table.notes += [
        shape + ".",
        f"Median {args.metric} time of {repeat} calls after a warm-up call (at least 3 for "
        "variants slower than 4 s), variants timed round-robin; ratios = other / ragged (above "
        "1: ragged is faster).",
        "padded = `ragged.to_padded` with a masking fill (0 / -inf / +inf) + the dense op "
        "(+ gather back to rows for row-wise outputs); best torch = fastest matching "
        "composition (see the detail table).",
        f"GB/s against the same run's copy: `out.copy_(values)` {bandwidth['copy_']:.2f} GB/s "
        f"(the % column's reference), `values.clone()` {bandwidth['clone']:.2f} GB/s (fresh "
        "256 MB tensor: page faults).",
    ]
    overhead = eager_overhead(number, small_repeat, args.metric, device)
    for table in (main_table, detail, overhead):
        print()
        print(table.text())
    if args.json:
        write_result(
            args.json,
            "ops",
            [main_table, overhead, detail],
            quick=args.quick,
            metric=args.metric,
            plots={**plots, "copy_gbps": bandwidth},
        )


if __name__ == "__main__":
    main()
