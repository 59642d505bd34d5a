"""Broadcasting rules: how the operands of an elementwise op line up.

Two rules, chosen by whether the operands carry names:

* **Positional** (an unnamed operand is involved): numpy broadcasting aligned from the right. A
  ragged axis has per-segment sizes; it lines up with a ragged axis (same partition) or with a
  size-1 axis, which broadcasts. The batch axis lines up with a size-``B`` or size-1 axis. So
  for ``x`` of shape ``(B, L*, D)``: ``x + w`` with ``w: (D,)``; ``x * s`` with ``s: (B, 1, 1)``
  or ``(B, 1, D)``; ``x + y`` for a RaggedArray ``y`` with the same partition. A dense
  ``(B, D)`` lines its ``B`` up with the ragged axis and is rejected with a hint.
* **Named** (both operands named: two named RaggedArrays, or a named RaggedArray and a torch
  named tensor): axes align by name like xarray. An axis missing from one operand broadcasts;
  the result's axes follow the first operand, then the second operand's new axes.

Ragged against ragged: the same partition object takes the fast path; equal-valued partitions
are accepted after one comparison of offsets; different ones are an error naming both shapes.

>>> import ragged, torch
>>> x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
>>> (x * torch.tensor([[[10.0]], [[100.0]]])).to_list()
[[[10.0, 20.0]], [[300.0, 400.0], [500.0, 600.0]]]
>>> x + torch.ones(2, 2)
Traceback (most recent call last):
ValueError: ragged.add: `other` of shape (2, 2) lines up its axis 0 with the ragged axis 1 of (2, [1, 2], 2), which needs size 1; for a per-segment operand write other[:, None, ...] (shape (B, 1, ...)), or name the axes of both operands.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._array import RaggedArray
from ._errors import Func, name_of
from ._format import shape_text
from ._pair_index import pair_index
from ._partition import Partition

__all__ = ["align", "line_up", "same_partition"]

Aligned = tuple[Any, Any, Partition, "tuple[str, ...] | None"]


def same_partition(func: Func, a: RaggedArray, b: RaggedArray) -> Partition:
    """The shared partition of ``a`` and ``b`` (identity, else one value comparison)."""
    if a.partition is b.partition:
        return a.partition
    if a.partition.equals(b.partition):
        return a.partition
    raise ValueError(
        f"{name_of(func)}: the operands have different ragged structure: {shape_text(a)} vs "
        f"{shape_text(b)}; elementwise ops need equal partitions."
    )


def align(func: Func, a: Any, b: Any) -> Aligned:
    """Line up two operands (at least one a RaggedArray) for an elementwise op.

    Returns the two operands' tensors (values-shaped, broadcastable by torch), the result's
    partition and its axis names.
    """
    if isinstance(a, RaggedArray) and isinstance(b, RaggedArray):
        if a.axes is not None and b.axes is not None:
            return _align_named(func, a, b)
        pairs = _positional_outer(func, a, b)
        if pairs is not None:
            return pairs
        levels = _levels_broadcast(func, a, b)
        if levels is not None:
            return levels
        partition = same_partition(func, a, b)
        if a.ndim != b.ndim:
            raise ValueError(
                f"{name_of(func)}: ragged operands of {a.ndim} and {b.ndim} axes would line their ragged "
                f"axes up with dense ones ({shape_text(a)} vs {shape_text(b)}); add size-1 "
                f"inner axes with x[..., None] or name the axes."
            )
        _check_inner(func, a.inner_shape, b.inner_shape, a, b)
        return a.values, b.values, partition, a.axes if a.axes is not None else b.axes
    if isinstance(a, RaggedArray):
        dense = _align_dense(func, a, b)
        return a.values, dense, a.partition, a.axes
    dense = _align_dense(func, b, a)
    return dense, b.values, b.partition, b.axes


def line_up(func: Func, first: RaggedArray, operand: Any) -> Any:
    """``operand``'s tensor lined up against ``first``, whose partition the result keeps (an
    operand of ``where``, ``torch.lerp``, ``torch.clamp(min=...)``, ``masked_fill``...): the
    values of a RaggedArray with ``first``'s partition and number of axes, a dense tensor as for
    ``ragged.add``, a number unchanged. Raises as ``x * y`` does for operands that do not line up.
    """
    if isinstance(operand, RaggedArray):
        if operand is first:
            return operand.values
        if operand.axes is not None and first.axes is not None and operand.axes != first.axes:
            a, b, partition, _ = _align_named(func, first, operand)
            if partition is first.partition and a is first.values:
                return b
            raise _mismatch(func, first, operand, "the result keeps the first operand's axes")
        same_partition(func, first, operand)
        if operand.ndim != first.ndim:
            raise ValueError(
                f"{name_of(func)}: ragged operands of {first.ndim} and {operand.ndim} axes would "
                f"line their ragged axes up with dense ones ({shape_text(first)} vs "
                f"{shape_text(operand)}); add size-1 inner axes with x[..., None] or name the axes."
            )
        _check_inner(func, first.inner_shape, operand.inner_shape, first, operand)
        return operand.values
    if isinstance(operand, Tensor):
        return _align_dense(func, first, operand)
    return operand


def _check_inner(func: Func, a: Any, b: Any, x: RaggedArray, y: Any) -> None:
    try:
        torch.broadcast_shapes(tuple(a), tuple(b))
    except RuntimeError:
        other = shape_text(y) if isinstance(y, RaggedArray) else tuple(y.shape)
        raise ValueError(
            f"{name_of(func)}: inner shapes {tuple(a)} and {tuple(b)} do not broadcast "
            f"({shape_text(x)} vs {other})."
        ) from None


def _align_dense(func: Func, x: RaggedArray, other: Any) -> Any:
    """A dense operand against a RaggedArray, positionally (or by name when both are named)."""
    if not isinstance(other, Tensor):
        if isinstance(other, (int, float, bool, complex)):
            return other
        raise TypeError(
            f"{name_of(func)}: `other` must be a RaggedArray, Tensor or number, got {type(other).__name__}."
        )
    if x.axes is not None and other.dim() and any(n is not None for n in _names(other)):
        return _align_named_dense(func, x, other)
    inner = x.values.dim() - 1
    rank = other.dim()
    if rank <= inner:
        _check_inner(func, x.inner_shape, other.shape, x, other)
        return other
    if rank > x.ndim:
        raise ValueError(
            f"{name_of(func)}: `other` of shape {tuple(other.shape)} has more axes than {shape_text(x)}."
        )
    # `other` reaches into the batch/ragged axes: every ragged axis it meets must be size 1.
    lead = rank - inner  # how many of x's leading (batch + ragged) axes it covers
    first = x.ndim - rank  # x's axis lined up with other's axis 0
    for k in range(lead):
        axis = first + k
        if axis >= 1 and other.shape[k] != 1:
            raise ValueError(
                f"{name_of(func)}: `other` of shape {tuple(other.shape)} lines up its axis {k} with the "
                f"ragged axis {axis} of {shape_text(x)}, which needs size 1; for a per-segment "
                f"operand write other[:, None, ...] (shape (B, 1, ...)), or name the axes of both "
                f"operands."
            )
    _check_inner(func, x.inner_shape, other.shape[lead:], x, other)
    squeezed = other.reshape(other.shape[0] if first == 0 else 1, *other.shape[lead:])
    if first == 0 and squeezed.shape[0] == x.num_segments:
        # Per-segment rows (also right when B == 1: no branch on the size being 1, which
        # would specialise compiled graphs).
        return squeezed.index_select(0, x.partition.segment_ids())
    if squeezed.shape[0] == 1:
        # Kept 1-d (not squeezed[0]): torch promotes a dimensioned tensor's dtype, a 0-d one's
        # only as a number (float32 + float64 of shape (1,) is float64).
        return squeezed
    raise ValueError(
        f"{name_of(func)}: `other` of shape {tuple(other.shape)} has {squeezed.shape[0]} entries on the "
        f"batch axis of {shape_text(x)}, expected {x.num_segments} or 1."
    )


def _names(t: Tensor) -> tuple[str | None, ...]:
    """A tensor's torch names; tensors under torch.func transforms have none."""
    return getattr(t, "names", None) or (None,) * t.dim()


