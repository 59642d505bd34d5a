"""A small Pairformer-style stack on synthetic proteins, with ragged pair maps and no padding.

Each "protein" is a random 3-D chain of ``N_b`` residues (a random walk with 3.8 A steps), and the
batch has skewed lengths (log-normal, 16..256 residues). Two representations flow through the
stack, as in AlphaFold 3's Pairformer:

* the single representation ``s``: ``(B, N*, Cs)``, one row per residue;
* the pair representation ``z``: ``(B, N*, N*, Cz)``, a dense ``N_b x N_b`` block per protein,
  stored back to back (``sum N_b^2`` rows instead of ``B * Nmax^2``). It starts as the outer sum
  of two projections of ``s`` (``ragged.outer``) plus a relative-position embedding (the outer
  difference of residue indices).

Each block updates ``z`` with the gated triangle multiplicative updates, outgoing then incoming
(``ragged.triangle_multiply``, with ``ragged.layer_norm`` around it), and a pair transition
(an MLP applied with ``ragged.map``); then ``s`` with pair-biased attention (``ragged.attention``
with the projected pair representation as a per-head bias) and a transition.
A linear head on ``z`` predicts every pairwise distance; the loss is their mean squared error.
The input features are a random residue type and the residue's coordinates with noise, so the
distances are learnable.

The same blocks also run *padded* (dense ``(B, Nmax, Nmax, Cz)`` tensors with masks, the usual
implementation) with the same parameters: ``--check`` compares the two, and the memory report
runs one training step (forward and backward) of each in a fresh subprocess: after building the
batch and the model and a warm-up step, the child resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``), takes the step and reads the peak RSS (``VmHWM``, see
:func:`measure_step`); the peak minus the resident memory before the step is the step's memory
(activations, temporaries and the parameters' gradients, which are tiny next to pair tensors). Children run with glibc's
``MALLOC_MMAP_THRESHOLD_=131072``, so that freed tensors leave the resident set at once and the
peak tracks live memory rather than allocator caching. The packed lower bound
``sum N_b^2 * Cz * 4`` bytes is the size of one pair tensor.

Run: ``python examples/pairformer.py`` (under a minute), ``--small`` for CI (a few seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import ragged
from ragged import RaggedArray

AMINO_ACIDS = 20
MAX_OFFSET = 32  # relative positions are clipped to [-32, 32]


@dataclasses.dataclass(frozen=True)
class Config:
    single: int = 64  # Cs
    pair: int = 32  # Cz
    hidden: int = 32  # channels of the triangle products
    heads: int = 4
    head_dim: int = 16
    blocks: int = 2


# --- data -------------------------------------------------------------------------------------


def protein_lengths(
    count: int, gen: torch.Generator, low: int = 16, high: int = 256, median: float = 64.0
) -> list[int]:
    """Skewed lengths: log-normal around ``median``, clipped to ``[low, high]``."""
    draws = torch.randn(count, generator=gen, dtype=torch.float64) * 0.8 + math.log(median)
    return draws.exp().round().clamp(low, high).long().tolist()


def make_proteins(lengths: list[int], gen: torch.Generator) -> tuple[RaggedArray, RaggedArray]:
    """Random chains: features ``(B, N*, 20 + 3)`` (residue type one-hot, noisy coordinates
    in nm) and coordinates ``(B, N*, 3)`` in nm."""
    total = sum(lengths)
    steps = torch.randn(total, 3, generator=gen)
    steps = 0.38 * steps / steps.norm(dim=-1, keepdim=True)
    chains = ragged.from_lengths(steps, lengths, axes=("protein", "residue", "xyz"))
    coords = ragged.cumsum(chains, axis="residue")
    kinds = torch.randint(0, AMINO_ACIDS, (total,), generator=gen)
    noisy = coords.values + 0.1 * torch.randn(total, 3, generator=gen)
    features = torch.cat([F.one_hot(kinds, AMINO_ACIDS).float(), noisy], dim=-1)
    return coords.with_values(features, axes=("protein", "residue", "feature")), coords


def padded_batch(x: RaggedArray) -> tuple[Tensor, Tensor]:
    """``(B, Nmax, ...)`` and the residue mask ``(B, Nmax)``."""
    return x.to_padded(), x.to_mask()


# --- layers: each runs on ragged arrays and on padded tensors with the same parameters ----------


class TriangleMultiplication(nn.Module):
    """Gated triangle multiplicative update (AlphaFold 2, algorithms 11 and 12)."""

    def __init__(self, cfg: Config, outgoing: bool) -> None:
        super().__init__()
        self.outgoing = outgoing
        self.norm_in = nn.LayerNorm(cfg.pair)
        self.project = nn.Linear(cfg.pair, 4 * cfg.hidden)  # a, a's gate, b, b's gate
        self.gate = nn.Linear(cfg.pair, cfg.pair)
        self.norm_out = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.pair)

    def _inputs(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        zn = self.norm_in(z)
        a, a_gate, b, b_gate = self.project(zn).chunk(4, dim=-1)
        return torch.sigmoid(a_gate) * a, torch.sigmoid(b_gate) * b, self.gate(zn)

    def _output(self, x: Tensor, gate: Tensor) -> Tensor:
        return torch.sigmoid(gate) * self.out(self.norm_out(x))

    def forward(self, z: RaggedArray) -> RaggedArray:
        a, b, gate = ragged.map(self._inputs, z)
        x = ragged.triangle_multiply(a, b, outgoing=self.outgoing)
        return ragged.map(self._output, x, gate)

    def padded(self, z: Tensor, pair_mask: Tensor | None) -> Tensor:
        """On dense ``(B, N, N, Cz)``; ``pair_mask`` ``(B, N, N, 1)`` (``None``: no padding)."""
        a, b, gate = self._inputs(z)
        if pair_mask is not None:
            a, b = a * pair_mask, b * pair_mask  # padding must not enter the sum over k
        equation = "bikc,bjkc->bijc" if self.outgoing else "bkic,bkjc->bijc"
        return self._output(torch.einsum(equation, a, b), gate)


class Transition(nn.Module):
    """LayerNorm, then a two-layer SwiGLU-free MLP (ReLU), as a residual update."""

    def __init__(self, channels: int, factor: int = 2) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.up = nn.Linear(channels, factor * channels)
        self.down = nn.Linear(factor * channels, channels)

    def dense(self, x: Tensor) -> Tensor:
        return self.down(F.relu(self.up(self.norm(x))))

    def forward(self, x: RaggedArray) -> RaggedArray:
        return ragged.map(self.dense, x)


class PairBiasedAttention(nn.Module):
    """Single-representation attention with a per-head bias from the pair representation."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        width = cfg.heads * cfg.head_dim
        self.norm = nn.LayerNorm(cfg.single)
        self.qkv = nn.Linear(cfg.single, 3 * width, bias=False)
        self.pair_norm = nn.LayerNorm(cfg.pair)
        self.pair_bias = nn.Linear(cfg.pair, cfg.heads, bias=False)
        self.gate = nn.Linear(cfg.single, width)
        self.out = nn.Linear(width, cfg.single)

    def _qkv(self, s: Tensor) -> tuple[Tensor, ...]:
        sn = self.norm(s)
        q, k, v = self.qkv(sn).unflatten(-1, (3, self.heads, self.head_dim)).unbind(-3)
        return q, k, v, self.gate(sn)

    def _bias(self, z: Tensor) -> Tensor:
        return self.pair_bias(self.pair_norm(z))

    def _output(self, o: Tensor, gate: Tensor) -> Tensor:
        return self.out(torch.sigmoid(gate) * o.flatten(-2))

    def forward(self, s: RaggedArray, z: RaggedArray) -> RaggedArray:
        # (B, N*, H, D) for q, k, v: name the new head axes (names are never dropped silently)
        heads = None if s.axes is None else (*s.axes[:2], "head", "channel")
        q, k, v, gate = ragged.map(self._qkv, s, axes=(heads, heads, heads, "keep"))
        bias = ragged.map(self._bias, z)  # (B, N*, N*, H)
        # Per protein softmax(q k^T * scale + bias) v, without materialising the probabilities.
        o = ragged.attention(q, k, v, scale=self.head_dim**-0.5, bias=bias)
        return ragged.map(self._output, o, gate, axes=s.axes)

    def padded(self, s: Tensor, z: Tensor, mask: Tensor | None) -> Tensor:
        q, k, v, gate = self._qkv(s)  # (B, N, H, D)
        scores = torch.einsum("bihd,bjhd->bijh", q, k) * self.head_dim**-0.5 + self._bias(z)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, :, None], float("-inf"))
        o = torch.einsum("bijh,bjhd->bihd", torch.softmax(scores, dim=2), v)
        return self._output(o, gate)


