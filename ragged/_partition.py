"""Partitions: how the flat ``values`` of a RaggedArray split into segments and rows.

A [`Partition`][ragged.Partition] is a stack of [`RowPartition`][ragged.RowPartition] levels, one per ragged axis, in the
style of TensorFlow's nested row partitions. Level 0 splits the ``B`` segments into rows of the
first ragged axis; level ``k`` splits the rows of level ``k - 1`` into rows of the next ragged
axis; the children of the last level are the rows of ``values``.

Both classes compare and hash by identity. They ride in the pytree *context* of a RaggedArray,
and ``torch.func`` compares contexts when it checks that two trees match: identity makes that
check cheap and never asks a tensor for its truth value. Value equality is
[`Partition.equals`][ragged.Partition.equals] (one comparison of the offsets, which reads device memory).

Nothing here reads tensor data: partitions are built by the factories in ``ragged._factories``
(which validate user input) and by ops (whose outputs are valid by construction). Building a
``Partition`` checks only what costs nothing (dtypes, devices, dims and the sizes that chain
the levels) and records the version counters of its tensors (``ragged._versions``). Loading one
from a file or a pickle checks everything (``ragged._serialization``): files are untrusted.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from ._errors import type_error, typename, value_error
from ._registry import public
from ._versions import stamp

__all__ = ["Partition", "RowPartition"]  # pair_index and length_stats are internal helpers


class Pickled:
    """Pickling and copying of the immutable ragged classes (RowPartition, Partition,
    RaggedArray): loading checks everything (``ragged._serialization``, files are untrusted);
    ``copy.copy`` returns the object itself and ``copy.deepcopy`` rebuilds it through its
    constructor (copies in memory are trusted)."""

    # Installed by ``ragged._serialization.register()`` when ``ragged`` loads (it imports this
    # module, so this module cannot import it).
    _reduce: ClassVar[Callable[[Any], tuple[Any, ...]]]
    _setstate: ClassVar[Callable[[Any, Any], None]]

    def __reduce__(self) -> tuple[Any, ...]:
        return Pickled._reduce(self)

    def __setstate__(self, state: Any) -> None:
        Pickled._setstate(self, state)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        fields = [f for f in dataclasses.fields(self) if f.init]  # type: ignore[arg-type]
        return type(self)(*(copy.deepcopy(getattr(self, f.name), memo) for f in fields))


@public("arrays")
@dataclasses.dataclass(frozen=True, eq=False)
class RowPartition(Pickled):
    """One ragged axis: parent row ``r`` owns the children ``offsets[r]:offsets[r + 1]``.

    Attributes:
        offsets: int64 ``[num_rows + 1]``, starting at 0 and non-decreasing.
        lengths: int64 ``[num_rows]``, ``offsets.diff()``.
        row_ids: int64 ``[num_children]``, the parent row of each child (sorted).
        max_length: the exact maximum of ``lengths`` as a Python int, or ``None`` when it is
            not known without reading device memory (a product level may hold its columns'
            maximum instead, an upper bound). It is static metadata: under
            ``torch.compile(dynamic=True)`` it becomes a symbolic size.
        sum_squares: the exact ``sum(lengths ** 2)`` as a Python int, or ``None``: the number of
            pairs of a pair map over this level, so that building one needs no host sync.
        columns: for a *product* level (every row of segment ``b`` has the same length ``M_b``,
            as in a pair map ``(B, N*, M*)``), the one-level partition whose lengths are the
            ``M_b``; ``None`` for a general nested level. Fast paths use it to treat each
            segment as a dense ``N_b x M_b`` block.
        unit: every row has exactly one child: the size-1 axis of ``x[:, None]`` or of
            ``keepdims`` on an outer ragged axis.
        nonempty: every row is known to hold a child (from host lengths, ``units``, a concat
            with a unit level): ``x[:, :1]``, ``x[:, -1:]``, ``x[:, 1:]``, ``x[:, :-1]`` then
            know their size without a read. Static: compiled code guards on it.

    >>> level = RowPartition.from_lengths(torch.tensor([2, 0, 1]), total=3, max_length=2)
    >>> level.offsets, level.row_ids
    (tensor([0, 2, 2, 3]), tensor([0, 0, 2]))
    """

    offsets: Tensor
    lengths: Tensor
    row_ids: Tensor
    max_length: int | None
    sum_squares: int | None = None
    columns: RowPartition | None = None
    unit: bool = False
    nonempty: bool = False

    @staticmethod
    def from_lengths(
        lengths: Tensor,
        total: int,
        max_length: int | None = None,
        sum_squares: int | None = None,
        columns: RowPartition | None = None,
        nonempty: bool = False,
    ) -> RowPartition:
        """Build a level from trusted int64 ``lengths`` that sum to ``total`` (no checks)."""
        offsets = torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))
        row_ids = _row_ids(lengths, total)
        return RowPartition(
            offsets, lengths, row_ids, max_length, sum_squares, columns, False, nonempty
        )

    @staticmethod
    def from_offsets(
        offsets: Tensor, total: int, max_length: int | None = None, sum_squares: int | None = None
    ) -> RowPartition:
        """Build a level from trusted int64 ``offsets`` ending at ``total`` (no checks)."""
        lengths = torch.diff(offsets)
        return RowPartition(offsets, lengths, _row_ids(lengths, total), max_length, sum_squares)

    @staticmethod
    def from_row_ids(
        row_ids: Tensor,
        num_rows: int,
        max_length: int | None = None,
        sum_squares: int | None = None,
    ) -> RowPartition:
        """Build a level from trusted sorted int64 ``row_ids`` in ``[0, num_rows)`` (no checks)."""
        lengths = torch.zeros(num_rows, dtype=torch.int64, device=row_ids.device)
        lengths = lengths.index_add(0, row_ids, torch.ones_like(row_ids))
        offsets = torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))
        return RowPartition(offsets, lengths, row_ids, max_length, sum_squares)

    @staticmethod
    def from_unchecked_lengths(lengths: Tensor, total: int) -> RowPartition:
        """A level from int64 ``lengths`` that nobody checked (``validate=False``, compiled code).

        Valid lengths (non-negative, summing to ``total``) give exactly ``from_lengths``'s
        level. Invalid ones give a well-formed level instead of out-of-bounds writes (a negative
        length or an overflowing sum makes ``repeat_interleave`` write outside its output): the
        segment ends are clamped into ``[0, total]``, made non-decreasing and the last set to
        ``total``. No data is read; the tensors are new (the caller's are not kept).

        >>> RowPartition.from_unchecked_lengths(torch.tensor([2, -1, 9]), total=5).lengths
        tensor([2, 0, 3])
        """
        ends = torch.cumsum(lengths.clamp(0, total), 0)
        return RowPartition.from_unchecked_offsets(torch.nn.functional.pad(ends, (1, 0)), total)

    @staticmethod
    def from_unchecked_offsets(offsets: Tensor, total: int) -> RowPartition:
        """A level from int64 ``offsets`` (``B + 1`` of them) that nobody checked.

        As ``from_unchecked_lengths``: valid offsets give ``from_offsets``'s level,
        invalid ones a well-formed level (clamped into ``[0, total]``, non-decreasing, starting
        at 0 and ending at ``total``). No data is read; the tensors are new.

        >>> RowPartition.from_unchecked_offsets(torch.tensor([1, 4, 2, 7]), total=5).offsets
        tensor([0, 4, 4, 5])
        """
        ends = torch.cummax(offsets[1:].clamp(0, total), 0).values
        num = ends.shape[0]
        last = ends.new_full((torch.sym_min(num, 1),), total)
        safe = torch.cat([ends.new_zeros(1), ends[: num - 1], last])
        return RowPartition.from_offsets(safe, total)

    @staticmethod
    def from_unchecked_row_ids(row_ids: Tensor, num_rows: int) -> RowPartition:
        """A level from int64 ``row_ids`` (the row of each child) that nobody checked.

        Sorted ids in ``[0, num_rows)`` give ``from_row_ids``'s level. Otherwise ids are
        clamped into range and the level keeps only their counts: its row ids are rebuilt
        sorted from the lengths, so the level is well formed (children of an unsorted input
        land in the wrong rows). No data is read; the tensors are new.

        >>> RowPartition.from_unchecked_row_ids(torch.tensor([0, 2, 1, 7]), 3).lengths
        tensor([1, 1, 2])
        """
        total = row_ids.shape[0]
        if num_rows == 0:  # nothing to count into: the level has no children
            return RowPartition.from_offsets(row_ids.new_zeros(1), 0)
        safe = row_ids.clamp(0, num_rows - 1)
        lengths = torch.zeros(num_rows, dtype=torch.int64, device=row_ids.device)
        lengths = lengths.index_add(0, safe, torch.ones_like(safe))
        return RowPartition.from_lengths(lengths, total)

    @staticmethod
    def units(num: int, device: torch.device | str | None = None) -> RowPartition:
        """``num`` rows of one child each (a size-1 axis).

        >>> RowPartition.units(3).offsets
        tensor([0, 1, 2, 3])
        """
        rows = torch.arange(num, device=device)
        offsets = torch.arange(num + 1, device=device)
        ones = torch.ones(num, dtype=torch.int64, device=device)
        return RowPartition(offsets, ones, rows, torch.sym_min(num, 1), num, None, True, True)

    @property
    def num_rows(self) -> int:
        """Number of parent rows."""
        return self.lengths.shape[0]

    @property
    def num_children(self) -> int:
        """Number of children (the sum of ``lengths``)."""
        return self.row_ids.shape[0]

    def positions(self) -> Tensor:
        """Index of each child within its parent row, int64 ``[num_children]``.

        >>> RowPartition.from_lengths(torch.tensor([2, 0, 3]), total=5).positions()
        tensor([0, 1, 0, 1, 2])
        """
        children = torch.arange(self.num_children, device=self.row_ids.device)
        return children - self.offsets[self.row_ids]

    def equals(self, other: RowPartition) -> bool:
        """Value equality: identity, else equal offsets (one comparison; reads device memory).

        >>> a = RowPartition.from_lengths(torch.tensor([2, 0]), total=2)
        >>> a.equals(a), a.equals(RowPartition.from_lengths(torch.tensor([2, 0]), total=2))
        (True, True)
        """
        return self is other or tensors_equal(self.offsets, other.offsets)

    def to(self, device: torch.device) -> RowPartition:
        """This level with its tensors on ``device``."""
        return self.map_tensors(lambda t: t.to(device))

    def map_tensors(self, fn: Callable[[Tensor], Tensor]) -> RowPartition:
        """This level with ``fn`` applied to its tensors (and its columns')."""
        return RowPartition(
            fn(self.offsets),
            fn(self.lengths),
            fn(self.row_ids),
            self.max_length,
            self.sum_squares,
            None if self.columns is None else self.columns.map_tensors(fn),
            self.unit,
            self.nonempty,
        )

    def tensors(self) -> tuple[Tensor, ...]:
        """The index tensors of this level (and of its columns), in a fixed order."""
        own = (self.offsets, self.lengths, self.row_ids)
        return own if self.columns is None else own + self.columns.tensors()

    def __repr__(self) -> str:
        return f"RowPartition(num_rows={self.num_rows}, num_children={self.num_children})"


def _row_ids(lengths: Tensor, total: int) -> Tensor:
    # `output_size` keeps repeat_interleave from reading `lengths.sum()` back to the host.
    rows = torch.arange(lengths.shape[0], device=lengths.device)
    return torch.repeat_interleave(rows, lengths, output_size=total)


@public("arrays")
@dataclasses.dataclass(frozen=True, eq=False)
class Partition(Pickled):
    """The partition tree of a RaggedArray: one [`RowPartition`][ragged.RowPartition] per ragged axis.

    A RaggedArray of logical shape ``(B, L*, *inner)`` has one level; ``(B, S*, T*, *inner)``
    has two. Arrays that share a partition *object* take the fast path in binary ops; ops that
    keep the ragged structure return their input's partition object unchanged.

    >>> p = Partition.from_lengths(torch.tensor([2, 0, 3]), total=5)
    >>> p.num_segments, p.ragged_ndim, p.offsets
    (3, 1, tensor([0, 2, 2, 5]))
    >>> p == p, p == Partition.from_lengths(torch.tensor([2, 0, 3]), total=5)
    (True, False)
    >>> p.equals(Partition.from_lengths(torch.tensor([2, 0, 3]), total=5))
    True
    """

    levels: tuple[RowPartition, ...]
    # Set by __post_init__: every index tensor and the sum of their version counters
    # (ragged._versions), and the values' expected row count and device (RaggedArray checks).
    _watch: tuple[Tensor, ...] = dataclasses.field(init=False, repr=False)
    _stamp: int | None = dataclasses.field(init=False, repr=False)
    _rows: int = dataclasses.field(init=False, repr=False)
    _device: torch.device = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        # What costs nothing: types, dtypes, dims, devices and the sizes that chain the levels
        # (no data is read); then the version stamp of every index tensor (ragged._versions).
        watch = _check_structure(self.levels)
        state = self.__dict__
        state["_watch"] = watch
        state["_stamp"] = stamp(watch)
        state["_rows"] = self.levels[-1].row_ids.shape[0]
        state["_device"] = watch[0].device

    @staticmethod
    def from_lengths(lengths: Tensor, total: int, max_length: int | None = None) -> Partition:
        """A one-level partition from trusted int64 ``lengths`` (no checks)."""
        return Partition((RowPartition.from_lengths(lengths, total, max_length),))

    @staticmethod
    def outer(rows: RowPartition, columns: RowPartition) -> Partition:
        """The product partition of a pair map ``(B, N*, M*)``.

        Segment ``b`` is a dense ``N_b x M_b`` block stored row-major: ``rows`` splits the
        segments into their ``N_b`` rows (and is kept as level 0, the same object), and each row
        of segment ``b`` has ``M_b = columns.lengths[b]`` entries. The number of pairs is
        ``sum(N_b * M_b)``: free for a square map (``rows is columns``) whose ``sum_squares`` is
        known, otherwise read once from the device.

        >>> level = RowPartition.from_lengths(torch.tensor([2, 0, 1]), 3, 2, 5)
        >>> pairs = Partition.outer(level, level)
        >>> pairs.levels[1].lengths, pairs.num_values
        (tensor([2, 2, 1]), 5)
        """
        if rows is columns and rows.sum_squares is not None:
            total = rows.sum_squares
        else:
            total = int((rows.lengths * columns.lengths).sum())
        lengths = columns.lengths.index_select(0, rows.row_ids)
        squares = None
        level = RowPartition.from_lengths(lengths, total, columns.max_length, squares, columns)
        return Partition((rows, level))

    @property
    def num_segments(self) -> int:
        """``B``, the number of segments (size of axis 0)."""
        return self.levels[0].num_rows

    @property
    def ragged_ndim(self) -> int:
        """Number of ragged axes."""
        return len(self.levels)

    @property
    def offsets(self) -> Tensor:
        """Offsets of the first ragged axis, int64 ``[B + 1]``."""
        return self.levels[0].offsets

    @property
    def lengths(self) -> Tensor:
        """Lengths of the first ragged axis, int64 ``[B]``."""
        return self.levels[0].lengths

    @property
    def num_values(self) -> int:
        """Number of rows of ``values`` (children of the last level)."""
        return self.levels[-1].num_children

    @property
    def device(self) -> torch.device:
        """Device of the offsets (always that of the values)."""
        return self.levels[0].offsets.device

    def segment_ids(self) -> Tensor:
        """The segment of each row of ``values``, int64 ``[num_values]``, sorted."""
        ids = self.levels[-1].row_ids
        for level in reversed(self.levels[:-1]):
            ids = level.row_ids[ids]
        return ids

    def sum_squares(self, level: int = 0) -> int:
        """Exact ``sum(lengths ** 2)`` at ``level`` (the size of a pair map over it).

        Free when known (factories record it from host data); otherwise it reads the lengths once.
        """
        known = self.levels[level].sum_squares
        if known is not None:
            return known
        lengths = self.levels[level].lengths
        return int((lengths * lengths).sum())

    def max_length(self, level: int = 0) -> int:
        """Exact maximum length at ``level`` as a Python int.

        Free when known (factories from host data record it); otherwise it reads the lengths
        back from the device once (a host sync, an unbacked size under ``torch.compile``).
        """
        known = self.levels[level].max_length
        if known is not None:
            return known
        lengths = self.levels[level].lengths
        return int(lengths.max()) if lengths.numel() else 0

    def equals(self, other: Partition) -> bool:
        """Value equality: same number of levels and equal offsets at every level.

        Identity is checked first; otherwise this compares offsets (reads device memory). Two
        pair maps built separately over the same levels (``x @ x.mT`` twice: ``outer`` makes
        a new product level each time) are equal without a read: a product level is a function
        of the level above it and its ``columns``, so both being the same objects suffices.
        """
        if self is other:
            return True
        if len(self.levels) != len(other.levels):
            return False
        known = True  # the levels so far are the same objects (or products of them)
        for a, b in zip(self.levels, other.levels, strict=True):
            known = a is b or (known and a.columns is not None and a.columns is b.columns)
            if not known and not a.equals(b):
                return False
        return True

    def to(self, device: torch.device | str) -> Partition:
        """This partition on ``device`` (the same object when already there)."""
        device = torch.device(device)
        if self.device == device:
            return self
        return self.map_tensors(lambda t: t.to(device))

    def map_tensors(self, fn: Callable[[Tensor], Tensor]) -> Partition:
        """A new partition with ``fn`` applied to every offsets/lengths/ids tensor.

        Columns shared between levels (a square pair map) stay shared.
        """
        mapped: dict[int, RowPartition] = {}
        levels = []
        for level in self.levels:
            columns = level.columns
            if columns is not None:
                columns = mapped.get(id(columns)) or columns.map_tensors(fn)
            new = dataclasses.replace(
                level,
                offsets=fn(level.offsets),
                lengths=fn(level.lengths),
                row_ids=fn(level.row_ids),
                columns=columns,
            )
            mapped[id(level)] = new
            levels.append(new)
        return Partition(tuple(levels))

    def __repr__(self) -> str:
        return f"Partition(num_segments={self.num_segments}, levels={len(self.levels)})"


def tensors_equal(a: Tensor, b: Tensor) -> bool:
    """Same shape and entries (reads device memory once).

    >>> tensors_equal(torch.tensor([0, 2]), torch.tensor([0, 2])), tensors_equal(torch.ones(2), torch.ones(3))
    (True, False)
    """
    return a.shape == b.shape and bool(torch.equal(a, b))


def length_stats(lengths: Tensor) -> tuple[int, int, int]:
    """Sum, maximum and sum of squares of ``lengths``, read in one transfer (one host sync).

    >>> length_stats(torch.tensor([2, 0, 3]))
    (5, 3, 13)
    """
    if lengths.numel() == 0:
        return 0, 0, 0
    total, longest, squares = torch.stack(
        [lengths.sum(), lengths.max(), (lengths * lengths).sum()]
    ).tolist()
    return total, longest, squares


def _check_structure(levels: object) -> tuple[Tensor, ...]:
    """Every index tensor of ``levels``, after the checks that read no data."""
    if not isinstance(levels, tuple) or not levels:
        raise type_error(
            Partition, "levels", "must be a non-empty tuple of RowPartition", typename(levels)
        )
    watch: list[Tensor] = []
    for k, level in enumerate(levels):
        if not isinstance(level, RowPartition):
            raise type_error(Partition, f"levels[{k}]", "must be a RowPartition", typename(level))
        watch.extend(level.tensors())
    if torch.compiler.is_compiling():  # sizes are symbolic there: comparing them would guard
        return tuple(watch)
    device = watch[0].device if isinstance(watch[0], Tensor) else None
    for t in watch:
        if not isinstance(t, Tensor) or t.dtype != torch.int64 or t.dim() != 1:
            raise type_error(Partition, "levels", "must hold 1-D int64 index tensors", typename(t))
        if t.device != device:
            raise value_error(
                Partition, "levels", f"must hold index tensors on one device ({device})", t.device
            )
    rows = None
    for k, level in enumerate(levels):
        _check_level_sizes(level, f"levels[{k}]")
        if rows is not None and level.num_rows != rows:
            expected = f"must have one row per child of levels[{k - 1}] ({rows})"
            raise value_error(Partition, f"levels[{k}]", expected, f"{level.num_rows} rows")
        rows = level.num_children
    return tuple(watch)


def _check_level_sizes(level: RowPartition, name: str) -> None:
    rows = level.lengths.shape[0]
    if level.offsets.shape[0] != rows + 1:
        expected = f"must have offsets of size num_rows + 1 = {rows + 1}"
        raise value_error(Partition, name, expected, f"size {level.offsets.shape[0]}")
    if level.columns is not None:
        _check_level_sizes(level.columns, f"{name}.columns")
