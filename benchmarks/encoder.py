"""A BERT-style encoder on variable-length batches: ragged against padding and the alternatives.

Model: 4 post-norm Transformer encoder layers (d=256, 4 heads, feed-forward 1024, ReLU,
dropout 0), the weights of one ``nn.TransformerEncoder`` shared by every variant. Batches:

* ``B=32`` sequences with skewed lengths in [8, 512] (one of length 512; padded/real ~4.4);
* ``B=512`` short sequences with skewed lengths in [8, 64].

Variants (``--variants`` picks some):

* ``padded``: ``nn.TransformerEncoder`` on the padded batch with ``src_key_padding_mask`` (torch's
  inference fast path disabled, so it computes what it is given);
* ``padded-sdpa``: the same layers written by hand on the padded batch, with
  ``F.scaled_dot_product_attention`` and a key padding mask;
* ``ragged``: ``ragged.nn.RaggedTransformerEncoder`` on a RaggedArray (built per call from host
  lengths, as ``ragged.data.collate`` does: its attention plan is rebuilt every call);
* ``nested``: the hand-written layers on a ``torch.nested`` jagged tensor (NJT) with
  ``F.scaled_dot_product_attention`` (``nn.TransformerEncoderLayer`` rejects NJT inputs outside
  its inference fast path in torch 2.13);
* ``loop``: packed linear layers and layer norms on the concatenated rows, attention as one
  ``F.scaled_dot_product_attention`` per sequence (split, attend, concatenate);
* ``danling``: ``nn.TransformerEncoder`` called on a DanLing ``NestedTensor`` (its handlers pad
  where they need to);
* ``fastpath`` (forward only): ``nn.TransformerEncoder`` in eval mode under ``no_grad`` with
  torch's fast path, which converts the padded batch to a nested tensor internally.

A second model (``--configs gqa-window``) is a decoder-style stack with the attention of recent
LLMs: 8 query heads sharing 2 key/value heads (grouped-query attention), causal, with a sliding
window of 128 keys back (Mistral-style), the same sizes otherwise, on the long skewed batch
(weights of one ``ragged.nn.RaggedTransformerEncoder``):

* ``padded``: hand-written layers on the padded batch, ``F.scaled_dot_product_attention`` with
  ``enable_gqa=True`` and the equivalent dense mask (key padding, causal, window);
* ``ragged``: ``ragged.nn.RaggedTransformerEncoder(..., num_kv_heads=2, causal=True,
  window=(128, 0))``;
* ``ragged-unbanded``: the same with the window cut into bands off (one kernel call per length
  bucket with the window as its mask), to measure the bands;
* ``loop``: packed linear layers, then one SDPA per sequence with its causal window mask.

Its FLOP ratio counts the pairs each query needs (at most 129 keys), against the padded batch's
``B * Lmax^2``.

Each runs eager and, with ``--compile``, under ``torch.compile`` (Inductor) where it compiles;
forward (``no_grad``) and forward+backward (loss = sum of outputs). Times are the median of
``--reps`` runs of CPU time of this process (``time.process_time``: the machine may be shared;
with one thread it equals wall time on an idle machine). One thread by default. With
``--device cuda`` the model and data live on the GPU and the times are wall time, each call
followed by a synchronisation.

The table reports the occupancy (real/padded tokens), the padded/packed FLOP ratio (linear layers
and attention's quadratic term) and every variant's speedup over ``padded`` in the same mode.

Run: ``python benchmarks/encoder.py [--quick] [--no-compile] [--configs mha gqa-window]
[--json out.json]`` (``--quick``: a small smoke run, eager only).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

import ragged
from ragged.bench import add_device_option, synchronize, use_device
from ragged.bench._report import Table, write_result
from ragged.kernels import _attention_blocks as attention_blocks

E, HEADS, FF, LAYERS = 256, 4, 1024, 4
GQA_HEADS, GQA_KV_HEADS, GQA_WINDOW = 8, 2, 128  # the gqa-window model: causal, 128 keys back


# --- data -------------------------------------------------------------------------------------


def skewed_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    """Lengths ``low + (high - low) * u**3.7`` (mostly short, a long tail), one of ``high``."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    lengths = (low + (high - low) * u**3.7).round().long().tolist()
    lengths[int(torch.randint(n, (1,), generator=gen))] = high
    return lengths


