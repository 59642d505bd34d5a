"""Pair-map products: triangle_multiply, pair_dot and outer against per-segment references, on
both kernels (eager groups, compiled tiles), with every transform."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
import ragged.testing
from ragged.kernels import _pairblocks
from tests.optable import pair_blocks, pair_randn
from tests.strategies import lengths as lengths_strategy

EQUATIONS = {True: "ikc,jkc->ijc", False: "kic,kjc->ijc"}


def _maps(lengths: list[int], seed: int, inner=(3,), dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    a = pair_randn(lengths, inner, gen, dtype)
    b = a.with_values(torch.randn(a.values.shape, generator=gen, dtype=dtype))
    return a, b


def _tiled(a: ragged.RaggedArray, b: ragged.RaggedArray, tx: bool, ty: bool) -> torch.Tensor:
    level = a.partition.levels[0]
    return _pairblocks.tiled_block_matmul(
        a.values, b.values, level.lengths, level.offsets, level.num_children,
        level.max_length, tx, ty,
    )  # fmt: skip


@pytest.mark.parametrize("outgoing", [True, False])
@given(lengths=lengths_strategy(max_segments=5, max_length=6), seed=st.integers(0, 2**16))
def test_triangle_multiply_matches_einsum_per_segment(outgoing, lengths, seed):
    a, b = _maps(lengths, seed)
    out = ragged.triangle_multiply(a, b, outgoing=outgoing)
    assert out.partition is a.partition
    expected = [
        torch.einsum(EQUATIONS[outgoing], p, q)
        for p, q in zip(pair_blocks(a), pair_blocks(b), strict=True)
    ]
    for got, want in zip(pair_blocks(out), expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("tx", "ty"), [(False, True), (True, False), (False, False), (True, True)])
@given(lengths=lengths_strategy(max_segments=5, max_length=12), seed=st.integers(0, 2**16))
@settings(max_examples=20)
def test_grouped_and_tiled_kernels_agree(tx, ty, lengths, seed):
    """The compiled path's kernel, run eagerly, equals the grouped one for every transpose
    combination (the backward uses all four), including one segment longer than a tile."""
    a, b = _maps([*lengths, 40], seed, inner=(2,))
    level = a.partition.levels[0]
    grouped = _pairblocks._grouped_block_matmul(a.values, b.values, level, tx, ty)
    torch.testing.assert_close(_tiled(a, b, tx, ty), grouped)


def test_tiled_kernel_bound_when_max_length_is_unknown():
    a, b = _maps([3, 0, 35], 0)
    level = a.partition.levels[0]
    tiled = _pairblocks.tiled_block_matmul(
        a.values, b.values, level.lengths, level.offsets, level.num_children,
        level.num_children, False, True,
    )  # fmt: skip
    torch.testing.assert_close(tiled, ragged.triangle_multiply(a, b).values)


def test_tiled_function_gradients():
    """The compiled path's autograd.Function: its backward is the same product transposed."""
    a, b = _maps([2, 0, 3, 1], 1, inner=(2,))
    level = a.partition.levels[0]

    for tx, ty in [(False, True), (True, False), (False, False)]:

        def fn(x, y, tx=tx, ty=ty):
            return _pairblocks._TiledBlockMatmul.apply(
                x, y, level.lengths, level.offsets, level.num_children, level.max_length, tx, ty
            )

        x = a.values.detach().requires_grad_()
        y = b.values.detach().requires_grad_()
        assert torch.autograd.gradcheck(fn, (x, y))
        assert torch.autograd.gradgradcheck(fn, (x, y))


def test_triangle_multiply_edge_cases():
    for lengths in ([], [0, 0], [1], [1, 0, 1], [5]):
        a, b = _maps(lengths, 2)
        for outgoing in (True, False):
            out = ragged.triangle_multiply(a, b, outgoing=outgoing)
            assert out.values.shape == a.values.shape
            for got, p, q in zip(pair_blocks(out), pair_blocks(a), pair_blocks(b), strict=True):
                torch.testing.assert_close(got, torch.einsum(EQUATIONS[outgoing], p, q))


def test_triangle_multiply_interleaved_groups_and_no_inner_axes():
    """Segments of one length that are not consecutive are gathered, then put back in order."""
    lengths = [3, 2, 3, 0, 2, 3]
    gen = torch.Generator().manual_seed(0)
    a = pair_randn(lengths, (), gen, torch.float64)
    b = a.with_values(torch.randn(a.values.shape, generator=gen, dtype=torch.float64))
    out = ragged.triangle_multiply(a, b, outgoing=False)
    for got, p, q in zip(pair_blocks(out), pair_blocks(a), pair_blocks(b), strict=True):
        torch.testing.assert_close(got, p.T @ q)


