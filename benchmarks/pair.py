"""Pair maps: one Pairformer block, ragged against padded, forward and backward on one CPU thread.

The block is ``examples/pairformer.py``'s: gated triangle multiplicative updates (outgoing and
incoming, ``ragged.triangle_multiply``), a pair transition, pair-biased single attention and a
single transition. Its inputs are a single representation ``s`` ``(B, N*, Cs)`` and a pair
representation ``z`` ``(B, N*, N*, Cz)`` (leaves that require grad, as inside a stack); the
loss is the sum of squares of both outputs. The *padded* variant runs the same parameters on
dense ``(B, Nmax, Nmax, Cz)`` tensors with masks (the usual implementation).

Three length regimes of ``B`` proteins: uniform (lengths uniform in ``[16, Nmax]``), skewed
(log-normal around 64, clipped to ``[16, Nmax]``) and one long (one of ``Nmax`` among
``B - 1`` of 32).

Each variant runs in a fresh process (``MALLOC_MMAP_THRESHOLD_=131072``, so freed tensors leave
the resident set at once), one thread, and reports:

* time: the median of ``--reps`` forward+backward passes after a warm-up;
* peak: resident memory of one pass above the resident memory before it: the kernel's peak-RSS
  counter is reset (``/proc/self/clear_refs``) before the pass and read (``VmHWM``) after it.
  It counts activations, temporaries and gradients (of the inputs and of the parameters, which
  are small: ~0.1 MiB here); parameters and inputs exist before the pass and are not counted;
* saved: the bytes of every distinct storage autograd saves for the backward pass
  (``torch.autograd.graph.saved_tensors_hooks``), parameters excluded: the activations.

Lower bounds: ``sum N_b^2 * Cz * 4`` bytes is one packed pair tensor; the *packed block bound* is
the sum over proteins of what the same block saves when run densely on that protein alone, with
no padding and no masks: what any implementation of this block keeps for the backward pass.

Run: ``python benchmarks/pair.py [--quick] [--json out.json]`` (about three minutes; ``--quick``
under a minute).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import pairformer as pf  # noqa: E402

import ragged  # noqa: E402
from ragged.bench._report import Table, write_result  # noqa: E402

REGIMES = ("uniform", "skewed", "one long")
SEED_PAPER = (
    "seed paper (GPU, AlphaFold-style pair model): 38.08 -> 5.41 GiB (7.0x), 2.40-4.32x faster"
)


def regime_lengths(regime: str, batch: int, high: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    if regime == "uniform":
        return torch.randint(16, high + 1, (batch,), generator=gen).tolist()
    if regime == "skewed":
        return pf.protein_lengths(batch, gen, high=high)
    return [high] + [32] * (batch - 1)


def make_inputs(lengths: list[int], cfg: pf.Config, seed: int):
    """``s`` ``(B, N*, Cs)`` and ``z`` ``(B, N*, N*, Cz)``, random, as ragged arrays."""
    gen = torch.Generator().manual_seed(seed)
    s = ragged.from_lengths(torch.randn(sum(lengths), cfg.single, generator=gen), lengths)
    pairs = ragged.outer(s, s).partition
    z = ragged.RaggedArray(torch.randn(pairs.num_values, cfg.pair, generator=gen), pairs)
    return s, z


class Runner:
    """One variant's forward+backward pass on fixed inputs."""

    def __init__(self, variant: str, block: pf.PairformerBlock, s: Any, z: Any) -> None:
        self.variant, self.block = variant, block
        if variant == "ragged":
            self.s = s.with_values(s.values.clone().requires_grad_())
            self.z = z.with_values(z.values.clone().requires_grad_())
        elif variant == "padded":
            self.mask = s.to_mask()
            self.pair_mask = (self.mask[:, :, None] & self.mask[:, None, :])[..., None].float()
            self.s = s.to_padded().requires_grad_()
            self.z = z.to_padded().requires_grad_()
        else:  # "packed": each protein alone, dense, no masks
            self.proteins = [
                (a.clone()[None].requires_grad_(), b.clone()[None].requires_grad_())
                for a, b in zip(s.unbind(), pf_blocks(z), strict=True)
            ]

    def loss(self) -> torch.Tensor:
        if self.variant == "ragged":
            s, z = self.block(self.s, self.z)
            return s.values.square().sum() + z.values.square().sum()
        if self.variant == "padded":
            s, z = self.block.padded(self.s, self.z, self.mask, self.pair_mask)
            return (s.square() * self.mask[..., None]).sum() + (z.square() * self.pair_mask).sum()
        raise ValueError(self.variant)

    def step(self) -> None:
        self.loss().backward()
        self.block.zero_grad(set_to_none=True)
        for t in (self.s, self.z):
            (t.values if isinstance(t, ragged.RaggedArray) else t).grad = None

    def saved_bytes(self) -> int:
        params = {p.untyped_storage().data_ptr() for p in self.block.parameters()}
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        if self.variant == "packed":
            total = 0
            for s, z in self.proteins:
                seen.clear()
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out_s, out_z = self.block.padded(s, z, None, None)
                total += sum(seen.values())
                del out_s, out_z
            return total
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = self.loss()
        del loss
        return sum(seen.values())


