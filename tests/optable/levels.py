"""The op table on multi-level arrays.

Two kinds of multi-level samples, both checked against nested per-row loops:

* **Lifted** (every op with ``lift=True``): each one-level sample runs again with outer levels
  ``(B, S*)`` or ``(B, A*, S*)`` on top of every RaggedArray argument, so that the sample's
  segments become the rows of the innermost ragged axis of a ``(B, S*, T*, ...)`` array. Axis
  arguments shift by the added levels. The reference is the op's own per-segment reference on
  each row, and the result must keep the outer levels (an op along the innermost axis acts on
  every row of the axis above separately).
* **Outer** (``OpInfo.levels``): samples along an outer ragged axis, each with the nested
  result its loops expect (``tests/optable/nested.py``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

import ragged

from . import OpInfo, PerSegment, Sample, compare_to_reference

OUTER_NAMES = ("doc", "par")


def outer_levels(structure: list[list[int]]) -> tuple[ragged.RowPartition, ...]:
    """The levels above the innermost of a nested structure (its last list: the row lengths)."""
    rows = len(structure[-1])
    return ragged.from_nested_lengths(torch.zeros(rows), structure[:-1]).partition.levels


def lift_array(a: ragged.RaggedArray, outer: tuple[ragged.RowPartition, ...]) -> Any:
    names = None if a.axes is None else (*OUTER_NAMES[: len(outer)], *a.axes)
    return ragged.RaggedArray(a.values, ragged.Partition((*outer, *a.partition.levels)), names)


def _lift(value: Any, outer: tuple[ragged.RowPartition, ...]) -> Any:
    if isinstance(value, ragged.RaggedArray):
        return lift_array(value, outer)
    if isinstance(value, (list, tuple)) and any(isinstance(v, ragged.RaggedArray) for v in value):
        return type(value)(_lift(v, outer) for v in value)
    return value


def _shift(axis: Any, by: int) -> Any:
    if isinstance(axis, (tuple, list)):
        return type(axis)(_shift(a, by) for a in axis)
    if isinstance(axis, int) and not isinstance(axis, bool) and axis > 0:
        return axis + by
    return axis


def _on_batch(axis: Any) -> bool:
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return any(isinstance(a, int) and not isinstance(a, bool) and a == 0 for a in items)


def _default_axis(op: Any) -> Any:
    """The default of an op's ``axis`` parameter (``None`` when it has none)."""
    try:
        parameter = inspect.signature(op).parameters.get("axis")
    except (TypeError, ValueError):
        return None
    return None if parameter is None else parameter.default


def lifted(
    sample: Sample, structure: list[list[int]], op: Any = None, *, broadcast: bool = False
) -> Sample | None:
    """``sample`` on arrays with the outer levels of ``structure`` on top (``None`` when it is
    not per-row there: an axis argument on the batch axis). ``op``'s default axis, when a
    ragged one, is given explicitly (shifted). A per-segment dense argument stays a tensor with
    one entry per row (``take``'s dense indices), or with ``broadcast`` (elementwise ops)
    becomes the RaggedArray ``(B, ..., *rest)`` of the outer levels, which broadcasts over the
    innermost axis."""
    outer = outer_levels(structure)
    by = len(outer)
    kwargs = dict(sample.kwargs)
    default = _default_axis(op)
    if "axis" not in kwargs and isinstance(default, int) and default > 0:
        kwargs["axis"] = default
    for key in ("axis", "axis0", "axis1"):
        if key in kwargs:
            if _on_batch(kwargs[key]):
                return None
            kwargs[key] = _shift(kwargs[key], by)
    index = kwargs.get("index")
    if isinstance(index, tuple) and index and index[0] is not Ellipsis:
        kwargs["index"] = (index[0], *[slice(None)] * by, *index[1:])
    args = []
    for a in sample.args:
        if isinstance(a, PerSegment):
            per_row = ragged.RaggedArray(a.tensor, ragged.Partition(outer))
            args.append(per_row if broadcast else PerSegment(a.tensor))
        else:
            args.append(_lift(a, outer))
    return Sample(sample.name, tuple(args), kwargs)


def unlift(out: Any, depth: int, outer: tuple[ragged.RowPartition, ...]) -> Any:
    """A lifted result without its outer levels (checked to be ``outer``): one entry per row."""
    if isinstance(out, tuple):
        return tuple(unlift(o, depth, outer) for o in out)
    assert isinstance(out, ragged.RaggedArray), f"a lifted op returned {type(out).__name__}"
    levels = out.partition.levels
    assert len(levels) >= depth, "the result lost outer levels"
    for got, want in zip(levels[:depth], outer, strict=True):
        assert got.offsets.tolist() == want.offsets.tolist(), "the result changed outer levels"
    if len(levels) == depth:  # one dense entry per row
        return out.values
    return ragged.RaggedArray(out.values, ragged.Partition(levels[depth:]))


def check_lifted(info: OpInfo, sample: Sample, structure: list[list[int]]) -> bool:
    """Run ``sample`` lifted onto ``structure`` and compare every row with the reference;
    ``False`` when the sample does not lift."""
    up = lifted(sample, structure, info.spec.obj, broadcast=broadcasts(info))
    if up is None:
        return False
    before = [a.values.clone() for a in up.args if isinstance(a, ragged.RaggedArray)]
    out = info.op(*up.call_args(), **up.kwargs)
    outer = outer_levels(structure)
    compare_to_reference(info, sample, unlift(out, len(outer), outer))
    after = [a.values for a in up.args if isinstance(a, ragged.RaggedArray)]
    for a, b in zip(before, after, strict=True):  # no op mutates its inputs
        torch.testing.assert_close(a, b, equal_nan=True)
    return True


def broadcasts(info: OpInfo) -> bool:
    """Whether the op's dense operands broadcast (elementwise ops)."""
    return info.spec.rule.kind == "unify"


def row_lengths(structure: list[list[int]]) -> list[int]:
    return structure[-1]
