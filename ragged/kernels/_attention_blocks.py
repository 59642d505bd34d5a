"""The blocks of one bucket of the eager attention kernel (``_attention_buckets``): reading its
rows, its additive mask (pair bias, variants, padding) on any sub-block of its ``[L, L]``
positions, and the *bands* that cut a sliding window's work.

A bucket holds ``n`` segments padded to ``q_len`` query rows and ``k_len`` keys, all starting
at position 0, so the variants of ``_attention_mods`` are evaluated on positions ``i`` and
``j`` that every segment of the bucket shares (document ids, prefixes and ``mask_mod`` add the
segment).

Bands: with a window ``(left, right)`` (``right = 0`` when causal) a query row sees at most
``w = left + right + 1`` keys, yet one kernel call on the whole bucket computes every
``L x L`` score (the flash kernel skips fully masked blocks only above the causal diagonal).
Cut the query rows into chunks of ``C`` rows; a chunk ``[a, b)`` sees the keys
``[a - left, b + right)`` only, so one call per chunk computes ``~ L (C + w)`` scores instead
of ``L^2``. Exact: the masks of a chunk are the bucket's, restricted to it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._attention_mods import Extras, Variant, position_bias, visible
from ._attention_plan import Bucket, Plan, Rows

# A window is cut into bands when the banded work is below this fraction of the full call's.
BAND_GAIN = 0.6
# Query rows per band: larger bands mean fewer calls, smaller ones fewer masked scores. 64 was
# the best of 32/64/128/w in a one-segment timing (L = 512..2048, windows 64..256); the
# encoder-level effect is measured by benchmarks/encoder.py (ragged against ragged-unbanded).
BAND_ROWS = 64

Block = tuple[int, int, int, int]  # query rows [a, b), keys [c, d) of a bucket


def pair_index(bucket: Bucket, dump: int | None = None) -> Tensor:
    """Index of every (query, key) slot of the bucket in the bias values, ``[n, q_len,
    k_len]``: clamped into the segment where padded (``dump is None``, for reading), or the dump
    row ``dump`` there (for writing). Computed per call (its size is the bucket's pairs)."""
    device = bucket.pair_start.device
    i = torch.arange(bucket.q_len, device=device).view(1, -1, 1)
    j = torch.arange(bucket.k_len, device=device).view(1, 1, -1)
    nq, nk = bucket.q_counts.view(-1, 1, 1), bucket.k_counts.view(-1, 1, 1)
    start = bucket.pair_start.view(-1, 1, 1)
    if dump is None:
        return start + torch.minimum(i, nq - 1) * nk + torch.minimum(j, nk - 1)
    inside = (i < nq) & (j < nk)
    return torch.where(inside, start + i * nk + j, dump)


def read(x: Tensor, rows: Rows, n: int, size: int) -> Tensor:
    """A bucket's rows of ``x`` (``[T, H, D]``) as ``[n, H, size, D]``."""
    block = x[rows[0] : rows[1]] if isinstance(rows, tuple) else x.index_select(0, rows)
    return block.view(n, size, *x.shape[1:]).transpose(1, 2)


def write(buffer: Tensor, dest: Rows, part: Tensor) -> None:
    """Write a bucket's ``[n, H, size, D]`` result rows into ``buffer`` (``[T + 1, H, D]``; row
    ``T`` is a dump for padded slots)."""
    rows = part.transpose(1, 2)  # [n, size, H, D]
    if isinstance(dest, tuple):
        buffer[dest[0] : dest[1]].view_as(rows).copy_(rows)
    else:
        buffer.index_put_((dest.view(rows.shape[:2]),), rows)


def buffer(sources: tuple[Tensor | None, ...], rows: int, tail: Any, like: Tensor) -> Tensor:
    """Zeros ``[rows + 1, *tail]`` (the last row is a dump) of ``like``'s dtype and device,
    batched under ``vmap`` when any source is: made from an empty slice of the sources rather
    than by a factory. The result is returned as the view ``[:rows]``."""
    anchor = None
    for source in sources:
        if source is not None:
            zero = source.reshape(-1)[:0].sum()
            anchor = zero if anchor is None else anchor + zero
    if anchor is None:
        return like.new_zeros((rows + 1, *tail))
    return anchor.to(like.dtype).expand(rows + 1, *tail).contiguous()


def result(p: Plan, idle: bool, sources: tuple[Tensor | None, ...], shape: torch.Size) -> Tensor:
    """The buffer a gradient or tangent of ``shape`` is written into. Uninitialised and without
    a dump row when every row is written (no padding, no idle rows) and there is one source of
    that shape: its ``empty_like``, batched under ``vmap`` when the source is. Else
    ``_buffer`` (batched when any source is)."""
    present = [s for s in sources if s is not None]
    if not p.padded and not idle and len(present) == 1 and present[0].shape == shape:
        return torch.empty_like(present[0], memory_format=torch.contiguous_format)
    like = next(s for s in sources if s is not None)
    return buffer(sources, shape[0], tuple(shape[1:]), like)


def trim(buffer: Tensor, rows: int) -> Tensor:
    """Drop the dump row of a ``_buffer`` (no-op for an exact buffer)."""
    return buffer if buffer.shape[0] == rows else buffer[:rows]


def bias_block(bucket: Bucket, bias: Tensor) -> Tensor:
    """A bucket's block of the pair bias ``[pairs, H]`` as ``[n, H, q_len, k_len]``."""
    if bucket.pair_range is not None:
        block = bias[bucket.pair_range[0] : bucket.pair_range[1]]
    else:
        block = bias.index_select(0, pair_index(bucket).view(-1))
    return block.view(bucket.n, bucket.q_len, bucket.k_len, -1).permute(0, 3, 1, 2)


def whole(bucket: Bucket) -> Block:
    return (0, bucket.q_len, 0, bucket.k_len)


def positions(block: Block, device: torch.device) -> tuple[Tensor, Tensor]:
    """Query and key positions of a block, ``[q, 1]`` and ``[1, k]``."""
    a, b, c, d = block
    return (
        torch.arange(a, b, device=device).view(-1, 1),
        torch.arange(c, d, device=device).view(1, -1),
    )


def _visible(
    bucket: Bucket,
    block: Block,
    extras: Extras,
    variant: Variant,
    heads: int,
    device: torch.device,
) -> Tensor | None:
    """The block's pairs kept by the variants' masks, bool broadcast to ``[n, H, q, k]``."""
    masked = variant.windowed or variant.mask_mod is not None
    if not masked and extras.prefix is None and extras.documents is None:
        return None
    n = bucket.n
    a, b, c, d = block
    i, j = positions(block, device)
    i, j = i.view(1, 1, -1, 1), j.view(1, 1, 1, -1)
    prefix = docs_i = docs_j = mod_args = None
    if extras.prefix is not None:
        prefix = extras.prefix.index_select(0, bucket.segments).view(n, 1, 1, 1)
    if extras.documents is not None:
        docs = extras.documents.view(-1, 1, 1)
        docs_i = read(docs, bucket.q_read, n, bucket.q_len)[:, :, a:b].reshape(n, 1, -1, 1)
        docs_j = read(docs, bucket.k_read, n, bucket.k_len)[:, :, c:d].reshape(n, 1, 1, -1)
    if variant.mask_mod is not None:
        # Padded slots see their segment's last position (their scores are dropped anyway).
        h = torch.arange(heads, device=device) % variant.heads
        mod_args = (bucket.segments.view(n, 1, 1, 1), h.view(1, heads, 1, 1))
        if bucket.q_keep is not None or bucket.key_keep is not None:
            i = torch.minimum(i, bucket.q_counts.view(n, 1, 1, 1) - 1)
            j = torch.minimum(j, bucket.k_counts.view(n, 1, 1, 1) - 1)
    return visible(i, j, variant, prefix, docs_i, docs_j, mod_args)


def mask(
    bucket: Bucket,
    bias: Tensor | None,
    extras: Extras,
    variant: Variant,
    dtype: torch.dtype,
    heads: int,
    block: Block | None = None,
) -> Tensor | None:
    """The additive mask of a bucket's ``block`` (default: all of it), broadcast to
    ``[n, H, q, k]``: the pair bias, the relative-position and ALiBi biases, ``-inf`` where the
    variants' masks or padded keys hide a pair; ``None`` when there is nothing.

    On the whole bucket, causal attention without a prefix is the kernel's own (its
    ``is_causal``), and padded keys then need no mask (they come after every real query). A
    band (``block`` given) carries the causal mask itself: its diagonal is not the kernel's.
    """
    device = bucket.pair_start.device
    banded = block is not None
    block = whole(bucket) if block is None else block
    a, b, c, d = block
    out = None if bias is None else bias_block(bucket, bias)[:, :, a:b, c:d]
    if extras.table is not None or extras.slopes is not None:
        i, j = positions(block, device)
        term = position_bias(i, j, variant.radius, extras.table, extras.slopes)
        if term is not None:
            term = term.unsqueeze(0).to(dtype)  # [1, H, q, k]
            out = term if out is None else out + term
    keep = _visible(bucket, block, extras, variant, heads, device)
    if banded and variant.causal and extras.prefix is None:
        i, j = positions(block, device)
        keep = j <= i if keep is None else keep & (j <= i)
    if bucket.key_keep is not None and not variant.causal:
        pad = bucket.key_keep.view(bucket.n, 1, 1, bucket.k_len)[..., c:d]
        keep = pad if keep is None else keep & pad
    if keep is None:
        return out
    if out is None:
        out = torch.zeros((), dtype=dtype, device=device)
    return torch.where(keep, out, float("-inf"))


def bands(bucket: Bucket, variant: Variant, extras: Extras) -> list[Block] | None:
    """The bands of a windowed bucket (see the module doc), or ``None`` when one call on the
    whole bucket is cheaper (no window, a short segment, a wide window, a prefix)."""
    left = variant.left
    right = 0 if variant.causal else variant.right
    length = bucket.q_len
    if left is None or right is None or extras.prefix is not None or bucket.k_len != length:
        return None
    width = left + right + 1
    rows = BAND_ROWS
    # Scores computed: ~ L (C + w) banded against L^2 for one call (causal or not: measured,
    # the CPU kernel's causal skipping saves little).
    if rows + width >= BAND_GAIN * length:
        return None
    out = []
    for a in range(0, length, rows):
        b = min(a + rows, length)
        out.append((a, b, max(0, a - left), min(length, b + right)))
    return out
