"""Arrays with two ragged axes: nested (documents -> sentences -> tokens) and product (pair
maps), against per-segment references."""

from __future__ import annotations

import re

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged

REDUCTIONS = {
    "sum": (ragged.sum, lambda t, d: t.sum(d), 0.0),
    "mean": (ragged.mean, lambda t, d: t.mean(d), float("nan")),
    "amax": (ragged.amax, lambda t, d: t.amax(d), float("-inf")),
    "logsumexp": (ragged.logsumexp, lambda t, d: t.logsumexp(d), float("-inf")),
}


@st.composite
def nested(draw, inner=(2,)):
    """A (B, S*, T*, *inner) array and its segments as lists of row tensors."""
    rows = draw(st.lists(st.lists(st.integers(0, 4), max_size=4), max_size=4))
    seed = draw(st.integers(0, 2**16))
    counts = [len(r) for r in rows]
    flat = [n for r in rows for n in r]
    values = torch.randn(
        sum(flat), *inner, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    x = ragged.from_nested_lengths(values, [counts, flat])
    return x, rows


@st.composite
def pair_maps(draw, inner=(2,), square=True):
    """A (B, N*, M*, *inner) pair map and its dense per-segment blocks."""
    n = draw(st.lists(st.integers(0, 4), max_size=4))
    m = n if square else draw(st.lists(st.integers(0, 4), min_size=len(n), max_size=len(n)))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    x = ragged.from_lengths(torch.randn(sum(n), *inner, generator=gen, dtype=torch.float64), n)
    y_values = torch.randn(sum(m), *inner, generator=gen, dtype=torch.float64)
    y = x.with_values(y_values) if square else ragged.from_lengths(y_values, m)
    z = ragged.outer(x, y, torch.mul)
    blocks = [a[:, None] * b[None, :] for a, b in zip(x.unbind(), y.unbind(), strict=True)]
    return z, blocks


def left_aligned(rows: list[torch.Tensor], fn, empty) -> torch.Tensor:
    """Reduce over sentences, tokens aligned left (the reference for axis 1 of nested)."""
    width = max((r.shape[0] for r in rows), default=0)
    out = []
    for t in range(width):
        column = torch.stack([r[t] for r in rows if r.shape[0] > t])
        out.append(fn(column, 0))
    return (
        torch.stack(out)
        if out
        else torch.zeros(0, *rows[0].shape[1:], dtype=torch.float64)
        if rows
        else None
    )


@pytest.mark.parametrize("name", list(REDUCTIONS))
@given(data=nested())
def test_nested_reductions(name, data):
    x, _ = data
    op, fn, empty = REDUCTIONS[name]
    segments = [
        list(torch.split(s.values, s.lengths.tolist()))
        if s.values.shape[0] or s.num_segments
        else []
        for s in x.unbind()
    ]
    inner = op(x, axis=2)  # per sentence
    assert inner.partition.levels[0] is x.partition.levels[0]
    for got, rows in zip(inner.unbind(), segments, strict=True):
        for g, r in zip(got, rows, strict=True):
            torch.testing.assert_close(
                g, fn(r, 0) if r.shape[0] else torch.full_like(g, empty), equal_nan=True
            )
    outer = op(x, axis=1)  # over sentences, tokens aligned left
    for got, rows in zip(outer.unbind(), segments, strict=True):
        expected = left_aligned(rows, fn, empty)
        if expected is None or expected.shape[0] == 0:
            assert got.shape[0] == 0
        else:
            torch.testing.assert_close(got, expected)
    both = op(x, axis=(1, 2))
    for got, rows in zip(both, segments, strict=True):
        flat = torch.cat(rows) if rows else torch.zeros(0, 2, dtype=torch.float64)
        torch.testing.assert_close(
            got, fn(flat, 0) if flat.shape[0] else torch.full_like(got, empty), equal_nan=True
        )


@pytest.mark.parametrize("name", list(REDUCTIONS))
@given(data=pair_maps(square=False))
def test_pair_map_reductions(name, data):
    z, blocks = data
    op, fn, empty = REDUCTIONS[name]
    over_j, over_i = op(z, axis=2), op(z, axis=1)
    assert over_j.partition.levels[0] is z.partition.levels[0]
    assert over_i.partition.levels[0] is z.partition.levels[1].columns
    for got_j, got_i, block in zip(over_j.unbind(), over_i.unbind(), blocks, strict=True):
        n, m = block.shape[:2]
        want_j = fn(block, 1) if m else torch.full((n, 2), empty, dtype=torch.float64)
        want_i = fn(block, 0) if n else torch.full((m, 2), empty, dtype=torch.float64)
        torch.testing.assert_close(got_j, want_j, equal_nan=True)
        torch.testing.assert_close(got_i, want_i, equal_nan=True)


@given(data=pair_maps())
def test_pair_map_conversions_and_transpose(data):
    z, blocks = data
    assert [b.tolist() for b in blocks] == z.to_list()
    lengths = z.lengths.tolist()
    width = max(lengths, default=0)
    padded = z.to_padded()
    assert padded.shape == (len(blocks), width, width, 2)
    for b, block in enumerate(blocks):
        n = block.shape[0]
        torch.testing.assert_close(padded[b, :n, :n], block)
    back = ragged.from_padded(padded, lengths, pairs=True)
    assert back.to_list() == z.to_list()
    t = ragged.transpose(z)
    assert t.partition is z.partition  # square: the same structure
    assert t.to_list() == [b.transpose(0, 1).tolist() for b in blocks]
    assert ragged.transpose(t).to_list() == z.to_list()


@given(data=pair_maps(square=False))
def test_transpose_rectangular(data):
    z, blocks = data
    t = ragged.transpose(z)
    assert t.lengths.tolist() == [b.shape[1] for b in blocks]
    assert t.to_list() == [b.transpose(0, 1).tolist() for b in blocks]


def test_outer_broadcasting_positional_named_and_explicit():
    x = ragged.array([[[1.0], [2.0]], [], [[3.0]]])
    explicit = ragged.outer(x, x)
    positional = x[:, :, None, :] + x[:, None, :, :]
    reverse = x[:, None, :, :] + x[:, :, None, :]
    named = x.rename("b", "i", "c") + x.rename("b", "j", "c")
    assert positional.to_list() == explicit.to_list() == named.to_list() == reverse.to_list()
    assert named.axes == ("b", "i", "j", "c")
    assert (x @ x.mT).to_list() == [[[1.0, 2.0], [2.0, 4.0]], [], [[9.0]]]
    a = ragged.array([[1.0, 2.0], [3.0]], axes=("b", "i"))
    w = ragged.array([[[10.0, 20.0]], [[30.0, 40.0]]], axes=("b", "j", "c"))
    pairs = a * w  # (b, i*) x (b, j*, c) -> (b, i*, j*, c)
    assert pairs.axes == ("b", "i", "j", "c")
    assert pairs.to_list() == [[[[10.0, 20.0]], [[20.0, 40.0]]], [[[90.0, 120.0]]]]


def test_multilevel_structure_and_indexing():
    docs = ragged.array([[[1, 2], [3]], [], [[4], [5, 6, 7]]])
    assert docs.ragged_ndim == 2
    assert docs.shape.to_list() == [3, [2, 0, 2], [[2, 1], [], [1, 3]]]
    assert docs[2].to_list() == [[4], [5, 6, 7]]
    assert docs[[2, 0]].to_list() == [[[4], [5, 6, 7]], [[1, 2], [3]]]
    assert docs.to_padded(-1).tolist() == [
        [[1, 2, -1], [3, -1, -1]],
        [[-1, -1, -1], [-1, -1, -1]],
        [[4, -1, -1], [5, 6, 7]],
    ]
    assert docs.to_mask().sum().item() == 7
    assert "RaggedArray([[[1, 2]," in repr(docs)
    a = ragged.array([[1, 2], [3]])
    z = ragged.outer(a, a)
    picked = z[[1, 0]]
    assert picked.partition.levels[1].columns is picked.partition.levels[0]
    assert ragged.transpose(picked).to_list() == [[[6]], [[2, 3], [3, 4]]]
    rect = ragged.outer(a, ragged.array([[10], [20, 30]]))[[1, 0]]
    assert rect.partition.levels[1].columns.lengths.tolist() == [2, 1]
    assert ragged.transpose(rect).to_list() == [[[23], [33]], [[11, 12]]]


def test_keepdims_and_argmax_on_pair_maps():
    z = ragged.outer(
        ragged.array([[1.0, 5.0], [3.0]]), ragged.array([[2.0, 1.0], [1.0]]), torch.mul
    )
    # segment 0: [[2, 1], [10, 5]]
    assert ragged.argmax(z, 1).to_list() == [[1, 1], [0]]
    assert ragged.argmax(z, 2).to_list() == [[0, 0], [0]]
    assert ragged.sum(z, 2, keepdims=True).shape.to_list() == [2, [2, 1], 1]
    kept = ragged.sum(z, 1, keepdims=True)
    assert kept.shape.to_list() == [2, [1, 1], [[2], [1]]]
    torch.testing.assert_close(
        (z - kept).to_padded()[0], torch.tensor([[-10.0, -5.0], [-2.0, -1.0]])
    )


@settings(max_examples=10)
@given(data=pair_maps(inner=(), square=False))
def test_pair_map_gradients(data):
    z, _ = data
    if z.values.numel() == 0:
        return
    for axis in (1, 2):

        def fn(v, axis=axis):
            out = ragged.logsumexp(z.with_values(v), axis=axis).values
            return torch.where(torch.isfinite(out.detach()), out, 0.0)  # empty groups: constants

        assert torch.autograd.gradcheck(
            fn, (z.values.clone().requires_grad_(),), check_forward_ad=True
        )


def test_from_nested_lengths_errors():
    v = torch.arange(4.0)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "ragged.from_nested_lengths: `nested_lengths[0]` must sum to len(nested_lengths[1]) = 3, got sum 2."
        ),
    ):
        ragged.from_nested_lengths(v, [[1, 1], [1, 2, 1]])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "ragged.from_nested_lengths: `nested_lengths[1]` must sum to values.shape[0] = 4, got sum 5."
        ),
    ):
        ragged.from_nested_lengths(v, [[2, 1], [1, 3, 1]])
    with pytest.raises(TypeError, match="must be a non-empty sequence of per-level lengths"):
        ragged.from_nested_lengths(v, [])


