"""Sampling: distributions (chi-square checks with fixed seeds, so never flaky), exact counts,
no duplicates, seeding, edge cases and compilation."""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
import ragged.testing
from tests.strategies import lengths as lengths_strategy
from tests.strategies import random_tensor


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def chi_square(counts: torch.Tensor, expected: float) -> float:
    return float(((counts.double() - expected) ** 2 / expected).sum())


# Chi-square critical values at p = 1e-4 (the seeds are fixed, so a pass is reproducible; the
# threshold only has to reject a biased sampler, which gives statistics in the hundreds here).
CHI2_CRITICAL = {2: 18.4, 3: 21.1, 5: 25.7, 9: 33.7, 14: 41.1}


def arange_array(lengths: list[int], inner: tuple[int, ...] = ()) -> ragged.RaggedArray:
    total = sum(lengths)
    values = torch.arange(total, dtype=torch.float64).reshape(total, *[1] * len(inner))
    return ragged.from_lengths(values.expand(total, *inner).clone(), lengths)


def subset_codes(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Encode each segment's chosen subset (rows of a ``(B, length)`` mask) as an integer."""
    return (mask.reshape(-1, length).long() << torch.arange(length)).sum(1)


# --- uniformity --------------------------------------------------------------------------------


@pytest.mark.parametrize(("length", "k"), [(5, 2), (3, 1), (6, 4)])
def test_sample_mask_subsets_are_uniform(length, k):
    b = 6000
    x = ragged.from_lengths(torch.zeros(b * length), [length] * b)
    mask = ragged.sample_mask(x, k, generator=seeded(1)).values
    counts = torch.bincount(subset_codes(mask, length), minlength=1 << length)
    subsets = [sum(1 << i for i in c) for c in itertools.combinations(range(length), k)]
    assert counts.sum() == counts[subsets].sum() == b  # only subsets of size k occur
    dof = len(subsets) - 1
    assert chi_square(counts[subsets], b / len(subsets)) < CHI2_CRITICAL[dof]


def test_sample_mask_is_uniform_in_a_mixed_batch():
    # Segments of different lengths in one batch: each length's subsets are uniform.
    pattern = [0, 3, 1, 5, 3]
    lengths = pattern * 3000
    x = ragged.from_lengths(torch.zeros(sum(lengths)), lengths)
    mask = ragged.sample_mask(x, 2, generator=seeded(2))
    for length in (3, 5):
        rows = torch.cat([s for s, n in zip(mask.unbind(), lengths, strict=True) if n == length])
        counts = torch.bincount(subset_codes(rows, length), minlength=1 << length)
        subsets = [sum(1 << i for i in c) for c in itertools.combinations(range(length), 2)]
        assert counts[subsets].sum() == rows.shape[0] // length
        expected = rows.shape[0] / length / len(subsets)
        assert chi_square(counts[subsets], expected) < CHI2_CRITICAL[len(subsets) - 1]
    ones = torch.cat([s for s, n in zip(mask.unbind(), lengths, strict=True) if n == 1])
    assert ones.all()


def test_sample_with_replacement_is_uniform():
    b, length, k = 4000, 4, 3
    x = arange_array([length] * b)
    y = ragged.sample(x, k, replace=True, generator=seeded(3))
    position = y.values.long() - x.offsets[y.segment_ids]
    counts = torch.bincount(position, minlength=length)
    assert chi_square(counts, b * k / length) < CHI2_CRITICAL[length - 1]
    # pairs of consecutive draws are independent: all 16 ordered pairs equally likely
    pairs = position.reshape(b, k)[:, :2]
    pair_counts = torch.bincount(pairs[:, 0] * length + pairs[:, 1], minlength=length**2)
    assert chi_square(pair_counts, b / length**2) < 2 * CHI2_CRITICAL[14]


def test_sample_balanced_is_uniform_within_each_class():
    b = 6000
    segment = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, -1]
    labels = ragged.from_lengths(torch.tensor(segment * b), [len(segment)] * b)
    mask = ragged.sample_balanced(labels, 4, generator=seeded(4)).values.reshape(b, -1)
    assert (mask[:, :4].sum(1) == 2).all() and (mask[:, 4:10].sum(1) == 2).all()
    assert not mask[:, 10].any()
    for lo, hi, subsets in ((0, 4, 6), (4, 10, 15)):
        codes = subset_codes(mask[:, lo:hi], hi - lo)
        counts = torch.bincount(codes, minlength=1 << (hi - lo))
        counts = counts[counts > 0]
        assert counts.numel() == subsets
        assert chi_square(counts, b / subsets) < CHI2_CRITICAL[subsets - 1]


