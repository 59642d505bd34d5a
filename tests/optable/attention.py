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

from . import ErrorCase, OpInfo, PerSegment, Sample, ragged_randn, randn

HEADS, WIDTH = 2, 3


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Any = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: Any = None,
    alibi: torch.Tensor | None = None,
    relative_bias: Any = None,
    documents: torch.Tensor | None = None,
    prefix: Any = None,
    score_mod: Any = None,
    mask_mod: Any = None,
    segment: Any = None,
) -> torch.Tensor:
    """One segment: SDPA on ``(H, L, Dh)`` with the equivalent dense mask and bias.

    ``bias`` is the segment's ``(Lq, Lk, H)`` pair block (the table hands out a square pair
    map's segment as its dense block and a cross one as a RaggedArray ``(Lq, Lk*, H)``; both
    carry the same values in row order). The variants become a dense ``[H, Lq, Lk]`` additive
    mask; ``documents`` are the segment's ids, ``prefix`` its prefix length and ``segment`` its
    index ``b``. With a ``score_mod`` or ``mask_mod`` the scores are computed explicitly (a
    score modification is no mask).
    """
    nq, nk, heads = q.shape[0], k.shape[0], q.shape[1]
    if nq == 0 or nk == 0:
        return q.new_zeros((nq, heads, v.shape[-1]))
    i = torch.arange(nq).view(-1, 1)
    j = torch.arange(nk).view(1, -1)
    add = q.new_zeros((heads, nq, nk))
    keep = torch.ones(nq, nk, dtype=torch.bool)
    if bias is not None:
        block = bias.values if isinstance(bias, ragged.RaggedArray) else bias
        add = add + block.reshape(nq, nk, heads).permute(2, 0, 1)
    if causal:
        keep &= (j <= i) | (j < prefix if prefix is not None else False)
    if window is not None:
        left, right = window
        keep &= (j >= i - left) if left is not None else True
        keep &= (j <= i + right) if right is not None else True
    if documents is not None:
        keep &= documents.view(-1, 1) == documents.view(1, -1)
    if alibi is not None:
        add = add - alibi.view(-1, 1, 1) * (j - i).abs()
    if relative_bias is not None:
        distance = j - i
        if callable(relative_bias) and not isinstance(relative_bias, torch.Tensor):
            table = relative_bias(distance.reshape(-1)).reshape(nq, nk, heads)
        else:
            radius = (relative_bias.shape[0] - 1) // 2
            table = relative_bias[distance.clamp(-radius, radius) + radius]
        add = add + table.permute(2, 0, 1)
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if score_mod is None and mask_mod is None:
        out = F.scaled_dot_product_attention(
            qh,
            kh,
            vh,
            attn_mask=add.masked_fill(~keep, float("-inf")),
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(0, 1)
    groups = heads // k.shape[1]
    kh, vh = kh.repeat_interleave(groups, 0), vh.repeat_interleave(groups, 0)
    scores = qh @ kh.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    scores = scores + add
    h = torch.arange(heads).view(-1, 1, 1)
    if score_mod is not None:
        scores = score_mod(scores, segment, h, i, j)
    if mask_mod is not None:
        keep = keep & mask_mod(segment, h, i, j)
    scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)  # fully hidden rows: 0
    return (weights @ vh).transpose(0, 1)


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


KV_HEADS = 2  # grouped-query samples: 4 query heads share 2 key/value heads


def _grouped(
    lengths: list[int],
    gen: torch.Generator,
    dtype: torch.dtype,
    layout: str,
    kv_heads: int,
    heads: int = 2 * KV_HEADS,
    width: int = WIDTH,
) -> tuple[ragged.RaggedArray, ragged.RaggedArray, ragged.RaggedArray]:
    """``q`` ``(B, L*, heads, width)`` and ``k``, ``v`` ``(B, L*, kv_heads, width)`` on ``q``'s
    partition."""
    q = ragged_randn(lengths, (heads, width), gen, dtype, layout)
    shape = (q.values.shape[0], kv_heads, width)
    k = ragged.RaggedArray(randn(shape, gen, dtype, layout), q.partition)
    v = ragged.RaggedArray(randn(shape, gen, dtype, layout), q.partition)
    return q, k, v


