"""Tensor-style handlers: layouts and reshapes, properties and conversions, and losses.

``transpose``/``permute``/``movedim`` (a ragged axis moves among the inner axes as metadata,
``ragged._layout``), ``view``/``reshape``/``flatten``/``unflatten``/``squeeze``/``unsqueeze``/
``expand``/``split``/``chunk`` of inner axes, wherever the ragged axes sit; ``x.size()``, ``x.dim()``, ``numel``, ``cpu``/``cuda``,
``type_as``, ``unbind``...; and torch's elementwise losses over every entry.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, overload

import torch

from ... import _layout as layout
from ..._array import RaggedArray
from ..._registry import torch_function
from ..._shape import RaggedShape, RaggedSize
from ..._versions import check_unchanged
from .._combining import split as ragged_split
from .._pairs import transpose as pair_transpose
from ._immutable import refuse_nn_init
from ._spelling import torch_handler


def _any_layout(handler: Any) -> Any:
    """Mark ``handler`` as taking permuted arrays (the torch door's checks let them through)."""
    handler.takes_layouts = True
    return handler


def _sequence_first(handler: Any) -> Any:
    """Mark ``handler`` as taking the sequence-first view ``(L*, B, ...)`` too."""
    handler.takes_layouts = handler.takes_sequence_first = True
    return handler


RESHAPES_RAGGED = (
    "is the batch or a ragged axis, which has per-segment sizes; reshape the rows with "
    "ragged.map(lambda v: ..., x)"
)

# --- layouts and reshapes: transpose, permute, view, reshape, split... (ragged._layout) ------


def _transpose_dims(x: RaggedArray, dim0: Any, dim1: Any) -> list[int]:
    n = x.ndim
    for dim in (dim0, dim1):
        if isinstance(dim, bool) or not isinstance(dim, int) or not -n <= dim < n:
            raise ValueError(f"`dim` must be an int in [{-n}, {n}), got {dim!r}.")
    dims = list(range(n))
    dims[dim0 % n], dims[dim1 % n] = dims[dim1 % n], dims[dim0 % n]
    return dims


@torch_handler(
    torch.transpose,
    torch.swapaxes,
    torch.swapdims,
    methods=("transpose", "swapaxes", "swapdims"),
    family="indexing",
    meaning="swaps two axes other than the batch axis, without a copy: a ragged axis moves "
    "among the inner ones as metadata (`(B, L*, H, D).transpose(1, 2)` is `(B, H, L*, D)`); the "
    "two ragged axes of a pair map: `ragged.transpose`; `x.transpose(0, 1)` of a one-level array "
    "in the storage order: the sequence-first view `(L*, B, ...)` of `nn.MultiheadAttention`, "
    "which transposes back the same way (docs/semantics.md)",
    see=("ragged.transpose",),
)
@_sequence_first
def _transpose(input: RaggedArray, dim0: int, dim1: int) -> RaggedArray:
    dims = _transpose_dims(input, dim0, dim1)
    if (
        input.ragged_ndim == 2
        and input.order is None
        and sorted(dims[1:3]) == [1, 2]
        and dims[1] == 2
    ):
        return pair_transpose(input)
    return layout.permute(None, input, dims)


@torch_handler(
    torch.permute,
    methods=("permute",),
    family="indexing",
    meaning="reorders the axes after the batch axis without a copy (the ragged axes keep their "
    "relative order); `permute(1, 0, ...)`: the sequence-first view, as `transpose(0, 1)`",
)
@_sequence_first
def _permute(input: RaggedArray, *dims: Any) -> RaggedArray:
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return layout.permute(None, input, dims)


@torch_handler(
    torch.movedim,
    torch.moveaxis,
    methods=("movedim", "moveaxis"),
    family="indexing",
    meaning="moves axes after the batch axis without a copy, as `permute`",
)
@_sequence_first
def _movedim(input: RaggedArray, source: Any, destination: Any) -> RaggedArray:
    n = input.ndim
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise ValueError(f"`source` and `destination` must have the same length, got {src}, {dst}.")
    src = [layout.logical_dim(None, d, n) for d in src]
    dst = [layout.logical_dim(None, d, n) for d in dst]
    rest = iter(d for d in range(n) if d not in src)
    out: list[Any] = [None] * n
    for s, d in zip(src, dst, strict=True):
        out[d] = s
    return layout.permute(None, input, [next(rest) if d is None else d for d in out])


def _shape_arg(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        return tuple(shape[0])
    return shape


@torch_handler(
    family="indexing",
    meaning="a new shape for the inner axes between and around the ragged axes, which stay as "
    "their own sizes (`x.view(B, T, h, d)` with `B, T, C = x.shape`); values viewed, no copy. "
    "`x.view(-1, C)` merges the batch and ragged axes: the rows, a `ragged.FlatArray` that "
    "`view(x.size()[:-1] + (n,))` turns back (GPT-2's `Conv1D`)",
    methods=("view",),
)
@_any_layout
def _view(self: RaggedArray, *shape: Any) -> Any:
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        return self.with_values(self.values.view(shape[0]))
    return layout.view_or_rows(None, self, _shape_arg(shape), view=True)


@torch_handler(
    torch.reshape,
    methods=("reshape",),
    family="indexing",
    meaning="as `view` (`reshape(-1, C)`: the rows, a `ragged.FlatArray`), copying the values "
    "when they cannot be viewed",
)
@_any_layout
def _reshape(input: RaggedArray, *shape: Any) -> Any:
    return layout.view_or_rows(None, input, _shape_arg(shape), view=False)


@torch_handler(
    family="indexing",
    meaning="the array itself for `other`'s shape (`x.view_as(y)`, `x.reshape_as(y)`)",
    methods=("view_as", "reshape_as"),
)
@_any_layout
def _view_as(self: RaggedArray, other: Any) -> RaggedArray:
    return layout.reshape(None, self, tuple(other.shape), view=False)


@torch_handler(
    torch.unsqueeze,
    methods=("unsqueeze",),
    family="indexing",
    meaning="a size-1 axis at `dim` (of the result), anywhere after the batch axis",
    see=("RaggedArray.__getitem__",),
)
@_any_layout
def _unsqueeze(input: RaggedArray, dim: int) -> RaggedArray:
    if input.axes is not None:
        raise ValueError("a named array needs a name for its new axis: use x[..., None] unnamed.")
    d = layout.logical_dim(None, dim, input.ndim + 1)
    if d == 0:
        raise TypeError(f"`dim` {dim} {layout.MOVES_BATCH}.")
    shape = list(input.shape)
    return layout.reshape(None, input, [*shape[:d], 1, *shape[d:]], view=True)


@torch_handler(
    torch.squeeze,
    methods=("squeeze",),
    family="indexing",
    meaning="removes size-1 inner axes (all of them, or `dim`)",
)
@_any_layout
def _squeeze(input: RaggedArray, dim: Any = None) -> RaggedArray:
    n = input.ndim
    dims = range(1, n) if dim is None else dim if isinstance(dim, (tuple, list)) else (dim,)
    shape = list(input.shape)
    drop = set()
    for d in dims:
        k = layout.logical_dim(None, d, n)
        if k == 0 or isinstance(shape[k], RaggedSize):
            if dim is None:
                continue
            raise TypeError(f"`dim` {d} {RESHAPES_RAGGED}.")
        if shape[k] == 1:
            drop.add(k)
    if not drop:
        return input
    if input.axes is not None:
        names = tuple(a for i, a in enumerate(input.axes) if i not in drop)
        return input.rename(None).squeeze(tuple(drop)).rename(*names)
    kept = [s for i, s in enumerate(shape) if i not in drop]
    return layout.reshape(None, input, kept, view=True)


@torch_handler(
    torch.flatten,
    methods=("flatten",),
    family="indexing",
    meaning="flattens axes `start_dim..end_dim` (inner axes: no copy); the batch and ragged "
    "axes (`flatten(0, 1)`): the rows, a FlatArray as `view(-1, C)`; all axes (the default): "
    "every entry in order, a dense 1-D tensor (`x.values.reshape(-1)`)",
)
@_any_layout
def _flatten(input: RaggedArray, start_dim: int = 0, end_dim: int = -1) -> Any:
    n = input.ndim
    a = layout.logical_dim(None, start_dim, n, "start_dim")
    b = layout.logical_dim(None, end_dim, n, "end_dim")
    if a == 0 and b == n - 1 and input.order is None:
        return input.values.reshape(-1)
    shape = list(input.shape)
    if a == 0 and b == input.ragged_ndim:  # the batch and ragged axes: rows, a FlatArray
        return layout.merge_rows(None, input, [-1, *shape[b + 1 :]], view=False)
    if a == 0 or any(isinstance(s, RaggedSize) for s in shape[a : b + 1]):
        raise TypeError(f"`start_dim`..`end_dim` ({start_dim}..{end_dim}) {RESHAPES_RAGGED}.")
    if a >= b:
        return input
    return layout.reshape(None, input, [*shape[:a], -1, *shape[b + 1 :]], view=False)


@torch_handler(
    torch.unflatten,
    methods=("unflatten",),
    family="indexing",
    meaning="splits an inner axis into `sizes`",
)
@_any_layout
def _unflatten(input: RaggedArray, dim: int, sizes: Any) -> RaggedArray:
    d = layout.logical_dim(None, dim, input.ndim)
    shape = list(input.shape)
    if d == 0 or isinstance(shape[d], RaggedSize):
        raise TypeError(f"`dim` {dim} {RESHAPES_RAGGED}.")
    new = [*shape[:d], *sizes, *shape[d + 1 :]]
    return layout.reshape(None, input, new, view=False)


def _split_inner(fn: Any, input: RaggedArray, pieces: Any, dim: int, chunk: bool) -> Any:
    vd = layout.storage_dim(fn, input, dim)
    parts = input.values.chunk(pieces, vd) if chunk else input.values.split(pieces, vd)
    return tuple(RaggedArray._trusted(v, input.partition, input.axes, input.order) for v in parts)


@torch_handler(
    torch.split,
    methods=("split",),
    family="combining",
    meaning="`dim=0`: groups of segments (`ragged.split`); an inner `dim` "
    "(`x.split(C, dim=2)`): views of the values along that axis",
    see=("ragged.split",),
)
@_any_layout
def _split(tensor: RaggedArray, split_size_or_sections: Any, dim: int = 0) -> Any:
    if isinstance(dim, int) and dim % max(tensor.ndim, 1) == 0:
        check_unchanged("torch.split", tensor, names=("tensor", ""))
        return ragged_split(tensor, split_size_or_sections)
    return _split_inner(None, tensor, split_size_or_sections, dim, chunk=False)


@torch_handler(
    torch.chunk,
    methods=("chunk",),
    family="combining",
    meaning="`chunks` views of the values along an inner `dim`",
)
@_any_layout
def _chunk(input: RaggedArray, chunks: int, dim: int = 0) -> Any:
    return _split_inner(None, input, chunks, dim, chunk=True)


@torch_handler(
    family="indexing",
    meaning="broadcasts size-1 inner axes to `sizes` (-1, the batch size and the array's own "
    "ragged sizes keep an axis)",
    methods=("expand",),
)
@_any_layout
def _expand(self: RaggedArray, *sizes: Any) -> RaggedArray:
    sizes = _shape_arg(sizes)
    shape = list(self.shape)
    if len(sizes) != len(shape):
        raise ValueError(f"`sizes` must have {len(shape)} entries (no new axes), got {sizes}.")
    order = layout.logical_order(self)
    lead = self.values.dim() - (self.ndim - self.ragged_ndim)
    target = list(self.values.shape)
    for d, (want, have) in enumerate(zip(sizes, shape, strict=True)):
        if d == 0 or isinstance(have, RaggedSize) or (isinstance(want, int) and want == -1):
            continue
        target[lead + order[d - 1] - self.ragged_ndim] = want
    return RaggedArray._trusted(self.values.expand(target), self.partition, self.axes, self.order)


def _new(fill: Any, name: str) -> Callable[..., Any]:
    def new(self: RaggedArray, *size: Any, **options: Any) -> Any:
        value = fill
        if fill is None:  # new_full: the fill value follows the size
            given = (*size, options.pop("fill_value")) if "fill_value" in options else size
            size, value = given[:-1], given[-1]
        return layout.new_filled(self, _shape_arg(tuple(size)), value, **options)

    new.__name__ = new.__qualname__ = f"_{name}"
    return new


for _name, _fill in (("new_zeros", 0), ("new_ones", 1), ("new_empty", 0), ("new_full", None)):
    torch_handler(
        family="tensor",
        meaning="a dense tensor for a dense `size`; for a size with the array's RaggedSize "
        "entries (`x.new_zeros(x.shape[:-1] + (n,))`), a RaggedArray of that partition"
        + (" (filled with zeros)" if _name == "new_empty" else ""),
        methods=(_name,),
        grad=False,
    )(_any_layout(_new(_fill, _name)))


# --- Tensor-style properties and conversions ----------------------------------------------------


@overload
def _size(self: RaggedArray, dim: None = None) -> RaggedShape: ...
@overload
def _size(self: RaggedArray, dim: int) -> int | RaggedSize: ...
@torch_function(
    family="tensor",
    meaning="`x.size()`: the RaggedShape, a tuple; `x.size(d)`: an int, or the RaggedSize of a "
    "ragged axis",
    methods=("size",),
    see=("RaggedArray.shape",),
    grad=False,
)
@_sequence_first
def _size(self: RaggedArray, dim: int | None = None) -> Any:
    if dim is None:
        return self.shape
    size = self.shape[layout.logical_dim(None, dim, self.ndim)]
    if type(size) is RaggedSize and not torch.compiler.is_compiling():
        _refuse_sequence_first()
    return size


_RNN_GLOBALS = vars(torch.nn.modules.rnn)


def _refuse_sequence_first() -> None:
    """``nn.LSTM``/``nn.GRU``/``nn.RNN`` with ``batch_first=False`` read the batch size as
    ``input.size(1)``, the ragged axis of a RaggedArray: name ``batch_first`` (torch would fail
    later, building its initial state from a RaggedSize)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return
        if frame.f_globals is _RNN_GLOBALS:
            raise ValueError(
                f"nn.{type(frame.f_locals.get('self')).__name__}: `batch_first` must be True for "
                "a RaggedArray (B, L*, C): the sequence-first layout puts the ragged axis before "
                "the batch; got False."
            )
        frame = frame.f_back


@torch_function(
    family="tensor",
    meaning="the number of axes, `x.ndim`",
    methods=("dim", "ndimension"),
    see=("RaggedArray.ndim",),
    grad=False,
)
@_sequence_first
def _dim(self: RaggedArray) -> int:
    refuse_nn_init()  # xavier_*, kaiming_normal_, orthogonal_, eye_ read it before writing
    return self.ndim


@torch_function(
    torch.numel,
    family="tensor",
    meaning="the number of entries (of the values)",
    methods=("numel", "nelement"),
    grad=False,
)
@_sequence_first
def _numel(input: RaggedArray) -> int:
    return input.values.numel()


@torch_function(
    torch.is_floating_point,
    family="tensor",
    meaning="whether the values are floating point",
    methods=("is_floating_point",),
    grad=False,
)
@_sequence_first
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
@_sequence_first
def _requires_grad_(self: RaggedArray, requires_grad: bool = True) -> RaggedArray:
    self.values.requires_grad_(requires_grad)
    return self


@torch_function(
    family="tensor",
    meaning="values and offsets on the CPU",
    methods=("cpu",),
    see=("RaggedArray.to",),
)
@_any_layout
def _cpu(self: RaggedArray, memory_format: Any = torch.preserve_format) -> RaggedArray:
    return self.to("cpu", memory_format=memory_format)


@torch_function(
    family="tensor",
    meaning="values and offsets on a CUDA device",
    methods=("cuda",),
    see=("RaggedArray.to",),
    compile=False,
)
@_any_layout
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
@_any_layout
def _type_as(self: RaggedArray, other: Any) -> RaggedArray:
    return self.to(device=other.device, dtype=other.dtype)


@torch_function(
    torch.unbind,
    family="indexing",
    meaning="`dim=0`: the segments, as `x.unbind()`; an inner `dim`: one array per index",
    see=("ragged.unbind",),
    grad=True,
    compile=False,
)
@_any_layout
def _unbind(input: RaggedArray, dim: int = 0) -> tuple[Any, ...]:
    if layout.logical_dim(None, dim, input.ndim) == 0:
        return input.unbind()
    return layout.unbind_dim(None, input, dim)
