"""Collectives and sharding of RaggedArrays (the first half of ``ragged.distributed``)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .._array import RaggedArray
from .._errors import Func, name_of, type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import public
from ..ops._indexing._axis import one_level_array

Group = Any  # torch.distributed.ProcessGroup | None


@dataclasses.dataclass(frozen=True)
class _Meta:
    """What a receiver needs to allocate buffers for one rank's RaggedArray."""

    num: int
    total: int
    max_length: int | None
    dtype: torch.dtype
    inner: tuple[int, ...]
    axes: tuple[str, ...] | None


def _meta(x: RaggedArray) -> _Meta:
    level = x.partition.levels[0]
    return _Meta(
        x.num_segments, x.values.shape[0], level.max_length, x.dtype, tuple(x.inner_shape), x.axes
    )


def _handshake(func: Func, prepare: Callable[[], Any], group: Group) -> list[Any]:
    """Every rank's ``prepare()``, exchanged in one ``all_gather_object`` (group rank order).

    A rank whose ``prepare`` raises still takes part, with its error in place of a result;
    then every rank raises, so that none is left waiting in a later collective.
    """
    error: Exception | None = None
    try:
        local: tuple[str, Any] = ("ok", prepare())
    except Exception as err:  # reported to every rank, then re-raised here
        error = err
        local = (type(err).__name__, str(err).rstrip("."))
    headers: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(headers, local, group=group)
    if error is not None:
        raise error
    for rank, (status, payload) in enumerate(headers):
        if status != "ok":
            cls = TypeError if status == "TypeError" else ValueError
            raise cls(
                f"{name_of(func)}: rank {rank} failed before communicating ({status}: {payload})."
            )
    return [payload for _, payload in headers]


def _receiver_device(device: torch.device | str | None, group: Group) -> torch.device:
    return torch.device(device) if device is not None else _default_device(group)


def _group_rank(rank: int, group: Group) -> int:
    """The rank in ``group`` of the global ``rank``."""
    return rank if group is None else dist.get_group_rank(group, rank)


def _default_device(group: Group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _build(values: Tensor, lengths: Tensor, max_length: int | None, axes: Any) -> RaggedArray:
    level = RowPartition.from_lengths(lengths, values.shape[0], max_length)
    return RaggedArray(values, Partition((level,)), axes)


def _padded(tensor: Tensor, rows: int) -> Tensor:
    """``tensor`` (contiguous) grown to ``rows`` rows; no copy when it already has them."""
    if tensor.shape[0] == rows:
        return tensor.contiguous()
    out = tensor.new_zeros((rows, *tensor.shape[1:]))
    out[: tensor.shape[0]] = tensor
    return out


@public("distributed", namespace="ragged.distributed")
def all_gather(x: RaggedArray, group: Group = None) -> RaggedArray:
    """Every rank's segments, concatenated in rank order, on every rank.

    Ranks may hold different numbers of segments and values; dtype and inner shape must agree.
    The local part of the result is ``x.values`` itself, so gradients flow back to the local
    values (the other ranks' parts are constants, as in contrastive-loss gathers).

    Metadata goes through ``all_gather_object``, then lengths and values through
    ``all_gather`` of buffers padded to the largest rank. Reads the local maximum length once
    if the partition does not know it.

    Raises:
        ValueError: ranks disagree on dtype, inner shape or axis names (raised on every rank).
    """
    func = all_gather
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)

    def prepare() -> _Meta:
        checked = one_level_array(func, x)
        return dataclasses.replace(_meta(checked), max_length=checked.partition.max_length())

    metas = _handshake(func, prepare, group)
    _check_agree(func, metas, ("dtype", "inner", "axes"))
    assert isinstance(x, RaggedArray)
    max_num = max(m.num for m in metas)
    max_total = max(m.total for m in metas)
    lengths_out = [x.lengths.new_empty(max_num) for _ in range(world)]
    dist.all_gather(lengths_out, _padded(x.lengths, max_num), group=group)
    values_out = [x.values.new_empty((max_total, *x.inner_shape)) for _ in range(world)]
    dist.all_gather(values_out, _padded(x.values.detach(), max_total), group=group)
    values = torch.cat(
        [x.values if r == rank else values_out[r][: m.total] for r, m in enumerate(metas)]
    )
    lengths = torch.cat([lengths_out[r][: m.num] for r, m in enumerate(metas)])
    return _build(values, lengths, max(m.max_length for m in metas), x.axes)


def _check_agree(func: Func, metas: Sequence[_Meta], fields: Sequence[str]) -> None:
    for field in fields:
        seen = [getattr(m, field) for m in metas]
        if any(v != seen[0] for v in seen):
            got = ", ".join(f"rank {r}: {v}" for r, v in enumerate(seen))
            raise value_error(func, "x", f"must have one {field} on every rank", got)


