"""Validating factories: the public ways to build a RaggedArray from values and an index.

Each factory checks what it is given and raises a ``TypeError``/``ValueError`` naming itself and
the parameter before anything is built. Checks that read tensor *data* (signs, sums, order) run
when ``validate=True`` (the default) and outside ``torch.compile``; they read a few scalars back
from the device in one transfer. Host inputs (Python lists) are checked on the host for free, and
they also give the partition its exact maximum length, which later makes ``to_padded`` sync-free.

Here: ``from_lengths``, ``from_offsets``, ``from_segment_ids``, ``from_nested_lengths``; the
factories from dense or nested data (``from_padded``, ``from_nested``, ``array``) are in
``ragged._factories_dense``, the checks both use in ``ragged._factory_checks``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from ._array import RaggedArray
from ._errors import type_error, typename, value_error
from ._factory_checks import (
    check_lengths,
    check_offsets,
    check_values,
    checked_lengths,
    index_argument,
    named_array,
    readable,
    segment_ids_level,
    validating,
)
from ._partition import Partition, RowPartition
from ._registry import public

__all__ = [
    "from_lengths",
    "from_nested_lengths",
    "from_offsets",
    "from_segment_ids",
]


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
    values = check_values(func, values)
    total = values.shape[0]

    def check(host: list[int]) -> None:
        check_lengths(func, host, total, "values.shape[0]")

    lengths_t, host = index_argument(func, "lengths", lengths, values.device, check)
    if host is not None:  # a fresh tensor, checked on the host
        squares = sum(n * n for n in host)
        level = RowPartition.from_lengths(
            lengths_t, total, max(host, default=0), squares, nonempty=min(host, default=1) > 0
        )
    elif validating(validate):
        longest, squares = checked_lengths(func, "lengths", lengths_t, total, "values.shape[0]")
        level = RowPartition.from_lengths(lengths_t.clone(), total, longest, squares)
    else:
        if lengths_t.shape[0] == 0 and total != 0:  # no segment to hold the rows (no read)
            raise value_error(func, "lengths", f"must sum to values.shape[0] = {total}", "sum 0")
        level = RowPartition.from_unchecked_lengths(lengths_t, total)
    return named_array(func, values, Partition((level,)), axes)


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
    values = check_values(func, values)
    total = values.shape[0]

    def check(host: list[int]) -> None:
        if not host:
            return
        decrease = next((i for i in range(1, len(host)) if host[i] < host[i - 1]), None)
        check_offsets(func, host[0], decrease, host[-1], total, lambda i: host[i])

    offsets_t, host = index_argument(func, "offsets", offsets, values.device, check)
    if offsets_t.numel() == 0:
        raise value_error(
            func, "offsets", "must have at least one entry (B + 1 for B segments)", "[]"
        )
    if host is not None:
        steps = [b - a for a, b in itertools.pairwise(host)]
        squares = sum(n * n for n in steps)
        level = RowPartition.from_offsets(offsets_t, total, max(steps, default=0), squares)
    elif validating(validate):
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
        check_offsets(func, first, decrease, last, total, lambda i: int(offsets_t[i]))
        level = RowPartition.from_offsets(offsets_t.clone(), total, longest, squares)
    else:
        if offsets_t.shape[0] == 1 and total != 0:  # no segment to hold the rows (no read)
            raise value_error(
                func, "offsets", f"must end at values.shape[0] = {total}", "a single offset"
            )
        level = RowPartition.from_unchecked_offsets(offsets_t, total)
    return named_array(func, values, Partition((level,)), axes)


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
    values = check_values(func, values)
    if isinstance(num_segments, bool) or not isinstance(num_segments, (int, torch.SymInt)):
        raise type_error(func, "num_segments", "must be an int", typename(num_segments))
    if num_segments < 0:
        raise value_error(func, "num_segments", "must be non-negative", num_segments)
    ids, host = index_argument(func, "segment_ids", segment_ids, values.device)
    total = values.shape[0]
    if ids.shape[0] != total:
        expected = f"must have one id per row of values ({total})"
        raise value_error(func, "segment_ids", expected, f"{ids.shape[0]} ids")
    level = segment_ids_level(
        func, "segment_ids", ids, num_segments, host is not None or validating(validate)
    )
    return named_array(func, values, Partition((level,)), axes)


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
    values = check_values(func, values)
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
        index_argument(func, f"nested_lengths[{k}]", lengths, values.device)
        for k, lengths in enumerate(nested_lengths)
    ]
    levels = []
    for k, (lengths_t, host) in enumerate(parsed):
        total = parsed[k + 1][0].shape[0] if k + 1 < len(parsed) else values.shape[0]
        what = f"len(nested_lengths[{k + 1}])" if k + 1 < len(parsed) else "values.shape[0]"
        param = f"nested_lengths[{k}]"
        if host is not None:
            check_lengths(func, host, total, what, param=param)
            squares = sum(n * n for n in host)
            level = RowPartition.from_lengths(
                lengths_t, total, max(host, default=0), squares, nonempty=min(host, default=1) > 0
            )
        elif validating(validate):
            longest, squares = checked_lengths(func, param, lengths_t, total, what)
            level = RowPartition.from_lengths(lengths_t.clone(), total, longest, squares)
        else:
            if lengths_t.shape[0] == 0 and total != 0:  # no row to hold the children (no read)
                raise value_error(func, param, f"must sum to {what} = {total}", "sum 0")
            level = RowPartition.from_unchecked_lengths(lengths_t, total)
        levels.append(level)
    return named_array(func, values, Partition(tuple(levels)), axes)
