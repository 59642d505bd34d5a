"""Context-parallel plans: which rank holds which rows of a ragged batch, and what moves.

A plan is computed on the host from the sequence lengths of one global batch, the same way on
every rank, so ranks agree on it without communication. It fixes

* the **layout**: rank ``r`` holds a list of *runs* ``(sequence, start, stop)``, rows
  ``[start, stop)`` of one sequence, stacked in that order (every row of the batch is held by
  exactly one rank);
* the **work**: rank ``r`` computes the attention of the query rows it holds over all their
  keys (the *query-home* rule: queries, outputs and their gradients never move); a run
  ``[a, e)`` of a sequence of length ``L`` computes ``sum_{i=a}^{e-1} (i + 1)`` query-key pairs
  under a causal mask (the triangle counted exactly) and ``(e - a) * L`` without;
* the **traffic**: the keys and values a run needs that other ranks hold (``[0, a)`` under a
  causal mask; ``[0, a)`` and ``[e, L)`` without), sent once per (sender, receiver) pair
  (``"balanced"``), or every rank's whole shard passed round a ring (``"static"``, the
  ring-attention baseline).

Two strategies (``docs/data.md``, "Context parallelism"):

``"balanced"`` (after DCP, Jiang et al., SOSP 2025: blocks of sequences mapped to devices per
batch, balancing computation and minimising communication). The non-empty sequences, longest
first, are laid end to end on a line weighted by their cost ``token_cost * L + pair_cost *
pairs(L)``; the line is cut into ``world_size`` pieces. Cut ``k`` may move within
``tolerance / 2`` of the ideal point ``k * total / world_size``, so every rank's cost is within
``1 +/- tolerance`` of the mean when the granularity allows. Inside that window the cut that
moves the fewest key/value rows wins: a sequence boundary (nothing moves), else, under a causal
mask, the earliest row (the later rank then needs the shortest prefix), else (no mask: the cut
costs the whole sequence wherever it falls) the row nearest the ideal point. Long sequences are
thus split across consecutive ranks at the rows that balance their quadratic cost; short ones
stay whole.

``"static"``: equal contiguous token shards of the packed batch in input order, keys and values
passed round a ring (``world_size - 1`` steps, every rank's shard reaching every other rank),
as ring attention does.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import Func, type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import public

Run = tuple[int, int, int]  # (sequence, start, stop)
Layout = tuple[tuple[Run, ...], ...]  # the runs of every rank, in local order

STRATEGIES = ("balanced", "static")


def pairs(causal: bool, length: int, start: int, stop: int) -> int:
    """Query-key pairs computed by the query rows ``[start, stop)`` of a sequence.

    >>> pairs(True, 4, 0, 4), pairs(True, 4, 2, 4), pairs(False, 4, 2, 4)
    (10, 7, 8)
    """
    if causal:
        return (stop * (stop + 1) - start * (start + 1)) // 2
    return (stop - start) * length


@public("distributed", namespace="ragged.distributed")
@dataclasses.dataclass(frozen=True, eq=False)
class ContextParallelPlan:
    """Where every row of a ragged batch lives for context-parallel attention, and what moves.

    Made by ``plan_context_parallel`` on the host, identically on every rank; reuse it for
    every attention layer of a batch. Rank ``r`` holds the *runs* ``runs(r)``: rows
    ``[start, stop)`` of a sequence, stacked in that order. ``shard`` cuts a global batch
    into that layout; ``positions`` gives each local row's position in its sequence (for
    rotary embeddings).

    Attributes:
        lengths: the global batch's sequence lengths.
        world_size: the number of ranks.
        causal: whether the plan is for causal attention (what each run needs differs).
        strategy: ``"balanced"`` or ``"static"`` (see ``plan_context_parallel``).
        layout: ``layout[r]`` is ``runs(r)``.

    >>> plan = plan_context_parallel([6, 2, 2], 2, causal=True)
    >>> plan.runs(0), plan.runs(1)
    ([(0, 0, 5)], [(0, 5, 6), (1, 0, 2), (2, 0, 2)])
    >>> plan.attention_pairs(), plan.kv_rows_received()
    ([15, 12], [0, 5])
    """

    lengths: tuple[int, ...]
    world_size: int
    causal: bool
    strategy: str
    layout: Layout
    _cache: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False)

    def _rank(self, func: Func, rank: object) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise value_error(func, "rank", f"must be an int in [0, {self.world_size})", repr(rank))
        return rank

    def runs(self, rank: int) -> list[Run]:
        """Rank ``rank``'s runs ``(sequence, start, stop)``, in local order."""
        return list(self.layout[self._rank(ContextParallelPlan.runs, rank)])

    def num_rows(self, rank: int) -> int:
        """The number of rows (tokens) rank ``rank`` holds."""
        return sum(e - a for _, a, e in self.layout[self._rank(ContextParallelPlan.num_rows, rank)])

    def rows(self, rank: int) -> Tensor:
        """Rank ``rank``'s rows as indices into the global batch's values (int64).

        >>> plan_context_parallel([3, 2], 2, causal=False, strategy="static").rows(1)
        tensor([2, 3, 4])
        """
        runs = self.layout[self._rank(ContextParallelPlan.rows, rank)]
        offsets = _offsets(self.lengths)
        return ranges_index([(offsets[s] + a, offsets[s] + e) for s, a, e in runs])

    def positions(self, rank: int) -> Tensor:
        """Each of rank ``rank``'s rows' position in its sequence (int64).

        >>> plan_context_parallel([6, 2, 2], 2, causal=True).positions(1)
        tensor([5, 0, 1, 0, 1])
        """
        runs = self.layout[self._rank(ContextParallelPlan.positions, rank)]
        return ranges_index([(a, e) for _, a, e in runs])

    def shard(self, x: RaggedArray, rank: int) -> RaggedArray:
        """Rank ``rank``'s rows of the global batch ``x``, one segment per run.

        Differentiable (an ``index_select`` of the values); reads nothing from the device.

        Raises:
            ValueError: ``x`` does not have the plan's number of sequences and rows.

        >>> import ragged, torch
        >>> x = ragged.from_lengths(torch.arange(10.0), [6, 2, 2])
        >>> plan_context_parallel([6, 2, 2], 2, causal=True).shard(x, 1).to_list()
        [[5.0], [6.0, 7.0], [8.0, 9.0]]
        """
        func = ContextParallelPlan.shard
        if not isinstance(x, RaggedArray):
            raise type_error(func, "x", "must be a RaggedArray", typename(x))
        if x.ragged_ndim != 1 or x.num_segments != len(self.lengths):
            raise value_error(
                func, "x", f"must have one ragged axis and {len(self.lengths)} segments", x.shape
            )
        if x.values.shape[0] != sum(self.lengths):
            raise value_error(
                func, "x", f"must have {sum(self.lengths)} rows (the plan's lengths)", x.shape
            )
        rank = self._rank(func, rank)
        values = x.values.index_select(0, self.rows(rank).to(x.device))
        return _local_array(values, self.layout[rank], x.axes)

    def attention_pairs(self) -> list[int]:
        """The query-key pairs every rank computes (its attention FLOPs are ``4 * H * D``
        times this, forward), causal triangles counted exactly."""
        return [
            sum(pairs(self.causal, self.lengths[s], a, e) for s, a, e in runs)
            for runs in self.layout
        ]

    def tokens(self) -> list[int]:
        """The rows every rank holds."""
        return [sum(e - a for _, a, e in runs) for runs in self.layout]

    def kv_rows_received(self) -> list[int]:
        """The key/value rows every rank receives in the forward pass (the backward sends as
        many gradient rows back): the rows its runs need from other ranks, each once per
        sender (``"balanced"``), or every other rank's whole shard (``"static"``, a ring)."""
        if self.strategy == "static":
            total = sum(self.lengths)
            return [total - t if self.world_size > 1 else 0 for t in self.tokens()]
        homes = home_map(self.layout)
        received = []
        for rank in range(self.world_size):
            wanted = other_rows(self, rank)
            per_peer = needs(homes, rank, wanted)
            received.append(sum(b - a for ranges in per_peer.values() for a, b in ranges))
        return received


