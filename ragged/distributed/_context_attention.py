"""Context-parallel attention over ``torch.distributed``: execution of a
``ragged._context_plan.ContextParallelPlan``.

Every rank computes the attention of the query rows it holds (its *runs*) over all their keys,
in two parts merged by their log-sum-exp:

* **own**: every run attends over its own rows (causal: the triangle; the flash kernel's
  top-left causal mask is exact because the run's queries and keys start at the same row);
* **other**: every run attends, without a mask, over the keys it needs from elsewhere (causal:
  the sequence's rows before the run; else all rows outside it), gathered into one buffer
  after the exchange (one message per sender and receiver, or a ring for the static baseline).

Both parts are the eager bucket kernel of ``ragged.attention`` (``buckets.forward``), which
returns the log-sum-exp of every query row. The merge is
``lse = logaddexp(lse_own, lse_other)``, ``out = exp(lse_own - lse) out_own +
exp(lse_other - lse) out_other`` (as torch's ring attention merges its steps).

Backward is exact: with the merged output ``O`` and log-sum-exp ``L`` of every query row, the
gradient of each part is the flash-attention backward of that part with ``O`` and ``L`` in place
of its own (``P_ij = exp(s_ij - L_i)`` and ``D_i = rowsum(dO_i * O_i)`` are the full attention's),
which ``buckets.vjp`` computes when called without a graph. The exchange is an
``autograd.Function`` whose backward sends the key/value gradients back to their owners and
sums them there. Double backward, forward-mode AD and ``vmap`` are not supported.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._array import RaggedArray
from .._errors import type_error, typename, value_error
from .._registry import public
from ..kernels import _attention_buckets as buckets
from ..kernels import _attention_plan as planner
from ..kernels._attention_mods import NONE, PLAIN, Variant
from ._agreement import agree
from ._context_plan import (
    ContextParallelPlan,
    other_rows,
    plan_context_parallel,
)
from ._transfer import Group, Transfer, direct_transfer, exchange_rows, ring_transfer

# --- one rank's attention ---------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class RankPlan:
    """One rank's share of a plan: its runs' lengths, the key/value transfer and the bucket
    plans of the two parts (per head size), cached on the plan."""

    rows: int
    own: list[int]  # rows of every run
    other: list[int]  # keys every run needs from elsewhere
    transfer: Transfer
    alone: Tensor | None  # bool [rows, 1]: rows of runs that need no other keys (None: none)
    kernel_plans: dict[tuple[int, str], tuple[planner.Plan, planner.Plan | None]]
    on_device: dict[str, tuple[Transfer, Tensor | None]]

    def bucket_plans(
        self, head_numel: int, device: torch.device
    ) -> tuple[planner.Plan, planner.Plan | None]:
        key = (head_numel, str(device))
        found = self.kernel_plans.get(key)
        if found is None:
            own = planner.build_plan(self.own, self.own, head_numel)
            other = None
            if any(self.other):
                other = planner.build_plan(self.own, self.other, head_numel)
            if device.type != "cpu":
                own = planner._to_device(own, device)
                other = None if other is None else planner._to_device(other, device)
            found = self.kernel_plans[key] = (own, other)
        return found

    def tensors(self, device: torch.device) -> tuple[Transfer, Tensor | None]:
        key = str(device)
        found = self.on_device.get(key)
        if found is None:
            alone = None if self.alone is None else self.alone.to(device)
            found = self.on_device[key] = (self.transfer.to(device), alone)
        return found


def rank_plan(plan: ContextParallelPlan, rank: int) -> RankPlan:
    """Rank ``rank``'s ``RankPlan`` (built once per plan and rank)."""
    key = ("rank", rank)
    found = plan._cache.get(key)
    if found is None:
        runs = plan.layout[rank]
        own = [e - a for _, a, e in runs]
        other = [a if plan.causal else plan.lengths[s] - (e - a) for s, a, e in runs]
        wanted = [other_rows(plan, r) for r in range(plan.world_size)]
        if plan.strategy == "static":
            transfer = ring_transfer(plan.layout, wanted, rank)
        else:
            transfer = direct_transfer(plan.layout, wanted, rank)
        alone = None
        if any(other) and not all(other):
            flags = torch.tensor([not n for n in other], dtype=torch.bool)
            alone = flags.repeat_interleave(torch.tensor(own), output_size=sum(own)).view(-1, 1)
        found = plan._cache[key] = RankPlan(sum(own), own, other, transfer, alone, {}, {})
    return found


