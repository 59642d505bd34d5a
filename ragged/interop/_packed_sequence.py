"""``torch.nn.utils.rnn.PackedSequence`` (RNNs): ``to_packed_sequence``, ``from_packed_sequence``.

``to_packed_sequence`` reads the lengths once (one host sync); ``from_packed_sequence`` reads
nothing from the device (``PackedSequence`` keeps its ``batch_sizes`` on the host).
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import PackedSequence

from .._array import RaggedArray
from .._errors import type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import public
from ..ops._indexing._axis import one_level_array
from ..ops._packing import packed_index, packing_plan


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
    plan = packing_plan(func, one_level_array(func, x))
    if enforce_sorted and not bool(torch.equal(plan.sorted_lengths, plan.lengths)):
        raise value_error(
            func,
            "x",
            "must have lengths in decreasing order with enforce_sorted=True",
            f"lengths {plan.lengths.tolist()}",
        )
    data = x.values.new_empty(x.values.shape).index_copy(0, plan.dest, x.values)
    if enforce_sorted:
        return PackedSequence(data, plan.batch_sizes, None, None)
    device = x.device
    return PackedSequence(
        data, plan.batch_sizes, plan.sorted_indices.to(device), plan.rank.to(device)
    )


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
    source = packed_index(level, batch_sizes, rank, data.device)
    return RaggedArray(data.index_select(0, source), Partition((level,)))
