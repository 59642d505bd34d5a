"""RaggedShape, the logical shape of a RaggedArray (a tuple), and RaggedSize, a ragged axis in it."""

from __future__ import annotations

import itertools
from typing import Any

from torch import Tensor

from ._partition import Partition
from ._registry import public

__all__ = ["RaggedShape", "RaggedSize", "set_arange"]

# torch.arange of a ragged size: ragged.ops._ragged_index (a higher layer) installs it.
_ARANGE: list[Any] = []


def set_arange(fn: Any) -> None:
    """Install ``fn`` as ``torch.arange`` of a ragged size (``ragged.ops._ragged_index``)."""
    _ARANGE[:] = [fn]


@public("arrays")
class RaggedSize:
    """The size of a ragged axis in a [`RaggedShape`][ragged.RaggedShape]: one object per
    ragged axis, like ``torch.nested``'s nested int ``j1``.

    It stands for the per-segment lengths without reading them (no host read, no guard under
    ``torch.compile``), and is accepted back where the array's own shape is accepted:
    ``x.view(B, T, h, d)``, ``x.reshape(*x.shape[:-1], -1)``, ``x.expand``, ``x.unflatten``.

    Comparisons (``docs/semantics.md``, Layouts and shapes): a ragged size equals itself (the
    same axis of the same partition) and no int; against ints it compares as an unknown size
    of at least 2, as ``torch.nested``'s nested int: ``T > 1``, ``T >= 2`` and ``T != 1`` are
    True, ``T < 2``, ``T <= 1`` and ``T == 1`` False; against itself as any size does (``T > T``
    False, ``T >= T`` True); ``T > 2`` or another ragged size (undecidable without the
    lengths) raises a TypeError, as do ``int(T)``, ``range(T)`` and indexing with it.

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0], [3.0]])
    >>> B, T = x.shape
    >>> T, T > 1, T == 1, T == x.shape[1], T.lengths
    (RaggedSize([2, 1]), True, False, True, tensor([2, 1]))
    """

    __slots__ = ("_level", "_partition")

    def __init__(self, partition: Partition, level: int) -> None:
        self._partition = partition
        self._level = level

    @property
    def lengths(self) -> Tensor:
        """The int64 lengths of this axis, one per row of the axis before it."""
        return self._partition.levels[self._level].lengths

    @property
    def partition(self) -> Partition:
        """The partition this axis belongs to."""
        return self._partition

    @property
    def level(self) -> int:
        """Which ragged axis of its partition (0: the first)."""
        return self._level

    def same_axis(self, partition: Partition, level: int) -> bool:
        """Whether this is ragged axis ``level`` of ``partition`` (shared level objects)."""
        return self._level == level and (
            self._partition is partition or self._partition.levels[level] is partition.levels[level]
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RaggedSize):
            return other.same_axis(self._partition, self._level)
        if isinstance(other, int):
            return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((id(self._partition.levels[self._level]), self._level))

    def _against(self, other: Any, op: str) -> int | None:
        """``other`` as an int; None for this same ragged size (``T > T`` is False, as for
        any size; HF's SDPA wrapper asks ``kv_length > q_length``)."""
        if isinstance(other, RaggedSize) and other == self:
            return None
        if isinstance(other, RaggedSize) or not isinstance(other, int):
            raise TypeError(
                f"RaggedSize: `{op}` compares a ragged size with ints and with itself only, got "
                f"{type(other).__name__}."
            )
        return other

    def _undecided(self, op: str, other: int) -> TypeError:
        return TypeError(
            f"RaggedSize: `T {op} {other}` depends on the lengths, which a ragged size does not "
            "read (it compares as an unknown size >= 2); compare T.lengths instead."
        )

    def __gt__(self, other: Any) -> bool:
        n = self._against(other, ">")
        if n is None or n <= 1:
            return n is not None
        raise self._undecided(">", n)

    def __ge__(self, other: Any) -> bool:
        n = self._against(other, ">=")
        if n is None or n <= 2:
            return True
        raise self._undecided(">=", n)

    def __lt__(self, other: Any) -> bool:
        return not self.__ge__(other)

    def __le__(self, other: Any) -> bool:
        return not self.__gt__(other)

    def _host(self, use: str) -> TypeError:
        return TypeError(
            f"RaggedSize: {use} needs one number, but a ragged axis has one length per segment "
            "(read them with T.lengths, a host read on an accelerator)."
        )

    def __index__(self) -> int:
        raise self._host("using a ragged size as an index or in range()")

    def __int__(self) -> int:
        raise self._host("int()")

    def __float__(self) -> float:
        raise self._host("float()")

    def __repr__(self) -> str:
        return f"RaggedSize({_summary(_nested_lengths(self._partition, self._level))})"

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        """``torch.arange(T)``: the positions of every segment, a
        [`RaggedIndex`][ragged.RaggedIndex]. Other torch functions leave a ragged size to a
        RaggedArray among their arguments, or refuse it (a dense shape needs one number)."""
        import torch

        if func is torch.arange and _ARANGE:
            return _ARANGE[0](*args, **(kwargs or {}))
        if any(t is not cls for t in types):
            return NotImplemented
        name = torch.overrides.resolve_name(func) or getattr(func, "__name__", "torch")
        raise TypeError(
            f"{name}: got a ragged size (RaggedSize) where a dense size is expected; it has one "
            "length per segment, a dense shape needs one number. Build the tensor from the "
            "array instead (x.new_ones(x.shape[:2]), torch.ones_like(x)), or use T.lengths."
        )


