"""ragged.data: collate (the ragged/dense rule, partitions, DataLoader use) and batch samplers
(every index once per epoch, budgets and bucketing hold, determinism with a seeded generator)."""

import collections
import functools
import re

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given
from torch.utils.data import DataLoader

import ragged
from ragged.data import BucketBatchSampler, TokenBudgetBatchSampler, collate
from tests.strategies import lengths as lengths_strategy

# --- collate ----------------------------------------------------------------------------------


@given(lengths_strategy(min_segments=1), st.sampled_from([(), (3,), (2, 2)]))
def test_collate_tensors_is_concatenation(lens, inner):
    samples = [torch.randn(n, *inner, dtype=torch.float64) for n in lens]
    x = collate(samples)
    assert isinstance(x, ragged.RaggedArray)
    assert x.lengths.tolist() == lens
    assert x.partition.levels[0].max_length == max(lens)  # host-known: no sync later
    assert tuple(x.inner_shape) == inner
    for got, want in zip(x.unbind(), samples, strict=True):
        torch.testing.assert_close(got, want)


def test_collate_bare_tensors_of_equal_length_stay_ragged():
    x = collate([torch.ones(3), torch.ones(3)])
    assert isinstance(x, ragged.RaggedArray)
    assert x.lengths.tolist() == [3, 3]


def test_collate_infers_ragged_fields_and_stacks_fixed_ones():
    samples = [
        {"tokens": torch.tensor([1, 2, 3]), "image": torch.zeros(2, 2), "label": 0, "id": "a"},
        {"tokens": torch.tensor([4]), "image": torch.ones(2, 2), "label": 1, "id": "b"},
    ]
    batch = collate(samples)
    assert isinstance(batch["tokens"], ragged.RaggedArray)
    assert batch["tokens"].to_list() == [[1, 2, 3], [4]]
    assert batch["image"].shape == (2, 2, 2)
    assert batch["label"].tolist() == [0, 1]
    assert batch["id"] == ["a", "b"]


def test_collate_ragged_keys_is_the_complete_list():
    samples = [
        {"tokens": torch.tensor([1, 2]), "labels": torch.tensor([0, 1]), "mask": torch.ones(2)},
        {"tokens": torch.tensor([3, 4]), "labels": torch.tensor([1, 1]), "mask": torch.ones(2)},
    ]
    batch = collate(samples, ragged_keys=["tokens", "labels"])
    assert isinstance(batch["tokens"], ragged.RaggedArray)  # equal lengths, still ragged
    assert isinstance(batch["mask"], torch.Tensor) and batch["mask"].shape == (2, 2)
    # Fields with equal lengths share one partition object: binary ops take the fast path.
    assert batch["tokens"].partition is batch["labels"].partition
    inferred = collate(samples)
    assert isinstance(inferred["tokens"], torch.Tensor)  # inference stacks equal lengths


def test_collate_nested_paths_tuples_and_namedtuples():
    Pair = collections.namedtuple("Pair", ["seq", "y"])
    samples = [
        ({"ids": torch.arange(3)}, Pair(torch.ones(3, 2), 1.5)),
        ({"ids": torch.arange(3)}, Pair(torch.ones(1, 2), 2.5)),
    ]
    inputs, pair = collate(samples, ragged_keys=[(0, "ids"), (1, "seq")])
    assert isinstance(inputs["ids"], ragged.RaggedArray)
    assert isinstance(pair, Pair) and isinstance(pair.seq, ragged.RaggedArray)
    assert pair.seq.lengths.tolist() == [3, 1]
    assert pair.y.dtype == torch.float32 and pair.y.tolist() == [1.5, 2.5]


def test_collate_numpy_and_empty_samples():
    batch = collate([np.zeros((0, 2)), np.ones((2, 2))])
    assert batch.lengths.tolist() == [0, 2] and batch.dtype == torch.float64


def test_collate_partitions_differ_for_different_lengths():
    samples = [{"a": torch.ones(2), "b": torch.ones(1)}, {"a": torch.ones(1), "b": torch.ones(2)}]
    batch = collate(samples)
    assert batch["a"].partition is not batch["b"].partition