def test_pair_maps_compile_once():
    import ragged.testing

    def batch(n):
        x = ragged.from_lengths(torch.randn(sum(n), 3), n)
        return (x,)

    def fn(x):
        z = ragged.matmul(x, x.mT)  # Dynamo (torch 2.13) does not trace `@` on non-tensors
        return (
            ragged.logsumexp(z, axis=2).values + ragged.sum(ragged.outer(x, x), axis=(1, 2)).sum()
        )

    batches = [batch(n) for n in ([3, 1, 2], [1], [4, 0, 2, 5], [2, 2])]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(fn, batches, backend="aot_eager")
    assert report.graphs == 1


KEEP = {
    "softmax": (lambda x, a: ragged.softmax(x, a), lambda t, d: torch.softmax(t, d)),
    "log_softmax": (lambda x, a: ragged.log_softmax(x, a), lambda t, d: torch.log_softmax(t, d)),
    "cumsum": (lambda x, a: ragged.cumsum(x, a), lambda t, d: torch.cumsum(t, d)),
    "cumsum_rev_excl": (
        lambda x, a: ragged.cumsum(x, a, reverse=True, exclusive=True),
        lambda t, d: t.flip(d).cumsum(d).flip(d) - t,
    ),
    "cummax": (lambda x, a: ragged.cummax(x, a), lambda t, d: torch.cummax(t, d).values),
    "logcumsumexp": (lambda x, a: ragged.logcumsumexp(x, a), lambda t, d: torch.logcumsumexp(t, d)),
    "normalize": (
        lambda x, a: ragged.normalize(x, a),
        lambda t, d: (
            (t - t.mean(d, keepdim=True)) / torch.sqrt(t.var(d, correction=0, keepdim=True) + 1e-5)
        ),
    ),
}


