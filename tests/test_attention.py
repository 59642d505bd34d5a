"""Behaviour of ``ragged.attention`` beyond the op table: long segments (the flash backward),
buckets, the pair bias, empty key sets, transforms and compilation."""

from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import example, given, settings

import ragged
import ragged.testing
from ragged.kernels import _attention_blocks as blocks
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


# --- variants: grouped-query heads, windows, positions, masks, score_mod --------------------


def _variant_call(lengths, seed, kind, kv_heads=2):
    """Arrays, keyword arguments and per-segment reference keywords of one variant kind."""
    gen = torch.Generator().manual_seed(seed)
    q = arrays(lengths, (4, 3), seed, grad=True)
    k = ragged.RaggedArray(arrays(lengths, (kv_heads, 3), seed + 1, grad=True).values, q.partition)
    v = ragged.RaggedArray(arrays(lengths, (kv_heads, 3), seed + 2, grad=True).values, q.partition)
    table = torch.randn(9, 4, generator=gen, dtype=torch.float64).requires_grad_()
    slopes = torch.rand(4, generator=gen, dtype=torch.float64).requires_grad_()
    runs = torch.randint(0, 2, (q.values.shape[0],), generator=gen).cumsum(0) % 3
    documents = ragged.RaggedArray(runs, q.partition)
    prefix = torch.randint(0, 6, (len(lengths),), generator=gen)
    gain = torch.rand(4, generator=gen, dtype=torch.float64).add(0.5).requires_grad_()
    kinds = {
        "gqa": {},
        "gqa_causal": {"causal": True},
        "window": {"window": (3, 1)},
        "window_causal": {"window": (4, None), "causal": True},
        "alibi": {"alibi": slopes},
        "alibi_causal_window": {"alibi": slopes, "causal": True, "window": (5, 0)},
        "table": {"relative_bias": table},
        "callable": {"relative_bias": lambda d: table[(d // 2).clamp(-4, 4) + 4] * 0.5},
        "documents": {"document_ids": documents},
        "prefix": {"prefix": prefix, "causal": True},
        "mask_mod": {"mask_mod": lambda b, h, i, j: ((i - j) % 3 != 1) | (b % 2 == 1)},
        "score_mod": {"score_mod": lambda s, b, h, i, j: 3 * torch.tanh(s * gain[h] / 3)},
    }
    kwargs = kinds[kind]
    leaves = [q.values, k.values, v.values] + [
        t
        for t in (table, slopes, gain)
        if kind in ("table", "callable", "score_mod") or (t is slopes and "alibi" in kind)
    ]
    return q, k, v, kwargs, leaves


def _variant_reference(q, k, v, kwargs):
    parts = []
    for b, (a, c, d) in enumerate(zip(q.unbind(), k.unbind(), v.unbind(), strict=True)):
        ref = dict(kwargs)
        if "document_ids" in ref:
            ref["documents"] = ref.pop("document_ids").unbind()[b]
        if "prefix" in ref:
            ref["prefix"] = ref["prefix"][b]
        parts.append(attention_reference(a, c, d, segment=torch.tensor(b), **ref))
    if not parts:
        return q.values.new_zeros((0, *q.values.shape[1:]))
    return torch.cat(parts)


VARIANTS = [
    "gqa",
    "gqa_causal",
    "window",
    "window_causal",
    "alibi",
    "alibi_causal_window",
    "table",
    "callable",
    "documents",
    "prefix",
    "mask_mod",
    "score_mod",
]


@settings(max_examples=80, deadline=None)
@given(
    lengths=lengths_strategy(max_segments=6, max_length=24),
    seed=st.integers(0, 2**31 - 1),
    kind=st.sampled_from(VARIANTS),
    cost=st.sampled_from([0, 10**9]),
    kv_heads=st.sampled_from([1, 2, 4]),
    band_rows=st.sampled_from([3, 64]),
)
# A prefix past a segment's end, in a padded bucket: the padding keys were prefix keys.
@example(lengths=[1, 2], seed=1, kind="prefix", cost=10**9, kv_heads=1, band_rows=3)
def test_variants_match_per_segment_sdpa_with_gradients(
    lengths, seed, kind, cost, kv_heads, band_rows
):
    """Every variant against per-segment SDPA with the equivalent dense mask: values and the
    gradients of q, k, v and of the tables, slopes and parameters they close over; long
    segments (the flash backward), equal-length and padded buckets, 1, 2 or 4 key/value heads,
    windows cut into bands of 3 rows or not."""
    with (
        mock.patch.object(planner, "CALL_COST", cost),
        mock.patch.object(blocks, "BAND_ROWS", band_rows),
        mock.patch.object(blocks, "BAND_GAIN", 10.0 if band_rows == 3 else blocks.BAND_GAIN),
    ):
        q, k, v, kwargs, leaves = _variant_call(lengths, seed, kind, kv_heads)
        out = ragged.attention(q, k, v, **kwargs)
        expected = _variant_reference(q, k, v, kwargs)
        torch.testing.assert_close(out.values, expected)
        if not out.values.numel():
            return
        cotangent = torch.randn(out.values.shape, dtype=torch.float64)
        got = torch.autograd.grad(out.values, leaves, cotangent, allow_unused=True)
        want = torch.autograd.grad(expected, leaves, cotangent, allow_unused=True)
        for a, b in zip(got, want, strict=True):
            if b is None:
                assert a is None or not a.any()
            else:
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize("path", ["buckets", "tiles"])
def test_gradcheck_of_tables_slopes_and_score_mod_parameters(monkeypatch, path):
    """First and second derivatives and forward-mode tangents of the parameters of the
    positional biases (the eager kernel's linear rules, or the composite path)."""
    if path == "tiles":
        monkeypatch.setattr(ragged.ops._attention, "BUCKET_DEVICES", ())
    x = arrays([3, 0, 2], (2, 2), 0)
    kv = ragged.RaggedArray(arrays([3, 0, 2], (1, 2), 1).values, x.partition)
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(5, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(2, generator=gen, dtype=torch.float64, requires_grad=True)

    def f(table, slopes):
        return ragged.attention(
            x, kv, kv, causal=True, window=(1, 0), relative_bias=table, alibi=slopes
        ).values

    assert torch.autograd.gradcheck(f, (table, slopes), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, (table, slopes))
    gain = torch.rand(2, generator=gen, dtype=torch.float64, requires_grad=True)

    def g(gain):
        return ragged.attention(x, kv, kv, score_mod=lambda s, b, h, i, j: s * gain[h]).values

    assert torch.autograd.gradcheck(g, (gain,), check_forward_ad=True)


def test_vmap_over_tables_and_slopes_and_jacfwd_equals_jacrev():
    x = arrays([3, 0, 4], (2, 2), 0)
    kv = ragged.RaggedArray(arrays([3, 0, 4], (1, 2), 1).values, x.partition)

    def f(table, slopes):
        return ragged.attention(x, kv, kv, relative_bias=table, alibi=slopes, window=(2, 1)).values

    gen = torch.Generator().manual_seed(0)
    tables = torch.randn(3, 5, 2, generator=gen, dtype=torch.float64)
    slopes = torch.rand(3, 2, generator=gen, dtype=torch.float64)
    batched = torch.func.vmap(f)(tables, slopes)
    torch.testing.assert_close(
        batched, torch.stack([f(t, s) for t, s in zip(tables, slopes, strict=True)])
    )
    half = torch.func.vmap(f, in_dims=(0, None))(tables, slopes[0])
    torch.testing.assert_close(half[2], f(tables[2], slopes[0]))
    jf = torch.func.jacfwd(f, argnums=(0, 1))(tables[0], slopes[0])
    jr = torch.func.jacrev(f, argnums=(0, 1))(tables[0], slopes[0])
    for a, b in zip(jf, jr, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("path", ["buckets", "tiles"])
def test_fully_masked_rows_by_mask_mod_give_zero_and_finite_gradients(monkeypatch, path):
    if path == "tiles":
        monkeypatch.setattr(ragged.ops._attention, "BUCKET_DEVICES", ())
    x = arrays([4, 2], (1, 4), 0, grad=True)
    out = ragged.attention(x, x, x, mask_mod=lambda b, h, i, j: (i != 1) & (j >= 0))
    assert out.values[1].eq(0).all() and out.values[[0, 2, 3]].ne(0).all()
    assert out.values[5].eq(0).all() and out.values[4].ne(0).all()  # row 1 of segment 1 too
    (grad,) = torch.autograd.grad(out.values.sum(), x.values)
    assert torch.isfinite(grad).all()


def test_variant_cross_attention_rules():
    """Positional variants need self-attention (equal partitions are accepted); score_mod and
    mask_mod work in cross-attention, with positions in each axis."""
    q = arrays([2, 3], (2, 4), 0)
    same = arrays([2, 3], (2, 4), 1)  # an equal partition, another object
    out = ragged.attention(q, same, same, window=(1, 0))
    ref = ragged.attention(
        q, ragged.RaggedArray(same.values, q.partition), q.with_values(same.values), window=(1, 0)
    )
    torch.testing.assert_close(out.values, ref.values)
    keys = arrays([4, 1], (1, 4), 2)
    mod = lambda b, h, i, j: j <= i + b
    got = ragged.attention(q, keys, keys, mask_mod=mod)
    want = torch.cat(
        [
            attention_reference(a, c, c, mask_mod=mod, segment=torch.tensor(b))
            for b, (a, c) in enumerate(zip(q.unbind(), keys.unbind(), strict=True))
        ]
    )
    torch.testing.assert_close(got.values, want)


def test_compiled_variants_one_graph_with_gradients_of_tables(compiled_path):
    """GQA, causal window, ALiBi, a callable relative bias and document ids under
    torch.compile: one graph across batches, forward and gradients (the callable's table and
    the slopes included) as in eager."""
    shapes = [[3, 0, 5, 2], [1], [4, 4], [0, 2, 7, 1, 3, 6], [9]]
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(7, 4, generator=gen, requires_grad=True)
    slopes = torch.rand(4, generator=gen, requires_grad=True)
    batches = []
    for i, n in enumerate(shapes):
        q = arrays(n, (4, 8), i, dtype=torch.float32, grad=True)
        kv = ragged.RaggedArray(arrays(n, (2, 8), i + 9, dtype=torch.float32).values, q.partition)
        ids = ragged.RaggedArray(torch.arange(sum(n)) // 3, q.partition)
        batches.append((q, kv, ids, table, slopes))

    def f(q, kv, ids, table, slopes):
        return ragged.attention(
            q,
            kv,
            kv,
            causal=True,
            window=(2, 0),
            relative_bias=lambda d: table[d.clamp(-3, 3) + 3],  # tabulated on every distance
            alibi=slopes,
            document_ids=ids,
        )

    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            f, batches, backend="aot_eager", grad=True, atol=1e-4, rtol=1e-4
        )
    assert report.graphs == 1


def test_varlen_choice_for_variants():
    from ragged.kernels._attention_varlen import FLASH, Call, choose

    base = Call("cuda", torch.float16, 64, 64, empty=False, max_q=40, max_k=40)
    import dataclasses

    assert choose(dataclasses.replace(base, window=True), True, True).kernel == FLASH
    choice = choose(dataclasses.replace(base, window=True), False, True)
    assert choice.kernel is None and "only the flash kernel" in choice.reason
    choice = choose(dataclasses.replace(base, variants="ALiBi slopes"), True, True)
    assert choice.kernel is None and choice.reason.startswith("ALiBi slopes")


@pytest.mark.parametrize("kind", ["window", "window_causal", "alibi_causal_window"])
def test_windows_are_banded_on_long_segments_exactly(kind):
    """Long segments with a narrow window run band by band (fewer scores): the same values and
    gradients as per-segment SDPA with the window as a mask."""
    lengths = [300, 0, 129, 65, 2]
    q, k, v, kwargs, leaves = _variant_call(lengths, 0, kind)
    plan = planner.plan(q.partition.levels[0], q.partition.levels[0], 12)
    variant = ragged.ops._attention_variants.parse(
        ragged.attention,
        q,
        True,
        kwargs.get("causal", False),
        kwargs["window"],
        None,
        None,
        None,
        None,
        None,
        None,
    ).variant
    cut = [blocks.bands(b, variant, blocks.Extras()) for b in plan.buckets]
    assert cut[0] is not None and len(cut[0]) == 5  # 300 rows in bands of 64
    out = ragged.attention(q, k, v, **kwargs)
    expected = _variant_reference(q, k, v, kwargs)
    torch.testing.assert_close(out.values, expected)
    cotangent = torch.randn(out.values.shape, dtype=torch.float64)
    got = torch.autograd.grad(out.values, leaves, cotangent)
    want = torch.autograd.grad(expected, leaves, cotangent)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
