"""Attention within one bucket of equal-shaped segments ``[n, H, q_len, Dh]``: masked scores, a
softmax safe for fully masked rows, the forward (torch's CPU flash kernel where it runs) and
torch's flash backward, whole or band by band under a narrow window. The buckets, their plan
and the autograd Function are in ``_attention_buckets.py``."""

from __future__ import annotations

import torch
from torch import Tensor

from ._attention_blocks import bands, mask
from ._attention_mods import Extras, Variant, pv, qk
from ._attention_plan import Bucket

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def masked_scores(
    qb: Tensor, kb: Tensor, add: Tensor | None, scale: float, causal: bool, inplace: bool = True
) -> Tensor:
    """Masked scores ``[n, H, q_len, k_len]`` (out of place when a graph is recorded)."""
    scores = qk(qb, kb)
    above = None
    if causal:
        shape = scores.shape[-2:]
        above = torch.ones(shape, dtype=torch.bool, device=scores.device).triu_(1)
    if not inplace:
        scores = scores * scale
        if add is not None:
            scores = scores + add
        return scores if above is None else scores.masked_fill(above, float("-inf"))
    scores.mul_(scale)
    if add is not None:
        scores.add_(add)
    return scores if above is None else scores.masked_fill_(above, float("-inf"))


def safe_softmax(scores: Tensor) -> Tensor:
    """Softmax over the keys that gives 0, not NaN, for a row whose keys are all masked (as the
    flash kernel does), with finite derivatives of every order. The shift is detached:
    softmax is invariant to it."""
    peak = scores.detach().amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, 0.0)
    weights = torch.exp(scores - peak)
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total > 0, total, 1.0)


def forward_bucket(
    qb: Tensor, kb: Tensor, vb: Tensor, attn_mask: Tensor | None, scale: float, causal: bool
) -> tuple[Tensor, Tensor]:
    """Output ``[n, H, q_len, Dv]`` and log-sum-exp ``[n, H, q_len]`` of one bucket (0 for a
    row whose keys are all masked, as the flash kernel gives)."""
    if qb.shape[-1] == vb.shape[-1] and qb.device.type == "cpu":
        return _flash(qb, kb, vb, 0.0, causal, attn_mask=attn_mask, scale=scale)
    scores = masked_scores(qb, kb, attn_mask, scale, causal)
    lse = torch.logsumexp(scores, -1)
    lse = torch.where(torch.isfinite(lse), lse, 0.0)
    weights = scores.sub_(lse.unsqueeze(-1)).exp_()
    return pv(weights, vb), lse.to(lse_dtype(qb.dtype))


def forward_banded(
    bucket: Bucket,
    qb: Tensor,
    kb: Tensor,
    vb: Tensor,
    bias: Tensor | None,
    extras: Extras,
    variant: Variant,
    scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor]:
    """``forward_bucket`` on the whole bucket, or band by band under a narrow window."""
    heads = qb.shape[1]
    cut = bands(bucket, variant, extras)
    if cut is None:
        return forward_bucket(
            qb, kb, vb, mask(bucket, bias, extras, variant, qb.dtype, heads), scale, causal
        )
    out = qb.new_empty((*qb.shape[:-1], vb.shape[-1]))
    lse = qb.new_empty(qb.shape[:-1], dtype=lse_dtype(qb.dtype))
    for block in cut:
        a, b, c, d = block
        part = mask(bucket, bias, extras, variant, qb.dtype, heads, block)
        out_b, lse_b = forward_bucket(
            qb[:, :, a:b], kb[:, :, c:d], vb[:, :, c:d], part, scale, False
        )
        out[:, :, a:b], lse[:, :, a:b] = out_b, lse_b
    return out, lse


def flash_backward_banded(
    bucket: Bucket,
    gb: Tensor,
    qb: Tensor,
    kb: Tensor,
    vb: Tensor,
    ob: Tensor,
    lse_b: Tensor,
    bias: Tensor | None,
    extras: Extras,
    variant: Variant,
    scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """torch's flash backward on the whole bucket, or band by band under a narrow window (the
    key gradients of overlapping bands add up)."""
    heads = qb.shape[1]
    cut = bands(bucket, variant, extras)
    if cut is None:
        whole_mask = mask(bucket, bias, extras, variant, qb.dtype, heads)
        return _flash_backward(
            gb, qb, kb, vb, ob, lse_b.contiguous(), 0.0, causal, attn_mask=whole_mask, scale=scale
        )
    dq = torch.empty_like(qb)
    dk, dv = torch.zeros_like(kb), torch.zeros_like(vb)
    for block in cut:
        a, b, c, d = block
        part = mask(bucket, bias, extras, variant, qb.dtype, heads, block)
        dqc, dkc, dvc = _flash_backward(
            gb[:, :, a:b],
            qb[:, :, a:b],
            kb[:, :, c:d],
            vb[:, :, c:d],
            ob[:, :, a:b],
            lse_b[:, :, a:b].contiguous(),
            0.0,
            False,
            attn_mask=part,
            scale=scale,
        )
        dq[:, :, a:b] = dqc
        dk[:, :, c:d] += dkc
        dv[:, :, c:d] += dvc
    return dq, dk, dv


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the log-sum-exp the flash kernel returns for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def unit_stride(x: Tensor) -> Tensor:
    """``x`` with a unit stride on its last axis (the flash kernel needs it; a copy if not)."""
    return x if x.stride(-1) == 1 else x.contiguous()