# --- exact counts and structure -------------------------------------------------------------


@given(lengths=lengths_strategy(max_segments=8, max_length=6), k=st.integers(0, 8))
def test_mask_counts_are_exact(lengths, k):
    x = ragged.from_lengths(torch.zeros(sum(lengths), 2), lengths)
    mask = ragged.sample_mask(x, k, generator=seeded(k))
    assert mask.partition is x.partition and mask.dtype == torch.bool
    expected = torch.tensor(lengths, dtype=torch.int64).clamp_max(k)
    torch.testing.assert_close(ragged.sum(mask, axis=1), expected)
    quotas = torch.randint(0, 8, (len(lengths),), generator=seeded(k))
    per_segment = ragged.sample_mask(x, quotas, generator=seeded(k))
    expected = torch.minimum(torch.tensor(lengths, dtype=torch.int64), quotas)
    torch.testing.assert_close(ragged.sum(per_segment, axis=1), expected)


@given(
    lengths=lengths_strategy(max_segments=8, max_length=6),
    k=st.integers(0, 8),
    seed=st.integers(0, 2**31 - 1),
    layout=st.sampled_from(["contiguous", "strided", "transposed"]),
)
def test_sample_without_replacement(lengths, k, seed, layout):
    total = sum(lengths)
    values = random_tensor((total, 2), torch.float64, seed, layout)
    ids = torch.arange(total)
    x = ragged.from_lengths(values, lengths)
    y = ragged.sample(x, k, generator=seeded(seed))
    mask = ragged.sample_mask(x, k, generator=seeded(seed)).values
    torch.testing.assert_close(y.values, values[mask])  # the mask's rows, in order
    assert y.lengths.tolist() == [min(k, n) for n in lengths]
    # no duplicates, original order, rows of their own segment
    chosen = ids[mask]
    for seg, lo, hi in zip(
        ragged.from_lengths(chosen, y.lengths).unbind(),
        x.offsets[:-1].tolist(),
        x.offsets[1:].tolist(),
        strict=True,
    ):
        assert (seg[1:] > seg[:-1]).all() and ((seg >= lo) & (seg < hi)).all()


@given(lengths=lengths_strategy(max_segments=8, max_length=6), k=st.integers(0, 5))
def test_sample_with_replacement_structure(lengths, k):
    x = arange_array(lengths, (2,))
    y = ragged.sample(x, k, replace=True, generator=seeded(k))
    assert y.lengths.tolist() == [k if n else 0 for n in lengths]
    assert y.partition.levels[0].max_length == (k if any(lengths) else 0)
    rows = y.values[:, 0].long()
    segment = y.segment_ids
    assert ((rows >= x.offsets[segment]) & (rows < x.offsets[segment + 1])).all()
    quotas = torch.arange(len(lengths))
    z = ragged.sample(x, quotas, replace=True, generator=seeded(k))
    assert z.lengths.tolist() == [q if n else 0 for q, n in enumerate(lengths)]


@settings(max_examples=60)
@given(
    lengths=lengths_strategy(max_segments=8, max_length=10),
    k=st.integers(0, 10),
    fraction=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
    seed=st.integers(0, 2**31 - 1),
    bools=st.booleans(),
)
def test_sample_balanced_counts(lengths, k, fraction, seed, bools):
    total = sum(lengths)
    raw = torch.randint(-1, 2, (total,), generator=seeded(seed))
    labels = ragged.from_lengths(raw > 0 if bools else raw, lengths)
    mask = ragged.sample_balanced(labels, k, positive_fraction=fraction, generator=seeded(seed))
    assert mask.partition is labels.partition
    positive = raw > 0
    negative = raw <= 0 if bools else raw == 0
    quota = round(k * fraction)
    for m, p, n in zip(
        mask.unbind(),
        ragged.from_lengths(positive, lengths).unbind(),
        ragged.from_lengths(negative, lengths).unbind(),
        strict=True,
    ):
        num_pos = min(int(p.sum()), quota)
        assert int((m & p).sum()) == num_pos
        assert int((m & n).sum()) == min(int(n.sum()), k - num_pos)
        assert not (m & ~p & ~n).any()  # ignored rows are never chosen


