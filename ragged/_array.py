"""RaggedArray: an immutable array with ragged axes, stored as flat values plus a partition."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from types import FunctionType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from . import _convert, _format, _layout
from ._axes import AxisNames, check_names
from ._errors import name_of, type_error, typename, value_error
from ._partition import Partition, Pickled
from ._registry import public
from ._segment_ids import segment_ids_view
from ._shape import RaggedShape
from ._versions import Parameter

_is_compiling = torch.compiler.is_compiling
ITERATION_UNDER_COMPILE = (
    "RaggedArray: iterating the segments under torch.compile would read every length (their "
    "sizes are data: one graph per batch); x.unbind() reads them explicitly, ragged.vmap(fn)(x) "
    "maps a function over the segments."
)
_inference_mode = torch.is_inference_mode_enabled

if TYPE_CHECKING:
    from ._tensor_methods import TensorMethods  # x.sum(dim, keepdim), x.exp(), ...: typing only
else:
    TensorMethods = object

__all__ = ["RaggedArray"]

# The dispatch table of ``RaggedArray.__torch_function__``: torch function -> its handler, which
# takes torch's arguments. ``ragged.ops._torch.install`` fills it from the registry once the ops
# have loaded (the class never imports its ops); the entry under ``None`` raises the error for a
# function without a handler. ``TORCH_PYTHON_FUNCTIONS`` lists its entries whose keys are Python
# functions, for the lookup by identity that torch.compile needs for some of them.
TORCH_FUNCTIONS: dict[Any, Callable[..., Any]] = {}
TORCH_PYTHON_FUNCTIONS: list[tuple[Any, Callable[..., Any]]] = []
NOT_DENSE = (
    "RaggedArray: a RaggedArray is no dense tensor, so torch.as_tensor, torch.tensor, "
    "torch.asarray, torch.from_dlpack and numpy.asarray cannot convert it; use x.values (the "
    "rows of every segment back to back) or x.to_padded() (a dense (B, L, ...) tensor, with "
    "x.to_mask() for its real positions)."
)
_compiling = torch.compiler.is_compiling


@public("arrays")
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class RaggedArray(Pickled, TensorMethods):
    """An immutable array of logical shape ``(B, L*, *inner)`` whose axis 1 is ragged.

    Segment ``b`` is the dense tensor ``values[offsets[b]:offsets[b + 1]]`` of shape
    ``(lengths[b], *inner)``. Only ``values`` is a pytree leaf; the partition (offsets and
    static metadata) and the axis names ride in the pytree context, so ``torch.func`` transforms
    and ``torch.compile`` accept and return RaggedArrays.

    The semantics of every op is the same op applied to each segment separately. For an op
    ``f`` that keeps the ragged axis this reference loop is the specification:

    ```python
    def reference(f, x):
        return ragged.array([f(x.values[a:b]) for a, b in pairwise(x.offsets.tolist())])
    ```

    Build RaggedArrays with the validating factories ([`ragged.array`][ragged.array],
    [`ragged.from_lengths`][ragged.from_lengths], [`ragged.from_offsets`][ragged.from_offsets], ...). This constructor trusts the
    partition's data and checks only what costs nothing: that ``partition`` is a Partition and
    ``values`` has one row per child of its last level (the partition itself checks its index
    tensors' dtypes, devices and sizes when it is built; a ``values`` device that differs is
    left to the first op, whose torch kernels reject it). Neither edits its tensors in
    place afterwards: ops check the version counters recorded here (``docs/semantics.md``,
    Immutability).

    Attributes:
        values: ``[total, *inner]`` tensor holding the segments back to back.
        partition: the [`ragged.Partition`][ragged.Partition] of the ragged axes.
        axes: one unique name per logical axis, or ``None``.

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.arange(10.0).reshape(5, 2), [2, 0, 3])
    >>> x.shape, x.ndim, x.lengths
    (RaggedShape(3, [2, 0, 3], 2), 3, tensor([2, 0, 3]))
    >>> x[2]
    tensor([[4., 5.],
            [6., 7.],
            [8., 9.]])
    """

    values: Tensor
    partition: Partition
    axes: AxisNames | None = None
    # The logical order of the non-batch axes (``None``: the storage order); ragged._layout.
    order: tuple[int, ...] | None = None
    # The version counter of ``values`` when built (``None``: not checked); ragged._versions.
    _values_version: int | None = dataclasses.field(init=False, repr=False)

    def __init__(
        self,
        values: Tensor,
        partition: Partition,
        axes: AxisNames | None = None,
        order: tuple[int, ...] | None = None,
    ) -> None:
        # Written straight into __dict__ (the frozen dataclass's __setattr__ refuses, and
        # object.__setattr__ costs more): this runs once per op on tiny inputs too.
        state = self.__dict__
        state["values"] = values
        state["partition"] = partition
        state["axes"] = axes
        state["order"] = order
        state["_values_version"] = None
        if type(partition) is not Partition:
            raise type_error(
                RaggedArray, "partition", "must be a ragged.Partition", typename(partition)
            )
        cls = type(values)
        if (cls is not Tensor and cls is not Parameter) or _is_compiling():
            # Not a plain tensor: a pytree prefix for torch.func (``RaggedArray(0, p)`` as
            # ``in_dims``), or a fake/functional tensor while tracing, where sizes are symbolic.
            return
        rows = partition._rows
        # Leading batch dims are allowed: torch.func.vmap takes and returns such arrays.
        if values.dim() == 0 or (values.shape[0] != rows and rows not in values.shape):
            expected = f"must have one row per value of the partition ({rows})"
            raise value_error(RaggedArray, "values", expected, f"shape {tuple(values.shape)}")
        if not _inference_mode():  # tensors made there have no version counter
            try:  # noqa: SIM105  (contextlib.suppress costs a third of this constructor)
                state["_values_version"] = values._version
            except RuntimeError:  # an inference tensor made earlier
                pass

    @classmethod
    def _trusted(
        cls,
        values: Any,
        partition: Partition,
        axes: AxisNames | None,
        order: tuple[int, ...] | None = None,
    ) -> RaggedArray:
        """The constructor without checks (it still records the version counter), for pytree
        unflattening, where ``torch.func`` rebuilds nodes around anything (batched outputs with
        extra leading dims, nested structures under ``jacrev``, ints under ``vmap``, ``None``
        under ``tree_map``), and for the results of hot ops, which are valid by construction."""
        x = object.__new__(cls)
        state = x.__dict__
        state["values"] = values
        state["partition"] = partition
        state["axes"] = axes
        state["order"] = order
        state["_values_version"] = None
        kind = type(values)
        if (kind is Tensor or kind is Parameter) and not _is_compiling() and not _inference_mode():
            try:  # noqa: SIM105  (values_version, inlined: this runs once per op)
                state["_values_version"] = values._version
            except RuntimeError:  # an inference tensor made earlier
                pass
        return x

    # --- structure -------------------------------------------------------------------------

    @property
    def offsets(self) -> Tensor:
        """Offsets of the first ragged axis into its rows, int64 ``[B + 1]``."""
        return self.partition.levels[0].offsets

    @property
    def lengths(self) -> Tensor:
        """Per-segment lengths of the first ragged axis, int64 ``[B]``."""
        return self.partition.levels[0].lengths

    @property
    def num_segments(self) -> int:
        """``B``, the number of segments."""
        return self.partition.levels[0].lengths.shape[0]

    @property
    def shape(self) -> RaggedShape:
        """The logical shape, a tuple; each ragged axis appears as a
        [`RaggedSize`][ragged.RaggedSize] (printed with its lengths).

        >>> import ragged
        >>> ragged.array([[[1, 2]], [[3, 4], [5, 6]]]).shape
        RaggedShape(2, [1, 2], 2)
        """
        return RaggedShape(self.partition, tuple(self.values.shape[1:]), self.order)

    @property
    def inner_shape(self) -> torch.Size:
        """The dense shape ``inner`` of the values (in logical order; ``order`` says where the
        ragged axes sit among them)."""
        return self.values.shape[1:]

    @property
    def ragged_ndim(self) -> int:
        """Number of ragged axes (1 for ``(B, L*, *inner)``)."""
        return len(self.partition.levels)

    @property
    def ndim(self) -> int:
        """Number of logical axes: batch, ragged axes and inner axes."""
        return len(self.partition.levels) + self.values.dim()

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the values."""
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        """Device of the values (and of the offsets)."""
        return self.values.device

    @property
    def requires_grad(self) -> bool:
        """Whether the values require grad."""
        return self.values.requires_grad

    @property
    def grad(self) -> RaggedArray | None:
        """The gradient accumulated in ``values.grad`` by ``backward()``, as an array of this
        partition, or ``None`` (no gradient yet).

        >>> import ragged, torch
        >>> x = ragged.array([[1.0, 2.0], [3.0]]).requires_grad_()
        >>> ragged.sum(x * x, axis=1).sum().backward()
        >>> x.grad.to_list()
        [[2.0, 4.0], [6.0]]
        """
        grad = self.values.grad
        return None if grad is None else RaggedArray._trusted(grad, self.partition, self.axes)

    @property
    def segment_ids(self) -> Tensor:
        """The segment of each row of ``values``, int64 ``[total]`` (no copy, no sync).

        A property, like ``offsets`` and ``lengths``; the old call ``x.segment_ids()`` still
        returns the same tensor, with a ``DeprecationWarning``.

        >>> import ragged
        >>> ragged.array([[1, 2], [], [3]]).segment_ids
        tensor([0, 0, 2])
        """
        return segment_ids_view(self.partition.segment_ids())

    def __len__(self) -> int:
        return self.num_segments

    def __bool__(self) -> bool:
        raise TypeError(
            "RaggedArray: the truth value of an array is ambiguous; reduce it first "
            "(e.g. ragged.any(x) or ragged.all(x))."
        )

    # --- functional updates ----------------------------------------------------------------

    def with_values(self, values: Tensor, *, axes: Any = "keep") -> RaggedArray:
        """The same partition (the same object) with new ``values``.

        Args:
            values: ``[total, *new_inner]``; the leading size must match.
            axes: names for the result; by default the current names, which requires the
                number of inner axes to be unchanged.

        >>> import ragged, torch
        >>> x = ragged.array([[1.0, 2.0], [3.0]])
        >>> y = x.with_values(x.values * 10)
        >>> y.to_list(), y.partition is x.partition
        ([[10.0, 20.0], [30.0]], True)
        """
        func = RaggedArray.with_values
        if not isinstance(values, Tensor):
            raise type_error(func, "values", "must be a Tensor", type(values).__name__)
        if values.dim() == 0 or values.shape[0] != self.values.shape[0]:
            expected = f"must have shape [{self.values.shape[0]}, ...] (one row per value)"
            raise value_error(func, "values", expected, tuple(values.shape))
        ndim = len(self.partition.levels) + values.dim()
        if isinstance(axes, str) and axes == "keep":
            if self.axes is not None and ndim != self.ndim:
                raise type_error(
                    func,
                    "axes",
                    f"must be given when the number of axes changes ({self.ndim} -> {ndim})",
                    "no names",
                )
            names = self.axes
        else:
            names = check_names(func, axes, ndim)
        order = self.order
        if order is not None and ndim != self.ndim:
            raise ValueError(
                f"{name_of(func)}: a permuted array keeps its number of axes ({self.ndim}); "
                "move its axes back first (x.permute)."
            )
        return RaggedArray._trusted(values, self.partition, names, order)  # rows checked above

    def rename(self, *names: str | None, **mapping: str) -> RaggedArray:
        """The same array with new axis names (values and partition shared, not copied).

        Pass all names positionally (``None`` alone removes them), or rename some by keyword.

        >>> import ragged
        >>> x = ragged.array([[[1.0]], [[2.0], [3.0]]], axes=("batch", "seq", "feat"))
        >>> x.rename(seq="i").axes
        ('batch', 'i', 'feat')
        >>> x.rename(None).axes is None
        True
        """
        func = RaggedArray.rename
        if names and mapping:
            raise TypeError(f"{name_of(func)}: pass names positionally or by keyword, not both.")
        if names == (None,):
            return RaggedArray(self.values, self.partition, None, self.order)
        if names:
            named = check_names(func, names, self.ndim)
            return RaggedArray(self.values, self.partition, named, self.order)
        if self.axes is None:
            raise TypeError(
                f"{name_of(func)}: keyword renaming needs a named array, got unnamed axes."
            )
        unknown = sorted(set(mapping) - set(self.axes))
        if unknown:
            raise value_error(func, "mapping", f"must rename axes among {self.axes}", unknown)
        new = tuple(mapping.get(name, name) for name in self.axes)
        return RaggedArray(
            self.values, self.partition, check_names(func, new, self.ndim), self.order
        )

    def to(self, *args: Any, **kwargs: Any) -> RaggedArray:
        """Convert values like ``Tensor.to`` (dtype, device); offsets follow the device.

        The partition object is kept when the device does not change.

        >>> import ragged, torch
        >>> x = ragged.array([[1, 2], [3]])
        >>> y = x.to(torch.float64)
        >>> y.dtype, y.partition is x.partition
        (torch.float64, True)
        """
        values = self.values.to(*args, **kwargs)
        return RaggedArray(values, self.partition.to(values.device), self.axes, self.order)

    def pin_memory(self) -> RaggedArray:
        """Values and offsets in page-locked memory, for fast asynchronous copies to an
        accelerator; ``DataLoader(pin_memory=True)`` calls this on RaggedArray batches.

        Needs an accelerator (as ``Tensor.pin_memory``).
        """
        return RaggedArray(
            self.values.pin_memory(),
            self.partition.map_tensors(lambda t: t.pin_memory()),
            self.axes,
        )

    def detach(self) -> RaggedArray:
        """Values detached from the autograd graph; same partition."""
        return RaggedArray(self.values.detach(), self.partition, self.axes, self.order)

    def clone(self) -> RaggedArray:
        """A copy of the values; the (immutable) partition is shared."""
        return RaggedArray(self.values.clone(), self.partition, self.axes, self.order)

    def contiguous(self) -> RaggedArray:
        """Values made contiguous (no copy when they already are); same partition and order
        (where the ragged axes sit among the others is metadata: nothing to copy)."""
        return RaggedArray(self.values.contiguous(), self.partition, self.axes, self.order)

    # --- conversion ------------------------------------------------------------------------

    def to_padded(self, fill_value: float = 0, *, length: int | None = None) -> Tensor:
        """Dense ``(B, length, *inner)`` tensor; see [`ragged.to_padded`][ragged.to_padded]."""
        return _convert.to_padded(self, fill_value, length=length)

    def to_mask(self, *, length: int | None = None) -> Tensor:
        """Boolean ``(B, length)`` mask of real positions; see [`ragged.to_mask`][ragged.to_mask]."""
        return _convert.to_mask(self, length=length)

    def to_list(self) -> list:
        """Nested Python lists, one per segment; see [`ragged.to_list`][ragged.to_list]."""
        return _convert.to_list(self)

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The segments as a tuple of tensors; see [`ragged.unbind`][ragged.unbind]. An inner
        ``dim``: one array per index along it, as ``Tensor.unbind``."""
        if dim != 0:
            return _layout.unbind_dim(RaggedArray.unbind, self, dim)
        if self.order is not None:  # one-level: each segment's axes in the logical order
            if self.order[0] == 0:
                raise TypeError(
                    "RaggedArray.unbind: a sequence-first view (L*, B, ...) has no dense "
                    "slices along its ragged first axis; transpose it back (x.transpose(0, 1)) "
                    "for the segments."
                )
            if len(self.partition.levels) != 1:
                raise TypeError(
                    "RaggedArray.unbind: a permuted array with several ragged axes has no dense "
                    "segments; move its axes back first (x.permute)."
                )
            plain = RaggedArray._trusted(self.values, self.partition, None)
            dims = [k - 1 for k in self.order]
            return tuple(t.permute(dims) for t in _convert.unbind(plain))
        return _convert.unbind(self)

    def to_nested(self) -> Tensor:
        """A ``torch.nested`` jagged tensor sharing the values; see [`ragged.to_nested`][ragged.to_nested]."""
        return _convert.to_nested(self)

    def __iter__(self) -> Any:
        if _compiling():
            # The segments' sizes are data: iterating would read every length (one graph per
            # batch). HF's ModelOutput calls iter() on its first field and takes a TypeError
            # as "not a container of key/value pairs".
            raise TypeError(ITERATION_UNDER_COMPILE)
        return iter(self.unbind())

    # torch.as_tensor/tensor/asarray never dispatch to __torch_function__: they ask for DLPack
    # (``__dlpack_device__`` first), numpy for ``__array__``. No dense array: all refuse.
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(NOT_DENSE)

    def __dlpack_device__(self) -> Any:
        raise TypeError(NOT_DENSE)

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(NOT_DENSE)

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """torch functions take RaggedArrays: ``torch.sum(x, dim=1)``, ``F.gelu(x)``,
        ``nn.Linear(8, 4)(x)``; one dict lookup, then the handler generated from the op registry
        (see ``docs/torch.md``, "torch functions on RaggedArrays").
        """
        if type(func) is FunctionType and _compiling():
            # Dynamo (torch 2.13) misses in a dict some Python functions it traces, such as the
            # wrapper behind ``Tensor.__rdiv__`` that it calls for ``x / t`` (and a guard on the
            # miss fails at once): compare by identity (tests/test_torch.py compiles ``x / t``:
            # re-check this branch on a torch upgrade).
            handler = next((h for f, h in TORCH_PYTHON_FUNCTIONS if f is func), None)
        else:
            handler = TORCH_FUNCTIONS.get(func)
        if handler is None:
            return TORCH_FUNCTIONS[None](func, args, kwargs)
        if kwargs:
            return handler(*args, **kwargs)
        return handler(*args)

    def __repr__(self) -> str:
        if self.order is None:
            return _format.format_array(self)
        text = _format.format_array(RaggedArray._trusted(self.values, self.partition, None))
        return f"{text[:-1]}, order={self.order})" if text.endswith(")") else text

    # --- operators, indexing and x.mT ------------------------------------------------------
    # Installed from the table in ``ragged/ops/_methods.py`` once the ops load (the class and its
    # ops never import each other); declared here for type checkers only.

    if TYPE_CHECKING:

        def __getitem__(self, index: Any) -> Any: ...
        def __add__(self, other: Any) -> RaggedArray: ...
        def __radd__(self, other: Any) -> RaggedArray: ...
        def __sub__(self, other: Any) -> RaggedArray: ...
        def __rsub__(self, other: Any) -> RaggedArray: ...
        def __mul__(self, other: Any) -> RaggedArray: ...
        def __rmul__(self, other: Any) -> RaggedArray: ...
        def __truediv__(self, other: Any) -> RaggedArray: ...
        def __rtruediv__(self, other: Any) -> RaggedArray: ...
        def __floordiv__(self, other: Any) -> RaggedArray: ...
        def __rfloordiv__(self, other: Any) -> RaggedArray: ...
        def __mod__(self, other: Any) -> RaggedArray: ...
        def __rmod__(self, other: Any) -> RaggedArray: ...
        def __pow__(self, other: Any) -> RaggedArray: ...
        def __rpow__(self, other: Any) -> RaggedArray: ...
        def __eq__(self, other: Any) -> RaggedArray: ...  # type: ignore[override]
        def __ne__(self, other: Any) -> RaggedArray: ...  # type: ignore[override]
        def __lt__(self, other: Any) -> RaggedArray: ...
        def __le__(self, other: Any) -> RaggedArray: ...
        def __gt__(self, other: Any) -> RaggedArray: ...
        def __ge__(self, other: Any) -> RaggedArray: ...
        def __and__(self, other: Any) -> RaggedArray: ...
        def __rand__(self, other: Any) -> RaggedArray: ...
        def __or__(self, other: Any) -> RaggedArray: ...
        def __ror__(self, other: Any) -> RaggedArray: ...
        def __xor__(self, other: Any) -> RaggedArray: ...
        def __rxor__(self, other: Any) -> RaggedArray: ...
        def __invert__(self) -> RaggedArray: ...
        def __neg__(self) -> RaggedArray: ...
        def __pos__(self) -> RaggedArray: ...
        def __abs__(self) -> RaggedArray: ...
        def __matmul__(self, other: Any) -> RaggedArray: ...
        def __rmatmul__(self, other: Any) -> RaggedArray: ...
        @property
        def mT(self) -> Any: ...
        @property
        def is_nested(self) -> bool: ...

    __hash__ = object.__hash__  # `==` is elementwise; identity hashing, as for torch.Tensor


# A RaggedArray is a sequence of its segments (``len``, iteration, ``x[b]``): so
# ``torch.testing.assert_close`` compares two of them segment by segment, and a mismatch names
# the segment ("item [b]") and the row within it.
Sequence.register(RaggedArray)
