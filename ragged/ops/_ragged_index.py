"""``torch.arange(T)`` of a ragged size: the positions along a ragged axis, as mask code builds
them.

Model code builds attention masks from index arithmetic: HF ``transformers``' ``sdpa_mask``
takes ``torch.arange(q_length)`` and ``torch.arange(kv_length)``, lays them out as
``(1, 1, T, 1)`` and ``(1, 1, 1, T)``, looks the positions up in ``position_ids[batch, q]`` and
compares them (``kv <= q``). With ``T`` the [`RaggedSize`][ragged.RaggedSize] of a ragged axis
there is no single ``T``: the arange has one length per segment. A
[`RaggedIndex`][ragged.RaggedIndex] is that arange: one value per position of the axis (the
positions ``0..L_b-1`` of every segment), laid out in a dense broadcast shape where the ragged
axis stands at one place and every other axis has size 1, axis 0 standing for the batch.
Its arithmetic keeps the layout; two of them laid out along different axes broadcast into the
segments' pair map (``docs/semantics.md``, "torch.arange of a ragged size"), never a padded
``(B, T, T)``. Nothing reads the lengths: the same code runs under ``torch.compile``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import type_error, typename, value_error
from .._partition import Partition
from .._registry import public
from .._shape import RaggedSize, set_arange
from ._pairs import outer

__all__ = ["RaggedIndex", "arange", "index_rows"]

ARANGE = "torch.arange"
GETITEM = "RaggedArray.__getitem__"


@public("arrays")
class RaggedIndex:
    """One value per position of a ragged axis in a dense broadcast layout: what
    ``torch.arange(T)`` gives for a [`RaggedSize`][ragged.RaggedSize] ``T``.

    ``values`` holds one entry per row of the axis (its segments' positions ``0..L_b-1`` after
    ``torch.arange``), and the layout says where the ragged axis stands among ``ndim`` axes
    whose others have size 1 (axis 0 stands for the batch). Indexing with ``None`` and ``:``
    moves it, as for a 1-D tensor (``i[None, None, :, None]``); arithmetic and comparisons with
    numbers, or with an index of the same layout, act entry by entry; with an index laid out
    along another axis (the next one) they broadcast into the pair map of every segment, a
    [`RaggedArray`][ragged.RaggedArray] ``(B, ..., N*, M*)`` (``sum_b L_b^2`` entries, never
    padded). ``x[b, i]`` of a ``(B, L*)`` array ``x`` (``b`` the batch index
    ``torch.arange(B)`` laid out along axis 0, or ``:``) reads ``x`` at those positions and
    keeps the layout. HF ``transformers`` builds its packed-sequence causal mask this way while
    ``torch.compile`` traces (``docs/models.md``).

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 2.0], [3.0]])
    >>> B, T = x.shape
    >>> i = torch.arange(T)
    >>> i
    RaggedIndex([[0, 1], [0]], shape=(T,))
    >>> causal = i[None, :, None] >= i[None, None, :]  # (B, L*, L*): the causal pair mask
    >>> causal.shape, causal.to_list()
    (RaggedShape(2, [2, 1], [[2, 2], [1]]), [[[True, False], [True, True]], [[True]]])
    """

    __slots__ = ("axis", "level", "ndim", "partition", "values")
    __hash__ = None  # type: ignore[assignment]  # == is elementwise

    def __init__(self, values: Tensor, size: RaggedSize, ndim: int = 1, axis: int = 0) -> None:
        self.values = values
        self.partition: Partition = size.partition
        self.level = size.level
        self.ndim = ndim
        self.axis = axis

    @property
    def size(self) -> RaggedSize:
        """The ragged size ``T`` this index runs along."""
        return RaggedSize(self.partition, self.level)

    @property
    def shape(self) -> tuple[Any, ...]:
        """``(1, ..., T, ..., 1)``: ``T`` at the ragged axis."""
        return tuple(self.size if d == self.axis else 1 for d in range(self.ndim))

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def _with(self, values: Tensor, ndim: int | None = None, axis: int | None = None) -> Any:
        return RaggedIndex(
            values,
            self.size,
            self.ndim if ndim is None else ndim,
            self.axis if axis is None else axis,
        )

    def to(self, *args: Any, **kwargs: Any) -> RaggedIndex:
        """The same index with ``values.to(*args, **kwargs)``."""
        return self._with(self.values.to(*args, **kwargs))

    def new_ones(self, size: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> Tensor:
        """``torch.ones(())`` of a scalar (the seed of HF's ``and_masks``); other shapes refuse."""
        return _new_scalar(self, size, 1, dtype, device, "new_ones")

    def new_zeros(self, size: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> Tensor:
        """``torch.zeros(())`` of a scalar (the seed of HF's ``or_masks``)."""
        return _new_scalar(self, size, 0, dtype, device, "new_zeros")

    def unsqueeze(self, dim: int) -> RaggedArray:
        """``torch.arange(T).unsqueeze(0)``: the batch axis in front, i.e. the positions of every
        segment as a ``(B, L*)`` RaggedArray (HF Llama builds its default ``position_ids`` so).
        Other layouts come from indexing with ``None``."""
        if self.ndim != 1 or dim != 0:
            raise value_error(
                "RaggedIndex.unsqueeze",
                "dim",
                "must be 0 on a 1-D index (the batch axis: a (B, L*) array; lay an index out "
                "for masks with None, i[None, :, None])",
                dim,
            )
        levels = self.partition.levels
        if self.level == len(levels) - 1:
            return RaggedArray(self.values, self.partition)
        return RaggedArray(self.values, Partition(levels[: self.level + 1]))

    def __invert__(self) -> RaggedIndex:
        return self._with(~self.values)

    def __neg__(self) -> RaggedIndex:
        return self._with(-self.values)

    def __getitem__(self, index: Any) -> RaggedIndex:
        items = index if isinstance(index, tuple) else (index,)
        slots = [k for k, item in enumerate(items) if item is not None]
        bad = [
            item
            for item in items
            if item is not None and item is not Ellipsis and item != slice(None)
        ]
        if bad or len(slots) != 1 or self.ndim != 1:
            raise type_error(
                "RaggedIndex.__getitem__",
                "index",
                "must be `None` entries and one `:` or `...` on a 1-D index (a layout such as "
                "`i[None, :, None]`)",
                repr(index),
            )
        return self._with(self.values, len(items), slots[0])

    def __repr__(self) -> str:
        lengths = self.partition.levels[self.level].lengths.tolist()  # printing reads them
        rows = [row.tolist() for row in self.values.split(lengths)]
        shape = ", ".join("T" if d == self.axis else "1" for d in range(self.ndim))
        return f"RaggedIndex({rows}, shape=({shape}{',' if self.ndim == 1 else ''}))"

    def _binary(self, other: Any, op: Callable[[Any, Any], Any], swap: bool = False) -> Any:
        if isinstance(other, RaggedIndex):
            if not other.size == self.size or other.ndim != self.ndim:
                raise value_error(
                    f"RaggedIndex `{_symbol(op)}`",
                    "other",
                    f"must be an index of the same ragged axis with {self.ndim} axes",
                    f"an index with {other.ndim} axes"
                    if other.size == self.size
                    else "an index over another ragged axis",
                )
            if other.axis == self.axis:
                a, b = (other, self) if swap else (self, other)
                return self._with(op(a.values, b.values))
            return _pair(*((other, self) if swap else (self, other)), op)
        if isinstance(other, RaggedArray):
            return _against_pairs(self, other, op, swap)
        if isinstance(other, (int, float, bool, torch.SymInt)) or (
            isinstance(other, Tensor) and other.dim() == 0
        ):
            return self._with(op(other, self.values) if swap else op(self.values, other))
        raise type_error(
            f"RaggedIndex `{_symbol(op)}`",
            "other",
            "must be a number, a 0-d tensor, a RaggedIndex of the same ragged axis or a pair map "
            "built from such indexes",
            typename(other),
        )

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        """A tensor operator with a RaggedIndex operand (``torch.ones(()) & i``, HF's
        ``and_masks``) is the index's own; other torch functions refuse it."""
        op = _TENSOR_OPERATORS.get(func)
        if op is not None and len(args) == 2 and not kwargs:
            first, second = args
            if isinstance(first, RaggedIndex):
                return first._binary(second, op)
            if isinstance(second, RaggedIndex):
                return second._binary(first, op, swap=True)
        name = torch.overrides.resolve_name(func) or getattr(func, "__name__", "torch")
        raise TypeError(
            f"{name}: got a RaggedIndex (torch.arange of a ragged size), which takes numbers, "
            "0-d tensors, indexes of its axis and their pair maps in arithmetic and comparisons "
            "only; i.unsqueeze(0) gives the (B, L*) positions as a RaggedArray."
        )


def _against_pairs(
    index: RaggedIndex, pairs: RaggedArray, op: Callable[[Any, Any], Any], swap: bool
) -> RaggedArray:
    """``op`` of an index laid out along one ragged axis of a pair map built from indexes
    (``(1, 1, T, 1)`` against ``(B, 1, L*, L*)``): the index broadcast along the other one."""
    levels = pairs.partition.levels
    logical = _pair_axes(pairs)
    own = index.partition.levels[0]
    product = len(levels) == 2 and levels[1].columns is not None
    if not product or pairs.ndim != index.ndim or index.axis not in logical:
        raise value_error(
            f"RaggedIndex `{_symbol(op)}`",
            "other",
            f"must be a pair map with {index.ndim} axes whose ragged axes include the index's "
            f"axis {index.axis}",
            f"shape {pairs.shape}",
        )
    rows = levels[1].row_ids  # the pair map's query row of every pair
    if index.axis == logical[0]:
        if own is not levels[0]:
            raise _other_partition(op)
        picked = index.values.index_select(0, rows)
    else:
        columns = levels[1].columns
        if columns is None or own is not columns:
            raise _other_partition(op)
        segment = levels[0].row_ids.index_select(0, rows)
        picked = index.values.index_select(0, columns.offsets[segment] + levels[1].positions())
    picked = picked.reshape(-1, *[1] * (pairs.values.dim() - 1))
    values = op(pairs.values, picked) if swap else op(picked, pairs.values)
    return pairs.with_values(values)


def _pair_axes(pairs: RaggedArray) -> tuple[int, int]:
    """The logical axes of a pair map's two ragged axes (storage axes 1 and 2)."""
    order = (1, 2) if pairs.order is None else pairs.order
    return order.index(1) + 1, order.index(2) + 1


def _other_partition(op: Callable[..., Any]) -> ValueError:
    return value_error(
        f"RaggedIndex `{_symbol(op)}`",
        "other",
        "must be a pair map built from indexes of the same ragged size",
        "a pair map of another partition",
    )


def _symbol(op: Callable[..., Any]) -> str:
    return _SYMBOLS.get(op, getattr(op, "__name__", "op"))


_SYMBOLS: dict[Any, str] = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.floordiv: "//",
    operator.mod: "%",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
    operator.eq: "==",
    operator.ne: "!=",
    operator.and_: "&",
    operator.or_: "|",
    operator.xor: "^",
}


# Tensor operators that reach RaggedIndex.__torch_function__ with a tensor on the other side.
_ARITHMETIC = {"and": operator.and_, "or": operator.or_, "xor": operator.xor}
_ARITHMETIC |= {"add": operator.add, "sub": operator.sub, "mul": operator.mul}
_COMPARISONS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}
_COMPARISONS |= {"eq": operator.eq, "ne": operator.ne}
_TENSOR_OPERATORS: dict[Any, Callable[[Any, Any], Any]] = {
    getattr(Tensor, f"__{name}__"): op for name, op in (_ARITHMETIC | _COMPARISONS).items()
}
_TENSOR_OPERATORS |= {  # Tensor.__rsub__(t, i) is i - t
    getattr(Tensor, f"__r{name}__"): (lambda f: lambda a, b: f(b, a))(op)
    for name, op in _ARITHMETIC.items()
}


