"""Conversions to and from other libraries' variable-length formats.

* ``torch.nn.utils.rnn.PackedSequence`` (RNNs): ``to_packed_sequence``,
  ``from_packed_sequence``.
* HuggingFace-style padded batches with an ``attention_mask``: ``to_hf``, ``from_hf``.
* HuggingFace padding-free batches (``input_ids`` of shape ``[1, T]``, ``position_ids``
  restarting per sequence, flash-attention's ``cu_seq_lens_q/k``), as transformers'
  ``DataCollatorWithFlattening`` makes them: ``to_hf_packed``, ``from_hf_packed``.
* PyTorch Geometric's ``(x, batch)`` segment-id vector or a ``Batch``: ``to_pyg``,
  ``from_pyg``.
* DanLing's ``NestedTensor`` (PyPI ``danling``, optional): ``to_danling``,
  ``from_danling``.
* ``torch.nested`` jagged tensors: ``ragged.from_nested`` and ``RaggedArray.to_nested``.
* awkward arrays (PyPI ``awkward``, optional): ``from_awkward``, ``to_awkward`` (defined in
  ``ragged/_awkward.py``, which ``ragged.array`` uses too).

Every conversion is differentiable with respect to the values. Host reads are stated per
function; they happen only where the other format keeps sizes on the host (``PackedSequence``'s
``batch_sizes``, DanLing's offsets) or where an output size depends on the data.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from ._array import RaggedArray
from ._awkward import from_awkward as from_awkward
from ._awkward import to_awkward as to_awkward
from ._errors import Func, name_of, type_error, typename, value_error
from ._factory_checks import readable, segment_ids_level
from ._partition import Partition, RowPartition
from ._registry import public

if TYPE_CHECKING:
    from danling import NestedTensor

__all__ = [
    "from_awkward",
    "from_danling",
    "from_hf",
    "from_hf_packed",
    "from_packed_sequence",
    "from_pyg",
    "to_awkward",
    "to_danling",
    "to_hf",
    "to_hf_packed",
    "to_packed_sequence",
    "to_pyg",
]


def _ragged_arg(func: Func, x: object) -> RaggedArray:
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", typename(x))
    if x.ragged_ndim != 1:
        raise value_error(func, "x", "must have one ragged axis", f"{x.ragged_ndim} ragged axes")
    return x


# --- PackedSequence ---------------------------------------------------------------------------


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
    x = _ragged_arg(func, x)
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


# --- HuggingFace padded batches ---------------------------------------------------------------


def _side(func: Func, padding_side: object) -> str:
    if padding_side not in ("right", "left"):
        raise value_error(func, "padding_side", 'must be "right" or "left"', repr(padding_side))
    return str(padding_side)


@public("interop")
def to_hf(
    x: RaggedArray,
    *,
    pad_id: float = 0,
    length: int | None = None,
    padding_side: str = "right",
) -> tuple[Tensor, Tensor]:
    """A padded batch and its HuggingFace ``attention_mask`` (int64, 1 on real tokens).

    Args:
        x: ``(B, L*, *inner)``: token ids ``(B, L*)`` or embeddings ``(B, L*, D)``.
        pad_id: the value of padding positions.
        length: the padded length; default the longest segment (free when the partition knows
            it, else read once). Longer segments are truncated: right padding keeps their first
            ``length`` tokens, left padding their last ``length`` tokens.
        padding_side: ``"right"`` (real tokens first, the usual layout for training) or
            ``"left"`` (real tokens last, the usual layout for batched generation).

    Returns:
        ``(padded, attention_mask)`` of shapes ``(B, length, *inner)`` and ``(B, length)``.

    >>> import ragged
    >>> x = ragged.array([[5, 6, 7], [8]])
    >>> ragged.to_hf(x)
    (tensor([[5, 6, 7],
            [8, 0, 0]]), tensor([[1, 1, 1],
            [1, 0, 0]]))
    >>> ragged.to_hf(x, pad_id=-1, padding_side="left")[0]
    tensor([[ 5,  6,  7],
            [-1, -1,  8]])
    """
    func = to_hf
    x = _ragged_arg(func, x)
    side = _side(func, padding_side)
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, int) or length < 0
    ):
        raise type_error(func, "length", "must be a non-negative int or None", repr(length))
    if side == "right":
        return x.to_padded(pad_id, length=length), x.to_mask(length=length).to(torch.int64)
    level = x.partition.levels[0]
    width = x.partition.max_length() if length is None else length
    num = x.num_segments
    shift = width - level.lengths  # where each segment starts; negative: truncated
    column = level.positions() + shift[level.row_ids]
    index = level.row_ids * width + column
    grid = num * width
    truncates = level.max_length is None or level.max_length > width
    if truncates:  # rows that fall off the left edge go to a dump row, sliced off below
        index = torch.where(column >= 0, index, grid)
    values = x.values
    out = values.new_full((grid + truncates, *values.shape[1:]), pad_id)
    out = out.index_put((index,), values)[:grid]
    mask = torch.arange(width, device=x.device) >= shift[:, None]
    return out.reshape(num, width, *values.shape[1:]), mask.to(torch.int64)


@public("interop")
def from_hf(padded: Tensor, attention_mask: Tensor, *, padding_side: str = "right") -> RaggedArray:
    """The real tokens of a padded batch, packed: the inverse of [`to_hf`][ragged.to_hf].

    Reads the mask's row sums and checks once (one host sync): the output size depends on them.

    Args:
        padded: ``(B, L, *inner)`` token ids or embeddings.
        attention_mask: ``(B, L)`` of 0/1 (any integer dtype) or bool; each row must be a block
            of ones at the start (``padding_side="right"``) or at the end (``"left"``).
        padding_side: where the padding is.

    Raises:
        ValueError: a mask row is not a block of ones on the given side (the message suggests
            the other side), or the mask holds values other than 0 and 1.

    >>> import ragged, torch
    >>> ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    >>> ragged.from_hf(ids, torch.tensor([[1, 1, 1], [1, 0, 0]])).to_list()
    [[5, 6, 7], [8]]
    >>> ragged.from_hf(ids, torch.tensor([[1, 1, 1], [0, 0, 1]]))
    Traceback (most recent call last):
    ValueError: ragged.from_hf: `attention_mask` must be right-padded (ones on a prefix of each row; pass padding_side="left" for left padding), got row 1 = [0, 0, 1].
    """
    func = from_hf
    side = _side(func, padding_side)
    if not isinstance(padded, Tensor):
        raise type_error(func, "padded", "must be a Tensor", typename(padded))
    if padded.dim() < 2:
        raise value_error(
            func, "padded", "must have at least 2 dims (B, L, ...)", tuple(padded.shape)
        )
    num, width = padded.shape[0], padded.shape[1]
    if not isinstance(attention_mask, Tensor) or attention_mask.dtype.is_floating_point:
        raise type_error(
            func, "attention_mask", "must be an integer or bool Tensor", typename(attention_mask)
        )
    if tuple(attention_mask.shape) != (num, width):
        raise value_error(
            func, "attention_mask", f"must have shape ({num}, {width})", tuple(attention_mask.shape)
        )
    if attention_mask.device != padded.device:
        raise value_error(
            func, "attention_mask", f"must be on {padded.device}", attention_mask.device
        )
    real = attention_mask != 0
    lengths = real.sum(1)
    columns = torch.arange(width, device=padded.device)
    if side == "right":
        expected = columns < lengths[:, None]
    else:
        expected = columns >= (width - lengths)[:, None]
    bad_rows = torch.cat([(expected != real).any(1), real.new_ones(1)])  # sentinel: row num
    bad_values = real & (attention_mask != 1) if attention_mask.dtype != torch.bool else real[:0]
    # One read for everything: the total, the longest row, the first bad row (num when none)
    # and whether the mask holds values other than 0/1.
    stats = torch.stack(
        [
            lengths.sum(),
            torch.cat([lengths, lengths.new_zeros(1)]).max(),
            torch.argmax(bad_rows.to(torch.int8)),
            bad_values.any().to(torch.int64),
        ]
    )
    total, longest, row, has_bad_values = stats.tolist()
    if has_bad_values:
        raise value_error(func, "attention_mask", "must hold only 0 and 1", "other values")
    if row < num:
        other = "left" if side == "right" else "right"
        where = "prefix" if side == "right" else "suffix"
        expected_text = (
            f"must be {side}-padded (ones on a {where} of each row; pass "
            f'padding_side="{other}" for {other} padding)'
        )
        raise value_error(
            func, "attention_mask", expected_text, f"row {row} = {attention_mask[row].tolist()}"
        )
    level = RowPartition.from_lengths(lengths, total, longest)
    column = level.positions()
    if side == "left":
        column = column + (width - lengths)[level.row_ids]
    flat = padded.reshape(num * width, *padded.shape[2:])
    return RaggedArray(flat.index_select(0, level.row_ids * width + column), Partition((level,)))


# --- HuggingFace padding-free batches ---------------------------------------------------------


@public("interop")
def to_hf_packed(
    x: RaggedArray,
    *,
    labels: RaggedArray | None = None,
    separator_id: int = -100,
    position_ids_start: int = 0,
    return_seq_idx: bool = False,
) -> dict[str, Any]:
    """A padding-free batch for transformers: every sequence back to back in one row.

    The output is what ``transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)``
    makes of the same sequences: ``input_ids`` ``[1, T]`` (int64); ``labels`` ``[1, T]``, each
    sequence's labels (default: its ids) with the first replaced by ``separator_id`` so that no
    token learns to predict across a boundary; ``position_ids`` ``[1, T]`` restarting at
    ``position_ids_start`` for every sequence; ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32
    ``[B + 1]``, the offsets) and ``max_length_q``/``max_length_k`` (Python ints) for
    flash-attention's variable-length kernels; with ``return_seq_idx``, ``seq_idx`` ``[1, T]``
    (int32, each token's sequence). Pass it as ``model(**batch)``.

    Embeddings ``(B, L*, D)`` (a floating dtype) give ``inputs_embeds`` ``[1, T, D]`` instead of
    ``input_ids``, and ``labels`` only when given.

    Differences from the collator: an empty sequence keeps its (zero-length) entry in
    ``cu_seq_lens_q/k`` (varlen kernels accept it; ``from_hf_packed`` restores it, and
    ``seq_idx`` counts it), where the collator drops empty examples.

    Host reads: none when the partition knows its maximum length (``ragged.data.collate``
    records it), else one.

    Args:
        x: token ids ``(B, L*)`` or embeddings ``(B, L*, D)``.
        labels: per-token labels ``(B, L*)`` with the partition of ``x``.
        separator_id: the label of every sequence's first token.
        position_ids_start: the position of every sequence's first token (2 for RoBERTa-like
            models, as the collator's argument of that name).
        return_seq_idx: add ``seq_idx``.

    >>> import ragged, torch
    >>> batch = ragged.to_hf_packed(ragged.array([[5, 6, 7], [8, 9]]))
    >>> batch["input_ids"], batch["position_ids"]
    (tensor([[5, 6, 7, 8, 9]]), tensor([[0, 1, 2, 0, 1]]))
    >>> batch["labels"]
    tensor([[-100,    6,    7, -100,    9]])
    >>> batch["cu_seq_lens_q"], batch["max_length_q"]
    (tensor([0, 3, 5], dtype=torch.int32), 3)
    >>> ragged.from_hf_packed(batch).to_list()
    [[5, 6, 7], [8, 9]]
    """
    func = to_hf_packed
    x = _ragged_arg(func, x)
    level = x.partition.levels[0]
    ids = not x.dtype.is_floating_point and not x.dtype.is_complex
    if ids and x.values.dim() != 1:
        raise value_error(func, "x", "must be token ids (B, L*) or embeddings (B, L*, D)", x.shape)
    if labels is not None:
        labels = _ragged_arg(func, labels)
        if labels.partition is not x.partition and not labels.partition.equals(x.partition):
            raise value_error(
                func, "labels", f"must have the partition of `x` ({x.shape})", labels.shape
            )
    for name, value in (("separator_id", separator_id), ("position_ids_start", position_ids_start)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise type_error(func, name, "must be an int", typename(value))
    positions = level.positions()
    batch: dict[str, Any] = {}
    if ids:
        batch["input_ids"] = x.values.to(torch.int64).unsqueeze(0)
    else:
        batch["inputs_embeds"] = x.values.unsqueeze(0)
    if labels is not None or ids:
        source = (x if labels is None else labels).values.to(torch.int64)
        first = positions == 0
        batch["labels"] = torch.where(first, separator_id, source).unsqueeze(0)
    batch["position_ids"] = (positions + position_ids_start).unsqueeze(0)
    if return_seq_idx:
        batch["seq_idx"] = level.row_ids.to(torch.int32).unsqueeze(0)
    offsets = level.offsets.to(torch.int32)
    longest = x.partition.max_length()
    batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = offsets
    batch["max_length_q"] = batch["max_length_k"] = longest
    return batch


@public("interop")
def from_hf_packed(batch: Mapping[str, Any], key: str = "input_ids") -> RaggedArray:
    """The sequences of a padding-free batch: the inverse of ``to_hf_packed``.

    Sequence boundaries come from ``cu_seq_lens_q`` when the batch has it (no host read; with
    ``max_length_q`` the result knows its maximum length), else from ``position_ids``: a
    sequence starts wherever the position does not increase by one (one host read; empty
    sequences cannot be told apart then).

    Args:
        batch: a mapping with ``key`` (``[1, T, ...]``) and ``cu_seq_lens_q`` or
            ``position_ids`` (``[1, T]``), as ``DataCollatorWithFlattening`` or
            ``to_hf_packed`` make it.
        key: the field to unpack (``"input_ids"``, ``"labels"``, ``"inputs_embeds"``, ...).

    >>> import ragged, torch
    >>> batch = {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]),
    ...          "position_ids": torch.tensor([[0, 1, 2, 0, 1]])}
    >>> ragged.from_hf_packed(batch).to_list()
    [[5, 6, 7], [8, 9]]
    """
    func = from_hf_packed
    if not isinstance(batch, Mapping):
        raise type_error(func, "batch", "must be a mapping (a dict of tensors)", typename(batch))
    values = batch.get(key)
    if not isinstance(values, Tensor) or values.dim() < 2 or values.shape[0] != 1:
        raise value_error(
            func, "batch", f"must hold `{key}` of shape [1, T, ...]", typename(values)
        )
    values = values[0]
    total = values.shape[0]
    cu = batch.get("cu_seq_lens_q")
    if cu is not None:
        if not isinstance(cu, Tensor) or cu.dim() != 1 or cu.dtype.is_floating_point:
            raise type_error(func, "batch", "must hold int `cu_seq_lens_q` [B + 1]", typename(cu))
        longest = batch.get("max_length_q")
        longest = longest if isinstance(longest, int) and not isinstance(longest, bool) else None
        level = RowPartition.from_offsets(cu.to(values.device, torch.int64), total, longest)
        return RaggedArray(values, Partition((level,)))
    positions = batch.get("position_ids")
    if not isinstance(positions, Tensor) or tuple(positions.shape) != (1, total):
        raise value_error(
            func,
            "batch",
            f"must hold `cu_seq_lens_q` or `position_ids` of shape (1, {total})",
            typename(positions),
        )
    positions = positions[0].to(values.device)
    starts = torch.ones(total, dtype=torch.bool, device=values.device)
    if total > 1:
        starts[1:] = positions[1:] != positions[:-1] + 1
    row_ids = torch.cumsum(starts, 0) - 1
    num = int(row_ids[-1]) + 1 if total else 0
    level = RowPartition.from_row_ids(row_ids, num)
    return RaggedArray(values, Partition((level,)))


# --- PyTorch Geometric ------------------------------------------------------------------------


@public("interop")
def to_pyg(x: RaggedArray) -> tuple[Tensor, Tensor]:
    """PyG's ``(x, batch)``: the values and the graph (segment) of each row; no copy, no sync.

    >>> import ragged
    >>> values, batch = ragged.to_pyg(ragged.array([[1.0, 2.0], [], [3.0]]))
    >>> values, batch
    (tensor([1., 2., 3.]), tensor([0, 0, 2]))
    """
    x = _ragged_arg(to_pyg, x)
    return x.values, x.segment_ids()


@public("interop")
def from_pyg(
    x: Any,
    batch: Tensor | None = None,
    num_graphs: int | None = None,
    *,
    validate: bool = True,
    key: str = "x",
) -> RaggedArray:
    """A RaggedArray of graphs from PyG's node features and sorted ``batch`` vector, or from a
    ``torch_geometric.data.Batch``.

    A ``Batch`` gives its node attribute ``key`` (default the features ``x``; ``"pos"`` for
    coordinates) split by its ``ptr`` offsets: nothing is read from the device and empty graphs
    are kept. Its other arguments must be left out.

    Args:
        x: ``[num_nodes, *inner]`` node (or edge) features, or a PyG ``Batch``.
        batch: int ``[num_nodes]``, the graph of each node, sorted (PyG's ``Batch.batch``).
        num_graphs: the number of graphs. ``None`` reads ``batch[-1] + 1`` once (one host
            sync); graphs after the last node's graph are then lost, so pass it when the batch
            can end with empty graphs (``Batch.num_graphs``).
        validate: check that ``batch`` is sorted and in range (one small read from the
            device). With ``validate=False`` an unsorted ``batch`` gives wrong graphs (each
            graph gets as many rows as ids name it), never an out-of-bounds access.

    >>> import ragged, torch
    >>> ragged.from_pyg(torch.arange(3.0), torch.tensor([0, 0, 2])).to_list()
    [[0.0, 1.0], [], [2.0]]
    >>> ragged.from_pyg(torch.arange(3.0), torch.tensor([0, 0, 2]), num_graphs=4).lengths
    tensor([2, 0, 1, 0])
    """
    func = from_pyg
    if _is_pyg_batch(x):
        if batch is not None or num_graphs is not None:
            raise TypeError(
                f"{name_of(func)}: pass a PyG Batch alone (no `batch` or `num_graphs`)."
            )
        return _from_pyg_batch(func, x, key)
    if key != "x":
        raise TypeError(f"{name_of(func)}: `key` applies to a PyG Batch only.")
    if batch is None:
        raise type_error(func, "batch", "must be an integer Tensor (x is not a PyG Batch)", "None")
    if not isinstance(x, Tensor) or x.dim() == 0:
        raise type_error(func, "x", "must be a Tensor with at least 1 dim", typename(x))
    if not isinstance(batch, Tensor) or batch.dtype.is_floating_point or batch.dtype == torch.bool:
        raise type_error(func, "batch", "must be an integer Tensor", typename(batch))
    total = x.shape[0]
    if tuple(batch.shape) != (total,):
        raise value_error(
            func,
            "batch",
            f"must have shape ({total},) (one graph per row of x)",
            tuple(batch.shape),
        )
    if batch.device != x.device:
        raise value_error(func, "batch", f"must be on {x.device}", batch.device)
    if num_graphs is not None and (
        isinstance(num_graphs, bool) or not isinstance(num_graphs, int) or num_graphs < 0
    ):
        raise type_error(func, "num_graphs", "must be a non-negative int or None", repr(num_graphs))
    ids = batch.to(torch.int64)
    if num_graphs is None and total:  # the one extra read
        readable(func, "batch", ids, "pass num_graphs, and validate=False")
        num = max(int(ids[-1]) + 1, 0)
    else:
        num = num_graphs or 0
    level = segment_ids_level(func, "batch", ids, num, validate)
    return RaggedArray(x, Partition((level,)))


def _is_pyg_batch(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch_geometric.data.Batch`` (PyG is imported if it is one)."""
    module = sys.modules.get("torch_geometric.data")
    return module is not None and isinstance(obj, module.Batch)


def _from_pyg_batch(func: Func, data: Any, key: str) -> RaggedArray:
    values = getattr(data, key, None)
    if not isinstance(values, Tensor) or values.dim() == 0:
        raise value_error(
            func, "key", "must name a node attribute (a tensor) of the Batch", repr(key)
        )
    total = values.shape[0]
    if total != data.num_nodes:
        raise value_error(
            func,
            "key",
            f"must name a node attribute ({data.num_nodes} rows)",
            f"{key!r}: {total} rows",
        )
    ptr = getattr(data, "ptr", None)
    if ptr is None:  # a Batch not made by from_data_list: fall back to its batch vector
        return from_pyg(values, data.batch, data.num_graphs)
    level = RowPartition.from_offsets(ptr.to(values.device, torch.int64), total)
    return RaggedArray(values, Partition((level,)))


# --- DanLing NestedTensor ---------------------------------------------------------------------


def _danling() -> Any:
    try:
        import danling
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "ragged: DanLing conversions need the `danling` package (pip install torch-ragged[danling])."
        ) from err
    return danling


