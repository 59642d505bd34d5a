"""Variable-length attention: ``ragged.attention``.

Axis rule: **keep all** for the queries: the output has the shape and the partition object of
``q`` (with ``v``'s head width). Every segment attends over its own keys only; nothing is padded
to the longest segment.

Three implementations with one semantics (the reference is
``F.scaled_dot_product_attention`` on each segment, transposed to ``(H, L, Dh)``):

* on CUDA (the varlen kernel module): torch's variable-length flash or
  memory-efficient kernel, with the offsets as cumulative sequence lengths and the partitions'
  static maximum lengths: no padding, no buckets, no host read. Taken when the dtype, head sizes
  and settings allow (no pair bias, maximum lengths known, no ``torch.func`` transform); see that
  module for the rules.
* eager on CPU, causal or not, with grouped-query heads and no other variant (the native
  attention module): a tiled flash-attention loop in C over the packed rows, on torch's own
  GEMM, split over threads. Under ``torch.compile`` the custom op below runs it too.
* eager on CPU otherwise (the buckets module): segments grouped into length buckets,
  one call of torch's CPU flash-attention kernel per bucket. It reads the lengths on the host
  once per partition object (cached, weakly). Under ``torch.compile`` on CPU the same kernel runs
  as an opaque custom op: one graph across batches with static shapes; it
  reads the lengths from memory when it runs. Narrow windows run band by band.
* otherwise (the tiles module): block tiles of each segment, batched
  matmuls and segment softmax, with static sizes only: on other devices (eager or compiled),
  with ``TILES_UNDER_COMPILE``, or with dropout or a ``score_mod`` on CPU (and a ``mask_mod``
  under ``torch.compile``). No host read when the partitions
  bound the tiles statically (always but for cross-attention without a bias whose maximum
  lengths are unknown): one graph across batches under ``torch.compile(dynamic=True)``.

Memory is at most ``O(sum_b Lq_b * Lk_b)`` (the pairs that exist), never ``O(B * Lmax^2)``.

The variants (grouped-query heads, windows, ALiBi, relative positions, document and prefix
masks, ``score_mod``, ``mask_mod``) are checked once and evaluated by every path on its own
blocks of scores; the attention core takes one ragged level of queries and one of keys, so a dispatch for inner ragged axes can call
it on the innermost level. Semantics decisions are in ``docs/semantics.md`` (section "Attention
semantics"). Each path is one module of ``ragged/kernels/`` (attention varlen, buckets, op,
blocks, tiles, variants and mods).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import KEEP
from .._errors import type_error, typename, value_error
from .._format import shape_text
from .._partition import RowPartition, tensors_equal
from .._registry import op
from ..kernels import _attention_buckets as buckets
from ..kernels import _attention_plan as planner
from ..kernels import _attention_varlen as varlen
from ..kernels import _native_attention as native_attention
from ..kernels._attention_op import bucketed_attention as bucketed_attention_op
from ..kernels._attention_tiles import (
    COMPILE_BLOCK,
    Geometry,
    block_bound,
    tile_bound,
    tiled_attention,
)
from . import _attention_variants as variants
from ._attention_levels import attention_levels
from ._levels import is_multi_level

# Under torch.compile on CPU the eager bucket kernel runs as an opaque custom op (see
# _attention_op.py: one graph, no unbacked sizes; it reads the lengths from memory when it runs).
# Set this to compile the sync-free tiled formulation instead, as on other devices.
TILES_UNDER_COMPILE = False
# Device types whose eager path plans length buckets on the host; others take the tiles (or the
# fused kernels of _attention_varlen), which need no host read.
BUCKET_DEVICES = ("cpu",)

BIAS_PARTITION = (
    "must be a pair map (B, Lq*, Lk*, H) with the partition "
    "ragged.Partition.outer(q.partition.levels[0], k.partition.levels[0])"
)


@op(
    "attention",
    rule=KEEP,
    args=(
        "q: ragged, k: ragged, v: ragged, causal: bool?, scale: number?, bias: ragged?, "
        "dropout_p: number?, window: any?, alibi: tensor?, relative_bias: any?, "
        "document_ids: ragged?, prefix: any?, score_mod: callable?, mask_mod: callable?"
    ),
)
def attention(
    q: RaggedArray,
    k: RaggedArray,
    v: RaggedArray,
    *,
    causal: bool = False,
    scale: float | None = None,
    bias: RaggedArray | None = None,
    dropout_p: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    alibi: Tensor | None = None,
    relative_bias: Tensor | Callable[[Tensor], Tensor] | None = None,
    document_ids: RaggedArray | None = None,
    prefix: int | Tensor | None = None,
    score_mod: Callable[..., Tensor] | None = None,
    mask_mod: Callable[..., Tensor] | None = None,
) -> RaggedArray:
    """Scaled dot-product attention within each segment, with the usual variants.

    For every segment ``b`` this is ``F.scaled_dot_product_attention`` on the segment's rows
    transposed to ``(H, L, Dh)``: query row ``i`` of segment ``b`` attends over the keys of
    segment ``b`` only:

    ```text
    out[b] = softmax(q[b] @ k[b]^T * scale + bias[b] + mask[b]) @ v[b]     # per head
    ```

    where ``mask`` (``-inf`` for hidden pairs) and the extra biases come from the variants below,
    each a function of the positions ``i`` (query) and ``j`` (key) within the segment. None of
    them materialises the ``sum_b Lq_b * Lk_b`` pairs: each kernel evaluates them on its own
    block of scores.

    With more ragged axes (``(B, S*, T*, H, Dh)``: documents -> sentences -> tokens) attention
    runs within every row of the innermost ragged axis (every sentence), on the same kernels:
    ``k`` and ``v`` share the levels of ``q`` above the innermost, a ``bias`` has one more
    ragged axis than ``q`` (``(B, S*, Tq*, Tk*, H)``, as ``ragged.outer`` of two such arrays)
    and ``document_ids`` has the partition of ``q``. Every variant applies within each sentence
    as it would to a segment: a tensor ``prefix`` has one entry per sentence, and the ``b`` of
    ``score_mod``/``mask_mod`` numbers the sentences of the whole batch.

    Args:
        q: queries ``(B, Lq*, H, Dh)``.
        k: keys ``(B, Lk*, H_kv, Dh)``. With the partition of ``q`` this is self-attention;
            with another partition (same ``B``) it is cross-attention. ``H_kv`` must divide
            ``H``: with fewer key/value heads (grouped-query or, with one, multi-query
            attention) query head ``h`` uses key/value head ``h // (H / H_kv)``, as torch's
            ``enable_gqa``; keys and values are not repeated.
        v: values ``(B, Lk*, H_kv, Dv)``, with the partition of ``k``.
        causal: query ``i`` attends to keys ``j <= i`` only (self-attention only: ``q`` and
            ``k`` must have equal partitions).
        scale: the factor of the scores; default ``1 / sqrt(Dh)``.
        bias: an additive pair bias ``(B, Lq*, Lk*, H)``: a RaggedArray with partition
            ``ragged.Partition.outer(q.partition.levels[0], k.partition.levels[0])`` whose
            values ``[sum_b Lq_b * Lk_b, H]`` hold each segment's ``Lq_b x Lk_b`` block
            row-major. Differentiable. Use ``-inf`` entries to mask pairs out.
        dropout_p: dropout probability on the attention weights; ``None`` or 0 for none (use
            that in evaluation). A positive value runs the composite path (slower than the
            eager kernel).
        window: ``(left, right)``: sliding-window (local) attention, key ``j`` visible from
            query ``i`` when ``i - left <= j <= i + right`` (``None``: unbounded on that side;
            ``(0, 0)``: each row sees itself). With ``causal`` only the left side matters.
        alibi: ALiBi slopes ``[H]``: adds ``-alibi[h] * |i - j|`` (with ``causal``, the bias of
            the ALiBi paper; without, its symmetric form, as flash-attention's
            ``alibi_slopes``). Differentiable.
        relative_bias: a relative-position bias by distance ``j - i``: a table ``[2R + 1, H]``
            (adds ``table[clip(j - i, -R, R) + R, h]``, differentiable) or a callable mapping
            int64 distances ``[n]`` to ``[n, H]`` (called once per call on every distance the
            batch can see; e.g. T5's buckets over a learned table). Gradients flow into its
            parameters.
        document_ids: ``(B, L*)`` integers with the partition of ``q``: row ``i`` attends to
            rows of the same id only (documents packed into one sequence; combine with
            ``causal``).
        prefix: prefix-LM lengths, an int or an integer tensor ``[B]``; needs ``causal=True``:
            keys ``j < prefix[b]`` are visible from every query of segment ``b`` (the prefix
            attends bidirectionally), the rest causally.
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score``, as torch's
            ``flex_attention``: applied to the scaled scores (after the biases) before the
            masks, with broadcastable tensors (``score`` ``[..., H, q, k]``; ``b``, ``h``,
            ``q_idx``, ``kv_idx`` int64, broadcasting against it), so it must be elementwise.
            Differentiable, with gradients into the tensors it closes over. Runs the
            composite path.
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx) -> bool``: pairs where it is false are
            hidden (called like ``score_mod``). Not differentiable; kept on the eager kernel.

    Returns:
        ``(B, Lq*, H, Dv)`` with the partition object and axis names of ``q``. An empty
        segment gives an empty segment; a query row whose segment has no keys (``Lk_b = 0``),
        or whose keys are all hidden, gives 0.

    Host reads: on CUDA none when the partitions' maximum lengths are known statically (they
    are whenever a partition came from host data): the fused variable-length kernels or the
    tiled formulation run. On CPU in eager mode, plain or causal attention with grouped-query
    heads and no other variant runs a native tiled kernel that reads the offsets from memory
    (no host read, no plan); with the other variants the segment lengths are read once per
    partition object (cached). Under ``torch.compile`` the graph has none: on CPU the kernel is
    a custom op that reads the lengths from memory when it runs. Off CPU, the one read left is
    cross-attention without a ``bias`` whose maximum lengths are both unknown.

    On CUDA the fused kernels have no double backward: ``create_graph=True`` through them
    raises torch's error (``torch.func`` transforms and forward AD take the general path).
    They take grouped-query heads and windows; the other variants take the general path.

    Raises:
        TypeError: an argument is not a RaggedArray, or dtypes differ or are not floating.
        ValueError: shapes, batch sizes, heads or partitions do not match, or ``causal`` (or
            a positional variant) with different partitions.

    >>> import ragged, torch
    >>> torch.manual_seed(0) and None
    >>> x = ragged.from_lengths(torch.randn(5, 2, 4), [2, 0, 3])  # (B=3, L*, H=2, Dh=4)
    >>> out = ragged.attention(x, x, x, causal=True)
    >>> out.shape, out.partition is x.partition
    (RaggedShape(3, [2, 0, 3], 2, 4), True)
    >>> segment = x[2].transpose(0, 1)  # (H, L, Dh)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     segment, segment, segment, is_causal=True)
    >>> torch.allclose(out[2], ref.transpose(0, 1), atol=1e-6)
    True

    Grouped-query attention over a sliding window of two keys back:

    >>> kv = ragged.from_lengths(torch.randn(5, 1, 4), [2, 0, 3])  # one key/value head
    >>> out = ragged.attention(x, kv, kv, causal=True, window=(1, 0))
    >>> near = torch.ones(3, 3, dtype=torch.bool).tril() & ~torch.ones(3, 3, dtype=torch.bool).tril(-2)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     segment, kv[2].transpose(0, 1), kv[2].transpose(0, 1), attn_mask=near, enable_gqa=True)
    >>> torch.allclose(out[2], ref.transpose(0, 1), atol=1e-6)
    True
    """
    if is_multi_level(q, k, v):  # within every row of the innermost ragged axis
        return attention_levels(
            attention,
            q,
            k,
            v,
            bias,
            document_ids,
            causal=causal,
            scale=scale,
            dropout_p=dropout_p,
            window=window,
            alibi=alibi,
            relative_bias=relative_bias,
            prefix=prefix,
            score_mod=score_mod,
            mask_mod=mask_mod,
        )
    _check_arrays(q, k, v)
    q_level, k_level = q.partition.levels[0], k.partition.levels[0]
    same = q.partition is k.partition
    if causal and not same:
        if not q.partition.equals(k.partition):
            raise value_error(
                attention,
                "causal",
                "needs self-attention: q and k with equal partitions",
                f"q {shape_text(q)} and k {shape_text(k)}",
            )
        same = True
    positional = (window, alibi, relative_bias, document_ids, prefix)
    if not same and any(x is not None for x in positional) and q.partition.equals(k.partition):
        same = True
    parsed = variants.parse(
        attention,
        q,
        same,
        causal,
        window,
        alibi,
        relative_bias,
        document_ids,
        prefix,
        score_mod,
        mask_mod,
    )
    if scale is None:
        # int(): the head width is a model constant; a symbolic scale would make Dynamo
        # restart its analysis to turn the float into a tensor.
        scale = 1.0 / math.sqrt(int(q.values.shape[-1]))
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise type_error(attention, "scale", "must be a float or None", typename(scale))
    if dropout_p is None:
        dropout_p = 0.0
    elif isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise type_error(attention, "dropout_p", "must be a float or None", typename(dropout_p))
    elif not 0.0 <= dropout_p < 1.0:
        raise value_error(attention, "dropout_p", "must be in [0, 1)", dropout_p)
    bias_values = None if bias is None else _check_bias(bias, q, k)
    scale = float(scale)
    key_level = q_level if same else k_level
    out = _attend(q, k, v, bias_values, q_level, key_level, same, scale, causal, dropout_p, parsed)
    return RaggedArray(out, q.partition, q.axes)


def _attend(
    q: RaggedArray,
    k: RaggedArray,
    v: RaggedArray,
    bias: Tensor | None,
    q_level: RowPartition,
    k_level: RowPartition,
    same: bool,
    scale: float,
    causal: bool,
    dropout_p: float,
    parsed: variants.Parsed,
) -> Tensor:
    """The values ``[Tq, H, Dv]`` of the attention of ``q``'s segments (``q_level``) over
    ``k``'s (``k_level``), with checked arguments: picks the kernel."""
    variant = parsed.variant
    window = (variant.left, variant.right) if variant.windowed else None
    kernel = varlen.select(
        q.values,
        k.values,
        v.values,
        q_level,
        k_level,
        bias=bias is not None,
        causal=causal,
        dropout_p=dropout_p,
        window=variant.windowed,
        variants=parsed.unfused,
    )
    if kernel is not None:
        return varlen.attention(
            kernel,
            q.values,
            k.values,
            v.values,
            q_level,
            k_level,
            scale,
            causal,
            dropout_p,
            window,
        )
    args = (q.values, k.values, v.values, bias)
    if torch.compiler.is_compiling():
        longest = q_level.max_length if q_level.max_length is not None else q.values.shape[0]
        variant, extras = variants.tabulate(attention, parsed, q, longest)
        custom_op = variant.mask_mod is None and variant.score_mod is None
        if q.device.type == "cpu" and dropout_p == 0.0 and custom_op and not TILES_UNDER_COMPILE:
            out, _ = bucketed_attention_op(
                *args,
                *extras,
                q_level.lengths,
                k_level.lengths,
                scale,
                causal,
                variant.left,
                variant.right,
                variant.radius,
            )
            return out
        geometry = _static_geometry(q, k, bias, same)
        return tiled_attention(*args, geometry, scale, causal, dropout_p, extras, variant)
    if q.device.type not in BUCKET_DEVICES and _bounded(q_level, k_level, bias, same):
        longest = q_level.max_length if q_level.max_length is not None else q.values.shape[0]
        variant, extras = variants.tabulate(attention, parsed, q, longest)
        geometry = _static_geometry(q, k, bias, same)
        return tiled_attention(*args, geometry, scale, causal, dropout_p, extras, variant)
    head_numel = q.values.shape[1] * q.values.shape[2]
    if parsed.relative is None and native_attention.runs(
        *args, parsed.extras, parsed.variant, dropout_p
    ):
        return native_attention.attention(
            *args[:3],
            q_level.offsets,
            k_level.offsets,
            scale,
            causal,
            lambda: planner.plan(q_level, k_level, head_numel),
        )
    plan = planner.plan(q_level, k_level, head_numel)
    variant, extras = variants.tabulate(attention, parsed, q, max(plan.host_q, default=0))
    if dropout_p > 0.0 or variant.score_mod is not None:
        geometry = _host_geometry(q_level, k_level, plan)
        return tiled_attention(*args, geometry, scale, causal, dropout_p, extras, variant)
    return buckets.bucketed_attention(*args, extras, plan, scale, variant)


