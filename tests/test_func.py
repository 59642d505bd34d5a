"""Transforms: ragged.map, ragged.vmap (buckets, collectives, fallbacks), ragged.reduce."""

import functools
import re

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
from tests.strategies import lengths as lengths_strategy
from tests.strategies import ragged_arrays


def attention(s):
    """A per-segment attention: needs the whole segment, wrong under padding."""
    scores = (s @ s.T) / s.shape[-1] ** 0.5
    return torch.softmax(scores, dim=-1) @ s


# --- map ----------------------------------------------------------------------------------------


def test_map_module_and_pytree():
    x = ragged.array([[[1.0, 2.0]], [], [[3.0, 4.0], [5.0, 6.0]]], axes=("b", "l", "d"))
    layer = torch.nn.Linear(2, 3)
    y = ragged.map(layer, x)
    assert y.partition is x.partition
    assert y.axes == ("b", "l", "d")
    torch.testing.assert_close(y.values, layer(x.values))
    out = ragged.map(lambda v, scale: {"a": v * scale, "n": v.norm(dim=-1)}, x, 2.0, axes=None)
    assert out["a"].partition is x.partition
    assert out["a"].axes is None and out["n"].axes is None
    # Names are never dropped silently: a named array whose number of axes changes needs axes=.
    with pytest.raises(ValueError, match=re.escape("(3 -> 2); pass `axes=` with the 2 names")):
        ragged.map(lambda v: v.norm(dim=-1), x)
    assert ragged.map(lambda v: v.norm(dim=-1), x, axes=("b", "l")).axes == ("b", "l")
    assert ragged.map(torch.add, x, x.with_values(x.values)).to_list() == (x * 2).to_list()


def test_map_errors():
    x = ragged.array([[1.0, 2.0], [3.0]])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "ragged.map: `f` must keep the leading dimension (3 rows) of every output, got shape ()."
        ),
    ):
        ragged.map(lambda v: v.sum(), x)
    with pytest.raises(ValueError, match="must include at least one RaggedArray"):
        ragged.map(torch.sin, torch.ones(2))
    with pytest.raises(ValueError, match="different ragged structure"):
        ragged.map(torch.add, x, ragged.array([[1.0], [2.0, 3.0]]))


# --- vmap ---------------------------------------------------------------------------------------


def loop(f, x, *extra):
    return [f(s, *(e[b] for e in extra)) for b, s in enumerate(x.unbind())]


@given(ragged_arrays(inner=(4,), min_segments=1))
def test_vmap_ragged_output_matches_loop(x):
    out = ragged.vmap(attention)(x)
    assert out.partition is x.partition
    for got, want in zip(out.unbind(), loop(attention, x), strict=True):
        torch.testing.assert_close(got, want)


@given(ragged_arrays(inner=(3,), min_segments=1), st.integers(0, 2**16))
def test_vmap_dense_output_and_dense_argument(x, seed):
    w = torch.randn(x.num_segments, 3, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    f = lambda s, wb: (s @ wb).sum() if s.shape[0] else wb.sum() * 0
    out = ragged.vmap(f)(x, w)
    torch.testing.assert_close(out, torch.stack(loop(f, x, w)))


def test_vmap_in_axes_out_axes_and_broadcast():
    x = ragged.array([[1.0, 2.0, 3.0], [4.0], [5.0, 6.0, 7.0]])
    bias = torch.tensor([1.0, 10.0])
    f = lambda s, c: torch.stack([s.sum(), s.max()]) + c
    out = ragged.vmap(f, in_axes=(0, None))(x, bias)
    torch.testing.assert_close(out, torch.tensor([[7.0, 13.0], [5.0, 14.0], [19.0, 17.0]]))
    torch.testing.assert_close(ragged.vmap(f, in_axes=(0, None), out_axes=1)(x, bias), out.T)
    per = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])  # mapped along dim 1
    g = lambda s, p: s.sum() * p
    torch.testing.assert_close(
        ragged.vmap(g, in_axes=(0, 1))(x, per), torch.tensor([[6.0, 0.0], [8.0, 0.0], [54.0, 0.0]])
    )
    tree = ragged.vmap(lambda d: {"m": d["x"].mean(), "c": d["x"] * 2}, in_axes=({"x": 0},))(
        {"x": x}
    )
    assert tree["c"].to_list() == (x * 2).to_list()


def test_vmap_output_rules():
    x = ragged.array([[1.0, 2.0], [3.0, 4.0]])
    assert isinstance(ragged.vmap(lambda s: s * 2)(x), ragged.RaggedArray)  # leading L: ragged
    dense = ragged.vmap(lambda s: s * 2, out_ragged=False)(x)
    torch.testing.assert_close(dense, torch.tensor([[2.0, 4.0], [6.0, 8.0]]))
    square = ragged.from_lengths(torch.ones(4, 2), [2, 2])  # L == D == 2: the probe decides
    torch.testing.assert_close(ragged.vmap(lambda s: s.sum(0))(square), torch.full((2, 2), 2.0))
    assert isinstance(ragged.vmap(lambda s: s.cumsum(0))(square), ragged.RaggedArray)
    y = ragged.array([[1.0, 2.0], [3.0]])
    with pytest.raises(
        ValueError, match=re.escape("output 0 has per-segment shapes {1: (1, 1), 2: (2, 2)}")
    ):
        ragged.vmap(lambda s: s[:, None] * s[None, :])(y)


