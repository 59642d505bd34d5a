"""Model code run unmodified on RaggedArrays: time against padding, ragged.nn, DanLing, a loop.

Two stacks of 4 layers (hidden 256, 4 heads, feed-forward 1024, dropout 0), trained shapes
(forward+backward, loss = sum of the real rows' outputs), on a skewed batch: ``B=32`` log-normal
lengths clipped to 8..512, one of 512.

* ``bert``: HF ``transformers``' ``BertEncoder`` (SDPA attention, post-norm, GELU).
* ``gpt``: a causal pre-norm block stack written in nanoGPT's plain-torch style (fused qkv
  ``split(C, dim=2)``, ``view(B, T, nh, hs).transpose(1, 2)``, SDPA with ``is_causal``).

Variants, all with the same weights:

* ``padded``: the module on the padded batch. BERT takes its attention mask (built by
  ``transformers.masking_utils.create_bidirectional_mask`` from the 0/1 padding mask, as
  ``BertModel`` does); the causal stack needs none: with right padding, a real query never sees a
  padded key, so ``is_causal`` is the mask. The real rows' outputs are kept.
* ``ragged``: the same module object called with a ``(B, L*, 256)`` RaggedArray (built per call
  with ``ragged.from_lengths``, as a data loader would hand it over).
* ``ragged.nn``: the same weights in ``ragged.nn.RaggedTransformerEncoder`` (post-norm GELU for
  BERT; ``norm_first=True, causal=True`` for the GPT stack), the library's own layers.
* ``danling``: the same module called with a DanLing ``NestedTensor`` (skipped without danling).
* ``loop``: the same module called on each sequence as a ``(1, L, 256)`` tensor.

Times: median of ``--reps`` round-robin rounds (every variant once per round, so that load on a
shared machine hits all alike) of this process's CPU time, one thread. The FLOP ratio counts the
linear layers per token and attention's two products per (query, key) pair that the kernel
computes (causal: pairs on and below the diagonal) for the padded batch over the packed one.

Run: ``python benchmarks/model_stacks.py [--quick] [--reps 5] [--models bert gpt] [--json out]``
(``--quick``: B=8, lengths 8..64, one round; needs ``transformers`` for the BERT rows).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import ragged
from ragged.bench._report import Table, write_result

E, HEADS, FF, LAYERS = 256, 4, 1024, 4
VARIANTS = ["padded", "ragged", "ragged.nn", "danling", "loop"]


def lognormal_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    """``n`` lengths ``exp(N(log 64, 1))`` clipped to ``[low, high]``, one of them ``high``."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(64) + torch.randn(n, generator=gen, dtype=torch.float64))
    lengths = raw.clamp(low, high).round().long().tolist()
    lengths[int(torch.randint(n, (1,), generator=gen))] = high
    return lengths


def flops(lengths: list[int], *, padded: bool, causal: bool) -> float:
    """Forward FLOPs of one stack: linear layers per token, two products per attended pair."""
    width = max(lengths)
    sizes = [width] * len(lengths) if padded else lengths
    pairs = sum(n * (n + 1) // 2 if causal else n * n for n in sizes)
    linear = 2 * sum(sizes) * (4 * E * E + 2 * E * FF)
    return LAYERS * (linear + 2 * 2 * pairs * E)


# --- the nanoGPT-style stack (plain torch, nothing of ragged) ----------------------------------


class CausalSelfAttention(nn.Module):
    """Causal self-attention as nanoGPT writes it: fused qkv, heads by view + transpose, SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(E, 3 * E)
        self.c_proj = nn.Linear(E, E)

    def forward(self, x: Any) -> Any:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    """A pre-norm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(E), nn.LayerNorm(E)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(E, FF), nn.GELU(), nn.Linear(FF, E))

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# --- the same weights in ragged.nn layers -------------------------------------------------------


def _ragged_layer(params: dict[str, torch.Tensor], *, norm_first: bool, eps: float) -> nn.Module:
    layer = ragged.nn.RaggedTransformerEncoderLayer(
        E,
        HEADS,
        FF,
        dropout=0.0,
        activation="gelu",
        layer_norm_eps=eps,
        norm_first=norm_first,
        causal=norm_first,
    )
    layer.load_state_dict(params)
    return layer


def ragged_nn_bert(encoder: nn.Module) -> nn.Module:
    """``RaggedTransformerEncoder`` computing what the HF ``BertEncoder`` computes."""
    layers = []
    for bert in encoder.layer:
        attn = bert.attention
        parts = (attn.self.query, attn.self.key, attn.self.value)
        params = {
            "self_attn.in_proj_weight": torch.cat([p.weight for p in parts]),
            "self_attn.in_proj_bias": torch.cat([p.bias for p in parts]),
            "self_attn.out_proj.weight": attn.output.dense.weight,
            "self_attn.out_proj.bias": attn.output.dense.bias,
            "norm1.weight": attn.output.LayerNorm.weight,
            "norm1.bias": attn.output.LayerNorm.bias,
            "linear1.weight": bert.intermediate.dense.weight,
            "linear1.bias": bert.intermediate.dense.bias,
            "linear2.weight": bert.output.dense.weight,
            "linear2.bias": bert.output.dense.bias,
            "norm2.weight": bert.output.LayerNorm.weight,
            "norm2.bias": bert.output.LayerNorm.bias,
        }
        eps = attn.output.LayerNorm.eps
        layers.append(_ragged_layer(params, norm_first=False, eps=eps))
    return _stack(layers)


