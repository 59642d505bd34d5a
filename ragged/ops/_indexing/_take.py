"""Indexing ops along a ragged axis: ``take`` and ``filter`` (``pad``, ``pad_to``, ``truncate``,
``first`` and ``last`` are on the same page).

Axis rules (docs/semantics.md, "Axis names"): ``take`` with RaggedArray indices gives the **indices'
partition** (segment ``b`` is ``x_b[indices_b]``); with dense ``(B, *extra)`` indices it
**consumes** the ragged axis (a dense result; on a multi-level array one index per row removes
the axis); ``filter`` builds a **new partition** with the same axes and names, and returns the
input's partition object when every row is kept. Along an outer ragged axis of a multi-level
array whole rows move with their subtrees.

Out-of-range indices (per segment: ``-L_b <= i < L_b`` is in range, negative ``i`` counts from
the segment's end) follow ``jnp.take``'s modes. ``"fill"`` (the default) gives ``fill_value``:
NaN for floating dtypes, 0 for integers, False for bool. ``"clip"`` clamps into the segment and
``"wrap"`` wraps around it; an empty segment has no row to clamp or wrap to, so it fills there
too. ``"raise"`` checks every index, which reads one flag back (one host sync). ``x[:, i]`` and
``first``/``last`` use the ``"fill"`` rule, so ``x[:, 0]`` equals ``ragged.first(x)``.

Host syncs: ``filter`` (and per-segment slicing ``x[:, a:b]``) produce a size that depends on
the data; each reads the new total and maximum length once (one host sync) and records the
maximum in the new partition. ``take`` (except ``mode="raise"``) is sync-free along the
innermost ragged axis; along an outer one it reads the sizes of the rows it moves once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import NEW, TAKE, normalize_axis
from ..._broadcast import same_partition
from ..._errors import Func, name_of, type_error, typename, value_error
from ..._partition import Partition, RowPartition, length_stats
from ..._registry import op, refuse
from ...kernels._segment import Segments, segment_sum
from ._axis import filter_plan, same_upper, take_dense, take_ragged

_MODES = ("fill", "clip", "wrap", "raise")


# --- shared helpers ---------------------------------------------------------------------------


def check_index_array(func: Func, x: Any, param: str = "x") -> None:
    if not isinstance(x, RaggedArray):
        raise type_error(func, param, "must be a RaggedArray", type(x).__name__)


def default_fill(dtype: torch.dtype) -> float | int | bool:
    """The fill of out-of-range rows: NaN for floating/complex dtypes, False for bool, else 0.

    >>> default_fill(torch.float32), default_fill(torch.int64), default_fill(torch.bool)
    (nan, 0, False)
    """
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return False
    return 0


def fill_tensor(func: Func, like: Tensor, fill_value: Any, param: str = "fill_value") -> Tensor:
    """``fill_value`` (or the dtype's default) as a 0-d tensor of ``like``'s dtype and device."""
    value = default_fill(like.dtype) if fill_value is None else fill_value
    if isinstance(value, Tensor) and value.dim() == 0:
        return value.to(dtype=like.dtype, device=like.device)
    if not isinstance(value, (bool, int, float, complex)):
        raise type_error(func, param, "must be a number or a 0-D tensor", typename(value))
    if not _representable(value, like.dtype):
        raise value_error(func, param, f"must be representable in {like.dtype}", repr(value))
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def _representable(value: bool | int | float | complex, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds ``value`` exactly (floats may round), checked on the host."""
    if dtype.is_complex:
        return True
    if isinstance(value, complex):
        return False
    if dtype.is_floating_point:
        return True
    if isinstance(value, float) and not value.is_integer():  # also NaN and infinities
        return False
    if dtype == torch.bool:
        return value in (0, 1)
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


def take_rows_or_fill(values: Tensor, rows: Tensor, valid: Tensor | None, fill: Tensor) -> Tensor:
    """``values[rows]`` where ``valid``, ``fill`` elsewhere: shape ``(*rows.shape, *inner)``.

    Invalid entries of ``rows`` may hold anything; they are clamped before the gather and masked
    after it, so the gradient flows only to the rows actually read (never NaN through the fill).
    """
    inner = values.shape[1:]
    if valid is not None and values.shape[0] == 0:
        # Nothing to read, every entry fills: one fill row to point at keeps the graph intact.
        values = torch.cat([values, fill.expand(1, *inner)])
    flat = rows.reshape(-1)
    if valid is not None:
        flat = flat.clamp(0, values.shape[0] - 1)
    picked = values.index_select(0, flat)
    if valid is not None:
        mask = valid.reshape(-1, *[1] * len(inner))
        picked = torch.where(mask, picked, fill)
    return picked.reshape(*rows.shape, *inner)


def _check_mode(func: Func, mode: Any) -> str:
    if not isinstance(mode, str) or mode not in _MODES:
        raise value_error(
            func, "mode", "must be one of 'fill', 'clip', 'wrap', 'raise'", repr(mode)
        )
    return mode


def _check_int_tensor(func: Func, param: str, t: Tensor) -> None:
    if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
        raise type_error(func, param, "must have an integer dtype", t.dtype)


def _check_device(func: Func, t: Tensor, x: RaggedArray) -> None:
    if t.device != x.device:
        raise value_error(func, "indices", f"must be on the device of x ({x.device})", t.device)


def resolve(
    func: Func, index: Tensor, size: Tensor | int, mode: str
) -> tuple[Tensor, Tensor | None]:
    """Positions of ``index`` within an axis of ``size`` (per element), and which are in range.

    ``size`` broadcasts against ``index`` (per-segment lengths, or an int for a dense axis).
    Returns ``(position, valid)``; ``valid`` is ``None`` when every position is in range.
    """
    index = index.to(torch.int64)
    if mode == "wrap":
        if isinstance(size, int):
            return (torch.remainder(index, size), None) if size else (index, _none_valid(index))
        position = torch.remainder(index, size.clamp_min(1))
        return position, (size > 0).expand_as(position)
    position = torch.where(index < 0, index + size, index)
    if mode == "clip":
        if isinstance(size, int):
            position = position.clamp(0, max(size - 1, 0))
            return position, None if size else _none_valid(index)
        position = torch.minimum(position.clamp_min(0), size - 1)
        return position, (size > 0).expand_as(position)
    valid = (position >= 0) & (position < size)
    if mode == "raise":
        if not bool(valid.all()):  # one host sync, by request
            raise IndexError(f"{name_of(func)}: index out of range (mode='raise').")
        return position, None
    return position, valid


def _none_valid(index: Tensor) -> Tensor:
    return torch.zeros_like(index, dtype=torch.bool)


# --- take -------------------------------------------------------------------------------------


@op(
    "indexing",
    rule=TAKE,
    args="x: ragged, indices: index, axis: axis?, mode: str?, fill_value: number?",
)
def take(
    x: RaggedArray,
    indices: RaggedArray | Tensor,
    axis: int | str = 1,
    *,
    mode: str = "fill",
    fill_value: Any = None,
) -> RaggedArray | Tensor:
    """Per-segment gather along ``axis``: segment ``b`` of the result is ``x_b[indices_b]``.

    Along the ragged axis (the default), ``indices`` is either

    * a RaggedArray of integers with ``B`` segments and no inner axes: the result has the
      partition of ``indices`` (the same object) and the inner shape and names of ``x``; or
    * a dense integer tensor ``(B, *extra)``: the result is dense ``(B, *extra, *inner)``.

    Along ragged axis ``k`` of a multi-level array the positions are per row of axis ``k - 1``
    (``(B, S*, T*)``, ``axis=2``: tokens of each sentence; ``axis=1``: sentences of each
    document, moved whole with their tokens): a RaggedArray with ``k`` ragged axes (the first
    ``k - 1`` those of ``x``), or a dense ``(R,)`` (one per row: the axis goes) or ``(R, K)``,
    ``R`` the number of rows of axis ``k - 1``. Out of range along an outer axis gives an empty
    row (along the innermost, ``fill_value``).

    Negative indices count from each segment's end. Out-of-range indices follow ``mode``, as
    for ``jnp.take``: ``"fill"`` gives ``fill_value`` (default NaN for floating dtypes, 0 for
    integers, False for bool), ``"clip"`` clamps into the segment, ``"wrap"`` wraps around it
    (an empty segment fills for both), and ``"raise"`` raises ``IndexError``, reading one flag
    back (one host sync). Every other mode is sync-free.

    Along an inner axis ``indices`` is a dense integer tensor applied to every row (like
    ``torch.index_select``; a multi-dimensional ``indices`` adds its axes in place of the axis);
    the partition is kept.

    Differentiable with respect to ``x`` (repeated indices accumulate their gradients; filled
    entries get none).

    Args:
        x: the array, ``(B, L*, *inner)`` or with more ragged axes.
        indices: the positions to pick, as described above.
        axis: a ragged axis (default 1) or an inner axis; an int or a name.
        mode: ``"fill"``, ``"clip"``, ``"wrap"`` or ``"raise"``.
        fill_value: the value of filled entries (``mode="fill"``, and empty segments).

    Returns:
        A RaggedArray (ragged indices, or an inner axis) or a dense tensor (dense indices).

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 2.0, 3.0], [], [4.0]])
    >>> ragged.take(x, ragged.array([[2, 0, -1], [0], []])).to_list()
    [[3.0, 1.0, 3.0], [nan], []]
    >>> ragged.take(x, torch.tensor([[0, 5], [0, 0], [-1, 1]]), mode="clip", fill_value=0.0)
    tensor([[1., 3.],
            [0., 0.],
            [4., 4.]])
    >>> docs = ragged.array([[[1, 2], [3]], [[4]]])
    >>> ragged.take(docs, ragged.array([[1, 1], [5]]), axis=1).to_list()
    [[[3], [3]], [[]]]
    """
    func = take
    check_index_array(func, x)
    mode = _check_mode(func, mode)
    dim = normalize_axis(func, x, axis)
    if dim == 0:
        raise value_error(
            func, "axis", "cannot be the batch axis (pick segments with x[indices])", repr(axis)
        )
    fill = fill_tensor(func, x.values, fill_value)
    if dim > x.ragged_ndim:
        return _take_inner(func, x, indices, dim - x.ragged_ndim, mode, fill)
    if x.ragged_ndim > 1:
        return _take_levels(func, x, dim, indices, mode, fill)
    level = x.partition.levels[0]
    num = x.num_segments
    if isinstance(indices, RaggedArray):
        _check_int_tensor(func, "indices", indices.values)
        if indices.ragged_ndim != 1 or indices.values.dim() != 1:
            raise value_error(
                func,
                "indices",
                "must be a RaggedArray of shape (B, K*) (no inner axes)",
                f"{indices.ndim} axes",
            )
        if indices.num_segments != num:
            expected = f"must have {num} segments (one per segment of x)"
            raise value_error(func, "indices", expected, indices.num_segments)
        _check_device(func, indices.values, x)
        seg = indices.partition.segment_ids()
        position, valid = resolve(func, indices.values, level.lengths[seg], mode)
        rows = level.offsets[seg] + position
        values = take_rows_or_fill(x.values, rows, valid, fill)
        return RaggedArray(values, indices.partition, x.axes)
    if not isinstance(indices, Tensor):
        raise type_error(func, "indices", "must be a RaggedArray or a Tensor", typename(indices))
    _check_int_tensor(func, "indices", indices)
    if indices.dim() == 0 or indices.shape[0] != num:
        expected = f"must have shape ({num}, ...) (one row per segment)"
        raise value_error(func, "indices", expected, tuple(indices.shape))
    _check_device(func, indices, x)
    shape = (num, *[1] * (indices.dim() - 1))
    position, valid = resolve(func, indices, level.lengths.view(shape), mode)
    rows = level.offsets[:-1].view(shape) + position
    return take_rows_or_fill(x.values, rows, valid, fill)


def _take_levels(
    func: Func, x: RaggedArray, dim: int, indices: Any, mode: str, fill: Tensor
) -> RaggedArray:
    """``take`` along ragged axis ``dim`` of a multi-level array."""
    if isinstance(indices, RaggedArray):
        _check_int_tensor(func, "indices", indices.values)
        if indices.ragged_ndim != dim or indices.values.dim() != 1:
            raise value_error(
                func,
                "indices",
                f"must be a RaggedArray with {dim} ragged axes and no inner axes (a list of "
                f"positions per row of ragged axis {dim - 1})",
                f"{indices.ragged_ndim} ragged axes, {indices.ndim} axes",
            )
        _check_device(func, indices.values, x)
        return take_ragged(func, x, dim, indices, resolve, take_rows_or_fill, mode, fill)
    if not isinstance(indices, Tensor):
        raise type_error(func, "indices", "must be a RaggedArray or a Tensor", typename(indices))
    _check_int_tensor(func, "indices", indices)
    _check_device(func, indices, x)
    return take_dense(func, x, dim, indices, resolve, take_rows_or_fill, mode, fill)


def _take_inner(
    func: Func, x: RaggedArray, indices: Any, vdim: int, mode: str, fill: Tensor
) -> RaggedArray:
    """``take`` along dim ``vdim`` of ``x.values`` (an inner axis): the partition is kept."""
    if not isinstance(indices, Tensor):
        raise type_error(func, "indices", "must be a Tensor for an inner axis", typename(indices))
    _check_int_tensor(func, "indices", indices)
    _check_device(func, indices, x)
    values = x.values
    size = values.shape[vdim]
    position, valid = resolve(func, indices.reshape(-1), size, mode)
    if size == 0:
        position = position.new_zeros(position.shape)
        picked = fill.expand(*values.shape[:vdim], position.shape[0], *values.shape[vdim + 1 :])
    else:
        if valid is not None:
            position = position.clamp(0, size - 1)
        picked = values.index_select(vdim, position)
    if valid is not None:
        mask = valid.view(-1, *[1] * (values.dim() - vdim - 1))
        picked = torch.where(mask, picked, fill)
    out = picked.reshape(*values.shape[:vdim], *indices.shape, *values.shape[vdim + 1 :])
    names = x.axes
    if names is not None:
        axis = x.ragged_ndim + vdim
        if indices.dim() == 0:
            names = names[:axis] + names[axis + 1 :]
        elif indices.dim() > 1:
            raise value_error(
                func,
                "indices",
                f"must be 0-D or 1-D for a named array {x.axes} (more would add unnamed axes; "
                "drop the names with x.rename(None) first)",
                tuple(indices.shape),
            )
    return RaggedArray(out, x.partition, names)


# --- filter -----------------------------------------------------------------------------------


@op("indexing", rule=NEW, args="x: ragged, mask: ragged")
def filter(x: RaggedArray, mask: RaggedArray) -> RaggedArray:
    """The rows of each segment where ``mask`` is True, in order (``x_b[mask_b]``).

    ``mask`` is a boolean RaggedArray with one flag per row of the ragged axis it filters: for
    ``(B, L*, *inner)``, shape ``(B, L*)`` with ``x``'s partition (the same object, or an equal
    one). For a multi-level ``x`` the number of ragged axes of ``mask`` says which axis: on
    documents -> sentences -> tokens ``(B, S*, T*)``, a ``(B, S*)`` mask keeps whole sentences
    (with their tokens) and a ``(B, S*, T*)`` mask keeps tokens within their sentences.

    The new lengths are the counts of True, so the result's size depends on the data: this
    reads the new sizes once (one host sync; along an outer axis, together with the sizes of
    the levels below) and records the maximum length in the new partition. Everything else is
    sync-free (no boolean-mask indexing: destinations come from a cumulative sum). When every
    row is kept the result shares ``x``'s partition. Differentiable with respect to ``x``.

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0, 3.0], [], [4.0, 5.0]])
    >>> ragged.filter(x, x > 1.5).to_list()
    [[2.0, 3.0], [], [4.0, 5.0]]
    >>> docs = ragged.array([[[1, 2], [3]], [[4, 5, 6]]])
    >>> ragged.filter(docs, ragged.array([[False, True], [True]])).to_list()
    [[[3]], [[4, 5, 6]]]
    """
    func = filter
    check_index_array(func, x)
    check_index_array(func, mask, "mask")
    if mask.dtype != torch.bool:
        raise type_error(func, "mask", "must have dtype torch.bool", mask.dtype)
    nr = x.ragged_ndim
    if mask.values.dim() != 1 or mask.ragged_ndim > nr:
        expected = (
            "must have shape (B, L*) (one flag per row)"
            if nr == 1
            else f"must have at most {nr} ragged axes and no inner axes (one flag per row of "
            "the ragged axis it filters)"
        )
        raise value_error(func, "mask", expected, f"{mask.ndim} axes")
    dim = mask.ragged_ndim
    if nr == 1:
        same_partition(func, x, mask)
    else:
        same_upper(func, "mask", x, mask, dim)
    keep = mask.values
    if dim < nr:
        plan = filter_plan(x, dim, keep)
        if plan is None:
            return x
        partition, rows = plan
        return RaggedArray(x.values.index_select(0, rows), partition, x.axes)
    levels = x.partition.levels
    level = levels[-1]
    segments = Segments(level.row_ids, level.num_rows, level.lengths, level.offsets)
    counts = segment_sum(keep.to(torch.int64), segments)
    total, longest, squares = length_stats(counts)  # the one host sync
    if total == x.values.shape[0]:
        return RaggedArray(x.values, x.partition, x.axes)
    # Destination of each kept row: its rank among kept rows; dropped rows go to a dump slot.
    destination = torch.where(keep, torch.cumsum(keep, 0) - 1, total)
    source = keep.new_zeros(total + 1, dtype=torch.int64)
    every = torch.arange(keep.shape[0], device=keep.device)
    source = source.index_put((destination,), every)[:total]
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    new = RowPartition(offsets, counts, level.row_ids[source], longest, squares)
    partition = Partition((*levels[:-1], new))
    return RaggedArray(x.values.index_select(0, source), partition, x.axes)


# torch indexing functions that a RaggedArray refuses, and the ragged ops to use instead.
refuse(
    torch.nonzero,
    torch.masked_select,
    family="indexing",
    hint="ragged.filter(x, mask) keeps the rows where a RaggedArray mask is True",
    see=("ragged.filter",),
)
refuse(
    torch.index_select,
    torch.take,
    torch.take_along_dim,
    family="indexing",
    hint="ragged.take(x, indices, axis) takes rows within each segment",
    see=("ragged.take",),
)
