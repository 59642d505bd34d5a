"""Validating factories: the public ways to build a RaggedArray.

Each factory checks what it is given and raises a ``TypeError``/``ValueError`` naming itself and
the parameter before anything is built. Checks that read tensor *data* (signs, sums, order) run
when ``validate=True`` (the default) and outside ``torch.compile``; they read a few scalars back
from the device in one transfer. Host inputs (Python lists) are checked on the host for free, and
they also give the partition its exact maximum length, which later makes ``to_padded`` sync-free.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ._array import RaggedArray
from ._awkward import from_awkward, is_awkward
from ._axes import check_names
from ._errors import Func, name_of, type_error, typename, value_error
from ._from_lists import from_lists
from ._partition import Partition, RowPartition
from ._registry import public

__all__ = [
    "array",
    "from_lengths",
    "from_nested",
    "from_nested_lengths",
    "from_offsets",
    "from_padded",
    "from_segment_ids",
]


def _checking(validate: bool) -> bool:
    return validate and not torch.compiler.is_compiling()


def _values(func: Func, values: object, param: str = "values") -> Tensor:
    if not isinstance(values, Tensor):
        raise type_error(func, param, "must be a Tensor", typename(values))
    if values.dim() == 0:
        raise value_error(
            func, param, "must have at least 1 dim (one row per value)", "a 0-dim tensor"
        )
    return values


_INT64 = (-(2**63), 2**63)


def _index_arg(
    func: Func,
    param: str,
    obj: object,
    device: torch.device,
    check: Callable[[list[int]], object] | None = None,
) -> tuple[Tensor, list[int] | None]:
    """An int64 1-D tensor on ``device``, plus the host list when ``obj`` came from the host.

    A tensor argument comes back as given when it is already int64: callers must not keep it
    (the partition owns its index tensors). A host list is checked by ``check`` (if given) and
    against the int64 range before it becomes a tensor.
    """
    if isinstance(obj, Tensor):
        if obj.dtype == torch.bool or obj.dtype.is_floating_point or obj.dtype.is_complex:
            raise type_error(func, param, "must have an integer dtype", obj.dtype)
        if obj.dim() != 1:
            raise value_error(func, param, "must be 1-D", f"shape {tuple(obj.shape)}")
        if obj.device != device:
            raise value_error(func, param, f"must be on the values' device {device}", obj.device)
        return obj.to(torch.int64), None
    if isinstance(obj, (Sequence, range)) and not isinstance(obj, str):
        host = list(obj)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in host):
            bad = next(n for n in host if not isinstance(n, int) or isinstance(n, bool))
            raise type_error(func, param, "must contain only ints", f"{bad!r}")
        if check is not None:
            check(host)
        low, high = _INT64
        for i, n in enumerate(host):
            if not low <= n < high:
                raise value_error(func, param, "must hold int64 values", f"{param}[{i}] = {n}")
        return torch.tensor(host, dtype=torch.int64, device=device), host
    raise type_error(
        func, param, "must be a 1-D integer tensor or a sequence of ints", typename(obj)
    )


def readable(
    func: Func, param: str, t: Tensor, remedy: str = "pass validate=False, or a list"
) -> None:
    """Checks that read ``t`` need its data: a meta tensor has none."""
    if t.device.type == "meta":
        expected = f"must hold data to read ({remedy}, for meta tensors)"
        raise value_error(func, param, expected, "a tensor on the meta device")


def _first(mask: Tensor) -> int:
    """The index of the first ``True`` of a 1-D boolean tensor that has one (error paths)."""
    return int(torch.argmax(mask.to(torch.int8)))


def _named(func: Func, values: Tensor, partition: Partition, axes: object) -> RaggedArray:
    names = check_names(func, axes, partition.ragged_ndim + values.dim())
    return RaggedArray(values, partition, names)


# --- lengths / offsets / segment ids --------------------------------------------------------


def _check_lengths(
    func: Func, host: list[int], total: int, total_text: str, param: str = "lengths"
) -> None:
    """Host lengths: each in ``[0, total]`` (checked before summing), summing to ``total``."""
    for b, n in enumerate(host):
        if n < 0:
            raise value_error(func, param, "must be non-negative", f"{param}[{b}] = {n}")
    for b, n in enumerate(host):
        if n > total:
            expected = f"must be at most {total_text} = {total}"
            raise value_error(func, param, expected, f"{param}[{b}] = {n}")
    if sum(host) != total:
        raise value_error(func, param, f"must sum to {total_text} = {total}", f"sum {sum(host)}")


def _checked_lengths(
    func: Func, param: str, lengths: Tensor, total: int, total_text: str
) -> tuple[int, int]:
    """Tensor lengths checked as ``_check_lengths`` does (one read): ``(max, squares)``.

    Each length is compared with ``total`` before the sum is trusted: with every length in
    ``[0, total]`` an int64 sum cannot wrap unless ``B * total`` reaches ``2**63``, and then a
    float64 sum decides.
    """
    readable(func, param, lengths)
    if not lengths.numel():
        if total != 0:
            raise value_error(func, param, f"must sum to {total_text} = {total}", "sum 0")
        return 0, 0
    low, summed, high, squares = torch.stack(
        [lengths.min(), lengths.sum(), lengths.max(), (lengths * lengths).sum()]
    ).tolist()
    if low < 0:
        b = _first(lengths < 0)
        raise value_error(func, param, "must be non-negative", f"{param}[{b}] = {int(lengths[b])}")
    if high > total:
        b = _first(lengths > total)
        expected = f"must be at most {total_text} = {total}"
        raise value_error(func, param, expected, f"{param}[{b}] = {int(lengths[b])}")
    if lengths.shape[0] * total >= 2**63:  # the int64 sum may have wrapped
        summed = round(float(lengths.to(torch.float64).sum()))
    if summed != total:
        raise value_error(func, param, f"must sum to {total_text} = {total}", f"sum {summed}")
    return high, squares


@public("constructors")
def from_lengths(
    values: Tensor,
    lengths: Tensor | Sequence[int],
    *,
    axes: Sequence[str] | None = None,
    validate: bool = True,
) -> RaggedArray:
    """A RaggedArray whose segment ``b`` holds the next ``lengths[b]`` rows of ``values``.

    Args:
        values: ``[total, *inner]``, the segments back to back (not copied).
        lengths: per-segment lengths, a 1-D integer tensor on the values' device or a
            sequence of ints; non-negative, summing to ``total``. The array keeps its own copy:
            later writes to ``lengths`` do not change it.
        axes: optional unique names, one per logical axis.
        validate: check tensor ``lengths`` (one small read from the device); host lengths are
            always checked. With ``validate=False`` invalid lengths give wrong segments (a
            well-formed partition: each length clamped into ``[0, total]``, the last segment
            ending at ``total``), never an out-of-bounds access.

    Raises:
        TypeError: ``values`` is not a tensor, or ``lengths`` is not integer.
        ValueError: ``values`` is 0-dim, a length is negative or exceeds ``total``, the lengths
            do not sum to ``total``, ``lengths`` is on another device (or on ``meta`` with
            ``validate=True``), or ``axes`` is malformed.

    >>> import ragged, torch
    >>> ragged.from_lengths(torch.arange(5), [2, 0, 3])
    RaggedArray([[0, 1],
                 [],
                 [2, 3, 4]], shape=(3, [2, 0, 3]))
    >>> ragged.from_lengths(torch.arange(5), [2, 2])
    Traceback (most recent call last):
    ValueError: ragged.from_lengths: `lengths` must sum to values.shape[0] = 5, got sum 4.
    """
    func = from_lengths
    values = _values(func, values)
    total = values.shape[0]

    def check(host: list[int]) -> None:
        _check_lengths(func, host, total, "values.shape[0]")

    lengths_t, host = _index_arg(func, "lengths", lengths, values.device, check)
    if host is not None:  # a fresh tensor, checked on the host
        squares = sum(n * n for n in host)
        level = RowPartition.from_lengths(lengths_t, total, max(host, default=0), squares)
    elif _checking(validate):
        longest, squares = _checked_lengths(func, "lengths", lengths_t, total, "values.shape[0]")
        level = RowPartition.from_lengths(lengths_t.clone(), total, longest, squares)
    else:
        if lengths_t.shape[0] == 0 and total != 0:  # no segment to hold the rows (no read)
            raise value_error(func, "lengths", f"must sum to values.shape[0] = {total}", "sum 0")
        level = RowPartition.from_unchecked_lengths(lengths_t, total)
    return _named(func, values, Partition((level,)), axes)


@public("constructors")
def from_offsets(
    values: Tensor,
    offsets: Tensor | Sequence[int],
    *,
    axes: Sequence[str] | None = None,
    validate: bool = True,
) -> RaggedArray:
    """A RaggedArray whose segment ``b`` is ``values[offsets[b]:offsets[b + 1]]``.

    Args:
        values: ``[total, *inner]`` (not copied).
        offsets: ``B + 1`` integers starting at 0, non-decreasing, ending at ``total``; a 1-D
            integer tensor on the values' device or a sequence of ints. The array keeps its
            own copy.
        axes: optional unique names, one per logical axis.
        validate: check tensor ``offsets`` (one small read from the device). With
            ``validate=False`` invalid offsets give wrong segments (clamped into ``[0, total]``,
            made non-decreasing, from 0 to ``total``), never an out-of-bounds access.

    >>> import ragged, torch
    >>> ragged.from_offsets(torch.arange(5.0), torch.tensor([0, 2, 2, 5])).lengths
    tensor([2, 0, 3])
    >>> ragged.from_offsets(torch.arange(5.0), [1, 5])
    Traceback (most recent call last):
    ValueError: ragged.from_offsets: `offsets` must start at 0, got offsets[0] = 1.
    """
    func = from_offsets
    values = _values(func, values)
    total = values.shape[0]

    def check(host: list[int]) -> None:
        if not host:
            return
        decrease = next((i for i in range(1, len(host)) if host[i] < host[i - 1]), None)
        _check_offsets(func, host[0], decrease, host[-1], total, lambda i: host[i])

    offsets_t, host = _index_arg(func, "offsets", offsets, values.device, check)
    if offsets_t.numel() == 0:
        raise value_error(
            func, "offsets", "must have at least one entry (B + 1 for B segments)", "[]"
        )
    if host is not None:
        steps = [b - a for a, b in itertools.pairwise(host)]
        squares = sum(n * n for n in steps)
        level = RowPartition.from_offsets(offsets_t, total, max(steps, default=0), squares)
    elif _checking(validate):
        readable(func, "offsets", offsets_t)
        steps_t = torch.diff(offsets_t)
        if steps_t.numel() == 0:
            steps_t = offsets_t.new_zeros(1)
        decreasing = (offsets_t[1:] < offsets_t[:-1]).to(torch.int64)  # compared: no wrap
        first, last, decreases, longest, squares = torch.stack(
            [
                offsets_t[0],
                offsets_t[-1],
                decreasing.sum(),
                steps_t.max(),
                (steps_t * steps_t).sum(),
            ]
        ).tolist()
        decrease = int(torch.argmax(decreasing)) + 1 if decreases else None
        _check_offsets(func, first, decrease, last, total, lambda i: int(offsets_t[i]))
        level = RowPartition.from_offsets(offsets_t.clone(), total, longest, squares)
    else:
        if offsets_t.shape[0] == 1 and total != 0:  # no segment to hold the rows (no read)
            raise value_error(
                func, "offsets", f"must end at values.shape[0] = {total}", "a single offset"
            )
        level = RowPartition.from_unchecked_offsets(offsets_t, total)
    return _named(func, values, Partition((level,)), axes)


def _check_offsets(
    func: Func,
    first: int,
    decrease: int | None,
    last: int,
    total: int,
    at: Callable[[int], int],
) -> None:
    """Offsets start at 0, never decrease (``decrease``: the first index that does), and end
    at ``total``; with these, every offset lies in ``[0, total]``."""
    if first != 0:
        raise value_error(func, "offsets", "must start at 0", f"offsets[0] = {first}")
    if decrease is not None:
        i = decrease
        got = f"offsets[{i}] = {at(i)} < offsets[{i - 1}] = {at(i - 1)}"
        raise value_error(func, "offsets", "must be non-decreasing", got)
    if last != total:
        expected = f"must end at values.shape[0] = {total}"
        raise value_error(func, "offsets", expected, f"offsets[-1] = {last}")


@public("constructors")
def from_segment_ids(
    values: Tensor,
    segment_ids: Tensor | Sequence[int],
    num_segments: int,
    *,
    axes: Sequence[str] | None = None,
    validate: bool = True,
) -> RaggedArray:
    """A RaggedArray from the (sorted) segment of each row, as in PyG's ``batch`` vector.

    Args:
        values: ``[total, *inner]`` (not copied).
        segment_ids: ``total`` sorted integers in ``[0, num_segments)``. The array keeps its
            own copy.
        num_segments: ``B``; segments no id names are empty.
        axes: optional unique names, one per logical axis.
        validate: check tensor ids (one small read from the device). With ``validate=False``
            unsorted or out-of-range ids give wrong segments (each segment gets as many rows
            as ids name it, ids clamped into range), never an out-of-bounds access.

    >>> import ragged, torch
    >>> ragged.from_segment_ids(torch.arange(4), torch.tensor([0, 0, 2, 2]), 4).lengths
    tensor([2, 0, 2, 0])
    >>> ragged.from_segment_ids(torch.arange(2), [1, 0], 2)
    Traceback (most recent call last):
    ValueError: ragged.from_segment_ids: `segment_ids` must be sorted (non-decreasing), got segment_ids[1] = 0 < segment_ids[0] = 1.
    """
    func = from_segment_ids
    values = _values(func, values)
    if isinstance(num_segments, bool) or not isinstance(num_segments, (int, torch.SymInt)):
        raise type_error(func, "num_segments", "must be an int", typename(num_segments))
    if num_segments < 0:
        raise value_error(func, "num_segments", "must be non-negative", num_segments)
    ids, host = _index_arg(func, "segment_ids", segment_ids, values.device)
    total = values.shape[0]
    if ids.shape[0] != total:
        expected = f"must have one id per row of values ({total})"
        raise value_error(func, "segment_ids", expected, f"{ids.shape[0]} ids")
    level = segment_ids_level(
        func, "segment_ids", ids, num_segments, host is not None or _checking(validate)
    )
    return _named(func, values, Partition((level,)), axes)


def segment_ids_level(func: Func, param: str, ids: Tensor, num: int, check: bool) -> RowPartition:
    """The level of sorted segment ``ids`` in ``[0, num)`` (checked with one read when
    ``check``; otherwise ``RowPartition.from_unchecked_row_ids``). The caller's ``ids``
    are not kept."""
    total = ids.shape[0]
    if num == 0 and total:  # no segment to hold the rows (no read)
        raise value_error(func, param, "must be in [0, 0)", "ids for 0 segments")
    if not check:
        return RowPartition.from_unchecked_row_ids(ids, num)
    if total == 0:
        return RowPartition.from_row_ids(ids.clone(), num, 0, 0)
    readable(func, param, ids)
    unsorted = (ids[1:] < ids[:-1]).to(torch.int64)  # compared, not diffed: no wrap-around
    lengths = torch.bincount(ids.clamp(0, max(num - 1, 0)), minlength=num)
    low, high, unsorted_n, longest, squares = torch.stack(
        [ids.min(), ids.max(), unsorted.sum(), lengths.max(), (lengths * lengths).sum()]
    ).tolist()
    if unsorted_n:
        at = int(torch.argmax(unsorted)) + 1
        got = f"{param}[{at}] = {int(ids[at])} < {param}[{at - 1}] = {int(ids[at - 1])}"
        raise value_error(func, param, "must be sorted (non-decreasing)", got)
    if low < 0 or high >= num:
        raise value_error(func, param, f"must be in [0, {num})", f"id {low if low < 0 else high}")

    return RowPartition.from_row_ids(ids.clone(), num, longest, squares)


# --- padded / nested ------------------------------------------------------------------------


@public("constructors")
def from_padded(
    padded: Tensor,
    lengths: Tensor | Sequence[int] | None = None,
    *,
    mask: Tensor | None = None,
    axes: Sequence[str] | None = None,
    pairs: bool = False,
) -> RaggedArray:
    """The rows ``padded[b, :lengths[b]]`` of a dense ``(B, L, *inner)`` tensor, packed.

    Give either ``lengths`` or a prefix ``mask`` (``True`` on the first ``lengths[b]``
    positions of each row, as HuggingFace ``attention_mask``), or neither for full rows. The
    output size depends on the data: this reads the lengths back once (one host sync) unless
    they are given as a Python sequence.

    Args:
        padded: ``(B, L, *inner)``, or ``(B, L, L, *inner)`` with ``pairs=True``.
        lengths: per-segment lengths in ``[0, L]``.
        mask: boolean ``(B, L)``; must be left-aligned (a prefix of each row).
        axes: optional unique names, one per logical axis.
        pairs: read a padded pair map: the result is the ``(B, L*, L*, *inner)`` array of the
            blocks ``padded[b, :L_b, :L_b]`` (a product partition, see ``Partition.outer``).

    Returns:
        A RaggedArray whose values are gathered from ``padded`` (differentiable).

    >>> import ragged, torch
    >>> padded = torch.tensor([[1, 2, 0], [3, 0, 0]])
    >>> ragged.from_padded(padded, mask=padded != 0).to_list()
    [[1, 2], [3]]
    >>> ragged.from_padded(torch.arange(8).reshape(2, 2, 2), [2, 1], pairs=True).to_list()
    [[[0, 1], [2, 3]], [[4]]]
    >>> ragged.from_padded(padded, mask=torch.tensor([[True, False, True], [True, False, False]]))
    Traceback (most recent call last):
    ValueError: ragged.from_padded: `mask` must be left-aligned (True on a prefix of each row), got row 0 = [True, False, True].
    """
    func = from_padded
    if not isinstance(padded, Tensor):
        raise type_error(func, "padded", "must be a Tensor", typename(padded))
    needed = 3 if pairs else 2
    if padded.dim() < needed:
        expected = "(B, L, L, ...)" if pairs else "(B, L, ...)"
        raise value_error(
            func, "padded", f"must have at least {needed} dims {expected}", tuple(padded.shape)
        )
    num, width = padded.shape[0], padded.shape[1]
    if pairs and padded.shape[2] != width:
        raise value_error(
            func, "padded", "must be square in dims 1 and 2 for pairs=True", tuple(padded.shape)
        )
    level = _padded_level(func, lengths, mask, num, width, padded.device)
    if not pairs:
        index = level.row_ids * width + level.positions()
        values = padded.reshape(num * width, *padded.shape[2:]).index_select(0, index)
        return _named(func, values, Partition((level,)), axes)
    partition = Partition.outer(level, level)
    cells = partition.levels[1]
    row = cells.row_ids
    segment = level.row_ids.index_select(0, row)
    i = level.positions().index_select(0, row)
    index = (segment * width + i) * width + cells.positions()
    values = padded.reshape(num * width * width, *padded.shape[3:]).index_select(0, index)
    return _named(func, values, partition, axes)


def _padded_level(
    func: Func,
    lengths: Tensor | Sequence[int] | None,
    mask: Tensor | None,
    num: int,
    width: int,
    device: torch.device,
) -> RowPartition:
    """The first ragged level of ``from_padded``, from lengths, a prefix mask, or full rows."""
    if lengths is not None and mask is not None:
        raise TypeError(f"{name_of(func)}: pass `lengths` or `mask`, not both.")
    host: list[int] | None
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise type_error(func, "mask", "must be a bool Tensor", typename(mask))
        if tuple(mask.shape) != (num, width):
            raise value_error(func, "mask", f"must have shape ({num}, {width})", tuple(mask.shape))
        readable(func, "mask", mask, "pass lengths as a list")
        lengths_t = mask.sum(1)
        prefix = torch.arange(width, device=mask.device) < lengths_t[:, None]
        bad_rows = (prefix != mask).any(1)
        if bool(bad_rows.any()):
            row = int(torch.argmax(bad_rows.to(torch.int8)))
            got = f"row {row} = {mask[row].tolist()}"
            raise value_error(
                func, "mask", "must be left-aligned (True on a prefix of each row)", got
            )
        host = None
    elif lengths is not None:
        lengths_t, host = _index_arg(func, "lengths", lengths, device)
        if lengths_t.shape[0] != num:
            raise value_error(func, "lengths", f"must have {num} entries", lengths_t.shape[0])
    else:
        lengths_t = torch.full((num,), width, dtype=torch.int64, device=device)
        host = [width] * num
    if host is None:
        readable(func, "lengths", lengths_t, "pass lengths as a list")
        stats = (
            torch.stack(
                [lengths_t.min(), lengths_t.max(), lengths_t.sum(), (lengths_t * lengths_t).sum()]
            )
            if num
            else None
        )
        low, high, total, squares = stats.tolist() if stats is not None else (0, 0, 0, 0)
        lengths_t = lengths_t.clone() if lengths_t is lengths else lengths_t  # own it
    else:
        low, high, total = min(host, default=0), max(host, default=0), sum(host)
        squares = sum(n * n for n in host)
    if low < 0 or high > width:
        raise value_error(func, "lengths", f"must be in [0, {width}]", f"min {low}, max {high}")
    return RowPartition.from_lengths(lengths_t, total, high, squares)


@public("constructors")
def from_nested_lengths(
    values: Tensor,
    nested_lengths: Sequence[Tensor | Sequence[int]],
    *,
    axes: Sequence[str] | None = None,
    validate: bool = True,
) -> RaggedArray:
    """A RaggedArray with several ragged axes from the lengths of every level.

    ``nested_lengths[0]`` has one length per segment (``B`` entries); ``nested_lengths[k]`` has
    one per row of level ``k - 1`` (``sum(nested_lengths[k - 1])`` entries); the last level's
    lengths sum to ``len(values)``. This is TensorFlow's ``from_nested_row_lengths``.

    Args:
        values: ``[total, *inner]`` (not copied).
        nested_lengths: per-level lengths (1-D integer tensors or sequences of ints).
        axes: optional unique names, one per logical axis.
        validate: check tensor lengths (one small read from the device per level).

    >>> import ragged, torch
    >>> docs = ragged.from_nested_lengths(torch.arange(6), [[2, 1], [3, 1, 2]])
    >>> docs.shape, docs.to_list()
    (RaggedShape(2, [2, 1], [[3, 1], [2]]), [[[0, 1, 2], [3]], [[4, 5]]])
    """
    func = from_nested_lengths
    values = _values(func, values)
    if (
        isinstance(nested_lengths, (Tensor, str))
        or not isinstance(nested_lengths, Sequence)
        or not nested_lengths
    ):
        raise type_error(
            func,
            "nested_lengths",
            "must be a non-empty sequence of per-level lengths",
            typename(nested_lengths),
        )
    parsed = [
        _index_arg(func, f"nested_lengths[{k}]", lengths, values.device)
        for k, lengths in enumerate(nested_lengths)
    ]
    levels = []
    for k, (lengths_t, host) in enumerate(parsed):
        total = parsed[k + 1][0].shape[0] if k + 1 < len(parsed) else values.shape[0]
        what = f"len(nested_lengths[{k + 1}])" if k + 1 < len(parsed) else "values.shape[0]"
        param = f"nested_lengths[{k}]"
        if host is not None:
            _check_lengths(func, host, total, what, param=param)
            squares = sum(n * n for n in host)
            level = RowPartition.from_lengths(lengths_t, total, max(host, default=0), squares)
        elif _checking(validate):
            longest, squares = _checked_lengths(func, param, lengths_t, total, what)
            level = RowPartition.from_lengths(lengths_t.clone(), total, longest, squares)
        else:
            if lengths_t.shape[0] == 0 and total != 0:  # no row to hold the children (no read)
                raise value_error(func, param, f"must sum to {what} = {total}", "sum 0")
            level = RowPartition.from_unchecked_lengths(lengths_t, total)
        levels.append(level)
    return _named(func, values, Partition(tuple(levels)), axes)


@public("constructors")
def from_nested(nt: Tensor, *, axes: Sequence[str] | None = None) -> RaggedArray:
    """A RaggedArray sharing the values of a ``torch.nested`` jagged tensor.

    The offsets are copied (the array owns its index tensors) and, as torch does not check
    them, made well formed without reading them (see
    ``ragged.RowPartition.from_unchecked_offsets``). A jagged tensor with holes (built with
    ``lengths``) is compacted (its values are copied).

    >>> import ragged, torch
    >>> nt = torch.nested.nested_tensor([torch.ones(2), torch.zeros(1)], layout=torch.jagged)
    >>> ragged.from_nested(nt).to_list()
    [[1.0, 1.0], [0.0]]
    """
    func = from_nested
    if not isinstance(nt, Tensor) or not nt.is_nested or nt.layout != torch.jagged:
        raise type_error(
            func, "nt", "must be a torch.nested tensor with layout=torch.jagged", typename(nt)
        )
    ragged_dim = getattr(nt, "_ragged_idx", 1)
    if ragged_dim != 1:
        raise value_error(func, "nt", "must be ragged along dim 1", f"ragged dim {ragged_dim}")
    values, offsets, holes = nt.values(), nt.offsets(), nt.lengths()  # type: ignore[attr-defined]
    total = values.shape[0]
    if holes is None:
        level = RowPartition.from_unchecked_offsets(offsets.to(torch.int64), total)
    else:  # every kept row must lie inside `values`: clamp the starts and the lengths
        starts = offsets[:-1].to(torch.int64).clamp(0, total)
        lengths_t = torch.minimum(holes.to(torch.int64).clamp(min=0), total - starts)
        level = RowPartition.from_lengths(lengths_t, int(lengths_t.sum()))
        values = values[starts[level.row_ids] + level.positions()]
    return _named(func, values, Partition((level,)), axes)


# --- segments as tensors or nested Python lists ---------------------------------------------


def _segments_from_tensors(
    func: Func, data: Sequence[Any], dtype: torch.dtype | None, device: Any
) -> tuple[Tensor, list[int]]:
    tensors = [seg if isinstance(seg, Tensor) else torch.as_tensor(seg) for seg in data]
    for b, seg in enumerate(tensors):
        if seg.dim() == 0:
            raise value_error(
                func,
                "data",
                "must hold one sequence of rows per segment",
                f"data[{b}] = {data[b]!r}",
            )
    dtypes = {seg.dtype for seg in tensors}
    if dtype is None and len(dtypes) > 1:
        raise type_error(
            func,
            "data",
            "must hold tensors of one dtype (or pass dtype=)",
            sorted(map(str, dtypes)),
        )
    devices = {seg.device for seg in tensors}
    if len(devices) > 1:
        raise value_error(
            func, "data", "must hold tensors on one device", sorted(map(str, devices))
        )
    inner = {tuple(seg.shape[1:]) for seg in tensors}
    if len(inner) > 1:
        raise value_error(
            func, "data", "must hold segments with one inner shape", f"inner shapes {sorted(inner)}"
        )
    values = torch.cat(tensors) if tensors else torch.empty(0)
    return values.to(dtype=dtype, device=device), [seg.shape[0] for seg in tensors]


@public("constructors")
def array(
    data: Sequence[Any],
    *,
    axes: Sequence[str] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    ragged_ndim: int | None = None,
) -> RaggedArray:
    """A RaggedArray from a sequence of segments (tensors, arrays or nested lists).

    Args:
        data: one entry per segment, each a tensor (or array-like) of shape ``(L_b, *inner)``
            or a nested list of rows; or an awkward array (see
            [`ragged.from_awkward`][ragged.from_awkward]). Tensors must share dtype (unless ``dtype`` is given),
            device and inner shape; nested lists must share their depth.
        axes: optional unique names, one per logical axis.
        dtype: convert the values to this dtype (lists: infer, as ``torch.tensor`` does).
        device: put the values on this device.
        ragged_ndim: number of ragged axes for nested lists (e.g. 2 for documents -> sentences
            -> tokens). Default: the fewest that fit the data (the deepest axis whose lists
            differ in length); pass it in data pipelines, where a batch whose sentences happen to
            have equal lengths must not come out with a dense axis.

    >>> import ragged, torch
    >>> ragged.array([torch.ones(2, 3), torch.zeros(0, 3)]).shape
    RaggedShape(2, [2, 0], 3)
    >>> ragged.array([[1, 2], [3.5]]).to_list()
    [[1.0, 2.0], [3.5]]
    >>> ragged.array([[[1, 2], [3]], [[4]]]).shape          # documents -> sentences -> tokens
    RaggedShape(2, [2, 1], [[2, 1], [1]])
    >>> ragged.array([[[1, 2]], [[3, 4], [5, 6]]], ragged_ndim=2).shape
    RaggedShape(2, [1, 2], [[2], [2, 2]])
    >>> ragged.array([[1, 2], [[3]]])
    Traceback (most recent call last):
    ValueError: ragged.array: `data` must be nested lists of one consistent depth, got depths [2, 3].
    """
    func = array
    if is_awkward(data):  # an awkward array of lists: its buffers, shared where they can be
        return from_awkward(data, axes=axes, dtype=dtype, device=device, ragged_ndim=ragged_ndim)
    if isinstance(data, Tensor) or not isinstance(data, Sequence) or isinstance(data, str):
        raise type_error(
            func,
            "data",
            "must be a list of segments (for a dense tensor use ragged.from_padded)",
            typename(data),
        )
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise type_error(func, "dtype", "must be a torch.dtype", typename(dtype))
    if ragged_ndim is not None and (
        isinstance(ragged_ndim, bool) or not isinstance(ragged_ndim, int)
    ):
        raise type_error(func, "ragged_ndim", "must be an int or None", typename(ragged_ndim))
    if all(isinstance(seg, (list, tuple)) for seg in data):
        values, levels = from_lists(func, data, ragged_ndim, dtype, device)
    else:
        if ragged_ndim not in (None, 1):
            raise value_error(
                func, "ragged_ndim", "must be 1 for segments given as tensors", ragged_ndim
            )
        values, lengths = _segments_from_tensors(func, data, dtype, device)
        levels = [lengths]
    return _named(func, values, host_partition(levels, values.device), axes)


def host_partition(levels: Sequence[list[int]], device: torch.device) -> Partition:
    """A partition from trusted host lengths per level (max length and squares recorded)."""
    built = []
    for lengths in levels:
        lengths_t = torch.tensor(lengths, dtype=torch.int64, device=device)
        squares = sum(n * n for n in lengths)
        built.append(
            RowPartition.from_lengths(lengths_t, sum(lengths), max(lengths, default=0), squares)
        )
    return Partition(tuple(built))