def _offsets(lengths: Sequence[int]) -> list[int]:
    return list(itertools.accumulate(lengths, initial=0))


def ranges_index(ranges: Sequence[tuple[int, int]]) -> Tensor:
    """``cat(arange(a, b) for a, b in ranges)`` as an int64 CPU tensor."""
    parts = [torch.arange(a, b, dtype=torch.int64) for a, b in ranges if b > a]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def _local_array(values: Tensor, runs: Sequence[Run], axes: Any) -> RaggedArray:
    lengths = [e - a for _, a, e in runs]
    level = RowPartition.from_lengths(
        torch.tensor(lengths, dtype=torch.int64, device=values.device),
        values.shape[0],
        max(lengths, default=0),
        sum(n * n for n in lengths),
    )
    return RaggedArray(values, Partition((level,)), axes)


# --- what moves -------------------------------------------------------------------------------


Homes = dict[int, list[tuple[int, int, int, int]]]  # sequence -> [(start, stop, rank, local row)]


def home_map(layout: Layout) -> Homes:
    """Where every held piece of every sequence lives: sorted ``(start, stop, rank, local)``."""
    homes: Homes = {}
    for rank, runs in enumerate(layout):
        local = 0
        for s, a, e in runs:
            homes.setdefault(s, []).append((a, e, rank, local))
            local += e - a
    for pieces in homes.values():
        pieces.sort()
    return homes


