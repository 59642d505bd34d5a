"""The eager bucket kernel as an opaque custom op, for ``torch.compile`` on CPU.

Under ``torch.compile`` the attention of ``ragged.attention`` on a CPU tensor is the custom op
``ragged::bucketed_attention`` (and ``ragged::bucketed_attention_backward`` for its gradient):
Dynamo and Inductor see one op with static output shapes (``[Tq, H, Dv]`` and the
log-sum-exp ``[Tq, H]``), so a compiled model still has one graph across batches with no
unbacked sizes, while the op runs the eager length buckets on torch's flash kernels, which are
faster than any composite Inductor generates here (``benchmarks/encoder.py``); where the native
tiled kernel takes the call (``_native_attention.runs``: causal or not, grouped-query heads, no
other variant) the op runs it instead, forward and backward.

The op reads the segment lengths from memory when it runs, to plan its buckets: on CPU that is
a memory read, not a device synchronisation. The plan is cached per lengths tensor (the
partition's, passed to every layer of a model), so an encoder plans once per batch. On other
devices ``ragged.attention`` compiles the sync-free tiled formulation instead
(``_attention_tiles.py``), as it does everywhere when ``ragged.ops._attention.TILES_UNDER_COMPILE``
is set.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from . import _attention_buckets as buckets
from . import _attention_plan as planner
from . import _native_attention as native
from ._attention_bucket import lse_dtype
from ._attention_mods import Extras, Variant
from ._native import plain

# Plans by (id of q's lengths tensor, id of k's, head width): tensors compare elementwise, so they
# cannot key a WeakKeyDictionary; the entry keeps weak references to check identity and is
# dropped when either tensor dies.
_PLANS: dict[tuple[int, int, int], tuple[Any, Any, planner.Plan]] = {}


def _plan(q_lengths: Tensor, k_lengths: Tensor, head_numel: int) -> planner.Plan:
    """The plan for these lengths tensors (cached per tensor object; read once)."""
    key = (id(q_lengths), id(k_lengths), head_numel)
    entry = _PLANS.get(key)
    if entry is not None and entry[0]() is q_lengths and entry[1]() is k_lengths:
        return entry[2]
    lq = q_lengths.tolist()
    lk = lq if k_lengths is q_lengths else k_lengths.tolist()
    found = planner.build_plan(lq, lk, head_numel)
    _PLANS[key] = (weakref.ref(q_lengths), weakref.ref(k_lengths), found)
    for tensor in {id(q_lengths): q_lengths, id(k_lengths): k_lengths}.values():
        weakref.finalize(tensor, _PLANS.pop, key, None)
    return found


def _variant(causal: bool, left: int | None, right: int | None, radius: int) -> Variant:
    return Variant(causal=causal, left=left, right=right, radius=radius)


@torch.library.custom_op("ragged::bucketed_attention", mutates_args=())
def bucketed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    table: Tensor | None,
    slopes: Tensor | None,
    documents: Tensor | None,
    prefix: Tensor | None,
    q_lengths: Tensor,
    k_lengths: Tensor,
    scale: float,
    causal: bool,
    left: int | None,
    right: int | None,
    radius: int,
) -> tuple[Tensor, Tensor]:
    """Output ``[Tq, H, Dv]`` and log-sum-exp ``[Tq, H]`` of the bucketed kernel."""
    extras = Extras(table, slopes, documents, prefix)
    variant = _variant(causal, left, right, radius)
    if native.runs(q, k, v, bias, extras, variant):
        qo = native.offsets_of(q_lengths)
        ko = qo if k_lengths is q_lengths else native.offsets_of(k_lengths)
        return native.forward(q, k, v, qo, ko, scale, causal)
    p = _plan(q_lengths, k_lengths, q.shape[1] * q.shape[2])
    with torch.no_grad():
        return buckets.forward(
            q, k, v, bias, extras, p, scale, _variant(causal, left, right, radius)
        )


@bucketed_attention.register_fake
def _(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    table: Tensor | None,
    slopes: Tensor | None,
    documents: Tensor | None,
    prefix: Tensor | None,
    q_lengths: Tensor,
    k_lengths: Tensor,
    scale: float,
    causal: bool,
    left: int | None,
    right: int | None,
    radius: int,
) -> tuple[Tensor, Tensor]:
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    return out, q.new_empty((q.shape[0], q.shape[1]), dtype=lse_dtype(q.dtype))


@torch.library.custom_op("ragged::bucketed_attention_backward", mutates_args=())
def bucketed_attention_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    table: Tensor | None,
    slopes: Tensor | None,
    documents: Tensor | None,
    prefix: Tensor | None,
    out: Tensor,
    lse: Tensor,
    q_lengths: Tensor,
    k_lengths: Tensor,
    scale: float,
    causal: bool,
    left: int | None,
    right: int | None,
    radius: int,
    need: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of q, k, v, the bias, the table and the slopes (empty when not needed)."""
    extras = Extras(table, slopes, documents, prefix)
    variant = _variant(causal, left, right, radius)
    if native.runs(q, k, v, bias, extras, variant) and plain(grad):
        qo = native.offsets_of(q_lengths)
        ko = qo if k_lengths is q_lengths else native.offsets_of(k_lengths)
        dq, dk, dv = native.backward(grad, q, k, v, out, lse, qo, ko, scale, causal)
        return dq, dk, dv, q.new_empty(0), q.new_empty(0), q.new_empty(0)
    p = _plan(q_lengths, k_lengths, q.shape[1] * q.shape[2])
    with torch.no_grad():
        grads = buckets.vjp(
            p, q, k, v, bias, extras, out, lse, grad, scale, variant, (True, True, True, *need)
        )
    dq, dk, dv = (
        x if x is not None else torch.zeros_like(y)
        for x, y in zip(grads[:3], (q, k, v), strict=True)
    )
    rest = [q.new_empty(0) if x is None else x for x in grads[3:]]
    return dq, dk, dv, rest[0], rest[1], rest[2]


