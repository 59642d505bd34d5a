"""Variable-length attention in eager mode: segments grouped into length buckets.

Segments of equal length form a *bucket*; each bucket is one call of torch's CPU
flash-attention kernel on ``[n, H, L, D]`` (the kernel behind ``F.scaled_dot_product_attention``).
A bucket of one segment, or of segments that lie back to back in ``values``, reads its rows as a
view (no copy); others gather their rows.

The buckets and their cached plans come from ``_attention_plan``. The variants
(``_attention_mods``: grouped-query heads, windows, prefix and document masks, ``mask_mod``,
relative-position tables and ALiBi) are evaluated per bucket on its ``[L, L]`` positions and
given to the kernel as its additive mask; keys and values with fewer heads go to the kernel as
they are (torch's CPU flash kernel takes grouped-query heads, forward and backward).

The kernel is an ``autograd.Function``:

* ``backward`` calls torch's flash backward kernel; for a bias, relative-position table or ALiBi
  slopes that needs a gradient (the kernel does not return one) and for other head widths of
  ``v`` it recomputes the bucket's
  probabilities from the saved log-sum-exp with batched matmuls. Results go into buffers made from the incoming gradient, so it runs
  batched too (``autograd.grad(..., is_grads_batched=True)``; the flash kernel then runs through
  vmap's slow fallback, with torch's performance warning). When a graph of the gradient is being built
  (double backward), the matmul formulas run out of place with a differentiable softmax.
* ``jvp`` (forward-mode AD): ``dS = scale (dq k^T + q dk^T) + dbias``,
  ``dP = P (dS - rowsum(P dS))``, ``dO = dP v + P dv``, bucket by bucket.
* ``vmap`` folds the vmapped dimension into the heads: ``V`` attention problems with ``H`` heads
  are one problem with ``V * H`` heads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._attention_blocks import (
    bias_block,
    buffer,
    mask,
    pair_index,
    positions,
    read,
    result,
    trim,
    whole,
    write,
)
from ._attention_bucket import (
    flash_backward_banded,
    forward_banded,
    lse_dtype,
    masked_scores,
    safe_softmax,
    unit_stride,
)
from ._attention_mods import (
    Extras,
    Variant,
    kernel_causal,
    key_grad,
    position_bias,
    position_bias_grads,
    pv,
    qk,
)
from ._attention_plan import Plan

# Buckets with at least this many query rows use torch's flash backward kernel when they can.
# Measured here it is as fast as the batched matmuls or faster for every bucket shape but very
# many very short segments, and one call instead of a dozen.
FLASH_BACKWARD_MIN = 1

# --- the kernel -------------------------------------------------------------------------------


def bucketed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    extras: Extras,
    p: Plan,
    scale: float,
    variant: Variant,
) -> Tensor:
    """Attention of ``q`` ``[Tq, H, D]`` over ``k``/``v`` ``[Tk, H_kv, D(v)]`` by the plan
    ``p``, with a pair bias ``[pairs, H]`` and the variants (``extras``, ``variant``)."""
    table, slopes, documents, prefix = extras
    out, _ = _BucketedAttention.apply(
        q, k, v, bias, table, slopes, documents, prefix, p, scale, variant
    )
    return out


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    extras: Extras,
    p: Plan,
    scale: float,
    variant: Variant,
) -> tuple[Tensor, Tensor]:
    """The output ``[Tq, H, Dv]`` and the log-sum-exp of every query row's scores ``[Tq, H]``
    (rows without keys: their entries are unspecified, and never read)."""
    q, k, v = unit_stride(q), unit_stride(k), unit_stride(v)
    heads = q.shape[1]
    causal = kernel_causal(variant, extras)
    make = q.new_zeros if p.idle_q else q.new_empty
    out = make((q.shape[0], heads, v.shape[-1]))
    lse = q.new_empty((q.shape[0], heads, 1), dtype=lse_dtype(q.dtype))
    for bucket in p.buckets:
        qb = read(q, bucket.q_read, bucket.n, bucket.q_len)
        kb = read(k, bucket.k_read, bucket.n, bucket.k_len)
        vb = read(v, bucket.k_read, bucket.n, bucket.k_len)
        ob, lse_b = forward_banded(bucket, qb, kb, vb, bias, extras, variant, scale, causal)
        lse_b = lse_b.unsqueeze(-1)  # [n, H, q_len, 1]
        if bucket.q_real is None or bucket.q_real_dest is None:
            write(out, bucket.q_dest, ob)
            write(lse, bucket.q_dest, lse_b)
        else:  # only the real rows: the outputs have no dump row (they are returned as is)
            for target, part in ((out, ob), (lse, lse_b)):
                rows = _rows_of(part).index_select(0, bucket.q_real)
                target.index_copy_(0, bucket.q_real_dest, rows)
    return out, lse.view(q.shape[0], heads)


def _rows_of(x: Tensor) -> Tensor:
    """``[n, H, len, D]`` -> ``[n * len, H, D]``."""
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])


def _fold(x: Tensor | None, dim: int | None, size: int, axis: int) -> Tensor | None:
    """Merge a vmapped dimension ``dim`` of ``x`` (``None``: not batched, expanded) into its
    heads axis ``axis``: ``V`` problems of ``H`` heads become one problem of ``V * H`` heads,
    problem-major (``v * H + h``), which keeps grouped-query heads grouped."""
    if x is None:
        return None
    if dim is None:
        x = x.unsqueeze(axis).expand(*x.shape[:axis], size, *x.shape[axis:])
    else:
        x = x.movedim(dim, axis)
    return x.flatten(axis, axis + 1)


class _BucketedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor | None,
        table: Tensor | None,
        slopes: Tensor | None,
        documents: Tensor | None,
        prefix: Tensor | None,
        p: Plan,
        scale: float,
        variant: Variant,
    ) -> tuple[Tensor, Tensor]:
        extras = Extras(table, slopes, documents, prefix)
        return forward(q, k, v, bias, extras, p, scale, variant)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        q, k, v, bias, table, slopes, documents, prefix, p, scale, variant = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, bias, table, slopes, documents, prefix, out, lse)
        ctx.save_for_forward(q, k, v, bias, table, slopes, documents, prefix)
        ctx.plan, ctx.scale, ctx.variant = p, scale, variant

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _grad_lse: Any) -> tuple[Any, ...]:
        q, k, v, bias, table, slopes, documents, prefix, out, lse = ctx.saved_tensors
        need = ctx.needs_input_grad[:6]
        extras = Extras(table, slopes, documents, prefix)
        grads = vjp(ctx.plan, q, k, v, bias, extras, out, lse, grad, ctx.scale, ctx.variant, need)
        grads = tuple(g if n else None for g, n in zip(grads, need, strict=True))
        return (*grads, None, None, None, None, None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> tuple[Tensor, None]:
        q, k, v, bias, table, slopes, documents, prefix = ctx.saved_tensors
        extras = Extras(table, slopes, documents, prefix)
        dq, dk, dv, dbias, dtable, dslopes = tangents[:6]
        tangent = _jvp(
            ctx.plan,
            q,
            k,
            v,
            bias,
            extras,
            (dq, dk, dv, dbias, dtable, dslopes),
            ctx.scale,
            ctx.variant,
        )
        return tangent, None

    @staticmethod
    def vmap(info: Any, in_dims: Any, *args: Any) -> Any:
        q, k, v, bias, table, slopes, documents, prefix, p, scale, variant = args
        size = info.batch_size
        if in_dims[6] is not None or in_dims[7] is not None:
            raise NotImplementedError(
                "vmap over the `document_ids` or `prefix` of ragged.attention is not supported"
            )
        q2, k2, v2, b2, t2 = (
            _fold(x, d, size, 1) for x, d in zip((q, k, v, bias, table), in_dims[:5], strict=True)
        )
        s2 = _fold(slopes, in_dims[5], size, 0)
        out, lse = _BucketedAttention.apply(
            q2, k2, v2, b2, t2, s2, documents, prefix, p, scale, variant
        )
        out = out.view(out.shape[0], size, -1, out.shape[-1])
        lse = lse.view(lse.shape[0], size, -1)
        return (out, lse), (1, 1)


def vjp(
    p: Plan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    extras: Extras,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    scale: float,
    variant: Variant,
    need: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """Gradients of ``(q, k, v, bias, table, slopes)``, bucket by bucket.

    First order (no graph of the gradient): torch's flash backward kernel when no bias, table
    or slopes needs a gradient; else probabilities from the saved log-sum-exp, updated in place
    in fresh temporaries, and batched matmuls. When a graph of the gradient is being built
    (double backward), every step is out of place and the probabilities come from a
    differentiable softmax (the saved log-sum-exp carries no gradient; the saved output does,
    through this Function).
    """
    graph = torch.is_grad_enabled()
    q, k, v = unit_stride(q), unit_stride(k), unit_stride(v)
    heads, kv_heads, width, width_v = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    causal = kernel_causal(variant, extras)
    table, slopes = extras.table, extras.slopes
    need_table = len(need) > 4 and need[4] and table is not None
    need_slopes = len(need) > 5 and need[5] and slopes is not None
    delta = None  # [Tq, H, 1]: rowsum(dO * O), for the matmul formulas
    sources = (grad,)
    dq = result(p, p.idle_q, sources, q.shape) if need[0] else None
    dk = result(p, p.idle_k, sources, k.shape) if need[1] else None
    dv = result(p, p.idle_k, sources, v.shape) if need[2] else None
    dbias = dtable = dslopes = None
    if need[3] and bias is not None:
        dbias = buffer(sources, bias.shape[0], (heads,), q)
    flash = (
        not graph
        and dbias is None
        and not need_table
        and not need_slopes
        and width == width_v
        and q.device.type == "cpu"
    )
    for bucket in p.buckets:
        n, q_len, k_len = bucket.n, bucket.q_len, bucket.k_len
        qb = read(q, bucket.q_read, n, q_len)
        kb = read(k, bucket.k_read, n, k_len)
        vb = read(v, bucket.k_read, n, k_len)
        gb = read(grad, bucket.q_read, n, q_len)
        q_keep = None if bucket.q_keep is None else bucket.q_keep.view(n, 1, q_len, 1)
        if q_keep is not None:  # padded query rows carry no gradient
            gb = torch.where(q_keep, gb, 0.0)
        # Padded slots read the log-sum-exp of the row they were read from (the same scores).
        lse_b = read(lse.unsqueeze(-1), bucket.q_read, n, q_len).squeeze(-1)  # [n, H, q_len]
        if flash and q_len >= FLASH_BACKWARD_MIN:
            ob = read(out, bucket.q_read, n, q_len)
            dqb, dkb, dvb = flash_backward_banded(
                bucket, gb, qb, kb, vb, ob, lse_b, bias, extras, variant, scale, causal
            )
            for target, dest, part in ((dq, bucket.q_dest, dqb), (dk, bucket.k_dest, dkb)):
                if target is not None:
                    write(target, dest, part)
            if dv is not None:
                write(dv, bucket.k_dest, dvb)
            continue
        block_mask = mask(bucket, bias, extras, variant, q.dtype, heads)
        # Batched matmuls want contiguous [n, H, L, D] operands: copy each once.
        qb, kb, vb, gb = qb.contiguous(), kb.contiguous(), vb.contiguous(), gb.contiguous()
        if delta is None:
            delta = (grad * out).sum(-1, keepdim=True)
        db = read(delta, bucket.q_read, n, q_len)  # [n, H, q_len, 1]
        if q_keep is not None:
            db = torch.where(q_keep, db, 0.0)
        scores = masked_scores(qb, kb, block_mask, scale, causal, inplace=not graph)
        dweights = qk(gb, vb)
        if graph:
            weights = safe_softmax(scores)
            dscores = (dweights - db) * weights
        else:
            weights = scores.sub_(lse_b.unsqueeze(-1).to(scores.dtype)).exp_()
            dscores = dweights.sub_(db).mul_(weights)
        if dv is not None:
            write(dv, bucket.k_dest, key_grad(weights, gb, kv_heads))
        if dq is not None:
            write(dq, bucket.q_dest, pv(dscores, kb) * scale)
        if dk is not None:
            write(dk, bucket.k_dest, key_grad(dscores, qb, kv_heads) * scale)
        if dbias is not None:
            block = dscores.permute(0, 2, 3, 1)  # [n, q_len, k_len, H]
            if bucket.pair_range is not None:
                dbias[bucket.pair_range[0] : bucket.pair_range[1]].view_as(block).copy_(block)
            else:
                dbias.index_put_((pair_index(bucket, dump=dbias.shape[0] - 1),), block)
        if need_table or need_slopes:
            i, j = positions(whole(bucket), q.device)
            grads = position_bias_grads(
                dscores,
                i,
                j,
                variant.radius,
                table if need_table else None,
                slopes if need_slopes else None,
            )
            dtable = _accumulate(dtable, grads[0])
            dslopes = _accumulate(dslopes, grads[1])
    if need_table and dtable is None and table is not None:  # no bucket: no pairs
        dtable = torch.zeros_like(table)
    if need_slopes and dslopes is None and slopes is not None:
        dslopes = torch.zeros_like(slopes)
    shapes = (q.shape, k.shape, v.shape, None if bias is None else bias.shape)
    first = tuple(
        None if x is None or shape is None else trim(x, shape[0])
        for x, shape in zip((dq, dk, dv, dbias), shapes, strict=True)
    )
    return (*first, dtable, dslopes)


def _accumulate(total: Tensor | None, term: Tensor | None) -> Tensor | None:
    if term is None:
        return total
    return term if total is None else total + term


def _jvp(
    p: Plan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    extras: Extras,
    tangents: tuple[Tensor | None, ...],
    scale: float,
    variant: Variant,
) -> Tensor:
    """The output tangent, bucket by bucket (tangents may be batched)."""
    dq, dk, dv, dbias, dtable, dslopes = tangents
    q, k, v = unit_stride(q), unit_stride(k), unit_stride(v)
    heads = q.shape[1]
    causal = kernel_causal(variant, extras)
    shape = (q.shape[0], heads, v.shape[2])
    out = result(p, p.idle_q, (dq, dk, dv, dbias, dtable, dslopes), torch.Size(shape))
    for bucket in p.buckets:
        n, q_len, k_len = bucket.n, bucket.q_len, bucket.k_len
        qb = read(q, bucket.q_read, n, q_len)
        kb = read(k, bucket.k_read, n, k_len)
        vb = read(v, bucket.k_read, n, k_len)
        block_mask = mask(bucket, bias, extras, variant, q.dtype, heads)
        weights = safe_softmax(masked_scores(qb, kb, block_mask, scale, causal, inplace=False))
        dscores = None
        if dq is not None:
            dscores = qk(read(dq, bucket.q_read, n, q_len), kb)
        if dk is not None:
            term = qk(qb, read(dk, bucket.k_read, n, k_len))
            dscores = term if dscores is None else dscores + term
        if dscores is not None:
            dscores = dscores * scale
        if dbias is not None:
            term = bias_block(bucket, dbias)
            dscores = term if dscores is None else dscores + term
        if dtable is not None or dslopes is not None:
            i, j = positions(whole(bucket), q.device)
            moved = position_bias(i, j, variant.radius, dtable, dslopes)
            if moved is not None:
                dscores = moved if dscores is None else dscores + moved
        tangent = None
        if dscores is not None:
            dweights = weights * (dscores - (weights * dscores).sum(-1, keepdim=True))
            tangent = pv(dweights, vb)
        if dv is not None:
            term = pv(weights, read(dv, bucket.k_read, n, k_len))
            tangent = term if tangent is None else tangent + term
        if tangent is not None:
            write(out, bucket.q_dest, tangent)
    return trim(out, shape[0])
