"""What changes the attention scores besides a pair bias: the variants of ``ragged.attention``.

Every variant is a function of a query's and a key's *positions* in their segment (``i`` and
``j``), the segment ``b``, the head ``h`` and some small tensors, so each kernel evaluates it on
its own block of the score matrix (a bucket ``[n, H, L, L]`` of the eager kernel, a tile of the
composite path) and never materialises ``sum_b Lq_b * Lk_b`` pairs at once:

* ``window = (left, right)``: key ``j`` is visible from query ``i`` when
  ``i - left <= j <= i + right`` (``None``: unbounded on that side);
* ``prefix[b]`` (with causal attention): ``j <= i or j < prefix[b]`` (prefix-LM);
* ``documents`` (an id per row): ``documents[i] == documents[j]``;
* ``mask_mod(b, h, i, j)``: a user predicate;
* additive biases, linear in their parameters: ``table[clip(j - i, -R, R) + R, h]`` (relative
  positions) and ``-slopes[h] * |j - i|`` (ALiBi);
* ``score_mod(score, b, h, i, j)``: any differentiable function of the score (composite path
  only).

Plain causal attention is not here: the kernels take it natively. Grouped-query attention
(``H_kv`` key/value heads shared by groups of ``H / H_kv`` query heads) is here as
matmul helpers that never repeat the keys or values: the ``G = H / H_kv`` query heads of a
group are folded into the query axis of one ``[H_kv, G * L, D]`` problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True, eq=False)
class Variant:
    """The static facts of an attention call's variants (no tensor data).

    Attributes:
        causal: key ``j`` is visible from query ``i`` only when ``j <= i`` (or inside the
            prefix, with ``prefix``).
        left, right: the window; ``None`` is unbounded.
        radius: ``R`` of the relative-position table (rows ``2R + 1``).
        heads: the query heads of one problem (a ``mask_mod``'s ``h`` is taken modulo it when
            the vmap rule folds problems into heads).
        mask_mod, score_mod: the user's callables, or ``None``.
    """

    causal: bool = False
    left: int | None = None
    right: int | None = None
    radius: int = 0
    heads: int = 1
    mask_mod: Callable[..., Tensor] | None = None
    score_mod: Callable[..., Tensor] | None = None

    @property
    def windowed(self) -> bool:
        return self.left is not None or self.right is not None


PLAIN = Variant()


class Extras(NamedTuple):
    """The tensors of the variants (each ``None`` when absent).

    Attributes:
        table: ``[2R + 1, H]`` relative-position bias by clipped distance ``j - i``.
        slopes: ``[H]`` ALiBi slopes.
        documents: int64 ``[Tq]``, a document id per query row (self-attention: the key rows
            are the same rows).
        prefix: int64 ``[B]``, the prefix length of each segment.
    """

    table: Tensor | None = None
    slopes: Tensor | None = None
    documents: Tensor | None = None
    prefix: Tensor | None = None


NONE = Extras()


def kernel_causal(variant: Variant, extras: Extras) -> bool:
    """Whether the kernel's own causal mask applies (with a prefix, the mask carries it)."""
    return variant.causal and extras.prefix is None


def visible(
    i: Tensor,
    j: Tensor,
    variant: Variant,
    prefix: Tensor | None = None,
    docs_i: Tensor | None = None,
    docs_j: Tensor | None = None,
    mod_args: tuple[Tensor, Tensor] | None = None,
) -> Tensor | None:
    """Which (query ``i``, key ``j``) pairs the window, prefix, documents and ``mask_mod``
    keep, as a bool tensor broadcast from the arguments; ``None`` when they keep every pair.

    ``i`` and ``j`` broadcast against each other (``[..., q, 1]`` and ``[..., 1, k]``);
    ``prefix`` against both; ``docs_i``/``docs_j`` like ``i``/``j``; ``mod_args`` is the
    ``(b, h)`` pair handed to ``mask_mod`` with ``i`` and ``j``.
    """
    keep = None

    def both(a: Tensor | None, b: Tensor) -> Tensor:
        return b if a is None else a & b

    if variant.left is not None:
        keep = both(keep, j >= i - variant.left)
    if variant.right is not None:
        keep = both(keep, j <= i + variant.right)
    if prefix is not None:  # prefix-LM: causal after the prefix (causal is required with it)
        keep = both(keep, (j <= i) | (j < prefix))
    if docs_i is not None and docs_j is not None:
        keep = both(keep, docs_i == docs_j)
    if variant.mask_mod is not None and mod_args is not None:
        b, h = mod_args
        keep = both(keep, variant.mask_mod(b, h, i, j).to(torch.bool))
    return keep


