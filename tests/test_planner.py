"""plan_microbatches against brute force over every set partition of small batches.

For the padded cost the contiguous DP must equal the optimum over all partitions (the exchange
argument in docs/semantics.md, data loading); for the packed cost (bin packing under a cap) the plan must
be no worse than the best contiguous plan and within first-fit decreasing's bound of optimal.
"""

import itertools
import re

import hypothesis.strategies as st
import pytest
from hypothesis import given

from ragged.data import MicrobatchCost, plan_cost, plan_microbatches


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


def feasible(lengths, group, cost, max_tokens, max_samples):
    if len(group) == 1:
        return True  # a sample alone is always allowed
    sizes = [lengths[i] for i in group]
    tokens_ok = max_tokens is None or cost.tokens(sizes) <= max_tokens
    return tokens_ok and (max_samples is None or len(group) <= max_samples)


def brute_force(lengths, cost, max_tokens=None, max_samples=None, contiguous=False):
    """Least (cost, number of micro-batches) over all set partitions (or contiguous splits)."""
    n = len(lengths)
    if contiguous:
        order = sorted(range(n), key=lengths.__getitem__)
        candidates = []
        for cuts in itertools.product([False, True], repeat=max(n - 1, 0)):
            groups, current = [], [order[0]] if n else []
            for cut, i in zip(cuts, order[1:], strict=True):
                if cut:
                    groups.append(current)
                    current = []
                current.append(i)
            candidates.append([*groups, current] if n else [])
    else:
        candidates = set_partitions(list(range(n)))
    scored = [
        (plan_cost(lengths, plan, cost), len(plan))
        for plan in candidates
        if all(feasible(lengths, g, cost, max_tokens, max_samples) for g in plan)
    ]
    best = min(total for total, _ in scored)
    # Equal costs up to rounding tie; among them the fewest micro-batches.
    fewest = min(count for total, count in scored if total <= best + 1e-9 * max(1.0, best))
    return best, fewest


def check_plan(lengths, plan, cost, max_tokens, max_samples):
    assert sorted(i for group in plan for i in group) == list(range(len(lengths)))
    for group in plan:
        assert group
        assert feasible(lengths, group, cost, max_tokens, max_samples)
        assert [lengths[i] for i in group] == sorted(lengths[i] for i in group)


small_lengths = st.lists(st.integers(0, 12), min_size=0, max_size=7)
coefficients = st.tuples(
    st.sampled_from([0.0, 1.0, 2.5]), st.sampled_from([0.0, 0.1]), st.sampled_from([0.0, 3.0, 20.0])
)


@given(
    small_lengths, coefficients, st.sampled_from([None, 8, 20, 40]), st.sampled_from([None, 2, 3])
)
def test_padded_plan_is_optimal_over_all_partitions(lengths, abc, max_tokens, max_samples):
    cost = MicrobatchCost(*abc, padded=True)
    plan = plan_microbatches(lengths, max_tokens=max_tokens, cost=cost, max_samples=max_samples)
    check_plan(lengths, plan, cost, max_tokens, max_samples)
    best, count = brute_force(lengths, cost, max_tokens, max_samples)
    assert plan_cost(lengths, plan, cost) == pytest.approx(best)
    # Contiguity of the sorted order loses nothing for the padded cost...
    assert brute_force(lengths, cost, max_tokens, max_samples, contiguous=True)[0] == pytest.approx(
        best
    )
    # ...and among optimal plans the planner takes one with the fewest micro-batches.
    assert len(plan) == count


@given(small_lengths, coefficients, st.sampled_from([None, 8, 12, 20]))
def test_packed_plan_is_no_worse_than_contiguous_and_near_optimal(lengths, abc, max_tokens):
    cost = MicrobatchCost(*abc)
    plan = plan_microbatches(lengths, max_tokens=max_tokens, cost=cost)
    check_plan(lengths, plan, cost, max_tokens, None)
    best, fewest = brute_force(lengths, cost, max_tokens)
    contiguous, contiguous_count = brute_force(lengths, cost, max_tokens, contiguous=True)
    total = plan_cost(lengths, plan, cost)
    assert best - 1e-9 <= total <= contiguous + 1e-9
    assert len(plan) <= contiguous_count
    assert len(plan) <= 11 / 9 * fewest + 6 / 9  # first-fit decreasing's bound


def test_contiguity_is_not_optimal_for_packed_cost_under_a_cap():
    lengths = [1, 1, 9, 9]
    cost = MicrobatchCost(c=1.0)
    assert brute_force(lengths, cost, 10, contiguous=True)[1] == 3
    assert brute_force(lengths, cost, 10)[1] == 2
    assert len(plan_microbatches(lengths, max_tokens=10, cost=cost)) == 2


def test_padded_plan_separates_short_from_long():
    lengths = [100, 3, 98, 5, 4, 97]
    plan = plan_microbatches(lengths, cost=MicrobatchCost(c=50.0, padded=True))
    assert plan == [[1, 4, 3], [5, 2, 0]]


def test_default_cost_gives_fewest_microbatches_under_the_cap():
    lengths = [4] * 10
    assert len(plan_microbatches(lengths, max_tokens=16)) == 3
    assert plan_microbatches(lengths) == [list(range(10))]  # no cap: one micro-batch


def test_large_batch_is_fast_enough():
    lengths = [(i * 7919) % 500 + 1 for i in range(2000)]
    cost = MicrobatchCost(a=1.0, b=1e-3, c=200.0, padded=True)
    plan = plan_microbatches(lengths, max_tokens=4096, cost=cost)
    check_plan(lengths, plan, cost, 4096, None)


def test_empty_batch():
    assert plan_microbatches([]) == []


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: plan_microbatches([1], cost="padded"),
            TypeError,
            "ragged.data.plan_microbatches: `cost` must be a ragged.data.MicrobatchCost, got str.",
        ),
        (
            lambda: plan_microbatches([1], max_tokens=0),
            ValueError,
            "ragged.data.plan_microbatches: `max_tokens` must be positive, got 0.",
        ),
        (
            lambda: MicrobatchCost(c=-1.0),
            ValueError,
            "ragged.data.MicrobatchCost: `c` must be non-negative, got -1.0.",
        ),
        (
            lambda: plan_microbatches([2, -1]),
            ValueError,
            "ragged.data.plan_microbatches: `lengths` must be non-negative, got lengths[1] = -1.",
        ),
    ],
)
def test_errors(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()