@public("interop")
def from_danling(nt: NestedTensor) -> RaggedArray:
    """A RaggedArray sharing the packed values of a DanLing ``NestedTensor``.

    Only the first element dim may vary (DanLing tensors ragged in several dims need a
    multi-level partition). DanLing keeps its offsets on the host, so the result knows its
    maximum length and nothing is read from the device.

    >>> import ragged, torch
    >>> from danling import NestedTensor
    >>> ragged.from_danling(NestedTensor(torch.tensor([1, 2, 3]), torch.tensor([4]))).to_list()
    [[1, 2, 3], [4]]
    """
    func = from_danling
    danling = _danling()
    if not isinstance(nt, danling.NestedTensor):
        raise type_error(func, "nt", "must be a danling.NestedTensor", typename(nt))
    if not nt.batch_first:
        raise value_error(func, "nt", "must be batch_first", "batch_first=False")
    offsets = nt.packed_offsets().to(torch.int64)  # on the host by DanLing's design
    values = nt.concat
    sizes = nt.element_sizes()
    num = offsets.shape[0] - 1
    if num and sizes.shape[1] == 0:
        raise value_error(func, "nt", "must hold tensors of at least 1 dim", "0-dim elements")
    if num and sizes.shape[1] > 1 and bool((sizes[:, 1:] != sizes[:1, 1:]).any()):
        raise value_error(
            func,
            "nt",
            "must be ragged in its first element dim only",
            f"element shapes {sizes.tolist()}",
        )
    lengths = torch.diff(offsets)
    longest = int(lengths.max()) if num else 0
    level = RowPartition.from_lengths(lengths.to(values.device), values.shape[0], longest)
    return RaggedArray(values, Partition((level,)))


@public("interop")
def to_danling(x: RaggedArray) -> NestedTensor:
    """A DanLing ``NestedTensor`` over the values of ``x`` (differentiable, values not copied).

    DanLing keeps offsets and element shapes on the host: for values on an accelerator this
    copies the offsets to the host (one sync).

    >>> import ragged, torch
    >>> nt = ragged.to_danling(ragged.array([[1.0, 2.0], [3.0]]))
    >>> nt.tensor
    tensor([[1., 2.],
            [3., 0.]])
    """
    func = to_danling
    danling = _danling()
    x = _ragged_arg(func, x)
    offsets = x.offsets.cpu()
    lengths = torch.diff(offsets)
    inner = torch.tensor(list(x.inner_shape), dtype=torch.int64)
    shapes = torch.cat([lengths[:, None], inner.expand(lengths.shape[0], inner.shape[0])], 1)
    return danling.NestedTensor.from_packed(x.values, offsets, shapes)