@public("arrays")
class RaggedShape(tuple):
    """The logical shape of a RaggedArray: a tuple ``(B, ..., L*, ...)``.

    A tuple, as ``torch.Size``: indexing, negative indices, slices (plain tuples),
    unpacking, ``len`` and ``+``. ``B`` and every dense axis are ints; each ragged axis is one
    [`ragged.RaggedSize`][ragged.RaggedSize], which ``view``, ``reshape``, ``expand`` and
    ``unflatten`` take back. Building a RaggedShape reads nothing; printing it reads the
    lengths (a host sync on an accelerator), as does comparing two RaggedShapes with distinct
    partitions.

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0], [], [3.0, 4.0, 5.0]])
    >>> s = x.shape
    >>> s
    RaggedShape(3, [2, 0, 3])
    >>> B, T = s
    >>> s[0], s[-1] is T, len(s), s[:1] + (4,)
    (3, True, 2, (3, 4))
    """

    _partition: Partition
    _inner: tuple[int, ...]
    _order: tuple[int, ...] | None

    def __new__(
        cls, partition: Partition, inner: tuple[int, ...], order: tuple[int, ...] | None = None
    ) -> RaggedShape:
        inner = tuple(inner)
        levels = partition.levels
        if len(levels) == 1:  # the common case, unrolled (x.shape is called often)
            stored: tuple[Any, ...] = (RaggedSize(partition, 0), *inner)
        else:
            stored = (*[RaggedSize(partition, k) for k in range(len(levels))], *inner)
        batch = levels[0].lengths.shape[0]
        if order is None:
            shape = tuple.__new__(cls, (batch, *stored))
        elif order[0] == 0:  # sequence-first (L*, B, ...): ragged._layout
            shape = tuple.__new__(cls, (stored[0], batch, *stored[1:]))
        else:
            shape = tuple.__new__(cls, (batch, *(stored[k - 1] for k in order)))
        state = shape.__dict__
        state["_partition"] = partition
        state["_inner"] = inner
        state["_order"] = order
        return shape

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self._partition, self._inner, self._order)

    @property
    def num_segments(self) -> int:
        """``B``."""
        return self._partition.num_segments

    @property
    def inner(self) -> tuple[int, ...]:
        """The dense sizes (in logical order)."""
        return self._inner

    @property
    def ragged_ndim(self) -> int:
        """Number of ragged axes."""
        return self._partition.ragged_ndim

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RaggedShape):
            return (
                self._inner == other._inner
                and self._order == other._order
                and self._partition.equals(other._partition)
            )
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def to_list(self) -> list[int | list]:
        """The shape with each ragged axis as nested Python lists of lengths (reads them)."""
        return [
            _nested_lengths(item._partition, item._level) if isinstance(item, RaggedSize) else item
            for item in self
        ]

    def text(self) -> str:
        """The shape as ``(B, [lengths], *inner)``; a ragged axis with more than ``SUMMARY``
        lengths (in one list) shows its first and last three and ``...``, as torch prints long
        tensors (it reads all the lengths, one transfer).

        >>> import ragged, torch
        >>> x = ragged.from_lengths(torch.zeros(500500, 2), torch.arange(1, 1001))
        >>> x.shape
        RaggedShape(1000, [1, 2, 3, ..., 998, 999, 1000], 2)
        """
        return "(" + ", ".join(_summary(part) for part in self.to_list()) + ")"

    def __repr__(self) -> str:
        return "RaggedShape" + self.text()


def _nested_lengths(partition: Partition, level_index: int) -> list:
    """The lengths of ragged axis ``level_index``, grouped by the levels above it (reads them)."""
    levels = partition.levels
    lengths: list = levels[level_index].lengths.tolist()
    for parent in reversed(levels[:level_index]):
        bounds = parent.offsets.tolist()
        lengths = [lengths[a:b] for a, b in itertools.pairwise(bounds)]
    return lengths


SUMMARY = 20  # lengths shown in full in one list; more show the first and last EDGE
EDGE = 3


def _summary(part: int | list) -> str:
    """``str(part)`` with long lists (at every depth) cut to their edges."""
    if not isinstance(part, list):
        return str(part)
    items = [_summary(p) for p in part]
    if len(items) > SUMMARY:
        items = [*items[:EDGE], "...", *items[-EDGE:]]
    return "[" + ", ".join(items) + "]"
