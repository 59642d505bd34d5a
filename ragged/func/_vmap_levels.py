"""``ragged.vmap`` over the segments of multi-level arrays.

``f`` sees segment ``b`` of a ``(B, S*, T*, *inner)`` array as a RaggedArray with one fewer
level, ``(S_b, T*, *inner)``: its rows along axis 1 are the segments of the sub-array. Segments
with the same nested lengths share one sub-partition and run as one ``torch.func.vmap`` call
over their stacked values (a Python loop per segment when ``f`` cannot be vmapped). Grouping
reads every level's offsets once (one host sync).

Outputs: a RaggedArray that kept its sub-array's partition goes back into ``x``'s partition (the
same object); other RaggedArrays are stacked into a new array, one segment per call; a tensor
whose leading size is ``S_b`` for every segment becomes a RaggedArray over ``x``'s first ragged
axis; a tensor of one shape for every segment is stacked into a dense ``(B, ...)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from .._array import RaggedArray
from .._axes import transformed
from .._errors import name_of, value_error
from .._partition import Partition, RowPartition
from .._pytree import is_ragged_leaf
from ..ops._combining import concat
from ._prefix import names_leaf, prefix_leaves


class _Group:
    """Segments of one nested structure: their sub-partition and their value rows."""

    def __init__(self, segments: list[int], key: tuple[Any, ...], rows: list[tuple[int, int]]):
        self.segments = segments
        self.key = key
        self.rows = rows  # (start, end) of each segment's values


def _groups(x: RaggedArray) -> tuple[list[_Group], list[int]]:
    """Segments grouped by nested lengths (one host read), and every segment's row count."""
    levels = x.partition.levels
    host = torch.cat([level.offsets for level in levels]).tolist()  # the one host sync
    offsets, at = [], 0
    for level in levels:
        offsets.append(host[at : at + level.num_rows + 1])
        at += level.num_rows + 1
    groups: dict[tuple[Any, ...], _Group] = {}
    counts = []
    for b in range(x.num_segments):
        start, end = offsets[0][b], offsets[0][b + 1]
        counts.append(end - start)
        key: list[Any] = []
        for bounds in offsets[1:]:
            key.append(tuple(bounds[i + 1] - bounds[i] for i in range(start, end)))
            start, end = bounds[start], bounds[end]
        group = groups.setdefault(tuple(key), _Group([], tuple(key), []))
        group.segments.append(b)
        group.rows.append((start, end))
    return list(groups.values()), counts


def _sub_partition(key: tuple[Any, ...], device: torch.device) -> Partition:
    levels = []
    for lengths in key:
        t = torch.tensor(lengths, dtype=torch.int64, device=device)
        levels.append(RowPartition.from_lengths(t, sum(lengths), max(lengths, default=0)))
    return Partition(tuple(levels))


def run_levels(call: Any, vmap: Callable[..., Any], warning: type[Warning]) -> Any:
    """Run a ``ragged.vmap`` call whose first mapped array has several ragged axes
    (``warning``: the class of the fallback warning)."""
    if call.axis_name is not None:
        raise value_error(
            vmap,
            "axis_name",
            "is not supported over arrays with several ragged axes (collectives across "
            "segments run on one-level arrays)",
            repr(call.axis_name),
        )
    x: RaggedArray = call.first
    groups, counts = _groups(x)
    if call.fill_empty is not None:
        groups = [g for g in groups if counts[g.segments[0]] > 0]
    if not groups:
        raise value_error(vmap, "args", "must have at least one segment to call f on", "0 segments")
    outputs = [_run_group(call, vmap, warning, x, g) for g in groups]
    flat = [pytree.tree_flatten(out, is_leaf=is_ragged_leaf) for out, _ in outputs]
    spec = flat[0][1]
    if any(s != spec for _, s in flat):
        raise ValueError(
            f"{name_of(vmap)}: f returned different structures for different segments."
        )
    template = pytree.tree_unflatten([0] * len(flat[0][0]), spec)
    forced = prefix_leaves(vmap, "out_ragged", call.out_ragged, template)
    out_axes = prefix_leaves(vmap, "out_axes", call.out_axes, template)
    names = prefix_leaves(vmap, "axes", call.names, template, names_leaf)
    assembled = []
    for k in range(len(flat[0][0])):
        column = [(leaves[k], sub) for (leaves, _), (_, sub) in zip(flat, outputs, strict=True)]
        assembled.append(
            _assemble(call, vmap, x, groups, counts, column, forced[k], out_axes[k], names[k])
        )
    return pytree.tree_unflatten(assembled, spec)