class PairformerBlock(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.outgoing = TriangleMultiplication(cfg, outgoing=True)
        self.incoming = TriangleMultiplication(cfg, outgoing=False)
        self.pair_transition = Transition(cfg.pair)
        self.attention = PairBiasedAttention(cfg)
        self.single_transition = Transition(cfg.single)

    def forward(self, s: RaggedArray, z: RaggedArray) -> tuple[RaggedArray, RaggedArray]:
        z = z + self.outgoing(z)
        z = z + self.incoming(z)
        z = z + self.pair_transition(z)
        s = s + self.attention(s, z)
        s = s + self.single_transition(s)
        return s, z

    def padded(
        self, s: Tensor, z: Tensor, mask: Tensor | None, pair_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The block on dense tensors with masks (``None``: one unpadded protein)."""
        z = z + self.outgoing.padded(z, pair_mask)
        z = z + self.incoming.padded(z, pair_mask)
        z = z + self.pair_transition.dense(z)
        s = s + self.attention.padded(s, z, mask)
        s = s + self.single_transition.dense(s)
        return s, z


class Pairformer(nn.Module):
    """Embedding, a stack of blocks, and a distance head on the pair representation.

    Before the head the final single representation joins the pair one as an outer sum of two
    projections, so the attention (which updates only ``s``) is trained by the distance loss.
    """

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = nn.Linear(AMINO_ACIDS + 3, cfg.single)
        self.left = nn.Linear(cfg.single, cfg.pair)
        self.right = nn.Linear(cfg.single, cfg.pair)
        self.relpos = nn.Embedding(2 * MAX_OFFSET + 1, cfg.pair)
        self.blocks = nn.ModuleList(PairformerBlock(cfg) for _ in range(cfg.blocks))
        self.final_left = nn.Linear(cfg.single, cfg.pair)
        self.final_right = nn.Linear(cfg.single, cfg.pair)
        self.head_norm = nn.LayerNorm(cfg.pair)
        self.head = nn.Linear(cfg.pair, 1)

    def _relpos(self, offsets: Tensor) -> Tensor:
        return self.relpos(offsets.clamp(-MAX_OFFSET, MAX_OFFSET) + MAX_OFFSET)

    def _distance(self, z: Tensor) -> Tensor:
        return self.head(self.head_norm(z)).squeeze(-1)

    def forward(self, features: RaggedArray) -> RaggedArray:
        """Predicted distances ``(B, N*, N*)`` in nm."""
        s = ragged.map(self.embed, features)
        z = ragged.outer(ragged.map(self.left, s), ragged.map(self.right, s))  # z_ij = l_i + r_j
        index = s.with_values(s.partition.levels[0].positions(), axes=None)
        z = z + ragged.map(
            self._relpos, ragged.outer(index, index, torch.sub)
        )  # an equal partition
        for block in self.blocks:
            s, z = block(s, z)
        z = z + ragged.outer(ragged.map(self.final_left, s), ragged.map(self.final_right, s))
        return ragged.map(self._distance, z)

    def padded(self, features: Tensor, mask: Tensor) -> Tensor:
        """Predicted distances ``(B, Nmax, Nmax)`` (padding entries are garbage)."""
        width = features.shape[1]
        pair_mask = (mask[:, :, None] & mask[:, None, :])[..., None].to(features.dtype)
        s = self.embed(features)
        z = self.left(s)[:, :, None] + self.right(s)[:, None, :]
        index = torch.arange(width, device=features.device)
        z = z + self._relpos(index[:, None] - index[None, :])
        for block in self.blocks:
            s, z = block.padded(s, z, mask, pair_mask)
        z = z + self.final_left(s)[:, :, None] + self.final_right(s)[:, None, :]
        return self._distance(z)


def loss_ragged(model: Pairformer, features: RaggedArray, coords: RaggedArray) -> Tensor:
    distances = ragged.outer(coords, coords, torch.sub)  # (B, N*, N*, 3)
    target = distances.values.norm(dim=-1)
    return F.mse_loss(model(features).values, target)


def loss_padded(model: Pairformer, features: Tensor, coords: Tensor, mask: Tensor) -> Tensor:
    pair_mask = (mask[:, :, None] & mask[:, None, :]).to(features.dtype)
    target = torch.cdist(coords, coords)
    error = (model.padded(features, mask) - target) ** 2 * pair_mask
    return error.sum() / pair_mask.sum()


# --- memory, measured in fresh processes -------------------------------------------------------


def _setup(args: argparse.Namespace) -> tuple[Pairformer, RaggedArray, RaggedArray]:
    gen = torch.Generator().manual_seed(args.seed)
    lengths = args.lengths or protein_lengths(args.batch, gen, high=args.max_length)
    features, coords = make_proteins(lengths, gen)
    torch.manual_seed(args.seed)
    return Pairformer(Config(pair=args.pair, blocks=args.blocks)), features, coords


def step(variant: str, model: Pairformer, features: RaggedArray, coords: RaggedArray) -> Tensor:
    """One forward and backward pass; returns the loss."""
    if variant == "ragged":
        loss = loss_ragged(model, features, coords)
    else:
        mask = features.to_mask()
        loss = loss_padded(model, features.to_padded(), coords.to_padded(), mask)
    loss.backward()
    return loss.detach()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_step(
    variant: str, model: Pairformer, features: RaggedArray, coords: RaggedArray
) -> int:
    """Peak resident memory of one step above the resident memory before it (bytes).

    Takes a step on a tiny batch to warm up (torch initialises libraries and kernels lazily,
    tens of MiB),
    then resets the kernel's peak-RSS counter (``/proc/self/clear_refs``) and reads the peak
    after the measured step (``VmHWM``: the counter behind ``ru_maxrss``, which also keeps the
    resident size of the parent process at ``fork``, before ``exec``, and so would report the
    parent's memory instead of the step's).
    """
    import gc

    tiny = make_proteins([5, 3], torch.Generator().manual_seed(1))
    step(variant, model, *tiny)  # warm up: lazy library and kernel initialisation
    model.zero_grad(set_to_none=True)
    del tiny
    gc.collect()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak RSS (Linux >= 4.0)
    step(variant, model, features, coords)
    return (_status_kib("VmHWM") - before) * 1024


def child(args: argparse.Namespace) -> None:
    """Run in a fresh process: set up, take one step, print its peak memory."""
    torch.set_num_threads(1)
    model, features, coords = _setup(args)
    print(json.dumps({"peak_bytes": measure_step(args.child, model, features, coords)}))


def child_args(args: argparse.Namespace) -> list[str]:
    out = ["--seed", str(args.seed), "--batch", str(args.batch), "--pair", str(args.pair)]
    out += ["--blocks", str(args.blocks), "--max-length", str(args.max_length)]
    if args.lengths:
        out += ["--lengths", *map(str, args.lengths)]
    return out


def measure_peaks(script: str, argv: list[str]) -> dict[str, int]:
    """Peak memory of one step of each variant, each in a fresh process (bytes)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    peaks = {}
    for variant in ("ragged", "padded"):
        done = subprocess.run(
            [sys.executable, script, *argv, "--child", variant],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        peaks[variant] = json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]
    return peaks


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run (CI)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pair", type=int, default=32, help="pair channels Cz")
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="*", help="explicit protein lengths")
    parser.add_argument("--check", action="store_true", help="compare ragged and padded outputs")
    parser.add_argument("--child", choices=["ragged", "padded"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.small:
        args.batch, args.max_length, args.pair, args.blocks = 4, 96, 16, 1
    if args.child:
        child(args)
        return
    torch.set_num_threads(1)
    steps = args.steps or (4 if args.small else 10)

    model, features, coords = _setup(args)
    lengths = features.lengths.tolist()
    pairs = features.partition.sum_squares()
    print(f"{len(lengths)} proteins, lengths {lengths}: {pairs} pairs packed vs "
          f"{len(lengths) * max(lengths) ** 2} padded")  # fmt: skip
    if args.check:
        with torch.no_grad():
            got = model(features)
            padded = model.padded(features.to_padded(), features.to_mask())
            want = ragged.from_padded(padded, lengths, pairs=True)
        print(
            f"ragged vs padded: max |difference| {float((got.values - want.values).abs().max()):.2e}"
        )

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    for i in range(steps):
        optimizer.zero_grad()
        loss = step("ragged", model, features, coords)
        optimizer.step()
        if i == 0 or i == steps - 1 or i % 4 == 3:
            print(f"step {i + 1:3d}  loss {float(loss):.4f}")
    print(f"{steps} training steps in {time.perf_counter() - start:.1f} s")

    peaks = measure_peaks(os.path.abspath(__file__), child_args(args))
    bound = pairs * args.pair * 4
    print(
        f"peak memory of one step (RSS, fresh process): ragged {mib(peaks['ragged'])}, "
        f"padded {mib(peaks['padded'])} ({peaks['padded'] / max(peaks['ragged'], 1):.2f}x); "
        f"packed lower bound of one pair tensor (sum N^2 * Cz * 4 B) {mib(bound)}: ragged peak "
        f"= {peaks['ragged'] / bound:.1f} pair tensors, padded = {peaks['padded'] / bound:.1f}"
    )


if __name__ == "__main__":
    main()