def ragged_nn_gpt(blocks: nn.Sequential) -> nn.Module:
    """``RaggedTransformerEncoder(norm_first, causal)`` computing what the block stack does."""
    layers = []
    for block in blocks:
        params = {
            "self_attn.in_proj_weight": block.attn.c_attn.weight,
            "self_attn.in_proj_bias": block.attn.c_attn.bias,
            "self_attn.out_proj.weight": block.attn.c_proj.weight,
            "self_attn.out_proj.bias": block.attn.c_proj.bias,
            "norm1.weight": block.ln_1.weight,
            "norm1.bias": block.ln_1.bias,
            "linear1.weight": block.mlp[0].weight,
            "linear1.bias": block.mlp[0].bias,
            "linear2.weight": block.mlp[2].weight,
            "linear2.bias": block.mlp[2].bias,
            "norm2.weight": block.ln_2.weight,
            "norm2.bias": block.ln_2.bias,
        }
        layers.append(_ragged_layer(params, norm_first=True, eps=block.ln_1.eps))
    return _stack(layers)


def _stack(layers: list[nn.Module]) -> nn.Module:
    stack = ragged.nn.RaggedTransformerEncoder(layers[0], len(layers))
    stack.layers = nn.ModuleList(layers)
    return stack.eval()


# --- the variants -------------------------------------------------------------------------------


class Batch:
    """One batch of random rows: packed values, per-sequence tensors, padded with its mask."""

    def __init__(self, lengths: list[int], seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.lengths = lengths
        self.values = torch.randn(sum(lengths), E, generator=gen)
        self.padded = nn.utils.rnn.pad_sequence(list(self.values.split(lengths)), batch_first=True)
        width = self.padded.shape[1]
        self.keep = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]

    def leaf(self, grad: bool, padded: bool = False) -> torch.Tensor:
        return (self.padded if padded else self.values).detach().requires_grad_(grad)


Run = Callable[[bool], torch.Tensor]


