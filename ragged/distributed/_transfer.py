"""Moving query, key and value rows between ranks for context-parallel attention: a
``Transfer`` (who sends which rows to whom: one message per sender and receiver, or a ring for
the static baseline) and ``exchange_rows``, an autograd Function whose backward sends the
gradients back to the rows' owners and sums them there."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._context_plan import Layout, Run, home_map, needs, pieces, ranges_index

Group = Any  # torch.distributed.ProcessGroup | None


# --- moving rows between ranks ----------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Transfer:
    """How one rank gathers rows held elsewhere: what it sends, what it receives, and where
    each wanted row sits in ``pool = cat([local rows, received rows])``.

    Attributes:
        ring: pass whole shards round a ring (``steps`` of them) instead of direct messages.
        sends: ``(peer, local row index)`` per peer that needs rows from this rank.
        recvs: ``(peer, rows)`` per peer this rank needs rows from (in pool order).
        ring_counts: for a ring, the rows received at each step.
        index: the pool row of every wanted row, in the wanted order.
    """

    ring: bool
    sends: list[tuple[int, Tensor]]
    recvs: list[tuple[int, int]]
    ring_counts: list[int]
    index: Tensor
    moves: bool  # whether this rank sends or receives anything

    def to(self, device: torch.device) -> Transfer:
        return Transfer(
            self.ring,
            [(p, i.to(device)) for p, i in self.sends],
            self.recvs,
            self.ring_counts,
            self.index.to(device),
            self.moves,
        )


def direct_transfer(source: Layout, wanted: Sequence[Sequence[Run]], rank: int) -> Transfer:
    """Rows ``wanted[r]`` (runs, in order) gathered by every rank ``r`` from ``source``, each
    needed row sent once per (sender, receiver) pair."""
    homes = home_map(source)
    mine = needs(homes, rank, wanted[rank])
    sends = []
    for peer in range(len(wanted)):
        if peer != rank:
            theirs = needs(homes, peer, wanted[peer]).get(rank)
            if theirs:
                sends.append((peer, ranges_index(theirs)))
    local = sum(e - a for _, a, e in source[rank])
    recvs, starts = [], {}
    offset = local
    for peer, ranges in mine.items():
        count = sum(b - a for a, b in ranges)
        recvs.append((peer, count))
        starts[peer] = (ranges, offset)
        offset += count
    index = []
    for s, a, e in wanted[rank]:
        for peer, lo, hi in pieces(homes, s, a, e):
            if peer == rank:
                index.append((lo, hi))
            else:
                index.append(_pool_range(*starts[peer], lo, hi))
    return Transfer(False, sends, recvs, [], ranges_index(index), bool(sends or recvs))


def _pool_range(ranges: list[tuple[int, int]], base: int, lo: int, hi: int) -> tuple[int, int]:
    """Where the peer's local rows ``[lo, hi)`` landed in the pool (they lie in one range)."""
    for a, b in ranges:
        if a <= lo and hi <= b:
            return base + lo - a, base + hi - a
        base += b - a
    raise AssertionError("a wanted row was not requested")  # pragma: no cover


def ring_transfer(source: Layout, wanted: Sequence[Sequence[Run]], rank: int) -> Transfer:
    """Rows ``wanted[rank]`` after every shard has been passed round the ring: at step ``s``
    rank ``r`` receives the shard of rank ``r - s`` from rank ``r - 1``."""
    world = len(source)
    sizes = [sum(e - a for _, a, e in runs) for runs in source]
    homes = home_map(source)
    start = {rank: 0}
    offset = sizes[rank]
    counts = []
    for step in range(1, world):
        owner = (rank - step) % world
        start[owner] = offset
        offset += sizes[owner]
        counts.append(sizes[owner])
    index = [
        (start[peer] + lo, start[peer] + hi)
        for s, a, e in wanted[rank]
        for peer, lo, hi in pieces(homes, s, a, e)
    ]
    return Transfer(True, [], [], counts, ranges_index(index), world > 1)


def _p2p(
    outgoing: Sequence[tuple[int, Tensor]],
    incoming: Sequence[tuple[int, int]],
    like: Tensor,
    group: Group,
) -> list[Tensor]:
    """Send ``outgoing`` tensors and receive ``incoming`` row counts (rows shaped like
    ``like``'s), all at once; empty messages are skipped on both sides."""
    ops = []
    received = []
    for peer, count in incoming:
        buffer = like.new_empty((count, *like.shape[1:]))
        received.append(buffer)
        if count:
            ops.append(dist.P2POp(dist.irecv, buffer, group=group, group_peer=peer))
    for peer, tensor in outgoing:
        if tensor.shape[0]:
            ops.append(dist.P2POp(dist.isend, tensor.contiguous(), group=group, group_peer=peer))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return received


class _Exchange(torch.autograd.Function):
    """Send rows of ``x`` to peers and receive rows from peers (differentiable).

    ``sends``: ``(peer, index)``, the rows of ``x`` each peer gets (``None``: all of ``x``);
    ``recvs``: ``(peer, rows)``; the result is the received rows in ``recvs`` order. Backward
    sends the gradient of what was received back to its senders, which sum it into ``x``.
    """

    @staticmethod
    def forward(
        x: Tensor,
        sends: Sequence[tuple[int, Tensor | None]],
        recvs: Sequence[tuple[int, int]],
        group: Group,
    ) -> Tensor:
        outgoing = [(p, x if i is None else x.index_select(0, i)) for p, i in sends]
        parts = _p2p(outgoing, recvs, x, group)
        return torch.cat(parts) if parts else x.new_empty((0, *x.shape[1:]))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, sends, recvs, group = inputs
        ctx.sends, ctx.recvs, ctx.group, ctx.shape = sends, recvs, group, x.shape

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        back = list(
            zip((p for p, _ in ctx.recvs), grad.split([n for _, n in ctx.recvs]), strict=True)
        )
        counts = [(p, ctx.shape[0] if i is None else i.shape[0]) for p, i in ctx.sends]
        returned = _p2p(back, counts, grad, ctx.group)
        dx = grad.new_zeros(ctx.shape)
        for (_, index), part in zip(ctx.sends, returned, strict=True):
            if index is None:
                dx += part
            else:
                dx.index_add_(0, index, part)
        return dx, None, None, None


def exchange_rows(x: Tensor, transfer: Transfer, group: Group) -> Tensor:
    """The wanted rows of ``transfer``: ``x`` (this rank's local rows) and the rows received,
    in the wanted order (differentiable)."""
    if not transfer.moves:
        return x.index_select(0, transfer.index)
    if transfer.ring:
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        parts = [x]
        shard = x
        for count in transfer.ring_counts:
            shard = _Exchange.apply(
                shard, [((rank + 1) % world, None)], [((rank - 1) % world, count)], group
            )
            parts.append(shard)
    else:
        parts = [x, _Exchange.apply(x, transfer.sends, transfer.recvs, group)]
    return torch.cat(parts).index_select(0, transfer.index)
