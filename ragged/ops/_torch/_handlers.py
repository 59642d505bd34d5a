"""Handlers of torch functions without an op of their own, built from ragged ops.

``torch.max``/``torch.min`` (values and indices), ``torch.sort``, ``torch.topk``,
``torch.norm``, ``torch.allclose``, ``torch.equal``, ``F.normalize``, ``torch.stack`` and
``F.scaled_dot_product_attention``; each is declared with ``torch_handler`` (its errors speak torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import normalize_axis
from ..._errors import value_error
from ..._partition import Partition, RowPartition
from ..._registry import refuse
from ..._torch_args import refuse_out
from ..._versions import check_unchanged
from .. import _elementwise as ew
from .._attention import attention
from .._combining import concat
from .._combining import stack as ragged_stack
from .._reductions._logical import argmax, argmin
from .._reductions._reduce import amax, amin
from .._reductions._statistics import norm
from .._sorting import argsort, sort, topk
from ._spelling import display_name, torch_handler


def _extremum(ops: tuple[Any, Any, Any, Any], x: Any, dim: Any, keepdim: bool, other: Any) -> Any:
    """``torch.max``/``torch.min`` from ``ops`` = (elementwise, reduce, arg-reduce, result
    type): with a tensor ``other`` (or ``dim``) elementwise, without ``dim`` a full reduction,
    else (values, indices) along ``dim``."""
    elementwise, reduce, arg, kind = ops
    if isinstance(dim, (Tensor, RaggedArray)) or other is not None:
        return elementwise(x, dim if other is None else other)
    if dim is None:
        return reduce(x)
    values = reduce(x, dim, keepdims=keepdim)
    return kind((values, arg(x, dim, keepdims=keepdim)))


@torch_handler(
    torch.max,
    torch.Tensor.max,
    methods=("max",),
    family="reductions",
    meaning="`max(x)`: the maximum; `max(x, dim)`: (values, indices) along `dim` (empty "
    "segments: -inf and -1); `max(x, other)`: elementwise maximum",
    see=("ragged.amax", "ragged.argmax", "ragged.maximum"),
    checks=True,  # the ragged ops it calls check their arguments
)
def _max(
    input: Any, dim: Any = None, keepdim: bool = False, *, other: Any = None, out: Any = None
) -> Any:
    refuse_out(None, out)
    ops = (ew.maximum, amax, argmax, torch.return_types.max)
    return _extremum(ops, input, dim, keepdim, other)


@torch_handler(
    torch.min,
    torch.Tensor.min,
    methods=("min",),
    family="reductions",
    meaning="`min(x)`, `min(x, dim)` (values, indices), `min(x, other)`: as `max`",
    see=("ragged.amin", "ragged.argmin", "ragged.minimum"),
    checks=True,  # the ragged ops it calls check their arguments
)
def _min(
    input: Any, dim: Any = None, keepdim: bool = False, *, other: Any = None, out: Any = None
) -> Any:
    refuse_out(None, out)
    ops = (ew.minimum, amin, argmin, torch.return_types.min)
    return _extremum(ops, input, dim, keepdim, other)


@torch_handler(
    torch.sort,
    methods=("sort",),
    family="sorting",
    meaning="(values, indices) sorted along `dim` (default -1), within each segment for the "
    "ragged axis; always stable",
    see=("ragged.sort", "ragged.argsort"),
    checks=True,  # the ragged ops it calls check their arguments
)
def _sort(
    input: Any, dim: Any = -1, descending: bool = False, stable: bool = False, *, out: Any = None
) -> Any:
    refuse_out(None, out)
    values = sort(input, dim, descending=descending)
    indices = argsort(input, dim, descending=descending)
    return torch.return_types.sort((values, indices))  # type: ignore[arg-type]


@torch_handler(
    torch.topk,
    methods=("topk",),
    family="sorting",
    meaning="(values, indices) of the `k` largest along `dim` (default -1); a segment shorter "
    "than `k` keeps all its rows",
    see=("ragged.topk",),
    checks=True,  # the ragged ops it calls check their arguments
)
def _topk(
    input: Any,
    k: int,
    dim: Any = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    out: Any = None,
) -> Any:
    refuse_out(None, out)
    out = topk(input, k, dim, largest=largest, sorted=sorted)
    return torch.return_types.topk(out)


@torch_handler(
    torch.norm,
    methods=("norm",),
    family="reductions",
    meaning="vector `p`-norm over `dim` (`'fro'`: 2)",
    see=("ragged.norm",),
    checks=True,  # ragged.norm checks
)
def _norm(
    input: Any,
    p: Any = "fro",
    dim: Any = None,
    keepdim: bool = False,
    out: Any = None,
    dtype: Any = None,
) -> Any:
    refuse_out(None, out)
    if p == "nuc":
        raise ValueError("`p='nuc'` (the nuclear norm) is not supported on RaggedArrays.")
    x = input if dtype is None else input.to(dtype)
    return norm(x, 2 if p == "fro" or p is None else p, dim, keepdims=keepdim)


@torch_handler(
    torch.allclose,
    torch.Tensor.allclose,
    methods=("allclose",),
    family="elementwise",
    meaning="every entry close (`torch.isclose`); partitions compared by value (different "
    "ones raise, as shapes that do not broadcast)",
    see=("ragged.testing.assert_close",),
    grad=False,
    compile=False,
    checks=True,  # torch.isclose checks its operands
)
def _allclose(
    input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> bool:
    close = torch.isclose(input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)
    return bool(close.values.all()) if isinstance(close, RaggedArray) else bool(close.all())


@torch_handler(
    torch.equal,
    torch.Tensor.equal,
    methods=("equal",),
    family="elementwise",
    meaning="same partition (by value), inner shape and values",
    see=("ragged.testing.assert_close",),
    grad=False,
    compile=False,
)
def _equal(input: Any, other: Any) -> bool:
    if not (isinstance(input, RaggedArray) and isinstance(other, RaggedArray)):
        return False
    if input.inner_shape != other.inner_shape or input.ragged_ndim != other.ragged_ndim:
        return False
    if input.partition is not other.partition and not input.partition.equals(other.partition):
        return False
    return torch.equal(input.values, other.values)


@torch_handler(
    F.normalize,
    family="normalization",
    meaning="`x / max(norm_p(x, dim), eps)`; `dim=1` (the default) normalises each segment "
    "along its rows, an inner `dim` each row",
    see=("ragged.norm",),
    checks=True,  # ragged.norm checks
)
def _normalize(
    input: Any, p: float | None = None, dim: Any = 1, eps: float | None = None, out: Any = None
) -> Any:
    # Float defaults live in the body: torch.compile lifts a float default of the signature as
    # a graph input and reads it back with .item() (a host sync). torch's are 2.0 and 1e-12.
    p = 2.0 if p is None else p
    eps = 1e-12 if eps is None else eps
    refuse_out(None, out)
    if not isinstance(input, RaggedArray):
        raise TypeError(f"`input` must be a RaggedArray, got {type(input).__name__}.")
    axis = normalize_axis("F.normalize", input, dim, "dim")
    if axis > input.ragged_ndim:
        values = F.normalize(input.values, p, axis - input.ragged_ndim, eps)
        return input.with_values(values)
    return input / norm(input, p, axis, keepdims=True).clamp_min(eps)


@torch_handler(
    torch.stack,
    family="combining",
    meaning="a new axis: an inner `dim` stacks equal partitions (`ragged.stack`); `dim=0` "
    "nests the arrays as the segments of a new batch axis; `dim=1` puts, in each segment, the "
    "arrays' rows for it under a new axis (two ragged axes)",
    see=("ragged.stack", "ragged.concat"),
)
def _stack(tensors: Sequence[Any], dim: int = 0, *, out: Any = None) -> RaggedArray:
    refuse_out(None, out)
    arrays = list(tensors)
    if not arrays or not all(isinstance(a, RaggedArray) for a in arrays):
        raise TypeError("`tensors` must be a non-empty sequence of RaggedArrays.")
    first = arrays[0]
    if not isinstance(dim, int) or not -first.ndim - 1 <= dim <= first.ndim:
        raise ValueError(f"`dim` must be in [{-first.ndim - 1}, {first.ndim}], got {dim}.")
    position = dim % (first.ndim + 1)
    if position > first.ragged_ndim:
        return ragged_stack(arrays, position)
    if any(a.axes is not None for a in arrays):
        raise ValueError(
            "named arrays need a name for the new axis: stack them with `rename(None)` first."
        )
    if position == 0:
        joined = concat(arrays, 0)
        counts = torch.tensor([a.num_segments for a in arrays], device=first.device)
        outer = RowPartition.from_lengths(
            counts, joined.num_segments, max(a.num_segments for a in arrays)
        )
        return RaggedArray(joined.values, Partition((outer, *joined.partition.levels)))
    if first.ragged_ndim > 1:
        raise NotImplementedError("`dim=1` needs arrays with one ragged axis.")
    return _stack_rows(arrays)


def _stack_rows(arrays: list[RaggedArray]) -> RaggedArray:
    """``torch.stack(arrays, 1)``: segment ``b`` holds ``arrays[k][b]`` for every ``k``."""
    b = arrays[0].num_segments
    if any(a.num_segments != b for a in arrays):
        counts = [a.num_segments for a in arrays]
        raise ValueError(f"`tensors` must have equal numbers of segments, got {counts}.")
    k = len(arrays)
    device = arrays[0].device
    lengths = torch.stack([a.lengths for a in arrays], 1).reshape(-1)  # (b, k) row-major
    total = sum(a.values.shape[0] for a in arrays)
    known = [a.partition.levels[0].max_length for a in arrays]
    longest = None if None in known else max([0, *[m for m in known if m is not None]])
    inner = RowPartition.from_lengths(lengths, total, longest)
    outer = RowPartition.from_lengths(torch.full((b,), k, device=device), b * k, k if b else 0)
    values = torch.cat([a.values for a in arrays])
    bases = [0]
    for a in arrays[:-1]:
        bases.append(bases[-1] + a.values.shape[0])
    starts = torch.stack([a.offsets[:-1] + base for a, base in zip(arrays, bases, strict=True)], 1)
    starts = starts.reshape(-1)
    row = torch.arange(total, device=device)
    source = (
        starts.index_select(0, inner.row_ids) + row - inner.offsets.index_select(0, inner.row_ids)
    )
    return RaggedArray(values.index_select(0, source), Partition((outer, inner)))


SDPA_LAYOUT = (
    "`query`, `key` and `value` must be RaggedArrays of torch's layout (B, L*, E), one head; "
    "for heads use ragged.attention(q, k, v) with the layout (B, L*, H, Dh) (torch's (B, H, L*, "
    "Dh) puts the heads before the ragged axis, which a RaggedArray does not represent)"
)


def pair_bias(mask: Any, dtype: torch.dtype) -> RaggedArray:
    """``attn_mask`` as ``ragged.attention``'s ``bias`` ``(B, Lq*, Lk*, H)``, from a pair map
    ``(B, Lq*, Lk*)`` (one head) or ``(B, H or 1, Lq*, Lk*)`` (heads first, as torch and HF's
    ``sdpa_mask`` lay it out), boolean (True: attend, as torch) or additive."""
    heads_first = isinstance(mask, RaggedArray) and mask.ndim == 4 and mask.order == (3, 1, 2)
    if (
        not isinstance(mask, RaggedArray)
        or (mask.ndim != 3 and not heads_first)
        or (mask.ndim == 3 and mask.order is not None)
        or mask.ragged_ndim != 2
    ):
        got = (
            f"a RaggedArray of shape {mask.shape}"
            if isinstance(mask, RaggedArray)
            else type(mask).__name__
        )
        raise TypeError(
            "`attn_mask` must be a RaggedArray pair map (B, Lq*, Lk*) or (B, H or 1, Lq*, Lk*) "
            "(ragged.outer of the query and key rows; segments never attend to each other, "
            f"and a dense mask would need padding), got {got}."
        )
    values = mask.values
    if values.dtype == torch.bool:
        values = torch.zeros(values.shape, dtype=dtype, device=values.device).masked_fill(
            ~values, float("-inf")
        )
    return RaggedArray(values if heads_first else values[:, None], mask.partition)


@torch_handler(
    F.scaled_dot_product_attention,
    family="attention",
    meaning="torch's layout `(B, L*, E)` (one head): attention within each segment (keys "
    "and values of another partition: cross-attention); `is_causal`, `scale`, `dropout_p` "
    "as torch; `attn_mask` a RaggedArray pair map `(B, Lq*, Lk*)`, boolean or additive; "
    "heads: torch's `(B, H, L*, Dh)` (`enable_gqa`: fewer key/value heads)",
    see=("ragged.attention",),
    checks=True,
)
def _sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> RaggedArray:
    arrays = (query, key, value)
    if not torch.compiler.is_compiling():  # the door's checks, on the storage order
        for name, a in zip(
            ("query", "key", "value", "attn_mask"), (*arrays, attn_mask), strict=True
        ):
            if isinstance(a, RaggedArray):
                check_unchanged(
                    display_name(F.scaled_dot_product_attention),
                    a,
                    names=(name, ""),
                    any_layout=True,
                )
    if all(isinstance(a, RaggedArray) and a.ndim == 4 and a.order == (2, 1, 3) for a in arrays):
        return _sdpa_heads(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not all(isinstance(a, RaggedArray) and a.ndim == 3 for a in arrays):
        got = ", ".join(
            f"{a.ndim} axes" if isinstance(a, RaggedArray) else type(a).__name__ for a in arrays
        )
        raise TypeError(f"{SDPA_LAYOUT}; got {got}.")
    if enable_gqa:
        raise TypeError("`enable_gqa` needs heads: use ragged.attention.")
    bias = None if attn_mask is None else pair_bias(attn_mask, query.dtype)
    q, k, v = (RaggedArray(a.values[:, None], a.partition) for a in arrays)
    out = attention(q, k, v, causal=is_causal, scale=scale, bias=bias, dropout_p=dropout_p or None)
    return RaggedArray(out.values[:, 0], query.partition, query.axes)


def _sdpa_heads(
    query: RaggedArray,
    key: RaggedArray,
    value: RaggedArray,
    attn_mask: Any,
    dropout_p: float | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> RaggedArray:
    """SDPA in the head-first layout ``(B, H, L*, Dh)``: ``ragged.attention`` on the storage
    order ``(B, L*, H, Dh)`` (``transpose(1, 2)``: metadata only), and back."""
    q, k, v = (a.transpose(1, 2) for a in (query, key, value))
    heads, kv_heads = q.values.shape[1], k.values.shape[1]
    if kv_heads != heads and not enable_gqa:
        raise ValueError(
            f"`key` must have the heads of `query` ({heads}) unless enable_gqa=True, got "
            f"{kv_heads}."
        )
    bias = None if attn_mask is None else pair_bias(attn_mask, query.dtype)
    if bias is not None and bias.values.shape[1] not in (1, heads):
        raise value_error(
            display_name(F.scaled_dot_product_attention),
            "attn_mask",
            f"must have 1 or {heads} heads (those of `query`)",
            bias.values.shape[1],
        )
    if bias is not None and bias.values.shape[1] != heads:
        bias = RaggedArray(bias.values.expand(-1, heads), bias.partition)
    out = attention(q, k, v, causal=is_causal, scale=scale, bias=bias, dropout_p=dropout_p or None)
    return out.transpose(1, 2)


# The sorting and attention functions of torch that RaggedArrays refuse (beside their handlers).
refuse(
    torch.unique_consecutive,
    family="sorting",
    hint="ragged.unique_consecutive(x, axis) collapses runs within each segment",
    see=("ragged.unique_consecutive",),
)
