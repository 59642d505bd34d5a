"""Behaviour of ``ragged.attention`` beyond the op table: long segments (the flash backward),
buckets, the pair bias, empty key sets, transforms and compilation."""

from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
import ragged.testing
from ragged.kernels import _attention_plan as planner
from tests.optable.attention import attention_reference, cross_lengths, pair_bias
from tests.strategies import lengths as lengths_strategy
from tests.strategies import random_tensor


def reference(q, k, v, bias=None, **kwargs):
    """Per-segment SDPA, concatenated: ``[Tq, H, Dv]``."""
    biases = bias.unbind() if bias is not None else [None] * q.num_segments
    parts = [
        attention_reference(a, b, c, d, **kwargs)
        for a, b, c, d in zip(q.unbind(), k.unbind(), v.unbind(), biases, strict=True)
    ]
    if not parts:
        return q.values.new_zeros((0, *q.values.shape[1:-1], v.values.shape[-1]))
    return torch.cat(parts)


def arrays(lengths, inner, seed, layout="contiguous", dtype=torch.float64, grad=False):
    values = random_tensor((sum(lengths), *inner), dtype, seed, layout)
    if grad:
        values = values.detach().requires_grad_()
    return ragged.from_lengths(values, lengths)


@settings(max_examples=40, deadline=None)
@given(
    lengths=lengths_strategy(max_segments=7, max_length=30),
    seed=st.integers(0, 2**31 - 1),
    layout=st.sampled_from(["contiguous", "strided", "transposed"]),
    kind=st.sampled_from(["self", "causal", "cross", "bias", "bias_causal", "cross_bias"]),
    cost=st.sampled_from([0, 10**9]),
)
def test_matches_per_segment_sdpa_with_gradients(lengths, seed, layout, kind, cost):
    """Forward and gradients (q, k, v, bias) against per-segment SDPA: empty segments, long
    segments (the flash backward), causal, cross-attention, bias, non-contiguous inputs; with
    equal-length buckets and with padded buckets (one bucket for the batch)."""
    with mock.patch.object(planner, "CALL_COST", cost):
        _check_against_sdpa(lengths, seed, layout, kind)


