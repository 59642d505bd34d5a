"""``ragged.reduce``: a user-defined associative reduction over each segment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import normalize_axis
from .._errors import type_error, value_error
from .._registry import public


@public("transforms")
def reduce(
    f: Callable[[Tensor, Tensor], Tensor], x: RaggedArray, axis: int | str = 1, *, initial: Any
) -> Tensor:
    """Reduce each segment with an associative binary function ``f`` (a monoid).

    ``f(a, b)`` combines two batches of rows elementwise (``[n, *inner]`` each) and must be
    associative with identity ``initial`` (``f(a, initial) == a``). The reduction is a tree:
    ``ceil(log2(max_length))`` vectorised steps over all segments at once, each combining rows
    ``2^k`` apart within a segment; the association order is the tree's, so ``f`` need not be
    commutative but must be associative. Empty segments give ``initial``.

    The number of steps comes from the partition's maximum length: free when known (factories
    record it), otherwise read once (a host sync). Under ``torch.compile`` the loop unrolls, so
    a batch whose maximum length crosses a power of two compiles a new graph.

    Args:
        f: associative ``(a, b) -> c`` on row batches (same shape in and out).
        x: the array; only one ragged axis is supported.
        axis: the ragged axis (1 or its name).
        initial: the identity of ``f`` (a number or a tensor broadcastable to a row).

    Returns:
        A dense ``(B, *inner)`` tensor.

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 5.0, 2.0], [], [7.0]])
    >>> ragged.reduce(torch.maximum, x, initial=float("-inf"))
    tensor([5., -inf, 7.])
    >>> # a non-commutative monoid: 2x2 matrix products, in order within each segment
    >>> m = ragged.from_lengths(torch.tensor([[[1.0, 1.0], [0.0, 1.0]]] * 3), [3])
    >>> ragged.reduce(torch.matmul, m, initial=torch.eye(2))
    tensor([[[1., 3.],
             [0., 1.]]])
    """
    func = reduce
    if not callable(f):
        raise type_error(func, "f", "must be callable", type(f).__name__)
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", type(x).__name__)
    if x.ragged_ndim != 1 or normalize_axis(func, x, axis) != 1:
        raise value_error(func, "axis", "must be the ragged axis of a one-level array", repr(axis))
    level = x.partition.levels[0]
    values = x.values
    identity = torch.as_tensor(initial, dtype=values.dtype, device=values.device)
    position = level.positions()
    length = level.lengths.index_select(0, level.row_ids)
    steps = max(x.partition.max_length(0) - 1, 0).bit_length()  # ceil(log2(max_length))
    rows = torch.arange(values.shape[0], device=values.device)
    view = [-1, *[1] * (values.dim() - 1)]
    for k in range(steps):
        stride = 1 << k
        # Row p (p % 2stride == 0) absorbs row p + stride of the same segment, when it exists.
        partner = position + stride
        active = (position % (2 * stride) == 0) & (partner < length)
        other = values.index_select(0, torch.where(active, rows + stride, rows))
        values = torch.where(active.view(view), f(values, other), values)
    out = identity.expand(level.num_rows, *values.shape[1:]).clone()
    nonempty = level.lengths > 0
    firsts = level.offsets[:-1].clamp_max(max(values.shape[0] - 1, 0))
    if values.shape[0] == 0:
        return out
    picked = values.index_select(0, firsts)
    return torch.where(nonempty.view(view), picked, out)