@pytest.mark.parametrize("name", list(KEEP))
@given(data=pair_maps(square=False))
def test_pair_map_normalisations_and_scans(name, data):
    z, blocks = data
    op, fn = KEEP[name]
    for axis, dim in ((1, 0), (2, 1)):
        out = op(z, axis)
        assert out.partition is z.partition
        for got, block in zip(out.to_padded().unbind(), blocks, strict=True):
            n, m = block.shape[:2]
            if n and m:
                torch.testing.assert_close(got[:n, :m], fn(block, dim))


@pytest.mark.parametrize("name", ["softmax", "cumsum", "cummax"])
@given(data=nested())
def test_nested_outer_axis_normalisations_and_scans(name, data):
    x, _ = data
    op, fn = KEEP[name]
    out = op(x, 1)  # over sentences, tokens aligned left
    assert out.partition is x.partition
    for got, segment in zip(out.unbind(), x.unbind(), strict=True):
        rows = list(torch.split(segment.values, segment.lengths.tolist()))
        got_rows = list(torch.split(got.values, got.lengths.tolist()))
        width = max((r.shape[0] for r in rows), default=0)
        for t in range(width):
            members = [k for k, r in enumerate(rows) if r.shape[0] > t]
            expected = fn(torch.stack([rows[k][t] for k in members]), 0)
            torch.testing.assert_close(torch.stack([got_rows[k][t] for k in members]), expected)


