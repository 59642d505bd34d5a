"""Scans beyond the op table: exactness per segment, both block-prefix methods and several block
sizes, the in-place fast paths under every autograd transform, ties, long segments, compile."""

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
import ragged.testing
from ragged.kernels import _monoids, _scan
from tests.paths import PATHS, use_path
from tests.strategies import ragged_arrays

INF = math.inf
SCANS = {
    "cumsum": (_monoids.SUM, torch.cumsum, 0.0),
    "cumprod": (_monoids.PROD, torch.cumprod, 1.0),
    "cummax": (_monoids.MAX, lambda t, d: torch.cummax(t, d).values, -INF),
    "cummin": (_monoids.MIN, lambda t, d: torch.cummin(t, d).values, INF),
    "logcumsumexp": (_monoids.LOGSUMEXP, torch.logcumsumexp, -INF),
}


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    return use_path(request.param, monkeypatch)


def reference(x, name, *, reverse=False, exclusive=False):
    """Per segment: the torch scan, flipped for reverse, shifted by one for exclusive."""
    _, fn, identity = SCANS[name]
    outs = []
    for segment in x.unbind():
        t = segment.flip(0) if reverse else segment
        out = fn(t, 0)
        if exclusive and out.shape[0]:
            out = torch.cat([torch.full_like(out[:1], identity), out[:-1]])
        outs.append(out.flip(0) if reverse else out)
    return torch.cat(outs) if outs else x.values.clone()


def test_exact_per_segment(path):
    # 1e8s then 1e-3s in float32: a global cumsum minus its value at the segment start keeps
    # nothing of the small segment (1e8 has an ulp of 8), the blocked scan keeps it all.
    big = torch.full((1000, 2), 1e8)
    small = torch.full((1000, 2), 1e-3)
    x = ragged.from_lengths(torch.cat([big, small]), [1000, 1000])
    out = ragged.cumsum(x).values[1000:]
    expected = torch.cumsum(small, 0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=0)
    naive = torch.cumsum(x.values, 0)
    naive = naive[1000:] - naive[999]
    assert (naive - expected).abs().max() > 0.5  # the trick this scan avoids is really wrong
    reverse = ragged.cumsum(x, reverse=True, exclusive=True).values[1000:]
    torch.testing.assert_close(reverse, reference(x, "cumsum", reverse=True, exclusive=True)[1000:])


@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("method", ["padded", "doubling"])
@pytest.mark.parametrize("block", [1, 2, 8])
@settings(max_examples=15)
@given(
    x=ragged_arrays(inner=(2,), max_length=20),
    reverse=st.booleans(),
    exclusive=st.booleans(),
)
def test_every_layout_matches_reference(name, method, block, x, reverse, exclusive):
    m = SCANS[name][0]
    level = x.partition.levels[0]
    lay = _scan.layout(level, x.partition.max_length(), reverse=reverse, block=block, method=method)
    expected = reference(x, name, reverse=reverse, exclusive=exclusive)
    out = _scan.segmented_scan(m, x.values, lay, exclusive=exclusive)
    torch.testing.assert_close(out, expected)
    if name != "logcumsumexp":  # the in-place kernel runs for cumsum, cummax, cummin
        torch.testing.assert_close(
            _scan.scan_in_place(m, x.values, lay, exclusive=exclusive), expected
        )


@pytest.mark.parametrize("name", list(SCANS))
@given(x=ragged_arrays(inner=(3,), max_length=12), reverse=st.booleans(), exclusive=st.booleans())
def test_public_ops_match_reference(path, name, x, reverse, exclusive):
    out = getattr(ragged, name)(x, reverse=reverse, exclusive=exclusive)
    assert out.partition is x.partition
    torch.testing.assert_close(out.values, reference(x, name, reverse=reverse, exclusive=exclusive))


AUTOGRAD_CASES = [
    (name, reverse, exclusive)
    for name in ("cumsum", "cummax", "cummin", "cumprod", "logcumsumexp")
    for reverse, exclusive in ((False, False), (True, True))
]


@pytest.mark.parametrize(("name", "reverse", "exclusive"), AUTOGRAD_CASES)
def test_autograd_checks(path, name, reverse, exclusive):
    torch.manual_seed(0)
    lengths = [3, 0, 9, 1, 5]
    values = torch.randn(sum(lengths), 2, dtype=torch.float64, requires_grad=True)
    if name == "cumprod":
        values = values.detach().round().requires_grad_()  # zeros occur
    partition = ragged.from_lengths(values.detach(), lengths).partition
    op = getattr(ragged, name)

    def fn(v):
        out = op(ragged.RaggedArray(v, partition), reverse=reverse, exclusive=exclusive).values
        return torch.where(torch.isfinite(out.detach()), out, 0.0)

    assert torch.autograd.gradcheck(fn, (values,), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(fn, (values,))
    batch = torch.randn(3, *values.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(fn)(batch), torch.stack([fn(b) for b in batch]))
    hess = torch.func.hessian(lambda v: (fn(v) ** 2).sum())(values.detach())
    assert torch.isfinite(hess).all()
    jac = torch.func.jacfwd(fn)(values.detach())
    torch.testing.assert_close(jac, torch.func.jacrev(fn)(values.detach()))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("reverse", [False, True])
def test_extreme_gradient_goes_where_torch_points(path, largest, reverse):
    # Ties and NaN: the gradient of each output goes to the element torch.cummax names.
    values = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 0.0, 5.0, math.nan, 5.0, 4.0, 4.0])
    values = torch.stack([values, -values], 1)
    lengths = [5, 0, 2, 5]
    weights = torch.arange(1.0, 1.0 + values.numel()).reshape(values.shape)
    op = ragged.cummax if largest else ragged.cummin
    torch_op = torch.cummax if largest else torch.cummin
    leaf = values.clone().requires_grad_()
    out = op(ragged.from_lengths(leaf, lengths), reverse=reverse).values
    (torch.nan_to_num(out) * weights).sum().backward()
    expected = []
    for v, w in zip(values.split(lengths), weights.split(lengths), strict=True):
        seg = v.clone().requires_grad_()
        t = seg.flip(0) if reverse else seg
        o = torch_op(t, 0).values
        o = o.flip(0) if reverse else o
        (torch.nan_to_num(o) * w).sum().backward()
        expected.append(seg.grad)
    torch.testing.assert_close(leaf.grad, torch.cat(expected))