def _mismatch(func: Func, a: Any, b: Any, why: str) -> ValueError:
    def describe(t: Any) -> str:
        if isinstance(t, RaggedArray):
            return f"{t.axes} {shape_text(t)}"
        return f"{_names(t)} {tuple(t.shape)}"

    return ValueError(f"{name_of(func)}: {why}: {describe(a)} vs {describe(b)}.")


def _is_column(x: RaggedArray) -> bool:
    """``(B, N*, 1, ...)``: one ragged axis followed by a size-1 axis."""
    return x.ragged_ndim == 1 and x.values.dim() >= 2 and x.values.shape[1] == 1


def _is_row(x: RaggedArray) -> bool:
    """``(B, 1, M*, ...)``: a size-1 axis (``x[:, None]``) before the ragged axis."""
    return x.ragged_ndim == 2 and x.partition.levels[0].unit


def _pair_operand(func: Func, pairs: RaggedArray, other: RaggedArray) -> Tensor | None:
    """``other``'s rows for every entry of the pair map ``pairs`` when ``other`` is a size-1
    broadcast of it: ``(B, N*, 1, ...)`` (one value per row ``i``) or ``(B, 1, M*, ...)`` (one
    per column ``j``); ``None`` if it is neither."""
    rows, cells = pairs.partition.levels
    columns = cells.columns
    if columns is None:
        return None
    if _is_column(other) and other.partition.levels[0].equals(rows):
        return other.values[:, 0].index_select(0, cells.row_ids)
    if _is_row(other) and other.partition.levels[1].equals(columns):
        segment = rows.row_ids.index_select(0, cells.row_ids)
        index = columns.offsets.index_select(0, segment) + cells.positions()
        return other.values.index_select(0, index)
    return None


