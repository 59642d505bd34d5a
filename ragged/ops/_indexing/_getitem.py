"""``x[index]`` for tuple indices: the ragged and inner axes.

For ``x`` of logical shape ``(B, L*, *inner)`` the tuple's entries index, in order, the batch
axis, the ragged axis and the inner axes; ``...`` stands for as many full slices as needed and
``None`` adds a size-1 axis among the inner axes; ``x[:, None]`` alone (then only full slices)
adds one between the batch and ragged axes, ``(B, 1, L*, ...)``, the form that broadcasts
against ``(B, N*, 1, ...)`` into a pair map. The batch entry is handled first
(``x[i]``, ``x[i:j]``, ``x[tensor]``); then the inner entries, then the
ragged one. Each part follows its own rule:

* **Inner axes** (``x[:, :, 0]``, ``x[..., 1:3]``, ``x[..., None]``, ``x[:, :, idx]``): torch
  indexing of ``values`` behind a full slice of the rows (negative slice steps too, which torch
  lacks). The partition object is kept and nothing is read from the device (a boolean tensor is
  a mask and reads it, as in torch). Tensor indices on several inner axes must be adjacent
  (torch would move their axes before the rows).
* **Ragged axis, a slice** (``x[:, a:b:step]``): Python slice semantics in each segment
  separately (negative bounds count from the segment's end, bounds clamp to it, any nonzero
  step). The new total depends on the data and is read once (one host sync) with the new
  maximum length, unless the result provably keeps every row (``x[:, :k]`` with a known maximum
  length ``<= k``: ``x`` itself) or reverses every segment (``x[:, ::-1]``: the same partition).
* **Ragged axis, an int or a 0-D tensor** (``x[:, i]``): the ``i``-th row of each segment as a
  dense ``(B, *inner)`` tensor; segments too short give the fill value of [`ragged.take`][ragged.take]
  (NaN for floating dtypes, 0 for integers, False for bool), sync-free.
* **Ragged axis, an integer tensor** ``(K, ...)``: the same positions in every segment, dense
  ``(B, K, ..., *inner)`` (``ragged.take`` in fill mode); **a RaggedArray of integers**: segment
  ``b`` is ``x_b[index_b]`` (``ragged.take``); **a boolean RaggedArray**: the kept rows
  (``ragged.filter``, one host sync).

The ragged entry and the inner entries apply independently: a tensor on the ragged axis cannot
be combined with tensors on inner axes (torch would broadcast them together).

Axis names: an integer-indexed axis loses its name, a sliced one keeps it, a 1-D tensor index
keeps the name of its axis. An index that would add an unnamed axis to a named array (``None``,
a tensor index of 2 or more dims, a multi-dimensional mask) raises: names are all or nothing,
and silently dropping them would change how the result broadcasts. Dense results have no names.

>>> import ragged, torch
>>> x = ragged.from_lengths(torch.arange(12.0).reshape(6, 2), [3, 0, 2, 1])
>>> x[:, 1:].to_list()
[[[2.0, 3.0], [4.0, 5.0]], [], [[8.0, 9.0]], []]
>>> x[:, -1, 0]
tensor([ 4., nan,  8., 10.])
>>> x[..., None].shape
RaggedShape(4, [3, 0, 2, 1], 2, 1)
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import INDEX
from ..._errors import name_of, type_error
from ..._partition import Partition, RowPartition
from ..._registry import op
from . import _batch
from ._axis import sliced
from ._take import filter, take


@op(
    "indexing",
    rule=INDEX,
    args="x: ragged, index: any",
    name="__getitem__",
    namespace="RaggedArray",
)
def getitem(x: RaggedArray, index: Any) -> Any:
    """``x[index]``: the batch axis, or a tuple over every axis (see the module docstring).

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.arange(6.0), [3, 0, 2, 1])
    >>> x[2], x[1:3].to_list(), x[:, :2].to_list()
    (tensor([3., 4.]), [[], [3.0, 4.0]], [[0.0, 1.0], [], [3.0, 4.0], [5.0]])
    """
    if isinstance(index, RaggedArray):  # per-row positions or flags: x[:, index], x[:, :, index]
        index = (*[slice(None)] * max(index.ragged_ndim, 1), index)
    if isinstance(index, tuple):
        if len(index) == 1:
            return getitem(x, index[0])
        return _getitem_tuple(x, index)
    if isinstance(index, bool):
        raise type_error(getitem, "index", "must be an int, slice or tensor", "bool")
    if isinstance(index, int):
        return _batch.segment(getitem, x, index)
    if isinstance(index, slice):
        return _batch.select_slice(getitem, x, index)
    if isinstance(index, (list, range)):
        index = torch.as_tensor(list(index), dtype=torch.int64, device=x.device)
    if isinstance(index, Tensor):
        return _batch.select(getitem, x, index)
    raise type_error(
        getitem, "index", "must be an int, slice, int/bool tensor or tuple", type(index).__name__
    )


def _getitem_tuple(x: RaggedArray, index: tuple[Any, ...]) -> Any:
    """``x[index]`` for a tuple ``index`` (see the module docstring)."""
    if _is_unit_axis(x, index):
        return _unit_axis(x, index)
    items = _expand(x, [_item(x, item) for item in index], index)
    nr = x.ragged_ndim
    lead: list[Any] = []  # the batch entry, then one entry per ragged axis
    inner: list[Any] = []
    for item in items:
        if len(lead) < 1 + nr:
            if item is None:
                raise IndexError(
                    f"{name_of(getitem)}: a new axis (None) can only be added after the ragged axis (or as "
                    f"x[:, None] alone, before it), got "
                    f"{index!r}."
                )
            if _consumed(item) != 1:
                raise IndexError(
                    f"{name_of(getitem)}: a boolean mask cannot span the batch or ragged axes, got {index!r}."
                )
            lead.append(item)
        else:
            inner.append(item)
    batch, ragged = lead[0], lead[1:]
    if isinstance(batch, int) or (isinstance(batch, Tensor) and batch.dim() == 0):
        picked = _batch.segment(
            getitem, x, operator.index(batch)
        )  # dense (or one fewer ragged axis)
        if isinstance(picked, RaggedArray):
            return picked[tuple(items[1:])]
        picked, rest = _negative_steps(picked, items[1:], first=0)
        return picked[tuple(rest)]
    if not _is_full(batch):
        x = getitem(x, batch)
    x = _index_inner(x, inner, index)
    return _index_ragged(x, ragged, inner, index)


def _is_unit_axis(x: RaggedArray, index: tuple[Any, ...]) -> bool:
    """``x[:, None]`` (then only full slices or ``...``): a size-1 axis before the ragged one."""
    return (
        len(index) >= 2
        and x.ragged_ndim == 1
        and index[1] is None
        and _is_full(index[0])
        and all(item is Ellipsis or _is_full(item) for item in index[2:])
    )


def _unit_axis(x: RaggedArray, index: tuple[Any, ...]) -> RaggedArray:
    """``(B, L*, ...) -> (B, 1, L*, ...)``: each segment becomes one row; values are shared.

    The axes broadcast against ``(B, N*, 1, ...)`` into a pair map (``ragged._broadcast``).
    """
    if x.axes is not None:
        raise _unnamed(x, index)
    level = x.partition.levels[0]
    units = RowPartition.units(x.num_segments, x.device)
    return RaggedArray(x.values, Partition((units, level)), None)


def _item(x: RaggedArray, item: Any) -> Any:
    """Check one entry; lists and ranges become tensors."""
    if item is None or item is Ellipsis or isinstance(item, (slice, RaggedArray)):
        return item
    if isinstance(item, bool):
        raise TypeError(f"{name_of(getitem)}: `index` entries cannot be bools, got {item!r}.")
    if isinstance(item, int):
        return item
    if isinstance(item, (list, range)):
        item = torch.as_tensor(list(item), device=x.device)
        if item.numel() == 0:
            return item.to(torch.int64)
    if isinstance(item, Tensor):
        if item.dtype.is_floating_point or item.dtype.is_complex:
            raise TypeError(
                f"{name_of(getitem)}: tensor indices must be integer or boolean, got {item.dtype}."
            )
        if item.dtype == torch.bool and item.dim() == 0:
            raise TypeError(
                f"{name_of(getitem)}: a boolean index must have at least 1 dim, got a 0-d one."
            )
        return item
    raise TypeError(
        f"{name_of(getitem)}: `index` entries must be ints, slices, None, ..., tensors or RaggedArrays, "
        f"got {type(item).__name__}."
    )


def _consumed(item: Any) -> int:
    """How many axes of ``x`` an entry indexes."""
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, Tensor) and item.dtype == torch.bool:
        return item.dim()
    return 1


def _expand(x: RaggedArray, items: list[Any], index: tuple[Any, ...]) -> list[Any]:
    """Replace ``...`` by full slices (or append them) so that every axis has an entry."""
    ellipses = [k for k, item in enumerate(items) if item is Ellipsis]
    if len(ellipses) > 1:
        raise IndexError(
            f"{name_of(getitem)}: an index can have only one ellipsis (...), got {index!r}."
        )
    used = sum(_consumed(item) for item in items)
    if used > x.ndim:
        raise IndexError(
            f"{name_of(getitem)}: too many indices for an array of {x.ndim} axes: {used} were indexed."
        )
    full = [slice(None)] * (x.ndim - used)
    if ellipses:
        k = ellipses[0]
        return items[:k] + full + items[k + 1 :]
    return items + full


def _is_full(item: Any) -> bool:
    return (
        isinstance(item, slice)
        and item.start in (None, 0)
        and item.stop is None
        and item.step in (None, 1)
    )


# --- inner axes -------------------------------------------------------------------------------


def _index_inner(x: RaggedArray, items: list[Any], index: tuple[Any, ...]) -> RaggedArray:
    """Apply the inner entries to ``values`` behind a full slice of the rows; same partition."""
    if all(_is_full(item) for item in items):
        return x
    if any(isinstance(item, RaggedArray) for item in items):
        raise IndexError(
            f"{name_of(getitem)}: a RaggedArray can only index the ragged axis, not inner axes."
        )
    tensors = [k for k, item in enumerate(items) if isinstance(item, Tensor)]
    if tensors and tensors != list(range(tensors[0], tensors[-1] + 1)):
        raise IndexError(
            f"{name_of(getitem)}: tensor indices on inner axes must be adjacent (torch would move their "
            f"axes before the rows), got {index!r}."
        )
    values, items = _negative_steps(x.values, items, first=1)
    key = (slice(None), *items)
    values = values[key]
    return RaggedArray(values, x.partition, _inner_names(x, items, index))


def _negative_steps(values: Tensor, items: list[Any], first: int) -> tuple[Tensor, list[Any]]:
    """Torch slices need a positive step: ``t[a:b:-k]`` is ``t.flip(d)[-1-a:-1-b:k]``.

    Position ``p`` of an axis is position ``-1 - p`` of the flipped axis (as Python indices,
    negative ones included), and the clamping of out-of-range bounds maps over the same way.
    """
    flips, out, dim = [], [], first
    for item in items:
        if isinstance(item, slice) and item.step is not None and item.step < 0:
            flips.append(dim)
            start = None if item.start is None else -1 - item.start
            stop = None if item.stop is None else -1 - item.stop
            item = slice(start, stop, -item.step)
        out.append(item)
        dim += _consumed(item)
    return (values.flip(flips) if flips else values), out


def _inner_names(x: RaggedArray, items: list[Any], index: tuple[Any, ...]) -> Any:
    if x.axes is None:
        return None
    nr = x.ragged_ndim
    names = x.axes[1 + nr :]
    tensors = sum(isinstance(item, Tensor) for item in items)
    kept = list(x.axes[: 1 + nr])
    k = 0
    for item in items:
        if isinstance(item, Tensor):
            d = _consumed(item)
            if item.dim() == 1 and tensors == 1:
                kept.append(names[k])  # one axis replaced by one axis
            elif item.dim() != 0:
                raise _unnamed(x, index)
            k += d
        elif item is None:
            raise _unnamed(x, index)
        else:
            if isinstance(item, slice):
                kept.append(names[k])
            k += 1
    return tuple(kept)


def _unnamed(x: RaggedArray, index: tuple[Any, ...]) -> ValueError:
    return ValueError(
        f"{name_of(getitem)}: `index` would add unnamed axes to the named array {x.axes}; drop the names "
        f"first (x.rename(None)[...]) or name the result with x.with_values(v, axes=...), "
        f"got {index!r}."
    )


# --- the ragged axis --------------------------------------------------------------------------


def _index_ragged(x: RaggedArray, ragged: list[Any], inner: list[Any], index: Any) -> Any:
    if all(_is_full(item) for item in ragged):
        return x
    if any(isinstance(i, Tensor) for i in inner) and any(
        isinstance(item, (Tensor, RaggedArray)) for item in ragged
    ):
        raise IndexError(
            f"{name_of(getitem)}: a tensor index on the ragged axis cannot be combined with tensor indices "
            f"on inner axes, got {index!r}."
        )
    # Innermost first: an integer removes its axis, which leaves the axes before it in place.
    for dim in range(len(ragged), 0, -1):
        if not _is_full(ragged[dim - 1]):
            x = _index_axis(x, dim, ragged[dim - 1], index)
    return x


def _index_axis(x: RaggedArray, dim: int, item: Any, index: Any) -> Any:
    """``item`` applied to ragged axis ``dim`` of ``x`` (every row of the axis above)."""
    if isinstance(item, slice):
        return sliced(getitem, x, dim, item.start, item.stop, item.step)
    num = x.partition.levels[dim - 1].num_rows
    if isinstance(item, int):
        index_t = torch.full((num,), item, dtype=torch.int64, device=x.device)
        return take(x, index_t, axis=dim)
    if isinstance(item, RaggedArray):
        if item.dtype != torch.bool:
            return take(x, item, axis=dim)
        if item.ragged_ndim != dim:
            raise IndexError(
                f"{name_of(getitem)}: a boolean RaggedArray on ragged axis {dim} must have {dim} "
                f"ragged axes (one flag per row of that axis), got {item.ragged_ndim}."
            )
        return filter(x, item)
    if item.dtype == torch.bool:
        raise TypeError(
            f"{name_of(getitem)}: a boolean mask of the ragged axis must be a RaggedArray (one flag per "
            f"row of each segment), got a dense tensor of shape {tuple(item.shape)}."
        )
    return take(x, item.expand(num, *item.shape), axis=dim)
