"""Kernels over the dense blocks of pair maps: the eager grouped path and the compiled tile path.

A pair map ``(B, N*, M*, *inner)`` stores segment ``b`` as a dense ``N_b x M_b`` block, row-major
and contiguous in ``values``. Products over those blocks (``x_b @ y_b^T``, the triangle update
``A_b @ B_b^T`` per channel) run in one of two ways:

* **eager: grouped by length.** The segment lengths are read to the host once (one host sync;
  nothing is cached on the partition). Segments of equal shape form a group whose blocks are
  stacked to ``[n, N, M, *inner]``: a view of ``values`` when the group's segments are
  consecutive (always for a group of one), else one ``index_select``. Each group is one batched
  dense product, and one ``cat`` of per-segment views of the results puts them back in segment
  order. Temporaries are ``O(sum N_b M_b * C)``, nothing is padded.
* **compiled: static tiles** (``torch.compiler.is_compiling()``): sizes must not depend on the
  data, so each segment's block is cut into ``T x T`` tiles of a fixed size ``T``. The number of
  tiles ``sum ceil(N_b/T) ceil(M_b/T)`` is data-dependent, but bounded by a static expression of
  the number of pairs, rows and segments (``PairTiles``); tiles past the used ones are
  masked. One graph serves every batch.

Both paths are compositions of differentiable torch ops (or, for the compiled triangle product,
an ``autograd.Function`` whose backward is the same product), so every transform works.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from .._partition import RowPartition

# --- eager: groups of equal shape -------------------------------------------------------------


@dataclasses.dataclass
class Group:
    """Segments whose blocks have the same shape ``rows x cols``."""

    rows: int
    cols: int
    segments: list[int]


@dataclasses.dataclass
class Groups:
    """The host-side grouping of a batch of blocks (built from one read of the lengths).

    Attributes:
        groups: the non-empty groups, ordered by their first segment.
        rows, cols: per segment, ``N_b`` and ``M_b``.
        sizes: per segment, ``N_b * M_b``.
        in_order: concatenating the groups' blocks gives the pair map's order.
    """

    groups: list[Group]
    rows: list[int]
    cols: list[int]
    sizes: list[int]
    in_order: bool


def length_groups(rows: RowPartition, columns: RowPartition) -> Groups:
    """Group the segments by block shape. Reads the lengths once (one host sync)."""
    if rows is columns:
        n = rows.lengths.tolist()
        m = n
    else:
        n, m = torch.stack([rows.lengths, columns.lengths]).tolist()
    by_shape: dict[tuple[int, int], list[int]] = {}
    for b, (nb, mb) in enumerate(zip(n, m, strict=True)):
        if nb and mb:
            by_shape.setdefault((nb, mb), []).append(b)
    groups = sorted((Group(r, c, s) for (r, c), s in by_shape.items()), key=lambda g: g.segments)
    sizes = [nb * mb for nb, mb in zip(n, m, strict=True)]
    order = [b for g in groups for b in g.segments]
    in_order = order == [b for b, s in enumerate(sizes) if s]
    return Groups(groups, n, m, sizes, in_order)


def _consecutive(segments: list[int]) -> bool:
    return segments[-1] - segments[0] == len(segments) - 1


def group_blocks(values: Tensor, groups: Groups, sizes: list[int]) -> list[Tensor]:
    """Every group's blocks as ``[n, size, *inner]``, where segment ``b`` owns ``sizes[b]``
    consecutive rows of ``values``.

    One ``split`` cuts ``values`` into pieces (a group of consecutive segments is one piece, any
    other segment its own), so the backward pass is one ``cat`` of the pieces' gradients. A
    group of consecutive segments is a view of its piece; another group stacks its segments'
    pieces (one copy of that group).
    """
    owner: list[int | None] = [None] * len(sizes)
    for index, g in enumerate(groups.groups):
        for b in g.segments:
            owner[b] = index
    runs = {index for index, g in enumerate(groups.groups) if _consecutive(g.segments)}
    piece_sizes: list[int] = []
    piece_of: dict[tuple[str, int], int] = {}
    b = 0
    while b < len(sizes):
        mine = owner[b]
        if mine is not None and mine in runs:
            count = len(groups.groups[mine].segments)
            piece_of["group", mine] = len(piece_sizes)
            piece_sizes.append(sum(sizes[b : b + count]))
            b += count
        else:
            piece_of["segment", b] = len(piece_sizes)
            piece_sizes.append(sizes[b])
            b += 1
    pieces = values.split(piece_sizes)
    out = []
    for index, g in enumerate(groups.groups):
        size = sizes[g.segments[0]]
        if index in runs:
            out.append(pieces[piece_of["group", index]].unflatten(0, (len(g.segments), size)))
        else:
            out.append(torch.stack([pieces[piece_of["segment", b]] for b in g.segments]))
    return out


def assemble(pieces: list[Tensor], groups: Groups, empty: Tensor) -> Tensor:
    """Per-group results ``[n, N, M, *inner]`` back into the pair map's ``[pairs, *inner]``.

    Each segment's block is a view of its group's result; one ``cat`` in segment order copies
    them into place (no gather), and a single group that covers the batch in order is only
    flattened. ``empty`` is the ``[0, *inner]`` result for a batch without pairs.
    """
    if not pieces:
        return empty
    if len(pieces) == 1 and groups.in_order:
        return pieces[0].flatten(0, 2)
    blocks: list[Tensor | None] = [None] * len(groups.sizes)
    for g, piece in zip(groups.groups, pieces, strict=True):
        for b, block in zip(g.segments, piece.unbind(0), strict=True):
            blocks[b] = block.flatten(0, 1)  # a view of the group's result
    return torch.cat([t for t in blocks if t is not None])


# --- compiled: static tiles -------------------------------------------------------------------


class PairTiles:
    """Segment-aligned ``size x size`` tiles of a pair map over ``rows x columns``.

    Segment ``b``'s ``N_b x M_b`` block is cut into ``ceil(N_b/size) * ceil(M_b/size)`` tiles,
    numbered row-major within the segment and segment after segment. That count is
    data-dependent; the number of tiles allocated is the static bound
    ``min(pairs, (pairs + (size - 1) * (rows + cols) + B * (size - 1)**2) // size**2)`` (each
    ceil is at most ``(N + size - 1) / size``), so shapes depend only on sizes a compiled graph
    already has.
    Unused tiles are marked invalid (segment ``B``).

    Attributes:
        count: the number of tiles (the static bound).
        i, j: ``[count, size]`` row and column index within the segment of each tile position.
        valid_i, valid_j: ``[count, size]`` whether that row / column exists.
        row_strip, col_strip: ``[count]`` the ``RowStrips`` index of each tile's rows and
            of its columns.
        row_start, col_start: ``[count]`` the segment's first row in a one-level operand over
            ``rows`` / ``columns``.
        pair_start: ``[count]`` the offset of the segment's block in the pair map's values.
        n, m: ``[count]`` the segment's block shape.
    """

    def __init__(
        self,
        n_lengths: Tensor,
        n_offsets: Tensor,
        n_total: int,
        m_lengths: Tensor,
        m_offsets: Tensor,
        m_total: int,
        pairs: int,
        size: int,
    ) -> None:
        device = n_lengths.device
        num = n_lengths.shape[0]
        self.size = size
        n_tiles = (n_lengths + (size - 1)) // size
        m_tiles = (m_lengths + (size - 1)) // size
        per_segment = n_tiles * m_tiles
        end = torch.cumsum(per_segment, 0)
        start = end - per_segment
        pad = size - 1
        bound = (pairs + pad * (n_total + m_total) + num * pad * pad) // (size * size)
        # A used tile holds a pair, so `pairs` bounds the count too (and makes it 0 when there
        # are no pairs: the gathers below then never index empty values).
        self.count = torch.sym_min(bound, pairs)
        tile = torch.arange(self.count, device=device)
        segment = torch.searchsorted(end, tile, right=True)  # `num` for unused tiles
        clamped = segment.clamp_max(num - 1)
        local = tile - start.index_select(0, clamped)
        width = m_tiles.index_select(0, clamped).clamp_min(1)
        ramp = torch.arange(size, device=device)
        self.i = (local // width)[:, None] * size + ramp
        self.j = (local % width)[:, None] * size + ramp
        self.n = n_lengths.index_select(0, clamped)
        self.m = m_lengths.index_select(0, clamped)
        used = (segment < num)[:, None]
        self.valid_i = used & (self.i < self.n[:, None])
        self.valid_j = used & (self.j < self.m[:, None])
        # Each tile's row strip and column strip (see RowStrips): unused tiles take strip 0.
        first_row_strip = torch.cumsum(n_tiles, 0) - n_tiles
        first_col_strip = torch.cumsum(m_tiles, 0) - m_tiles
        self.row_strip = torch.where(
            used[:, 0], first_row_strip.index_select(0, clamped) + local // width, 0
        )
        self.col_strip = torch.where(
            used[:, 0], first_col_strip.index_select(0, clamped) + local % width, 0
        )
        self.row_start = n_offsets.index_select(0, clamped)
        self.col_start = m_offsets.index_select(0, clamped)
        pair_offsets = torch.nn.functional.pad(torch.cumsum(n_lengths * m_lengths, 0), (1, 0))
        self.pair_start = pair_offsets.index_select(0, clamped)
        self.pairs = pairs
        self._start, self._m_tiles = start, m_tiles
        self._pair_offsets, self._m_lengths = pair_offsets, m_lengths

    def back(self) -> Tensor:
        """For every pair of the map, its flat position in the ``[count * size * size]`` layout
        of the tiles (a gather index from tiles back to the pair map's values)."""
        tile, position = self.back_parts()
        return tile * (self.size * self.size) + position

    def back_parts(self) -> tuple[Tensor, Tensor]:
        """For every pair of the map, its tile and its position ``i * size + j`` in the tile."""
        size = self.size
        pair = torch.arange(self.pairs, device=self._start.device)
        segment = torch.searchsorted(self._pair_offsets[1:], pair, right=True)
        local = pair - self._pair_offsets.index_select(0, segment)
        m = self._m_lengths.index_select(0, segment)  # > 0: the segment has this pair
        i, j = local // m, local % m
        tile = self._start.index_select(0, segment)
        tile = tile + (i // size) * self._m_tiles.index_select(0, segment) + j // size
        return tile, (i % size) * size + j % size

    def tile_rows(self, values: Tensor, axis: str) -> Tensor:
        """A one-level operand's rows per tile: ``[count, size, *inner]`` (zero padding) for the
        tiles' rows (``axis="i"``, over ``rows``) or columns (``"j"``, over ``columns``)."""
        if axis == "i":
            index, valid, start = self.i, self.valid_i, self.row_start
        else:
            index, valid, start = self.j, self.valid_j, self.col_start
        flat = torch.where(valid, start[:, None] + index, 0).reshape(-1)
        tiled = values.index_select(0, flat).unflatten(0, (self.count, self.size))
        mask = ~valid.view(self.count, self.size, *[1] * (values.dim() - 1))
        return tiled.masked_fill(mask, 0)


class RowStrips:
    """Segment-aligned strips of ``size`` rows of a square pair map: strip ``r`` holds rows
    ``I * size .. I * size + size - 1`` of one segment (all its columns). Numbered segment after
    segment, as ``PairTiles`` numbers the tiles' row and column strips; the count is the
    static bound ``min(rows, (rows + B * (size - 1)) // size)``.
    """

    def __init__(self, lengths: Tensor, rows: int, pairs: int, size: int) -> None:
        device = lengths.device
        num = lengths.shape[0]
        per_segment = (lengths + (size - 1)) // size
        end = torch.cumsum(per_segment, 0)
        self.count = torch.sym_min(rows, (rows + num * (size - 1)) // size)
        strip = torch.arange(self.count, device=device)
        segment = torch.searchsorted(end, strip, right=True)
        clamped = segment.clamp_max(num - 1)
        first = (strip - (end - per_segment).index_select(0, clamped)) * size
        self.index = first[:, None] + torch.arange(size, device=device)  # [count, size]
        self.n = lengths.index_select(0, clamped)
        self.valid = (segment < num)[:, None] & (self.index < self.n[:, None])
        pair_offsets = torch.nn.functional.pad(torch.cumsum(lengths * lengths, 0), (1, 0))
        self.pair_start = pair_offsets.index_select(0, clamped)
        self.size, self.pairs = size, pairs

    def gather(self, channels_first: Tensor, k: Tensor, transposed: bool, k_major: bool) -> Tensor:
        """``X[rows, k]`` (``X[k, rows]`` when ``transposed``) for every strip, as
        ``[C, count, size, len(k)]`` (``[C, count, len(k), size]`` when ``k_major``), zero
        where the entry does not exist.

        ``channels_first`` is the map's values as ``[C, pairs + 1]``, its last column zero
        (missing entries gather it: no masking pass); ``k`` is ``[width]``. Gathering along the
        pairs of a channels-first tensor gives bmm operands by plain views (a reshape of
        permuted tiles would guard on the width being 1 under ``torch.compile``).
        """
        n = self.n[:, None, None]
        if k_major:
            a, c, valid = self.index[:, None, :], k[None, :, None], self.valid[:, None, :]
        else:
            a, c, valid = self.index[:, :, None], k[None, None, :], self.valid[:, :, None]
        local = c * n + a if transposed else a * n + c
        valid = valid & (c < n)
        flat = torch.where(valid, self.pair_start[:, None, None] + local, self.pairs)
        gathered = channels_first.index_select(1, flat.reshape(-1))
        return gathered.view(channels_first.shape[0], *valid.shape)


# --- per-segment matrix products of square pair maps ------------------------------------------

# Compiled tile path: output tiles of _TILE x _TILE pairs; the contraction runs in _STEPS static
# steps of ceil(max_length / _STEPS) entries each, so the loop has a static trip count.
_TILE = 16
_STEPS = 8


def block_matmul(x: Tensor, y: Tensor, level: RowPartition, tx: bool, ty: bool) -> Tensor:
    """Values of ``op(X_b) @ op(Y_b)`` for every segment ``b`` and inner index.

    ``x`` and ``y`` are the ``[sum N_b^2, *inner]`` values of two square pair maps over
    ``level``; ``op`` transposes the block when ``tx`` / ``ty``. Eager: grouped by length (one
    host read of the lengths). Compiling: static tiles, no host read.
    """
    if torch.compiler.is_compiling():
        bound = level.max_length if level.max_length is not None else level.num_children
        return _TiledBlockMatmul.apply(
            x, y, level.lengths, level.offsets, level.num_children, bound, tx, ty
        )
    return _grouped_block_matmul(x, y, level, tx, ty)


def _channels(x: Tensor) -> Tensor:
    """``[pairs, *inner]`` -> ``[pairs, C]``."""
    return x.flatten(1) if x.dim() > 1 else x.unsqueeze(1)


def _grouped_block_matmul(x: Tensor, y: Tensor, level: RowPartition, tx: bool, ty: bool) -> Tensor:
    groups = length_groups(level, level)
    xc, yc = _channels(x), _channels(y)
    pieces = []
    x_blocks = group_blocks(xc, groups, groups.sizes)
    y_blocks = x_blocks if y is x else group_blocks(yc, groups, groups.sizes)
    for g, xb, yb in zip(groups.groups, x_blocks, y_blocks, strict=True):
        n = g.rows
        xm = xb.unflatten(1, (n, n)).permute(0, 3, 1, 2)  # [count, C, N, N]: per segment, channel
        ym = yb.unflatten(1, (n, n)).permute(0, 3, 1, 2)
        out = torch.matmul(xm.mT if tx else xm, ym.mT if ty else ym)  # [count, C, N, N]
        pieces.append(out.permute(0, 2, 3, 1))
    return assemble(pieces, groups, xc[:0]).reshape(x.shape)


def tiled_block_matmul(
    x: Tensor,
    y: Tensor,
    lengths: Tensor,
    offsets: Tensor,
    rows: int,
    bound: int,
    tx: bool,
    ty: bool,
) -> Tensor:
    """The static-shape kernel of ``block_matmul``: ``bound`` is at least every length."""
    pairs = x.shape[0]
    xc, yc = _channels(x), _channels(y)
    tiles = PairTiles(lengths, offsets, rows, lengths, offsets, rows, pairs, _TILE)
    strips = RowStrips(lengths, rows, pairs, _TILE)
    width = (bound + (_STEPS - 1)) // _STEPS
    ramp = torch.arange(width, device=x.device)
    count, channels = tiles.count, xc.shape[1]
    # [C, pairs + 1], contiguous, a zero last column: gathers read one channel at a time.
    zero = xc.new_zeros((1, channels))
    xt = torch.cat([xc, zero]).t().contiguous()
    yt = xt if y is x else torch.cat([yc, zero]).t().contiguous()
    out = xc.new_zeros((channels * count, _TILE, _TILE))
    for step in range(_STEPS):
        k = step * width + ramp
        # Entries are gathered once per strip (rows x width), then whole strips per tile: a
        # tile's operands are copies of contiguous blocks, not gathers of single entries.
        xs = strips.gather(xt, k, transposed=tx, k_major=False)  # op(X)[i, k]
        ys = strips.gather(yt, k, transposed=not ty, k_major=True)  # op(Y)[k, j]
        xm = xs.index_select(1, tiles.row_strip).view(channels * count, _TILE, width)
        ym = ys.index_select(1, tiles.col_strip).view(channels * count, width, _TILE)
        out = torch.baddbmm(out, xm, ym)  # [C * tiles, T, T]
    # Gathering rows of the transposed tiles gives a contiguous [pairs, C] (a reshape of the
    # permuted tiles, or a non-contiguous result, would make torch.compile guard on sizes
    # being 1).
    flat = out.view(channels, count * _TILE * _TILE).t().index_select(0, tiles.back())
    if x.dim() == 1:
        return flat.select(1, 0)
    return flat if x.dim() == 2 else flat.unflatten(1, x.shape[1:])


class _TiledBlockMatmul(torch.autograd.Function):
    """The compiled path: saves only its inputs (the per-step tiles would be ``max_length /
    _TILE`` times the map) and differentiates into the same product with other transposes:
    for ``Z = op(X) @ op(Y)``, ``dX = G @ op(Y)^T`` (or its transpose) and ``dY = op(X)^T @ G``."""

    @staticmethod
    def forward(
        x: Tensor,
        y: Tensor,
        lengths: Tensor,
        offsets: Tensor,
        rows: int,
        bound: int,
        tx: bool,
        ty: bool,
    ) -> Tensor:
        return tiled_block_matmul(x, y, lengths, offsets, rows, bound, tx, ty)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, y, lengths, offsets, rows, bound, tx, ty = inputs
        ctx.save_for_backward(x, y, lengths, offsets)
        ctx.rows, ctx.bound, ctx.tx, ctx.ty = rows, bound, tx, ty

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, y, lengths, offsets = ctx.saved_tensors
        tx, ty = ctx.tx, ctx.ty

        def product(a: Tensor, b: Tensor, ta: bool, tb: bool) -> Tensor:
            return _TiledBlockMatmul.apply(a, b, lengths, offsets, ctx.rows, ctx.bound, ta, tb)

        gx = gy = None
        if ctx.needs_input_grad[0]:
            gx = product(y, grad, ty, True) if tx else product(grad, y, False, not ty)
        if ctx.needs_input_grad[1]:
            gy = product(grad, x, True, tx) if ty else product(x, grad, not tx, False)
        return gx, gy, None, None, None, None, None, None