def test_sample_balanced_rounds_half_to_even_and_accepts_per_segment_k():
    labels = ragged.from_lengths(torch.tensor([1] * 6 + [0] * 6), [12])
    # k = 5, fraction 0.5: round(2.5) = 2 positives (torchvision's int() gives 2 as well)
    mask = ragged.sample_balanced(labels, 5, generator=seeded()).values
    assert int(mask[:6].sum()) == 2 and int(mask[6:].sum()) == 3
    # k = 3: round(1.5) = 2 positives, then 1 negative
    mask = ragged.sample_balanced(labels, torch.tensor([3]), generator=seeded()).values
    assert int(mask[:6].sum()) == 2 and int(mask[6:].sum()) == 1


# --- seeding, identity, gradients, edge cases ---------------------------------------------------


def test_seeded_generator_is_deterministic():
    x = ragged.from_lengths(torch.zeros(3000), [30] * 100)
    a = ragged.sample_mask(x, 7, generator=seeded(5)).values
    b = ragged.sample_mask(x, 7, generator=seeded(5)).values
    c = ragged.sample_mask(x, 7, generator=seeded(6)).values
    assert torch.equal(a, b) and not torch.equal(a, c)
    r1 = ragged.sample(x, 7, replace=True, generator=seeded(5)).values
    r2 = ragged.sample(x, 7, replace=True, generator=seeded(5)).values
    assert torch.equal(r1, r2)
    torch.manual_seed(11)
    g1 = ragged.sample_mask(x, 7).values
    torch.manual_seed(11)
    assert torch.equal(g1, ragged.sample_mask(x, 7).values)


def test_sample_returns_x_when_every_row_is_chosen():
    x = ragged.from_lengths(torch.randn(6, 2), [2, 0, 4])
    assert x.partition.levels[0].max_length == 4
    assert ragged.sample(x, 4) is x
    y = ragged.sample(x, 3, generator=seeded())
    assert y.partition.levels[0].max_length == 3


def test_sample_gradient_counts_the_draws():
    lengths = [3, 0, 5, 1]
    values = torch.arange(9, dtype=torch.float64).requires_grad_()
    x = ragged.from_lengths(values, lengths)
    y = ragged.sample(x, 6, replace=True, generator=seeded())
    (grad,) = torch.autograd.grad(y.values.sum(), values)
    torch.testing.assert_close(grad, torch.bincount(y.values.long(), minlength=9).double())
    z = ragged.sample(x, 2, generator=seeded())
    (grad,) = torch.autograd.grad((z.values * 2).sum(), values)
    torch.testing.assert_close(
        grad, 2.0 * ragged.sample_mask(x, 2, generator=seeded()).values.double()
    )


@pytest.mark.parametrize("lengths", [[], [0, 0, 0], [7], [1]])
def test_edge_partitions(lengths):
    x = arange_array(lengths, (2,))
    for k in (0, 1, 3):
        mask = ragged.sample_mask(x, k, generator=seeded())
        assert mask.values.shape == (sum(lengths),)
        assert ragged.sample(x, k, generator=seeded()).lengths.tolist() == [
            min(k, n) for n in lengths
        ]
        assert ragged.sample(x, k, replace=True).lengths.tolist() == [
            k if n else 0 for n in lengths
        ]
        labels = x.with_values(x.values[:, 0].long() % 3 - 1)
        assert ragged.sample_balanced(labels, k).values.shape == (sum(lengths),)


def test_named_mask_keeps_batch_and_ragged_names():
    x = ragged.from_lengths(torch.zeros(5, 2), [2, 3], axes=("batch", "seq", "feat"))
    assert ragged.sample_mask(x, 1).axes == ("batch", "seq")
    assert ragged.sample(x, 1).axes == ("batch", "seq", "feat")


def test_masks_compile_once():
    def fn(x):
        labels = x.with_values((x.values > 0).long() - (x.values < -1).long())
        mask = ragged.sample_mask(x, 3)
        balanced = ragged.sample_balanced(labels, 4, positive_fraction=0.25)
        return ragged.sum(mask, axis=1), ragged.sum(balanced, axis=1)

    batches = [
        (ragged.from_lengths(torch.randn(sum(n)), n),)
        for n in ([2, 5], [4, 0, 1, 7], [6, 5, 2, 3, 9], [3, 3, 0])
    ]
    report = ragged.testing.check_compile(fn, batches)
    assert report.graphs == 1
