"""The argument checks of ``ragged.attention``: queries, keys, values and a pair-map bias."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .._array import RaggedArray
from .._errors import type_error, typename, value_error
from .._format import shape_text
from .._partition import tensors_equal
from . import _attention_variants as variants

__all__ = ["check_arrays", "check_bias", "widths"]

ATTENTION = "ragged.attention"  # the function the errors name

BIAS_PARTITION = (
    "must be a pair map (B, Lq*, Lk*, H) with the partition "
    "ragged.Partition.outer(q.partition.levels[0], k.partition.levels[0])"
)


def check_arrays(q: Any, k: Any, v: Any) -> None:
    """Check the queries, keys and values of ``ragged.attention`` (shapes, dtypes, devices,
    heads, the key/value partitions)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, RaggedArray):
            raise type_error(ATTENTION, name, "must be a RaggedArray", typename(x))
        if x.values.dim() != 3:
            raise value_error(ATTENTION, name, "must have shape (B, L*, H, Dh)", shape_text(x))
        if not x.dtype.is_floating_point:
            raise type_error(ATTENTION, name, "must have a floating-point dtype", x.dtype)
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise type_error(ATTENTION, name, f"must have the dtype of `q` ({q.dtype})", x.dtype)
        if x.device != q.device:
            raise value_error(
                ATTENTION, name, f"must be on the device of `q` ({q.device})", x.device
            )
    if k.num_segments != q.num_segments:
        raise value_error(
            ATTENTION, "k", f"must have the batch size of `q` ({q.num_segments})", k.num_segments
        )
    variants.check_partition(ATTENTION, "v", v, "k", k, "keys and values pair up row by row")
    heads, width = q.values.shape[1:]
    if k.values.shape[2] != width:
        raise value_error(
            ATTENTION, "k", f"must have the head width of `q` ({width})", k.values.shape[2]
        )
    kv_heads = k.values.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise value_error(
            ATTENTION,
            "k",
            f"must have a number of heads dividing the heads of `q` ({heads})",
            kv_heads,
        )
    if v.values.shape[1] != kv_heads:
        raise value_error(
            ATTENTION, "v", f"must have the heads of `k` ({kv_heads})", v.values.shape[1]
        )


def check_bias(bias: Any, q: RaggedArray, k: RaggedArray) -> Tensor:
    """The values of a pair-map ``bias`` of ``ragged.attention``, checked against ``q`` and
    ``k``."""
    if not isinstance(bias, RaggedArray):
        raise type_error(ATTENTION, "bias", "must be a RaggedArray or None", typename(bias))
    heads = q.values.shape[1]
    if bias.ragged_ndim != 2 or bias.values.dim() != 2 or bias.values.shape[1] != heads:
        expected = f"must have shape (B, Lq*, Lk*, H) with H = {heads}"
        raise value_error(ATTENTION, "bias", expected, shape_text(bias))
    if bias.dtype != q.dtype:
        raise type_error(ATTENTION, "bias", f"must have the dtype of `q` ({q.dtype})", bias.dtype)
    rows, columns = bias.partition.levels
    q_level, k_level = q.partition.levels[0], k.partition.levels[0]
    if rows is q_level and columns.columns is k_level:
        return bias.values
    if not (rows.equals(q_level) and tensors_equal(columns.lengths, widths(q, k))):
        raise value_error(ATTENTION, "bias", BIAS_PARTITION, shape_text(bias))
    return bias.values


def widths(q: RaggedArray, k: RaggedArray) -> Tensor:
    """``Lk_b`` for every query row: the row lengths of the pair map's second level."""
    return k.lengths.index_select(0, q.partition.levels[0].row_ids)
