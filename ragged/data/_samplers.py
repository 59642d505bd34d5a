"""Batch samplers for variable-length data: length bucketing and token budgets.

Both are ``torch.utils.data.Sampler``s of index lists, for ``DataLoader(batch_sampler=...)``.
Guarantees (``docs/semantics.md`` (data loading)): every index appears exactly once per epoch (except the
final incomplete batch that ``drop_last=True`` drops); with a seeded ``generator`` the sequence of
epochs is deterministic (each epoch advances the generator), so ranks that build the sampler with
the same seed see the same batches; without a generator each shuffled epoch draws its seed from
torch's global RNG, as ``RandomSampler`` does.

Across ranks (``num_replicas > 1``, by default the initialised process group's size): every rank
plans the same global epoch (same ``seed`` or equally seeded ``generator``), sorts its batches
by cost, and cuts them into *steps* of ``num_replicas`` consecutive batches, so the batches of
one step cost about the same; rank ``r`` takes one batch of every step. A final incomplete
step is padded by repeating its own batches (or dropped with ``drop_last=True``), so every rank
yields the same number of batches. ``state_dict()``/``load_state_dict()`` resume an epoch at
its next batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .._errors import name_of, type_error, typename, value_error
from .._registry import public
from ._epochs import EpochSampler, positive_int

__all__ = ["BucketBatchSampler", "TokenBudgetBatchSampler"]

Cost = Callable[[list[int]], float]


@public("data", namespace="ragged.data")
class BucketBatchSampler(EpochSampler):
    """Batches of samples of similar length: little padding if a model pads, balanced cost.

    Samples are grouped into length buckets (``length // bucket_width``, or ``num_buckets``
    groups of equal count by length rank). Each epoch shuffles the samples within each bucket,
    lays the buckets out in length order, cuts the sequence into batches of ``batch_size``
    (a batch mixes two neighbouring buckets only at a bucket boundary, and only the final batch
    can be incomplete), then shuffles the order of the batches.

    Across ranks the epoch's batches are dealt in steps of batches of similar cost (module
    doc): rank ``rank`` yields ``ceil(batches / num_replicas)`` of them (``floor`` with
    ``drop_last``).

    Args:
        lengths: per-sample lengths (a sequence of ints or a 1-D integer tensor).
        batch_size: samples per batch (per rank).
        bucket_width: width of a length bucket; give this or ``num_buckets``.
        num_buckets: number of buckets of (nearly) equal sample count.
        shuffle: shuffle within buckets and the order of batches; ``False`` gives the batches
            in bucket order, each bucket in index order.
        drop_last: drop the final batch when it is incomplete, and across ranks the batches of
            an incomplete final step (instead of repeating some).
        generator: source of randomness; seed it for reproducible epochs.
        seed: instead of ``generator``: epoch ``e`` shuffles with ``seed + e`` (as
            ``DistributedSampler``). Default 0 when ``num_replicas > 1`` and no generator.
        num_replicas: the number of ranks; default the process group's size if one is
            initialised, else 1.
        rank: this rank; default the process group's rank, else 0.
        cost: the cost of a batch from its lengths, to deal batches of similar cost to the
            ranks of a step, e.g. ``ragged.data.MicrobatchCost(a=1.0, b=1 / 12288)``; default
            the number of tokens.

    >>> import torch
    >>> from ragged.data import BucketBatchSampler
    >>> lengths = [5, 1, 4, 2, 9, 8, 3, 7]
    >>> list(BucketBatchSampler(lengths, 2, bucket_width=4, shuffle=False))
    [[1, 3], [6, 0], [2, 7], [4, 5]]
    >>> sampler = BucketBatchSampler(lengths, 3, num_buckets=2, generator=torch.Generator().manual_seed(0))
    >>> sorted(i for batch in sampler for i in batch), len(sampler)
    ([0, 1, 2, 3, 4, 5, 6, 7], 3)
    >>> # Two ranks: steps of two batches of similar cost, [[4, 5], [2, 7]] and [[6, 0], [1, 3]]
    >>> [list(BucketBatchSampler(lengths, 2, bucket_width=4, shuffle=False, num_replicas=2,
    ...                          rank=r)) for r in range(2)]
    [[[4, 5], [1, 3]], [[2, 7], [6, 0]]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | Tensor,
        batch_size: int,
        *,
        bucket_width: int | None = None,
        num_buckets: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        cost: Cost | None = None,
    ) -> None:
        func = BucketBatchSampler
        super().__init__(
            func,
            lengths,
            shuffle=shuffle,
            drop_last=drop_last,
            generator=generator,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
            cost=cost,
        )
        self.batch_size = positive_int(func, "batch_size", batch_size)
        if (bucket_width is None) == (num_buckets is None):
            raise TypeError(
                f"{name_of(func)}: pass exactly one of `bucket_width` and `num_buckets`."
            )
        n = len(self.lengths)
        lengths_t = torch.tensor(self.lengths, dtype=torch.int64)
        if bucket_width is not None:
            width = positive_int(func, "bucket_width", bucket_width)
            self.buckets = lengths_t // width
        else:
            count = positive_int(func, "num_buckets", num_buckets)
            rank_of = torch.empty(n, dtype=torch.int64)
            rank_of[torch.argsort(lengths_t, stable=True)] = torch.arange(n)
            self.buckets = rank_of * count // max(n, 1)

    def __len__(self) -> int:
        n = len(self.lengths)
        batches = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        world = self.num_replicas
        return batches // world if self.drop_last else -(-batches // world)

    def _batches(self, generator: torch.Generator | None) -> list[list[int]]:
        n = len(self.lengths)
        order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
        order = order[torch.argsort(self.buckets[order], stable=True)]
        batches = list(torch.split(order, self.batch_size)) if n else []
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if generator is not None:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        return [batch.tolist() for batch in batches]


