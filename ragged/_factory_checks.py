"""The checks and builders the factories share (``ragged._factories``, ``ragged._factories_dense``).

Arguments to tensors (``check_values``, ``index_argument``), checks of lengths and offsets (on host
lists for free; on tensors in one read, behind ``validate``), partition levels from segment ids
or host lengths, and the final naming of the result. Error messages name the calling factory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ._array import RaggedArray
from ._axes import check_names
from ._errors import Func, type_error, typename, value_error
from ._partition import Partition, RowPartition


def validating(validate: bool) -> bool:
    return validate and not torch.compiler.is_compiling()


def check_values(func: Func, values: object, param: str = "values") -> Tensor:
    if not isinstance(values, Tensor):
        raise type_error(func, param, "must be a Tensor", typename(values))
    if values.dim() == 0:
        raise value_error(
            func, param, "must have at least 1 dim (one row per value)", "a 0-dim tensor"
        )
    return values


_INT64 = (-(2**63), 2**63)


def index_argument(
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


def named_array(func: Func, values: Tensor, partition: Partition, axes: object) -> RaggedArray:
    names = check_names(func, axes, partition.ragged_ndim + values.dim())
    return RaggedArray(values, partition, names)


# --- lengths / offsets / segment ids --------------------------------------------------------


def check_lengths(
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


def checked_lengths(
    func: Func, param: str, lengths: Tensor, total: int, total_text: str
) -> tuple[int, int]:
    """Tensor lengths checked as ``check_lengths`` does (one read): ``(max, squares)``.

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


def check_offsets(
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


def host_partition(levels: Sequence[list[int]], device: torch.device) -> Partition:
    """A partition from trusted host lengths per level (max length and squares recorded)."""
    built = []
    for lengths in levels:
        lengths_t = torch.tensor(lengths, dtype=torch.int64, device=device)
        squares = sum(n * n for n in lengths)
        built.append(
            RowPartition.from_lengths(
                lengths_t,
                sum(lengths),
                max(lengths, default=0),
                squares,
                nonempty=min(lengths, default=1) > 0,
            )
        )
    return Partition(tuple(built))