# --- checks -----------------------------------------------------------------------------------


def _check_arrays(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, RaggedArray):
            raise type_error(attention, name, "must be a RaggedArray", typename(x))
        if x.values.dim() != 3:
            raise value_error(attention, name, "must have shape (B, L*, H, Dh)", shape_text(x))
        if not x.dtype.is_floating_point:
            raise type_error(attention, name, "must have a floating-point dtype", x.dtype)
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise type_error(attention, name, f"must have the dtype of `q` ({q.dtype})", x.dtype)
        if x.device != q.device:
            raise value_error(
                attention, name, f"must be on the device of `q` ({q.device})", x.device
            )
    if k.num_segments != q.num_segments:
        raise value_error(
            attention, "k", f"must have the batch size of `q` ({q.num_segments})", k.num_segments
        )
    variants.check_partition(attention, "v", v, "k", k, "keys and values pair up row by row")
    heads, width = q.values.shape[1:]
    if k.values.shape[2] != width:
        raise value_error(
            attention, "k", f"must have the head width of `q` ({width})", k.values.shape[2]
        )
    kv_heads = k.values.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise value_error(
            attention,
            "k",
            f"must have a number of heads dividing the heads of `q` ({heads})",
            kv_heads,
        )
    if v.values.shape[1] != kv_heads:
        raise value_error(
            attention, "v", f"must have the heads of `k` ({kv_heads})", v.values.shape[1]
        )


