"""RaggedShape: the logical shape of a RaggedArray, with ragged axes shown as lengths."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from torch import Tensor

from ._partition import Partition
from ._registry import public

__all__ = ["RaggedShape"]


@public("arrays")
class RaggedShape:
    """The logical shape ``(B, L*, *inner)`` of a RaggedArray.

    Indexing gives a Python int for a dense axis and the int64 lengths tensor for a ragged
    axis. Building a RaggedShape is free; printing it or comparing two of them reads the lengths
    (a host sync on an accelerator).

    >>> import ragged
    >>> s = ragged.array([[1.0, 2.0], [], [3.0, 4.0, 5.0]]).shape
    >>> s
    RaggedShape(3, [2, 0, 3])
    >>> s[0], s[1], len(s)
    (3, tensor([2, 0, 3]), 2)
    """

    __slots__ = ("_inner", "_partition")

    def __init__(self, partition: Partition, inner: tuple[int, ...]) -> None:
        self._partition = partition
        self._inner = tuple(inner)

    @property
    def num_segments(self) -> int:
        """``B``."""
        return self._partition.num_segments

    @property
    def inner(self) -> tuple[int, ...]:
        """The dense trailing sizes."""
        return self._inner

    @property
    def ragged_ndim(self) -> int:
        """Number of ragged axes."""
        return self._partition.ragged_ndim

    def __len__(self) -> int:
        return 1 + self._partition.ragged_ndim + len(self._inner)

    def __getitem__(self, index: int) -> int | Tensor:
        n = len(self)
        if not isinstance(index, int):
            raise TypeError(f"RaggedShape: index must be an int, got {type(index).__name__}.")
        if not -n <= index < n:
            raise IndexError(f"RaggedShape: index {index} out of range for {n} axes.")
        index %= n
        if index == 0:
            return self._partition.num_segments
        if index <= self._partition.ragged_ndim:
            return self._partition.levels[index - 1].lengths
        return self._inner[index - 1 - self._partition.ragged_ndim]

    def __iter__(self) -> Iterator[int | Tensor]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RaggedShape):
            return NotImplemented
        return self._inner == other._inner and self._partition.equals(other._partition)

    __hash__ = None  # type: ignore[assignment]

    def to_list(self) -> list[int | list]:
        """The shape with each ragged axis as nested Python lists of lengths (reads them)."""
        out: list[int | list] = [self._partition.num_segments]
        for level_index, level in enumerate(self._partition.levels):
            lengths = level.lengths.tolist()
            # Group a deeper level's lengths by the parent structure above it.
            for parent in reversed(self._partition.levels[:level_index]):
                bounds = parent.offsets.tolist()
                lengths = [lengths[a:b] for a, b in itertools.pairwise(bounds)]
            out.append(lengths)
        out.extend(self._inner)
        return out

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