@public("distributed", namespace="ragged.distributed")
def broadcast(
    x: RaggedArray | None,
    src: int,
    group: Group = None,
    *,
    device: torch.device | str | None = None,
) -> RaggedArray:
    """Rank ``src``'s RaggedArray on every rank.

    Args:
        x: the array on ``src``; ignored (pass ``None``) on the other ranks.
        src: the sending rank (a global rank, as in ``torch.distributed.broadcast``).
        group: the process group.
        device: where receivers allocate; default ``x.device`` on ``src``, and the current CUDA
            device for NCCL or the CPU otherwise on receivers.

    Metadata goes through ``broadcast_object_list``, lengths and values through
    ``broadcast``. The result knows its maximum length when ``src``'s partition does.
    """
    func = broadcast
    is_src = dist.get_rank() == src

    def prepare() -> _Meta | torch.device:
        return _meta(one_level_array(func, x)) if is_src else _receiver_device(device, group)

    # One all_gather_object (not broadcast_object_list): receivers' errors reach src too.
    header = _handshake(func, prepare, group)
    meta: _Meta = header[_group_rank(src, group)]
    if is_src and x is not None:
        lengths, values = x.lengths.contiguous(), x.values.detach().contiguous()
    else:
        where = header[dist.get_rank(group)]
        lengths = torch.empty(meta.num, dtype=torch.int64, device=where)
        values = torch.empty((meta.total, *meta.inner), dtype=meta.dtype, device=where)
    dist.broadcast(lengths, src=src, group=group)
    dist.broadcast(values, src=src, group=group)
    if is_src and x is not None:
        return x
    return _build(values, lengths, meta.max_length, meta.axes)


@public("distributed", namespace="ragged.distributed")
def scatter(
    x: RaggedArray | None,
    src: int,
    group: Group = None,
    *,
    device: torch.device | str | None = None,
) -> RaggedArray:
    """Split ``src``'s segments into contiguous chunks, one per rank (rank order).

    The chunks balance the number of values (tokens) with [`shard_bounds`][ragged.distributed.shard_bounds], so a rank may
    receive zero segments when there are fewer segments than ranks. ``src`` reads its lengths
    once (one host sync). Metadata goes through ``scatter_object_list``, lengths and values
    through ``scatter`` of buffers padded to the largest chunk.

    Args:
        x: the array on ``src``; ignored (pass ``None``) on the other ranks.
        src: the sending rank (a global rank).
        group: the process group.
        device: where receivers allocate (see [`broadcast`][ragged.distributed.broadcast]).
    """
    func = scatter
    world = dist.get_world_size(group)
    is_src = dist.get_rank() == src
    chunks: list[RaggedArray] = []

    def prepare() -> list[Any] | torch.device:
        if not is_src:
            return _receiver_device(device, group)
        checked = one_level_array(func, x)
        host = checked.lengths.tolist()
        bounds = shard_bounds(host, world)
        chunks.extend(_slice(checked, host, a, b) for a, b in itertools.pairwise(bounds))
        metas = [_meta(c) for c in chunks]
        # `scatter` needs equal sizes: every rank also learns the largest chunk's.
        sizes = (max(m.num for m in metas), max(m.total for m in metas))
        return [(m, *sizes) for m in metas]

    # One all_gather_object (not scatter_object_list): receivers' errors reach src too; every
    # rank gets every plan (a few ints each).
    header = _handshake(func, prepare, group)
    rank = dist.get_rank(group)
    meta, max_num, max_total = header[_group_rank(src, group)][rank]
    where = chunks[0].device if is_src else header[rank]
    lengths = torch.empty(max_num, dtype=torch.int64, device=where)
    values = torch.empty((max_total, *meta.inner), dtype=meta.dtype, device=where)
    lengths_in = [_padded(c.lengths, max_num) for c in chunks] if is_src else None
    dist.scatter(lengths, lengths_in, src=src, group=group)
    values_in = [_padded(c.values.detach(), max_total) for c in chunks] if is_src else None
    dist.scatter(values, values_in, src=src, group=group)
    return _build(values[: meta.total], lengths[: meta.num], meta.max_length, meta.axes)


# --- sharding -------------------------------------------------------------------------------


@public("distributed", namespace="ragged.distributed")
def shard_bounds(lengths: Sequence[int] | Tensor, world_size: int) -> list[int]:
    """Token-balanced contiguous split points: rank ``r`` owns segments ``[b[r], b[r + 1])``.

    Cut ``k`` is the segment boundary whose prefix sum of lengths is nearest to
    ``k * total / world_size`` (ties to the earlier boundary), so each rank's number of tokens
    is within the longest length of ``total / world_size``. Deterministic: it depends only on
    the lengths. A tensor of lengths is read once.

    >>> shard_bounds([5, 1, 1, 1, 4, 4], 2)
    [0, 4, 6]
    >>> shard_bounds([3, 3], 4)  # fewer segments than ranks: some ranks get none
    [0, 0, 1, 1, 2]
    """
    func = shard_bounds
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise value_error(func, "world_size", "must be a positive int", repr(world_size))
    host = lengths.tolist() if isinstance(lengths, Tensor) else list(lengths)
    prefix = [0]
    for n in host:
        prefix.append(prefix[-1] + n)
    total = prefix[-1]
    bounds = [0]
    i = 0
    for k in range(1, world_size):
        target = k * total / world_size
        while i < len(host) and abs(prefix[i + 1] - target) < abs(prefix[i] - target):
            i += 1
        bounds.append(i)
    bounds.append(len(host))
    return bounds