def test_triangle_multiply_transforms():
    a, b = _maps([3, 0, 2, 1], 3, inner=(2,))

    def fn(x, y):
        return ragged.triangle_multiply(a.with_values(x), b.with_values(y)).values

    x, y = a.values.detach().requires_grad_(), b.values.detach().requires_grad_()
    assert torch.autograd.gradcheck(fn, (x, y), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(fn, (x, y))
    ensemble = torch.stack([a.values, b.values, a.values * 2])
    batched = torch.func.vmap(fn, in_dims=(0, None))(ensemble, b.values)
    for got, v in zip(batched, ensemble, strict=True):
        torch.testing.assert_close(got, fn(v, b.values))


def test_triangle_multiply_same_partition_by_value():
    a, _ = _maps([2, 3], 4)
    other = pair_randn([2, 3], (3,), torch.Generator().manual_seed(5), torch.float64)
    assert other.partition is not a.partition
    out = ragged.triangle_multiply(a, other)
    for got, p, q in zip(pair_blocks(out), pair_blocks(a), pair_blocks(other), strict=True):
        torch.testing.assert_close(got, torch.einsum("ikc,jkc->ijc", p, q))


@given(lengths=lengths_strategy(max_segments=5, max_length=6), seed=st.integers(0, 2**16))
def test_pair_dot_kernels_match_reference(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    x = ragged.from_lengths(torch.randn(sum(lengths), 2, 3, generator=gen), lengths)
    y = ragged.from_lengths(torch.randn(sum(lengths), 3, generator=gen), lengths)
    out = ragged.pair_dot(x, y, scale=0.5)
    rows = x.partition.levels[0]
    tiled = ragged.ops._pairs._pair_dot_tiled(x.values, y.values, rows, rows, out.values.shape[0])
    torch.testing.assert_close(tiled * 0.5, out.values)
    for got, p, q in zip(pair_blocks(out), x.unbind(), y.unbind(), strict=True):
        torch.testing.assert_close(got, torch.einsum("ihd,jd->ijh", p, q) * 0.5)


def test_pair_dot_is_matmul_with_mT_and_names():
    x = ragged.from_lengths(torch.randn(5, 4), [2, 3], axes=("batch", "i", "feat"))
    y = x.rename(i="j")
    out = ragged.pair_dot(x, y)
    assert out.axes == ("batch", "i", "j")
    torch.testing.assert_close((x @ x.mT).values, out.values)
    torch.testing.assert_close(ragged.matmul(x, y.mT).values, out.values)


@given(lengths=lengths_strategy(max_segments=5, max_length=6), seed=st.integers(0, 2**16))
def test_pair_matmul_kernels_match_the_weighted_sum(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    p = pair_randn(lengths, (2,), gen, torch.float64)
    v = ragged.from_lengths(
        torch.randn(sum(lengths), 2, 3, generator=gen, dtype=torch.float64), lengths
    )
    out = ragged.pair_matmul(p, v)
    assert out.partition.levels[0] is p.partition.levels[0]
    columns = p.partition.levels[1].columns
    torch.testing.assert_close(out.values, ragged.ops._pairs._pair_matmul_gathered(p, v, columns))
    if p.values.shape[0]:  # the broadcast product needs pairs to line up
        torch.testing.assert_close(out.values, ragged.sum(p[..., None] * v[:, None], axis=2).values)


def test_outer_op_paths_agree():
    """Recognised elementwise ops take the broadcasting path; others get row batches."""
    gen = torch.Generator().manual_seed(0)
    x = ragged.from_lengths(torch.randn(9, 3, generator=gen), [2, 0, 4, 3])
    y = ragged.from_lengths(torch.randn(9, 3, generator=gen), [3, 2, 1, 3])
    fast = ragged.outer(x, y, torch.mul)
    rows = ragged.outer(x, y, lambda a, b: a * b)
    torch.testing.assert_close(fast.values, rows.values)
    assert fast.to_list() == rows.to_list()


def test_pair_ops_compile_once():
    """One graph over batches of different B, lengths and empty segments (forward and
    backward), no host syncs."""

    def block(x, a):
        z = ragged.outer(x, x, torch.mul).values.sum(-1, keepdim=True)
        scores = ragged.matmul(x, x.mT)
        tri = ragged.triangle_multiply(a, a.with_values(a.values * z), outgoing=False)
        return tri.with_values(tri.values * scores.values[:, None])

    batches = []
    for i, lengths in enumerate([[3, 0, 5], [1], [4, 4, 2, 7], [0, 2, 9, 1, 3]]):
        gen = torch.Generator().manual_seed(i)
        x = ragged.from_lengths(torch.randn(sum(lengths), 4, generator=gen), lengths)
        a = pair_randn(lengths, (2,), gen, torch.float32)
        a = ragged.RaggedArray(a.values.requires_grad_(), ragged.outer(x, x).partition)
        batches.append((x, a))
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(block, batches, grad=True, atol=1e-4, rtol=1e-4)
    assert report.graphs == 1
