"""``F.multi_head_attention_forward`` on RaggedArrays: torch's attention modules run
``ragged.attention``.

``nn.MultiheadAttention`` (``batch_first`` or not), ``nn.TransformerEncoderLayer``,
``nn.TransformerEncoder`` and ``nn.TransformerDecoderLayer`` call it with sequence-first
``(L*, B, E)`` arrays: ``nn.MultiheadAttention(batch_first=True)`` makes that view with
``query.transpose(1, 0)`` and undoes it on the output (metadata only, ``ragged._layout``). The
handler projects the rows (packed or separate weights), splits the heads, runs
``ragged.attention`` within each segment (keys and values of another partition of the same
batch: cross-attention) and projects the output; no padding anywhere.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import _layout as layout
from ..._array import RaggedArray
from ..._versions import check_unchanged
from .._attention import attention
from .._grouping import positions_along
from .._normalization import softmax
from .._pairs import pair_dot
from ._handlers import pair_bias
from ._spelling import display_name, torch_handler

SEQUENCE_FIRST = (
    "must be a sequence-first RaggedArray (L*, B, E), as F.multi_head_attention_forward takes "
    "it (nn.MultiheadAttention(batch_first=True) makes that view of a (B, L*, E) array with "
    "x.transpose(1, 0); with batch_first=False pass x.transpose(0, 1))"
)


def _rows(name: str, x: Any) -> Tensor:
    """The ``[rows, E]`` values of a sequence-first ``(L*, B, E)`` argument."""
    if not isinstance(x, RaggedArray) or x.ndim != 3 or not layout.is_sequence_first(x):
        got = type(x).__name__
        if isinstance(x, RaggedArray):
            kind = "sequence-first" if layout.is_sequence_first(x) else "batch-first"
            got = f"a {kind} RaggedArray of {x.ndim} axes"
        raise TypeError(f"`{name}` {SEQUENCE_FIRST}, got {got}.")
    if not torch.compiler.is_compiling():
        label = display_name(F.multi_head_attention_forward)
        check_unchanged(label, x, names=(name, ""), sequence_first=True)
    return x.values


def _refuse(name: str, value: Any, why: str) -> None:
    if value is not None and value is not False:
        raise TypeError(f"`{name}` {why}, got {type(value).__name__}.")


def _projections(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    same: tuple[bool, bool],
    weights: tuple[Any, Any, Any, Any],
    bias: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """The projected rows: one packed ``F.linear`` for self-attention, as torch's
    ``_in_projection_packed``; separate weights (``use_separate_proj_weight``) otherwise."""
    packed, wq, wk, wv = weights
    if packed is not None:
        if same[0] and same[1]:
            q, k, v = F.linear(q, packed, bias).chunk(3, dim=-1)
            return q, k, v
        wq, wk, wv = packed.chunk(3)
    bq, bk, bv = (None, None, None) if bias is None else bias.chunk(3)
    return F.linear(q, wq, bq), F.linear(k, wk, bk), F.linear(v, wv, bv)


@torch_handler(
    F.multi_head_attention_forward,
    family="attention",
    meaning="sequence-first `(L*, B, E)` query, key and value (what `nn.MultiheadAttention`, "
    "`nn.TransformerEncoderLayer`, `nn.TransformerEncoder` and `nn.TransformerDecoderLayer` "
    "pass): in-projection (packed or separate weights), heads, `ragged.attention` within each "
    "segment (cross-attention for keys of another partition), dropout, out-projection; "
    "`is_causal` needs no `attn_mask`; `attn_mask` a RaggedArray pair map `(B, Lq*, Lk*)` "
    "(True: masked out, as torch; or additive); `need_weights`: the attention weights as a "
    "pair map `(B, Lq*, Lk*)` (averaged) or `(B, H, Lq*, Lk*)`; `key_padding_mask`, dense "
    "masks, `add_bias_kv`, `add_zero_attn` and `static_k`/`static_v` refused",
    see=("ragged.attention", "ragged.nn.RaggedMultiheadAttention"),
    checks=True,
)
def _multi_head_attention_forward(
    query: Any,
    key: Any,
    value: Any,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Any,
    in_proj_bias: Any,
    bias_k: Any,
    bias_v: Any,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Any,
    training: bool = True,
    key_padding_mask: Any = None,
    need_weights: bool = True,
    attn_mask: Any = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Any = None,
    k_proj_weight: Any = None,
    v_proj_weight: Any = None,
    static_k: Any = None,
    static_v: Any = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[RaggedArray, RaggedArray | None]:
    rows = [_rows(n, a) for n, a in (("query", query), ("key", key), ("value", value))]
    _refuse(
        "key_padding_mask",
        key_padding_mask,
        "must be None on RaggedArrays: the partition already says which keys each segment has",
    )
    extra = (
        "is not supported on RaggedArrays (an extra key per segment); build the module without it"
    )
    _refuse("bias_k", bias_k, extra + " (add_bias_kv=False)")
    _refuse("bias_v", bias_v, extra + " (add_bias_kv=False)")
    _refuse("add_zero_attn", add_zero_attn, extra)
    _refuse("static_k", static_k, "is not supported on RaggedArrays: pass the keys as `key`")
    _refuse("static_v", static_v, "is not supported on RaggedArrays: pass the values as `value`")
    embed = rows[0].shape[-1]
    if embed != embed_dim_to_check:
        raise ValueError(
            f"`query` must have embed_dim_to_check={embed_dim_to_check} channels, got {embed}."
        )
    head_dim = embed // num_heads
    if head_dim * num_heads != embed:
        raise ValueError(f"`num_heads` ({num_heads}) must divide the embed_dim {embed}.")
    dropout = dropout_p if training and dropout_p > 0 else None
    if need_weights and dropout is not None:
        raise ValueError(
            "`need_weights`=True with dropout in training is not supported on RaggedArrays (the "
            "weights and the output would draw different dropout masks): pass need_weights=False "
            "or call module.eval()."
        )
    weights = (None if use_separate_proj_weight else in_proj_weight, q_proj_weight)
    projected = _projections(
        rows[0],
        rows[1],
        rows[2],
        (query is key, key is value),
        (*weights, k_proj_weight, v_proj_weight),
        in_proj_bias,
    )
    q, k, v = (
        RaggedArray._trusted(t.unflatten(-1, (num_heads, head_dim)), a.partition, None)
        for t, a in zip(projected, (query, key, value), strict=True)
    )
    bias = _mask(attn_mask, q.values.dtype, num_heads)
    if dropout is not None and dropout >= 1:  # every weight dropped, as torch's dropout(p=1)
        heads = q.values.new_zeros(q.values.shape[0], embed)
    else:
        out = attention(q, k, v, causal=is_causal, bias=bias, dropout_p=dropout)
        heads = out.values.flatten(-2)
    merged = F.linear(heads, out_proj_weight, out_proj_bias)
    result = RaggedArray._trusted(merged, query.partition, None, (0, 2))
    if not need_weights:
        return result, None
    return result, _weights(q, k, bias, is_causal, average_attn_weights)


def _mask(mask: Any, dtype: torch.dtype, heads: int) -> RaggedArray | None:
    """``attn_mask`` (torch's meaning: True masks a pair out) as ``ragged.attention``'s bias
    ``(B, Lq*, Lk*, H)``."""
    if mask is None:
        return None
    if isinstance(mask, RaggedArray) and mask.dtype == torch.bool:
        mask = mask.with_values(~mask.values)  # pair_bias: True attends, as SDPA's
    bias = pair_bias(mask, dtype)
    return RaggedArray._trusted(bias.values.expand(-1, heads), bias.partition, None)


def _weights(
    q: RaggedArray, k: RaggedArray, bias: RaggedArray | None, causal: bool, average: bool
) -> RaggedArray:
    """The attention weights ``softmax(q k^T / sqrt(Dh) + mask)``: a pair map ``(B, Lq*, Lk*)``
    averaged over the heads, or ``(B, H, Lq*, Lk*)`` (the heads before the ragged axes)."""
    scores = pair_dot(q, k, scale=q.values.shape[-1] ** -0.5)  # (B, Lq*, Lk*, H)
    values = scores.values
    if bias is not None:
        values = values + bias.values  # the same pairs in the same order (ragged.outer)
    if causal:
        i = positions_along(scores.partition, 1)
        j = positions_along(scores.partition, 2)
        values = values.masked_fill((j > i)[:, None], float("-inf"))
    weights = softmax(scores.with_values(values), axis=2)
    if average:
        return weights.with_values(weights.values.mean(-1))
    return weights.permute(0, 3, 1, 2)