class _MergedAttention(torch.autograd.Function):
    """The attention of the local queries over their own rows (``k``, ``v``) and over the
    other keys gathered for them (``ko``, ``vo``), merged; exact backward (module doc)."""

    @staticmethod
    def forward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        ko: Tensor | None,
        vo: Tensor | None,
        own: planner.Plan,
        other: planner.Plan | None,
        alone: Tensor | None,
        scale: float,
        causal: bool,
    ) -> tuple[Tensor, Tensor]:
        out, lse = buckets.forward(q, k, v, None, NONE, own, scale, Variant(causal=causal))
        if other is None or ko is None or vo is None:  # ko, vo may be empty (see attend)
            return out, lse
        out_o, lse_o = buckets.forward(q, ko, vo, None, NONE, other, scale, PLAIN)
        if alone is not None:  # rows without other keys: their lse_o is unspecified
            lse_o = lse_o.masked_fill(alone, -math.inf)
        merged = torch.logaddexp(lse, lse_o)
        weight = torch.exp(lse - merged).unsqueeze(-1).to(out.dtype)
        weight_o = torch.exp(lse_o - merged).unsqueeze(-1).to(out.dtype)
        return out * weight + out_o * weight_o, merged

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        q, k, v, ko, vo, own, other, _, scale, causal = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, ko, vo, out, lse)
        ctx.own, ctx.other, ctx.scale, ctx.causal = own, other, scale, causal

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor, _grad_lse: Any) -> tuple[Any, ...]:
        q, k, v, ko, vo, out, lse = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad = grad.contiguous()
        causal = Variant(causal=ctx.causal)
        dq, dk, dv, *_ = buckets.vjp(
            ctx.own, q, k, v, None, NONE, out, lse, grad, ctx.scale, causal, (*need[:3], False)
        )
        dko = dvo = None
        if ctx.other is not None and ko is not None:
            wants = (need[0], need[3], need[4], False)
            dq_o, dko, dvo, *_ = buckets.vjp(
                ctx.other, q, ko, vo, None, NONE, out, lse, grad, ctx.scale, PLAIN, wants
            )
            if dq is not None and dq_o is not None:
                dq = dq + dq_o
        # Always a gradient for the gathered keys and values, even empty or zero: the
        # exchange's backward must run on every rank (peers wait for the rows it sends back).
        if need[3] and dko is None:
            dko = torch.zeros_like(ko)
        if need[4] and dvo is None:
            dvo = torch.zeros_like(vo)
        return dq, dk, dv, dko, dvo, None, None, None, None, None


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    local: RankPlan,
    group: Group,
    scale: float,
    causal: bool,
) -> Tensor:
    """This rank's output rows for its local ``q``, ``k``, ``v`` (``[rows, H, D]``)."""
    transfer, alone = local.tensors(q.device)
    own, other = local.bucket_plans(q.shape[1] * q.shape[2], q.device)
    ko = vo = None
    if transfer.moves or other is not None:
        width = k.shape[-1]
        kv = torch.cat([k, v], -1)
        gathered = exchange_rows(kv, transfer, group)
        ko, vo = gathered[..., :width], gathered[..., width:]
    out, _ = _MergedAttention.apply(q, k, v, ko, vo, own, other, alone, scale, causal)
    return out