def _run_group(
    call: Any, vmap: Callable[..., Any], warning: type[Warning], x: RaggedArray, group: _Group
) -> Any:
    """``f`` on the group's segments (vmapped, or a loop); returns (output, sub-partition)."""
    sub = _sub_partition(group.key, x.device)
    index = torch.cat(
        [torch.arange(a, b, device=x.device) for a, b in group.rows]
        or [torch.zeros(0, dtype=torch.int64, device=x.device)]
    )
    n = len(group.segments)
    per = group.rows[0][1] - group.rows[0][0]
    segments = torch.tensor(group.segments, dtype=torch.int64, device=x.device)
    mapped, inputs = [], []
    for i, (leaf, axis) in enumerate(zip(call.leaves, call.axes, strict=True)):
        if axis is None:
            continue
        mapped.append(i)
        if isinstance(leaf, RaggedArray):
            values = leaf.values.index_select(0, index).view(n, per, *leaf.values.shape[1:])
            inputs.append((values, leaf.axes))
        else:
            inputs.append((leaf.index_select(0, segments), None))

    def one(*tensors: Tensor) -> Any:
        leaves = list(call.leaves)
        for i, t, (_, axes) in zip(mapped, tensors, inputs, strict=True):
            is_ragged = isinstance(call.leaves[i], RaggedArray)
            names = None if axes is None else axes[1:]
            leaves[i] = RaggedArray(t, sub, names) if is_ragged else t
        return call.f(*pytree.tree_unflatten(leaves, call.spec))

    tensors = [t for t, _ in inputs]
    if call.method != "loop":
        try:
            return torch.func.vmap(one, randomness=call.randomness)(*tensors), sub
        except Exception as error:
            if call.method == "vmap":
                raise
            warnings.warn(
                f"{name_of(vmap)}: f could not be vmapped ({type(error).__name__}: {error}); "
                "running a Python loop over segments instead (pass method='loop' to silence "
                "this).",
                warning,
                stacklevel=5,
            )
            call.method = "loop"
    results = [one(*(t[j] for t in tensors)) for j in range(n)]
    stacked = pytree.tree_map(
        lambda *ts: torch.stack(ts) if isinstance(ts[0], Tensor) else list(ts),
        *results,
        is_leaf=is_ragged_leaf,
    )
    return _restack(results, stacked), sub


def _restack(results: list[Any], stacked: Any) -> Any:
    """Loop results as vmap would return them (RaggedArray leaves: values stacked)."""

    def merge(*items: Any) -> Any:
        first = items[0]
        if isinstance(first, RaggedArray):
            if all(i.partition is first.partition for i in items):
                return RaggedArray(
                    torch.stack([i.values for i in items]), first.partition, first.axes
                )
            return _PerSegment(list(items))
        return torch.stack(items)

    return pytree.tree_map(merge, *results, is_leaf=is_ragged_leaf)


class _PerSegment:
    """RaggedArrays of different partitions returned by a loop: one per segment."""

    def __init__(self, items: list[RaggedArray]) -> None:
        self.items = items


def _assemble(
    call: Any,
    vmap: Callable[..., Any],
    x: RaggedArray,
    groups: list[_Group],
    counts: list[int],
    column: list[tuple[Any, Partition]],
    force: bool | None,
    out_axis: int | None,
    names_spec: Any,
) -> Any:
    num = x.num_segments
    first = column[0][0]
    if isinstance(first, (RaggedArray, _PerSegment)):
        per_segment: dict[int, RaggedArray] = {}
        kept = all(isinstance(out, RaggedArray) and out.partition is sub for out, sub in column)
        for (out, _), group in zip(column, groups, strict=True):
            items = (
                out.items
                if isinstance(out, _PerSegment)
                else [
                    RaggedArray(out.values[j], out.partition, out.axes)
                    for j in range(len(group.segments))
                ]
            )
            for b, item in zip(group.segments, items, strict=True):
                per_segment[b] = item
        sample = next(iter(per_segment.values()))
        names = transformed(vmap, x.axes, x.ndim, sample.ndim + 1, names_spec)
        if kept and len(per_segment) == num:
            values = torch.cat([per_segment[b].values for b in range(num)])
            return RaggedArray(values, x.partition, names)
        empty = RaggedArray(sample.values[:0], _empty_like(sample.partition), sample.axes)
        items = [per_segment.get(b, empty) for b in range(num)]
        joined = concat([i.rename(None) for i in items]) if num else empty
        top = RowPartition.from_lengths(
            torch.tensor([i.num_segments for i in items], dtype=torch.int64, device=x.device),
            joined.num_segments,
        )
        return RaggedArray(joined.values, Partition((top, *joined.partition.levels)), names)
    shapes = {}
    rows: dict[int, Tensor] = {}
    for (out, _), group in zip(column, groups, strict=True):
        for j, b in enumerate(group.segments):
            rows[b] = out[j]
            shapes[b] = tuple(out.shape[1:])
    distinct = set(shapes.values())
    follows = all(len(s) >= 1 and s[0] == counts[b] for b, s in shapes.items()) and (
        len({s[1:] for s in distinct}) == 1
    )
    # A shape that does not tell (every segment has as many rows) is dense unless forced.
    ragged = follows and len(distinct) > 1 if force is None else bool(force)
    if (ragged and not follows) or (not ragged and len(distinct) != 1):
        raise ValueError(
            f"{name_of(vmap)}: an output has per-segment shapes {sorted(distinct)}: it must have "
            "leading size S_b (the segment's rows: ragged) or one shape for every segment (dense)."
        )
    if ragged:
        values = torch.cat([rows[b] for b in range(num) if b in rows])
        names = transformed(vmap, x.axes, x.ndim, values.dim() + 1, names_spec)
        return RaggedArray(values, Partition((x.partition.levels[0],)), names)
    stacked_rows = [rows.get(b) for b in range(num)]
    like = next(r for r in stacked_rows if r is not None)
    fill = call.fill_empty
    result = torch.stack(
        [r if r is not None else torch.full_like(like, fill) for r in stacked_rows]
    )
    return result if out_axis in (0, None) else result.movedim(0, out_axis)


def _empty_like(partition: Partition) -> Partition:
    """A partition with the levels of ``partition`` and no segments."""
    device = partition.device
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    none = zero[:0]
    return Partition(tuple(RowPartition(zero, none, none, 0) for _ in partition.levels))
