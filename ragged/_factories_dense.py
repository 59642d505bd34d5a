"""Factories from dense or nested data: padded tensors, masks, ``torch.nested``, lists.

``from_padded`` (a padded tensor with lengths or a mask), ``from_nested`` (a ``torch.nested``
jagged tensor) and ``array`` (nested lists, a sequence of tensors, an awkward array). They check
their inputs as the index factories in ``ragged._factories`` do (``ragged._factory_checks``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ._array import RaggedArray
from ._errors import Func, name_of, type_error, typename, value_error
from ._factory_checks import (
    host_partition,
    index_argument,
    named_array,
    readable,
)
from ._from_lists import from_lists
from ._partition import Partition, RowPartition
from ._registry import public

# Other libraries' arrays that ``ragged.array`` takes, as (test, converter) pairs: registered by
# their conversions in ``ragged.interop`` (awkward arrays), which sits above this module.
_ARRAY_SOURCES: list[tuple[Callable[[object], bool], Callable[..., RaggedArray]]] = []


def register_array_source(
    test: Callable[[object], bool], convert: Callable[..., RaggedArray]
) -> None:
    """Have ``ragged.array(data, ...)`` return ``convert(data, axes=, dtype=, device=,
    ragged_ndim=)`` when ``test(data)`` holds (``ragged.interop`` registers awkward arrays)."""
    _ARRAY_SOURCES.append((test, convert))


__all__ = ["array", "from_nested", "from_padded"]


@public("constructors")
def from_padded(
    padded: Tensor,
    lengths: Tensor | Sequence[int] | None = None,
    *,
    mask: Tensor | None = None,
    axes: Sequence[str] | None = None,
    pairs: bool = False,
) -> RaggedArray:
    """The rows ``padded[b, :lengths[b]]`` of a dense ``(B, L, *inner)`` tensor, packed.

    Give either ``lengths`` or a prefix ``mask`` (``True`` on the first ``lengths[b]``
    positions of each row, as HuggingFace ``attention_mask``), or neither for full rows. The
    output size depends on the data: this reads the lengths back once (one host sync) unless
    they are given as a Python sequence.

    Args:
        padded: ``(B, L, *inner)``, or ``(B, L, L, *inner)`` with ``pairs=True``.
        lengths: per-segment lengths in ``[0, L]``.
        mask: boolean ``(B, L)``; must be left-aligned (a prefix of each row).
        axes: optional unique names, one per logical axis.
        pairs: read a padded pair map: the result is the ``(B, L*, L*, *inner)`` array of the
            blocks ``padded[b, :L_b, :L_b]`` (a product partition, see ``Partition.outer``).

    Returns:
        A RaggedArray whose values are gathered from ``padded`` (differentiable).

    >>> import ragged, torch
    >>> padded = torch.tensor([[1, 2, 0], [3, 0, 0]])
    >>> ragged.from_padded(padded, mask=padded != 0).to_list()
    [[1, 2], [3]]
    >>> ragged.from_padded(torch.arange(8).reshape(2, 2, 2), [2, 1], pairs=True).to_list()
    [[[0, 1], [2, 3]], [[4]]]
    >>> ragged.from_padded(padded, mask=torch.tensor([[True, False, True], [True, False, False]]))
    Traceback (most recent call last):
    ValueError: ragged.from_padded: `mask` must be left-aligned (True on a prefix of each row), got row 0 = [True, False, True].
    """
    func = from_padded
    if not isinstance(padded, Tensor):
        raise type_error(func, "padded", "must be a Tensor", typename(padded))
    needed = 3 if pairs else 2
    if padded.dim() < needed:
        expected = "(B, L, L, ...)" if pairs else "(B, L, ...)"
        raise value_error(
            func, "padded", f"must have at least {needed} dims {expected}", tuple(padded.shape)
        )
    num, width = padded.shape[0], padded.shape[1]
    if pairs and padded.shape[2] != width:
        raise value_error(
            func, "padded", "must be square in dims 1 and 2 for pairs=True", tuple(padded.shape)
        )
    level = _padded_level(func, lengths, mask, num, width, padded.device)
    if not pairs:
        index = level.row_ids * width + level.positions()
        values = padded.reshape(num * width, *padded.shape[2:]).index_select(0, index)
        return named_array(func, values, Partition((level,)), axes)
    partition = Partition.outer(level, level)
    cells = partition.levels[1]
    row = cells.row_ids
    segment = level.row_ids.index_select(0, row)
    i = level.positions().index_select(0, row)
    index = (segment * width + i) * width + cells.positions()
    values = padded.reshape(num * width * width, *padded.shape[3:]).index_select(0, index)
    return named_array(func, values, partition, axes)


def _padded_level(
    func: Func,
    lengths: Tensor | Sequence[int] | None,
    mask: Tensor | None,
    num: int,
    width: int,
    device: torch.device,
) -> RowPartition:
    """The first ragged level of ``from_padded``, from lengths, a prefix mask, or full rows."""
    if lengths is not None and mask is not None:
        raise TypeError(f"{name_of(func)}: pass `lengths` or `mask`, not both.")
    host: list[int] | None
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise type_error(func, "mask", "must be a bool Tensor", typename(mask))
        if tuple(mask.shape) != (num, width):
            raise value_error(func, "mask", f"must have shape ({num}, {width})", tuple(mask.shape))
        readable(func, "mask", mask, "pass lengths as a list")
        lengths_t = mask.sum(1)
        prefix = torch.arange(width, device=mask.device) < lengths_t[:, None]
        bad_rows = (prefix != mask).any(1)
        if bool(bad_rows.any()):
            row = int(torch.argmax(bad_rows.to(torch.int8)))
            got = f"row {row} = {mask[row].tolist()}"
            raise value_error(
                func, "mask", "must be left-aligned (True on a prefix of each row)", got
            )
        host = None
    elif lengths is not None:
        lengths_t, host = index_argument(func, "lengths", lengths, device)
        if lengths_t.shape[0] != num:
            raise value_error(func, "lengths", f"must have {num} entries", lengths_t.shape[0])
    else:
        lengths_t = torch.full((num,), width, dtype=torch.int64, device=device)
        host = [width] * num
    if host is None:
        readable(func, "lengths", lengths_t, "pass lengths as a list")
        stats = (
            torch.stack(
                [lengths_t.min(), lengths_t.max(), lengths_t.sum(), (lengths_t * lengths_t).sum()]
            )
            if num
            else None
        )
        low, high, total, squares = stats.tolist() if stats is not None else (0, 0, 0, 0)
        lengths_t = lengths_t.clone() if lengths_t is lengths else lengths_t  # own it
    else:
        low, high, total = min(host, default=0), max(host, default=0), sum(host)
        squares = sum(n * n for n in host)
    if low < 0 or high > width:
        raise value_error(func, "lengths", f"must be in [0, {width}]", f"min {low}, max {high}")
    return RowPartition.from_lengths(lengths_t, total, high, squares, nonempty=num == 0 or low > 0)


@public("constructors")
def from_nested(nt: Tensor, *, axes: Sequence[str] | None = None) -> RaggedArray:
    """A RaggedArray sharing the values of a ``torch.nested`` jagged tensor.

    The offsets are copied (the array owns its index tensors) and, as torch does not check
    them, made well formed without reading them (see
    ``ragged.RowPartition.from_unchecked_offsets``). A jagged tensor with holes (built with
    ``lengths``) is compacted (its values are copied).

    >>> import ragged, torch
    >>> nt = torch.nested.nested_tensor([torch.ones(2), torch.zeros(1)], layout=torch.jagged)
    >>> ragged.from_nested(nt).to_list()
    [[1.0, 1.0], [0.0]]
    """
    func = from_nested
    if not isinstance(nt, Tensor) or not nt.is_nested or nt.layout != torch.jagged:
        raise type_error(
            func, "nt", "must be a torch.nested tensor with layout=torch.jagged", typename(nt)
        )
    ragged_dim = getattr(nt, "_ragged_idx", 1)
    if ragged_dim != 1:
        raise value_error(func, "nt", "must be ragged along dim 1", f"ragged dim {ragged_dim}")
    values, offsets, holes = nt.values(), nt.offsets(), nt.lengths()  # type: ignore[attr-defined]
    total = values.shape[0]
    if holes is None:
        level = RowPartition.from_unchecked_offsets(offsets.to(torch.int64), total)
    else:  # every kept row must lie inside `values`: clamp the starts and the lengths
        starts = offsets[:-1].to(torch.int64).clamp(0, total)
        lengths_t = torch.minimum(holes.to(torch.int64).clamp(min=0), total - starts)
        level = RowPartition.from_lengths(lengths_t, int(lengths_t.sum()))
        values = values[starts[level.row_ids] + level.positions()]
    return named_array(func, values, Partition((level,)), axes)


# --- segments as tensors or nested Python lists ---------------------------------------------


def _segments_from_tensors(
    func: Func, data: Sequence[Any], dtype: torch.dtype | None, device: Any
) -> tuple[Tensor, list[int]]:
    tensors = [seg if isinstance(seg, Tensor) else torch.as_tensor(seg) for seg in data]
    for b, seg in enumerate(tensors):
        if seg.dim() == 0:
            raise value_error(
                func,
                "data",
                "must hold one sequence of rows per segment",
                f"data[{b}] = {data[b]!r}",
            )
    dtypes = {seg.dtype for seg in tensors}
    if dtype is None and len(dtypes) > 1:
        raise type_error(
            func,
            "data",
            "must hold tensors of one dtype (or pass dtype=)",
            sorted(map(str, dtypes)),
        )
    devices = {seg.device for seg in tensors}
    if len(devices) > 1:
        raise value_error(
            func, "data", "must hold tensors on one device", sorted(map(str, devices))
        )
    inner = {tuple(seg.shape[1:]) for seg in tensors}
    if len(inner) > 1:
        raise value_error(
            func, "data", "must hold segments with one inner shape", f"inner shapes {sorted(inner)}"
        )
    values = torch.cat(tensors) if tensors else torch.empty(0)
    return values.to(dtype=dtype, device=device), [seg.shape[0] for seg in tensors]


@public("constructors")
def array(
    data: Sequence[Any],
    *,
    axes: Sequence[str] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    ragged_ndim: int | None = None,
) -> RaggedArray:
    """A RaggedArray from a sequence of segments (tensors, arrays or nested lists).

    Args:
        data: one entry per segment, each a tensor (or array-like) of shape ``(L_b, *inner)``
            or a nested list of rows; or an awkward array (see
            [`ragged.from_awkward`][ragged.from_awkward]). Tensors must share dtype (unless ``dtype`` is given),
            device and inner shape; nested lists must share their depth.
        axes: optional unique names, one per logical axis.
        dtype: convert the values to this dtype (lists: infer, as ``torch.tensor`` does).
        device: put the values on this device.
        ragged_ndim: number of ragged axes for nested lists (e.g. 2 for documents -> sentences
            -> tokens). Default: the fewest that fit the data (the deepest axis whose lists
            differ in length); pass it in data pipelines, where a batch whose sentences happen to
            have equal lengths must not come out with a dense axis.

    >>> import ragged, torch
    >>> ragged.array([torch.ones(2, 3), torch.zeros(0, 3)]).shape
    RaggedShape(2, [2, 0], 3)
    >>> ragged.array([[1, 2], [3.5]]).to_list()
    [[1.0, 2.0], [3.5]]
    >>> ragged.array([[[1, 2], [3]], [[4]]]).shape          # documents -> sentences -> tokens
    RaggedShape(2, [2, 1], [[2, 1], [1]])
    >>> ragged.array([[[1, 2]], [[3, 4], [5, 6]]], ragged_ndim=2).shape
    RaggedShape(2, [1, 2], [[2], [2, 2]])
    >>> ragged.array([[1, 2], [[3]]])
    Traceback (most recent call last):
    ValueError: ragged.array: `data` must be nested lists of one consistent depth, got depths [2, 3].
    """
    func = array
    for test, convert in _ARRAY_SOURCES:  # awkward arrays: their buffers, shared where they can be
        if test(data):
            return convert(data, axes=axes, dtype=dtype, device=device, ragged_ndim=ragged_ndim)
    if isinstance(data, Tensor) and data.is_nested:
        expected = "must be a list of segments (for a torch.nested tensor use ragged.from_nested)"
        raise type_error(func, "data", expected, typename(data))
    if isinstance(data, Tensor) or not isinstance(data, Sequence) or isinstance(data, str):
        raise type_error(
            func,
            "data",
            "must be a list of segments (for a dense tensor use ragged.from_padded)",
            typename(data),
        )
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise type_error(func, "dtype", "must be a torch.dtype", typename(dtype))
    if ragged_ndim is not None and (
        isinstance(ragged_ndim, bool) or not isinstance(ragged_ndim, int)
    ):
        raise type_error(func, "ragged_ndim", "must be an int or None", typename(ragged_ndim))
    if all(isinstance(seg, (list, tuple)) for seg in data):
        values, levels = from_lists(func, data, ragged_ndim, dtype, device)
    else:
        if ragged_ndim not in (None, 1):
            raise value_error(
                func, "ragged_ndim", "must be 1 for segments given as tensors", ragged_ndim
            )
        values, lengths = _segments_from_tensors(func, data, dtype, device)
        levels = [lengths]
    return named_array(func, values, host_partition(levels, values.device), axes)
