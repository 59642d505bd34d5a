"""``torch.nn.utils.rnn.PackedSequence`` (RNNs): ``to_packed_sequence``, ``from_packed_sequence``.

``to_packed_sequence`` reads the lengths once (one host sync); ``from_packed_sequence`` reads
nothing from the device (``PackedSequence`` keeps its ``batch_sizes`` on the host).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from .._array import RaggedArray
from .._errors import type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import public
from ..ops._indexing._axis import one_level_array


@public("interop")
def to_packed_sequence(x: RaggedArray, *, enforce_sorted: bool = False) -> PackedSequence:
    """A ``PackedSequence`` holding the segments of ``x``, for ``torch.nn.RNN/LSTM/GRU``.

    The segments are ordered by decreasing length (a stable sort: equal lengths keep their
    order) and interleaved time step by time step, as ``pack_sequence`` does; the permutation
    is recorded in ``sorted_indices``/``unsorted_indices``, so RNN outputs come back in the
    original order. Reads the lengths once (one host sync): ``PackedSequence`` keeps its
    ``batch_sizes`` on the host.

    Args:
        x: ``(B, L*, *inner)`` with ``B >= 1`` and no empty segment: ``PackedSequence`` cannot
            hold a sequence of length 0 (``pack_sequence`` rejects one too).
        enforce_sorted: require lengths already in decreasing order and record no permutation
            (``sorted_indices=None``), as ``pack_sequence(..., enforce_sorted=True)``.

    >>> import ragged, torch
    >>> ps = ragged.to_packed_sequence(ragged.array([[1.0], [2.0, 3.0, 4.0], [5.0, 6.0]]))
    >>> ps.data, ps.batch_sizes, ps.sorted_indices
    (tensor([2., 5., 1., 3., 6., 4.]), tensor([3, 2, 1]), tensor([1, 2, 0]))
    >>> ragged.from_packed_sequence(ps).to_list()
    [[1.0], [2.0, 3.0, 4.0], [5.0, 6.0]]
    """
    func = to_packed_sequence
    x = one_level_array(func, x)
    lengths = x.lengths.cpu()
    num = lengths.shape[0]
    if num == 0:
        raise value_error(
            func, "x", "must have at least one segment for a PackedSequence", "0 segments"
        )
    empty = lengths == 0
    if bool(empty.any()):
        b = int(torch.argmax(empty.to(torch.int8)))
        raise value_error(
            func,
            "x",
            "must have no empty segment (PackedSequence cannot hold one)",
            f"lengths[{b}] = 0",
        )
    sorted_lengths, sorted_indices = torch.sort(lengths, descending=True, stable=True)
    if enforce_sorted and not bool(torch.equal(sorted_lengths, lengths)):
        raise value_error(
            func,
            "x",
            "must have lengths in decreasing order with enforce_sorted=True",
            f"lengths {lengths.tolist()}",
        )
    longest = int(sorted_lengths[0])
    # batch_sizes[t] = number of segments longer than t.
    per_length = torch.bincount(lengths, minlength=longest + 1)
    batch_sizes = num - torch.cumsum(per_length, 0)[:longest]
    rank = torch.empty_like(sorted_indices)
    rank[sorted_indices] = torch.arange(num)  # the position of each segment in sorted order
    dest = _packed_index(x.partition.levels[0], batch_sizes, rank, x.device)
    data = x.values.new_empty(x.values.shape).index_copy(0, dest, x.values)
    if enforce_sorted:
        return PackedSequence(data, batch_sizes, None, None)
    device = x.device
    return PackedSequence(data, batch_sizes, sorted_indices.to(device), rank.to(device))


def _packed_index(
    level: RowPartition, batch_sizes: Tensor, rank: Tensor, device: torch.device
) -> Tensor:
    """Row ``(b, t)`` of the segments sits at ``time_offsets[t] + rank[b]`` in packed data."""
    time_offsets = torch.cumsum(batch_sizes, 0) - batch_sizes
    return time_offsets.to(device)[level.positions()] + rank.to(device)[level.row_ids]


@public("interop")
def from_packed_sequence(ps: PackedSequence) -> RaggedArray:
    """A RaggedArray of the sequences of a ``PackedSequence``, in their original order.

    The original order is the one ``unsorted_indices`` restores (as ``pad_packed_sequence``
    does). Reads nothing from the device: lengths follow from the host ``batch_sizes``, so the
    result knows its maximum length.

    >>> import ragged, torch
    >>> from torch.nn.utils.rnn import pack_sequence
    >>> ps = pack_sequence([torch.tensor([1, 2]), torch.tensor([3, 4, 5])], enforce_sorted=False)
    >>> ragged.from_packed_sequence(ps).to_list()
    [[1, 2], [3, 4, 5]]
    """
    func = from_packed_sequence
    if not isinstance(ps, PackedSequence):
        raise type_error(func, "ps", "must be a torch.nn.utils.rnn.PackedSequence", typename(ps))
    data, batch_sizes, sorted_indices, unsorted_indices = ps
    batch_sizes = batch_sizes.to(torch.int64)
    if sorted_indices is not None:
        num = sorted_indices.shape[0]
    else:
        num = int(batch_sizes[0]) if batch_sizes.numel() else 0
    longest = batch_sizes.shape[0]
    # Sorted position j is present at time t iff batch_sizes[t] > j.
    per_size = torch.bincount(batch_sizes, minlength=num + 1)
    sorted_lengths = longest - torch.cumsum(per_size, 0)[:num]
    if unsorted_indices is None:
        rank = torch.arange(num, device=data.device)
        lengths = sorted_lengths.to(data.device)
    else:  # stays on the data's device: no read
        rank = unsorted_indices.to(data.device, torch.int64)
        lengths = sorted_lengths.to(data.device)[rank]
    level = RowPartition.from_lengths(lengths, data.shape[0], longest)
    source = _packed_index(level, batch_sizes, rank, data.device)
    return RaggedArray(data.index_select(0, source), Partition((level,)))