def _slice(x: RaggedArray, host: list[int], start: int, stop: int) -> RaggedArray:
    """Segments ``start:stop`` (a view of the values), from the host ``lengths`` (no read)."""
    level = x.partition.levels[0]
    first = sum(host[:start])
    last = first + sum(host[start:stop])
    new = RowPartition(
        level.offsets[start : stop + 1] - first,
        level.lengths[start:stop],
        level.row_ids[first:last] - start,
        max(host[start:stop], default=0),
    )
    return RaggedArray(x.values[first:last], Partition((new,)), x.axes)


@public("distributed", namespace="ragged.distributed")
def shard(lengths_or_x: Sequence[int] | Tensor | RaggedArray, world_size: int, rank: int) -> Any:
    """Rank ``rank``'s token-balanced contiguous share of a global batch.

    Args:
        lengths_or_x: the global batch as per-sample lengths, or as a RaggedArray.
        world_size: number of ranks.
        rank: this rank.

    Returns:
        For lengths, the ``range`` of sample indices this rank owns; for a RaggedArray, those
        segments as a RaggedArray (a view of the values; the lengths are read once).

    >>> import ragged
    >>> shard([5, 1, 1, 1, 4, 4], 2, 1)
    range(4, 6)
    >>> shard(ragged.array([[1, 2, 3], [4], [5, 6]]), 2, 1).to_list()
    [[4], [5, 6]]
    """
    func = shard
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < max(world_size, 1):
        raise value_error(func, "rank", f"must be an int in [0, {world_size})", repr(rank))
    if isinstance(lengths_or_x, RaggedArray):
        x = one_level_array(func, lengths_or_x)
        host = x.lengths.tolist()
        bounds = shard_bounds(host, world_size)
        return _slice(x, host, bounds[rank], bounds[rank + 1])
    bounds = shard_bounds(lengths_or_x, world_size)
    return range(bounds[rank], bounds[rank + 1])


# --- losses ---------------------------------------------------------------------------------


@public("distributed", namespace="ragged.distributed")
def global_mean(
    loss_sum: Tensor, count: Tensor | int | float, group: Group = None, *, ddp: bool = True
) -> Tensor:
    """The global mean ``sum over ranks of loss_sum / sum over ranks of count``, differentiable.

    With per-token losses and ranks holding different numbers of tokens, averaging per-rank
    means weights tokens unequally; this divides the global sum by the global count. Sums and
    counts are all-reduced (one ``all_reduce`` of a small float64 tensor); the value is the
    same on every rank.

    The gradient flows to the local ``loss_sum`` only. With ``ddp=True`` it is scaled by
    ``world_size / global_count``: ``DistributedDataParallel`` averages gradients over ranks
    (divides their sum by the world size), which then yields exactly the gradient of the global
    mean. With ``ddp=False`` the scale is ``1 / global_count`` (when gradients are summed, not
    averaged). A global count of 0 gives NaN, like [`ragged.mean`][ragged.mean] of an empty segment.

    Args:
        loss_sum: this rank's sum of per-token losses (any shape; usually a scalar).
        count: this rank's number of tokens (an int or a tensor broadcastable to ``loss_sum``).
        group: the process group.
        ddp: scale the gradient for DDP's averaging.

    A rank whose arguments are wrong still joins the ``all_reduce`` (with NaN, shaped as for a
    scalar ``loss_sum``) before it raises, so the other ranks get NaN rather than wait; this
    function adds no exchange to check arguments (it runs every step).
    """
    func = global_mean
    try:
        if not isinstance(loss_sum, Tensor):
            raise type_error(func, "loss_sum", "must be a Tensor", typename(loss_sum))
        count_t = torch.as_tensor(count, device=loss_sum.device)
        count_t = count_t.detach().to(torch.float64).expand(loss_sum.shape)
        local = torch.cat([loss_sum.detach().to(torch.float64).reshape(-1), count_t.reshape(-1)])
    except Exception:
        # Still join the all_reduce (as for a scalar loss, the usual case), with NaN: the other
        # ranks get NaN instead of waiting for this rank until the timeout.
        nan = torch.full((2,), torch.nan, dtype=torch.float64, device=_default_device(group))
        dist.all_reduce(nan, group=group)
        raise
    dist.all_reduce(local, group=group)
    size = loss_sum.numel()
    total, global_count = local[:size].view(loss_sum.shape), local[size:].view(loss_sum.shape)
    value = (total / global_count).to(loss_sum.dtype)
    scale = (dist.get_world_size(group) if ddp else 1) / global_count.to(loss_sum.dtype)
    # value, with gradient `scale` with respect to the local loss_sum
    return value + (loss_sum - loss_sum.detach()) * scale
