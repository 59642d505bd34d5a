"""Padding, truncating and the ends of rows: ``pad``, ``pad_to``, ``truncate``, ``first``,
``last``, along any ragged axis.

Axis rules: ``pad``, ``pad_to`` and ``truncate`` build a **new partition** with the same axes and
names; ``first``/``last`` **remove** the axis (a dense result for one ragged axis).

Along the innermost ragged axis the new entries are rows of ``value``; along an outer ragged
axis (``axis=1`` of documents -> sentences -> tokens) they are empty rows, the only fill a
ragged row has, and ``first``/``last`` of an empty row list give an empty row.

Host syncs: ``pad`` and ``first``/``last`` are sync-free; ``pad_to`` too when ``clip=True`` or
when the partition knows that every row fits (else it reads the new total once); ``truncate``
reads the new sizes once unless every row is known to fit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import DENSE_RESULT, NEW
from ..._errors import Func, type_error, value_error
from ..._partition import Partition, RowPartition
from ..._registry import op, refuse
from .._levels import view
from ._axis import (
    check_flag,
    pad_outer,
    pad_to_inner,
    pad_to_outer,
    ragged_axis,
    sliced,
    take_dense,
)
from ._take import check_index_array, fill_tensor, resolve, take_rows_or_fill


def _pad_widths(func: Func, pad: Any) -> tuple[int, int]:
    widths = (pad, pad) if isinstance(pad, int) and not isinstance(pad, bool) else pad
    if (
        not isinstance(widths, (tuple, list))
        or len(widths) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in widths)
    ):
        raise type_error(func, "pad", "must be an int or a pair of ints (before, after)", repr(pad))
    if widths[0] < 0 or widths[1] < 0:
        raise value_error(func, "pad", "must be non-negative", repr(pad))
    return widths[0], widths[1]


@op("indexing", rule=NEW, args="x: ragged, pad: sizes, value: number?, axis: axis?")
def pad(
    x: RaggedArray, pad: int | tuple[int, int], value: Any = 0, *, axis: int | str = 1
) -> RaggedArray:
    """Add ``pad = (before, after)`` entries around every row along a ragged ``axis``.

    Along the innermost ragged axis the new entries are rows of ``value``; along an outer one
    (``axis=1`` of ``(B, S*, T*)``) they are empty rows (``value`` is not used). Sizes are
    static (``total + rows * (before + after)``), so this is sync-free; the new partition knows
    its maximum length whenever ``x``'s does. ``pad=0`` returns ``x``. Differentiable with
    respect to ``x``. To pad rows *to* a length, see [`pad_to`][ragged.pad_to].

    Args:
        x: the array, ``(B, L*, *inner)`` or with more ragged axes.
        pad: entries added before and after each row (an int pads both sides equally).
        value: the value of the new rows (innermost axis).
        axis: the ragged axis to pad (default 1).

    >>> import ragged
    >>> x = ragged.array([[1, 2], [], [3]])
    >>> ragged.pad(x, (1, 0), value=-1).to_list()
    [[-1, 1, 2], [-1], [-1, 3]]
    >>> docs = ragged.array([[[1, 2], [3]], [[4]]])
    >>> ragged.pad(docs, (0, 1), axis=1).to_list()
    [[[1, 2], [3], []], [[4], []]]
    """
    func = _PAD  # the op (its `pad` argument shadows its name here)
    check_index_array(func, x)
    before, after = _pad_widths(func, pad)
    fill = fill_tensor(func, x.values, value, "value")
    dim = ragged_axis(func, x, axis)
    if before == after == 0:
        return x
    if dim < x.ragged_ndim:
        return pad_outer(x, dim, before, after)
    v = view(x)
    level = v.array.partition.levels[0]
    extra = before + after
    num = level.num_rows
    values = x.values
    total = values.shape[0] + num * extra
    lengths = level.lengths + extra
    offsets = level.offsets + extra * torch.arange(num + 1, device=values.device)
    row_ids = torch.repeat_interleave(
        torch.arange(num, device=values.device), lengths, output_size=total
    )
    longest = None if level.max_length is None else level.max_length + extra
    squares = None
    if level.sum_squares is not None:  # sum (L + e)^2 = sum L^2 + 2 e sum L + B e^2
        squares = level.sum_squares + 2 * extra * values.shape[0] + num * extra * extra
    new = RowPartition(offsets, lengths, row_ids, longest, squares)
    destination = torch.arange(values.shape[0], device=values.device) + level.row_ids * extra
    # index_copy copies the (broadcast) fill once: the output is the only large allocation.
    out = fill.expand(total, *values.shape[1:]).index_copy(0, destination + before, values)
    return v.wrap(RaggedArray(out, Partition((new,)), v.array.axes))


_PAD = pad


@op("indexing", rule=NEW, args="x: ragged, length: int, value: number?, axis: axis?, clip: bool?")
def pad_to(
    x: RaggedArray, length: int, value: Any = 0, *, axis: int | str = 1, clip: bool = False
) -> RaggedArray:
    """Pad every row along a ragged ``axis`` at its end to at least ``length`` entries.

    Rows already that long stay as they are: the result stays ragged beyond ``length``
    (awkward's ``pad_none(x, length)``, with ``value`` in place of None). With ``clip=True``
    longer rows are cut, so every row has exactly ``length`` entries (``pad_none(...,
    clip=True)``). Along an outer ragged axis the new entries are empty rows.

    Host syncs: the new total depends on the data unless ``clip=True`` or the partition knows
    that every row fits (``max_length <= length``); otherwise it is read once (one host sync).
    Differentiable with respect to ``x``.

    Args:
        x: the array.
        length: the minimum (with ``clip``: exact) number of entries per row, ``>= 0``.
        value: the value of the new rows (innermost axis).
        axis: the ragged axis (default 1).
        clip: also cut longer rows to ``length``.

    >>> import ragged
    >>> x = ragged.array([[1, 2, 3], [], [4]])
    >>> ragged.pad_to(x, 2, value=-1).to_list()
    [[1, 2, 3], [-1, -1], [4, -1]]
    >>> ragged.pad_to(x, 2, value=-1, clip=True).to_list()
    [[1, 2], [-1, -1], [4, -1]]
    """
    func = pad_to
    check_index_array(func, x)
    if isinstance(length, bool) or not isinstance(length, int):
        raise type_error(func, "length", "must be an int", type(length).__name__)
    if length < 0:
        raise value_error(func, "length", "must be non-negative", length)
    check_flag(func, "clip", clip)
    fill = fill_tensor(func, x.values, value, "value")
    dim = ragged_axis(func, x, axis)
    if dim < x.ragged_ndim:
        return pad_to_outer(x, dim, length, clip)
    return pad_to_inner(x, length, clip, fill, take_rows_or_fill)


@op("indexing", rule=NEW, args="x: ragged, max_len: int, axis: axis?")
def truncate(x: RaggedArray, max_len: int, *, axis: int | str = 1) -> RaggedArray:
    """Keep the first ``max_len`` entries of every row along a ragged ``axis``.

    Lengths become ``min(L, max_len)``. Returns ``x`` itself when its partition knows that
    every row fits. Otherwise the new total depends on the data: this reads it (and the new
    maximum length, and along an outer axis the sizes of the levels below) once (one host
    sync). The same as ``x[:, :max_len]`` (``x[:, :, :max_len]`` for ``axis=2``).
    Differentiable with respect to ``x``.

    >>> import ragged
    >>> x = ragged.array([[1, 2, 3], [], [4]])
    >>> ragged.truncate(x, 2).to_list()
    [[1, 2], [], [4]]
    >>> ragged.truncate(x, 3) is x
    True
    """
    func = truncate
    check_index_array(func, x)
    if not isinstance(max_len, int) or isinstance(max_len, bool):
        raise type_error(func, "max_len", "must be an int", type(max_len).__name__)
    if max_len < 0:
        raise value_error(func, "max_len", "must be non-negative", max_len)
    return sliced(func, x, ragged_axis(func, x, axis), None, max_len, 1)


# --- first, last ------------------------------------------------------------------------------


def _end(func: Func, x: RaggedArray, fill_value: Any, axis: Any, last: bool) -> Any:
    check_index_array(func, x)
    fill = fill_tensor(func, x.values, fill_value)
    dim = ragged_axis(func, x, axis)
    if x.ragged_ndim > 1:
        level = x.partition.levels[dim - 1]
        index = torch.full((level.num_rows,), -1 if last else 0, device=x.device)
        return take_dense(func, x, dim, index, resolve, take_rows_or_fill, "fill", fill)
    level = x.partition.levels[0]
    rows = level.offsets[1:] - 1 if last else level.offsets[:-1]
    return take_rows_or_fill(x.values, rows, level.lengths > 0, fill)


@op("indexing", rule=DENSE_RESULT, args="x: ragged, fill_value: number?, axis: axis?")
def first(x: RaggedArray, *, fill_value: Any = None, axis: int | str = 1) -> Tensor:
    """The first entry of every row along a ragged ``axis`` (default: of every segment).

    For ``(B, L*, *inner)`` a dense ``(B, *inner)``; for more ragged axes the axis goes away
    (``x[:, 0]``: the first sentence of each document, ``(B, T*)``; ``axis=2``: the first token
    of each sentence, ``(B, S*)``). Empty rows give ``fill_value`` (default NaN for floating
    dtypes, 0 for integers, False for bool: the ``"fill"`` rule of [`take`][ragged.take], so
    this equals ``x[:, 0]``), and an empty row along an outer axis an empty row. Sync-free
    (along an outer axis: one host read of the sizes below). Differentiable.

    >>> import ragged
    >>> ragged.first(ragged.array([[1.0, 2.0], [], [3.0]]))
    tensor([1., nan, 3.])
    >>> ragged.first(ragged.array([[[1, 2], [3]], [[4]]]), axis=2).to_list()
    [[1, 3], [4]]
    """
    return _end(first, x, fill_value, axis, last=False)


@op("indexing", rule=DENSE_RESULT, args="x: ragged, fill_value: number?, axis: axis?")
def last(x: RaggedArray, *, fill_value: Any = None, axis: int | str = 1) -> Tensor:
    """The last entry of every row along a ragged ``axis``; see [`first`][ragged.first].

    >>> import ragged
    >>> ragged.last(ragged.array([[1, 2], [], [3]]), fill_value=-1)
    tensor([ 2, -1,  3])
    """
    return _end(last, x, fill_value, axis, last=True)


refuse(
    torch.nn.functional.pad,
    family="indexing",
    hint="ragged.pad pads every segment",
    see=("ragged.pad",),
)
