"""Op table entries: variable-length attention (``ragged.ops._attention``).

The reference is ``F.scaled_dot_product_attention`` on each segment transposed to
``(H, L, Dh)``; a segment with no queries gives an empty result and a query row whose segment has
no keys gives 0 (see ``docs/semantics.md`` (section "Attention semantics")).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import ragged

from . import ErrorCase, OpInfo, Sample, ragged_randn, randn

HEADS, WIDTH = 2, 3


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Any = None,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """One segment: SDPA on ``(H, L, Dh)``; ``bias`` is the segment's ``(Lq, Lk, H)`` pair block.

    The table hands out a square pair map's segment as its dense block and a cross one (``Lq !=
    Lk`` somewhere) as a RaggedArray ``(Lq, Lk*, H)``; both carry the same values in row order.
    """
    nq, nk, heads = q.shape[0], k.shape[0], q.shape[1]
    if nq == 0 or nk == 0:
        return q.new_zeros((nq, heads, v.shape[-1]))
    mask = None
    if bias is not None:
        block = bias.values if isinstance(bias, ragged.RaggedArray) else bias
        mask = block.reshape(nq, nk, heads).permute(2, 0, 1)
        if causal:  # SDPA takes a mask or is_causal, not both
            above = torch.ones(nq, nk, dtype=torch.bool).triu(1)
            mask, causal = mask.masked_fill(above, float("-inf")), False
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
    )
    return out.transpose(0, 1)


def pair_bias(
    q: ragged.RaggedArray, k: ragged.RaggedArray, values: torch.Tensor
) -> ragged.RaggedArray:
    """A pair map ``(B, Lq*, Lk*, H)`` over the segments of ``q`` and ``k``."""
    partition = ragged.Partition.outer(q.partition.levels[0], k.partition.levels[0])
    return ragged.RaggedArray(values, partition)


def cross_lengths(lengths: list[int]) -> list[int]:
    """Key lengths for cross-attention: different from the query lengths, some empty."""
    return [(3 * n + 2) % 6 for n in lengths]


def _qkv(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> tuple[ragged.RaggedArray, ragged.RaggedArray, ragged.RaggedArray]:
    q = ragged_randn(lengths, (HEADS, WIDTH), gen, dtype, layout)
    k = q.with_values(randn(q.values.shape, gen, dtype, layout))
    v = q.with_values(randn(q.values.shape, gen, dtype, layout))
    return q, k, v


def attention_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    q, k, v = _qkv(lengths, gen, dtype, layout)
    keys = ragged_randn(cross_lengths(lengths), (HEADS, WIDTH), gen, dtype, layout)
    values = keys.with_values(randn((keys.values.shape[0], HEADS, 4), gen, dtype, layout))
    named = [x.rename("batch", "seq", "head", "feat") for x in (q, k, v)]
    return [
        Sample("self", (q, k, v)),
        Sample("causal", (q, k, v), {"causal": True}),
        Sample("scale", (q, k, v), {"scale": 0.7}),
        Sample("cross", (q, keys, values)),
        Sample(
            "self_values_width", (q, k, q.with_values(randn((len(q.values), HEADS, 4), gen, dtype)))
        ),
        Sample("named", tuple(named), {"causal": True}),
    ]


def attention_bias_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    q, k, v = _qkv(lengths, gen, dtype, layout)
    pairs = sum(n * n for n in lengths)
    bias = pair_bias(q, q, randn((pairs, HEADS), gen, dtype, layout))
    keys = ragged_randn(cross_lengths(lengths), (HEADS, WIDTH), gen, dtype, layout)
    cross = sum(a * b for a, b in zip(lengths, cross_lengths(lengths), strict=True))
    cross_bias = pair_bias(q, keys, randn((cross, HEADS), gen, dtype, layout))
    return [
        Sample("self", (q, k, v, bias)),
        Sample("causal", (q, k, v, bias), {"causal": True}),
        Sample("cross", (q, keys, keys, cross_bias)),
    ]


def attention_with_bias(
    q: ragged.RaggedArray,
    k: ragged.RaggedArray,
    v: ragged.RaggedArray,
    bias: ragged.RaggedArray,
    **kwargs: Any,
) -> ragged.RaggedArray:
    """``ragged.attention`` with the bias positional, so the table hands it out per segment."""
    return ragged.attention(q, k, v, bias=bias, **kwargs)


X = ragged.from_lengths(torch.ones(3, 2, 4), [1, 2])  # (2, [1, 2], 2, 4)
Y = ragged.from_lengths(torch.ones(4, 2, 4), [3, 1])  # other partition, same B
Z = ragged.from_lengths(torch.ones(3, 2, 4), [1, 1, 1])  # other B
BIAS = pair_bias(X, X, torch.zeros(5, 2))
FUNC = "ragged.attention"

ERRORS = [
    ErrorCase(
        lambda: ragged.attention(X.values, X, X),
        TypeError,
        f"{FUNC}: `q` must be a RaggedArray, got Tensor(shape=(3, 2, 4), dtype=torch.float32).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X[..., 0], X),
        ValueError,
        f"{FUNC}: `k` must have shape (B, L*, H, Dh), got (2, [1, 2], 2).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X.to(torch.float64), X),
        TypeError,
        f"{FUNC}: `k` must have the dtype of `q` (torch.float32), got torch.float64.",
    ),
    ErrorCase(
        lambda: ragged.attention(X.to(torch.int64), X.to(torch.int64), X.to(torch.int64)),
        TypeError,
        f"{FUNC}: `q` must have a floating-point dtype, got torch.int64.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, Z, Z),
        ValueError,
        f"{FUNC}: `k` must have the batch size of `q` (2), got 3.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, Y),
        ValueError,
        f"{FUNC}: `v` must have the partition of `k` (keys and values pair up row by row), "
        "got k (2, [1, 2], 2, 4) and v (2, [3, 1], 2, 4).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X.with_values(torch.ones(3, 2, 5)), X),
        ValueError,
        f"{FUNC}: `k` must have the heads and head width of `q` (2, 4), got (2, 5).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X.with_values(torch.ones(3, 1, 4))),
        ValueError,
        f"{FUNC}: `v` must have the heads of `q` (2), got 1.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, Y, Y, causal=True),
        ValueError,
        f"{FUNC}: `causal` needs self-attention: q and k with equal partitions, "
        "got q (2, [1, 2], 2, 4) and k (2, [3, 1], 2, 4).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, scale="big"),
        TypeError,
        f"{FUNC}: `scale` must be a float or None, got str.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, dropout_p=1.0),
        ValueError,
        f"{FUNC}: `dropout_p` must be in [0, 1), got 1.0.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, bias=torch.zeros(5, 2)),
        TypeError,
        f"{FUNC}: `bias` must be a RaggedArray or None, got Tensor(shape=(5, 2), dtype=torch.float32).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, bias=X),
        ValueError,
        f"{FUNC}: `bias` must have shape (B, Lq*, Lk*, H) with H = 2, got (2, [1, 2], 2, 4).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, bias=BIAS.to(torch.float64)),
        TypeError,
        f"{FUNC}: `bias` must have the dtype of `q` (torch.float32), got torch.float64.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, Y, Y, bias=BIAS),
        ValueError,
        f"{FUNC}: `bias` {ragged.ops._attention.BIAS_PARTITION}, "
        "got (2, [1, 2], [[1], [2, 2]], 2).",
    ),
]


OPS = [
    OpInfo(
        name="attention",
        op=ragged.attention,
        reference=attention_reference,
        samples=attention_samples,
        errors=ERRORS,
    ),
    OpInfo(
        name="attention",
        variant="bias",
        op=attention_with_bias,
        reference=attention_reference,
        samples=attention_bias_samples,
    ),
]
