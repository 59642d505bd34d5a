"""The triangle multiplicative update of square pair maps (AlphaFold / Pairformer):
``A_b @ B_b^T`` or ``A_b^T @ B_b`` per segment and channel (axis rule: **keep all**)."""

from __future__ import annotations

from typing import Any

import torch

from .._array import RaggedArray
from .._axes import KEEP
from .._errors import Func, type_error, value_error
from .._registry import op
from ..kernels._pairblocks import block_matmul
from ._levels import on_rows
from ._pairs import same_lengths


@op("pairs", rule=KEEP, args="a: ragged, b: ragged, outgoing: bool?")
def triangle_multiply(a: RaggedArray, b: RaggedArray, *, outgoing: bool = True) -> RaggedArray:
    """The triangle multiplicative update of AlphaFold / Pairformer, per segment and channel.

    For square pair maps ``a`` and ``b`` of shape ``(B, N*, N*, *inner)`` with the same
    partition:

    ```text
    outgoing:  out[b, i, j, c] = sum_k a[b, i, k, c] * b[b, j, k, c]   (A_b @ B_b^T)
    incoming:  out[b, i, j, c] = sum_k a[b, k, i, c] * b[b, k, j, c]   (A_b^T @ B_b)
    ```

    (the gating, projections and layer norms around it are ordinary ops; see
    ``examples/pairformer.py``). The reference is ``torch.einsum("ikc,jkc->ijc", a_b, b_b)``
    (``"kic,kjc->ijc"`` incoming) on every segment's block.

    Cost: eager, segments are grouped by length (the lengths are read to the host once: one host
    sync; nothing is cached) and each group is one batched matrix product over
    ``[n * C, N, N]`` blocks (a view of the values when the group's segments are consecutive),
    concatenated back in order; temporaries ``O(sum N_b^2 * C)``, nothing padded. Under
    ``torch.compile`` there is no host read: the output runs in static ``16 x 16`` tiles and the
    sum over ``k`` in 8 static steps of ``ceil(max_length / 8)``, so one graph serves every batch;
    its backward saves only ``a`` and ``b`` and runs the same tiled product (each step's
    operands are ``O(sum N_b^2 * C * max_length / 128)``, dropped after the step). It is several
    times slower than the eager path (measured: see ``docs/semantics``).

    Axis names: ``a``'s. Differentiable in both operands (all transforms).

    Args:
        a: a floating-point square pair map ``(B, N*, N*, *inner)``.
        b: a pair map with the same partition, inner shape and dtype.
        outgoing: the "outgoing edges" update (rows of ``a`` and ``b``); ``False`` for
            "incoming edges" (their columns).

    Returns:
        The pair map ``(B, N*, N*, *inner)`` with ``a``'s partition object.

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.tensor([[1.0], [2.0], [3.0]]), [2, 1])
    >>> z = ragged.outer(x, x, torch.mul)  # blocks [[1, 2], [2, 4]] and [[9]]
    >>> ragged.triangle_multiply(z, z).to_list()
    [[[[5.0], [10.0]], [[10.0], [20.0]]], [[[81.0]]]]
    >>> w = ragged.outer(x, x, torch.sub)  # antisymmetric blocks: incoming != outgoing
    >>> ragged.triangle_multiply(w, z, outgoing=False).to_list()
    [[[[2.0], [4.0]], [[-1.0], [-2.0]]], [[[0.0]]]]
    """
    func = triangle_multiply
    if isinstance(a, RaggedArray) and a.ragged_ndim > 2:  # pair maps of every row above
        views = [("a", a, 2), ("b", b, 2)]
        return on_rows(func, views, lambda u, w: triangle_multiply(u, w, outgoing=outgoing))
    _square_pair_map(func, "a", a)
    _square_pair_map(func, "b", b)
    if (
        b.partition is not a.partition
        and not torch.compiler.is_compiling()
        and not a.partition.equals(b.partition)
    ):
        raise value_error(func, "b", "must have the partition of a", "a different partition")
    if b.inner_shape != a.inner_shape or b.dtype != a.dtype:
        expected = f"must have the inner shape and dtype of a ({tuple(a.inner_shape)}, {a.dtype})"
        raise value_error(func, "b", expected, f"({tuple(b.inner_shape)}, {b.dtype})")
    if not a.dtype.is_floating_point:
        raise type_error(func, "a", "must have a floating-point dtype", a.dtype)
    level = a.partition.levels[0]
    values = block_matmul(a.values, b.values, level, tx=not outgoing, ty=outgoing)
    return RaggedArray(values, a.partition, a.axes)


def _square_pair_map(func: Func, param: str, x: Any) -> None:
    if not isinstance(x, RaggedArray):
        raise type_error(func, param, "must be a RaggedArray", type(x).__name__)
    levels = x.partition.levels
    if len(levels) != 2 or levels[1].columns is None:
        got = f"{len(levels)} ragged axes" if len(levels) != 2 else "a nested partition"
        raise value_error(func, param, "must be a pair map (B, N*, N*, ...)", got)
    if not same_lengths(levels[0], levels[1].columns):
        raise value_error(func, param, "must be a square pair map (N_b x N_b blocks)", "N_b x M_b")