def position_bias(
    i: Tensor, j: Tensor, radius: int, table: Tensor | None, slopes: Tensor | None
) -> Tensor | None:
    """The additive bias of the relative-position table and ALiBi, ``[..., H, q, k]`` from
    positions ``i`` ``[..., q, 1]`` and ``j`` ``[..., 1, k]``; ``None`` without either. Linear
    in ``table`` and ``slopes`` (pass tangents to get the tangent of the bias)."""
    out = None
    distance = j - i
    if table is not None:
        index = distance.clamp(-radius, radius) + radius
        out = table[index].movedim(-1, -3)  # [..., q, k, H] -> [..., H, q, k]
    if slopes is not None:
        shape = (*[1] * (distance.dim() - 2), -1, 1, 1)
        term = -slopes.view(shape) * distance.abs().unsqueeze(-3).to(slopes.dtype)
        out = term if out is None else out + term
    return out


def position_bias_grads(
    dscores: Tensor,
    i: Tensor,
    j: Tensor,
    radius: int,
    table: Tensor | None,
    slopes: Tensor | None,
) -> tuple[Tensor | None, Tensor | None]:
    """The gradients of ``table`` and ``slopes`` from the gradient of the scores
    ``[n, H, q, k]`` of a block whose positions are ``i`` ``[q, 1]`` and ``j`` ``[1, k]``
    (the transpose of ``position_bias``; out of place, so batched and differentiable)."""
    distance = j - i
    dtable = dslopes = None
    per_pair = dscores.sum(0)  # [H, q, k]: every segment of the block has these positions
    if table is not None:
        index = (distance.clamp(-radius, radius) + radius).reshape(-1)
        rows = per_pair.flatten(1).transpose(0, 1)  # [q * k, H]
        dtable = rows.new_zeros(table.shape).index_add(0, index, rows)
    if slopes is not None:
        dslopes = -(per_pair * distance.abs().to(per_pair.dtype)).sum((1, 2))
    return dtable, dslopes


# --- grouped-query attention: matmuls with H_kv key/value heads ----------------------------


def grouped(x: Tensor, kv_heads: int) -> Tensor:
    """``[..., H, L, D]`` -> ``[..., H_kv, G * L, D]``: query head ``h`` uses key/value head
    ``h // G`` (torch's ``enable_gqa`` convention), so each group is one longer problem."""
    heads, length = x.shape[-3], x.shape[-2]
    if heads == kv_heads:
        return x
    return x.reshape(*x.shape[:-3], kv_heads, (heads // kv_heads) * length, x.shape[-1])


def ungrouped(x: Tensor, heads: int) -> Tensor:
    """The inverse of ``grouped`` for a result ``[..., H_kv, G * L, X]`` -> ``[..., H, L, X]``."""
    kv_heads = x.shape[-3]
    if heads == kv_heads:
        return x
    return x.reshape(*x.shape[:-3], heads, x.shape[-2] // (heads // kv_heads), x.shape[-1])


def qk(q: Tensor, k: Tensor) -> Tensor:
    """Scores ``q @ k^T`` ``[..., H, q, k]`` for ``q`` ``[..., H, q, D]``, ``k`` ``[..., H_kv, k, D]``."""
    return ungrouped(torch.matmul(grouped(q, k.shape[-3]), k.transpose(-1, -2)), q.shape[-3])


def pv(p: Tensor, v: Tensor) -> Tensor:
    """``p @ v`` ``[..., H, q, Dv]`` for weights ``[..., H, q, k]`` and ``v`` ``[..., H_kv, k, Dv]``."""
    return ungrouped(torch.matmul(grouped(p, v.shape[-3]), v), p.shape[-3])


def key_grad(d: Tensor, x: Tensor, kv_heads: int) -> Tensor:
    """``d^T @ x`` summed over each group's query heads: ``[..., H_kv, k, X]`` for ``d``
    ``[..., H, q, k]`` and ``x`` ``[..., H, q, X]`` (the gradient of keys or values)."""
    return torch.matmul(grouped(d, kv_heads).transpose(-1, -2), grouped(x, kv_heads))
