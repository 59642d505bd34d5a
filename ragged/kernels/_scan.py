"""Kernels of the segmented scans: monoids, the block layout, block prefixes, and the eager
fast path (an ``autograd.Function`` over the native streaming scans of
``ragged.kernels._native``, with in-place torch kernels where those cannot run). The public ops
and the design are in ``ragged.ops._scans``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._partition import RowPartition
from . import _native as native
from ._monoids import MAX, MIN, MONOIDS, PROD, SUM, Monoid
from ._segment import use_fast_path

BLOCK = 16
"""Rows per block of the ragged-axis scan under ``torch.compile`` (``K`` above)."""
MAX_BLOCK = 32
"""Largest block in eager mode (measured: 32 beats 16 and 64 on 128-row mean lengths)."""


# --- the block layout -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """Where every row goes in the block buffer, and how the blocks group into segments.

    The buffer has ``nblocks`` blocks of ``block`` slots plus one last slot (for the identity
    that exclusive scans put first). It is *block-major* (``[nblocks, K, *inner]``, a block's
    slots adjacent: the torch scans run along dim 1) or *position-major* (``[K, nblocks,
    *inner]``, slot ``k`` of every block adjacent, so that combining rows ``k - 1`` and ``k`` of
    all blocks is one contiguous elementwise op).

    Attributes:
        block: rows per block (``K``, a power of two).
        nblocks: the static number of blocks (``N // K + B``, at least the blocks used).
        slot: int64 ``[N]``, each row's block-major slot.
        row_ids: int64 ``[N]``, each row's segment.
        counts: int64 ``[B]``, blocks per segment.
        block_offsets: int64 ``[B + 1]``, first block of each segment.
        width: blocks in the longest segment (static).
        reverse: the scan runs from the end of each segment.
        method: "padded" or "doubling" (how block prefixes are scanned), or "none" (a segment
            has one block at most).
    """

    block: int
    nblocks: Any
    slot: Tensor
    row_ids: Tensor
    counts: Tensor
    block_offsets: Tensor
    width: Any
    reverse: bool
    method: str

    @property
    def size(self) -> Any:
        """Slots in the buffer, the identity slot included."""
        return self.nblocks * self.block + 1

    def slots(self, position_major: bool, *, previous: bool = False) -> Tensor:
        """The slot of every row, or with ``previous`` of the row before it in scan order (the
        identity slot for a segment's first row)."""
        if not position_major and not previous:
            return self.slot
        start = self.block_offsets.index_select(0, self.row_ids)
        position = self.slot - start * self.block
        if previous:
            position = position - 1
        if position_major:  # K is a power of two: mask and shift (floor semantics at -1 too)
            rest = torch.bitwise_and(position, self.block - 1)
            whole = torch.bitwise_right_shift(position, self.block.bit_length() - 1)
            slot = rest * self.nblocks + start + whole
        else:
            slot = start * self.block + position
        return torch.where(position < 0, self.size - 1, slot) if previous else slot


def block_size(rows: Any, num: Any) -> int:
    """``K``: the largest power of two up to the mean length (1..32); ``BLOCK`` when compiling.

    Under ``torch.compile`` sizes are symbolic: any decision taken on them here would become a
    guard (a recompilation when it flips), so the compiled scan takes none.
    """
    if torch.compiler.is_compiling():
        return BLOCK
    mean = rows // max(num, 1)
    size = 1
    while size * 2 <= min(mean, MAX_BLOCK):
        size *= 2
    return size


def layout(
    level: RowPartition,
    max_length: Any,
    *,
    reverse: bool,
    block: int | None = None,
    method: str = "auto",
    grid_ok: bool = True,
) -> Layout:
    """The block layout of one ragged level (index arithmetic on the offsets only).

    ``block`` (a power of two) and ``method`` ("padded" or "doubling") can be forced;
    ``grid_ok=False`` keeps eager mode off the padded grid. Under ``torch.compile`` the method
    is "padded" unless forced.
    """
    offsets, lengths, row_ids = level.offsets[:-1], level.lengths, level.row_ids
    rows, num = row_ids.shape[0], lengths.shape[0]
    block = block_size(rows, num) if block is None else block
    counts = (lengths + (block - 1)) // block
    block_offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    first = block_offsets[:-1] * block
    ranks = torch.arange(rows, device=row_ids.device)
    # Slot = first slot of the row's segment + its position (from the end when reversed).
    if reverse:
        slot = (first + offsets + lengths - 1).index_select(0, row_ids) - ranks
    else:
        slot = ranks + (first - offsets).index_select(0, row_ids)
    nblocks = rows // block + num
    width = -(-max_length // block)
    if torch.compiler.is_compiling():
        method = "padded" if method == "auto" else method
    elif width <= 1:
        method = "none"
    elif method == "auto":
        method = "padded" if grid_ok and num * width <= nblocks else "doubling"
    return Layout(block, nblocks, slot, row_ids, counts, block_offsets, width, reverse, method)


# --- block prefixes (small tensors: one row per block) ----------------------------------------


def _expand(t: Tensor, ndim: int) -> Tensor:
    return t.view(*t.shape, *[1] * (ndim - t.dim()))


def _with_prefix(m: Monoid, prefix: Tensor, has: Tensor, rows: Tensor) -> Tensor:
    """``combine(prefix, rows)`` where ``has`` and ``rows`` elsewhere (``has`` broadcasts).

    ``prefix`` and ``has`` are per block (small); ``rows`` may be the whole buffer.
    """
    if m.safe:
        return m.combine(torch.where(has, prefix, m.identity(prefix.dtype)), rows)
    # A finite stand-in for the missing prefix keeps every derivative of the unselected branch
    # finite, so no NaN leaks through the selection.
    combined = m.combine(torch.where(has, prefix, m.filler), rows)
    return torch.where(has, combined, rows)


def _blocks_of(lay: Layout, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Segment, index within the segment, and validity of every block."""
    num = lay.counts.shape[0]
    slack = (lay.nblocks - lay.block_offsets[-1]).view(1)  # blocks past the last segment's
    segment = torch.repeat_interleave(
        torch.arange(num + 1, device=device),
        torch.cat([lay.counts, slack]),
        output_size=lay.nblocks,
    )
    local = torch.arange(lay.nblocks, device=device) - lay.block_offsets.index_select(0, segment)
    return segment, local, segment < num


def _prefix_padded(m: Monoid, totals: Tensor, lay: Layout) -> tuple[Tensor, Tensor]:
    """Exclusive within-segment scan of the block totals through a padded ``[B, width]`` grid."""
    num, width = lay.counts.shape[0], lay.width
    inner = totals.shape[1:]
    cols = torch.arange(width, device=totals.device)
    index = (lay.block_offsets[:-1, None] + cols).clamp_max(lay.nblocks - 1)
    grid = totals.index_select(0, index.reshape(-1)).reshape(num, width, *inner)
    inside = _expand(cols < lay.counts[:, None], grid.dim())
    grid = m.scan(torch.where(inside, grid, m.filler), 1).reshape(num * width, *inner)
    segment, local, valid = _blocks_of(lay, totals.device)
    source = (segment.clamp_max(num - 1) * width + local - 1).clamp(0, num * width - 1)
    return grid.index_select(0, source), valid & (local > 0)


def _prefix_doubling(m: Monoid, totals: Tensor, lay: Layout) -> tuple[Tensor, Tensor]:
    """Exclusive within-segment scan of the block totals by recursive doubling."""
    _, local, valid = _blocks_of(lay, totals.device)
    blocks = torch.arange(lay.nblocks, device=totals.device)
    scanned = totals
    step = 1
    while step < lay.width:
        earlier = scanned.index_select(0, (blocks - step).clamp_min(0))
        ok = _expand(valid & (local >= step), totals.dim())
        scanned = _with_prefix(m, earlier, ok, scanned)
        step *= 2
    return scanned.index_select(0, (blocks - 1).clamp_min(0)), valid & (local > 0)


def _block_prefix(m: Monoid, totals: Tensor, lay: Layout) -> tuple[Tensor, Tensor]:
    fn = _prefix_padded if lay.method == "padded" else _prefix_doubling
    return fn(m, totals, lay)


# --- the ragged-axis scan: composite and in-place ---------------------------------------------


def segmented_scan(m: Monoid, values: Tensor, lay: Layout, *, exclusive: bool) -> Tensor:
    """The scan ``m`` of ``values`` within each segment, from differentiable torch ops.

    Works under every ``torch.func`` transform and ``torch.compile``.
    """
    values = values.to(m.dtype(values.dtype))
    inner = values.shape[1:]
    k, nblocks = lay.block, lay.nblocks
    major = not m.torch_blocks  # position-major
    buffer = values.new_full((lay.size, *inner), m.filler)
    buffer = buffer.index_copy(0, lay.slots(major), values)
    blocks = buffer[:-1].view(*((k, nblocks) if major else (nblocks, k)), *inner)
    if major:
        # One unbind (its backward is one stack), not K selects (each a full-size zero fill).
        rows = blocks.unbind(0)
        running = [rows[0]]
        for row in rows[1:]:
            running.append(m.combine(running[-1], row))
        scanned = torch.stack(running)
    else:
        scanned = m.scan(blocks, 1)
    if lay.method != "none":
        totals = scanned[k - 1] if major else scanned[:, k - 1]
        prefix, has = _block_prefix(m, totals, lay)
        prefix, has = (prefix[None], has[None]) if major else (prefix[:, None], has[:, None])
        scanned = _with_prefix(m, prefix, _expand(has, scanned.dim()), scanned)
    flat = scanned.reshape(nblocks * k, *inner)
    if not exclusive:
        return flat.index_select(0, lay.slots(major))
    flat = torch.cat([flat, flat.new_full((1, *inner), m.identity(flat.dtype))])
    return flat.index_select(0, lay.slots(major, previous=True))


def scan_in_place(m: Monoid, values: Tensor, lay: Layout, *, exclusive: bool) -> Tensor:
    """The same scan as ``segmented_scan`` with two large allocations (buffer and output).

    For plain tensors outside autograd (the bodies of the autograd Functions below): every step
    updates the buffer in place, so no large temporary is made. Unused slots are left
    uninitialised: a scan is causal, so they reach no real row, and the block prefixes never
    read them (the padded grid masks them, doubling combines valid blocks only).
    """
    dtype = m.dtype(values.dtype)
    inner = values.shape[1:]
    k, nblocks = lay.block, lay.nblocks
    buffer = torch.empty((lay.size, *inner), dtype=dtype, device=values.device)
    buffer[-1].fill_(m.identity(dtype))
    buffer.index_copy_(0, lay.slot, values.to(dtype))
    blocks = buffer[:-1].view(nblocks, k, *inner)
    if m is SUM:
        blocks.cumsum_(1)
    elif m is PROD:
        blocks.cumprod_(1)
    else:
        for i in range(1, k):
            m.combine(blocks[:, i - 1], blocks[:, i], out=blocks[:, i])
    if lay.method != "none":
        prefix, has = _block_prefix(m, blocks[:, k - 1], lay)
        prefix = torch.where(_expand(has, prefix.dim()), prefix, m.identity(dtype))
        m.combine(prefix[:, None], blocks, out=blocks)  # logaddexp(-inf, y) is y (no gradient)
    return buffer.index_select(0, lay.slots(False, previous=exclusive))


# --- cummax, cummin: the running values, and the index of the element attaining them ---------


def _records_to_index(values: Tensor, running: Tensor, lay: Layout, run: Any) -> Tensor:
    """For every element, the row of the element attaining its running extremum ``running``:
    the last one in scan order at ties, and NaN counts as the extremum (as ``torch.cummax``)."""
    rows = values.shape[0]
    record = values == running
    if values.is_floating_point():
        record |= torch.isnan(values)
    # The last record so far in scan order: a running max of keys that grow along the scan (the
    # row, negated for reverse scans), `low` below every key where there is no record.
    small = rows < 2**30  # keys below reach 2 * rows
    sign = -1 if lay.reverse else 1
    key = torch.arange(rows, device=values.device, dtype=torch.int32 if small else torch.int64)
    key = _expand(key * sign, values.dim())
    low = -rows - 1
    key = run(MAX, (key - low) * record + low, lay, exclusive=False)
    return (key * sign).long()


def _previous_rows(level: RowPartition, reverse: bool) -> Tensor:
    """The row before each row in scan order, or ``N`` (past the end) for a segment's first."""
    rows = level.num_children
    position = level.positions()
    if reverse:
        position = level.lengths.index_select(0, level.row_ids) - 1 - position
    rank = torch.arange(rows, device=position.device)
    return torch.where(position == 0, rows, rank + 1 if reverse else rank - 1)


def _shift(out: Tensor, level: RowPartition, reverse: bool, fill: Any) -> Tensor:
    """The exclusive scan from the inclusive one: each row takes the previous row's result."""
    out = torch.cat([out, out.new_full((1, *out.shape[1:]), fill)])
    return out.index_select(0, _previous_rows(level, reverse))


def _extreme_index(
    m: Monoid, values: Tensor, output: Tensor, level: RowPartition, max_length: Any, **how: bool
) -> Tensor:
    """The row each output of the running extremum ``m`` reads (``N``, past the end, for an
    exclusive scan's first); from plain tensors, with the in-place kernels."""
    lay = layout(level, max_length, reverse=how["reverse"])
    values, output = values.detach(), output.detach()
    if how["exclusive"]:  # the inclusive running values, again
        output = scan_in_place(m, values, lay, exclusive=False)
    index = _records_to_index(values, output, lay, scan_in_place)
    if how["exclusive"]:
        index = _shift(index, level, how["reverse"], values.shape[0])
    return index


def _composite_extreme(
    m: Monoid, values: Tensor, level: RowPartition, max_length: Any, **how: bool
) -> Tensor:
    """Running max or min from differentiable ops: the values gathered at the index of the
    element ``torch.cummax`` would name (so the gradient goes there)."""
    lay = layout(level, max_length, reverse=how["reverse"])
    plain = values.detach()
    with torch.no_grad():
        running = segmented_scan(m, plain, lay, exclusive=False)
        index = _records_to_index(plain, running, lay, segmented_scan)
    out = values.gather(0, index)
    if how["exclusive"]:
        return _shift(out, level, how["reverse"], m.identity(out.dtype))
    return out


# --- the entry point: the eager fast path or the composite scan -------------------------------


def scan_rows(
    m: Monoid,
    values: Tensor,
    level: RowPartition,
    max_length: Any,
    *,
    reverse: bool,
    exclusive: bool,
    method: str = "auto",
) -> Tensor:
    """The scan ``m`` of ``values`` (``[N, *inner]``) within the segments of ``level``.

    In eager mode the native scan runs at every size where it can (plain float CPU tensors;
    through :class:`_SegmentScan` when there is something to differentiate) and other large
    inputs take :class:`_SegmentScan` too; otherwise the composite scan runs
    (``method`` picks its block prefixes, see :func:`layout`). Running extrema route their
    gradient to the element ``torch.cummax`` would name.
    """
    native_scan = use_fast_path(values, "scan") and _native_scan(m.name, values)
    if native_scan and not native.differentiable(values):
        return native.segment_scan(values, level.offsets, m.name, reverse, exclusive)
    if native_scan or use_fast_path(values, "rows"):
        return _SegmentScan.apply(values, level, max_length, m.name, reverse, exclusive)
    return _composite(m, values, level, max_length, reverse, exclusive, method)


def _composite(
    m: Monoid,
    values: Tensor,
    level: RowPartition,
    max_length: Any,
    reverse: bool,
    exclusive: bool,
    method: str = "auto",
) -> Tensor:
    if m is MAX or m is MIN:
        return _composite_extreme(
            m, values, level, max_length, reverse=reverse, exclusive=exclusive
        )
    lay = layout(level, max_length, reverse=reverse, grid_ok=m.grid_ok, method=method)
    return segmented_scan(m, values, lay, exclusive=exclusive)


def _native_scan(op: str, values: Tensor, *others: Tensor) -> bool:
    """Whether the native scan runs: plain float CPU tensors, and for logcumsumexp an inner size
    of 1 or at least 8 (its per-element exp and log vectorise across the inner elements; for 2-7
    of them the composite scan was faster: 2^19 rows of 4, 33 ms against 65 ms native)."""
    if op == "logsumexp":
        inner = values[0].numel() if values.shape[0] else 0
        if 1 < inner < 8:
            return False
    return native.usable(values, *others)


def _pullback(fn: Callable[[Tensor], Tensor], x: Tensor) -> Callable[[Tensor], Any]:
    """The vector-Jacobian product function of ``fn`` at ``x`` (``torch.func.vjp``)."""
    return torch.func.vjp(fn, x)[1]


class _SegmentScan(torch.autograd.Function):
    """One segmented scan, eager. Forward and backward are the native streaming kernels
    (``ragged.kernels._native``: one pass per segment, exact: each segment's result depends on
    its own rows only) on plain float CPU tensors, and in-place torch kernels (cumsum, cummax,
    cummin) or the composite scan (cumprod, logcumsumexp) elsewhere.

    Backward: cumsum's transpose is the cumsum in the other direction; running extrema send each
    output's gradient to the element attaining it; cumprod and logcumsumexp use the native
    reverse recurrences (exact with zeros and ``-inf``). Batched gradients (``jacrev``,
    ``is_grads_batched``) and double backward take differentiable torch ops instead: the reverse
    composite cumsum, a scatter to the attaining elements, or the vector-Jacobian product of the
    composite scan (``torch.func.vjp``). ``jvp`` and ``vmap`` rules make every transform work.
    """

    @staticmethod
    def forward(
        values: Tensor,
        level: RowPartition,
        max_length: Any,
        op: str,
        reverse: bool,
        exclusive: bool,
    ) -> Tensor:
        if _native_scan(op, values):
            return native.segment_scan(values, level.offsets, op, reverse, exclusive)
        m = MONOIDS[op]
        lay = layout(level, max_length, reverse=reverse, grid_ok=m.grid_ok)
        if m.in_place:
            return scan_in_place(m, values, lay, exclusive=exclusive)
        return segmented_scan(m, values, lay, exclusive=exclusive)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        values, ctx.level, ctx.max_length, ctx.op, ctx.reverse, ctx.exclusive = inputs
        if ctx.op != "sum":  # the sum's derivatives need no tensor
            ctx.save_for_backward(values, output)
            ctx.save_for_forward(values, output)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        none = (None,) * 5
        level, reverse, exclusive = ctx.level, ctx.reverse, ctx.exclusive
        plain = not torch.is_grad_enabled()  # no graph of the gradient is being built
        if ctx.op == "sum":
            if plain and native.usable(grad):
                return native.segment_scan(
                    grad, level.offsets, "sum", not reverse, exclusive
                ), *none
            lay = layout(level, ctx.max_length, reverse=not reverse)
            return segmented_scan(SUM, grad, lay, exclusive=exclusive), *none
        values, output = ctx.saved_tensors
        if plain and _native_scan(ctx.op, values, output, grad):
            gin = native.segment_scan_backward(
                values.detach(), level.offsets, output.detach(), grad, ctx.op, reverse, exclusive
            )
            return gin, *none
        m = MONOIDS[ctx.op]
        if m is MAX or m is MIN:  # out of place: works on batched gradients
            how = {"reverse": reverse, "exclusive": exclusive}
            index = _extreme_index(m, values, output, level, ctx.max_length, **how)
            zeros = grad.new_zeros((values.shape[0] + 1, *values.shape[1:]))
            return zeros.scatter_add(0, index, grad)[:-1], *none

        def scan(v: Tensor) -> Tensor:
            return _composite(m, v, level, ctx.max_length, reverse, exclusive)

        return _pullback(scan, values)(grad)[0], *none

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, *_: Any) -> Tensor:
        level, reverse, exclusive = ctx.level, ctx.reverse, ctx.exclusive
        if ctx.op == "sum":  # linear
            return scan_rows(
                SUM, tangent, level, ctx.max_length, reverse=reverse, exclusive=exclusive
            )
        values, output = ctx.saved_tensors
        m = MONOIDS[ctx.op]
        if m is MAX or m is MIN:
            how = {"reverse": reverse, "exclusive": exclusive}
            index = _extreme_index(m, values, output, level, ctx.max_length, **how)
            padded = torch.cat([tangent, tangent.new_zeros((1, *tangent.shape[1:]))])
            return padded.gather(0, index)

        def scan(v: Tensor) -> Tensor:
            return _composite(m, v, level, ctx.max_length, reverse, exclusive)

        # Forward mode cannot nest (a jvp rule runs inside a dual level), so the tangent goes
        # through the transpose of the (linear) vector-Jacobian product: J t = vjp(u -> J^T u).
        pullback = _pullback(scan, values)
        return _pullback(lambda u: pullback(u)[0], torch.zeros_like(output))(tangent)[0]

    @staticmethod
    def vmap(info: Any, in_dims: Any, values: Tensor, *args: Any) -> Any:
        if in_dims[0] is None:
            return _SegmentScan.apply(values, *args), None
        return _SegmentScan.apply(values.movedim(in_dims[0], 1), *args), 1
