"""Transform benchmarks: ``ragged.vmap`` and ``torch.compile`` over ragged batches.

1. **vmap over segments.** B=20k segments, lengths uniform in 1-32, d=16, with a per-segment
   attention ``f(s) = softmax(s s^T / sqrt(d)) s`` (a function that reduces over the segment).
   Compared: ``ragged.vmap(f)`` (segments bucketed by exact length, ``torch.func.vmap`` per
   bucket), a Python loop over segments, and padding + ``torch.func.vmap`` of a *masked* ``f``
   (padding keys get -inf scores; padded query rows are dropped after). All three are checked to
   agree; padding + vmap of the unmasked ``f`` is shown to be wrong. Target: vmap >= 4x the loop.
2. **compile.** A pipeline "softmax over the ragged axis + weighted reduction"
   (``w = softmax_L(x @ q)``, ``out = sum_L(w * x)``) compiled with Inductor,
   ``dynamic=True``, called under ``ragged.dynamic_shapes()``, against eager, on several batches
   of different sizes (one graph expected). Target: compiled >= 2x eager.

With ``--device cuda`` the data lives on the GPU (wall time, every timed call synchronised).

Usage: ``python benchmarks/func.py [--quick] [--metric cpu|wall] [--device cpu|cuda]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ragged
from ragged.bench import Table, add_device_option, compare, use_device, write_result

# --- 1. vmap over segments --------------------------------------------------------------------


def attention(s: Tensor) -> Tensor:
    """Per-segment self-attention without projections: ``softmax(s s^T / sqrt(d)) s``."""
    scores = s @ s.transpose(-1, -2) / math.sqrt(s.shape[-1])
    return scores.softmax(-1) @ s


def masked_attention(s: Tensor, mask: Tensor) -> Tensor:
    """``attention`` on a padded segment: padding keys get -inf scores (``mask``: real rows)."""
    scores = s @ s.transpose(-1, -2) / math.sqrt(s.shape[-1])
    scores = scores.masked_fill(~mask[None, :], -math.inf)
    return scores.softmax(-1) @ s


def vmap_variants(x: ragged.RaggedArray) -> dict[str, Callable[[Tensor], Tensor]]:
    """Each variant maps the values of ``x`` to the values of the per-segment result."""
    lengths = x.lengths.tolist()
    mask = ragged.to_mask(x)
    level = x.partition.levels[0]
    width = mask.shape[1]
    flat = level.row_ids * width + level.positions()
    mapped = ragged.vmap(attention, method="vmap")

    def padded(v: Tensor, f: Callable[..., Tensor], masked: bool) -> Tensor:
        p = ragged.to_padded(x.with_values(v))
        out = torch.func.vmap(f)(p, mask) if masked else torch.func.vmap(f)(p)
        return out.reshape(-1, v.shape[1]).index_select(0, flat)

    return {
        "ragged.vmap": lambda v: mapped(x.with_values(v)).values,
        "loop": lambda v: torch.cat([attention(s) for s in v.split(lengths)]),
        "padded + mask + vmap": lambda v: padded(v, masked_attention, True),
        "padded + vmap, no mask (wrong)": lambda v: padded(v, attention, False),
    }


def bench_vmap(
    num: int, dim: int, repeat: int, metric: str, device: torch.device
) -> tuple[Table, dict[str, dict[str, float]]]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 33, (num,), generator=gen)
    values = torch.randn(int(lengths.sum()), dim, generator=gen).to(device)
    x = ragged.from_lengths(values, lengths if device.type == "cpu" else lengths.tolist())
    variants = vmap_variants(x)
    want = variants["loop"](values)
    errors = {name: float((fn(values) - want).abs().max()) for name, fn in variants.items()}
    grad = torch.randn(want.shape, generator=gen).to(device)
    leaf = values.detach().requires_grad_()
    want_grad = torch.autograd.grad(variants["loop"](leaf), leaf, grad)[0]

    def with_grad(fn: Callable[[Tensor], Tensor]) -> Callable[[], Tensor]:
        return lambda: torch.autograd.grad(fn(leaf), leaf, grad)[0]

    grad_errors = {
        name: float((with_grad(fn)() - want_grad).abs().max()) for name, fn in variants.items()
    }
    timed = {k: v for k, v in variants.items() if "wrong" not in k}
    fwd = compare({k: (lambda f=f: f(values)) for k, f in timed.items()}, repeat=repeat)
    both = compare({k: with_grad(f) for k, f in timed.items()}, repeat=repeat)
    table = Table(
        f"ragged.vmap over {num} segments (lengths 1-32, d={dim}) of f(s) = softmax(s s^T / sqrt(d)) s",
        ["method", "fwd ms", "loop / method", "fwd+bwd ms", "loop / method", "max |error|"],
    )
    plot: dict[str, dict[str, float]] = {}
    for name in variants:
        err = f"{errors[name]:.1e} / {grad_errors[name]:.1e}"
        if name not in timed:
            table.rows.append([name, "-", "-", "-", "-", err])
            continue
        f_ms = fwd[name].median(metric)
        b_ms = both[name].median(metric)
        f_ratio = fwd["loop"].median(metric) / f_ms
        b_ratio = both["loop"].median(metric) / b_ms
        plot[name] = {"fwd": f_ratio, "fwd+bwd": b_ratio}
        table.rows.append(
            [
                name,
                f"{f_ms * 1e3:.1f}",
                f"{f_ratio:.2f}x",
                f"{b_ms * 1e3:.1f}",
                f"{b_ratio:.2f}x",
                err,
            ]
        )
    speedup = fwd["loop"].median(metric) / fwd["ragged.vmap"].median(metric)
    table.notes += [
        f"Median {metric} time of {repeat} calls, round-robin. Error: max |output - loop| / max "
        "|gradient - loop's| (float32).",
        f"Target ragged.vmap >= 4x the loop (forward): {speedup:.2f}x, "
        f"{'met' if speedup >= 4 else 'missed'}.",
    ]
    return table, plot


# --- 2. compile -------------------------------------------------------------------------------


def pipeline(x: ragged.RaggedArray, q: Tensor) -> Tensor:
    """Attention pooling: weights softmax_L(x @ q), then the weighted sum over the ragged axis."""
    weights = ragged.softmax(x.with_values(x.values @ q), axis=1)
    return ragged.sum(x * weights.with_values(weights.values[:, None]), axis=1)


def batches(
    sizes: list[tuple[int, int]], dim: int, device: torch.device
) -> list[ragged.RaggedArray]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for num, mean in sizes:
        lengths = torch.exp(torch.randn(num, generator=gen) * 0.6) * mean
        lengths = lengths.round().long().clamp_min(1)
        values = torch.randn(int(lengths.sum()), dim, generator=gen).to(device)
        # On another device the lengths come from the host, as a collate function gives them.
        out.append(
            ragged.from_lengths(values, lengths if device.type == "cpu" else lengths.tolist())
        )
    return out


def bench_compile(
    sizes: list[tuple[int, int]], dim: int, repeat: int, metric: str, device: torch.device
) -> tuple[Table, dict[str, dict[str, float]]]:
    import torch._dynamo

    # A cold, private Inductor cache: compile times are honest, and the on-disk cache cannot
    # serve a graph compiled for other sizes. (torch 2.13: under ragged.dynamic_shapes(), a
    # cached training graph compiled for feature size 16 was reused for size 64 in a new process
    # and failed its stride assertion.)
    with tempfile.TemporaryDirectory(prefix="ragged-bench-inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch._dynamo.reset()
        return _bench_compile(sizes, dim, repeat, metric, device)


def _bench_compile(
    sizes: list[tuple[int, int]], dim: int, repeat: int, metric: str, device: torch.device
) -> tuple[Table, dict[str, dict[str, float]]]:
    xs = batches(sizes, dim, device)
    q = torch.randn(dim, generator=torch.Generator().manual_seed(2)).to(device)
    compiled = torch.compile(pipeline, dynamic=True, backend="inductor")
    table = Table(
        "torch.compile (Inductor, dynamic=True, under ragged.dynamic_shapes()) vs eager: "
        "out = sum_L(softmax_L(x @ q) * x)",
        [
            "batch",
            "eager fwd ms",
            "compiled fwd ms",
            "speedup",
            "eager fwd+bwd ms",
            "compiled fwd+bwd ms",
            "speedup",
        ],
    )
    plot: dict[str, dict[str, float]] = {}
    compile_s: dict[str, float] = {}
    with ragged.dynamic_shapes():
        for mode in ("fwd", "fwd+bwd"):
            start = time.perf_counter()
            for x in xs:
                _run(compiled, x, q, mode)()
            compile_s[mode] = time.perf_counter() - start
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        rows: dict[str, list[str]] = {}
        worst = 0.0
        for x in xs:
            label = f"B={x.num_segments}, rows={x.values.shape[0]}"
            cells = [label]
            for mode in ("fwd", "fwd+bwd"):
                got, want = _run(compiled, x, q, mode)(), _run(pipeline, x, q, mode)()
                # float32 sums in another order: compare against the output's scale.
                error = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
                worst = max(worst, error)
                if error > 1e-4:
                    raise AssertionError(
                        f"compiled result differs from eager ({label}, {mode}): {error:.1e}"
                    )
                t = compare(
                    {"eager": _run(pipeline, x, q, mode), "compiled": _run(compiled, x, q, mode)},
                    repeat=repeat,
                )
                e, c = t["eager"].median(metric), t["compiled"].median(metric)
                cells += [f"{e * 1e3:.1f}", f"{c * 1e3:.1f}", f"{e / c:.2f}x"]
                plot.setdefault(label, {})[mode] = e / c
            rows[label] = cells
        table.rows += list(rows.values())
    largest = max(plot, key=lambda k: int(k.split("rows=")[1]))
    speedup = plot[largest]["fwd"]
    table.notes += [
        f"Median {metric} time of {repeat} calls after compiling; compiled vs eager checked on "
        f"every batch (largest difference {worst:.1e} of the output's scale; float32).",
        f"Graphs compiled for {len(xs)} batch shapes x 2 modes (no-grad forward, training): "
        f"{frames} (compile time {compile_s['fwd']:.0f} s forward, {compile_s['fwd+bwd']:.0f} s "
        "training).",
        f"Target compiled >= 2x eager (forward, largest batch): {speedup:.2f}x, "
        f"{'met' if speedup >= 2 else 'missed'}.",
    ]
    return table, plot


def _run(
    fn: Callable[..., Tensor], x: ragged.RaggedArray, q: Tensor, mode: str
) -> Callable[[], Tensor]:
    if mode == "fwd":

        def forward() -> Tensor:
            with torch.no_grad():
                return fn(x, q)

        return forward
    leaf = x.values.detach().requires_grad_()
    xg = x.with_values(leaf)
    return lambda: torch.autograd.grad(fn(xg, q).sum(), leaf)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small data")
    parser.add_argument("--metric", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--json", help="write the result document here")
    add_device_option(parser)
    args = parser.parse_args()
    device = use_device(args.device)
    if device.type != "cpu":
        args.metric = "wall"
    torch.set_num_threads(1)
    if args.quick:
        num, dim, repeat = 2000, 16, 3
        sizes, cdim = [(64, 32), (96, 24), (80, 40)], 16
    else:
        # vmap: more calls, its median is the noisier one on a shared machine.
        num, dim, repeat = 20000, 16, 9
        sizes, cdim = [(2048, 128), (3072, 96), (4096, 64)], 64
    tables = []
    plots: dict[str, dict[str, dict[str, float]]] = {}
    table, plots["vmap"] = bench_vmap(num, dim, repeat, args.metric, device)
    print(table.text(), flush=True)
    tables.append(table)
    table, plots["compile"] = bench_compile(sizes, cdim, min(repeat, 5), args.metric, device)
    print()
    print(table.text(), flush=True)
    tables.append(table)
    if args.json:
        write_result(args.json, "func", tables, quick=args.quick, metric=args.metric, plots=plots)


if __name__ == "__main__":
    main()
