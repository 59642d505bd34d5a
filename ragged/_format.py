"""``repr`` of a RaggedArray, in the style of ``torch.Tensor``'s."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from ._array import RaggedArray

_EDGE = 3  # segments shown at each end of a long array
_SUFFIX = re.compile(r",\s*(dtype|size|requires_grad|grad_fn)=.*\)$", re.S)


def _format_segment(segment: Tensor, indent: int) -> str:
    if segment.numel() == 0:
        return "[]"
    text = repr(segment.detach())
    body = _SUFFIX.sub("", text[len("tensor(") :])
    body = body[:-1] if body.endswith(")") else body
    # torch indents continuation lines under "tensor("; re-indent under our bracket.
    return body.replace("\n" + " " * len("tensor("), "\n" + " " * indent)


def _elide(items: list[int]) -> list[int | None]:
    """The indices to show: all, or the first and last ``_EDGE`` with ``None`` for "..."."""
    if len(items) <= 2 * _EDGE:
        return list(items)
    return [*items[:_EDGE], None, *items[-_EDGE:]]


def _format_level(
    values: Tensor, bounds: list[list[int]], level: int, index: int, indent: int
) -> str:
    """Format child ``index`` of ``level``: a tensor at the last level, else nested brackets."""
    start, end = bounds[level][index], bounds[level][index + 1]
    if level == len(bounds) - 1:
        return _format_segment(values[start:end], indent)
    parts = [
        "..." if i is None else _format_level(values, bounds, level + 1, i, indent + 1)
        for i in _elide(list(range(start, end)))
    ]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(parts) + "]"


def format_array(x: RaggedArray) -> str:
    """``RaggedArray([...segments...], shape=..., dtype=..., axes=...)``.

    Shows up to three entries at each end of every ragged axis; reads the values (a host sync on
    an accelerator).

    >>> import ragged
    >>> ragged.array([[1.0, 2.0], [], [3.0]])
    RaggedArray([[1., 2.],
                 [],
                 [3.]], shape=(3, [2, 0, 1]))
    >>> ragged.array([[[1, 2], [3]], [[4]]])
    RaggedArray([[[1, 2],
                  [3]],
                 [[4]]], shape=(2, [2, 1], [[2, 1], [1]]))
    """
    values = x.values
    if not isinstance(values, torch.Tensor):
        return format_non_tensor(x)
    details = []
    if values.device.type != "meta":
        bounds = [level.offsets.tolist() for level in x.partition.levels]
        indent = len("RaggedArray([")
        shown = [
            "..." if b is None else _format_level(values, bounds, 0, b, indent)
            for b in _elide(list(range(x.num_segments)))
        ]
        body = "RaggedArray([" + ("," + "\n" + " " * indent).join(shown) + "]"
    else:
        body = "RaggedArray("
    details.append(f"shape={shape_text(x)}")
    if values.dtype not in (torch.get_default_dtype(), torch.int64, torch.bool):
        details.append(f"dtype={values.dtype}")
    if values.device.type != "cpu":
        details.append(f"device='{values.device}'")
    if x.axes is not None:
        details.append(f"axes={x.axes}")
    if values.grad_fn is not None:
        details.append(f"grad_fn=<{type(values.grad_fn).__name__}>")
    elif values.requires_grad:
        details.append("requires_grad=True")
    separator = ", " if body.endswith("]") else ""
    return body + separator + ", ".join(details) + ")"


def format_non_tensor(x: RaggedArray) -> str:
    """A RaggedArray whose ``values`` is not a tensor, e.g. what a pytree map returned.

    >>> import optree, ragged
    >>> x = ragged.array([[1.0, 2.0], [], [3.0]])
    >>> optree.tree_map(lambda v: v.dtype, x, namespace="ragged")
    RaggedArray(values=torch.float32, lengths=[2, 0, 1])
    """
    lengths = [(level.offsets[1:] - level.offsets[:-1]).tolist() for level in x.partition.levels]
    shown = lengths[0] if len(lengths) == 1 else lengths
    axes = "" if x.axes is None else f", axes={x.axes}"
    return f"RaggedArray(values={x.values!r}, lengths={shown}{axes})"


def shape_text(x: RaggedArray) -> str:
    """The logical shape for error messages, e.g. ``(2, [1, 2], 2)``.

    It reads the lengths, except on the meta device and while compiling (no host reads there),
    where ragged axes show as ``L*``.

    >>> import ragged
    >>> shape_text(ragged.array([[[1, 2]], [[3, 4], [5, 6]]]))
    '(2, [1, 2], 2)'
    """
    if x.values.device.type == "meta" or torch.compiler.is_compiling():
        parts = [x.num_segments, *["L*"] * x.ragged_ndim, *x.inner_shape]
        return "(" + ", ".join(map(str, parts)) + ")"
    return x.shape.text()  # long lists of lengths summarised
