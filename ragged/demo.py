"""A short tour of torch-ragged on synthetic data: ``python -m ragged.demo``.

It builds a batch of variable-length sequences without padding, reduces over the ragged axis,
converts to a padded tensor, takes a gradient through a reduction with ``torch.func.grad``, and
prints how much memory packing saves over padding for sequences and for pair maps.
"""

from __future__ import annotations

import argparse

import torch

import ragged


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.1f} MiB"


def tour(seed: int = 0) -> None:
    """Print each step of the tour."""
    torch.manual_seed(seed)
    print("1. Build a RaggedArray from flat values and per-sequence lengths (no padding).")
    lengths = [3, 0, 5, 2]
    values = torch.randn(sum(lengths), 4)
    x = ragged.from_lengths(values, lengths, axes=("batch", "seq", "feat"))
    print(f"   x.shape = {x.shape}, axes = {x.axes}, values: {tuple(x.values.shape)}")

    print("2. Reduce over the ragged axis (by name); empty segments get the identity or NaN.")
    for name in ("sum", "mean", "max"):
        result = getattr(ragged, name)(x, "seq")[:, 0].tolist()
        print(f"   {name:<4} -> {[round(v, 3) for v in result]}  (feature 0)")

    print("3. Convert to a padded tensor and mask when a dense kernel needs one.")
    padded, mask = x.to_padded(), x.to_mask()
    print(f"   to_padded: {tuple(padded.shape)}, mask rows: {mask.sum(1).tolist()}")

    print("4. Differentiate through a reduction with torch.func.grad (gradient is ragged too).")

    def loss(x: ragged.RaggedArray) -> torch.Tensor:
        centred = x - ragged.mean(x, "seq", keepdims=True, fill_value=0.0)
        return ragged.sum(centred * centred)

    grad = torch.func.grad(loss)(x)
    print(
        f"   grad is a {type(grad).__name__} with the same partition: {grad.partition is x.partition}"
    )
    dense = padded.clone().requires_grad_()
    counts = mask.sum(1, keepdim=True).clamp_min(1)
    centred = (dense - (dense * mask[..., None]).sum(1, keepdim=True) / counts[..., None]) * mask[
        ..., None
    ]
    (reference,) = torch.autograd.grad((centred**2).sum(), dense)
    same = torch.allclose(grad.to_padded(), reference, atol=1e-6)
    print(f"   matches the padded-and-masked computation: {same}")

    print("5. Memory: packed vs padded for a skewed batch (fp32).")
    skewed = (torch.distributions.LogNormal(4.0, 0.8).sample((64,)).clamp(8, 1024)).long()
    total, longest = int(skewed.sum()), int(skewed.max())
    width = 256
    packed_seq, padded_seq = total * width * 4, len(skewed) * longest * width * 4
    pairs_packed = int((skewed**2).sum()) * 64 * 4
    pairs_padded = len(skewed) * longest**2 * 64 * 4
    print(f"   64 sequences, lengths {int(skewed.min())}..{longest}, d={width}:")
    print(
        f"   sequences: packed {_mib(packed_seq)} vs padded {_mib(padded_seq)}"
        f" ({padded_seq / packed_seq:.1f}x)"
    )
    print(
        f"   pair maps (B, N, N, 64): packed {_mib(pairs_packed)} vs padded {_mib(pairs_padded)}"
        f" ({pairs_padded / pairs_packed:.1f}x)"
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m ragged.demo``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    tour(parser.parse_args(argv).seed)


if __name__ == "__main__":
    main()
