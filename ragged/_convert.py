"""Converters from a RaggedArray to dense tensors, masks, Python lists and ``torch.nested``.

Host syncs: ``to_padded``/``to_mask`` read nothing from the device when ``length`` is given or
the partition knows its maximum length (the factories record it from host data); otherwise they
read the maximum once. ``to_list``/``unbind`` read the data by nature.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._errors import Func, type_error, value_error
from ._registry import public
from ._versions import check_unchanged

if TYPE_CHECKING:
    from ._array import RaggedArray
    from ._partition import Partition

__all__ = ["to_list", "to_mask", "to_nested", "to_padded", "unbind"]


def _lengths_arg(func: Func, x: RaggedArray, length: int | Sequence[int] | None) -> list[int]:
    """The padded size of every ragged axis: given, known statically, or read once."""
    levels = x.partition.levels
    if length is None:
        return [x.partition.max_length(k) for k in range(len(levels))]
    given = [length] if isinstance(length, int) else list(length)
    if len(given) != len(levels) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in given
    ):
        expected = f"must be {len(levels)} int(s), one per ragged axis"
        raise type_error(func, "length", expected, repr(length))
    if any(n < 0 for n in given):
        raise value_error(func, "length", "must be non-negative", repr(length))
    return given


def padded_index(partition: Partition, sizes: list[int]) -> tuple[Tensor, Tensor | None]:
    """Flat index of every value row in a ``[B, *sizes]`` grid, and which rows fit in it.

    The mask is ``None`` when every row fits (known statically from the partition's maximum
    lengths), so callers can skip the masking work.
    """
    levels = partition.levels
    index = levels[-1].positions()
    parent = levels[-1].row_ids
    fits = not _may_overflow(partition, sizes, len(levels) - 1)
    valid = None if fits else index < sizes[-1]
    stride = sizes[-1]
    for k in range(len(levels) - 2, -1, -1):
        position = levels[k].positions()[parent]
        if _may_overflow(partition, sizes, k):
            inside = position < sizes[k]
            valid = inside if valid is None else valid & inside
        index = index + position * stride
        stride *= sizes[k]
        parent = levels[k].row_ids[parent]
    return index + parent * stride, valid


def _may_overflow(partition: Partition, sizes: list[int], k: int) -> bool:
    known = partition.levels[k].max_length
    return known is None or known > sizes[k]


@public("conversions")
def to_padded(x: RaggedArray, fill_value: float = 0, *, length: int | None = None) -> Tensor:
    """Pad every segment to a dense ``(B, length, *inner)`` tensor.

    Args:
        x: the ragged array.
        fill_value: value of the padding positions.
        length: padded size of the ragged axis (one int per ragged axis for several). Rows past
            ``length`` are dropped (a truncation, not an error). Default: the longest segment,
            which is free when the partition knows it and otherwise reads it once.

    Returns:
        A new tensor; differentiable with respect to ``x.values``.

    >>> import ragged
    >>> x = ragged.array([[1, 2], [], [3]])
    >>> ragged.to_padded(x, -1)
    tensor([[ 1,  2],
            [-1, -1],
            [ 3, -1]])
    >>> ragged.to_padded(x, length=1)
    tensor([[1],
            [0],
            [3]])
    """
    check_unchanged(to_padded, x, any_layout=True)  # an edited partition: a wrong layout
    sizes = _lengths_arg(to_padded, x, length)
    index, valid = padded_index(x.partition, sizes)
    values = x.values
    grid = x.num_segments
    for size in sizes:
        grid = grid * size
    if valid is not None:
        # Rows that do not fit go to one extra dump row, sliced off below (no sync).
        index = torch.where(valid, index, grid)
    out = values.new_full((grid + (valid is not None), *values.shape[1:]), fill_value)
    out = out.index_put((index,), values)
    if valid is not None:
        out = out[:grid]
    return out.reshape(x.num_segments, *sizes, *values.shape[1:])


@public("conversions")
def to_mask(x: RaggedArray, *, length: int | None = None) -> Tensor:
    """Boolean mask, ``True`` at the real positions of [`to_padded`][ragged.to_padded]'s output.

    >>> import ragged
    >>> ragged.to_mask(ragged.array([[1, 2], [], [3]]))
    tensor([[ True,  True],
            [False, False],
            [ True, False]])
    """
    check_unchanged(to_mask, x, any_layout=True)
    sizes = _lengths_arg(to_mask, x, length)
    if len(sizes) == 1:
        positions = torch.arange(sizes[0], device=x.device)
        return positions < x.lengths[:, None]
    index, valid = padded_index(x.partition, sizes)
    grid = x.num_segments
    for size in sizes:
        grid = grid * size
    ones = torch.ones_like(index, dtype=torch.bool)
    if valid is not None:
        index = torch.where(valid, index, grid)
    mask = torch.zeros(grid + (valid is not None), dtype=torch.bool, device=x.device)
    mask = mask.index_put((index,), ones)[:grid]
    return mask.reshape(x.num_segments, *sizes)


def _group(items: list, partition: Partition) -> list:
    for level in reversed(partition.levels):
        bounds = level.offsets.tolist()
        items = [items[a:b] for a, b in itertools.pairwise(bounds)]
    return items


@public("conversions")
def to_list(x: RaggedArray) -> list:
    """The array as nested Python lists (reads all values).

    >>> import ragged
    >>> ragged.to_list(ragged.array([[1, 2], [], [3]]))
    [[1, 2], [], [3]]
    """
    return _group(x.values.tolist(), x.partition)


@public("conversions")
def unbind(x: RaggedArray) -> tuple[Any, ...]:
    """The segments: a tuple of ``B`` tensors of shape ``(L_b, *inner)`` (reads the lengths).

    For an array with several ragged axes each segment is a RaggedArray of one fewer.

    >>> import ragged
    >>> ragged.unbind(ragged.array([[1, 2], [], [3]]))
    (tensor([1, 2]), tensor([], dtype=torch.int64), tensor([3]))
    """
    if x.ragged_ndim == 1:
        return torch.split(x.values, x.lengths.tolist())
    return tuple(x[b] for b in range(x.num_segments))


@public("conversions")
def to_nested(x: RaggedArray) -> Tensor:
    """A ``torch.nested`` jagged-layout tensor sharing ``x.values`` and ``x.offsets``.

    Only for one ragged axis (``torch.nested`` has no second one).

    >>> import ragged
    >>> nt = ragged.to_nested(ragged.array([[1.0, 2.0], [3.0]]))
    >>> nt.is_nested, nt.layout, [t.tolist() for t in nt.unbind()]
    (True, torch.jagged, [[1.0, 2.0], [3.0]])
    """
    if x.ragged_ndim != 1:
        raise value_error(
            to_nested, "x", "must have one ragged axis", f"{x.ragged_ndim} ragged axes"
        )
    build = torch.nested.nested_tensor_from_jagged
    max_seqlen = x.partition.levels[0].max_length
    if torch.compiler.is_compiling():
        return build(x.values, x.offsets, max_seqlen=max_seqlen)
    # torch 2.13's nested_tensor_from_jagged calls torch.fx's is_fx_tracing, which logs a warning
    # meant for torch's own code once per process: keep it out of the user's output. Remove the
    # filter when torch's constructor stops calling is_fx_tracing (the deprecation of
    # is_fx_tracing in torch.fx says its callers move to is_fx_symbolic_tracing).
    fx_log = logging.getLogger("torch.fx._symbolic_trace")
    fx_log.addFilter(_drop_fx_tracing_warning)
    try:
        return build(x.values, x.offsets, max_seqlen=max_seqlen)
    finally:
        fx_log.removeFilter(_drop_fx_tracing_warning)


def _drop_fx_tracing_warning(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("is_fx_tracing will return true")
