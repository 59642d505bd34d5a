"""ragged.distributed on the gloo backend in 2 and 4 local processes.

Each world size is one group of forked processes (``tests/gloo.py``) that runs every check in
turn (process start-up dominates the cost). Every rank builds every rank's data from its rank number, so each
can check the collectives' results without further communication. The DDP and FSDP2 checks
compare the gradients of one step on each rank's token-balanced shard against a single-process
run on the whole global batch with the global per-token mean loss.
"""

import datetime
import importlib
import itertools
import re

import pytest
import torch
import torch.distributed as dist

import ragged
from ragged.distributed import all_gather, broadcast, global_mean, scatter, shard, shard_bounds
from ragged.testing import assert_close
from tests.gloo import run_checks

LOCAL_LENGTHS = [[2, 0, 3], [1], [], [4, 1]]  # rank 2 holds zero segments


def local_array(rank, dtype=torch.float64):
    lengths = LOCAL_LENGTHS[rank % len(LOCAL_LENGTHS)]
    total = sum(lengths)
    values = torch.arange(total * 2, dtype=dtype).reshape(total, 2) + 100 * rank
    return ragged.from_lengths(values, lengths)


def global_batch():
    gen = torch.Generator().manual_seed(0)
    lengths = [3, 0, 5, 1, 4, 2, 6]
    total = sum(lengths)
    x = ragged.from_lengths(torch.randn(total, 3, generator=gen, dtype=torch.float64), lengths)
    target = x.with_values(torch.randn(total, 1, generator=gen, dtype=torch.float64))
    return x, target


class TinyModel(torch.nn.Module):
    """A per-token model with a per-sequence context: Linear, mean over the ragged axis."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(3, 4, dtype=torch.float64)
        self.out = torch.nn.Linear(4, 1, dtype=torch.float64)

    def forward(self, x):
        h = x.with_values(torch.tanh(self.inp(x.values)))
        context = ragged.mean(h, axis=1, fill_value=0.0)  # (B, 4); empty sequences give 0
        return self.out((h + context[:, None, :]).values)  # per token, [total, 1]


def token_loss_sum(model, x, target):
    return ((model(x) - target.values) ** 2).sum()


# --- checks (run on every rank) ----------------------------------------------------------------


def check_all_gather(rank, world):
    x = local_array(rank)
    x = x.with_values(x.values.clone().requires_grad_(True))
    y = all_gather(x)
    expected = [segment for r in range(world) for segment in local_array(r).to_list()]
    assert y.to_list() == expected
    assert y.partition.levels[0].max_length == max(
        max(LOCAL_LENGTHS[r], default=0) for r in range(world)
    )
    (y.values * 2).sum().backward()  # the local part is x.values itself: gradients reach it
    torch.testing.assert_close(x.values.grad, torch.full_like(x.values, 2.0))


def check_all_gather_rejects_mismatched_dtypes(rank, world):
    x = local_array(rank, torch.float32 if rank == 1 else torch.float64)
    with pytest.raises(ValueError, match="must have one dtype on every rank"):
        all_gather(x)


def check_broadcast(rank, world):
    src = 1
    y = broadcast(local_array(src) if rank == src else None, src=src)
    assert_close(y, local_array(src))
    assert y.partition.levels[0].max_length == max(LOCAL_LENGTHS[src])


def check_scatter(rank, world):
    x, _ = global_batch()
    y = scatter(x if rank == 0 else None, src=0)
    bounds = shard_bounds(x.lengths, world)
    assert y.to_list() == x.to_list()[bounds[rank] : bounds[rank + 1]]
    assert_close(y, shard(x, world, rank))


def check_global_mean(rank, world):
    loss_sum = torch.tensor(float(rank + 1), requires_grad=True)
    mean = global_mean(loss_sum, rank + 2)
    total = sum(r + 1 for r in range(world))
    count = sum(r + 2 for r in range(world))
    torch.testing.assert_close(mean, torch.tensor(total / count))
    mean.backward()
    torch.testing.assert_close(loss_sum.grad, torch.tensor(world / count))


def check_ddp_step_matches_single_process(rank, world):
    x, target = global_batch()
    torch.manual_seed(0)
    reference = TinyModel()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TinyModel())

    # Single process, whole batch, global per-token mean.
    token_count = x.values.shape[0]
    (token_loss_sum(reference, x, target) / token_count).backward()

    # This rank's token-balanced shard; the loss is the same global per-token mean.
    local_x, local_target = shard(x, world, rank), shard(target, world, rank)
    loss_sum = token_loss_sum(model, local_x, local_target)
    loss = global_mean(loss_sum, local_x.values.shape[0])
    loss.backward()

    torch.testing.assert_close(
        loss.detach(), token_loss_sum(reference, x, target).detach() / token_count
    )
    for (name, p), q in zip(model.module.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=f"gradient of {name}")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def check_fsdp2_step_matches_single_process(rank, world):
    """FSDP2 (``fully_shard`` on a CPU gloo mesh) accepts RaggedArray inputs; with the global
    per-token mean its gradients (reduce-scattered, averaged) equal one process's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    x, target = global_batch()
    torch.manual_seed(0)
    reference = TinyModel()
    torch.manual_seed(0)
    model = TinyModel()
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    (token_loss_sum(reference, x, target) / x.values.shape[0]).backward()
    local_x, local_target = shard(x, world, rank), shard(target, world, rank)
    loss = global_mean(token_loss_sum(model, local_x, local_target), local_x.values.shape[0])
    loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=f"gradient of {name}")