# --- the public function ----------------------------------------------------------------------


@public("distributed", namespace="ragged.distributed")
def context_parallel_attention(
    q: RaggedArray,
    k: RaggedArray,
    v: RaggedArray,
    *,
    causal: bool,
    group: Group = None,
    plan: ContextParallelPlan | None = None,
    scale: float | None = None,
) -> RaggedArray:
    """Self-attention within every sequence of a batch whose rows are spread over ranks.

    The result on every rank is what ``ragged.attention(q, k, v, causal=causal)`` on the whole
    global batch gives for this rank's rows, and so are the gradients (exact, not approximate).
    Every rank computes its own query rows; the keys and values they need from other ranks are
    exchanged (batched ``isend``/``irecv``: one message per sender and receiver for a
    ``"balanced"`` plan, a ring for a ``"static"`` one); partial results are merged by their
    log-sum-exp. Call it on every rank of ``group`` with the same plan.

    Args:
        q: this rank's queries ``(runs, L*, H, Dh)``. With a ``plan``: the rows
            ``plan.runs(rank)``, stacked in that order (``plan.shard(global_q, rank)`` lays
            them out; only the number of rows is checked). Without: whole sequences, the
            global batch being every rank's sequences in rank order (see below).
        k: keys ``(runs, L*, H, Dh)``, rows like ``q``.
        v: values ``(runs, L*, H, Dv)``, rows like ``q``.
        causal: query ``i`` of a sequence attends to keys ``j <= i`` of that sequence only.
        group: the process group (default: the world).
        plan: a ``ContextParallelPlan`` of the global batch for this group's size and
            this ``causal`` (from ``plan_context_parallel``; reuse it for every layer).
            ``None``: gather every rank's lengths (one host read and one object collective),
            plan a ``"balanced"`` layout, move the rows there and the outputs back (three
            extra exchanges per call: pass a plan in training loops).
        scale: the factor of the scores; default ``1 / sqrt(Dh)``.

    Returns:
        This rank's output rows ``(runs, L*, H, Dv)``, with the partition of ``q``.

    Raises:
        TypeError: an argument is not a RaggedArray or a plan, or dtypes differ.
        ValueError: shapes disagree, or the plan is for another world size, mask or number
            of rows; or the ranks disagree on the heads, head sizes, dtype, ``causal``,
            ``scale`` or plan (checked with one small all-gather before any exchange; every
            rank raises the same error).

    The planner runs on the host, without a process group:

    >>> import ragged, torch
    >>> plan = ragged.distributed.plan_context_parallel([9, 3, 2, 2], 2, causal=True)
    >>> plan.runs(0), plan.runs(1)
    ([(0, 0, 7)], [(0, 7, 9), (1, 0, 3), (2, 0, 2), (3, 0, 2)])
    >>> x = ragged.from_lengths(torch.randn(16, 2, 8), [9, 3, 2, 2])  # (B, L*, H, Dh)
    >>> plan.shard(x, 1).shape
    RaggedShape(4, [2, 3, 2, 2], 2, 8)

    On every rank of a group of two, ``local = plan.shard(x, rank)`` and
    ``context_parallel_attention(local, local, local, causal=True, plan=plan)`` equal the rows
    ``plan.rows(rank)`` of ``ragged.attention(x, x, x, causal=True).values`` (tested with 2
    and 4 processes in ``tests/test_context_parallel.py``).
    """
    _check(q, k, v)
    if not isinstance(causal, bool):
        raise type_error(context_parallel_attention, "causal", "must be a bool", typename(causal))
    if scale is None:
        scale = 1.0 / math.sqrt(int(q.values.shape[-1]))
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise type_error(
            context_parallel_attention, "scale", "must be a float or None", typename(scale)
        )
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if plan is not None and not isinstance(plan, ContextParallelPlan):
        raise type_error(
            context_parallel_attention,
            "plan",
            "must be a ContextParallelPlan or None",
            typename(plan),
        )
    agree(context_parallel_attention, q, v, plan, causal, float(scale), group, world)
    if plan is None:
        return _replanned(q, k, v, causal, group, float(scale), world, rank)
    if plan.world_size != world:
        raise value_error(
            context_parallel_attention,
            "plan",
            f"must be for the group's {world} ranks",
            f"{plan.world_size} ranks",
        )
    if plan.causal != causal:
        raise value_error(
            context_parallel_attention, "plan", f"must be made with causal={causal}", plan.causal
        )
    rows = plan.num_rows(rank)
    if q.values.shape[0] != rows:
        raise value_error(
            context_parallel_attention,
            "q",
            f"must hold rank {rank}'s {rows} rows of the plan",
            q.values.shape[0],
        )
    out = attend(q.values, k.values, v.values, rank_plan(plan, rank), group, float(scale), causal)
    return RaggedArray(out, q.partition, q.axes)