def test_pair_map_softmax_gradients_and_compile():
    import ragged.testing

    x = ragged.from_lengths(torch.randn(6, 2, dtype=torch.float64), [3, 0, 2, 1])
    z = ragged.outer(x, x, torch.mul)
    for axis in (1, 2):
        fn = lambda v, axis=axis: ragged.softmax(z.with_values(v), axis).values
        assert torch.autograd.gradcheck(
            fn, (z.values.clone().requires_grad_(),), check_forward_ad=True
        )

    def pipeline(x):
        z = ragged.outer(x, x, torch.mul)
        return ragged.sum(ragged.softmax(z, 1) * ragged.cumsum(z, 2), axis=2).values

    batches = [
        (ragged.from_lengths(torch.randn(sum(n), 3), n),) for n in ([3, 1, 2], [1], [4, 0, 2, 5])
    ]
    with ragged.dynamic_shapes():
        assert ragged.testing.check_compile(pipeline, batches, backend="aot_eager").graphs == 1


# --- every ragged axis: structure-level checks (the op table checks the values) -----------------


def test_vmap_gives_each_segment_as_a_ragged_array() -> None:
    x = ragged.from_nested_lengths(torch.randn(7, 3, dtype=torch.float64), [[2, 0, 1], [3, 1, 3]])
    seen = []

    def f(segment):
        seen.append(segment.ragged_ndim)
        return ragged.softmax(segment, axis=1)

    y = ragged.vmap(f)(x)
    assert set(seen) == {1} and y.partition is x.partition
    torch.testing.assert_close(y.values, ragged.softmax(x, axis=2).values)
    # a dense output per segment, a ragged one over axis 1 (leading size S_b), a new structure
    total = ragged.vmap(lambda s: s.values.sum(0))(x)
    torch.testing.assert_close(total, ragged.sum(x, axis=(1, 2)))
    per_sentence = ragged.vmap(lambda s: ragged.sum(s, axis=1))(x)
    assert per_sentence.partition.levels[0] is x.partition.levels[0]
    torch.testing.assert_close(per_sentence.values, ragged.sum(x, axis=2).values)
    cut = ragged.vmap(lambda s: ragged.truncate(s, 1), method="loop")(x)
    assert cut.to_list() == ragged.truncate(x, 1, axis=2).to_list()
    filled = ragged.vmap(lambda s: s.values.sum(0), fill_empty=-1.0)(x)
    assert filled[1].tolist() == [-1.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="axis_name"):
        ragged.vmap(lambda s: s.values.sum(), axis_name="i")(x)


