"""The native tiled attention kernel (ragged/kernels/_native_attention.c) against per-segment
SDPA: values and gradients, causal or not, grouped-query heads, cross-attention, empty and single
segments, several tiles per segment, threads, the fallbacks and the compiled custom op."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
import ragged.testing
from ragged.kernels import _native_attention as native
from tests.optable.attention import attention_reference
from tests.strategies import lengths as lengths_strategy
from tests.strategies import random_tensor

pytestmark = pytest.mark.skipif(native.library() is None, reason="no native attention kernel")


def reference(q, k, v, **kwargs):
    """Per-segment SDPA, concatenated: ``[Tq, H, Dv]``."""
    parts = [
        attention_reference(a, b, c, **kwargs)
        for a, b, c in zip(q.unbind(), k.unbind(), v.unbind(), strict=True)
    ]
    if not parts:
        return q.values.new_zeros((0, q.values.shape[1], v.values.shape[-1]))
    return torch.cat(parts)


def arrays(lengths, heads, width, seed, dtype=torch.float64, layout="contiguous"):
    values = random_tensor((sum(lengths), heads, width), dtype, seed, layout)
    return ragged.from_lengths(values.detach().requires_grad_(), lengths)


@contextlib.contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Counts the native forward and backward calls (to check which path ran)."""
    seen = {"forward": 0, "backward": 0}
    with contextlib.ExitStack() as stack:
        for name in seen:
            original = getattr(native, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                seen[_name] += 1
                return _original(*args, **kwargs)

            stack.enter_context(mock.patch.object(native, name, counted))
        yield seen


@pytest.fixture
def calls():
    with counting() as seen:
        yield seen


def _check(lengths, key_lengths, heads, kv_heads, width, width_v, causal, dtype, seed, layout):
    q = arrays(lengths, heads, width, seed, dtype, layout)
    k = arrays(key_lengths, kv_heads, width, seed + 1, dtype, layout)
    v = arrays(key_lengths, kv_heads, width_v, seed + 2, dtype, layout)
    out = ragged.attention(q, k, v, causal=causal)
    expected = reference(q, k, v, causal=causal)
    tol = {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 2e-5}
    torch.testing.assert_close(out.values, expected, **tol)
    grad = torch.randn_like(expected)
    got = torch.autograd.grad(
        out.values, (q.values, k.values, v.values), grad, allow_unused=True, materialize_grads=True
    )
    inputs = (q.values, k.values, v.values)
    if expected.requires_grad:
        want = torch.autograd.grad(
            expected, inputs, grad, allow_unused=True, materialize_grads=True
        )
    else:  # no pair at all: zero gradients
        want = tuple(torch.zeros_like(x) for x in inputs)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tol)


@settings(max_examples=40, deadline=None)
@given(
    lengths=lengths_strategy(max_segments=6, max_length=12),
    seed=st.integers(0, 2**31 - 1),
    kind=st.sampled_from(["self", "causal", "cross"]),
    heads=st.sampled_from([(2, 2), (4, 2), (3, 1)]),
    widths=st.sampled_from([(4, 4), (8, 3)]),
    layout=st.sampled_from(["contiguous", "transposed"]),
)
def test_matches_per_segment_sdpa_with_gradients(lengths, seed, kind, heads, widths, layout):
    """Small tiles (forward 3 query rows by 5 keys, backward 4 by 3) so that segments span
    several of each: the online softmax across key tiles, the causal diagonal inside a tile."""
    causal = kind == "causal"
    key_lengths = [(3 * n + 2) % 9 for n in lengths] if kind == "cross" else lengths
    with (
        mock.patch.object(native, "BLOCK_Q", 3),
        mock.patch.object(native, "BLOCK_K", 5),
        mock.patch.object(native, "BACKWARD_BLOCK_Q", 4),
        mock.patch.object(native, "BACKWARD_BLOCK_K", 3),
        counting() as calls,
    ):
        _check(lengths, key_lengths, *heads, *widths, causal, torch.float64, seed, layout)
    assert calls == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [[300], [0, 0], [], [130, 0, 1, 257, 64]])