def raises_everywhere(rank, failing, error, own, other, fn):
    """``fn()`` raises on every rank: ``own`` on the failing rank, ``other`` on the rest."""
    with pytest.raises(error, match=re.escape(own if rank == failing else other)):
        fn()


def check_local_errors_raise_on_every_rank(rank, world):
    # A short timeout: were a rank left waiting, the check would fail in seconds, not hang.
    group = dist.new_group(timeout=datetime.timedelta(seconds=10))
    x = local_array(rank)
    func = "ragged.distributed.all_gather"
    plain = f"{func}: `x` must be a RaggedArray, got Tensor(shape=(3,), dtype=torch.float32)."
    raises_everywhere(
        rank,
        1,
        TypeError,
        plain,
        f"{func}: rank 1 failed before communicating (TypeError: {plain[:-1]}).",
        lambda: all_gather(torch.ones(3) if rank == 1 else x, group),
    )
    two_levels = f"{func}: `x` must have one ragged axis, got 2 ragged axes."
    docs = ragged.from_nested_lengths(torch.arange(3.0), [[1], [3]])
    raises_everywhere(
        rank,
        0,
        ValueError,
        two_levels,
        f"{func}: rank 0 failed before communicating (ValueError: {two_levels[:-1]}).",
        lambda: all_gather(docs if rank == 0 else x, group),
    )
    func = "ragged.distributed.broadcast"
    none = f"{func}: `x` must be a RaggedArray, got NoneType."
    raises_everywhere(
        rank,
        1,
        TypeError,
        none,
        f"{func}: rank 1 failed before communicating (TypeError: {none[:-1]}).",
        lambda: broadcast(None, src=1, group=group),
    )
    raises_everywhere(
        rank,
        0,
        (RuntimeError, ValueError),  # torch.device's own error on the receiver; ours elsewhere
        "Expected one of",
        "rank 0 failed before communicating (RuntimeError: Expected one of",
        lambda: broadcast(x, src=1, group=group, device="nowhere" if rank == 0 else None),
    )
    func = "ragged.distributed.scatter"
    none = f"{func}: `x` must be a RaggedArray, got NoneType."
    raises_everywhere(
        rank,
        0,
        TypeError,
        none,
        f"{func}: rank 0 failed before communicating (TypeError: {none[:-1]}).",
        lambda: scatter(None, src=0, group=group),
    )
    # global_mean adds no exchange: the failing rank joins the all_reduce with NaN, then raises.
    if rank == 1:
        with pytest.raises(TypeError, match=re.escape("`loss_sum` must be a Tensor, got float.")):
            global_mean(1.0, 2, group)
    else:
        assert torch.isnan(global_mean(torch.tensor(1.0), 2, group))
    # The group is still in step: a collective after the errors works.
    assert all_gather(x, group).num_segments == sum(
        len(LOCAL_LENGTHS[r % len(LOCAL_LENGTHS)]) for r in range(world)
    )


CHECKS = [
    check_local_errors_raise_on_every_rank,
    check_all_gather,
    check_all_gather_rejects_mismatched_dtypes,
    check_broadcast,
    check_scatter,
    check_global_mean,
    check_ddp_step_matches_single_process,
    check_fsdp2_step_matches_single_process,
]


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_and_ddp(world):
    # DDP imports torch._dynamo (seconds); importing it once here spares every child the cost.
    importlib.import_module("torch._dynamo")
    run_checks(CHECKS, world)


# --- single-process helpers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "world"),
    [([5, 1, 1, 1, 4, 4], 2), ([1] * 10, 3), ([100, 1, 1, 1], 2), ([], 3), ([7], 4)],
)
def test_shard_bounds_balance_tokens(lengths, world):
    bounds = shard_bounds(lengths, world)
    assert bounds[0] == 0 and bounds[-1] == len(lengths) and bounds == sorted(bounds)
    total, longest = sum(lengths), max(lengths, default=0)
    for a, b in itertools.pairwise(bounds):
        assert abs(sum(lengths[a:b]) - total / world) <= longest
    ranges = [shard(lengths, world, r) for r in range(world)]
    assert [i for r in ranges for i in r] == list(range(len(lengths)))


def test_shard_of_array_knows_its_max_length():
    x = ragged.array([[1, 2, 3], [4], [5, 6]])
    parts = [shard(x, 2, r) for r in range(2)]
    assert [p.to_list() for p in parts] == [[[1, 2, 3]], [[4], [5, 6]]]
    assert [p.partition.levels[0].max_length for p in parts] == [3, 2]


def test_shard_errors():
    with pytest.raises(ValueError, match=r"`rank` must be an int in \[0, 2\), got 2"):
        shard([1, 2], 2, 2)
    with pytest.raises(ValueError, match="`world_size` must be a positive int, got 0"):
        shard_bounds([1], 0)