def gqa_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    q, k, v = _grouped(lengths, gen, dtype, layout, KV_HEADS, width=2)
    _, k1, v1 = _grouped(lengths, gen, dtype, layout, 1, width=2)
    keys = ragged_randn(cross_lengths(lengths), (KV_HEADS, 2), gen, dtype, layout)
    values = keys.with_values(randn((keys.values.shape[0], KV_HEADS, 3), gen, dtype, layout))
    return [
        Sample("window_causal", (q, k, v), {"causal": True, "window": (1, None)}),
        Sample("mqa_window", (q, k1, v1), {"window": (2, 1)}),
        Sample("cross", (q, keys, values)),
    ]


def attention_variants(
    q: ragged.RaggedArray,
    k: ragged.RaggedArray,
    v: ragged.RaggedArray,
    segment: torch.Tensor,
    prefix: torch.Tensor,
    documents: ragged.RaggedArray,
    *,
    use_documents: bool = False,
    use_prefix: bool = False,
    **kwargs: Any,
) -> ragged.RaggedArray:
    """``ragged.attention`` with per-segment data positional (the table hands the reference
    segment ``b``'s index, prefix length and document ids)."""
    return ragged.attention(
        q,
        k,
        v,
        document_ids=documents if use_documents else None,
        prefix=prefix if use_prefix else None,
        **kwargs,
    )


def variants_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segment: torch.Tensor,
    prefix: torch.Tensor,
    documents: torch.Tensor,
    *,
    use_documents: bool = False,
    use_prefix: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    return attention_reference(
        q,
        k,
        v,
        documents=documents if use_documents else None,
        prefix=prefix if use_prefix else None,
        segment=segment,
        **kwargs,
    )


def _per_segment(
    lengths: list[int], gen: torch.Generator, q: ragged.RaggedArray
) -> tuple[PerSegment, PerSegment, ragged.RaggedArray]:
    """Segment indices, prefix lengths (some past the segment) and document ids (runs)."""
    index = PerSegment(torch.arange(len(lengths)))
    prefix = PerSegment(torch.randint(0, 5, (len(lengths),), generator=gen))
    runs = torch.randint(0, 2, (q.values.shape[0],), generator=gen).cumsum(0)
    return index, prefix, ragged.RaggedArray(runs % 3, q.partition)


def positional_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    # Two query heads over one key/value head, head width 2: small for gradcheck.
    q, k, v = _grouped(lengths, gen, dtype, layout, 1, heads=2, width=2)
    heads = q.values.shape[1]
    extra = _per_segment(lengths, gen, q)
    slopes = torch.rand(heads, generator=gen, dtype=torch.float64).to(dtype)
    table = torch.randn(5, heads, generator=gen, dtype=torch.float64).to(dtype)
    weights = torch.randn(7, heads, generator=gen, dtype=torch.float64).to(dtype)

    def buckets(d: torch.Tensor) -> torch.Tensor:  # T5-like: log-spaced buckets of a table
        sign = torch.where(d < 0, 0, 3)
        index = sign + torch.log2(d.abs().clamp_min(1).double()).floor().long().clamp_max(2)
        return weights.to(d.device)[index]  # the device tests move the arrays, not closures

    args = (q, k, v, *extra)
    return [
        Sample(
            "combined",
            args,
            {
                "causal": True,
                "window": (3, None),
                "alibi": slopes,
                "relative_bias": table,
                "use_documents": True,
                "use_prefix": True,
            },
        ),
        Sample("alibi_window", args, {"alibi": slopes, "window": (2, 1)}),
        Sample("relative_callable", args, {"relative_bias": buckets, "use_documents": True}),
    ]