def _operator(op: Callable[[Any, Any], Any], swap: bool) -> Callable[..., Any]:
    if swap:
        return lambda self, other: self._binary(other, op, swap=True)
    return lambda self, other: self._binary(other, op)


for _name, _op in (_ARITHMETIC | {"floordiv": operator.floordiv, "mod": operator.mod}).items():
    setattr(RaggedIndex, f"__{_name}__", _operator(_op, False))
    setattr(RaggedIndex, f"__r{_name}__", _operator(_op, True))
for _name, _op in _COMPARISONS.items():  # no reflected forms: Python swaps comparisons itself
    setattr(RaggedIndex, f"__{_name}__", _operator(_op, False))


def _new_scalar(
    index: RaggedIndex, size: Any, fill: int, dtype: Any, device: Any, name: str
) -> Tensor:
    if tuple(size) != ():
        raise value_error(
            f"RaggedIndex.{name}",
            "size",
            "must be () (a scalar: a ragged layout has no dense form)",
            size,
        )
    return torch.full(
        (), fill, dtype=dtype or index.dtype, device=device if device is not None else index.device
    )


def _pair(first: RaggedIndex, second: RaggedIndex, op: Callable[[Any, Any], Any]) -> RaggedArray:
    """``op(first, second)`` of two indexes along different axes: the pair map of every segment,
    laid out as the two indexes are (their axes adjacent, the others of size 1)."""
    low, high = sorted((first.axis, second.axis))
    if low == 0 or high != low + 1:
        raise value_error(
            f"RaggedIndex `{_symbol(op)}`",
            "other",
            "must lie along the axis next to this one's, neither of them axis 0 (the batch)",
            f"indexes along axes {first.axis} and {second.axis}",
        )
    if len(first.partition.levels) != 1:
        raise value_error(
            f"RaggedIndex `{_symbol(op)}`",
            "self",
            "must run along the ragged axis of a one-level array (its pair map (B, L*, L*))",
            f"ragged axis {first.level + 1} of {len(first.partition.levels)}",
        )
    rows, cols = (first, second) if first.axis < second.axis else (second, first)
    a = RaggedArray(rows.values, rows.partition)
    b = RaggedArray(cols.values, cols.partition)
    pairs = outer(a, b, op if rows is first else lambda u, v: op(v, u))
    for d in range(1, first.ndim):
        if d not in (low, high):
            pairs = pairs.unsqueeze(d)
    return pairs