def _check_against_sdpa(lengths, seed, layout, kind):
    gen = torch.Generator().manual_seed(seed)
    cross = kind.startswith("cross")
    key_lengths = cross_lengths(lengths) if cross else lengths
    q = arrays(lengths, (2, 4), seed, layout, grad=True)
    k = arrays(key_lengths, (2, 4), seed + 1, layout, grad=True)
    v = arrays(key_lengths, (2, 4), seed + 2, layout, grad=True)
    if not cross:
        k = ragged.RaggedArray(k.values, q.partition)
        v = ragged.RaggedArray(v.values, q.partition)
    else:
        v = ragged.RaggedArray(v.values, k.partition)
    causal = kind.endswith("causal")
    bias = None
    if "bias" in kind:
        pairs = sum(a * b for a, b in zip(lengths, key_lengths, strict=True))
        values = torch.randn(pairs, 2, generator=gen, dtype=torch.float64).requires_grad_()
        bias = pair_bias(q, k, values)
    out = ragged.attention(q, k, v, causal=causal, bias=bias)
    expected = reference(q, k, v, bias, causal=causal)
    torch.testing.assert_close(out.values, expected)
    assert out.partition is q.partition
    leaves = [x.values for x in (q, k, v)] + ([bias.values] if bias is not None else [])
    if out.values.numel():
        cotangent = torch.randn(out.values.shape, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad(out.values, leaves, cotangent, allow_unused=True)
        want = torch.autograd.grad(expected, leaves, cotangent, allow_unused=True)
        for a, b in zip(got, want, strict=True):
            if b is None:  # no path in the reference (e.g. keys of empty query segments)
                assert a is None or not a.any()
            else:
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cost", [0, 10**9])
def test_exact_whatever_the_buckets(monkeypatch, cost):
    """One bucket per segment or one padded bucket for all: the same result."""
    monkeypatch.setattr(planner, "CALL_COST", cost)
    lengths = [70, 0, 3, 65, 1, 100, 64, 2]
    x = arrays(lengths, (2, 4), 0, grad=True)
    for causal in (False, True):
        out = ragged.attention(x, x, x, causal=causal)
        expected = reference(x, x, x, causal=causal)
        torch.testing.assert_close(out.values, expected)
        (got,) = torch.autograd.grad(out.values.sum(), x.values)
        (want,) = torch.autograd.grad(expected.sum(), x.values)
        torch.testing.assert_close(got, want)


def test_queries_without_keys_give_zero_with_zero_gradient():
    q = arrays([2, 3, 0], (1, 4), 0, grad=True)
    k = arrays([0, 2, 4], (1, 4), 1)
    out = ragged.attention(q, k, k)
    assert out.values[:2].eq(0).all() and out.values[2:].ne(0).all()
    (grad,) = torch.autograd.grad(out.values.sum(), q.values)
    assert grad[:2].eq(0).all()


def test_empty_and_zero_segments():
    x = arrays([0, 0], (2, 3), 0)
    assert ragged.attention(x, x, x).values.shape == (0, 2, 3)
    none = arrays([], (2, 3), 0)
    assert ragged.attention(none, none, none).num_segments == 0


def test_plan_is_cached_per_partition_and_padding_is_bounded():
    x = arrays([512, 3, 5, 7, 500, 9] + [16] * 40, (4, 64), 0, dtype=torch.float32)
    level = x.partition.levels[0]
    first = planner.plan(level, level, 256)
    assert planner.plan(level, level, 256) is first
    lengths = planner.host_lengths(level)
    real = sum(n * n for n in lengths)
    padded = sum(b.n * b.q_len * b.k_len for b in first.buckets)
    # Each merged segment adds at most CALL_COST / (H * D) padded pairs: never B * Lmax^2.
    assert padded - real <= len(lengths) * planner.CALL_COST / 256
    assert padded < len(lengths) * max(lengths) ** 2 / 20


def test_bias_partition_identity_equal_and_wrong():
    x = arrays([2, 0, 3], (2, 4), 0)
    values = torch.randn(13, 2, dtype=torch.float64)
    same = pair_bias(x, x, values)
    other_x = arrays([2, 0, 3], (2, 4), 0)  # equal offsets, another partition object
    equal = pair_bias(other_x, other_x, values)
    a = ragged.attention(x, x, x, bias=same)
    b = ragged.attention(x, x, x, bias=equal)
    torch.testing.assert_close(a.values, b.values)
    wrong = pair_bias(arrays([3, 0, 2], (2, 4), 0), arrays([3, 0, 2], (2, 4), 0), values)
    with pytest.raises(ValueError, match="must be a pair map"):
        ragged.attention(x, x, x, bias=wrong)


def test_bias_masks_pairs():
    x = arrays([3], (1, 4), 0)
    mask = torch.zeros(9, 1, dtype=torch.float64)
    mask[[1, 2, 5]] = float("-inf")  # row 0 sees key 0 only, row 1 keys 0-1: causal
    out = ragged.attention(x, x, x, bias=pair_bias(x, x, mask))
    torch.testing.assert_close(out.values, ragged.attention(x, x, x, causal=True).values)


def test_dropout_path():
    x = arrays([5, 0, 40], (2, 4), 0, dtype=torch.float32)
    torch.manual_seed(0)
    out = ragged.attention(x, x, x, dropout_p=0.5)
    assert out.partition is x.partition and torch.isfinite(out.values).all()
    assert not torch.allclose(out.values, ragged.attention(x, x, x).values)
    zero = ragged.attention(x, x, x, dropout_p=0.0)
    torch.testing.assert_close(zero.values, ragged.attention(x, x, x).values)


def test_vmap_over_q_k_v_and_bias():
    x = arrays([3, 0, 4], (2, 4), 0)
    bias = pair_bias(x, x, torch.randn(25, 2, dtype=torch.float64))

    def f(q, k, v, b):
        return ragged.attention(
            x.with_values(q), x.with_values(k), x.with_values(v), bias=bias.with_values(b)
        ).values

    stacks = [torch.randn(3, *t.shape, dtype=torch.float64) for t in (x.values,) * 3]
    stacks.append(torch.randn(3, 25, 2, dtype=torch.float64))
    batched = torch.func.vmap(f)(*stacks)
    looped = torch.stack([f(*(s[i] for s in stacks)) for i in range(3)])
    torch.testing.assert_close(batched, looped)
    # Some arguments batched, others not.
    half = torch.func.vmap(f, in_dims=(0, None, 0, None))(
        stacks[0], x.values, stacks[2], bias.values
    )
    torch.testing.assert_close(half[1], f(stacks[0][1], x.values, stacks[2][1], bias.values))


def test_jacfwd_equals_jacrev_and_hessian_of_bias():
    x = arrays([2, 0, 3], (1, 2), 0)
    bias = pair_bias(x, x, torch.randn(13, 1, dtype=torch.float64))

    def f(b):
        return ragged.attention(x, x, x, bias=bias.with_values(b), causal=True).values

    torch.testing.assert_close(torch.func.jacfwd(f)(bias.values), torch.func.jacrev(f)(bias.values))
    hessian = torch.func.hessian(lambda b: (f(b) ** 2).sum())(bias.values)
    expected = torch.autograd.functional.hessian(lambda b: (f(b) ** 2).sum(), bias.values)
    torch.testing.assert_close(hessian, expected)


@pytest.fixture(params=["custom op", "tiles"])
def compiled_path(request, monkeypatch):
    """Under torch.compile on CPU: the eager kernel as a custom op, or the sync-free tiles."""
    monkeypatch.setattr(ragged.ops._attention, "TILES_UNDER_COMPILE", request.param == "tiles")
    return request.param


def test_compiles_once_aot_eager_cross_and_bias(compiled_path):
    shapes = [[3, 0, 5, 2], [1], [4, 4], [0, 2, 7, 1, 3, 6], [2, 9], [6, 0, 1]]
    cross = []
    for i, n in enumerate(shapes):
        q = arrays(n, (2, 4), i, dtype=torch.float32)
        k = arrays(cross_lengths(n), (2, 4), i + 1, dtype=torch.float32)
        pairs = sum(a * b for a, b in zip(n, cross_lengths(n), strict=True))
        cross.append((q, k, pair_bias(q, k, torch.randn(pairs, 2))))
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            lambda q, k, b: ragged.attention(q, k, k, bias=b),
            cross,
            backend="aot_eager",
            atol=1e-4,
            rtol=1e-4,
        )
    assert report.graphs == 1
    with ragged.dynamic_shapes():  # cross-attention without a bias: bounded by max lengths
        report = ragged.testing.check_compile(
            lambda q, k: ragged.attention(q, k, k), [c[:2] for c in cross], atol=1e-4, rtol=1e-4
        )
    assert report.graphs == 1