def test_vmap_empty_segments():
    x = ragged.array([[1.0, 2.0], [], [3.0]])
    torch.testing.assert_close(ragged.vmap(lambda s: s.sum())(x), torch.tensor([3.0, 0.0, 3.0]))
    with pytest.raises(IndexError, match="non-zero size"):
        ragged.vmap(lambda s: s.max(), method="vmap")(x)  # max of an empty segment
    out = ragged.vmap(lambda s: s.max(), fill_empty=float("nan"))(x)
    torch.testing.assert_close(out, torch.tensor([2.0, float("nan"), 3.0]), equal_nan=True)
    assert ragged.vmap(lambda s: s + 1, fill_empty=0.0)(x).to_list() == [[2.0, 3.0], [], [4.0]]


def test_vmap_without_segments_probes_f_for_the_output_shapes():
    x = ragged.from_lengths(torch.zeros(0, 3), [])  # zero segments
    out = ragged.vmap(lambda s: (s.sum(0), s * 2, s.max()))(x)
    assert out[0].shape == (0, 3) and out[2].shape == (0,)  # dense: s.max() needed a 1-row probe
    assert isinstance(out[1], ragged.RaggedArray) and out[1].shape == x.shape
    w = torch.zeros(0, 4)
    assert ragged.vmap(lambda s, wb: s.sum() * wb, out_axes=1)(x, w).shape == (4, 0)
    forced = ragged.vmap(lambda s: s[:1], out_ragged=False)(x)
    assert forced.shape == (0, 0, 3)
    empty = ragged.from_lengths(torch.zeros(0, 3), [0, 0])  # only empty segments, skipped
    filled = ragged.vmap(lambda s: (s.max(0).values, s - 1), fill_empty=-1.0)(empty)
    torch.testing.assert_close(filled[0], torch.full((2, 3), -1.0))
    assert filled[1].to_list() == [[], []]
    with pytest.raises(ValueError, match="no segment to call f on, and f failed on the probe"):
        ragged.vmap(lambda s: s.reshape(7))(x)
    total = ragged.vmap(lambda s: s.sum() / ragged.psum(s.sum(), "b"), axis_name="b")(x)
    assert total.shape == (0,)


def test_vmap_loop_fallback():
    x = ragged.array([[1.0, 2.0], [3.0, 4.0, 5.0]])
    f = lambda s: s * 2 if s.sum().item() > 4 else s  # data-dependent control flow
    with pytest.warns(ragged.RaggedVmapFallbackWarning, match="could not be vmapped"):
        out = ragged.vmap(f)(x)
    assert out.to_list() == [[1.0, 2.0], [6.0, 8.0, 10.0]]
    assert ragged.vmap(f, method="loop")(x).to_list() == out.to_list()


def test_vmap_grad_matches_loop():
    x = ragged.array([[1.0, 2.0, 3.0], [4.0], [5.0, 6.0]], dtype=torch.float64)
    x = x.with_values(torch.randn(6, 2, dtype=torch.float64))
    loss = lambda x: (ragged.vmap(attention)(x).values ** 2).sum()
    g = torch.func.grad(loss)(x)
    v = x.values.clone().requires_grad_()
    ref = sum((attention(s) ** 2).sum() for s in torch.split(v, x.lengths.tolist()))
    (expected,) = torch.autograd.grad(ref, v)
    torch.testing.assert_close(g.values, expected)


def test_vmap_inside_torch_compile():
    x = ragged.array([[1.0, 2.0, 3.0], [4.0], [5.0, 6.0]])
    compiled = torch.compile(
        lambda x: ragged.vmap(lambda s: torch.softmax(s, 0))(x), backend="eager"
    )
    torch.testing.assert_close(
        compiled(x).values, ragged.vmap(lambda s: torch.softmax(s, 0))(x).values
    )


# --- collectives --------------------------------------------------------------------------------


@settings(max_examples=15)
@given(ragged_arrays(inner=(2,), min_segments=1, allow_empty=False))
def test_collectives_match_global_reductions(x):
    segments = x.unbind()
    sums = torch.stack([s.sum(0) for s in segments])
    f = lambda s: (
        s.sum(0) / ragged.psum(s.sum(0), "seg"),
        ragged.pmax(s.max(), "seg"),
        ragged.pmean(s.sum(0), "seg"),
        ragged.pmin(s.min(), "seg"),
    )
    share, top, mean, low = ragged.vmap(f, axis_name="seg")(x)
    torch.testing.assert_close(share, sums / sums.sum(0))
    torch.testing.assert_close(
        top, torch.full((x.num_segments,), x.values.max().item(), dtype=x.dtype)
    )
    torch.testing.assert_close(mean, sums.mean(0).expand_as(sums))
    torch.testing.assert_close(
        low, torch.full((x.num_segments,), x.values.min().item(), dtype=x.dtype)
    )