def flops(lengths: list[int], padded: bool) -> float:
    """Forward FLOPs of the encoder: linear layers per token, attention per pair."""
    tokens = len(lengths) * max(lengths) if padded else sum(lengths)
    pairs = len(lengths) * max(lengths) ** 2 if padded else sum(n * n for n in lengths)
    linear = 2 * tokens * (4 * E * E + 2 * E * FF)
    attention = 2 * 2 * pairs * E  # q k^T and p v
    return LAYERS * (linear + attention)


def gqa_flops(lengths: list[int], window: int, padded: bool) -> float:
    """Forward FLOPs of the gqa-window model: linear layers per token; attention per pair
    computed (padded: every pair of the padded batch) or needed (a query sees <= window + 1)."""
    tokens = len(lengths) * max(lengths) if padded else sum(lengths)
    if padded:
        pairs = len(lengths) * max(lengths) ** 2
    else:
        pairs = sum(sum(min(i, window) + 1 for i in range(n)) for n in lengths)
    kv = 2 * E * E * GQA_KV_HEADS // GQA_HEADS
    linear = 2 * tokens * (2 * E * E + kv + 2 * E * FF)
    return LAYERS * (linear + 2 * 2 * pairs * E)


# --- hand-written layers (padded, NJT and loop variants share them) ---------------------------


class Weights:
    """The tensors of one ``nn.TransformerEncoderLayer``."""

    def __init__(self, layer: torch.nn.TransformerEncoderLayer) -> None:
        self.in_w, self.in_b = layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias
        self.out_w, self.out_b = layer.self_attn.out_proj.weight, layer.self_attn.out_proj.bias
        self.w1, self.b1 = layer.linear1.weight, layer.linear1.bias
        self.w2, self.b2 = layer.linear2.weight, layer.linear2.bias
        self.n1 = (layer.norm1.weight, layer.norm1.bias)
        self.n2 = (layer.norm2.weight, layer.norm2.bias)


def _norm(x: Any, params: tuple[torch.Tensor, torch.Tensor]) -> Any:
    return F.layer_norm(x, (E,), params[0], params[1])


def _feed_forward(x: Any, w: Any) -> Any:
    return F.linear(F.relu(F.linear(x, w.w1, w.b1)), w.w2, w.b2)


