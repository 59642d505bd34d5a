"""HuggingFace batches: padded with an ``attention_mask`` (``to_hf``, ``from_hf``) and
padding-free (``to_hf_packed``, ``from_hf_packed``: ``input_ids`` of shape ``[1, T]``,
``position_ids`` restarting per sequence, flash-attention's ``cu_seq_lens_q/k``, as
transformers' ``DataCollatorWithFlattening`` makes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import Func, type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import public
from ..ops._indexing._axis import one_level_array

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
    x = one_level_array(func, x)
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
    x = one_level_array(func, x)
    level = x.partition.levels[0]
    ids = not x.dtype.is_floating_point and not x.dtype.is_complex
    if ids and x.values.dim() != 1:
        raise value_error(func, "x", "must be token ids (B, L*) or embeddings (B, L*, D)", x.shape)
    if labels is not None:
        labels = one_level_array(func, labels, "labels")
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


def check_cu_seq_lens(func: Func, batch: Mapping[str, Any], side: str, total: int) -> None:
    """``cu_seq_lens_<side>`` of ``batch`` (if any) are offsets into ``total`` tokens and
    ``max_length_<side>`` (if any) is at least the longest sequence (one host read)."""
    name, bound = f"cu_seq_lens_{side}", f"max_length_{side}"
    cu = batch.get(name)
    if cu is None:
        return
    if not isinstance(cu, Tensor) or cu.dim() != 1 or cu.dtype.is_floating_point:
        raise type_error(func, "batch", f"must hold int `{name}` [B + 1]", typename(cu))
    if cu.dtype in (torch.bool, torch.complex64, torch.complex128) or cu.numel() == 0:
        raise type_error(func, "batch", f"must hold int `{name}` [B + 1]", typename(cu))
    cu = cu.to(torch.int64)
    steps = torch.diff(cu) if cu.numel() > 1 else cu.new_zeros(1)
    first, last, low, high = torch.stack([cu[0], cu[-1], steps.min(), steps.max()]).tolist()
    where = f"`{name}`"
    if first != 0:
        raise value_error(func, "batch", f"must hold {where} starting at 0", f"{name}[0] = {first}")
    if low < 0:
        i = int(torch.argmax((steps < 0).to(torch.int8))) + 1
        got = f"{name}[{i}] = {int(cu[i])} < {name}[{i - 1}] = {int(cu[i - 1])}"
        raise value_error(func, "batch", f"must hold non-decreasing {where}", got)
    if last != total:
        expected = f"must hold {where} ending at the number of tokens {total}"
        raise value_error(func, "batch", expected, f"{name}[-1] = {last}")
    longest = batch.get(bound)
    if longest is None:
        return
    if isinstance(longest, Tensor) and longest.numel() == 1 and not longest.is_floating_point():
        longest = int(longest)
    if not isinstance(longest, int) or isinstance(longest, bool):
        raise type_error(func, "batch", f"must hold an int `{bound}`", typename(longest))
    if longest < high:
        expected = f"must hold `{bound}` at least the longest sequence ({high})"
        raise value_error(func, "batch", expected, f"{bound} = {longest}")


@public("interop")
def from_hf_packed(
    batch: Mapping[str, Any], key: str = "input_ids", *, validate: bool = True
) -> RaggedArray:
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
        validate: check ``cu_seq_lens_q``/``cu_seq_lens_k`` (start at 0, never decrease, end
            at the number of tokens) and ``max_length_q``/``max_length_k`` (at least the
            longest sequence): one host read in eager mode, none under ``torch.compile``
            (as the factories' ``validate``). With ``validate=False`` wrong boundaries give
            wrong sequences.

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
        if validate and not torch.compiler.is_compiling():
            for side in ("q", "k"):
                check_cu_seq_lens(func, batch, side, total)
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