def pieces(homes: Homes, seq: int, start: int, stop: int) -> list[tuple[int, int, int]]:
    """The rows ``[start, stop)`` of ``seq`` as ``(rank, local start, local stop)`` pieces."""
    found = homes.get(seq, [])
    out = []
    i = max(bisect.bisect_right(found, (start, float("inf"))) - 1, 0)
    while i < len(found) and found[i][0] < stop:
        a, e, rank, local = found[i]
        lo, hi = max(a, start), min(e, stop)
        if lo < hi:
            out.append((rank, local + lo - a, local + hi - a))
        i += 1
    return out


def other_rows(plan: ContextParallelPlan, rank: int) -> list[Run]:
    """The key/value rows each of ``rank``'s runs needs beyond its own rows, run by run."""
    wanted = []
    for s, a, e in plan.layout[rank]:
        if a > 0:
            wanted.append((s, 0, a))
        if not plan.causal and e < plan.lengths[s]:
            wanted.append((s, e, plan.lengths[s]))
    return wanted


def needs(homes: Homes, rank: int, wanted: Sequence[Run]) -> dict[int, list[tuple[int, int]]]:
    """The local rows of every other rank that ``rank`` needs for ``wanted``, as sorted,
    merged ranges per peer."""
    per_peer: dict[int, list[tuple[int, int]]] = {}
    for s, a, e in wanted:
        for peer, lo, hi in pieces(homes, s, a, e):
            if peer != rank:
                per_peer.setdefault(peer, []).append((lo, hi))
    return {peer: merge(ranges) for peer, ranges in sorted(per_peer.items())}


def merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint, non-adjacent ranges covering the same rows.

    >>> merge([(5, 7), (0, 2), (1, 3), (3, 4)])
    [(0, 4), (5, 7)]
    """
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


# --- planning ---------------------------------------------------------------------------------


@public("distributed", namespace="ragged.distributed")
def plan_context_parallel(
    lengths: Sequence[int] | Tensor,
    world_size: int,
    *,
    causal: bool,
    strategy: str = "balanced",
    token_cost: float = 0.0,
    pair_cost: float = 1.0,
    tolerance: float = 0.05,
    block: int = 1,
) -> ContextParallelPlan:
    """Plan context-parallel attention of a ragged batch over ``world_size`` ranks.

    Pure host computation from the lengths (a tensor is read once): run it in the data loader
    or once per batch, identically on every rank, and pass the plan to every
    ``context_parallel_attention`` call of that batch.

    Args:
        lengths: the global batch's sequence lengths.
        world_size: the number of ranks.
        causal: plan for causal attention (its cost is the triangle; each run needs only the
            keys before it) or for full attention within each sequence.
        strategy: ``"balanced"`` (DCP-style: cost-balanced cuts that move the fewest keys and
            values) or ``"static"`` (equal contiguous token shards, a ring: the baseline).
        token_cost: the cost of a row (the per-token layers, e.g. ``24 * d**2`` FLOPs of a
            transformer block against the attention's ``4 * d`` per pair).
        pair_cost: the cost of a query-key pair.
        tolerance: how far a rank's cost may stray from the mean (relative) to save
            communication (``"balanced"``).
        block: cut sequences only at multiples of this many rows (``"balanced"``; kernels on
            accelerators prefer aligned tiles).

    Returns:
        A ``ContextParallelPlan``.

    >>> import ragged
    >>> lengths = [64, 8, 8, 8, 8, 8, 8, 8, 8]
    >>> static = ragged.distributed.plan_context_parallel(lengths, 4, causal=True, strategy="static")
    >>> static.attention_pairs()  # the rank holding the end of the long sequence: 2.6x the mean
    [528, 1552, 144, 144]
    >>> plan = ragged.distributed.plan_context_parallel(lengths, 4, causal=True)
    >>> plan.attention_pairs()
    [595, 581, 594, 598]
    >>> plan.runs(1), plan.runs(2)  # the long sequence is cut where its triangle balances
    ([(0, 34, 48)], [(0, 48, 59)])
    >>> sum(plan.kv_rows_received()), sum(static.kv_rows_received())  # key/value rows moved
    (141, 384)
    """
    func = plan_context_parallel
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise type_error(func, "lengths", "must be a 1-D integer tensor", typename(lengths))
        host = [int(n) for n in lengths.tolist()]
    else:
        host = list(lengths)
    for i, n in enumerate(host):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise value_error(func, "lengths", "must be non-negative ints", f"lengths[{i}] = {n!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise value_error(func, "world_size", "must be a positive int", repr(world_size))
    if not isinstance(causal, bool):
        raise type_error(func, "causal", "must be a bool", typename(causal))
    if strategy not in STRATEGIES:
        raise value_error(func, "strategy", 'must be "balanced" or "static"', repr(strategy))
    for name, value in (("token_cost", token_cost), ("pair_cost", pair_cost)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise value_error(func, name, "must be a non-negative float", repr(value))
    if not token_cost and not pair_cost:
        raise value_error(func, "pair_cost", "must be positive when token_cost is 0", pair_cost)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        raise type_error(func, "tolerance", "must be a float", typename(tolerance))
    if not 0 <= tolerance < 1:
        raise value_error(func, "tolerance", "must be in [0, 1)", tolerance)
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise value_error(func, "block", "must be a positive int", repr(block))
    if strategy == "static":
        layout = _static_layout(host, world_size)
    else:
        layout = _balanced_layout(
            host, world_size, causal, float(token_cost), float(pair_cost), tolerance, block
        )
    return ContextParallelPlan(tuple(host), world_size, causal, strategy, layout)


def _static_layout(lengths: list[int], world: int) -> Layout:
    """Rank ``r`` holds the packed rows ``[r * T // W, (r + 1) * T // W)``."""
    offsets = _offsets(lengths)
    total = offsets[-1]
    layout = []
    for r in range(world):
        lo, hi = r * total // world, (r + 1) * total // world
        runs = []
        s = max(bisect.bisect_right(offsets, lo) - 1, 0)
        while s < len(lengths) and offsets[s] < hi:
            a, e = max(lo, offsets[s]) - offsets[s], min(hi, offsets[s + 1]) - offsets[s]
            if a < e:
                runs.append((s, a, e))
            s += 1
        layout.append(tuple(runs))
    return tuple(layout)


def _balanced_layout(
    lengths: list[int],
    world: int,
    causal: bool,
    token_cost: float,
    pair_cost: float,
    tolerance: float,
    block: int,
) -> Layout:
    order = sorted((s for s in range(len(lengths)) if lengths[s]), key=lambda s: -lengths[s])

    def cost(s: int, rows: int) -> float:
        """The cost of the first ``rows`` query rows of sequence ``s``."""
        return token_cost * rows + pair_cost * pairs(causal, lengths[s], 0, rows)

    prefix = list(itertools.accumulate((cost(s, lengths[s]) for s in order), initial=0.0))
    total = prefix[-1]
    # A cut is (j, a): before row a of sequence order[j]; (len(order), 0) is the end.
    cuts = [(0, 0)]
    for k in range(1, world):
        ideal = k * total / world
        cut = _cut(
            order, lengths, prefix, cost, ideal, tolerance * total / world / 2, block, causal
        )
        cuts.append(max(cut, cuts[-1]))
    cuts.append((len(order), 0))
    layout = []
    for (j1, a1), (j2, a2) in itertools.pairwise(cuts):
        runs = []
        for j in range(j1, min(j2, len(order) - 1) + 1):
            s = order[j]
            a = a1 if j == j1 else 0
            e = a2 if j == j2 else lengths[s]
            if a < e:
                runs.append((s, a, e))
        layout.append(tuple(runs))
    return tuple(layout)


def _cut(
    order: list[int],
    lengths: list[int],
    prefix: list[float],
    cost: Any,
    ideal: float,
    slack: float,
    block: int,
    causal: bool,
) -> tuple[int, int]:
    """The cut nearest ``ideal`` (in cost) within ``slack`` that moves the fewest rows."""
    lo, hi = ideal - slack, ideal + slack
    first, last = bisect.bisect_left(prefix, lo), bisect.bisect_right(prefix, hi)
    if first < last:  # sequence boundaries in the window: nothing moves; take the nearest
        near = bisect.bisect_left(prefix, ideal, first, last)
        candidates = [i for i in (near - 1, near) if first <= i < last]
        j = min(candidates, key=lambda i: (abs(prefix[i] - ideal), i))
        return (j, 0) if j < len(order) else (len(order), 0)
    # The window lies inside one sequence.
    j = min(max(bisect.bisect_right(prefix, ideal) - 1, 0), len(order) - 1)
    s, length, base = order[j], lengths[order[j]], prefix[j]
    steps = -(-length // block)  # candidate rows: multiples of block, then the end

    def row(i: int) -> int:
        return min(i * block, length)

    def at(i: int) -> float:
        return base + cost(s, row(i))

    if causal:  # the earliest row in the window: the later rank then needs the least
        i = bisect.bisect_left(range(steps + 1), lo, key=at)
        if i <= steps and at(i) <= hi:
            return _normal(j, row(i), length)
    i = bisect.bisect_left(range(steps + 1), ideal, key=at)
    candidates = [c for c in (i - 1, i) if 0 <= c <= steps]
    best = min(candidates, key=lambda c: abs(at(c) - ideal))
    return _normal(j, row(best), length)


def _normal(j: int, row: int, length: int) -> tuple[int, int]:
    """A cut at the end of a sequence is the start of the next."""
    return (j + 1, 0) if row >= length else (j, row)