class PaddedSDPA(torch.nn.Module):
    """Post-norm layers on ``[B, L, E]`` with ``F.scaled_dot_product_attention``."""

    def __init__(self, encoder: torch.nn.TransformerEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        mask = keep.view(b, 1, 1, n)
        for layer in self.encoder.layers:
            w = Weights(layer)
            qkv = F.linear(x, w.in_w, w.in_b).view(b, n, 3, HEADS, E // HEADS)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            att = F.linear(att.transpose(1, 2).reshape(b, n, E), w.out_w, w.out_b)
            x = _norm(x + att, w.n1)
            x = _norm(x + _feed_forward(x, w), w.n2)
        return x


class NestedSDPA(torch.nn.Module):
    """Post-norm layers on a jagged NJT ``(B, j, E)``."""

    def __init__(self, encoder: torch.nn.TransformerEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.contiguous().unflatten(-1, [HEADS, E // HEADS]).transpose(1, 2)

        for layer in self.encoder.layers:
            w = Weights(layer)
            q, k, v = F.linear(x, w.in_w, w.in_b).chunk(3, dim=-1)
            att = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
            att = F.linear(att.transpose(1, 2).flatten(-2), w.out_w, w.out_b)
            x = _norm(x + att, w.n1)
            x = _norm(x + _feed_forward(x, w), w.n2)
        return x


class Loop(torch.nn.Module):
    """Packed rows ``[T, E]``; attention one sequence at a time."""

    def __init__(self, encoder: torch.nn.TransformerEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        for layer in self.encoder.layers:
            w = Weights(layer)
            qkv = F.linear(x, w.in_w, w.in_b).view(-1, 3, HEADS, E // HEADS)
            outs = []
            for seq in qkv.split(lengths):
                q, k, v = seq.permute(1, 2, 0, 3).unsqueeze(1).unbind(0)  # [1, H, L, D] each
                outs.append(F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1))
            att = F.linear(torch.cat(outs).reshape(-1, E), w.out_w, w.out_b)
            x = _norm(x + att, w.n1)
            x = _norm(x + _feed_forward(x, w), w.n2)
        return x


class GQAWeights:
    """The tensors of one ``ragged.nn.RaggedTransformerEncoderLayer`` with grouped-query heads."""

    def __init__(self, layer: Any) -> None:
        attn = layer.self_attn
        width = E // GQA_HEADS
        self.split = (E, GQA_KV_HEADS * width, GQA_KV_HEADS * width)
        self.in_w, self.in_b = attn.in_proj_weight, attn.in_proj_bias
        self.out_w, self.out_b = attn.out_proj.weight, attn.out_proj.bias
        self.w1, self.b1 = layer.linear1.weight, layer.linear1.bias
        self.w2, self.b2 = layer.linear2.weight, layer.linear2.bias
        self.n1 = (layer.norm1.weight, layer.norm1.bias)
        self.n2 = (layer.norm2.weight, layer.norm2.bias)


def _heads(t: torch.Tensor) -> torch.Tensor:
    """``[..., L, h * Dh]`` -> ``[..., h, L, Dh]``."""
    return t.unflatten(-1, (-1, E // GQA_HEADS)).transpose(-3, -2)


class PaddedGQA(torch.nn.Module):
    """Post-norm GQA layers on ``[B, L, E]``: SDPA with ``enable_gqa`` and a dense mask."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        for layer in self.model.layers:
            w = GQAWeights(layer)
            q, k, v = (_heads(t) for t in F.linear(x, w.in_w, w.in_b).split(w.split, -1))
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            att = F.linear(att.transpose(1, 2).reshape(b, n, E), w.out_w, w.out_b)
            x = _norm(x + att, w.n1)
            x = _norm(x + _feed_forward(x, w), w.n2)
        return x


class LoopGQA(torch.nn.Module):
    """Packed rows ``[T, E]``; GQA attention one sequence at a time, with its window mask."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, lengths: list[int], masks: list[torch.Tensor]) -> Any:
        for layer in self.model.layers:
            w = GQAWeights(layer)
            outs = []
            for seq, mask in zip(F.linear(x, w.in_w, w.in_b).split(lengths), masks, strict=True):
                q, k, v = (_heads(t) for t in seq.split(w.split, -1))
                att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                outs.append(att.transpose(0, 1).reshape(-1, E))
            att = F.linear(torch.cat(outs), w.out_w, w.out_b)
            x = _norm(x + att, w.n1)
            x = _norm(x + _feed_forward(x, w), w.n2)
        return x


def window_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """bool ``[L, L]``: key ``j`` visible from query ``i`` when ``i - window <= j <= i``."""
    i = torch.arange(length, device=device).view(-1, 1)
    j = torch.arange(length, device=device).view(1, -1)
    return (j <= i) & (j >= i - window)


# --- variants ---------------------------------------------------------------------------------


class Batch:
    """One batch in every representation (built once; the ragged one per call)."""

    def __init__(self, lengths: list[int], seed: int, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.lengths = lengths
        self.values = torch.randn(sum(lengths), E, generator=gen).to(device)
        segments = list(self.values.split(lengths))
        self.padded = torch.nn.utils.rnn.pad_sequence(segments, batch_first=True)
        width = self.padded.shape[1]
        self.keep = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(device)
        self.segments = segments


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


def make_variants(
    encoder: torch.nn.TransformerEncoder, batch: Batch
) -> dict[str, Callable[[Any, bool], torch.Tensor]]:
    """Each variant: ``run(model, grad) -> a tensor of real rows`` (``model`` may be compiled)."""
    ragged_model = ragged.nn.RaggedTransformerEncoder(
        ragged.nn.RaggedTransformerEncoderLayer(E, HEADS, FF, dropout=0.0), LAYERS
    )
    ragged_model.load_state_dict(encoder.state_dict())
    ragged_model.to(batch.values.device).eval()
    models: dict[str, Any] = {
        "padded": encoder,
        "padded-sdpa": PaddedSDPA(encoder),
        "ragged": ragged_model,
        "nested": NestedSDPA(encoder),
        "loop": Loop(encoder),
        "danling": encoder,
        "fastpath": _fast_encoder(encoder),
    }

    def padded(model: Any, grad: bool) -> torch.Tensor:
        return model(_leaf(batch.padded, grad), src_key_padding_mask=~batch.keep)[batch.keep]

    def padded_sdpa(model: Any, grad: bool) -> torch.Tensor:
        return model(_leaf(batch.padded, grad), batch.keep)[batch.keep]

    def ragged_run(model: Any, grad: bool) -> torch.Tensor:
        x = ragged.from_lengths(_leaf(batch.values, grad), batch.lengths)  # a new partition
        return model(x).values

    def nested(model: Any, grad: bool) -> torch.Tensor:
        x = torch.nested.nested_tensor_from_jagged(
            _leaf(batch.values, grad), offsets=_offsets(batch.lengths).to(batch.values.device)
        )
        return model(x).values()

    def loop(model: Any, grad: bool) -> torch.Tensor:
        return model(_leaf(batch.values, grad), batch.lengths)

    def danling(model: Any, grad: bool) -> torch.Tensor:
        from danling import NestedTensor

        x = NestedTensor([_leaf(s, grad) for s in batch.segments])
        return model(x).concat

    def fastpath(model: Any, grad: bool) -> torch.Tensor:
        if grad:
            raise RuntimeError("forward only (inference fast path)")
        with _fastpath(True):
            return model(batch.padded, src_key_padding_mask=~batch.keep)[batch.keep]

    runs = {
        "padded": padded,
        "padded-sdpa": padded_sdpa,
        "ragged": ragged_run,
        "nested": nested,
        "loop": loop,
        "danling": danling,
        "fastpath": fastpath,
    }
    return {name: (models[name], run) for name, run in runs.items()}  # type: ignore[misc]


def make_gqa_variants(batch: Batch, window: int) -> dict[str, Any]:
    """The gqa-window model's variants: ``run(model, grad)``, as ``make_variants``."""
    device = batch.values.device
    layer = ragged.nn.RaggedTransformerEncoderLayer(
        E,
        GQA_HEADS,
        FF,
        dropout=0.0,
        num_kv_heads=GQA_KV_HEADS,
        causal=True,
        window=(window, 0),
    )
    model = ragged.nn.RaggedTransformerEncoder(layer, LAYERS).to(device).eval()
    width = batch.padded.shape[1]
    causal = window_mask(width, window, device)
    # Padded query rows see every key (no row of NaN); their outputs are dropped.
    mask = (batch.keep[:, None, None, :] & causal) | ~batch.keep[:, None, :, None]
    masks = [window_mask(n, window, device) for n in batch.lengths]

    def padded(module: Any, grad: bool) -> torch.Tensor:
        return module(_leaf(batch.padded, grad), mask)[batch.keep]

    def ragged_run(module: Any, grad: bool) -> torch.Tensor:
        x = ragged.from_lengths(_leaf(batch.values, grad), batch.lengths)  # a new partition
        return module(x).values

    def loop(module: Any, grad: bool) -> torch.Tensor:
        return module(_leaf(batch.values, grad), batch.lengths, masks)

    def unbanded(module: Any, grad: bool) -> torch.Tensor:
        return ragged_run(module, grad)

    @contextlib.contextmanager
    def no_bands() -> Iterator[None]:  # forward and backward: one call per bucket, masked
        before = attention_blocks.BAND_GAIN
        attention_blocks.BAND_GAIN = 0.0
        try:
            yield
        finally:
            attention_blocks.BAND_GAIN = before

    unbanded.context = no_bands  # type: ignore[attr-defined]

    return {
        "padded": (PaddedGQA(model), padded),
        "ragged": (model, ragged_run),
        "ragged-unbanded": (model, unbanded),
        "loop": (LoopGQA(model), loop),
    }


def _fast_encoder(encoder: torch.nn.TransformerEncoder) -> torch.nn.TransformerEncoder:
    """The same weights in an encoder that may convert padded input to a nested tensor."""
    layer = torch.nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True)
    fast = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=True)
    fast.load_state_dict(encoder.state_dict())
    return fast.to(next(encoder.parameters()).device).eval()


def _offsets(lengths: list[int]) -> torch.Tensor:
    return F.pad(torch.tensor(lengths).cumsum(0), (1, 0))


class _fastpath:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self.before = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(self.enabled)

    def __exit__(self, *_: Any) -> None:
        torch.backends.mha.set_fastpath_enabled(self.before)


# --- timing -----------------------------------------------------------------------------------


def jobs(model: Any, run: Callable[[Any, bool], torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """The two measured calls of a variant: forward under ``no_grad``, forward+backward (both
    inside the run's ``context``, when it has one)."""
    context = getattr(run, "context", contextlib.nullcontext)

    def forward() -> None:
        with torch.no_grad(), context():
            run(model, False)

    def forward_backward() -> None:
        with context():
            out = run(model, True)
            out.sum().backward()

    return {"fwd": forward, "fwd+bwd": forward_backward}


def _failure(error: Exception) -> str:
    if "forward only" in str(error):
        return "n/a"
    if isinstance(error, ModuleNotFoundError):
        return f"not installed: {error.name}"
    return f"fails: {type(error).__name__}: {str(error).splitlines()[0][:60]}"


def check_outputs(variants: dict[str, Any], names: list[str]) -> dict[str, str]:
    """Max |difference| of every variant's forward against ``padded``."""
    with torch.no_grad():
        model, run = variants["padded"]
        reference = run(model, False)
        notes = {}
        for name in names:
            model, run = variants[name]
            try:
                with getattr(run, "context", contextlib.nullcontext)():
                    out = run(model, False)
                notes[name] = f"{(out - reference).abs().max().item():.1e}"
            except ModuleNotFoundError:
                notes[name] = "-"
            except Exception as error:
                notes[name] = f"fails: {type(error).__name__}"
    return notes


def benchmark(
    name: str, lengths: list[int], args: argparse.Namespace, window: int | None = None
) -> tuple[Table, dict[str, Any]]:
    """One setting: the BERT-style encoder, or with ``window`` the gqa-window model."""
    torch.manual_seed(0)
    batch = Batch(lengths, seed=1, device=args.device)
    if window is None:
        layer = torch.nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True)
        encoder = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        encoder.to(args.device).eval()  # dropout is 0; eval keeps torch's layers from calling it
        variants = make_variants(encoder, batch)
        ratio = flops(lengths, True) / flops(lengths, False)
    else:
        variants = make_gqa_variants(batch, window)
        ratio = gqa_flops(lengths, window, True) / gqa_flops(lengths, window, False)
    names = [v for v in args.variants if v in variants]
    real, padded = sum(lengths), len(lengths) * max(lengths)
    print(
        f"\n## {name}: B={len(lengths)}, lengths {min(lengths)}..{max(lengths)}, "
        f"{real} real tokens; occupancy (real/padded tokens) {real / padded:.3f} "
        f"(padded/real {padded / real:.2f}); padded/packed FLOP ratio {ratio:.2f}; "
        f"{args.threads} thread(s), median of {args.reps}, {args.metric} ms on {args.device}"
    )
    diffs = check_outputs(variants, names)
    modes = ["eager", "compiled"] if args.compile else ["eager"]
    calls: dict[tuple[str, str, str], Callable[[], Any]] = {}
    results: dict[tuple[str, str, str], Any] = {}
    for mode in modes:
        for variant in names:
            model, run = variants[variant]
            if mode == "compiled":
                if variant in ("loop", "fastpath"):
                    continue  # a Python loop over sequences recompiles per batch; fastpath is eager
                model = torch.compile(model, dynamic=True)
            for direction, call in jobs(model, run).items():
                key = (variant, mode, direction)
                started = time.perf_counter()
                try:
                    call()  # warm-up (and compilation)
                    synchronize()
                    calls[key] = call
                except Exception as error:  # report what fails, keep going
                    results[key] = _failure(error)
                elapsed = time.perf_counter() - started
                print(f"   ... {variant} {mode} {direction}: warm-up {elapsed:.1f}s", flush=True)
    # Round robin: every repetition runs every call once, so load changes on a shared machine
    # hit all variants alike.
    times: dict[tuple[str, str, str], list[float]] = {key: [] for key in calls}
    clock = time.process_time if args.metric == "cpu" else time.perf_counter
    for _ in range(args.reps):
        for key, call in calls.items():
            started = clock()
            call()
            synchronize()
            times[key].append(1e3 * (clock() - started))
    for key, values in times.items():
        results[key] = statistics.median(values)
    table = Table(
        f"{name}: B={len(lengths)}, lengths {min(lengths)}..{max(lengths)}, occupancy "
        f"{real / padded:.3f} (padded/real tokens {padded / real:.2f}), padded/packed FLOP ratio "
        f"{ratio:.2f}",
        ["variant", "mode", "fwd ms", "speedup", "fwd+bwd ms", "speedup", "max diff"],
    )
    failures = []
    speedups: dict[tuple[str, str, str], float] = {}
    for mode in modes:
        for variant in names:
            if (variant, mode, "fwd") not in results:
                continue
            cells = []
            for direction in ("fwd", "fwd+bwd"):
                value = results[(variant, mode, direction)]
                base = results.get(("padded", mode, direction))
                if isinstance(value, str):
                    kind = value.split(":")[0] if value.startswith("not installed") else value
                    cells += [kind if kind in ("n/a", "not installed") else "fails", ""]
                    if value != "n/a":
                        failures.append(f"{variant} {mode} {direction}: {value}")
                else:
                    if isinstance(base, float):
                        speedups[(variant, mode, direction)] = base / value
                    speedup = f"{base / value:.2f}x" if isinstance(base, float) else "-"
                    cells += [f"{value:.1f}", speedup]
            table.rows.append([variant, mode, *cells, diffs.get(variant, "-")])
    table.notes += [
        f"{args.threads} thread(s); median {args.metric} time of {args.reps} round-robin runs on "
        f"{args.device}; speedup = "
        "padded / variant in the same mode; max diff: forward against padded (float32).",
        *targets(speedups, ratio),
        *failures,
    ]
    print(table.text(), flush=True)
    plot = {
        "setting": name,
        "flop_ratio": ratio,
        "occupancy": real / padded,
        "speedup": {f"{v} {m} {d}": x for (v, m, d), x in speedups.items()},
    }
    return table, plot


def targets(speedups: dict[tuple[str, str, str], float], ratio: float) -> list[str]:
    """The issue's targets, met or missed, for eager forward+backward."""
    got = speedups.get(("ragged", "eager", "fwd+bwd"))
    if got is None:
        return []
    lines = [
        f"Target: ragged fwd+bwd speedup >= 0.8 x FLOP ratio = {0.8 * ratio:.2f}x: "
        f"{got:.2f}x, {'met' if got >= 0.8 * ratio else 'missed'}."
    ]
    for other in ("loop", "nested", "danling"):
        theirs = speedups.get((other, "eager", "fwd+bwd"))
        if theirs is not None:
            verdict = "ahead" if got > theirs else "behind"
            lines.append(f"ragged vs {other} (fwd+bwd): {got / theirs:.2f}x, {verdict}.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, 1 rep (smoke run)")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run under torch.compile (default: on, off with --quick)",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the result document here")
    all_variants = [
        "padded",
        "padded-sdpa",
        "ragged",
        "ragged-unbanded",
        "nested",
        "loop",
        "danling",
        "fastpath",
    ]
    parser.add_argument("--variants", nargs="+", default=all_variants, choices=all_variants)
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["mha", "gqa-window"],
        choices=["mha", "gqa-window"],
        help="the BERT-style encoder (mha) and/or the grouped-query sliding-window model",
    )
    add_device_option(parser)
    args = parser.parse_args()
    args.device = use_device(args.device)
    args.metric = "cpu" if args.device.type == "cpu" else "wall"
    torch.set_num_threads(args.threads)
    torch.backends.mha.set_fastpath_enabled(False)  # padded means padded (see "fastpath")
    torch._dynamo.config.cache_size_limit = 64  # one module compiled for several input types
    logging.getLogger("torch.nested").setLevel(logging.ERROR)  # NJT SDPA backend notes
    warnings.filterwarnings("ignore", category=UserWarning)
    if args.compile is None:
        args.compile = not args.quick
    settings: list[tuple[str, list[int], int | None]] = []
    if args.quick:
        args.reps = 1
        if "mha" in args.configs:
            settings += [
                ("long", skewed_lengths(8, 8, 128, seed=0), None),
                ("short", skewed_lengths(64, 8, 32, seed=1), None),
            ]
        if "gqa-window" in args.configs:
            settings.append(("GQA + window 32", skewed_lengths(8, 8, 128, seed=0), 32))
    else:
        if "mha" in args.configs:
            settings += [
                ("long, skewed", skewed_lengths(32, 8, 512, seed=0), None),
                ("many short", skewed_lengths(512, 8, 64, seed=1), None),
            ]
        if "gqa-window" in args.configs:
            window = GQA_WINDOW
            settings.append((f"GQA + window {window}", skewed_lengths(32, 8, 512, seed=0), window))
    done = [benchmark(name, lengths, args, window) for name, lengths, window in settings]
    if args.json:
        tables, plots = [t for t, _ in done], [p for _, p in done]
        write_result(
            args.json,
            "encoder",
            tables,
            quick=args.quick,
            metric=args.metric,
            plots={"encoder": plots},
        )


if __name__ == "__main__":
    main()
