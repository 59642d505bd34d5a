"""Variable-length attention as a composite of differentiable torch ops: the sync-free path.

Every segment is cut into blocks of ``block`` rows (the last block of a segment is padded), and
segment ``b`` contributes the ``nq_b x nk_b`` *tiles* (query block, key block) of its own keys.
Scores are one batched matmul over the tiles, ``[tiles, H, block, block]``; the softmax runs
over all tiles of a query block (a segment max and a segment sum over tiles); the output is one
batched matmul with the value blocks, summed per query block. Padded keys are masked, padded
query rows are dropped. Memory is ``O(sum_b L_b^2 + block * (T + B))``, never
``O(B * Lmax^2)``.

Every size is static: the numbers of blocks and tiles are upper bounds computed from sizes that
a partition knows without reading the device (see ``Geometry``), and the slack tiles are
masked out. So under ``torch.compile(dynamic=True)`` this is one graph with no data-dependent
size, and every ``torch.func`` transform works on it (it is made of ``matmul``,
``index_select``, ``index_add``, ``scatter_reduce`` and elementwise ops).

The variants (``_attention_mods``) apply per tile: grouped-query heads by folding each group's
query heads into one matmul (keys and values are not repeated), the masks and positional biases
on the tile's positions ``i = query block * block + slot`` and ``j`` likewise, and ``score_mod``
on the tile's scores (any differentiable function: this is its path in every mode).

This is also the reference for the eager kernel's transform rules (forward AD, double
backward) in ``_attention_buckets.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._attention_mods import NONE, PLAIN, Extras, Variant, position_bias, pv, qk, visible

COMPILE_BLOCK = 32  # rows per block when compiling (a constant: one graph for every batch)


@dataclasses.dataclass(frozen=True, eq=False)
class Geometry:
    """The ragged structure of an attention call, with static bounds on its blocks and tiles.

    Attributes:
        q_lengths, q_offsets, q_row_ids: int64 ``[B]``, ``[B + 1]``, ``[Tq]`` of the queries'
            ragged axis.
        k_lengths, k_offsets: the same for the keys (and values).
        pair_offsets: int64 ``[B + 1]``, offsets of each segment's ``Lq_b * Lk_b`` pairs in a
            pair bias (only needed with a bias).
        q_blocks, k_blocks: upper bounds on ``sum_b ceil(L_b / block)``.
        tiles: upper bound on ``sum_b ceil(Lq_b / block) * ceil(Lk_b / block)``.
        block: rows per block.
    """

    q_lengths: Tensor
    q_offsets: Tensor
    q_row_ids: Tensor
    k_lengths: Tensor
    k_offsets: Tensor
    pair_offsets: Tensor | None
    q_blocks: int
    k_blocks: int
    tiles: int
    block: int


# The bounds below avoid min/max of symbolic sizes (Inductor guards on which side of a Min is
# smaller) and are never 0 or 1 (Inductor specialises sizes 0 and 1 of intermediate tensors):
# either would compile a new graph when a batch crosses over. The slack blocks and tiles are
# masked like any other.
_SLACK = 2


def block_bound(total: Any, num_segments: Any, block: int) -> Any:
    """A static bound on ``sum_b ceil(L_b / block)``: ``total // block + B`` (plus slack)."""
    return total // block + num_segments + _SLACK


def tile_bound(pairs: Any, q_total: Any, k_total: Any, num: Any, block: int) -> Any:
    """A static bound on the tiles from the number of pairs ``sum_b Lq_b * Lk_b``.

    ``ceil(a / s) * ceil(c / s) <= (a c + (s - 1)(a + c) + (s - 1)^2) / s^2``, summed over b.
    """
    slack = block - 1
    bound = (pairs + slack * (q_total + k_total) + num * slack * slack) // (block * block)
    return bound + _SLACK


