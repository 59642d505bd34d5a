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
            [{"ids": (1, 2, 3)}, {"ids": (4,)}],
            {},
            TypeError,
            "ragged.data.collate: `samples` must share one structure at ['ids'] (tuples and lists "
            "of non-numbers are containers: give a variable-length field as a tensor or a list of "
            "numbers), got length 3 in sample 0, 1 in sample 1.",
        ),
        (
            [{"words": ["a", "b"]}, {"words": ["c"]}],
            {},
            TypeError,
            "ragged.data.collate: `samples` must share one structure at ['words'] (tuples and "
            "lists of non-numbers are containers: give a variable-length field as a tensor or a "
            "list of numbers), got length 2 in sample 0, 1 in sample 1.",
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
            "`ragged_keys`, which holds ['a'], to batch it as a RaggedArray), got shapes "
            "[(2,), (3,)].",
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


def test_collate_takes_lists_of_numbers_as_fields():
    rows = [
        {"input_ids": [101, 7, 102], "attention_mask": [1, 1, 1], "score": [0.5], "label": 1},
        {"input_ids": [101, 102], "attention_mask": [1, 1], "score": [1], "label": 0},
        {"input_ids": [], "attention_mask": [], "score": [2.5], "label": 1},
    ]
    batch = collate(rows)
    assert batch["input_ids"].to_list() == [[101, 7, 102], [101, 102], []]
    assert batch["input_ids"].dtype == torch.int64
    assert batch["input_ids"].partition is batch["attention_mask"].partition  # equal lengths
    assert batch["score"].dtype == torch.get_default_dtype()  # a float anywhere: floats
    assert batch["score"].tolist() == [[0.5], [1.0], [2.5]]  # equal lengths: stacked
    assert batch["label"].tolist() == [1, 0, 1]
    named = collate(rows[:2], ragged_keys=["input_ids", "attention_mask", "score"])
    assert isinstance(named["score"], ragged.RaggedArray)
    flags = collate([{"m": [True, False]}, {"m": [True]}])["m"]
    assert flags.dtype == torch.bool and flags.to_list() == [[True, False], [True]]
    empty = collate([{"ids": []}, {"ids": []}], ragged_keys=["ids"])["ids"]
    assert empty.dtype == torch.int64 and empty.to_list() == [[], []]


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


def test_sampler_rank_errors():
    with pytest.raises(ValueError, match=re.escape("`rank` must be an int in [0, 2), got 2.")):
        TokenBudgetBatchSampler([1, 2], 4, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="`num_replicas` must be positive, got 0"):
        BucketBatchSampler([1, 2], 1, bucket_width=1, num_replicas=0, rank=0)
    with pytest.raises(TypeError, match="pass at most one of `seed` and `generator`"):
        TokenBudgetBatchSampler([1], 2, seed=0, generator=torch.Generator())
    with pytest.raises(ValueError, match="`epoch` must be a non-negative int"):
        TokenBudgetBatchSampler([1], 2).set_epoch(-1)


def test_samplers_accept_tensor_lengths():
    lens = torch.tensor([3, 1, 2])
    assert list(TokenBudgetBatchSampler(lens, 3, shuffle=False)) == [[0], [1, 2]]


# --- samplers across ranks ----------------------------------------------------------------------

SAMPLERS = {
    "bucket": lambda lens, **kw: BucketBatchSampler(lens, 3, num_buckets=3, **kw),
    "budget": lambda lens, **kw: TokenBudgetBatchSampler(lens, 40, **kw),
}


@given(
    st.lists(st.integers(0, 30), max_size=50),
    st.integers(1, 4),
    st.sampled_from(sorted(SAMPLERS)),
    st.booleans(),
    st.booleans(),
    st.integers(0, 100),
)
def test_ranks_share_every_epoch_exactly_once(lens, world, kind, drop_last, shuffle, seed):
    ranks = [
        SAMPLERS[kind](
            lens, num_replicas=world, rank=r, seed=seed, drop_last=drop_last, shuffle=shuffle
        )
        for r in range(world)
    ]
    whole = SAMPLERS[kind](lens, num_replicas=1, seed=seed, drop_last=drop_last, shuffle=shuffle)
    epoch = [sorted(b) for b in whole]  # the same global batches, dealt to the ranks
    # len() is the next epoch's count (iterating advances the epoch): read it before.
    counts = [len(r) for r in ranks]
    per_rank = [list(r) for r in ranks]
    assert len({len(batches) for batches in per_rank}) == 1  # equal counts
    assert counts == [len(batches) for batches in per_rank]
    dealt = collections.Counter(tuple(sorted(b)) for batches in per_rank for b in batches)
    global_batches = collections.Counter(tuple(b) for b in epoch)
    if drop_last:  # at most world - 1 batches dropped, none repeated
        assert not dealt - global_batches
        assert sum((global_batches - dealt).values()) < world
    else:  # every batch dealt; fewer than world of them repeated (padding the last step)
        assert not global_batches - dealt
        assert sum((dealt - global_batches).values()) < world
        flat = sorted(i for b in dealt.elements() for i in b)
        assert set(flat) == set(range(len(lens)))


def batch_costs(batches, lens, cost):
    return [cost([lens[i] for i in b]) for b in batches]


def step_spread(per_rank, lens, cost):
    """Mean over steps of max / mean cost across the ranks."""
    spreads = []
    for step in zip(*per_rank, strict=True):
        costs = batch_costs(step, lens, cost)
        spreads.append(max(costs) / (sum(costs) / len(costs)))
    return sum(spreads) / len(spreads)


@pytest.mark.parametrize("kind", ["tokens", "quadratic"])
def test_rank_batches_balance_cost_better_than_distributed_sampler(kind):
    gen = torch.Generator().manual_seed(0)
    lens = torch.exp(torch.randn(4000, generator=gen) * 0.9 + 5.0).clamp(1, 2048).long().tolist()
    world = 4
    cost = ragged.data.MicrobatchCost(a=1.0, b=1 / 256 if kind == "quadratic" else 0.0)
    ours = [
        list(TokenBudgetBatchSampler(lens, 4096, num_replicas=world, rank=r, cost=cost))
        for r in range(world)
    ]
    # The baseline: DistributedSampler + a fixed batch size with the same mean tokens per batch.
    mean_tokens = sum(lens) / sum(len(b) for b in ours[0] + ours[1] + ours[2] + ours[3])
    batch_size = max(1, round(4096 / mean_tokens * 0.9))
    baseline = []
    for r in range(world):
        sampler = torch.utils.data.DistributedSampler(lens, num_replicas=world, rank=r, seed=0)
        baseline.append(list(torch.utils.data.BatchSampler(sampler, batch_size, drop_last=False)))
    ours_spread = step_spread(ours, lens, cost)
    baseline_spread = step_spread(baseline, lens, cost)
    assert ours_spread < 1.05
    assert ours_spread < baseline_spread - 0.1, (ours_spread, baseline_spread)


def resume_case(kind, mode):
    lens = torch.randint(1, 30, (41,), generator=torch.Generator().manual_seed(5)).tolist()
    kwargs = {"num_replicas": 2, "rank": 1}
    if mode == "seed":
        kwargs["seed"] = 3
    elif mode == "global":
        kwargs["num_replicas"], kwargs["rank"] = 1, 0

    def make():
        if mode == "generator":  # a fresh generator, seeded alike, per sampler
            kwargs["generator"] = torch.Generator().manual_seed(3)
        return SAMPLERS[kind](lens, **kwargs)

    return make


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
@pytest.mark.parametrize("mode", ["seed", "generator", "global"])
@pytest.mark.parametrize("stop", [0, 1, 3, "end"])
def test_state_dict_resumes_at_the_next_batch(kind, mode, stop):
    make = resume_case(kind, mode)
    torch.manual_seed(11)
    sampler = make()
    first = list(sampler)  # epoch 0, uninterrupted
    expected = [list(sampler), list(sampler)]  # epochs 1 and 2
    torch.manual_seed(11)
    sampler = make()
    assert list(sampler) == first
    iterator = iter(sampler)
    count = len(expected[0]) if stop == "end" else stop
    taken = [next(iterator) for _ in range(count)]
    if stop == "end":
        assert next(iterator, None) is None
    state = sampler.state_dict()
    assert state["epoch"] == (2 if stop == "end" else 1)
    resumed = make()
    resumed.load_state_dict(state)
    if stop == "end":
        assert list(resumed) == expected[1]
    else:
        assert len(resumed) == len(expected[0])
        assert taken + list(resumed) == expected[0]
        assert list(resumed) == expected[1]  # later epochs follow as they would have


def test_set_epoch_reproduces_an_epoch_and_drops_a_resumption_point():
    lens = list(range(1, 40))
    a = TokenBudgetBatchSampler(lens, 50, seed=1, num_replicas=2, rank=0)
    epochs = [list(a) for _ in range(3)]  # the epoch advances after each pass
    assert epochs[0] != epochs[1]
    b = TokenBudgetBatchSampler(lens, 50, seed=1, num_replicas=2, rank=0)
    b.set_epoch(2)
    assert list(b) == epochs[2]
    iterator = iter(b)
    next(iterator)
    state = b.state_dict()
    c = TokenBudgetBatchSampler(lens, 50, seed=1, num_replicas=2, rank=0)
    c.load_state_dict(state)
    c.set_epoch(0)  # another epoch: start it from the beginning
    assert list(c) == epochs[0]


def test_samplers_default_to_the_process_group(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 2)
    sampler = BucketBatchSampler(list(range(20)), 2, bucket_width=5)
    assert (sampler.num_replicas, sampler.rank, sampler.seed) == (3, 2, 0)
    explicit = BucketBatchSampler(list(range(20)), 2, bucket_width=5, num_replicas=3, rank=2)
    assert list(sampler) == list(explicit)