@pytest.mark.parametrize(
    ("samples", "kwargs", "error", "message"),
    [
        (
            [],
            {},
            ValueError,
            "ragged.data.collate: `samples` must hold at least one sample, got an empty batch.",
        ),
        (
            [{"a": torch.ones(2)}, {"b": torch.ones(2)}],
            {},
            TypeError,
            "ragged.data.collate: `samples` must share one structure at the sample, got keys "
            "['a'] in sample 0, ['b'] in sample 1.",
        ),
        (
            [{"ids": [1, 2, 3]}, {"ids": [4]}],
            {},
            TypeError,
            "ragged.data.collate: `samples` must share one structure at ['ids'] (lists and tuples "
            "are containers: give a variable-length field as a tensor), got length 3 in sample 0, "
            "1 in sample 1.",
        ),
        (
            [{"a": torch.ones(2, 3)}, {"a": torch.ones(1, 4)}],
            {},
            ValueError,
            "ragged.data.collate: `samples` must have one inner shape at ['a'] (only the leading "
            "axis is ragged), got inner shapes [(3,), (4,)].",
        ),
        (
            [{"a": torch.ones(2), "b": torch.ones(2)}, {"a": torch.ones(1), "b": torch.ones(3)}],
            {"ragged_keys": ["a"]},
            ValueError,
            "ragged.data.collate: `samples` must have one shape at ['b'] to stack it (name it in "
            "ragged_keys to batch it as a RaggedArray), got shapes [(2,), (3,)].",
        ),
        (
            [{"a": torch.ones(2)}],
            {"ragged_keys": ["a", "z"]},
            ValueError,
            "ragged.data.collate: `ragged_keys` must name tensor fields of the samples, got ["
            "\"['z']\"].",
        ),
        (
            [torch.ones(2), torch.ones(1, dtype=torch.int64)],
            {},
            TypeError,
            "ragged.data.collate: `samples` must have one dtype at the sample, got "
            "['torch.float32', 'torch.int64'].",
        ),
        (
            [{"a": torch.tensor(1.0)}],
            {"ragged_keys": ["a"]},
            ValueError,
            "ragged.data.collate: `samples` must have a leading (ragged) axis at ['a'], got a "
            "0-dim tensor in sample 0.",
        ),
    ],
)
def test_collate_errors(samples, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        collate(samples, **kwargs)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"tokens": torch.full((self.lengths[i],), i), "label": i}


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_token_budget_sampler(workers):
    lengths = [3, 0, 5, 2, 7, 1, 4, 6]
    sampler = TokenBudgetBatchSampler(lengths, 8, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(
        _Tokens(lengths),
        batch_sampler=sampler,
        collate_fn=functools.partial(collate, ragged_keys=["tokens"]),
        num_workers=workers,
    )
    seen = []
    for batch in loader:
        x, labels = batch["tokens"], batch["label"].tolist()
        assert x.lengths.tolist() == [lengths[i] for i in labels]
        assert x.to_list() == [[i] * lengths[i] for i in labels]
        assert x.partition.levels[0].max_length == max(lengths[i] for i in labels)
        seen += labels
    assert sorted(seen) == list(range(len(lengths)))


# --- samplers ---------------------------------------------------------------------------------


def _flat(batches):
    return [i for batch in batches for i in batch]


sample_lengths = st.lists(st.integers(0, 40), min_size=0, max_size=60)


@given(
    sample_lengths,
    st.integers(1, 7),
    st.one_of(
        st.fixed_dictionaries({"bucket_width": st.integers(1, 10)}),
        st.fixed_dictionaries({"num_buckets": st.integers(1, 6)}),
    ),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_bucket_sampler_covers_every_index_once(
    lens, batch_size, buckets, shuffle, drop_last, seed
):
    sampler = BucketBatchSampler(
        lens,
        batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(seed),
        **buckets,
    )
    batches = list(sampler)
    assert len(batches) == len(sampler)
    flat = _flat(batches)
    assert len(flat) == len(set(flat))
    if drop_last:
        assert all(len(b) == batch_size for b in batches)
        assert len(lens) - len(flat) < batch_size
    else:
        assert sorted(flat) == list(range(len(lens)))
        assert sum(len(b) < batch_size for b in batches) <= 1
    if not shuffle:  # batches laid out in bucket order
        keys = sampler.buckets[flat].tolist() if flat else []
        assert keys == sorted(keys)


def test_bucket_sampler_groups_similar_lengths():
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 200, (400,), generator=gen).tolist()
    sampler = BucketBatchSampler(lens, 16, bucket_width=20, generator=gen)
    spreads = [max(lens[i] for i in b) - min(lens[i] for i in b) for b in sampler]
    assert sum(spread < 20 for spread in spreads) >= len(spreads) - 10  # all but boundary batches


@given(
    sample_lengths,
    st.integers(1, 60),
    st.sampled_from([None, 0.0, 0.25, 0.6]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_token_budget_sampler_respects_budget(lens, max_tokens, waste, shuffle, seed):
    sampler = TokenBudgetBatchSampler(
        lens,
        max_tokens,
        max_padding_waste=waste,
        shuffle=shuffle,
        generator=torch.Generator().manual_seed(seed),
    )
    planned = len(sampler)
    batches = list(sampler)
    assert len(batches) == planned  # len() plans the epoch that iter() then yields
    assert sorted(_flat(batches)) == list(range(len(lens)))
    for batch in batches:
        assert batch
        sizes = [lens[i] for i in batch]
        if len(batch) > 1:
            assert sum(sizes) <= max_tokens
            if waste is not None and max(sizes):
                padded = len(sizes) * max(sizes)
                assert padded - sum(sizes) <= waste * padded + 1e-9


@pytest.mark.parametrize(
    "make",
    [
        lambda g: BucketBatchSampler(list(range(50)), 4, num_buckets=5, generator=g),
        lambda g: TokenBudgetBatchSampler(list(range(50)), 60, max_padding_waste=0.5, generator=g),
    ],
)
def test_samplers_are_deterministic_with_a_seeded_generator(make):
    a = make(torch.Generator().manual_seed(7))
    b = make(torch.Generator().manual_seed(7))
    epochs_a = [list(a) for _ in range(3)]
    epochs_b = [list(b) for _ in range(3)]
    assert epochs_a == epochs_b
    assert epochs_a[0] != epochs_a[1]  # each epoch advances the generator


def test_samplers_without_generator_draw_from_the_global_rng():
    torch.manual_seed(3)
    first = list(BucketBatchSampler(list(range(30)), 4, bucket_width=100))
    torch.manual_seed(3)
    assert list(BucketBatchSampler(list(range(30)), 4, bucket_width=100)) == first


def test_token_budget_sampler_puts_an_oversized_sample_alone():
    assert list(TokenBudgetBatchSampler([3, 50, 4], 10, shuffle=False)) == [[0], [1], [2]]


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: BucketBatchSampler([1, 2], 2),
            TypeError,
            "ragged.data.BucketBatchSampler: pass exactly one of `bucket_width` and `num_buckets`.",
        ),
        (
            lambda: BucketBatchSampler([1, -2], 2, bucket_width=1),
            ValueError,
            "ragged.data.BucketBatchSampler: `lengths` must be non-negative, got lengths[1] = -2.",
        ),
        (
            lambda: BucketBatchSampler([1, 2], 0, bucket_width=1),
            ValueError,
            "ragged.data.BucketBatchSampler: `batch_size` must be positive, got 0.",
        ),
        (
            lambda: TokenBudgetBatchSampler([1.5], 2),
            TypeError,
            "ragged.data.TokenBudgetBatchSampler: `lengths` must contain only ints, got "
            "lengths[0] = 1.5.",
        ),
        (
            lambda: TokenBudgetBatchSampler([1], 2, max_padding_waste=1.0),
            ValueError,
            "ragged.data.TokenBudgetBatchSampler: `max_padding_waste` must be in [0, 1), got 1.0.",
        ),
    ],
)
def test_sampler_errors(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_samplers_accept_tensor_lengths():
    lens = torch.tensor([3, 1, 2])
    assert list(TokenBudgetBatchSampler(lens, 3, shuffle=False)) == [[0], [1, 2]]
