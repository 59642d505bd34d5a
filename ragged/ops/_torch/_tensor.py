"""Tensor-style handlers: inner-axis reshapes, properties and conversions, and losses.

``transpose``/``swapaxes``, ``unsqueeze``, ``squeeze`` and ``flatten`` of inner axes (the batch
and ragged axes stay in front); ``x.size()``, ``x.dim()``, ``numel``, ``cpu``/``cuda``,
``type_as``, ``unbind``...; and torch's elementwise losses over every entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._array import RaggedArray
from ..._broadcast import align
from ..._registry import torch_function
from ..._shape import RaggedShape
from .._pairs import transpose as pair_transpose
from ._spelling import torch_handler

# --- inner axes: transpose, unsqueeze, squeeze, flatten --------------------------------------

MOVES_RAGGED = (
    "moves the batch or a ragged axis, which RaggedArrays keep in front; torch modules that "
    "transpose batch and sequence (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.LSTM) "
    "do not take RaggedArrays: use ragged.nn (RaggedMultiheadAttention, "
    "RaggedTransformerEncoderLayer) or ragged.attention; ragged.transpose swaps the two ragged "
    "axes of a pair map"
)


RESHAPES_RAGGED = (
    "is the batch or a ragged axis, which has per-segment sizes; reshape the rows with "
    "ragged.map(lambda v: ..., x)"
)


def _inner(x: RaggedArray, dim: Any, ndim: int | None = None, why: str = RESHAPES_RAGGED) -> int:
    """``dim`` of ``x`` (of a result with ``ndim`` axes) as a dim of the values, which must be
    an inner axis (else a TypeError that says ``why``)."""
    n = x.ndim if ndim is None else ndim
    if not isinstance(dim, int) or isinstance(dim, bool) or not -n <= dim < n:
        raise ValueError(f"`dim` must be an int in [{-n}, {n}), got {dim!r}.")
    position = dim % n
    if position <= x.ragged_ndim:
        raise TypeError(f"`dim` {dim} {why}.")
    return position - x.ragged_ndim


@torch_handler(
    torch.transpose,
    torch.swapaxes,
    methods=("transpose", "swapaxes"),
    family="indexing",
    meaning="swaps two inner axes (the ragged axes of a pair map: `ragged.transpose`); the "
    "batch and ragged axes stay in front",
    see=("ragged.transpose",),
)
def _transpose(input: RaggedArray, dim0: int, dim1: int) -> RaggedArray:
    if {dim0 % input.ndim, dim1 % input.ndim} == {1, 2} and input.ragged_ndim == 2:
        return pair_transpose(input)
    a, b = _inner(input, dim0, why=MOVES_RAGGED), _inner(input, dim1, why=MOVES_RAGGED)
    return input.with_values(input.values.transpose(a, b), axes=_swapped(input.axes, a, b, input))


def _swapped(names: Any, a: int, b: int, x: RaggedArray) -> Any:
    if names is None:
        return None
    out = list(names)
    i, j = a + x.ragged_ndim, b + x.ragged_ndim
    out[i], out[j] = out[j], out[i]
    return tuple(out)


@torch_handler(
    torch.unsqueeze,
    methods=("unsqueeze",),
    family="indexing",
    meaning="a size-1 inner axis at `dim` (of the result)",
    see=("RaggedArray.__getitem__",),
)
def _unsqueeze(input: RaggedArray, dim: int) -> RaggedArray:
    if input.axes is not None:
        raise ValueError("a named array needs a name for its new axis: use x[..., None] unnamed.")
    return input.with_values(input.values.unsqueeze(_inner(input, dim, input.ndim + 1)))


@torch_handler(
    torch.squeeze,
    methods=("squeeze",),
    family="indexing",
    meaning="removes size-1 inner axes (all of them, or `dim`)",
)
def _squeeze(input: RaggedArray, dim: Any = None) -> RaggedArray:
    nr = input.ragged_ndim
    dims = range(nr + 1, input.ndim) if dim is None else dim if isinstance(dim, tuple) else (dim,)
    inner = sorted({_inner(input, d) for d in dims})
    drop = [d for d in inner if input.values.shape[d] == 1]
    values = input.values.squeeze(tuple(drop)) if drop else input.values
    names = input.axes
    if names is not None:
        names = tuple(n for i, n in enumerate(names) if i - nr not in drop)
    return RaggedArray(values, input.partition, names)


@torch_handler(
    torch.flatten,
    methods=("flatten",),
    family="indexing",
    meaning="flattens inner axes `start_dim..end_dim`; all axes (the default): every entry in "
    "order, a dense 1-D tensor (`x.values.reshape(-1)`)",
)
def _flatten(input: RaggedArray, start_dim: int = 0, end_dim: int = -1) -> Any:
    n = input.ndim
    every = isinstance(start_dim, int) and isinstance(end_dim, int)
    if every and start_dim % n == 0 and end_dim % n == n - 1:
        return input.values.reshape(-1)
    a, b = _inner(input, start_dim), _inner(input, end_dim)
    names = None if input.axes is not None and a != b else input.axes
    return RaggedArray(input.values.flatten(a, b), input.partition, names)


@torch_handler(
    torch.unflatten,
    methods=("unflatten",),
    family="indexing",
    meaning="splits inner axis `dim` into `sizes` (`ragged.unflatten` adds a ragged level instead)",
    see=("ragged.unflatten",),
)
def _unflatten(input: RaggedArray, dim: int, sizes: Any) -> RaggedArray:
    if input.axes is not None:
        raise ValueError("a named array needs names for its new axes: use x.rename(None) first.")
    return input.with_values(input.values.unflatten(_inner(input, dim), sizes))


# --- Tensor-style properties and conversions ----------------------------------------------------


@overload
def _size(self: RaggedArray, dim: None = None) -> RaggedShape: ...
@overload
def _size(self: RaggedArray, dim: int) -> int | Tensor: ...
@torch_function(
    family="tensor",
    meaning="`x.size()`: the RaggedShape; `x.size(d)`: an int, or the lengths of a ragged axis",
    methods=("size",),
    see=("RaggedArray.shape",),
    grad=False,
)
def _size(self: RaggedArray, dim: int | None = None) -> Any:
    return self.shape if dim is None else self.shape[dim]


@torch_function(
    family="tensor",
    meaning="the number of axes, `x.ndim`",
    methods=("dim", "ndimension"),
    see=("RaggedArray.ndim",),
    grad=False,
)
def _dim(self: RaggedArray) -> int:
    return self.ndim


@torch_function(
    torch.numel,
    family="tensor",
    meaning="the number of entries (of the values)",
    methods=("numel", "nelement"),
    grad=False,
)
def _numel(input: RaggedArray) -> int:
    return input.values.numel()


@torch_function(
    torch.is_floating_point,
    family="tensor",
    meaning="whether the values are floating point",
    methods=("is_floating_point",),
    grad=False,
)
def _is_floating_point(input: RaggedArray) -> bool:
    return input.values.is_floating_point()


@torch_function(
    family="tensor",
    meaning="sets `requires_grad` of the values (a leaf) in place and returns the array, as "
    "torch: the data and the partition do not change",
    methods=("requires_grad_",),
    grad=False,
    compile=False,
)
def _requires_grad_(self: RaggedArray, requires_grad: bool = True) -> RaggedArray:
    self.values.requires_grad_(requires_grad)
    return self


@torch_function(
    family="tensor",
    meaning="values and offsets on the CPU",
    methods=("cpu",),
    see=("RaggedArray.to",),
)
def _cpu(self: RaggedArray, memory_format: Any = torch.preserve_format) -> RaggedArray:
    return self.to("cpu", memory_format=memory_format)


@torch_function(
    family="tensor",
    meaning="values and offsets on a CUDA device",
    methods=("cuda",),
    see=("RaggedArray.to",),
    compile=False,
)
def _cuda(
    self: RaggedArray,
    device: Any = None,
    non_blocking: bool = False,
    memory_format: Any = torch.preserve_format,
) -> RaggedArray:
    target = torch.device("cuda", device) if isinstance(device, int) else device or "cuda"
    return self.to(target, non_blocking=non_blocking, memory_format=memory_format)


@torch_function(
    family="tensor",
    meaning="the dtype and device of `other` (a tensor or a RaggedArray)",
    methods=("type_as",),
    see=("RaggedArray.to",),
)
def _type_as(self: RaggedArray, other: Any) -> RaggedArray:
    return self.to(device=other.device, dtype=other.dtype)


@torch_function(
    torch.unbind,
    family="indexing",
    meaning="`dim=0`: the segments, as `x.unbind()`",
    see=("ragged.unbind",),
    grad=True,
    compile=False,
)
def _unbind(input: RaggedArray, dim: int = 0) -> tuple[Any, ...]:
    if dim != 0:
        raise ValueError(f"`dim` must be 0 (the batch axis) on a RaggedArray, got {dim}.")
    return input.unbind()


# --- losses: elementwise over all entries -------------------------------------------------------

_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_LOSSES_BCE = ("binary_cross_entropy", "binary_cross_entropy_with_logits")


def _loss(fn: Callable[..., Any]) -> Callable[..., Any]:
    label = f"torch.nn.functional.{fn.__name__}"

    def handler(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        reduction = kwargs.get("reduction", "mean")
        a, b, partition, names = align(label, input, target)
        out = fn(a, b, *args, **kwargs)
        return RaggedArray(out, partition, names) if reduction == "none" else out

    return handler


def _declare_losses() -> None:
    for name in _LOSSES + _LOSSES_BCE:
        fn = getattr(F, name)
        torch_function(
            fn,
            family="reductions",
            meaning="over every entry (`reduction='none'`: a RaggedArray of losses); input and "
            "target line up as for `ragged.add`",
            see=("ragged.mean",),
        )(_loss(fn))


_declare_losses()