def test_float32_default_tiles_and_edge_batches(lengths, causal, calls):
    """The default tiles on one long segment, empty batches and segments, float32."""
    _check(lengths, lengths, 4, 2, 16, 16, causal, torch.float32, 0, "contiguous")
    assert calls == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("micro", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("widths", [(64, 64), (32, 32), (80, 80), (128, 128), (20, 48), (16, 24)])
def test_float32_micro_kernel_edges(widths, causal, micro, calls, monkeypatch):
    """The float32 micro-kernels (AVX-512 builds; ``micro=False`` and builds without them take
    the BLAS tiles): lengths around their 16-key vectors, 6-row blocks and 64-key tiles, head
    widths of several vectors, not a multiple of 64 or of 16 (then the backward, and for the
    values' width the forward too, take the BLAS tiles), values and gradients."""
    monkeypatch.setattr(native, "MICRO_KERNEL", micro)
    lengths = [1, 15, 16, 17, 0, 63, 64, 65, 6, 7, 130]
    _check(lengths, lengths, 4, 2, *widths, causal, torch.float32, 0, "contiguous")
    if not causal:  # cross-attention: other key lengths, 3 query heads per key-value head
        cross = [(3 * n + 5) % 71 for n in lengths]
        _check(lengths, cross, 3, 1, *widths, causal, torch.float32, 1, "contiguous")
    assert calls == {"forward": 2 - causal, "backward": 2 - causal}


def test_micro_kernel_is_built_where_the_cpu_has_avx512():
    """The library is built with ``-march=native``: on a CPU with AVX-512 the float32
    micro-kernels must be in it (else every float32 call silently takes the BLAS tiles)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    if " avx512f" not in flags:
        pytest.skip("no AVX-512 here")
    assert native.micro_kernel()


def test_queries_without_keys_give_zero_and_zero_gradient(calls):
    q = arrays([3, 2, 4], 2, 4, 0)
    k = arrays([0, 5, 0], 2, 4, 1)
    out = ragged.attention(q, k, k)
    assert calls["forward"] == 1
    assert torch.equal(out.values[:3], torch.zeros(3, 2, 4, dtype=torch.float64))
    (dq,) = torch.autograd.grad(out.values.sum(), (q.values,))
    assert torch.equal(dq[:3], torch.zeros_like(dq[:3]))
    assert torch.equal(dq[5:], torch.zeros_like(dq[5:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_writes_every_gradient_row(dtype, monkeypatch):
    """The gradients start uninitialised (``empty_like``, here filled with NaN): the kernel
    writes every row, 0 outside every segment and where a segment has no queries."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(9, 2, 16, generator=gen, dtype=dtype) for _ in range(4))
    offsets = torch.tensor([2, 5, 5, 7])
    out, lse = native.forward(q, k, v, offsets, offsets, 0.25, True)
    monkeypatch.setattr(torch, "empty_like", lambda x: torch.full_like(x, float("nan")))
    grads = native.backward(grad, q, k, v, out, lse, offsets, offsets, 0.25, True)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    parts = [
        attention_reference(*(x[a:b] for x in leaves), causal=True) for a, b in ((2, 5), (5, 7))
    ]
    want = torch.autograd.grad(torch.cat(parts), leaves, grad[2:7])
    for got, ref in zip(grads, want, strict=True):
        assert torch.equal(got[:2], torch.zeros_like(got[:2]))
        assert torch.equal(got[7:], torch.zeros_like(got[7:]))
        torch.testing.assert_close(got[2:7], ref[2:7], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal, monkeypatch):
    for name, size in (("BLOCK_Q", 2), ("BLOCK_K", 3), ("BACKWARD_BLOCK_Q", 3)):
        monkeypatch.setattr(native, name, size)
    monkeypatch.setattr(native, "BACKWARD_BLOCK_K", 2)
    q = arrays([3, 0, 5], 2, 3, 0)
    k = arrays([3, 0, 5], 1, 3, 1)
    v = arrays([3, 0, 5], 1, 2, 2)

    def f(a, b, c):
        return ragged.attention(
            ragged.from_lengths(a, [3, 0, 5]),
            ragged.from_lengths(b, [3, 0, 5]),
            ragged.from_lengths(c, [3, 0, 5]),
            causal=causal,
        ).values

    assert torch.autograd.gradcheck(f, (q.values, k.values, v.values))


@pytest.mark.parametrize("width", [8, 64])  # the BLAS tiles, the micro-kernels (AVX-512)
def test_results_do_not_depend_on_the_thread_count(width):
    # long enough that the kernel splits every call (it keeps small calls on one thread)
    lengths = [700, 3, 0, 77, 300, 1, 64]
    q, k, v = (arrays(lengths, 4, width, s, torch.float32) for s in range(3))
    grad = torch.randn(sum(lengths), 4, width)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            out = ragged.attention(q, k, v, causal=True).values
            results.append((out, *torch.autograd.grad(out, (q.values, k.values, v.values), grad)))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_disabled_and_other_variants_take_the_bucket_path(calls, monkeypatch):
    q = arrays([5, 7], 2, 4, 0)
    expected = reference(q, q, q, causal=True)
    ragged.attention(q, q, q, causal=True, window=(2, None))
    assert calls["forward"] == 0
    monkeypatch.setattr(native, "ENABLED", False)
    torch.testing.assert_close(ragged.attention(q, q, q, causal=True).values, expected)
    assert calls["forward"] == 0


def test_double_backward_and_batched_gradients_fall_back_exactly(calls):
    q = arrays([4, 0, 6], 2, 3, 0)
    out = ragged.attention(q, q, q, causal=True)
    expected = reference(q, q, q, causal=True)
    (g1,) = torch.autograd.grad(out.values.square().sum(), (q.values,), create_graph=True)
    (r1,) = torch.autograd.grad(expected.square().sum(), (q.values,), create_graph=True)
    torch.testing.assert_close(g1, r1)
    assert calls["backward"] == 0  # the graph of the gradient: the bucket formulas
    (g2,) = torch.autograd.grad(g1.sum(), (q.values,))
    (r2,) = torch.autograd.grad(r1.sum(), (q.values,))
    torch.testing.assert_close(g2, r2)
    out = ragged.attention(q, q, q, causal=True)
    expected = reference(q, q, q, causal=True)
    grads = torch.randn(2, *out.values.shape, dtype=torch.float64)
    (batched,) = torch.autograd.grad(out.values, (q.values,), grads, is_grads_batched=True)
    for i in range(2):
        (one,) = torch.autograd.grad(expected, (q.values,), grads[i], retain_graph=True)
        torch.testing.assert_close(batched[i], one)


def test_transforms_keep_the_bucket_path(calls):
    q = arrays([4, 2], 2, 3, 0)

    def f(x):
        y = ragged.from_lengths(x, [4, 2])
        return ragged.attention(y, y, y).values

    out = torch.func.vmap(f)(q.values.detach()[None])
    torch.testing.assert_close(out[0], reference(q, q, q).detach())
    x = q.values.detach()
    torch.testing.assert_close(torch.func.jacrev(f)(x), torch.func.jacfwd(f)(x))
    assert calls["forward"] == 0


def test_bad_offsets_raise():
    x = torch.randn(4, 1, 2)
    with pytest.raises(ValueError, match="not non-decreasing"):
        native.forward(x, x, x, torch.tensor([0, 3, 2, 4]), torch.tensor([0, 3, 2, 4]), 1.0, False)
    with pytest.raises(ValueError, match="not non-decreasing"):
        native.forward(x, x, x, torch.tensor([0, 5]), torch.tensor([0, 4]), 1.0, False)


def test_compiled_custom_op_runs_the_kernel_in_one_graph(calls):
    shapes = [[3, 0, 5, 2], [1, 9], [4, 4, 6]]
    batches = [(arrays(n, 2, 4, i, torch.float32),) for i, n in enumerate(shapes)]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            lambda x: ragged.attention(x, x, x, causal=True),
            batches,
            backend="aot_eager",
            grad=True,
            atol=1e-4,
            rtol=1e-4,
        )
    assert report.graphs == 1
    assert calls["forward"] >= len(shapes) and calls["backward"] >= len(shapes)