@public("data", namespace="ragged.data")
class TokenBudgetBatchSampler(EpochSampler):
    """Batches whose total length (the packed cost) stays within ``max_tokens``.

    Each epoch orders the samples (a random permutation, or index order without ``shuffle``),
    then fills batches greedily in that order: a batch closes when the next sample would take
    its sum of lengths past ``max_tokens``, or its padding waste past ``max_padding_waste``.
    With ``max_padding_waste`` the samples are first sorted by length (ties in the shuffled
    order), so that batches hold similar lengths. The order of the batches is then shuffled.

    A sample longer than ``max_tokens`` forms a batch of its own (it cannot be split); the
    budget is exceeded by that batch only.

    The number of batches depends on the epoch's order; ``len()`` plans the next epoch ahead and
    returns its exact batch count, and that plan is the one the next ``iter()`` yields.

    Across ranks (``num_replicas > 1``) ``max_tokens`` bounds every rank's batch; the epoch's
    batches are dealt in steps of batches of similar ``cost`` (module doc), so the ranks of a
    step wait little for each other.

    Args:
        lengths: per-sample lengths (a sequence of ints or a 1-D integer tensor).
        max_tokens: the largest sum of lengths in a batch.
        max_padding_waste: optional bound on the fraction of padding if the batch were padded,
            ``1 - sum(L) / (n * max(L))``, in ``[0, 1)``.
        shuffle: shuffle the samples and the order of batches.
        generator: source of randomness; seed it for reproducible epochs.
        seed: instead of ``generator``: epoch ``e`` shuffles with ``seed + e`` (as
            ``DistributedSampler``). Default 0 when ``num_replicas > 1`` and no generator.
        num_replicas: the number of ranks; default the process group's size if one is
            initialised, else 1.
        rank: this rank; default the process group's rank, else 0.
        drop_last: across ranks, drop the batches of an incomplete final step instead of
            repeating some of them.
        cost: the cost of a batch from its lengths (default its tokens), e.g.
            ``ragged.data.MicrobatchCost(a=1.0, b=1 / 12288)`` for attention's quadratic term.

    >>> from ragged.data import TokenBudgetBatchSampler
    >>> lengths = [5, 1, 4, 2, 9, 8, 3, 7]
    >>> list(TokenBudgetBatchSampler(lengths, 10, shuffle=False))
    [[0, 1, 2], [3], [4], [5], [6, 7]]
    >>> list(TokenBudgetBatchSampler(lengths, 10, max_padding_waste=0.3, shuffle=False))
    [[1, 3], [6, 2], [0], [7], [5], [4]]
    >>> ranks = [TokenBudgetBatchSampler(lengths, 10, seed=0, num_replicas=2, rank=r) for r in (0, 1)]
    >>> [[sum(lengths[i] for i in batch) for batch in step] for step in zip(*ranks)]  # per step
    [[9, 9], [3, 4], [9, 5]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | Tensor,
        max_tokens: int,
        *,
        max_padding_waste: float | None = None,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        cost: Cost | None = None,
    ) -> None:
        func = TokenBudgetBatchSampler
        super().__init__(
            func,
            lengths,
            shuffle=shuffle,
            drop_last=drop_last,
            generator=generator,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
            cost=cost,
        )
        self.max_tokens = positive_int(func, "max_tokens", max_tokens)
        if max_padding_waste is not None:
            if isinstance(max_padding_waste, bool) or not isinstance(
                max_padding_waste, (int, float)
            ):
                raise type_error(
                    func,
                    "max_padding_waste",
                    "must be a float or None",
                    typename(max_padding_waste),
                )
            if not 0 <= max_padding_waste < 1:
                raise value_error(func, "max_padding_waste", "must be in [0, 1)", max_padding_waste)
        self.max_padding_waste = max_padding_waste

    def _batches(self, generator: torch.Generator | None) -> list[list[int]]:
        n = len(self.lengths)
        order = (
            torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
        ).tolist()
        lengths = self.lengths
        if self.max_padding_waste is not None:
            order.sort(key=lengths.__getitem__)  # stable: ties keep the shuffled order
        batches: list[list[int]] = []
        batch: list[int] = []
        total = longest = 0
        for i in order:
            length = lengths[i]
            new_total, new_longest = total + length, max(longest, length)
            fits = new_total <= self.max_tokens
            if fits and self.max_padding_waste is not None and new_longest:
                padded = (len(batch) + 1) * new_longest
                fits = padded - new_total <= self.max_padding_waste * padded
            if batch and not fits:
                batches.append(batch)
                batch, new_total, new_longest = [], length, length
            batch.append(i)
            total, longest = new_total, new_longest
        if batch:
            batches.append(batch)
        if generator is not None:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        return batches