def _check_bias(bias: Any, q: RaggedArray, k: RaggedArray) -> Tensor:
    if not isinstance(bias, RaggedArray):
        raise type_error(attention, "bias", "must be a RaggedArray or None", typename(bias))
    heads = q.values.shape[1]
    if bias.ragged_ndim != 2 or bias.values.dim() != 2 or bias.values.shape[1] != heads:
        expected = f"must have shape (B, Lq*, Lk*, H) with H = {heads}"
        raise value_error(attention, "bias", expected, shape_text(bias))
    if bias.dtype != q.dtype:
        raise type_error(attention, "bias", f"must have the dtype of `q` ({q.dtype})", bias.dtype)
    rows, columns = bias.partition.levels
    q_level, k_level = q.partition.levels[0], k.partition.levels[0]
    if rows is q_level and columns.columns is k_level:
        return bias.values
    if not (rows.equals(q_level) and tensors_equal(columns.lengths, _widths(q, k))):
        raise value_error(attention, "bias", BIAS_PARTITION, shape_text(bias))
    return bias.values


def _widths(q: RaggedArray, k: RaggedArray) -> Tensor:
    """``Lk_b`` for every query row: the row lengths of the pair map's second level."""
    return k.lengths.index_select(0, q.partition.levels[0].row_ids)


