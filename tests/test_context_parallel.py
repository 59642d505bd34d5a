"""Context-parallel attention: the host planner, and execution on 2 and 4 gloo processes.

The multi-process test forks one group per world size and runs every case in it (start-up
dominates the cost). Every rank builds the same global batch from a seed, runs
``ragged.attention`` on all of it as the reference, and checks its own rows of the output and,
after summing the ranks' partial gradients with ``all_reduce``, the full gradients.
"""

import itertools
import re

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import ragged
from ragged.distributed import (
    ContextParallelPlan,
    context_parallel_attention,
    plan_context_parallel,
)
from tests.gloo import run_checks

# --- the planner (host only) ------------------------------------------------------------------


def covered_rows(plan):
    """Every (sequence, row) held, with its rank; asserts no row is held twice."""
    held = {}
    for rank in range(plan.world_size):
        for s, a, e in plan.runs(rank):
            assert 0 <= a < e <= plan.lengths[s]
            for i in range(a, e):
                assert (s, i) not in held
                held[(s, i)] = rank
    return held


def received_by_brute_force(plan):
    held = covered_rows(plan)
    out = []
    for rank in range(plan.world_size):
        if plan.strategy == "static":
            out.append(sum(1 for r in held.values() if r != rank) if plan.world_size > 1 else 0)
            continue
        needed = set()
        for s, a, e in plan.runs(rank):
            keys = range(a) if plan.causal else [*range(a), *range(e, plan.lengths[s])]
            needed |= {(s, j) for j in keys if held[(s, j)] != rank}
        out.append(len(needed))
    return out


def pairs_by_brute_force(plan):
    return [
        sum(
            (i + 1) if plan.causal else plan.lengths[s]
            for s, a, e in plan.runs(rank)
            for i in range(a, e)
        )
        for rank in range(plan.world_size)
    ]


lengths_lists = st.lists(st.integers(0, 40), max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    lengths=lengths_lists,
    world=st.integers(1, 6),
    causal=st.booleans(),
    strategy=st.sampled_from(["balanced", "static"]),
    block=st.sampled_from([1, 4]),
)
def test_plan_holds_every_row_once_and_counts_exactly(lengths, world, causal, strategy, block):
    plan = plan_context_parallel(lengths, world, causal=causal, strategy=strategy, block=block)
    held = covered_rows(plan)
    assert len(held) == sum(lengths)
    assert plan.tokens() == [plan.num_rows(r) for r in range(world)]
    assert plan.attention_pairs() == pairs_by_brute_force(plan)
    assert plan.kv_rows_received() == received_by_brute_force(plan)
    if strategy == "balanced":
        for rank in range(world):  # cuts inside a sequence fall on multiples of `block`
            for s, a, e in plan.runs(rank):
                assert a % block == 0 and (e % block == 0 or e == plan.lengths[s])
    for rank in range(world):
        offsets = [0, *itertools.accumulate(lengths)]
        expected = [offsets[s] + i for s, a, e in plan.runs(rank) for i in range(a, e)]
        assert plan.rows(rank).tolist() == expected
        assert plan.positions(rank).tolist() == [
            i for _, a, e in plan.runs(rank) for i in range(a, e)
        ]


def skewed(seed, n=512, sigma=1.5):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64) * sigma + 5.0)
    return lengths.clamp(1, 32768).round().long().tolist()


