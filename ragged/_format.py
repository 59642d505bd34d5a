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


def format_array(x: RaggedArray) -> str:
    """``RaggedArray([...segments...], shape=..., dtype=..., axes=...)``.

    Shows up to three segments at each end; reads the values (a host sync on an accelerator).

    >>> import ragged
    >>> ragged.array([[1.0, 2.0], [], [3.0]])
    RaggedArray([[1., 2.],
                 [],
                 [3.]], shape=(3, [2, 0, 1]))
    """
    head = "RaggedArray(["
    details = []
    values = x.values
    if values.device.type != "meta" and x.ragged_ndim == 1:
        indent = len(head)
        segments = list(x.unbind())
        shown = [_format_segment(s, indent) for s in segments[:_EDGE]]
        if len(segments) > 2 * _EDGE:
            shown.append("...")
            shown += [_format_segment(s, indent) for s in segments[-_EDGE:]]
        else:
            shown += [_format_segment(s, indent) for s in segments[_EDGE:]]
        body = head + ("," + "\n" + " " * indent).join(shown) + "]"
        details.append(f"shape={_shape_text(x)}")
    else:
        body = "RaggedArray("
        details.append(f"shape={_shape_text(x)}")
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


def _shape_text(x: RaggedArray) -> str:
    if x.values.device.type == "meta":
        parts = [x.num_segments, *["?"] * x.ragged_ndim, *x.inner_shape]
    else:
        parts = x.shape.to_list()
    return "(" + ", ".join(map(str, parts)) + ")"