# Importing Inductor scripts a torch.jit module (a deprecation warning in torch 2.13).
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiles_once_with_inductor_forward_and_backward(compiled_path):
    shapes = [[3, 0, 5, 2], [1], [40, 4], [0, 2, 7, 1, 3, 6], [2, 70, 9]]
    batches = [
        (arrays(n, (2, 8), i, dtype=torch.float32, grad=True),) for i, n in enumerate(shapes)
    ]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            lambda x: ragged.attention(x, x, x, causal=True),
            batches,
            backend="inductor",
            grad=True,
            atol=1e-4,
            rtol=1e-4,
        )
    assert report.graphs == 1


@pytest.mark.parametrize("length", [3, 70])  # the matmul backward, and the flash backward
def test_fully_masked_rows_give_zero_and_finite_derivatives(length):
    """A query row whose keys are all masked (-inf bias) gives 0, like the flash kernel and
    SDPA, with finite first and second derivatives and forward-mode tangents."""
    x = arrays([length, 2], (1, 4), 0, grad=True)
    pairs = length * length + 4
    mask = torch.zeros(pairs, 1, dtype=torch.float64)
    mask[:length] = float("-inf")  # row 0 of segment 0
    bias = pair_bias(x, x, mask)

    def f(v):
        return ragged.attention(x.with_values(v), x, x, bias=bias).values

    out = f(x.values)
    assert out[0].eq(0).all() and torch.isfinite(out).all()
    (grad,) = torch.autograd.grad(out.sum(), x.values, create_graph=True)
    assert torch.isfinite(grad).all()
    (second,) = torch.autograd.grad(grad.sum(), x.values)
    assert torch.isfinite(second).all()
    _, tangent = torch.func.jvp(f, (x.values.detach(),), (torch.ones_like(x.values),))
    assert torch.isfinite(tangent).all()
    composite = ragged.attention(x, x, x, bias=bias, dropout_p=1e-12).values  # tiled path
    assert composite[0].eq(0).all()
