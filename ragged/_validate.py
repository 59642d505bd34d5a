"""Complete checks of a partition and its values, for data from untrusted sources (files).

Each level costs a few vectorised passes over its index tensors and one read from the device;
the error paths read a little more to say where the inconsistency is. Tensors without data
(``meta``, or fake tensors while tracing) get the checks that read no data only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ._errors import Func, typename, value_error
from ._partition import Partition, RowPartition

__all__ = ["check_array", "check_level", "check_levels"]

_LEVEL_FIELDS = ("offsets", "lengths", "row_ids")


def _has_data(tensors: Sequence[Tensor]) -> bool:
    return all(type(t) is Tensor and t.device.type != "meta" for t in tensors)


def _complete(func: Func, param: str, obj: object, cls: type) -> Any:
    """``obj`` as a fully built ``cls`` (a file can leave an object without its state)."""
    if type(obj) is not cls:
        raise value_error(func, param, f"must be a {cls.__name__}", typename(obj))
    if not obj.__dict__:
        raise value_error(func, param, "must be a complete object", "one without its state")
    return obj


def _optional_count(func: Func, param: str, value: object) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise value_error(func, param, "must be None or a non-negative int", repr(value))


def check_level(func: Func, state: dict[str, Any]) -> None:
    """Every invariant of one level given as its fields (see ``ragged._serialization``)."""
    tensors = [state[name] for name in _LEVEL_FIELDS]
    for name, t in zip(_LEVEL_FIELDS, tensors, strict=True):
        if not isinstance(t, Tensor) or t.dtype != torch.int64 or t.dim() != 1:
            raise value_error(func, name, "must be a 1-D int64 tensor", typename(t))
        if t.device != tensors[0].device:
            raise value_error(
                func, name, f"must be on the offsets' device {tensors[0].device}", t.device
            )
    offsets, lengths, row_ids = tensors
    rows, children = lengths.shape[0], row_ids.shape[0]
    if offsets.shape[0] != rows + 1:
        expected = f"must have len(lengths) + 1 = {rows + 1} entries"
        raise value_error(func, "offsets", expected, f"{offsets.shape[0]} entries")
    _optional_count(func, "max_length", state["max_length"])
    _optional_count(func, "sum_squares", state["sum_squares"])
    if type(state["unit"]) is not bool:
        raise value_error(func, "unit", "must be a bool", repr(state["unit"]))
    if type(state.get("nonempty", False)) is not bool:
        raise value_error(func, "nonempty", "must be a bool", repr(state["nonempty"]))
    columns = state["columns"]
    if columns is not None:
        columns = _complete(func, "columns", columns, RowPartition)
        if columns.offsets.device != offsets.device:
            raise value_error(
                func, "columns", f"must be on {offsets.device}", columns.offsets.device
            )
    if _has_data(tensors):
        _check_level_data(func, state, offsets, lengths, row_ids, rows, children)


def _check_level_data(
    func: Func,
    state: dict[str, Any],
    offsets: Tensor,
    lengths: Tensor,
    row_ids: Tensor,
    rows: int,
    children: int,
) -> None:
    # Every quantity below is safe to compute for any int64 contents (indices are clamped
    # first), so all of them come back in one read. Few large temporaries: fresh ones page
    # fault, which costs more than the comparisons (benchmarks/trust.py).
    steps = offsets[1:] - offsets[:-1]
    flags = [
        offsets[0],
        (offsets[1:] < offsets[:-1]).any(),  # compared, not diffed: no wrap-around
        offsets[-1],
        (lengths != steps).any(),
    ]
    if rows and children:
        # With valid offsets, the row ids are right when they never decrease and every
        # non-empty row's first and last child name that row: all children between follow.
        row = torch.arange(rows, device=row_ids.device)
        wrong = row_ids.index_select(0, offsets[:-1].clamp(0, children - 1)) != row
        wrong |= row_ids.index_select(0, offsets[1:].sub(1).clamp_(0, children - 1)) != row
        wrong &= steps > 0
        flags.append(wrong.any() | (row_ids[1:] < row_ids[:-1]).any())
    else:  # no rows: every child is wrong; no children: nothing to check
        flags.append(offsets.new_tensor(children > 0 and not rows))
    zero = offsets.new_zeros(())
    flags += [
        lengths.max() if rows else zero,
        (lengths * lengths).sum() if state["sum_squares"] is not None else zero,
        (lengths != 1).any() if state["unit"] else zero,
        (lengths == 0).any() if state.get("nonempty", False) else zero,
    ]
    stats = torch.stack([f.to(torch.int64) for f in flags]).tolist()
    first, decreasing_n, last, wrong_n, bad_n, longest_n, squares, non_unit, empty = stats
    if first != 0:
        raise value_error(func, "offsets", "must start at 0", f"offsets[0] = {first}")
    if decreasing_n:
        i = int(torch.argmax((offsets[1:] < offsets[:-1]).to(torch.int8))) + 1
        got = f"offsets[{i}] = {int(offsets[i])} < offsets[{i - 1}] = {int(offsets[i - 1])}"
        raise value_error(func, "offsets", "must be non-decreasing", got)
    if last != children:
        expected = f"must end at the number of children (len(row_ids) = {children})"
        raise value_error(func, "offsets", expected, f"offsets[-1] = {last}")
    if wrong_n:
        i = int(torch.argmax((lengths != steps).to(torch.int8)))
        got = f"lengths[{i}] = {int(lengths[i])} where the offsets give {int(steps[i])}"
        raise value_error(func, "lengths", "must be the differences of the offsets", got)
    if bad_n:
        row_of = _row_of(offsets, children)
        c = int(torch.argmax((row_ids != row_of).to(torch.int8)))
        got = f"row_ids[{c}] = {int(row_ids[c])}, where the offsets put child {c} in row {int(row_of[c])}"
        raise value_error(func, "row_ids", "must give the row of each child", got)
    max_length = state["max_length"]
    columns = state["columns"]
    bound = None if columns is None else columns.max_length
    if max_length is not None and max_length != longest_n and max_length != bound:
        expected = f"must be the longest length ({longest_n})"
        if bound is not None:
            expected += f" or, for a product level, its columns' ({bound})"
        raise value_error(func, "max_length", expected, max_length)
    if state["sum_squares"] is not None and state["sum_squares"] != squares:
        expected = f"must be the sum of the squared lengths ({squares})"
        raise value_error(func, "sum_squares", expected, state["sum_squares"])
    if state["unit"] and non_unit:
        raise value_error(func, "unit", "must be False: not every length is 1", True)
    if empty:
        raise value_error(func, "nonempty", "must be False: a row is empty", True)


def _row_of(offsets: Tensor, children: int) -> Tensor:
    """The row of every child according to valid ``offsets`` (error messages only)."""
    child = torch.arange(children, device=offsets.device)
    return torch.searchsorted(offsets[1:], child, right=True)


def check_levels(func: Func, levels: object) -> None:
    """The levels of a partition: each complete (checked when it was loaded), chained, and
    product levels consistent with their columns."""
    if not isinstance(levels, tuple) or not levels:
        raise value_error(
            func, "levels", "must be a non-empty tuple of RowPartition", typename(levels)
        )
    for k, level in enumerate(levels):
        _complete(func, f"levels[{k}]", level, RowPartition)
    device = levels[0].offsets.device
    for k, level in enumerate(levels):
        if level.offsets.device != device:
            raise value_error(func, f"levels[{k}]", f"must be on {device}", level.offsets.device)
        if k and level.num_rows != levels[k - 1].num_children:
            expected = (
                f"must have one row per child of levels[{k - 1}] ({levels[k - 1].num_children})"
            )
            raise value_error(func, f"levels[{k}]", expected, f"{level.num_rows} rows")
        if k and level.columns is not None:
            _check_product(func, k, levels[k - 1], level)


def _check_product(func: Func, k: int, parent: RowPartition, level: RowPartition) -> None:
    """Level ``k`` of a pair map: every row of segment ``b`` has ``columns.lengths[b]`` entries."""
    columns = level.columns
    assert columns is not None
    if columns.num_rows != parent.num_rows:
        expected = f"must have one row per row of levels[{k - 1}] ({parent.num_rows})"
        raise value_error(func, f"levels[{k}].columns", expected, f"{columns.num_rows} rows")
    tensors = [parent.row_ids, level.lengths, columns.lengths]
    if _has_data(tensors) and parent.row_ids.numel():
        expected_lengths = columns.lengths[parent.row_ids]
        if not bool(torch.equal(expected_lengths, level.lengths)):
            raise value_error(
                func,
                f"levels[{k}].lengths",
                "must be the columns' length of each row's segment (a product level)",
                "other lengths",
            )


def check_array(func: Func, state: dict[str, Any]) -> None:
    """A RaggedArray's fields: a complete partition (checked when it was loaded), values with
    one row per child of its last level on the same device, and valid axis names."""
    partition = _complete(func, "partition", state["partition"], Partition)
    values = state["values"]
    if not isinstance(values, Tensor) or values.dim() == 0:
        raise value_error(func, "values", "must be a tensor with at least 1 dim", typename(values))
    if values.shape[0] != partition.num_values:
        expected = f"must have one row per value of the partition ({partition.num_values})"
        raise value_error(func, "values", expected, f"{values.shape[0]} rows")
    if values.device != partition.device:
        raise value_error(
            func, "values", f"must be on the partition's device {partition.device}", values.device
        )
    axes = state["axes"]
    ndim = partition.ragged_ndim + values.dim()
    if axes is not None and (
        not isinstance(axes, tuple)
        or len(axes) != ndim
        or not all(type(a) is str for a in axes)
        or len(set(axes)) != len(axes)
    ):
        raise value_error(func, "axes", f"must be None or {ndim} unique names", repr(axes))
