"""Batch samplers for variable-length data: length bucketing and token budgets.

Both are ``torch.utils.data.Sampler``s of index lists, for ``DataLoader(batch_sampler=...)``.
Guarantees (``docs/semantics.md`` (data loading)): every index appears exactly once per epoch (except the
final incomplete batch that ``drop_last=True`` drops); with a seeded ``generator`` the sequence of
epochs is deterministic (each epoch advances the generator), so ranks that build the sampler with
the same seed see the same batches; without a generator each shuffled epoch draws its seed from
torch's global RNG, as ``RandomSampler`` does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from torch.utils.data import Sampler

from .._errors import Func, name_of, type_error, typename, value_error
from .._registry import public

__all__ = ["BucketBatchSampler", "TokenBudgetBatchSampler"]


def host_lengths(func: Func, lengths: object) -> list[int]:
    """Per-sample lengths as a host list of non-negative ints (a tensor is read once)."""
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise type_error(
                func,
                "lengths",
                "must be a 1-D integer tensor or a sequence of ints",
                typename(lengths),
            )
        host = lengths.tolist()
    elif isinstance(lengths, (Sequence, range)) and not isinstance(lengths, (str, bytes)):
        host = list(lengths)
    else:
        raise type_error(
            func, "lengths", "must be a 1-D integer tensor or a sequence of ints", typename(lengths)
        )
    for i, n in enumerate(host):
        if isinstance(n, bool) or not isinstance(n, int):
            raise type_error(func, "lengths", "must contain only ints", f"lengths[{i}] = {n!r}")
        if n < 0:
            raise value_error(func, "lengths", "must be non-negative", f"lengths[{i}] = {n}")
    return host


def positive_int(func: Func, param: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise type_error(func, param, "must be an int", typename(value))
    if value <= 0:
        raise value_error(func, param, "must be positive", value)
    return value


def _seeded(generator: torch.Generator | None) -> torch.Generator:
    if generator is not None:
        return generator
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    return torch.Generator().manual_seed(seed)


@public("data", namespace="ragged.data")
class BucketBatchSampler(Sampler[list[int]]):
    """Batches of samples of similar length: little padding if a model pads, balanced cost.

    Samples are grouped into length buckets (``length // bucket_width``, or ``num_buckets``
    groups of equal count by length rank). Each epoch shuffles the samples within each bucket,
    lays the buckets out in length order, cuts the sequence into batches of ``batch_size``
    (a batch mixes two neighbouring buckets only at a bucket boundary, and only the final batch
    can be incomplete), then shuffles the order of the batches.

    Args:
        lengths: per-sample lengths (a sequence of ints or a 1-D integer tensor).
        batch_size: samples per batch.
        bucket_width: width of a length bucket; give this or ``num_buckets``.
        num_buckets: number of buckets of (nearly) equal sample count.
        shuffle: shuffle within buckets and the order of batches; ``False`` gives the batches
            in bucket order, each bucket in index order.
        drop_last: drop the final batch when it is incomplete.
        generator: source of randomness; seed it for reproducible epochs.

    >>> import torch
    >>> from ragged.data import BucketBatchSampler
    >>> lengths = [5, 1, 4, 2, 9, 8, 3, 7]
    >>> list(BucketBatchSampler(lengths, 2, bucket_width=4, shuffle=False))
    [[1, 3], [6, 0], [2, 7], [4, 5]]
    >>> sampler = BucketBatchSampler(lengths, 3, num_buckets=2, generator=torch.Generator().manual_seed(0))
    >>> sorted(i for batch in sampler for i in batch), len(sampler)
    ([0, 1, 2, 3, 4, 5, 6, 7], 3)
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
    ) -> None:
        func = BucketBatchSampler
        self.lengths = host_lengths(func, lengths)
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
            rank = torch.empty(n, dtype=torch.int64)
            rank[torch.argsort(lengths_t, stable=True)] = torch.arange(n)
            self.buckets = rank * count // max(n, 1)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.generator = generator

    def __len__(self) -> int:
        n = len(self.lengths)
        if self.drop_last:
            return n // self.batch_size
        return -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        n = len(self.lengths)
        generator = _seeded(self.generator) if self.shuffle else None
        order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
        order = order[torch.argsort(self.buckets[order], stable=True)]
        batches = list(torch.split(order, self.batch_size)) if n else []
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if generator is not None:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        for batch in batches:
            yield batch.tolist()


@public("data", namespace="ragged.data")
class TokenBudgetBatchSampler(Sampler[list[int]]):
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

    Args:
        lengths: per-sample lengths (a sequence of ints or a 1-D integer tensor).
        max_tokens: the largest sum of lengths in a batch.
        max_padding_waste: optional bound on the fraction of padding if the batch were padded,
            ``1 - sum(L) / (n * max(L))``, in ``[0, 1)``.
        shuffle: shuffle the samples and the order of batches.
        generator: source of randomness; seed it for reproducible epochs.

    >>> from ragged.data import TokenBudgetBatchSampler
    >>> lengths = [5, 1, 4, 2, 9, 8, 3, 7]
    >>> list(TokenBudgetBatchSampler(lengths, 10, shuffle=False))
    [[0, 1, 2], [3], [4], [5], [6, 7]]
    >>> list(TokenBudgetBatchSampler(lengths, 10, max_padding_waste=0.3, shuffle=False))
    [[1, 3], [6, 2], [0], [7], [5], [4]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | Tensor,
        max_tokens: int,
        *,
        max_padding_waste: float | None = None,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        func = TokenBudgetBatchSampler
        self.lengths = host_lengths(func, lengths)
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
        self.shuffle = shuffle
        self.generator = generator
        self._planned: list[list[int]] | None = None

    def _plan(self) -> list[list[int]]:
        n = len(self.lengths)
        generator = _seeded(self.generator) if self.shuffle else None
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

    def __len__(self) -> int:
        if self._planned is None:
            self._planned = self._plan()
        return len(self._planned)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._planned if self._planned is not None else self._plan()
        self._planned = None
        yield from batches
