"""FlatArray: a RaggedArray with its batch and ragged axes merged into one axis of rows.

``x.view(-1, C)`` (``reshape``, ``flatten(0, 1)``) of a ``(B, L*, C)`` RaggedArray is the
``(N, C)`` array of its rows, ``N`` the total length: the values, with the partition kept so
that ``view(size_out)`` with the array's own sizes (``x.size()[:-1] + (nf,)``) turns the rows
back into a RaggedArray. GPT-2's ``Conv1D`` is written so::

    size_out = x.size()[:-1] + (self.nf,)
    x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
    x = x.view(size_out)

The class holds the data and the dispatch of torch functions; what it answers (matmul, addmm,
linear, the pointwise functions, ``view`` back) is installed by ``ragged.ops._torch._flat_rows``
once the ops load, as for RaggedArray (the core never imports its ops).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from types import FunctionType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._errors import type_error, typename, value_error
from ._partition import Partition
from ._registry import public

__all__ = ["FLAT_FUNCTIONS", "FLAT_PYTHON_FUNCTIONS", "FlatArray"]

# torch function -> handler, for ``FlatArray.__torch_function__`` (filled once the ops load;
# the entry under ``None`` raises the error for any other function). The Python functions among
# the keys are listed again for the lookup by identity that torch.compile needs (as RaggedArray).
FLAT_FUNCTIONS: dict[Any, Callable[..., Any]] = {}
FLAT_PYTHON_FUNCTIONS: list[tuple[Any, Callable[..., Any]]] = []
_compiling = torch.compiler.is_compiling


@public("arrays")
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class FlatArray:
    """The rows of a RaggedArray as one ``(N, *inner)`` array: ``x.view(-1, C)``.

    ``N`` is the total number of rows (``values.shape[0]``, a plain int, known without reading
    the lengths). It keeps the partition, so ``view`` / ``reshape`` with the array's own sizes
    (a shape with its [`RaggedSize`][ragged.RaggedSize] entries, e.g. ``x.size()[:-1] + (nf,)``)
    turns it back into a RaggedArray. In between, it takes what a row-wise layer does to an
    ``(N, C)`` tensor: ``torch.addmm(bias, flat, w)``, ``flat @ w``, ``F.linear``, the
    pointwise functions and operators (numbers and dense operands broadcast as against an
    ``(N, C)`` tensor), ``F.layer_norm`` and ``softmax`` over an inner axis, ``view`` /
    ``reshape`` of the inner axes. Anything that mixes rows (a reduction over ``N``, ``w @
    flat``, indexing) raises a TypeError: use ``flat.values``, the ``[N, C]`` tensor, for those.

    A pytree (``values`` is the leaf, the partition the context): ``torch.func`` and
    ``torch.compile`` take it as they take RaggedArrays.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]])
    >>> size_out = x.size()[:-1] + (3,)
    >>> flat = x.view(-1, x.size(-1))
    >>> flat.shape
    torch.Size([3, 2])
    >>> y = torch.addmm(torch.zeros(3), flat, torch.ones(2, 3)).view(size_out)
    >>> y.shape, y.partition is x.partition
    (RaggedShape(2, [2, 1], 3), True)

    Attributes:
        values: ``[N, *inner]``, the rows (shared with the array it came from).
        partition: the [`ragged.Partition`][ragged.Partition] of those rows.
    """

    values: Tensor
    partition: Partition

    def __init__(self, values: Tensor, partition: Partition) -> None:
        state = self.__dict__
        state["values"] = values
        state["partition"] = partition
        if type(partition) is not Partition:
            raise type_error(
                FlatArray, "partition", "must be a ragged.Partition", typename(partition)
            )
        if isinstance(values, Tensor) and not _compiling():
            rows = partition.num_values
            if values.dim() == 0 or (values.shape[0] != rows and rows not in values.shape):
                expected = f"must have one row per value of the partition ({rows})"
                raise value_error(FlatArray, "values", expected, f"shape {tuple(values.shape)}")

    @classmethod
    def _trusted(cls, values: Any, partition: Partition) -> FlatArray:
        """The constructor without checks (pytree unflattening and the ops' results)."""
        flat = object.__new__(cls)
        state = flat.__dict__
        state["values"] = values
        state["partition"] = partition
        return flat

    @property
    def shape(self) -> torch.Size:
        """``(N, *inner)``: the rows, then the inner sizes (the values' shape)."""
        return self.values.shape

    def size(self, dim: int | None = None) -> Any:
        """``flat.size()``: ``shape``; ``flat.size(d)``: one size, as ``Tensor.size``."""
        return self.values.shape if dim is None else self.values.shape[dim]

    @property
    def ndim(self) -> int:
        """Number of axes: the rows and the inner axes."""
        return self.values.dim()

    def dim(self) -> int:
        """``ndim``, as ``Tensor.dim``."""
        return self.values.dim()

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the values."""
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        """Device of the values."""
        return self.values.device

    @property
    def requires_grad(self) -> bool:
        """Whether the values require grad."""
        return self.values.requires_grad

    def __len__(self) -> int:
        return self.values.shape[0]

    def __bool__(self) -> bool:
        raise TypeError("FlatArray: the truth value of an array is ambiguous.")

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """torch functions take FlatArrays through one dict lookup (``FLAT_FUNCTIONS``)."""
        if isinstance(func, FunctionType) and _compiling():
            # As RaggedArray.__torch_function__: Dynamo misses some traced Python functions in
            # a dict lookup (Tensor.__rdiv__'s wrapper); compare by identity there.
            handler = next((h for f, h in FLAT_PYTHON_FUNCTIONS if f is func), None)
        else:
            handler = FLAT_FUNCTIONS.get(func)
        if handler is None:
            return FLAT_FUNCTIONS[None](func, args, kwargs)
        return handler(*args, **kwargs) if kwargs else handler(*args)

    def __repr__(self) -> str:
        return f"FlatArray({self.values!r}, rows of {self.partition.num_segments} segments)"

    # Tensor-style methods and operators, installed by ragged.ops._torch._flat_rows.
    if TYPE_CHECKING:

        def view(self, *shape: Any) -> Any: ...
        def reshape(self, *shape: Any) -> Any: ...
        def __add__(self, other: Any) -> FlatArray: ...
        def __radd__(self, other: Any) -> FlatArray: ...
        def __sub__(self, other: Any) -> FlatArray: ...
        def __rsub__(self, other: Any) -> FlatArray: ...
        def __mul__(self, other: Any) -> FlatArray: ...
        def __rmul__(self, other: Any) -> FlatArray: ...
        def __truediv__(self, other: Any) -> FlatArray: ...
        def __rtruediv__(self, other: Any) -> FlatArray: ...
        def __pow__(self, other: Any) -> FlatArray: ...
        def __neg__(self) -> FlatArray: ...
        def __matmul__(self, other: Any) -> FlatArray: ...

    __hash__ = object.__hash__
