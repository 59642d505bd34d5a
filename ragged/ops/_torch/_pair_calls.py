"""torch calls of attention written by hand: ``torch.bmm``, ``torch.baddbmm``, ``torch.tril``,
``torch.triu``, ``torch.ones_like`` and ``torch.zeros_like`` on RaggedArrays (the products
themselves are ``ragged/ops/_pair_layouts.py``).

``torch.bmm(x, x.transpose(1, 2))`` of ``(B, L*, C)`` is the pair map ``(B, L*, L*)`` and
``torch.bmm(att, v)`` applies it; ``torch.tril(att)`` / ``att.tril()`` zero each segment's block
above its diagonal, so ``att.masked_fill(torch.ones_like(att).tril() == 0, float("-inf"))`` is
the causal mask.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._layout import build, logical_order
from ..._torch_args import refuse_out
from .._linalg._einsum import einsum
from .._pair_layouts import pair_triangle, ragged_product
from ._spelling import torch_handler

PAIR_PRODUCTS = (
    "the pair map (B, N*, C) @ (B, C, M*) (x @ y.transpose(1, 2)) or a pair map applied, "
    "(B, N*, M*) @ (B, M*, C)"
)


def _any_layout(handler: Any) -> Any:
    """Mark ``handler`` as taking permuted arrays (the torch door's checks let them through)."""
    handler.takes_layouts = True
    return handler


def _bmm(name: str, input: Any, mat2: Any) -> RaggedArray:
    if isinstance(input, RaggedArray) and isinstance(mat2, RaggedArray):
        product = ragged_product(input, mat2) if input.ndim == 3 else None
        if product is None:
            raise ValueError(
                f"`{name}` and `mat2` must be {PAIR_PRODUCTS}, got {tuple(input.shape)} and "
                f"{tuple(mat2.shape)}."
            )
        return product
    if isinstance(input, RaggedArray) and isinstance(mat2, Tensor):
        if input.ndim != 3 or input.order is not None or mat2.dim() != 3:
            raise ValueError(
                f"`{name}` (B, L*, C) RaggedArray rows take a dense `mat2` of shape (B, C, D), "
                f"one matrix per segment; got {tuple(input.shape)} and {tuple(mat2.shape)}."
            )
        return einsum("bld,bde->ble", input, mat2)
    raise TypeError(
        f"`{name}` must be a RaggedArray (B, L*, C) with `mat2` a RaggedArray or a dense "
        f"(B, C, D) tensor, got {type(input).__name__} and {type(mat2).__name__}."
    )


@torch_handler(
    torch.bmm,
    methods=("bmm",),
    family="linalg",
    meaning=f"{PAIR_PRODUCTS}, both RaggedArrays (ragged.pair_dot, ragged.pair_matmul); "
    "or RaggedArray rows (B, L*, C) times a dense (B, C, D), one matrix per segment",
    see=("ragged.pair_dot", "ragged.pair_matmul", "ragged.einsum"),
)
@_any_layout
def _torch_bmm(input: Any, mat2: Any, *, out: Any = None) -> RaggedArray:
    refuse_out(None, out)
    return _bmm("input", input, mat2)


@torch_handler(
    torch.baddbmm,
    methods=("baddbmm",),
    family="linalg",
    meaning="`beta * input + alpha * torch.bmm(batch1, batch2)` (see torch.bmm); `input` a "
    "RaggedArray of the product's shape and layout, or a number (ignored when `beta` is 0, "
    "as in torch)",
    see=("ragged.pair_dot", "ragged.pair_matmul"),
)
@_any_layout
def _torch_baddbmm(
    input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1, out: Any = None
) -> RaggedArray:
    refuse_out(None, out)
    product = _bmm("batch1", batch1, batch2)
    if not isinstance(input, (RaggedArray, int, float)) and not (
        isinstance(input, Tensor) and input.dim() == 0
    ):
        raise TypeError(
            f"`input` must be a RaggedArray of the product's shape or a number, got "
            f"{type(input).__name__}{'' if not isinstance(input, Tensor) else tuple(input.shape)}."
        )
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        product = product * alpha
    if isinstance(beta, (int, float)) and beta == 0:
        return product  # torch ignores `input` (also its NaNs) when beta is 0
    return product + (input if isinstance(beta, (int, float)) and beta == 1 else input * beta)


def _triangle(name: str, input: Any, diagonal: Any, upper: bool) -> RaggedArray:
    if isinstance(diagonal, bool) or not isinstance(diagonal, int):
        raise TypeError(f"`diagonal` must be an int, got {diagonal!r}.")
    if not isinstance(input, RaggedArray):
        raise TypeError(f"`input` must be a RaggedArray, got {type(input).__name__}.")
    out = pair_triangle(input, diagonal, upper)
    if out is not None:
        return out
    order = input.order if input.order is not None else tuple(range(1, input.ndim))
    if input.ndim >= 3 and min(order[-2:]) > input.ragged_ndim:  # two inner axes: on the values
        fn = torch.triu if upper else torch.tril
        return input.with_values(fn(input.values, diagonal), axes=input.axes)
    raise ValueError(
        f"`input` must have two inner axes last, or be a pair map (B, ..., N*, M*) whose two "
        f"ragged axes are its last two (x @ x.transpose(-2, -1)), got {tuple(input.shape)}; "
        f"{name} works per segment on the block of each."
    )


@torch_handler(
    torch.tril,
    methods=("tril",),
    family="pairs",
    meaning="per segment: on a pair map (B, ..., N*, M*) the lower triangle of each segment's "
    "N x M block (`diagonal` as torch's), the causal mask of hand-written attention "
    "(`torch.ones_like(att).tril() == 0`); on two inner axes, of each row's matrix",
    see=("ragged.outer", "ragged.pair_dot"),
)
@_any_layout
def _torch_tril(input: Any, diagonal: Any = 0, *, out: Any = None) -> RaggedArray:
    refuse_out(None, out)
    return _triangle("torch.tril", input, diagonal, upper=False)


@torch_handler(
    torch.triu,
    methods=("triu",),
    family="pairs",
    meaning="per segment: on a pair map (B, ..., N*, M*) the upper triangle of each segment's "
    "N x M block (`diagonal` as torch's); on two inner axes, of each row's matrix",
    see=("ragged.outer", "ragged.pair_dot"),
)
@_any_layout
def _torch_triu(input: Any, diagonal: Any = 0, *, out: Any = None) -> RaggedArray:
    refuse_out(None, out)
    return _triangle("torch.triu", input, diagonal, upper=True)


def _like(fill: Any, input: Any, dtype: Any, device: Any, requires_grad: Any) -> RaggedArray:
    if not isinstance(input, RaggedArray):
        raise TypeError(f"`input` must be a RaggedArray, got {type(input).__name__}.")
    values = torch.full_like(
        input.values, fill, dtype=dtype, device=device, requires_grad=requires_grad
    )
    return build(input, values, input.axes, logical_order(input))


@torch_handler(
    torch.ones_like,
    family="tensor",
    meaning="an array of ones with the partition, layout and names of `input` (the mask of "
    "`torch.ones_like(att).tril()`)",
    see=("ragged.RaggedArray.with_values",),
)
@_any_layout
def _torch_ones_like(
    input: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> RaggedArray:
    return _like(1, input, dtype, device, requires_grad)


@torch_handler(
    torch.zeros_like,
    family="tensor",
    meaning="an array of zeros with the partition, layout and names of `input`",
    see=("ragged.RaggedArray.with_values",),
)
@_any_layout
def _torch_zeros_like(
    input: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> RaggedArray:
    return _like(0, input, dtype, device, requires_grad)
