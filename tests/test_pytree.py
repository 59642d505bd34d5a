"""RaggedArray as a pytree: torch and optree registries, torch.func transforms, torch.compile."""

import copy
import io
import pickle
import random

import optree
import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given

import ragged
import ragged.testing
from tests.strategies import ragged_arrays


def test_torch_pytree_round_trip():
    x = ragged.array([[1.0, 2.0], [3.0]], axes=("b", "l"))
    leaves, spec = pytree.tree_flatten({"x": x, "n": 3})
    assert len(leaves) == 2 and leaves[0] is x.values
    y = pytree.tree_unflatten(leaves, spec)["x"]
    assert y.partition is x.partition and y.axes == x.axes
    keyed, _ = pytree.tree_flatten_with_path(x)
    assert pytree.keystr(keyed[0][0]) == ".values"


def test_optree_round_trip():
    x = ragged.array([[1.0, 2.0], [3.0]])
    leaves, spec = optree.tree_flatten({"x": x}, namespace="ragged")
    assert len(leaves) == 1 and leaves[0] is x.values
    assert optree.tree_unflatten(spec, leaves)["x"].partition is x.partition
    doubled = optree.tree_map(lambda v: v * 2, x, namespace="ragged")
    assert doubled.to_list() == [[2.0, 4.0], [6.0]]


def loss(x):
    seg = torch.zeros(x.num_segments, dtype=x.dtype).index_add(0, x.segment_ids, x.values)
    return (seg**2).sum() + x.values.sin().sum()


@given(ragged_arrays(inner=()))
def test_grad_returns_ragged_with_same_partition(x):
    g = torch.func.grad(loss)(x)
    assert isinstance(g, ragged.RaggedArray) and g.partition is x.partition
    v = x.values.detach().requires_grad_()
    (expected,) = torch.autograd.grad(loss(x.with_values(v)), v)
    torch.testing.assert_close(g.values, expected)


def test_vjp_jacrev_vmap():
    x = ragged.array([[1.0, 2.0], [], [3.0]], dtype=torch.float64)

    def f(x):
        return x.with_values(x.values**2)

    out, pullback = torch.func.vjp(f, x)
    (ct,) = pullback(out)
    assert ct.partition is x.partition
    torch.testing.assert_close(ct.values, 2 * x.values**3)

    jac = torch.func.jacrev(loss)(x)
    assert jac.partition is x.partition
    torch.testing.assert_close(jac.values, torch.func.grad(loss)(x).values)

    tangent_out = torch.func.jvp(f, (x,), (x.with_values(torch.ones(3, dtype=torch.float64)),))[1]
    torch.testing.assert_close(tangent_out.values, 2 * x.values)

    ensemble = torch.randn(5, 3, dtype=torch.float64)
    batched = torch.func.vmap(lambda v: loss(x.with_values(v)))(ensemble)
    expected = torch.stack([loss(x.with_values(v)) for v in ensemble])
    torch.testing.assert_close(batched, expected)
    out = torch.func.vmap(f, in_dims=(ragged.RaggedArray(0, x.partition),))(
        ragged.RaggedArray(ensemble, x.partition)
    )
    assert out.partition is x.partition
    torch.testing.assert_close(out.values, ensemble**2)


def random_batch(rng):
    lens = [rng.randint(0, 9) for _ in range(rng.randint(2, 12))]
    lens[0] = max(lens[0], 2)  # keep totals away from the 0/1 specialisation
    return (ragged.from_lengths(torch.randn(sum(lens), 4), lens),)


def test_compile_once_over_ten_batches():
    rng = random.Random(0)
    batches = [random_batch(rng) for _ in range(10)]
    report = ragged.testing.check_compile(lambda x: x.values.sum(), batches, backend="eager")
    assert report.graphs == 1


def test_compile_returns_ragged():
    rng = random.Random(1)
    batches = [random_batch(rng) for _ in range(4)]
    report = ragged.testing.check_compile(
        lambda x: x.with_values(x.values.relu() * 2), batches, backend="aot_eager"
    )
    assert report.graphs == 1


def test_check_compile_flags_host_syncs():
    rng = random.Random(2)
    batches = [random_batch(rng) for _ in range(3)]
    with pytest.raises(AssertionError, match="data-dependent sizes or host syncs"):
        ragged.testing.check_compile(lambda x: x.values[: x.lengths.max().item()], batches)


def test_pickle_deepcopy_and_torch_save():
    x = ragged.array([[1.0, 2.0], [], [3.0]], axes=("b", "l"))
    y = x.with_values(x.values + 1)
    for restored in (pickle.loads(pickle.dumps([x, y])), copy.deepcopy([x, y])):
        assert restored[0].to_list() == x.to_list() and restored[0].axes == x.axes
        assert restored[0].partition is restored[1].partition  # sharing survives
    buffer = io.BytesIO()
    torch.save({"x": x, "y": y}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only=True is the default
    assert loaded["x"].to_list() == x.to_list()
    assert loaded["x"].partition is loaded["y"].partition
    assert loaded["x"].partition.levels[0].max_length == 2