# --- geometry of the composite path -----------------------------------------------------------


def _pair_offsets(q_level: RowPartition, k_level: RowPartition) -> Tensor:
    counts = q_level.lengths * k_level.lengths
    return torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))


def _bounded(q_level: RowPartition, k_level: RowPartition, bias: Tensor | None, same: bool) -> bool:
    """Whether ``_static_geometry`` bounds the tiles without reading the device."""
    return (
        bias is not None
        or (same and q_level.sum_squares is not None)
        or k_level.max_length is not None
        or q_level.max_length is not None
    )


def _static_geometry(q: RaggedArray, k: RaggedArray, bias: Tensor | None, same: bool) -> Geometry:
    """Bounds that need no host read: from sizes and the partitions' static metadata."""
    q_level, k_level = q.partition.levels[0], k.partition.levels[0]
    s = COMPILE_BLOCK
    num = q.num_segments
    q_total, k_total = q.values.shape[0], k.values.shape[0]
    q_blocks = block_bound(q_total, num, s)
    k_blocks = block_bound(k_total, num, s)
    pairs = None
    if bias is not None:
        pairs = bias.shape[0]
    elif same and q_level.sum_squares is not None:
        pairs = q_level.sum_squares
    if pairs is not None:
        tiles = tile_bound(pairs, q_total, k_total, num, s)
    elif k_level.max_length is not None:
        # sum_b ceil(Lq_b / s) * ceil(Lk_b / s) <= (query blocks) * ceil(max Lk / s)
        tiles = q_blocks * ((k_level.max_length + s - 1) // s + 1)
    elif q_level.max_length is not None:
        tiles = k_blocks * ((q_level.max_length + s - 1) // s + 1)
    else:  # nothing static to bound the tiles with: read the pair count (documented)
        tiles = tile_bound(int((q_level.lengths * k_level.lengths).sum()), q_total, k_total, num, s)
    return Geometry(
        q_level.lengths,
        q_level.offsets,
        q_level.row_ids,
        k_level.lengths,
        k_level.offsets,
        _pair_offsets(q_level, k_level) if bias is not None else None,
        q_blocks,
        k_blocks,
        tiles,
        s,
    )


def _host_geometry(q_level: RowPartition, k_level: RowPartition, plan: planner.Plan) -> Geometry:
    """The composite path's geometry with exact counts from the host lengths (eager mode)."""
    s = planner.COMPOSITE_BLOCK
    lq, lk = plan.host_q, plan.host_k
    return Geometry(
        q_level.lengths,
        q_level.offsets,
        q_level.row_ids,
        k_level.lengths,
        k_level.offsets,
        _pair_offsets(q_level, k_level),
        sum(-(-n // s) for n in lq),
        sum(-(-n // s) for n in lk),
        sum(-(-a // s) * -(-c // s) for a, c in zip(lq, lk, strict=True)),
        s,
    )