def mods_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    q, k, v = _grouped(lengths, gen, dtype, layout, 1, heads=2, width=2)
    heads = q.values.shape[1]
    extra = _per_segment(lengths, gen, q)
    gains = torch.rand(heads, generator=gen, dtype=torch.float64).to(dtype) + 0.5

    def softcap(score, b, h, i, j):  # tanh soft-capping, a per-head gain, a per-segment shift
        gain = gains.to(score.device)[h]  # the device tests move the arrays, not closures
        return 2.0 * torch.tanh(score * gain / 2.0) + 0.1 * b - 0.05 * (i - j).abs()

    def checker(b, h, i, j):  # a strided pattern that keeps the diagonal
        return ((i + j + h + b) % 3 != 1) | (i == j)

    args = (q, k, v, *extra)
    return [
        Sample("score_mod", args, {"score_mod": softcap, "mask_mod": checker, "causal": True}),
        Sample("mask_mod", args, {"mask_mod": checker, "window": (1, 1), "alibi": gains}),
    ]


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
        f"{FUNC}: `k` must have the head width of `q` (4), got 5.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X.with_values(torch.ones(3, 3, 4)), X),
        ValueError,
        f"{FUNC}: `k` must have a number of heads dividing the heads of `q` (2), got 3.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X.with_values(torch.ones(3, 1, 4))),
        ValueError,
        f"{FUNC}: `v` must have the heads of `k` (2), got 1.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, window=3),
        TypeError,
        f"{FUNC}: `window` must be a pair (left, right) of non-negative ints or None, got int.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, window=(-1, 2)),
        ValueError,
        f"{FUNC}: `window` must be a pair (left, right) of non-negative ints or None, got (-1, 2).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, Y, Y, window=(1, 1)),
        ValueError,
        f"{FUNC}: `window` {ragged.ops._attention_variants.SELF_ONLY}, got two partitions.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, alibi=torch.ones(3)),
        ValueError,
        f"{FUNC}: `alibi` must have shape [H] with H = 2, got (3,).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, alibi=[0.5, 0.25]),
        TypeError,
        f"{FUNC}: `alibi` must be a tensor [H] with H = 2, got list.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, relative_bias=torch.ones(4, 2)),
        ValueError,
        f"{FUNC}: `relative_bias` must have shape [2R + 1, H] with H = 2, got (4, 2).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, relative_bias=lambda d: d),
        ValueError,
        f"{FUNC}: `relative_bias` must return a floating tensor [len(distances), H] with "
        "H = 2, got (3,).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, document_ids=X[..., 0, 0]),
        TypeError,
        f"{FUNC}: `document_ids` must have an integer dtype, got torch.float32.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, document_ids=ragged.array([[1], [2, 2, 3]])),
        ValueError,
        f"{FUNC}: `document_ids` must have the partition of `q` (one id per query row), "
        "got q (2, [1, 2], 2, 4) and document_ids (2, [1, 3]).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, prefix=2),
        ValueError,
        f"{FUNC}: `prefix` needs causal=True (prefix-LM: bidirectional in the prefix, causal "
        "after), got causal=False.",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, causal=True, prefix=torch.tensor([1, 2, 3])),
        ValueError,
        f"{FUNC}: `prefix` must have one entry per segment (2), got torch.Size([3]).",
    ),
    ErrorCase(
        lambda: ragged.attention(X, X, X, score_mod=3),
        TypeError,
        f"{FUNC}: `score_mod` must be a callable or None, got int.",
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
        f"{FUNC}: `bias` {ragged.ops._attention_checks.BIAS_PARTITION}, "
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
        fast_gradcheck=True,
    ),
    OpInfo(
        name="attention",
        variant="bias",
        op=attention_with_bias,
        reference=attention_reference,
        samples=attention_bias_samples,
        fast_gradcheck=True,
    ),
    OpInfo(
        name="attention",
        variant="gqa",
        op=ragged.attention,
        reference=attention_reference,
        samples=gqa_samples,
        fast_gradcheck=True,
    ),
    OpInfo(
        name="attention",
        variant="positional",
        op=attention_variants,
        reference=variants_reference,
        samples=positional_samples,
        fast_gradcheck=True,
    ),
    OpInfo(
        name="attention",
        variant="mods",
        op=attention_variants,
        reference=variants_reference,
        samples=mods_samples,
        fast_gradcheck=True,
    ),
]