def test_logcumsumexp_gradients_stay_finite(path):
    # Empty segments, exclusive scans (an -inf first row) and very negative values: no NaN
    # reaches a real row's gradient, and -inf inputs give torch's values.
    values = torch.tensor([[-1000.0], [0.0], [-5.0], [3.0], [-INF], [-INF], [2.0]])
    lengths = [2, 0, 2, 3]
    leaf = values.clone().requires_grad_()
    x = ragged.from_lengths(leaf, lengths)
    out = ragged.logcumsumexp(x, exclusive=True).values
    torch.where(torch.isfinite(out), out, 0.0).sum().backward()
    assert torch.isfinite(leaf.grad[:4]).all()
    torch.testing.assert_close(
        ragged.logcumsumexp(x.detach()).values, reference(x.detach(), "logcumsumexp")
    )


@pytest.mark.parametrize("name", list(SCANS))
def test_one_long_segment_among_short_ones(path, name):
    torch.manual_seed(0)
    lengths = [1, 0, 3] * 20 + [3000] + [2] * 40
    values = torch.randn(sum(lengths), 3, dtype=torch.float64)
    if name == "cumprod":
        values = 1 + values / 1000  # products of 3000 numbers stay in range
    x = ragged.from_lengths(values, lengths)
    lay = _scan.layout(x.partition.levels[0], x.partition.max_length(), reverse=False)
    assert lay.method == "doubling"  # memory linear in N, not B * max_length / K
    assert lay.size <= 2 * values.shape[0] + 1
    out = getattr(ragged, name)(x)
    torch.testing.assert_close(out.values, reference(x, name))


def test_unknown_max_length_is_read_once():
    x = ragged.from_lengths(torch.randn(7, 2), [3, 0, 4])
    level = x.partition.levels[0]
    unknown = ragged.Partition(
        (ragged.RowPartition(level.offsets, level.lengths, level.row_ids, None),)
    )
    y = ragged.RaggedArray(x.values, unknown)
    assert ragged.cumsum(y).partition is unknown
    torch.testing.assert_close(ragged.cumsum(y).values, ragged.cumsum(x).values)


def test_names_and_partition_are_kept():
    x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]], axes=("batch", "seq", "feat"))
    for op in (ragged.cumsum, ragged.cumprod, ragged.cummax, ragged.cummin, ragged.logcumsumexp):
        for axis in ("seq", "feat"):
            out = op(x, axis)
            assert out.partition is x.partition
            assert out.axes == x.axes


def test_integer_inputs_accumulate_in_int64():
    x = ragged.array([[1, 2], [3]]).to(torch.int32)
    assert ragged.cumsum(x).dtype == torch.int64
    assert ragged.cumprod(x).to_list() == [[1, 2], [3]]
    assert ragged.cummax(x).dtype == torch.int32
    assert ragged.cummax(x, exclusive=True).to_list() == [[-(2**31), 1], [-(2**31)]]


def _batches(lengths_list, inner=7):
    g = torch.Generator().manual_seed(0)
    out = []
    for lengths in lengths_list:
        v = torch.randn(sum(lengths), inner, generator=g, dtype=torch.float64)
        out.append((ragged.from_lengths(v.requires_grad_(), lengths),))
    return out


LENGTHS = ([3, 0, 40, 7], [5, 1, 2, 9, 100], [64, 3, 17], [2, 2, 2, 2, 2, 2, 300, 0])


def test_compile_one_graph_with_gradients():
    def f(x):
        return (
            ragged.cumsum(x, exclusive=True).values.sum()
            + ragged.cummax(x, reverse=True).values.sum()
            + ragged.cummin(x, exclusive=True).values.clamp(-9, 9).sum()
            + ragged.logcumsumexp(x).values.sum()
        )

    report = ragged.testing.check_compile(f, _batches(LENGTHS), backend="aot_eager", grad=True)
    assert report.graphs == 1


def test_compile_cumprod():
    # Inference: one graph. Training: torch.cumprod's backward reads the size of the scanned
    # dim, so the block prefixes use doubling there: one graph per power of two of the width.
    def f(x):
        return ragged.cumprod(x, reverse=True).values.sum()

    batches = [(x.detach(),) for (x,) in _batches(LENGTHS)]
    assert ragged.testing.check_compile(f, batches, backend="aot_eager").graphs == 1
    report = ragged.testing.check_compile(
        f, _batches(LENGTHS), backend="aot_eager", grad=True, max_graphs=4
    )
    assert report.graphs > 1