@pytest.mark.parametrize("world", [8, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_balanced_plan_balances_skewed_batches(world, causal):
    lengths = skewed(0)
    plan = plan_context_parallel(lengths, world, causal=causal)
    work = plan.attention_pairs()
    assert max(work) / (sum(work) / world) <= 1.05 + 1e-9
    static = plan_context_parallel(lengths, world, causal=causal, strategy="static")
    assert sum(plan.kv_rows_received()) < sum(static.kv_rows_received())


def test_balanced_plan_prefers_sequence_boundaries():
    plan = plan_context_parallel([4, 4, 4, 4], 2, causal=True)
    assert plan.runs(0) == [(0, 0, 4), (1, 0, 4)] and plan.kv_rows_received() == [0, 0]


def test_token_cost_balances_rows():
    lengths = [64, *[8] * 8]
    attention_only = plan_context_parallel(lengths, 4, causal=True)
    per_token = plan_context_parallel(lengths, 4, causal=True, token_cost=200.0)
    spread = lambda p: max(p.tokens()) / (sum(p.tokens()) / 4)
    assert spread(per_token) < spread(attention_only)


def test_plan_errors():
    with pytest.raises(ValueError, match="`strategy` must be"):
        plan_context_parallel([3], 2, causal=True, strategy="ring")
    with pytest.raises(ValueError, match="`world_size` must be a positive int"):
        plan_context_parallel([3], 0, causal=True)
    with pytest.raises(ValueError, match=r"`lengths` must be non-negative ints, got lengths\[1\]"):
        plan_context_parallel([3, -1], 2, causal=True)
    with pytest.raises(TypeError, match="`causal` must be a bool"):
        plan_context_parallel([3], 2, causal=1)
    plan = plan_context_parallel([3, 2], 2, causal=True)
    with pytest.raises(ValueError, match=r"`rank` must be an int in \[0, 2\)"):
        plan.runs(2)
    with pytest.raises(ValueError, match="`x` must have 5 rows"):
        plan.shard(ragged.from_lengths(torch.zeros(4), [2, 2]), 0)
    assert isinstance(plan, ContextParallelPlan)


def test_plan_of_a_tensor_of_lengths():
    plan = plan_context_parallel(torch.tensor([5, 0, 2]), 2, causal=False)
    assert plan.lengths == (5, 0, 2)


# --- execution on gloo processes -----------------------------------------------------------------

HEADS, WIDTH = 2, 3
CASES = [
    # (lengths, causal, strategy): skewed with empty sequences; one sequence longer than a
    # rank's share; all sequences short; a batch of one sequence.
    ([23, 0, 5, 1, 3, 0, 2, 9], True, "balanced"),
    ([23, 0, 5, 1, 3, 0, 2, 9], False, "balanced"),
    ([23, 0, 5, 1, 3, 0, 2, 9], True, "static"),
    ([40, 3, 2], False, "static"),
    ([40, 3, 2], True, "balanced"),
    ([2, 1, 2, 1, 3], True, "balanced"),
    ([17], False, "balanced"),
]


def global_qkv(lengths, seed, value_width=WIDTH):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)

    def make(width):
        values = torch.randn(total, HEADS, width, generator=gen, dtype=torch.float64)
        return ragged.from_lengths(values.requires_grad_(True), lengths)

    q, k, v = make(WIDTH), make(WIDTH), make(value_width)
    grad = torch.randn(total, HEADS, value_width, generator=gen, dtype=torch.float64)
    return q, k, v, grad


def reference(q, k, v, grad, causal):
    out = ragged.attention(q, k, v, causal=causal)
    grads = torch.autograd.grad((out.values * grad).sum(), [q.values, k.values, v.values])
    return out.values.detach(), grads


def summed_grads(tensors):
    grads = [t.grad.clone() for t in tensors]
    for g in grads:
        dist.all_reduce(g)
    return grads


def check_plans_match_one_process(rank, world):
    for seed, (lengths, causal, strategy) in enumerate(CASES):
        value_width = WIDTH + 2 if seed == 1 else WIDTH  # other value width: the matmul path
        q, k, v, grad = global_qkv(lengths, seed, value_width)
        expected, expected_grads = reference(q, k, v, grad, causal)
        plan = plan_context_parallel(lengths, world, causal=causal, strategy=strategy)
        rows = plan.rows(rank)
        local = [plan.shard(x, rank) for x in (q, k, v)]
        for _ in range(2):  # the plan's cached tensors are reused by a second call
            out = context_parallel_attention(*local, causal=causal, plan=plan)
            assert out.partition is local[0].partition
            torch.testing.assert_close(out.values, expected[rows], msg=f"case {seed}")
        (out.values * grad[rows]).sum().backward()
        got = summed_grads([q.values, k.values, v.values])
        for name, g, e in zip("qkv", got, expected_grads, strict=True):
            torch.testing.assert_close(g, e, msg=f"case {seed}: gradient of {name}")


LOCAL_LENGTHS = [[12, 0, 3], [1], [], [7, 2]]  # without a plan: whole sequences per rank


def check_without_a_plan(rank, world):
    per_rank = [LOCAL_LENGTHS[r % len(LOCAL_LENGTHS)] for r in range(world)]
    lengths = [n for host in per_rank for n in host]
    for causal in (True, False):
        q, k, v, grad = global_qkv(lengths, 7)
        expected, expected_grads = reference(q, k, v, grad, causal)
        first = sum(len(h) for h in per_rank[:rank])
        mine = range(first, first + len(per_rank[rank]))
        offsets = [0, *itertools.accumulate(lengths)]
        rows = torch.arange(offsets[mine.start], offsets[mine.stop])
        local = [ragged.from_lengths(x.values[rows], per_rank[rank]) for x in (q, k, v)]
        out = context_parallel_attention(*local, causal=causal)
        assert out.partition is local[0].partition
        torch.testing.assert_close(out.values, expected[rows])
        (out.values * grad[rows]).sum().backward()
        for name, g, e in zip(
            "qkv", summed_grads([q.values, k.values, v.values]), expected_grads, strict=True
        ):
            torch.testing.assert_close(g, e, msg=f"causal={causal}: gradient of {name}")


def check_float32_and_errors(rank, world):
    lengths = [30, 4, 4, 1]
    gen = torch.Generator().manual_seed(3)
    x = ragged.from_lengths(torch.randn(sum(lengths), 4, 8, generator=gen), lengths)
    expected = ragged.attention(x, x, x, causal=True).values
    plan = plan_context_parallel(lengths, world, causal=True)
    local = plan.shard(x, rank)
    out = context_parallel_attention(local, local, local, causal=True, plan=plan)
    torch.testing.assert_close(out.values, expected[plan.rows(rank)], atol=1e-5, rtol=1e-5)
    # Every check below raises before any communication, on every rank.
    with pytest.raises(ValueError, match="must be made with causal=False"):
        context_parallel_attention(local, local, local, causal=False, plan=plan)
    other = plan_context_parallel(lengths, world + 1, causal=True)
    with pytest.raises(ValueError, match=f"must be for the group's {world} ranks"):
        context_parallel_attention(local, local, local, causal=True, plan=other)
    wrong = ragged.from_lengths(
        torch.zeros(plan.num_rows(rank) + 1, 4, 8), [plan.num_rows(rank) + 1]
    )
    with pytest.raises(ValueError, match="`q` must hold rank"):
        context_parallel_attention(wrong, wrong, wrong, causal=True, plan=plan)
    with pytest.raises(TypeError, match="`plan` must be a ContextParallelPlan"):
        context_parallel_attention(local, local, local, causal=True, plan="balanced")


def check_subgroups(rank, world):
    """Two groups of two ranks each run their own batch (group ranks differ from global)."""
    if world != 4:
        return
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[rank // 2]
    lengths = [[9, 2, 0, 4], [3, 11]][rank // 2]
    q, k, v, grad = global_qkv(lengths, 20 + rank // 2)
    expected, expected_grads = reference(q, k, v, grad, True)
    plan = plan_context_parallel(lengths, 2, causal=True)
    mine = dist.get_rank(group)
    local = [plan.shard(x, mine) for x in (q, k, v)]
    out = context_parallel_attention(*local, causal=True, group=group, plan=plan)
    rows = plan.rows(mine)
    torch.testing.assert_close(out.values, expected[rows])
    (out.values * grad[rows]).sum().backward()
    for x, e in zip((q, k, v), expected_grads, strict=True):
        g = x.values.grad.clone()
        dist.all_reduce(g, group=group)
        torch.testing.assert_close(g, e)


CHECKS = [
    check_plans_match_one_process,
    check_without_a_plan,
    check_float32_and_errors,
    check_subgroups,
]


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_attention_matches_one_process(world):
    run_checks(CHECKS, world)


# --- the ranks agree before any exchange ------------------------------------------------------


def _local(rank, heads=2, size=4, dtype=torch.float64, lengths=((3, 2), (4,))):
    gen = torch.Generator().manual_seed(rank)
    mine = list(lengths[rank])
    return ragged.from_lengths(
        torch.randn(sum(mine), heads, size, generator=gen, dtype=dtype), mine
    )


def _refused(rank, x, message, **kwargs):
    with pytest.raises(ValueError, match=re.escape(message)):
        context_parallel_attention(x, x, x, causal=True, **kwargs)


def _disagreements(rank, world):
    prefix = "ragged.distributed.context_parallel_attention: "
    _refused(
        rank,
        _local(rank, heads=1 + rank),
        prefix + "`q` must agree across the group's ranks on the heads, got by rank 0: 1, 1: 2.",
    )
    _refused(
        rank,
        _local(rank, dtype=(torch.float32, torch.float64)[rank]),
        "on the dtype, got by rank 0: torch.float32, 1: torch.float64.",
    )
    plans = [plan_context_parallel(n, 2, causal=True) for n in ([3, 2, 4], [3, 2, 5])]
    x = plans[0].shard(_local(0, lengths=((3, 2, 4),)), rank)
    _refused(rank, x, "`plan` must agree across the group's ranks on the plan", plan=plans[rank])
    # Valid after refusals (no rank left waiting), and with a rank that holds no sequence.
    empty = _local(rank, lengths=((3, 2, 4), ()))
    out = context_parallel_attention(empty, empty, empty, causal=True)
    whole = _local(0, lengths=((3, 2, 4),))
    expected = ragged.attention(whole, whole, whole, causal=True)
    if rank == 0:
        torch.testing.assert_close(out.values, expected.values)
    else:
        assert out.values.shape == (0, 2, 4)


def test_ranks_agree_before_any_exchange():
    run_checks([_disagreements], 2)
