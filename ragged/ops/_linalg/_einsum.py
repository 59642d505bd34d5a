"""``ragged.einsum``: einsum with a batch and a ragged letter per ragged operand (see its
docstring for the rules and the segment-aligned tiling).

An equation is parsed once per kind of operands into a cached recipe, then bound to the
operands' shapes and partitions, which plans the values-level einsum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import SUBSCRIPTS, subscripts
from ..._broadcast import same_partition
from ..._errors import Func, type_error, typename, value_error
from ..._registry import op
from ...kernels._segment import Segments, segment_sum
from ._einsum_levels import einsum_levels
from ._einsum_parse import ELLIPSIS, Recipe, axis_of, parse

# einsum tiles (see _Tiles) when a per-segment dense operand or a per-row product is bigger than
# the ragged rows; tile sizes are powers of two in [_MIN_TILE, _MAX_TILE] (_COMPILE_TILE when
# compiling, where the size may not depend on the batch).
_MIN_TILE = 8
_MAX_TILE = 1024
_COMPILE_TILE = 32


@op(
    "linalg",
    rule=SUBSCRIPTS,
    args="equation: str, *operands: operand",
    torch=(torch.einsum,),
    torch_args="equation, *operands",
)
def einsum(equation: str, *operands: Any) -> Any:
    """``torch.einsum`` where RaggedArray operands bring a batch and a ragged axis.

    Every RaggedArray operand's first two subscripts name its batch and ragged axes; all
    RaggedArray operands share them (and must have equal partitions). Dense operands may use
    the batch subscript (a per-segment tensor, gathered to each row by segment id) but not the
    ragged one. The output (given explicitly after ``->``) decides the result:

    * it keeps both (and starts with them, ``"bl..."``): a RaggedArray with the partition of the
      ragged operands (a row-wise einsum on the values);
    * it keeps the batch subscript only: a contraction over each segment, a dense ``(B, ...)``
      tensor (``"bld,ble->bde"`` is ``segment.T @ other`` per segment); empty segments give 0;
    * it keeps neither: a contraction over all rows, a dense tensor.

    ``...`` works as in ``torch.einsum`` for the axes after the batch and ragged ones.

    Cost: when a per-segment dense operand (or, for a contraction over each segment, the per-row
    product) is larger than the ragged rows, the rows are laid out in segment-aligned tiles of
    static shape (about half the mean segment length, or one padded tile per segment when the
    known ``max_length`` wastes at most the data's size), and each tile is a small dense product
    that reuses its segment's operand: a ``(B, D, E)`` weight costs a few times one dense
    ``(total, D) @ (D, E)``, not a matrix-vector product per row. Temporaries: the tiled rows
    (at most the rows plus ``B`` padded tiles) and the per-segment operand gathered once per
    tile. Otherwise the einsum runs on the rows (a per-segment vector is gathered per row, the
    size of the rows) and contractions use ``segment_sum``. No host sync either way.

    Axis names: a RaggedArray result is named when every output subscript names an axis of a
    named ragged operand (and there is no ``...``).

    Args:
        equation: e.g. ``"bld,de->ble"``, ``"bld,ble->bde"``, ``"bld,bd->bl"``.
        operands: RaggedArrays (same partition) and dense tensors, one per term.

    Returns:
        A RaggedArray or a dense tensor, as above.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
    >>> ragged.einsum("bld,de->ble", x, torch.eye(2)).to_list()
    [[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]]
    >>> ragged.einsum("bld,ble->bde", x, x)  # x_b^T x_b per segment
    tensor([[[ 1.,  2.],
             [ 2.,  4.]],
    <BLANKLINE>
            [[34., 42.],
             [42., 52.]]])
    >>> ragged.einsum("bld,bd->bl", x, torch.tensor([[1.0, 0.0], [0.0, 1.0]])).to_list()
    [[1.0], [4.0, 6.0]]
    """
    func = einsum
    if not isinstance(equation, str):
        raise type_error(func, "equation", "must be a str", typename(equation))
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    for i, operand in enumerate(operands):
        if not isinstance(operand, (RaggedArray, Tensor)):
            raise type_error(
                func, f"operands[{i}]", "must be a RaggedArray or a Tensor", typename(operand)
            )
    if any(isinstance(o, RaggedArray) and o.ragged_ndim > 1 for o in operands):
        return einsum_levels(func, equation, operands)
    return _plan(func, equation, operands).run(operands)


def _plan(func: Func, equation: str, operands: Sequence[Any]) -> _Plan:
    """Parse ``equation`` (a cached recipe per kind of operands), then bind it to ``operands``."""
    recipe = parse(func, equation, tuple(isinstance(o, RaggedArray) for o in operands))
    return _bind(func, recipe, operands)


class _Tiles:
    """Segment-aligned tiles of ``size`` rows: the static-shape layout for per-segment operands.

    Each segment's rows are cut into ``ceil(L_b / size)`` tiles, so every tile holds rows of one
    segment only, padded at its end. The number of tiles is data-dependent, but at most
    ``(total + B * (size - 1)) // size``, a static bound: tiles past the used ones are marked
    invalid (segment ``B``). A per-segment weight is then gathered once per tile (not per row)
    and each tile is a small dense GEMM, so the weight is reused across the tile's rows.

    With ``padded=True`` (``size`` at least the longest segment) there is exactly one tile per
    segment, tile ``b`` being segment ``b``: the padded layout, where per-segment operands need
    no gather at all.
    """

    def __init__(self, level: Any, size: int, padded: bool) -> None:
        num, total = level.num_rows, level.num_children
        device = level.lengths.device
        self.size = size
        self.padded = padded
        if padded:
            self.count = num
            per_segment = torch.ones_like(level.lengths)
        else:
            self.count = (total + num * (size - 1)) // size
            per_segment = (level.lengths + (size - 1)) // size
        end = torch.cumsum(per_segment, 0)
        start = end - per_segment
        tile = torch.arange(self.count, device=device)
        self.segment = torch.searchsorted(end, tile, right=True)  # `num` for unused tiles
        self.clamped = self.segment.clamp_max(num - 1)
        first = (tile - start[self.clamped]) * size
        position = first[:, None] + torch.arange(size, device=device)
        length = level.lengths[self.clamped][:, None]
        self.valid = (self.segment < num)[:, None] & (position < length)
        rows = torch.where(self.valid, level.offsets[self.clamped][:, None] + position, 0)
        self.rows = rows.reshape(-1)
        within = level.positions()
        self.back = (start[level.row_ids] + within // size) * size + within % size

    def tile_rows(self, values: Tensor) -> Tensor:
        """``values`` laid out as ``[tiles, size, *inner]``, padding rows zero."""
        tiled = values.index_select(0, self.rows).reshape(self.count, self.size, *values.shape[1:])
        mask = ~self.valid.view(self.count, self.size, *[1] * (values.dim() - 1))
        return tiled.masked_fill_(mask, 0)  # in place on a fresh gather: no extra copy

    def gather_segments(self, dense: Tensor, axis: int) -> Tensor:
        """A per-segment operand with one entry per tile along ``axis``."""
        return dense if self.padded else dense.index_select(axis, self.clamped)


def _tiles(level: Any) -> _Tiles:
    """The tiling for ``level``: padded when that wastes at most the data's size, else tiles of
    about half the mean length (padding stays below the data, weights are reused)."""
    total, num = level.num_children, level.num_rows
    if torch.compiler.is_compiling():  # sizes are symbolic: a fixed tile avoids guards on them
        return _Tiles(level, _COMPILE_TILE, padded=False)
    longest = level.max_length
    if longest is not None and longest > 0 and num * longest <= 2 * total:
        return _Tiles(level, longest, padded=True)
    half_mean = total // max(1, 2 * num)
    low, high = _MIN_TILE.bit_length() - 1, _MAX_TILE.bit_length() - 1
    return _Tiles(level, 1 << max(low, min(high, half_mean.bit_length())), padded=False)


class _Plan:
    """A parsed einsum: the values-level equations and how to post-process their result."""

    def __init__(
        self,
        rows_equation: str,
        tiles_equation: str | None,
        mode: str,
        ragged_pos: list[int],
        gathers: dict[int, int],
        squeezes: dict[int, int],
        out_batch_axis: int,
        names: tuple[str, ...] | None,
    ) -> None:
        self.rows_equation = rows_equation  # ragged operands as [rows, ...]
        self.tiles_equation = tiles_equation  # as [tiles, tile rows, ...]; None: no tiling
        self.mode = mode  # "keep" (RaggedArray), "segment" (dense (B, ...)), "all" (dense)
        self.ragged_pos = ragged_pos
        self.gathers = gathers  # dense operand -> its batch axis (gathered by segment)
        self.squeezes = squeezes  # dense operand -> its size-1 batch axis (dropped)
        self.out_batch_axis = out_batch_axis
        self.names = names

    def run(self, operands: Sequence[Any]) -> Any:
        x: RaggedArray = operands[self.ragged_pos[0]]
        level = x.partition.levels[0]
        num, total = level.num_rows, level.num_children
        dense = {
            i: operand.squeeze(self.squeezes[i]) if i in self.squeezes else operand
            for i, operand in enumerate(operands)
            if not isinstance(operand, RaggedArray)
        }
        if self.tiles_equation is not None and total > 0:
            return self._run_tiled(self.tiles_equation, operands, dense, _tiles(level))
        args = []
        for i, operand in enumerate(operands):
            if isinstance(operand, RaggedArray):
                args.append(operand.values)
            elif i in self.gathers:
                args.append(dense[i].index_select(self.gathers[i], level.row_ids))
            else:
                args.append(dense[i])
        out = torch.einsum(self.rows_equation, *args)
        if self.mode == "keep":
            return RaggedArray(out, x.partition, self.names)
        if self.mode == "all":
            return out
        out = segment_sum(out, Segments(level.row_ids, num, level.lengths, level.offsets))
        return out.movedim(0, self.out_batch_axis)

    def _run_tiled(
        self, equation: str, operands: Sequence[Any], dense: dict[int, Tensor], tiles: _Tiles
    ) -> Any:
        num = operands[self.ragged_pos[0]].num_segments
        args = []
        for i, operand in enumerate(operands):
            if isinstance(operand, RaggedArray):
                # Zero padding rows: their products vanish from sums, and (masked_fill's backward
                # zeroing them) no gradient reaches the row the padding was gathered from.
                args.append(tiles.tile_rows(operand.values))
            elif i in self.gathers:
                args.append(tiles.gather_segments(dense[i], self.gathers[i]))
            else:
                args.append(dense[i])
        out = torch.einsum(equation, *args)
        if self.mode == "keep":
            flat = out.reshape(tiles.count * tiles.size, *out.shape[2:])
            x: RaggedArray = operands[self.ragged_pos[0]]
            return RaggedArray(flat.index_select(0, tiles.back), x.partition, self.names)
        # Unused tiles go to an extra segment `num`, dropped (their products may be 0 * inf).
        per_segment = segment_sum(out, Segments(tiles.segment, num + 1, tiles.rows[:0]))[:num]
        if self.mode == "all":
            return per_segment.sum(0)
        return per_segment.movedim(0, self.out_batch_axis)


def _bind(func: Func, recipe: Recipe, operands: Sequence[Any]) -> _Plan:
    """Check the operands against a parsed equation and plan the values-level computation."""
    tokens, terms, bat = recipe.tokens, recipe.terms, recipe.bat
    first = recipe.ragged_pos[0]
    x: RaggedArray = operands[first]
    for i in recipe.ragged_pos[1:]:
        same_partition(func, x, operands[i])
    sizes: dict[str, tuple[int, int]] = {}
    ellipses: list[tuple[int, ...]] = []
    gathers: dict[int, int] = {}
    squeezes: dict[int, int] = {}
    gathered_numel = 0  # per row, of the dense operands gathered by segment
    num = x.num_segments
    for i, operand in enumerate(operands):
        toks = tokens[i]
        is_ragged = isinstance(operand, RaggedArray)
        shape = (num, -1, *operand.values.shape[1:]) if is_ragged else tuple(operand.shape)
        ndim = len(shape)
        letters = sum(t != ELLIPSIS for t in toks)
        if letters > ndim or (ELLIPSIS not in toks and letters != ndim):
            raise value_error(
                func,
                "equation",
                f"operand {i} has {ndim} axes but its subscripts {terms[i]!r} name {letters}",
                repr(recipe.equation),
            )
        ellipses.append(_ellipsis_shape(toks, shape))
        for pos, c in enumerate(toks):
            if c == ELLIPSIS or (is_ragged and pos == 1):
                continue
            axis = axis_of(toks, pos, ndim)
            size = shape[axis]
            if not is_ragged and c == bat:
                if size == 1 and num != 1:
                    squeezes[i] = axis
                    continue
                gathers[i] = axis
                gathered_numel += math.prod(shape[:axis]) * math.prod(shape[axis + 1 :])
            seen = sizes.get(c)
            if seen is not None and size != seen[0] and 1 not in (size, seen[0]):
                raise value_error(
                    func,
                    "equation",
                    f"subscript {c!r} has size {seen[0]} in operand {seen[1]} and {size} in "
                    f"operand {i}",
                    repr(recipe.equation),
                )
            if seen is None or seen[0] == 1:
                sizes[c] = (size, i)
    row, slot = recipe.row, recipe.slot

    def rewrite(i: int, lead: str) -> str:
        toks = tokens[i]
        if isinstance(operands[i], RaggedArray):
            return lead + "".join(toks[2:])
        if i in squeezes:
            return "".join(t for t in toks if t != bat)
        return "".join(row if t == bat else t for t in toks)

    mode, rest, out_tokens = recipe.mode, recipe.rest, recipe.out_tokens
    out_batch_axis, names = 0, None
    if mode == "keep":
        names = subscripts(
            [(terms[i], operands[i].axes) for i in recipe.ragged_pos], "".join(out_tokens)
        )
    elif mode == "segment":
        out_batch_axis = out_tokens.index(bat)
        if ELLIPSIS in out_tokens[:out_batch_axis]:
            out_batch_axis += len(torch.broadcast_shapes(*ellipses)) - 1
    tail = "".join(rest)
    rows_eq = ",".join(rewrite(i, row) for i in range(len(operands)))
    rows_eq += "->" + (tail if mode == "all" else row + tail)
    # Tile when a per-segment operand, or a per-row product to be summed per segment, is bigger
    # than the ragged rows themselves (a per-row einsum would then be a per-row matrix product).
    ragged_numel = sum(math.prod(operands[i].values.shape[1:]) for i in recipe.ragged_pos)
    tiles_eq = None
    blowup = mode == "segment" and _row_numel(rest, sizes, ellipses) > ragged_numel
    if gathered_numel > ragged_numel or blowup:
        tiles_eq = ",".join(rewrite(i, row + slot) for i in range(len(operands)))
        tiles_eq += "->" + (row + slot if mode == "keep" else row) + tail
    return _Plan(
        rows_eq, tiles_eq, mode, list(recipe.ragged_pos), gathers, squeezes, out_batch_axis, names
    )


def _ellipsis_shape(tokens: Sequence[str], shape: Sequence[int]) -> tuple[int, ...]:
    if ELLIPSIS not in tokens:
        return ()
    at = tokens.index(ELLIPSIS)
    return tuple(shape[at : len(shape) - (len(tokens) - at - 1)])


def _row_numel(
    rest: Sequence[str], sizes: dict[str, tuple[int, int]], ellipses: list[tuple[int, ...]]
) -> int:
    count = 1
    for c in rest:
        if c == ELLIPSIS:
            count *= math.prod(torch.broadcast_shapes(*ellipses))
        else:
            count *= sizes[c][0]
    return count