def pf_blocks(z: Any) -> list[torch.Tensor]:
    """The dense ``(N_b, N_b, Cz)`` block of every protein."""
    n = z.lengths.tolist()
    parts = torch.split(z.values, [k * k for k in n])
    return [p.reshape(k, k, *z.values.shape[1:]) for p, k in zip(parts, n, strict=True)]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def child(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    cfg = pf.Config(pair=args.pair, hidden=args.pair)
    torch.manual_seed(0)
    block = pf.PairformerBlock(cfg)
    s, z = make_inputs(args.lengths, cfg, args.seed)
    runner = Runner(args.child, block, s, z)
    if args.child == "packed":
        return {"saved": runner.saved_bytes()}
    runner.step()  # warm-up: lazy initialisation of libraries and kernels
    gc.collect()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak RSS
    runner.step()
    peak = (_status_kib("VmHWM") - before) * 1024
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        runner.step()
        times.append(time.perf_counter() - start)
    return {"peak": peak, "time": statistics.median(times), "saved": runner.saved_bytes()}


def run_child(variant: str, lengths: list[int], args: argparse.Namespace) -> dict[str, Any]:
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, __file__, "--child", variant, "--pair", str(args.pair)]
    command += ["--reps", str(args.reps), "--seed", str(args.seed), "--lengths", *map(str, lengths)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def mib(n: float) -> float:
    return n / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one rep")
    parser.add_argument("--json", help="write the table as JSON to this file")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--pair", type=int, default=32, help="pair channels Cz (= hidden)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", choices=["ragged", "padded", "packed"], help=argparse.SUPPRESS)
    parser.add_argument("--lengths", type=int, nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.quick:
        args.max_length, args.pair, args.reps = 128, 16, 1

    print(f"one Pairformer block, forward+backward, 1 thread, B={args.batch}, Cz={args.pair}")
    rows = []
    for regime in REGIMES:
        lengths = regime_lengths(regime, args.batch, args.max_length, args.seed)
        res = {v: run_child(v, lengths, args) for v in ("ragged", "padded", "packed")}
        pairs, padded_pairs = sum(n * n for n in lengths), len(lengths) * max(lengths) ** 2
        pair_tensor = pairs * args.pair * 4
        row = {
            "regime": regime,
            "lengths": lengths,
            "pairs": pairs,
            "padded_pairs": padded_pairs,
            "time_ragged_s": res["ragged"]["time"],
            "time_padded_s": res["padded"]["time"],
            "speedup": res["padded"]["time"] / res["ragged"]["time"],
            "peak_ragged_bytes": res["ragged"]["peak"],
            "peak_padded_bytes": res["padded"]["peak"],
            "peak_padded_over_ragged": res["padded"]["peak"] / res["ragged"]["peak"],
            "saved_ragged_bytes": res["ragged"]["saved"],
            "saved_padded_bytes": res["padded"]["saved"],
            "packed_block_bound_bytes": res["packed"]["saved"],
            "saved_ragged_over_bound": res["ragged"]["saved"] / res["packed"]["saved"],
            "peak_ragged_over_bound": res["ragged"]["peak"] / res["packed"]["saved"],
            "pair_tensor_bytes": pair_tensor,
            "peak_ragged_in_pair_tensors": res["ragged"]["peak"] / pair_tensor,
        }
        rows.append(row)
        print(
            f"\n{regime}: lengths {lengths}\n"
            f"  pairs {pairs} packed vs {padded_pairs} padded ({padded_pairs / pairs:.2f}x); "
            f"one packed pair tensor sum N^2*Cz*4 = {mib(pair_tensor):.1f} MiB\n"
            f"  time     ragged {1e3 * row['time_ragged_s']:8.0f} ms   padded "
            f"{1e3 * row['time_padded_s']:8.0f} ms   padded/ragged {row['speedup']:.2f}x\n"
            f"  peak     ragged {mib(row['peak_ragged_bytes']):8.1f} MiB  padded "
            f"{mib(row['peak_padded_bytes']):8.1f} MiB  padded/ragged "
            f"{row['peak_padded_over_ragged']:.2f}x\n"
            f"  saved    ragged {mib(row['saved_ragged_bytes']):8.1f} MiB  padded "
            f"{mib(row['saved_padded_bytes']):8.1f} MiB  packed block bound "
            f"{mib(row['packed_block_bound_bytes']):.1f} MiB\n"
            f"  ragged / packed block bound: saved {row['saved_ragged_over_bound']:.2f}x, "
            f"peak {row['peak_ragged_over_bound']:.2f}x; ragged peak = "
            f"{row['peak_ragged_in_pair_tensors']:.1f} pair tensors"
        )
    print(f"\n{SEED_PAPER}")
    if args.json:
        write_result(
            args.json,
            "pair",
            [table(rows, args)],
            quick=args.quick,
            metric="wall",
            plots={"pair": rows},
        )


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> Table:
    """The suite's table: one row per length regime."""
    out = Table(
        f"One Pairformer block, forward + backward (B={args.batch}, Nmax={args.max_length}, "
        f"Cz={args.pair}, float32, 1 thread)",
        [
            "regime",
            "pairs packed / padded",
            "ragged ms",
            "padded ms",
            "padded / ragged time",
            "ragged peak MiB",
            "padded peak MiB",
            "padded / ragged peak",
            "ragged peak / packed bound",
        ],
    )
    for row in rows:
        out.rows.append(
            [
                row["regime"],
                f"{row['pairs']} / {row['padded_pairs']}",
                f"{1e3 * row['time_ragged_s']:.0f}",
                f"{1e3 * row['time_padded_s']:.0f}",
                f"{row['speedup']:.2f}x",
                f"{mib(row['peak_ragged_bytes']):.1f}",
                f"{mib(row['peak_padded_bytes']):.1f}",
                f"{row['peak_padded_over_ragged']:.2f}x",
                f"{row['peak_ragged_over_bound']:.2f}x",
            ]
        )
    out.notes += [
        f"Median of {args.reps} forward+backward passes after a warm-up, each variant in a fresh "
        "process. Peak: rise of the resident high-water mark during one pass.",
        "Packed bound: what the same block saves for backward when run densely on each protein "
        "alone (no padding, no masks).",
        SEED_PAPER,
    ]
    return out


if __name__ == "__main__":
    main()
