"""Dynamic micro-batching: split a global batch into micro-batches of least total cost.

After DynaPipe (Jiang et al., "DynaPipe: Optimizing Multi-task Training through Dynamic
Pipelines", EuroSys 2024): sort the samples by length and choose the micro-batch boundaries by
dynamic programming over contiguous ranges of the sorted order, under a per-micro-batch memory
(token) cap.

Cost model (``MicrobatchCost``), per micro-batch of lengths ``L``:

* packed / ragged execution: ``a * sum(L) + b * sum(L**2) + c``;
* padded execution: ``a * n * max(L) + b * n * max(L)**2 + c``.

For the padded cost the contiguous DP is exactly optimal over *all* partitions (exchange
argument in ``docs/semantics.md`` (data loading), checked against brute force in the tests). The packed
cost is separable (``a * sum(L) + b * sum(L**2)`` is the same for every partition), so only
``c`` times the number of micro-batches varies: minimising it under a token cap is bin packing,
where contiguous ranges are not always optimal. The planner then returns the better of the
contiguous DP and first-fit decreasing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .._errors import type_error, typename, value_error
from .._registry import public
from ._epochs import host_lengths, positive_int

__all__ = ["MicrobatchCost", "plan_cost", "plan_microbatches"]


@public("data", namespace="ragged.data")
@dataclasses.dataclass(frozen=True)
class MicrobatchCost:
    """Cost of one micro-batch: linear plus quadratic in length, plus a fixed overhead.

    Attributes:
        a: cost per token (the linear layers).
        b: cost per squared token (attention over each sample).
        c: fixed cost per micro-batch (launch overhead, weight reads, pipeline bubbles). With
            ``c = 0`` the padded cost is least with one sample per micro-batch.
        padded: the micro-batch runs padded to its longest sample (``n * max(L)`` tokens)
            instead of packed (``sum(L)`` tokens). The token cap of [`plan_microbatches`][ragged.data.plan_microbatches]
            counts tokens the same way.

    >>> cost = MicrobatchCost(a=1.0, b=0.01, c=10.0)
    >>> cost([10, 20]), MicrobatchCost(a=1.0, b=0.01, c=10.0, padded=True)([10, 20])
    (45.0, 58.0)
    """

    a: float = 1.0
    b: float = 0.0
    c: float = 0.0
    padded: bool = False

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise type_error(MicrobatchCost, name, "must be a float", typename(value))
            if not value >= 0:
                raise value_error(MicrobatchCost, name, "must be non-negative", value)

    def __call__(self, lengths: Sequence[int]) -> float:
        """The cost of one micro-batch holding samples of these lengths."""
        if not lengths:
            return 0.0
        if self.padded:
            longest = max(lengths)
            return len(lengths) * (self.a * longest + self.b * longest * longest) + self.c
        return self.a * sum(lengths) + self.b * sum(n * n for n in lengths) + self.c

    def tokens(self, lengths: Sequence[int]) -> int:
        """The memory measure the token cap bounds: ``sum(L)``, or ``n * max(L)`` if padded."""
        if self.padded:
            return len(lengths) * max(lengths, default=0)
        return sum(lengths)


@public("data", namespace="ragged.data")
def plan_cost(
    lengths: Sequence[int] | Tensor, plan: Sequence[Sequence[int]], cost: MicrobatchCost
) -> float:
    """Total cost of a plan (micro-batches as lists of indices into ``lengths``).

    >>> plan_cost([3, 1, 2], [[1, 2], [0]], MicrobatchCost(c=1.0))
    8.0
    """
    host = host_lengths(plan_cost, lengths)
    return sum(cost([host[i] for i in batch]) for batch in plan)


@public("data", namespace="ragged.data")
def plan_microbatches(
    lengths: Sequence[int] | Tensor,
    *,
    max_tokens: int | None = None,
    cost: MicrobatchCost | None = None,
    max_samples: int | None = None,
) -> list[list[int]]:
    """Split a global batch into micro-batches of least total cost (DynaPipe-style).

    The samples are sorted by length and the boundaries between micro-batches chosen by an
    O(n^2) dynamic program over contiguous ranges of the sorted order (the inner minimum is
    vectorised; a token cap restricts it to a window). Among plans of equal cost the one with
    fewer micro-batches wins. A sample that alone exceeds a cap gets a micro-batch of its own.

    Args:
        lengths: per-sample lengths (a sequence of ints or a 1-D integer tensor, read once).
        max_tokens: cap per micro-batch on ``sum(L)`` (packed cost) or ``n * max(L)`` (padded
            cost): the memory bound.
        cost: the [`MicrobatchCost`][ragged.data.MicrobatchCost]; default ``MicrobatchCost()`` (``a=1``, packed), which
            makes the plan the fewest micro-batches under the cap.
        max_samples: cap on the number of samples per micro-batch.

    Returns:
        The micro-batches as lists of indices into ``lengths``, each in increasing length
        order; every index appears exactly once. For the padded cost the plan is optimal over
        all partitions; for the packed cost it is the better of the optimal contiguous plan and
        first-fit decreasing (the packed problem under a cap is bin packing).

    >>> lengths = [100, 3, 98, 5, 4, 97]
    >>> cost = MicrobatchCost(a=1.0, c=50.0, padded=True)
    >>> plan_microbatches(lengths, cost=cost)
    [[1, 4, 3], [5, 2, 0]]
    >>> plan = plan_microbatches(lengths, cost=cost)
    >>> plan_cost(lengths, plan, cost), plan_cost(lengths, [[0, 1, 2], [3, 4, 5]], cost)
    (415.0, 691.0)
    >>> plan_microbatches([1, 1, 9, 9], max_tokens=10)  # packed: bin packing, not contiguous
    [[0, 2], [1, 3]]
    """
    func = plan_microbatches
    host = host_lengths(func, lengths)
    cost = MicrobatchCost() if cost is None else cost
    if not isinstance(cost, MicrobatchCost):
        raise type_error(func, "cost", "must be a ragged.data.MicrobatchCost", typename(cost))
    cap = math.inf if max_tokens is None else positive_int(func, "max_tokens", max_tokens)
    count_cap = len(host) if max_samples is None else positive_int(func, "max_samples", max_samples)
    order = sorted(range(len(host)), key=host.__getitem__)
    plan = _contiguous_dp([host[i] for i in order], cap, count_cap, cost)
    result = [[order[p] for p in range(start, stop)] for start, stop in plan]
    if not cost.padded:
        packed = _first_fit_decreasing(host, order, cap, count_cap)
        if len(packed) < len(result):
            result = packed
    return result


def _contiguous_dp(
    sorted_lengths: list[int], cap: float, count_cap: int, cost: MicrobatchCost
) -> list[tuple[int, int]]:
    """Optimal split of the sorted lengths into ranges ``[start, stop)``: (cost, count) least."""
    n = len(sorted_lengths)
    if n == 0:
        return []
    lengths = torch.tensor(sorted_lengths, dtype=torch.float64)
    zero = torch.zeros(1, dtype=torch.float64)
    sums = torch.cat([zero, torch.cumsum(lengths, 0)])
    squares = torch.cat([zero, torch.cumsum(lengths * lengths, 0)])
    best = torch.full((n + 1,), math.inf, dtype=torch.float64)
    best[0] = 0.0
    counts = torch.zeros(n + 1, dtype=torch.float64)
    previous = [0] * (n + 1)
    host_sums = [0, *torch.cumsum(torch.tensor(sorted_lengths), 0).tolist()]
    low = 0
    for stop in range(1, n + 1):
        longest = sorted_lengths[stop - 1]

        def fits(start: int, stop: int = stop, longest: int = longest) -> bool:
            size = stop - start
            tokens = size * longest if cost.padded else host_sums[stop] - host_sums[start]
            return size <= count_cap and tokens <= cap

        while low < stop - 1 and not fits(low):
            low += 1
        starts = torch.arange(low, stop)
        if cost.padded:
            per_sample = cost.a * longest + cost.b * longest * longest
            group = (stop - starts).to(torch.float64) * per_sample + cost.c
        else:
            group = (
                cost.a * (sums[stop] - sums[low:stop])
                + cost.b * (squares[stop] - squares[low:stop])
                + cost.c
            )
        total = best[low:stop] + group
        least = total.min()
        near = total <= least + 1e-9 * max(1.0, abs(float(least)))
        pick = int(torch.argmin(torch.where(near, counts[low:stop], math.inf)))
        best[stop] = total[pick]
        counts[stop] = counts[low + pick] + 1
        previous[stop] = low + pick
    bounds = []
    stop = n
    while stop > 0:
        bounds.append((previous[stop], stop))
        stop = previous[stop]
    return bounds[::-1]


def _first_fit_decreasing(
    lengths: list[int], order: list[int], cap: float, count_cap: int
) -> list[list[int]]:
    """Bin packing by first-fit decreasing; bins listed as increasing-length index lists."""
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in reversed(order):
        for b, load in enumerate(loads):
            if load + lengths[i] <= cap and len(bins[b]) < count_cap:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [b[::-1] for b in reversed(bins)]