def arange(*args: Any, **kwargs: Any) -> RaggedIndex:
    """``torch.arange(T)`` / ``torch.arange(0, T)`` of a ragged size ``T``: the positions
    ``0..L_b-1`` of every segment as a [`RaggedIndex`][ragged.RaggedIndex]."""
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    refused = {
        "out": kwargs.get("out") is not None,
        "requires_grad": bool(kwargs.get("requires_grad", False)),
        "layout": kwargs.get("layout", torch.strided) not in (None, torch.strided),
        "pin_memory": bool(kwargs.get("pin_memory", False)),
    }
    for name, bad in refused.items():
        if bad:
            raise type_error(ARANGE, name, "is not taken for the positions of a ragged size", True)
    bounds = list(args) + [kwargs.pop(k) for k in ("start", "end", "step") if k in kwargs]
    unknown = sorted(set(kwargs) - set(refused))
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
    if unknown or not isinstance(end, RaggedSize) or start != 0 or step != 1:
        got = ", ".join(
            f"{name}={'a RaggedSize' if isinstance(v, RaggedSize) else repr(v)}"
            for name, v in (("start", start), ("end", end), ("step", step))
        )
        raise type_error(
            ARANGE,
            "end",
            "must be a ragged size T from x.shape as the only bound (`torch.arange(T)` or "
            "`torch.arange(0, T)`: the positions 0..L_b-1 of every segment)",
            got + (f", and {unknown}" if unknown else ""),
        )
    if dtype is None:  # as torch: a float bound gives the default float dtype
        dtype = torch.get_default_dtype() if isinstance(start, float) else torch.int64
    level = end.partition.levels[end.level]
    positions = level.positions().to(dtype=dtype)
    return RaggedIndex(positions if device is None else positions.to(device), end)


