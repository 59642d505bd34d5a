"""The segmented sort kernel on plain tensors: a stable sort of every column of ``[rows, C]``
values within segments, by one 1-D radix sort of integer keys per chunk of columns (see
``ragged.ops._sorting`` for the design and its measurements)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._native import differentiable, plain

# Dtypes with an order-preserving integer rank (``_signed_rank``), and its width in bits.
RANK_WIDTH = {
    torch.float64: 64,
    torch.float32: 32,
    torch.float16: 16,
    torch.bfloat16: 16,
    torch.int64: 64,
    torch.int32: 32,
    torch.int16: 16,
    torch.int8: 8,
    torch.uint8: 8,
    torch.bool: 1,
}
_AS_INT = {64: torch.int64, 32: torch.int32, 16: torch.int16}


def _signed_rank(columns: Tensor, descending: bool, out: Tensor | None = None) -> Tensor:
    """An integer tensor ordered as ``columns`` by ``torch.sort``: a fresh contiguous one, or
    ``out`` (same shape and dtype as ``columns``) overwritten.

    Floats: the bit pattern, with the magnitude bits of negative numbers flipped, orders like
    the number as a signed integer of the same width. All NaNs map to one rank above +inf and
    ``-0.0`` to the rank of ``0.0``, so that they tie as in ``torch.sort``. ``descending``
    reverses the order (``~rank``). The steps work in place on one fresh copy: large fresh
    tensors cost more than the arithmetic here.
    """
    if out is None:
        rank = columns.clone(memory_format=torch.contiguous_format)
    else:
        rank = out.copy_(columns)
    if columns.is_floating_point():
        width = RANK_WIDTH[columns.dtype]
        rank.add_(0.0)  # -0.0 + 0.0 is 0.0
        rank = rank.view(_AS_INT[width])
        magnitude = (1 << (width - 1)) - 1
        rank ^= (rank >> (width - 1)).bitwise_and_(magnitude)
        if torch.compiler.is_compiling():  # masked_fill's decomposition guards on size 1
            rank = torch.where(torch.isnan(columns), magnitude, rank)
        else:
            rank.masked_fill_(torch.isnan(columns), magnitude)
    return rank.bitwise_not_() if descending else rank


# Elements per 1-D sort, and rows per range of a large batch. torch sorts a 1-D integer tensor
# of at least 32768 elements with a radix sort (measured here: 13 ns per int64 key at 2**17
# keys, 22 at 2**18, 57 at 2**20, while a float32 comparison sort takes ~230 and sorting the
# rows of a 2-D tensor ~70); it is fastest while its buffers stay in cache, so several short
# columns share one sort, and a long column is cut into ranges (``_row_ranges``).
_SORT_CHUNK = 1 << 17
_HALF = 1 << 31
_LOW32 = (1 << 32) - 1


def _argsort_rows(
    keys: Callable[[int, int], Tensor],
    shape: tuple[int, int],
    span: int,
    out: Tensor | None = None,
) -> Tensor:
    """Stable argsort of every row of an int64 key matrix of ``shape`` ``[C, n]`` (into
    ``out`` if given).

    ``keys(start, stop)`` builds rows ``start:stop`` of the keys, each in ``[0, span)``; they are
    built chunk by chunk, so that no key matrix is ever allocated whole. Eagerly, rows are
    sorted as 1-D tensors (the radix sort), a few short rows together: row ``j`` of a chunk is
    lifted by ``j * span`` so that rows stay apart. Compiled code sorts along dim 1 instead (a
    chunk size derived from a dynamic ``n`` would guard on it).
    """
    rows, n = shape
    if torch.compiler.is_compiling() or rows * n == 0:
        order = torch.argsort(keys(0, rows), dim=1, stable=True)
        return order if out is None else out.copy_(order)
    per = max(1, min(rows, _SORT_CHUNK // n))
    if per * span >= 1 << 62:
        per = 1
    starts = range(0, rows, per)
    chunks = (_sort_chunk(keys(start, min(start + per, rows)), span) for start in starts)
    if out is None:  # functorch wrappers too: no out= (vmap has no rule for it)
        parts = [order if lift is None else order.sub_(lift * n) for order, lift in chunks]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    for start, (order, lift) in zip(starts, chunks, strict=True):
        dest = out[start : start + order.shape[0]]
        if lift is None:
            dest.copy_(order)
        else:
            torch.sub(order, lift * n, out=dest)
    return out


def _sort_chunk(chunk: Tensor, span: int) -> tuple[Tensor, Tensor | None]:
    """Stable argsort of every row of ``chunk`` (keys in ``[0, span)``) as one 1-D sort:
    positions into the flattened chunk, and the lift ``j`` of row ``j`` (``None`` for one
    row), so that ``order - lift * n`` are positions within each row."""
    if chunk.shape[0] == 1:
        return torch.argsort(chunk[0], stable=True).unsqueeze(0), None
    lift = torch.arange(chunk.shape[0], device=chunk.device).unsqueeze(1)
    order = torch.argsort((chunk + lift * span).reshape(-1), stable=True)
    return order.view(chunk.shape), lift


def segment_order(
    values: Tensor,
    row_ids: Tensor,
    num: int,
    descending: bool,
    row_starts: Tensor | None = None,
) -> Tensor:
    """Row permutation that sorts each column of ``values`` within segments, stably.

    Args:
        values: ``[total, C]`` (any layout).
        row_ids: the sorted segment id of each row, ``[total]``.
        num: number of segments.
        descending: sort each segment from the largest value down.
        row_starts: the first row of each row's segment, ``[total]``; given, the result
            holds positions within segments (the rows minus ``row_starts[:, None]``).

    Returns:
        int64 ``[total, C]``: column ``c`` of the result lists the rows of ``values`` (or
        their positions) in the order that sorts column ``c`` within every segment (segments
        stay in place).
    """
    ranges = _row_ranges(values, row_ids)
    return _order(values, row_ids, num, descending, ranges, row_starts)


def segment_sorted(values: Tensor, row_ids: Tensor, num: int, descending: bool) -> Tensor:
    """``values.gather(0, segment_order(values, ...))``: every column of ``values`` sorted
    within segments, for values with no gradient to record. A large batch is gathered range by
    range and never holds the ``[total, C]`` int64 permutation (twice the values' bytes)."""
    ranges = _row_ranges(values, row_ids)
    if len(ranges) > 1 and not differentiable(values):
        return _by_ranges(values, row_ids, num, descending, ranges, gather=True)
    return take_columns(values, _order(values, row_ids, num, descending, ranges))


def _order(
    values: Tensor,
    row_ids: Tensor,
    num: int,
    descending: bool,
    ranges: list[tuple[int, int]],
    row_starts: Tensor | None = None,
) -> Tensor:
    """:func:`segment_order` over the row ``ranges`` of :func:`_row_ranges`."""
    if len(ranges) > 1:
        return _by_ranges(values, row_ids, num, descending, ranges, row_starts=row_starts)
    # Columns first and contiguous: every elementwise step streams, and each column's keys
    # are one contiguous 1-D run for the radix sort.
    rank = _signed_rank(values.detach().t(), descending)
    order = _order_rows(rank, _segment_base(row_ids), _span(num), _wide(values)).t()
    return order if row_starts is None else order.sub_(row_starts.unsqueeze(1))  # fresh


def _segment_base(row_ids: Tensor) -> Tensor:
    return (row_ids << 32) + _HALF  # segment * 2**32, and 2**31 to lift signed ranks to >= 0


def _span(num: int) -> int:
    return max(num, 1) << 32


def _wide(values: Tensor) -> bool:
    return RANK_WIDTH[values.dtype] > 32


def _by_ranges(
    values: Tensor,
    row_ids: Tensor,
    num: int,
    descending: bool,
    ranges: list[tuple[int, int]],
    gather: bool = False,
    row_starts: Tensor | None = None,
) -> Tensor:
    """:func:`segment_order` range by range (``gather``: :func:`segment_sorted`'s values).

    Each range goes through warm buffers (a fresh tensor is page-faulted in), viewed as one
    contiguous ``[C, rows]`` block (torch transposes those a block at a time), and the
    positions come out row-major: gathering the sorted values, and scattering their gradient
    back, take twice as long with a transposed index.
    """
    columns, base, span, wide = values.detach(), _segment_base(row_ids), _span(num), _wide(values)
    width, device = values.shape[1], values.device
    size = width * max(b - a for a, b in ranges)
    ranks = torch.empty(size, dtype=values.dtype, device=device)
    positions = torch.empty(size, dtype=torch.int64, device=device)
    if gather:
        local = torch.empty(size, dtype=torch.int64, device=device)
        out = torch.empty(values.shape, dtype=values.dtype, device=device)
    else:
        out = torch.empty(values.shape, dtype=torch.int64, device=device)
    for start, stop in ranges:
        shape = (width, stop - start)
        rank = _signed_rank(columns[start:stop].t(), descending, _block(ranks, shape))
        part = _order_rows(rank, base[start:stop], span, wide, _block(positions, shape))
        if gather:
            index = _block(local, shape[::-1]).copy_(part.t())
            torch.gather(columns[start:stop], 0, index, out=out[start:stop])
        elif row_starts is None:
            torch.add(part.t(), start, out=out[start:stop])
        else:  # positions within segments: part counts rows from the range's start
            shift = (row_starts[start:stop] - start).unsqueeze(1)
            torch.sub(part.t(), shift, out=out[start:stop])
    return out


def _block(buffer: Tensor, shape: tuple[int, int]) -> Tensor:
    """The first ``shape[0] * shape[1]`` elements of 1-D ``buffer`` as a contiguous matrix."""
    return buffer[: shape[0] * shape[1]].view(shape)


def _row_ranges(values: Tensor, row_ids: Tensor) -> list[tuple[int, int]]:
    """Row ranges of about ``_SORT_CHUNK`` rows that cut no segment (whole segments each).

    Segments never mix, so each range sorts on its own: a column's keys then fit the radix
    sort's cache-sized runs however many rows the batch has (measured on ``[2**20, 64]``
    float32 values in 8192 segments: 64 sorts of 2**20 keys took 2.4 s). The cuts are read
    on the host, so plain CPU tensors only (not while compiling, nor for a functorch wrapper,
    which the warm buffers could not hold: one range, no sync, no guard).
    """
    n = row_ids.shape[0]
    if n <= _SORT_CHUNK or torch.compiler.is_compiling() or not plain(values):
        return [(0, n)]
    # the first row of the segment at every _SORT_CHUNK-th row (row_ids are sorted)
    cuts = torch.searchsorted(row_ids, row_ids[::_SORT_CHUNK].contiguous()).tolist()
    cuts = sorted(set(cuts) | {0, n})
    return list(itertools.pairwise(cuts))


def _order_rows(
    rank: Tensor, base: Tensor, span: int, wide: bool, out: Tensor | None = None
) -> Tensor:
    """``[C, n]`` positions (within these ``n`` rows; into ``out`` if given) that sort each
    row of ``rank`` by the segment ``base`` of each position, stably; see
    :func:`segment_order`."""
    shape = (rank.shape[0], rank.shape[1])
    if not wide:
        # One sort of segment * 2**32 + (rank + 2**31): segments never overlap.
        return _argsort_rows(lambda a, b: base + rank[a:b], shape, span, out)
    # 64-bit ranks do not fit next to the segment: two stable sorts (LSD order), by the low
    # half of the rank, then by segment and high half.
    order = _argsort_rows(lambda a, b: rank[a:b] & _LOW32, shape, 1 << 32)

    def by_segment_and_high(a: int, b: int) -> Tensor:
        rows = order[a:b]
        return base[rows] + (rank[a:b] >> 32).gather(1, rows)

    by_segment = _argsort_rows(by_segment_and_high, shape, span)
    return (
        order.gather(1, by_segment) if out is None else torch.gather(order, 1, by_segment, out=out)
    )


def as_columns(values: Tensor) -> Tensor:
    """``values`` as ``[rows, C]``, every inner entry a column."""
    return values.reshape(values.shape[0], math.prod(values.shape[1:]))


def take_columns(values: Tensor, perm: Tensor) -> Tensor:
    """Rows of every column of ``values`` picked by the ``[n, C]`` permutation ``perm``."""
    columns = as_columns(values)
    if columns.shape[1] == 1:
        picked = columns.index_select(0, perm[:, 0])
    else:
        picked = columns.gather(0, perm)
    return picked.reshape(perm.shape[0], *values.shape[1:])