def _positional_outer(func: Func, a: RaggedArray, b: RaggedArray) -> Aligned | None:
    """Broadcasts that create or follow a pair map: ``(B, N*, 1, ...)`` against
    ``(B, 1, M*, ...)`` (either order) gives ``(B, N*, M*, ...)``; either of them against such a
    pair map broadcasts over the pair map's other ragged axis."""
    if a.ragged_ndim == 2 and b.partition is not a.partition:
        gathered = _pair_operand(func, a, b)
        if gathered is not None:
            _check_inner(func, a.values.shape[1:], gathered.shape[1:], a, b)
            return a.values, gathered, a.partition, a.axes
    if b.ragged_ndim == 2 and b.partition is not a.partition:
        gathered = _pair_operand(func, b, a)
        if gathered is not None:
            _check_inner(func, gathered.shape[1:], b.values.shape[1:], a, b)
            return gathered, b.values, b.partition, b.axes
    if _is_column(a) and _is_row(b):
        column, row, swap = a, b, False
    elif _is_row(a) and _is_column(b):
        column, row, swap = b, a, True
    else:
        return None
    if column.num_segments != row.num_segments:
        raise _mismatch(func, a, b, "outer broadcasting needs the same number of segments")
    _check_inner(func, column.values.shape[2:], row.values.shape[1:], a, b)
    index = pair_index(column.partition.levels[0], row.partition.levels[1])
    left = column.values[:, 0].index_select(0, index.left)
    right = row.values.index_select(0, index.right)
    return (right, left, index.partition, None) if swap else (left, right, index.partition, None)


def _levels_broadcast(func: Func, a: RaggedArray, b: RaggedArray) -> Aligned | None:
    """Size-1 ragged axes against a multi-level array (``keepdims`` results broadcast back):
    either operand may be the smaller one; ``None`` when neither is."""
    small = _broadcast_rows(a, b)
    if small is not None:
        _check_inner(func, a.values.shape[1:], small.shape[1:], a, b)
        return a.values, small, a.partition, a.axes if a.axes is not None else b.axes
    small = _broadcast_rows(b, a)
    if small is not None:
        _check_inner(func, small.shape[1:], b.values.shape[1:], a, b)
        return small, b.values, b.partition, b.axes if b.axes is not None else a.axes
    return None


def _broadcast_rows(big: RaggedArray, small: RaggedArray) -> Tensor | None:
    """``small``'s row for every value row of ``big``, when ``small`` has ``big``'s ragged axes
    with some of size 1: a unit level (one row, from ``keepdims`` on an outer axis: the entry
    at the same place below it, columns aligned left) or, for the innermost ones, size-1 inner
    axes (``keepdims`` on the innermost). The levels above the first size-1 axis must equal
    ``big``'s (one comparison when not the same objects)."""
    nb, ns = big.ragged_ndim, small.ragged_ndim
    extra = nb - ns  # big's innermost ragged axes that small holds as size-1 inner axes
    if nb < 2 or extra < 0 or small.values.shape[1 : 1 + extra] != (1,) * extra:
        return None
    big_levels, small_levels = big.partition.levels, small.partition.levels
    # keepdims never makes the innermost level a unit level; x[..., :1] does (one entry of
    # every row), and that is no size-1 axis to broadcast.
    units = [k for k, level in enumerate(small_levels[:-1]) if level.unit]
    if not units and not extra:
        return None
    first = units[0] if units else ns
    if big.num_segments != small.num_segments or not all(
        p is q or (not p.unit and p.equals(q))
        for p, q in zip(small_levels[:first], big_levels[:first], strict=True)
    ):
        return None
    # Walk down from the segments: at each of small's levels, the child at big's position
    # (or the only child of a unit level).
    node = big.partition.segment_ids()
    for k, level in enumerate(small_levels):
        position = big_levels[k].positions()
        for deeper in big_levels[k + 1 :]:
            position = position.index_select(0, deeper.row_ids)
        start = level.offsets.index_select(0, node)
        node = start if level.unit else start + position
    values = small.values.reshape(small.values.shape[0], *small.values.shape[1 + extra :])
    return values.index_select(0, node)