@bucketed_attention_backward.register_fake
def _(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    table: Tensor | None,
    slopes: Tensor | None,
    documents: Tensor | None,
    prefix: Tensor | None,
    out: Tensor,
    lse: Tensor,
    q_lengths: Tensor,
    k_lengths: Tensor,
    scale: float,
    causal: bool,
    left: int | None,
    right: int | None,
    radius: int,
    need: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    rest = [
        torch.empty_like(x) if wanted and x is not None else q.new_empty(0)
        for x, wanted in zip((bias, table, slopes), need, strict=True)
    ]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), rest[0], rest[1], rest[2]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k, v, bias, table, slopes, documents, prefix, q_lengths, k_lengths = inputs[:10]
    out, lse = output
    ctx.save_for_backward(
        q, k, v, bias, table, slopes, documents, prefix, out, lse, q_lengths, k_lengths
    )
    ctx.static = inputs[10:]  # scale, causal, left, right, radius
    ctx.need = [
        x is not None and ctx.needs_input_grad[i] for i, x in ((3, bias), (4, table), (5, slopes))
    ]


def _backward(ctx: Any, grad: Tensor, _grad_lse: Any) -> tuple[Any, ...]:
    q, k, v, bias, table, slopes, documents, prefix, out, lse, q_lengths, k_lengths = (
        ctx.saved_tensors
    )
    grads = bucketed_attention_backward(
        grad,
        q,
        k,
        v,
        bias,
        table,
        slopes,
        documents,
        prefix,
        out,
        lse,
        q_lengths,
        k_lengths,
        *ctx.static,
        ctx.need,
    )
    rest = [g if wanted else None for g, wanted in zip(grads[3:], ctx.need, strict=True)]
    return (*grads[:3], *rest, None, None, None, None, None, None, None, None, None)


bucketed_attention.register_autograd(_backward, setup_context=_setup_context)