def index_rows(x: RaggedArray, index: tuple[Any, ...]) -> RaggedIndex:
    """``x[b, i]`` of a ``(B, L*)`` array: ``x``'s entries at the positions ``i`` (a
    RaggedIndex) of segment ``b`` (``:`` or a batch index tensor ``(B, 1, ..., 1)``)."""
    if len(index) != 2 or not isinstance(index[1], RaggedIndex):
        raise type_error(
            GETITEM,
            "index",
            "must be `x[b, i]` with `i` a RaggedIndex (torch.arange of a ragged size) and `b` "
            "`:` or the batch index torch.arange(B) laid out along axis 0",
            repr(index),
        )
    rows, positions = index
    if x.ndim != 2 or x.order is not None or x.ragged_ndim != 1:
        raise value_error(
            GETITEM, "x", "must be a (B, L*) array to read at a RaggedIndex", f"shape {x.shape}"
        )
    level = positions.partition.levels[positions.level]
    num = x.partition.num_segments
    if len(positions.partition.levels) != 1 or level.num_rows != num:
        raise value_error(
            GETITEM,
            "index",
            f"must hold the positions of a one-level array of {num} segments (x's batch)",
            f"positions of {level.num_rows} rows of ragged axis {positions.level + 1} of "
            f"{len(positions.partition.levels)}",
        )
    segment = level.row_ids
    if isinstance(rows, Tensor):
        expected = (num,) + (1,) * (positions.ndim - 1)
        if tuple(rows.shape) != expected:
            raise value_error(
                GETITEM,
                "index",
                f"must hold a batch index of shape {expected} (torch.arange(B) laid out along "
                "axis 0, as the RaggedIndex's axes)",
                f"shape {tuple(rows.shape)}",
            )
        segment = rows.reshape(-1)[segment]
    elif rows != slice(None):
        raise type_error(
            GETITEM, "index", "must hold `:` or a batch index tensor before the RaggedIndex", rows
        )
    if not torch.compiler.is_compiling():  # the positions must lie inside their rows
        inside = (positions.values >= 0) & (positions.values < x.partition.lengths[segment])
        if not bool(inside.all()):
            raise value_error(
                GETITEM,
                "index",
                "must hold positions inside the rows they read",
                "a position past its row",
            )
    flat = x.partition.offsets[segment] + positions.values
    return positions._with(x.values[flat])


set_arange(arange)  # torch.arange(T) of a RaggedSize (ragged._shape cannot import this module)