def _named_outer(func: Func, a: RaggedArray, b: RaggedArray) -> Aligned:
    """Two one-level arrays whose ragged axes have different names: their pair map."""
    a_axes, b_axes = a.axes or (), b.axes or ()
    if a.num_segments != b.num_segments:
        raise _mismatch(func, a, b, "outer broadcasting needs the same number of segments")
    a_inner, b_inner = a_axes[2:], b_axes[2:]
    extra = tuple(n for n in b_inner if n not in a_inner)
    result_inner = a_inner + extra
    for name in set(a_inner) & set(b_inner):
        sa = a.values.shape[1 + a_inner.index(name)]
        sb = b.values.shape[1 + b_inner.index(name)]
        if sa != sb and 1 not in (sa, sb):
            raise _mismatch(func, a, b, f"axis {name!r} has sizes {sa} and {sb}")
    index = pair_index(a.partition.levels[0], b.partition.levels[0])
    left = a.values.reshape(*a.values.shape, *[1] * len(extra)).index_select(0, index.left)
    right = _to_layout(b.values, b_inner, result_inner, leading=1).index_select(0, index.right)
    return left, right, index.partition, (a_axes[0], a_axes[1], b_axes[1], *result_inner)


def _align_named(func: Func, a: RaggedArray, b: RaggedArray) -> Aligned:
    a_axes, b_axes = a.axes or (), b.axes or ()
    if a_axes == b_axes and a.partition is not b.partition:  # keepdims results line up by name
        levels = _levels_broadcast(func, a, b)
        if levels is not None:
            return levels
    if (
        a.ragged_ndim == b.ragged_ndim == 1
        and a_axes[0] == b_axes[0]
        and a_axes[1] not in b_axes
        and b_axes[1] not in a_axes
    ):
        return _named_outer(func, a, b)
    nr = a.ragged_ndim
    if b.ragged_ndim != nr or a_axes[: 1 + nr] != b_axes[: 1 + nr]:
        raise _mismatch(func, a, b, "the batch and ragged axes must have the same names")
    partition = same_partition(func, a, b)
    a_inner, b_inner = a_axes[1 + nr :], b_axes[1 + nr :]
    extra = tuple(n for n in b_inner if n not in a_inner)
    if any(n in a_axes[: 1 + nr] for n in extra):
        raise _mismatch(func, a, b, "an inner axis of one operand is a ragged axis of the other")
    result_inner = a_inner + extra
    a_values = a.values.reshape(*a.values.shape, *[1] * len(extra))
    b_values = _to_layout(b.values, b_inner, result_inner, leading=1)
    for name in set(a_inner) & set(b_inner):
        sa = a.values.shape[1 + a_inner.index(name)]
        sb = b.values.shape[1 + b_inner.index(name)]
        if sa != sb and 1 not in (sa, sb):
            raise _mismatch(func, a, b, f"axis {name!r} has sizes {sa} and {sb}")
    return a_values, b_values, partition, a_axes[: 1 + nr] + result_inner


def _to_layout(t: Tensor, names: tuple[Any, ...], target: tuple[str, ...], leading: int) -> Tensor:
    """Permute ``t``'s named trailing axes into ``target`` order, size 1 where absent."""
    order = [names.index(n) + leading for n in target if n in names]
    t = t.permute(*range(leading), *order)
    shape = list(t.shape[:leading])
    it = iter(t.shape[leading:])
    for n in target:
        shape.append(next(it) if n in names else 1)
    return t.reshape(shape)


def _align_named_dense(func: Func, x: RaggedArray, other: Tensor) -> Tensor:
    """A torch named tensor against a named RaggedArray: align by name.

    Its axes must be axes of ``x``: the batch axis (size ``B`` or 1), inner axes, and ragged axes
    only with size 1. Axes of ``x`` it lacks broadcast.
    """
    names = _names(other)
    axes = x.axes or ()
    ragged_names = axes[1 : 1 + x.ragged_ndim]
    if any(n is None for n in names):
        raise _mismatch(func, x, other, "a named tensor operand must name all its axes")
    unknown = [n for n in names if n not in axes]
    if unknown:
        raise _mismatch(func, x, other, f"axes {unknown} are not axes of the ragged operand")
    plain = other.rename(None)  # type: ignore[attr-defined]
    spans = [i for i, n in enumerate(names) if n in ragged_names]
    if any(plain.shape[i] != 1 for i in spans):
        raise _mismatch(func, x, other, "a dense operand cannot span a ragged axis (size 1 only)")
    plain = plain.squeeze(tuple(spans)) if spans else plain
    kept = tuple(n for n in names if n not in ragged_names)
    lead = axes[:1] if axes[0] in kept else ()
    laid = _to_layout(plain, kept, lead + axes[1 + x.ragged_ndim :], leading=0)
    if not lead:
        return laid
    if laid.shape[0] not in (1, x.num_segments):
        raise _mismatch(func, x, other, f"batch axis {axes[0]!r} has size {laid.shape[0]}")
    return laid[0] if laid.shape[0] == 1 else laid.index_select(0, x.partition.segment_ids())