def _check(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, RaggedArray):
            raise type_error(context_parallel_attention, name, "must be a RaggedArray", typename(x))
        if x.ragged_ndim != 1 or x.values.dim() != 3:
            raise value_error(
                context_parallel_attention, name, "must have shape (B, L*, H, Dh)", x.shape
            )
        if not x.dtype.is_floating_point or x.dtype != q.dtype:
            raise type_error(
                context_parallel_attention,
                name,
                f"must have the floating dtype of `q` ({q.dtype})",
                x.dtype,
            )
    if k.values.shape != q.values.shape:
        raise value_error(
            context_parallel_attention, "k", f"must have the shape of `q` ({q.shape})", k.shape
        )
    if v.values.shape[:2] != q.values.shape[:2]:
        raise value_error(
            context_parallel_attention,
            "v",
            f"must have the rows and heads of `q` ({q.shape})",
            v.shape,
        )


def _replanned(
    q: RaggedArray,
    k: RaggedArray,
    v: RaggedArray,
    causal: bool,
    group: Group,
    scale: float,
    world: int,
    rank: int,
) -> RaggedArray:
    """``plan=None``: plan the gathered lengths, move the rows to the plan's layout and the
    outputs back."""
    if k.partition is not q.partition and not k.partition.equals(q.partition):
        raise value_error(
            context_parallel_attention,
            "k",
            "must have the partition of `q` without a plan",
            k.shape,
        )
    every: list[Any] = [None] * world
    dist.all_gather_object(every, q.lengths.tolist(), group=group)
    lengths = [n for host in every for n in host]
    plan = _PLANS.get((tuple(lengths), world, causal))
    if plan is None:
        plan = plan_context_parallel(lengths, world, causal=causal)
        _PLANS.clear()  # one batch's plan at a time: the layers of a model share it
        _PLANS[(tuple(lengths), world, causal)] = plan
    key = ("inputs", rank)
    moves = plan._cache.get(key)
    if moves is None:
        first = list(itertools.accumulate((len(host) for host in every), initial=0))
        inputs = tuple(
            tuple((s, 0, lengths[s]) for s in range(first[r], first[r + 1]) if lengths[s])
            for r in range(world)
        )
        moves = plan._cache[key] = (
            direct_transfer(inputs, plan.layout, rank),
            direct_transfer(plan.layout, inputs, rank),
        )
    inward, outward = (t.to(q.device) for t in moves)
    widths = [q.values.shape[-1], k.values.shape[-1], v.values.shape[-1]]
    qkv = exchange_rows(torch.cat([q.values, k.values, v.values], -1), inward, group)
    q2, k2, v2 = qkv.split(widths, -1)
    out = attend(q2, k2, v2, rank_plan(plan, rank), group, scale, causal)
    return RaggedArray(exchange_rows(out, outward, group), q.partition, q.axes)


_PLANS: dict[tuple[Any, ...], ContextParallelPlan] = {}