def test_collectives_gradients():
    x = ragged.from_lengths(torch.randn(7, dtype=torch.float64), [3, 1, 3])
    f = ragged.vmap(
        lambda s: torch.softmax(s, 0) * s.sum() / ragged.psum(s.sum() ** 2, "seg"), axis_name="seg"
    )

    def via_values(v):
        return f(x.with_values(v)).values

    assert torch.autograd.gradcheck(via_values, (x.values.clone().requires_grad_(),))


def test_collective_outside_vmap():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "ragged.psum: `axis_name` must name an enclosing ragged.vmap(..., axis_name=...), got 'seg'."
        ),
    ):
        ragged.psum(torch.ones(2), "seg")


# --- reduce -------------------------------------------------------------------------------------


@given(lengths_strategy(max_length=9), st.integers(0, 2**16))
def test_reduce_non_commutative_monoid(lens, seed):
    gen = torch.Generator().manual_seed(seed)
    mats = torch.randn(sum(lens), 2, 2, generator=gen, dtype=torch.float64) * 0.5
    x = ragged.from_lengths(mats, lens)
    out = ragged.reduce(torch.matmul, x, initial=torch.eye(2, dtype=torch.float64))
    for b, seg in enumerate(x.unbind()):
        want = functools.reduce(torch.matmul, list(seg), torch.eye(2, dtype=torch.float64))
        torch.testing.assert_close(out[b], want)


def test_reduce_gradcheck_and_unknown_max_length():
    v = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    f = lambda v: ragged.reduce(
        torch.mul, ragged.from_lengths(v, torch.tensor([4, 0, 2]), validate=False), initial=1.0
    )
    assert torch.autograd.gradcheck(f, (v,))
    torch.testing.assert_close(f(v), ragged.prod(ragged.from_lengths(v, [4, 0, 2]), axis=1))


# --- ragged.jit ---------------------------------------------------------------------------------


def _batches() -> list[ragged.RaggedArray]:
    """Batches of several sizes, one segment, one row and none (the 0/1 cases)."""
    shapes = [[3, 0, 5], [1], [2, 4, 1, 6], [], [0, 0], [7]]
    gen = torch.Generator().manual_seed(0)
    return [ragged.from_lengths(torch.randn(sum(n), 3, generator=gen), n) for n in shapes]


def test_jit_one_graph_for_every_batch_with_a_pytree_and_grad_inside():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()

    @ragged.jit(backend=counter, fullgraph=True)
    def step(batch: dict, w: torch.Tensor) -> dict:
        def loss(w: torch.Tensor) -> torch.Tensor:
            h = ragged.map(lambda v: torch.tanh(v @ w), batch["x"])
            return (ragged.sum(h, axis=1) ** 2).sum()

        return {"grad": torch.func.grad(loss)(w), "y": ragged.softmax(batch["x"] * 2, axis=1)}

    w = torch.randn(3, 2, dtype=torch.float32)
    for x in _batches():
        out = step({"x": x}, w)
        loss = lambda w, x=x: (ragged.sum(ragged.map(lambda v: torch.tanh(v @ w), x), 1) ** 2).sum()
        torch.testing.assert_close(out["grad"], torch.func.grad(loss)(w), atol=1e-5, rtol=1e-5)
        assert out["y"].partition is x.partition
        torch.testing.assert_close(out["y"].values, ragged.softmax(x * 2, axis=1).values)
    assert counter.frame_count == 1


def test_jit_decorator_forms_and_nesting():
    from torch._dynamo.testing import CompileCounter

    def double(x: ragged.RaggedArray) -> ragged.RaggedArray:
        """Doubles."""
        return x * 2

    counter = CompileCounter()
    plain = ragged.jit(double, backend=counter)
    assert (
        plain.__wrapped__ is double and plain.__doc__ == "Doubles." and plain.__name__ == "double"
    )
    inner = ragged.jit(backend=counter)(lambda x: ragged.cumsum(x, axis=1))
    outer = ragged.jit(lambda x: inner(plain(x)), backend=counter)
    for x in _batches()[:3]:
        torch.testing.assert_close(outer(x).values, ragged.cumsum(x * 2, axis=1).values)
    assert counter.frame_count == 1  # inner was traced into outer's graph
    with pytest.raises(TypeError, match=r"^ragged.jit: `f` must be a callable or None, got int.$"):
        ragged.jit(3)


def test_jit_compiles_each_function_under_its_own_code_object():
    """Nine functions (more than Dynamo's recompile limit of 8) each with its own graph: a
    wrapper shared by every jitted function would exhaust one limit under fullgraph."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    x = _batches()[0]
    for k in range(9):
        scope: dict = {"ragged": ragged}
        exec(f"def f(x):\n    return ragged.sum(x + {k}, axis=1)", scope)  # a new code object
        jitted = ragged.jit(scope["f"], backend=counter, fullgraph=True)
        torch.testing.assert_close(jitted(x), ragged.sum(x + k, axis=1))
    assert counter.frame_count == 9
