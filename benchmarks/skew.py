"""Length skew: time and peak memory of ragged vs padded as segment lengths spread out.

The rows stay fixed (``[2**18, 64]`` float32, 2048 segments, mean length 128); the log-normal
lengths are drawn with max/mean ratios from 1 (all equal) to 32. For each, the job
``logsumexp`` over the ragged axis, forward and backward, runs as ``ragged.logsumexp`` and as
padding (``ragged.to_padded`` with -inf + dense ``logsumexp``). Padding's cost grows with
``B * max(L)``, the ragged op's with ``sum(L)``, so the gap widens with the skew.

Peak memory: how far the process's resident high-water mark rises during one call (Linux
``/proc/self/status``, reset before each call); with ``--device cuda``, the rise of the CUDA
allocator's peak (and wall time, each call synchronised).

Usage: ``python benchmarks/skew.py [--quick] [--metric cpu|wall] [--device cpu|cuda]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ops import lognormal_lengths

import ragged
from ragged.bench import Table, add_device_option, compare, peak_memory, use_device, write_result

SKEWS = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


def variants(x: ragged.RaggedArray, grad: Tensor) -> dict[str, object]:
    leaf = x.values.detach().requires_grad_()
    xg = x.with_values(leaf)

    def ragged_job() -> Tensor:
        return torch.autograd.grad(ragged.logsumexp(xg, axis=1), leaf, grad)[0]

    def padded_job() -> Tensor:
        dense = ragged.to_padded(xg, -math.inf).logsumexp(1)
        return torch.autograd.grad(dense, leaf, grad)[0]

    return {"ragged": ragged_job, "padded": padded_job}


def _mb(size: float | None) -> float:
    return math.nan if size is None else size / 1e6


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
    rows, num, dim, repeat = (1 << 14, 128, 16, 3) if args.quick else (1 << 18, 2048, 64, 5)
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(rows, dim, generator=gen).to(device)
    grad = torch.randn(num, dim, generator=gen).to(device)
    table = Table(
        f"Length skew: logsumexp over the ragged axis, forward + backward ([{rows}, {dim}] "
        f"float32, {num} segments)",
        [
            "max/mean",
            "max length",
            "ragged ms",
            "padded ms",
            "padded / ragged",
            "ragged peak MB",
            "padded peak MB",
        ],
    )
    points = []
    for skew in SKEWS:
        lengths = lognormal_lengths(num, rows, max_over_mean=skew)
        x = ragged.from_lengths(values, lengths)
        jobs = variants(x, grad)
        times = compare(jobs, repeat=repeat)  # type: ignore[arg-type]
        memory = {k: peak_memory(fn) for k, fn in jobs.items()}  # type: ignore[arg-type]
        r, p = times["ragged"].median(args.metric), times["padded"].median(args.metric)
        ratio = max(lengths) * num / rows
        point = {
            "max_over_mean": ratio,
            "ragged_ms": r * 1e3,
            "padded_ms": p * 1e3,
            "ragged_mb": _mb(memory["ragged"]),
            "padded_mb": _mb(memory["padded"]),
        }
        points.append(point)
        table.rows.append(
            [
                f"{ratio:.2f}",
                str(max(lengths)),
                f"{point['ragged_ms']:.1f}",
                f"{point['padded_ms']:.1f}",
                f"{p / r:.1f}x",
                f"{point['ragged_mb']:.0f}",
                f"{point['padded_mb']:.0f}",
            ]
        )
        print(table.rows[-1], flush=True)
    table.notes += [
        f"Median {args.metric} time of {repeat} calls, round-robin, on {device}. Peak MB: rise of "
        f"the {'resident' if device.type == 'cpu' else 'device allocator'} high-water mark during "
        f"one call (the input values, {rows * dim * 4 / 1e6:.0f} MB, exist before it).",
        "The padded grid has B * max(L) rows: max/mean times the real rows.",
    ]
    print()
    print(table.text())
    if args.json:
        write_result(
            args.json, "skew", [table], quick=args.quick, metric=args.metric, plots={"skew": points}
        )


if __name__ == "__main__":
    main()
