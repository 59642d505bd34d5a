"""Sync-free per-sample sampling: ``ragged.sample_mask`` against a ``nonzero``-based sampler.

The PyTorch blog post "Overcoming the hidden performance traps of variable-shaped tensors"
samples up to ``k`` valid items per sample of a padded batch with ``nonzero`` + ``randperm``, one
sample at a time: every ``nonzero`` reads a data-dependent size back to the host (a sync per
sample on an accelerator). ``ragged.sample_mask`` chooses for all segments at once with static
shapes (a random permutation and one sort), so it needs no sync and compiles to one graph.

Run: ``python examples/sampler.py [--small]`` (a few seconds on one CPU thread).
"""

from __future__ import annotations

import argparse
import time

import torch

import ragged


def nonzero_sampler(valid: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """The blog post's pattern: per sample, find the valid positions, shuffle, keep ``k``."""
    chosen = torch.zeros_like(valid)
    for b in range(valid.shape[0]):
        candidates = torch.nonzero(valid[b]).squeeze(1)  # data-dependent size: a host sync
        perm = torch.randperm(candidates.numel(), generator=generator)[:k]
        chosen[b, candidates[perm]] = True
    return chosen


def time_per_call(fn, repeats: int = 20) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3  # median, ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run (CI)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    batch, longest, k = (64, 128, 16) if args.small else (256, 512, 64)
    lengths = torch.randint(0, longest + 1, (batch,), generator=gen)
    x = ragged.from_lengths(torch.randn(int(lengths.sum()), 16, generator=gen), lengths.tolist())
    valid = x.to_mask()  # the padded batch's (B, max_length) validity mask

    ragged_ms = time_per_call(lambda: ragged.sample_mask(x, k, generator=gen))
    nonzero_ms = time_per_call(lambda: nonzero_sampler(valid, k, gen))

    mask = ragged.sample_mask(x, k, generator=gen)
    padded = nonzero_sampler(valid, k, gen)
    counts_match = torch.equal(ragged.sum(mask, axis=1), padded.sum(1))
    exact = torch.equal(ragged.sum(mask, axis=1), lengths.clamp_max(k))
    print(f"batch of {batch} segments, lengths 0..{longest} (total {x.values.shape[0]}), k={k}")
    print(f"  ragged.sample_mask (sync-free):       {ragged_ms:7.2f} ms per call")
    print(f"  nonzero + randperm per sample (post): {nonzero_ms:7.2f} ms per call")
    print(f"  per-segment counts match: {counts_match} (both equal min(k, L_b): {exact})")


if __name__ == "__main__":
    main()