def test_export_takes_every_level_as_a_dynamic_input() -> None:
    x = ragged.from_nested_lengths(torch.randn(7, 3), [[2, 0, 1], [3, 1, 3]])
    program = ragged.export(lambda a: ragged.softmax(a * 2, axis=1), (x,))
    y = ragged.from_nested_lengths(torch.randn(9, 3), [[1, 3], [2, 0, 7, 0]])
    out = program(y)
    assert out.shape.to_list() == y.shape.to_list()
    torch.testing.assert_close(out.values, ragged.softmax(y * 2, axis=1).values)


def test_keepdims_results_broadcast_back() -> None:
    x = ragged.from_nested_lengths(torch.randn(7, 2, dtype=torch.float64), [[2, 0, 1], [3, 1, 3]])
    inner = ragged.sum(x, axis=2, keepdims=True)
    outer = ragged.sum(x, axis=1, keepdims=True)
    assert inner.shape.to_list() == [3, [2, 0, 1], 1, 2]
    assert outer.shape.to_list() == [3, [1, 1, 1], [[3], [0], [3]], 2]
    centred = x - ragged.mean(x, axis=2, keepdims=True)
    torch.testing.assert_close(
        ragged.sum(centred, axis=2).values, torch.zeros(3, 2, dtype=torch.float64)
    )
    assert (x - outer).partition is x.partition


def test_flatten_and_unflatten_are_inverse_and_copy_nothing() -> None:
    x = ragged.array([[[1, 2], [3]], [], [[4], [5, 6], []]])
    flat = ragged.flatten(x, axis=1)
    assert flat.values is x.values and flat.to_list() == [[1, 2, 3], [], [4, 5, 6]]
    counts = ragged.local_index(x, axis=2)  # (B, S*, T*) positions; the sizes are the lengths
    assert counts.to_list() == [[[0, 1], [0]], [], [[0], [0, 1], []]]
    back = ragged.unflatten(flat, ragged.array([[2, 1], [], [1, 2, 0]]), axis=1)
    assert back.to_list() == x.to_list() and back.values is x.values
    named = x.rename("doc", "sent", "tok")
    assert ragged.flatten(named).axes == ("doc", "tok")
    sizes = ragged.array([[2, 1], [], [1, 2, 0]])
    assert ragged.unflatten(ragged.flatten(named), sizes, name="s").axes == ("doc", "s", "tok")


def test_pairs_from_a_partition_that_knows_its_squares_read_nothing() -> None:
    x = ragged.array([[1.0, 2.0, 3.0], [], [4.0, 5.0]])
    level = x.partition.levels[0]
    assert level.sum_squares is not None and level.max_length is not None
    a, b = ragged.combinations(x, 2)
    assert a.partition is b.partition and a.partition.levels[0].max_length == 3
    assert (a.to_list(), b.to_list()) == (
        [[1.0, 1.0, 2.0], [], [4.0]],
        [[2.0, 3.0, 3.0], [], [5.0]],
    )


def test_attention_variants_run_within_every_sentence() -> None:
    # (B, S*, T*, H, Dh) with grouped-query heads, a window, ALiBi, document ids and a prefix per
    # sentence: each sentence as a one-level segment of its own, with the same options.
    gen = torch.Generator().manual_seed(0)
    flat = [3, 0, 2, 4]  # tokens per sentence; documents of 3, 0 and 1 sentences
    q = ragged.from_nested_lengths(torch.randn(sum(flat), 4, 3, generator=gen), [[3, 0, 1], flat])
    kv = q.with_values(torch.randn(sum(flat), 2, 3, generator=gen))
    docs = q.with_values(torch.tensor([0, 0, 1, 0, 0, 0, 1, 1, 1]))
    alibi = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    prefix = torch.tensor([1, 0, 1, 2])  # one entry per sentence
    options = dict(causal=True, window=(1, 0), alibi=alibi, document_ids=docs, prefix=prefix)
    out = ragged.attention(q, kv, kv, **options)
    assert out.partition is q.partition
    rows = ragged.from_lengths(q.values, flat)
    want = ragged.attention(
        rows,
        rows.with_values(kv.values),
        rows.with_values(kv.values),
        **{**options, "document_ids": rows.with_values(docs.values)},
    )
    torch.testing.assert_close(out.values, want.values)