def _blocks(
    lengths: Tensor, offsets: Tensor, bound: int, block: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The block table of one ragged axis (``lengths`` ends with an empty segment, ``offsets``
    has one entry per segment).

    Returns the blocks per segment ``[B]``, the first block of each segment ``[B + 1]``, and
    for each of the ``bound`` blocks the row of each of its ``block`` slots (the padding row
    ``total`` where there is none) and whether the slot holds a real row, ``[bound, block]``.
    """
    num = lengths.shape[0]
    count = torch.div(lengths + (block - 1), block, rounding_mode="floor")
    first = F.pad(torch.cumsum(count, 0), (1, 0))
    ids = torch.arange(bound, device=lengths.device)
    segment = torch.searchsorted(first[1:], ids, right=True).clamp_max(num - 1)
    position = (ids - first[segment]).unsqueeze(1) * block
    position = position + torch.arange(block, device=lengths.device)
    real = (position < lengths[segment].unsqueeze(1)) & (ids < first[-1]).unsqueeze(1)
    rows = torch.where(real, offsets[segment].unsqueeze(1) + position, offsets[-1])
    return count, first, rows, real


def _with_padding_row(x: Tensor) -> Tensor:
    """``x`` with one zero row appended: padded slots read it (``x`` may be empty)."""
    return torch.cat([x, x.new_zeros((1, *x.shape[1:]))])


def _gather_blocks(x: Tensor, rows: Tensor) -> Tensor:
    """``x[rows]`` as ``[blocks, H, block, D]``."""
    blocks, block = rows.shape
    return x.index_select(0, rows.reshape(-1)).view(blocks, block, *x.shape[1:]).transpose(1, 2)


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    geometry: Geometry,
    scale: float,
    causal: bool,
    dropout_p: float = 0.0,
    extras: Extras = NONE,
    variant: Variant = PLAIN,
) -> Tensor:
    """Attention of every query row over the keys of its segment, ``[Tq, H, Dv]``.

    ``q``: ``[Tq, H, D]``; ``k``: ``[Tk, H_kv, D]``; ``v``: ``[Tk, H_kv, Dv]`` (``H_kv``
    divides ``H``); ``bias``: ``[pairs, H]`` (segment-major, row-major ``(i, j)`` within a
    segment) or ``None``; the variants in ``extras`` and ``variant`` (its ``causal`` is the
    ``causal`` argument's). Query rows with no keys, or whose keys are all masked, get 0.
    """
    g = geometry
    s = g.block
    heads = q.shape[1]
    device = q.device
    # One empty segment appended: slack blocks and tiles belong to it (and B may be 0).
    q_lengths, k_lengths = F.pad(g.q_lengths, (0, 1)), F.pad(g.k_lengths, (0, 1))
    num = q_lengths.shape[0]
    q_count, q_first, q_rows, _ = _blocks(q_lengths, g.q_offsets, g.q_blocks, s)
    k_count, k_first, k_rows, k_real = _blocks(k_lengths, g.k_offsets, g.k_blocks, s)

    # The tile table: segment b owns q_count[b] * k_count[b] tiles, row-major.
    per_segment = q_count * k_count
    first = F.pad(torch.cumsum(per_segment, 0), (1, 0))
    ids = torch.arange(g.tiles, device=device)
    segment = torch.searchsorted(first[1:], ids, right=True).clamp_max(num - 1)
    local = ids - first[segment]
    across = k_count[segment].clamp_min(1)
    qi = torch.div(local, across, rounding_mode="floor")
    kj = local - qi * across
    real_tile = ids < first[-1]
    tile_q = torch.where(real_tile, q_first[segment] + qi, 0)
    tile_k = torch.where(real_tile, k_first[segment] + kj, 0)

    q_tiles = _gather_blocks(_with_padding_row(q), q_rows).index_select(0, tile_q)
    k_tiles = _gather_blocks(_with_padding_row(k), k_rows).index_select(0, tile_k)
    scores = qk(q_tiles, k_tiles) * scale  # [tiles, H, s, s]
    # Positions within the segment: i of the query slots, j of the key slots.
    slot = torch.arange(s, device=device)
    i = (qi.view(-1, 1) * s + slot).view(-1, 1, s, 1)
    j = (kj.view(-1, 1) * s + slot).view(-1, 1, 1, s)
    nq = q_lengths[segment].view(-1, 1, 1, 1)
    nk = k_lengths[segment].view(-1, 1, 1, 1)
    keep = (k_real.index_select(0, tile_k) & real_tile.unsqueeze(1)).view(-1, 1, 1, s)
    if causal and extras.prefix is None:  # with a prefix, ``visible`` has the causal part
        keep = keep & (i >= j)
    if bias is not None and g.pair_offsets is not None:
        inside = (i < nq) & (j < nk) & real_tile.view(-1, 1, 1, 1)
        pair = g.pair_offsets[segment].view(-1, 1, 1, 1) + i * nk + j
        pair = torch.where(inside, pair, bias.shape[0]).squeeze(1)
        tile_bias = _with_padding_row(bias).index_select(0, pair.reshape(-1))
        tile_bias = tile_bias.view(-1, s, s, heads)
        scores = scores + tile_bias.permute(0, 3, 1, 2)
    # The variants see positions clamped into their segment (padded slots are masked anyway)
    # and the segment of slack tiles clamped into the batch.
    ic, jc = torch.minimum(i, (nq - 1).clamp_min(0)), torch.minimum(j, (nk - 1).clamp_min(0))
    b = segment.clamp_max(num - 2).clamp_min(0).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    if extras.table is not None or extras.slopes is not None:
        term = position_bias(
            ic.squeeze(1), jc.squeeze(1), variant.radius, extras.table, extras.slopes
        )
        if term is not None:  # [tiles, H, s, s]
            scores = scores + term
    if variant.score_mod is not None:
        scores = variant.score_mod(scores, b, h, ic, jc)
    prefix = docs_i = docs_j = None
    if extras.prefix is not None:
        prefix = F.pad(extras.prefix, (0, 1))[segment].view(-1, 1, 1, 1)
    if extras.documents is not None:
        docs = _with_padding_row(extras.documents.view(-1, 1))
        docs_i = docs.index_select(0, q_rows.reshape(-1)).view(-1, s).index_select(0, tile_q)
        docs_j = docs.index_select(0, k_rows.reshape(-1)).view(-1, s).index_select(0, tile_k)
        docs_i, docs_j = docs_i.view(-1, 1, s, 1), docs_j.view(-1, 1, 1, s)
    seen = visible(i, j, variant, prefix, docs_i, docs_j, None)
    if variant.mask_mod is not None:
        modded = variant.mask_mod(b, h, ic, jc).to(torch.bool)
        seen = modded if seen is None else seen & modded
    if seen is not None:
        keep = keep & seen
    scores = torch.where(keep, scores, float("-inf"))

    # Softmax over every key of a query row: the tiles of its query block, then their columns.
    # The shift is detached (softmax is invariant to it, so this is exact in every order).
    peak = scores.detach().amax(-1)  # [tiles, H, s]
    block_peak = peak.new_full((g.q_blocks, heads, s), float("-inf"))
    index = tile_q.view(-1, 1, 1).expand_as(peak)
    block_peak = block_peak.scatter_reduce(0, index, peak, "amax", include_self=True)
    block_peak = torch.where(torch.isfinite(block_peak), block_peak, 0.0)
    weights = torch.exp(scores - block_peak.index_select(0, tile_q).unsqueeze(-1))
    total = weights.new_zeros((g.q_blocks, heads, s)).index_add(0, tile_q, weights.sum(-1))
    total = torch.where(total > 0, total, 1.0)  # query rows with no keys: weights are all 0
    weights = weights / total.index_select(0, tile_q).unsqueeze(-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    values = _gather_blocks(_with_padding_row(v), k_rows).index_select(0, tile_k)
    per_tile = pv(weights, values)  # [tiles, H, s, Dv]
    out = per_tile.new_zeros((g.q_blocks, *per_tile.shape[1:])).index_add(0, tile_q, per_tile)

    # Back to rows: row p of segment b sits in block q_first[b] + p // s, slot p % s.
    rows_segment = g.q_row_ids
    position = torch.arange(q.shape[0], device=device) - g.q_offsets[rows_segment]
    flat = (q_first[rows_segment] + torch.div(position, s, rounding_mode="floor")) * s
    flat = flat + torch.remainder(position, s)
    out = out.transpose(1, 2).reshape(g.q_blocks * s, heads, v.shape[-1])
    return out.index_select(0, flat)