def bert_variants(batch: Batch) -> dict[str, Run]:
    """Each variant of the BERT stack: ``run(grad) -> the real rows' outputs (T, E)``."""
    import transformers
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.models.bert.modeling_bert import BertEncoder

    config = transformers.BertConfig(
        hidden_size=E,
        num_attention_heads=HEADS,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    encoder = BertEncoder(config).eval()
    mine = ragged_nn_bert(encoder)
    attention_mask = batch.keep.long()

    def padded(grad: bool) -> torch.Tensor:
        x = batch.leaf(grad, padded=True)
        mask = create_bidirectional_mask(
            config=config, inputs_embeds=x, attention_mask=attention_mask
        )
        return encoder(x, attention_mask=mask).last_hidden_state[batch.keep]

    def ragged_run(grad: bool) -> torch.Tensor:
        x = ragged.from_lengths(batch.leaf(grad), batch.lengths)
        return encoder(x).last_hidden_state.values

    def ragged_nn(grad: bool) -> torch.Tensor:
        return mine(ragged.from_lengths(batch.leaf(grad), batch.lengths)).values

    def danling(grad: bool) -> torch.Tensor:
        from danling import NestedTensor

        return encoder(
            NestedTensor(list(batch.leaf(grad).split(batch.lengths)))
        ).last_hidden_state.concat

    def loop(grad: bool) -> torch.Tensor:
        parts = batch.leaf(grad).split(batch.lengths)
        return torch.cat([encoder(s[None]).last_hidden_state[0] for s in parts])

    return {
        "padded": padded,
        "ragged": ragged_run,
        "ragged.nn": ragged_nn,
        "danling": danling,
        "loop": loop,
    }


def gpt_variants(batch: Batch) -> dict[str, Run]:
    """Each variant of the nanoGPT-style causal stack, as ``bert_variants``."""
    blocks = nn.Sequential(*[Block() for _ in range(LAYERS)]).eval()
    mine = ragged_nn_gpt(blocks)

    def padded(grad: bool) -> torch.Tensor:
        return blocks(batch.leaf(grad, padded=True))[batch.keep]

    def ragged_run(grad: bool) -> torch.Tensor:
        return blocks(ragged.from_lengths(batch.leaf(grad), batch.lengths)).values

    def ragged_nn(grad: bool) -> torch.Tensor:
        return mine(ragged.from_lengths(batch.leaf(grad), batch.lengths)).values

    def danling(grad: bool) -> torch.Tensor:
        from danling import NestedTensor

        return blocks(NestedTensor(list(batch.leaf(grad).split(batch.lengths)))).concat

    def loop(grad: bool) -> torch.Tensor:
        parts = batch.leaf(grad).split(batch.lengths)
        return torch.cat([blocks(s[None])[0] for s in parts])

    return {
        "padded": padded,
        "ragged": ragged_run,
        "ragged.nn": ragged_nn,
        "danling": danling,
        "loop": loop,
    }


# --- timing -------------------------------------------------------------------------------------


def step(run: Run) -> Callable[[], None]:
    """Forward+backward of one variant (the loss: the sum of the real rows' outputs)."""

    def call() -> None:
        run(True).sum().backward()

    return call


def differences(variants: dict[str, Run]) -> dict[str, str]:
    """Max |difference| of each variant's forward against ``padded`` (float32)."""
    with torch.no_grad():
        reference = variants["padded"](False)
        return {
            name: f"{(run(False) - reference).abs().max():.1e}" for name, run in variants.items()
        }


def available(names: list[str]) -> list[str]:
    """The variants this environment can run (``danling`` needs the package)."""
    return [n for n in names if n != "danling" or importlib.util.find_spec("danling") is not None]


def benchmark(
    model: str, lengths: list[int], reps: int, names: list[str]
) -> tuple[Table, dict[str, Any]]:
    """Time every variant of ``model`` on one batch, round robin; the table and the plot data."""
    torch.manual_seed(0)
    batch = Batch(lengths, seed=1)
    variants = (bert_variants if model == "bert" else gpt_variants)(batch)
    variants = {n: variants[n] for n in ["padded", *names] if n in variants}
    causal = model == "gpt"
    ratio = flops(lengths, padded=True, causal=causal) / flops(lengths, padded=False, causal=causal)
    diffs = differences(variants)
    calls = {name: step(run) for name, run in variants.items()}
    for name, call in calls.items():  # warm-up
        started = time.perf_counter()
        call()
        print(f"   ... {model} {name}: warm-up {time.perf_counter() - started:.1f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            started = time.process_time()
            call()
            times[name].append(1e3 * (time.process_time() - started))
    ms = {name: statistics.median(values) for name, values in times.items()}
    real, padded = sum(lengths), len(lengths) * max(lengths)
    title = (
        f"{'HF BertEncoder' if model == 'bert' else 'nanoGPT-style causal block stack'}, "
        f"{LAYERS} layers: B={len(lengths)}, lengths {min(lengths)}..{max(lengths)}, "
        f"padded/real tokens {padded / real:.2f}, padded/packed FLOP ratio {ratio:.2f}"
    )
    table = Table(
        title, ["variant", "fwd+bwd ms", "padded / variant", "ragged / variant", "max diff"]
    )
    for name, value in ms.items():
        table.rows.append(
            [
                name,
                f"{value:.0f}",
                f"{ms['padded'] / value:.2f}x",
                f"{ms['ragged'] / value:.2f}x" if "ragged" in ms else "-",
                diffs[name],
            ]
        )
    table.notes += [
        f"1 thread; median CPU time of {reps} round-robin rounds; forward+backward, float32.",
        *verdicts(ms, ratio, causal),
    ]
    print(table.text(), flush=True)
    return table, {"model": model, "flop_ratio": ratio, "ms": ms}


def verdicts(ms: dict[str, float], ratio: float, causal: bool) -> list[str]:
    """The issue's targets, met or missed."""
    if "ragged" not in ms:
        return []
    speedup = ms["padded"] / ms["ragged"]
    lines = [
        f"Target: ragged over padded >= 0.8 x FLOP ratio = {0.8 * ratio:.2f}x: {speedup:.2f}x, "
        f"{'met' if speedup >= 0.8 * ratio else 'missed'}."
    ]
    if "ragged.nn" in ms:
        over = ms["ragged"] / ms["ragged.nn"]
        verdict = "met" if over <= 1.1 else "missed"
        lines.append(f"Target: ragged within 1.1x the time of ragged.nn: {over:.2f}x, {verdict}.")
    for other in ["danling", "loop"]:
        if other in ms:
            ahead = ms[other] / ms["ragged"]
            verdict = "ahead" if ahead > 1 else "behind"
            lines.append(f"Target: ragged ahead of {other}: {ahead:.2f}x, {verdict}.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B=8, lengths 8..64, one round")
    parser.add_argument("--reps", type=int, default=5, help="round-robin rounds (default 5)")
    parser.add_argument("--models", nargs="+", default=["bert", "gpt"], choices=["bert", "gpt"])
    parser.add_argument("--variants", nargs="+", default=VARIANTS[1:], choices=VARIANTS[1:])
    parser.add_argument("--json", help="write the result document here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    lengths = (
        lognormal_lengths(8, 8, 64, seed=0) if args.quick else lognormal_lengths(32, 8, 512, seed=0)
    )
    reps = 1 if args.quick else args.reps
    models = [m for m in args.models if m == "gpt" or importlib.util.find_spec("transformers")]
    done = [benchmark(m, lengths, reps, available(args.variants)) for m in models]
    if args.json:
        tables, plots = [t for t, _ in done], [p for _, p in done]
        write_result(
            args.json,
            "model_stacks",
            tables,
            quick=args.quick,
            metric="cpu",
            plots={"model_stacks": plots},
        )


if __name__ == "__main__":
    main()
