"""The segment kernels: fast (eager, autograd.Function) and composite paths agree, and both
pass every autograd check (gradcheck, gradgradcheck, forward AD, vmap)."""

import pytest
import torch
from hypothesis import given

from ragged.kernels import _native, _segment, _segment_softmax, _segment_stats
from ragged.kernels._segment import Segments
from tests.paths import PATHS, use_path
from tests.strategies import ragged_arrays


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    monkeypatch.setattr(_segment, "_CHUNK_BYTES", 16)  # several chunks even for tiny inputs
    return use_path(request.param, monkeypatch)


def segments_of(x):
    level = x.partition.levels[0]
    return Segments(level.row_ids, level.num_rows, level.lengths, level.offsets)


def reference(x, fn, fill):
    outs = [
        fn(s) if s.shape[0] else torch.full(s.shape[1:], fill, dtype=s.dtype) for s in x.unbind()
    ]
    return torch.stack(outs) if outs else x.values.new_zeros((0, *x.values.shape[1:]))


def kernels():
    return {
        "sum": (lambda v, s: _segment.segment_sum(v, s), lambda t: t.sum(0), 0.0),
        "mean": (lambda v, s: _segment.segment_mean(v, s), lambda t: t.mean(0), float("nan")),
        "amax": (lambda v, s: _segment.segment_amax(v, s, -7.0), lambda t: t.amax(0), -7.0),
        "amin": (lambda v, s: _segment.segment_amin(v, s, 7.0), lambda t: t.amin(0), 7.0),
        "logsumexp": (
            lambda v, s: _segment_softmax.segment_logsumexp(v, s),
            lambda t: t.logsumexp(0),
            float("-inf"),
        ),
        "var": (
            lambda v, s: _segment_stats.segment_var(v, s, 1),
            lambda t: t.var(0) if t.shape[0] > 1 else torch.full_like(t[0], float("nan")),
            float("nan"),
        ),
    }


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "logsumexp", "var"])
@given(x=ragged_arrays(inner=(2,)))
def test_reductions_match_reference(path, name, x):
    kernel, ref, fill = kernels()[name]
    expected = reference(x, ref, fill)
    torch.testing.assert_close(kernel(x.values, segments_of(x)), expected, equal_nan=True)


@pytest.mark.parametrize("log", [False, True])
@given(x=ragged_arrays(inner=(2,)))
def test_softmax_matches_reference(path, log, x):
    out = _segment_softmax.segment_softmax(x.values, segments_of(x), log=log)
    fn = torch.log_softmax if log else torch.softmax
    expected = [fn(s, 0) for s in x.unbind()]
    torch.testing.assert_close(out, torch.cat(expected) if expected else out)


CASES = [
    ("sum", lambda v, s: _segment.segment_sum(v, s)),
    ("mean", lambda v, s: _segment.segment_mean(v, s)),
    ("amax", lambda v, s: _segment.segment_amax(v, s, 0.0)),
    ("softmax", lambda v, s: _segment_softmax.segment_softmax(v, s)),
    ("log_softmax", lambda v, s: _segment_softmax.segment_softmax(v, s, log=True)),
    ("logsumexp", lambda v, s: _segment_softmax.segment_logsumexp(v, s)),
    ("var", lambda v, s: _segment_stats.segment_var(v, s, 1)),
    ("var_correction0", lambda v, s: _segment_stats.segment_var(v, s, 0)),
]


@pytest.mark.parametrize(("name", "kernel"), CASES, ids=[c[0] for c in CASES])
def test_autograd_checks(path, name, kernel):
    torch.manual_seed(0)
    values = torch.randn(9, 2, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([0, 0, 0, 2, 2, 3, 3, 3, 3])
    s = Segments(ids, 5, torch.tensor([3, 0, 2, 4, 0]), torch.tensor([0, 3, 3, 5, 9, 9]))

    def fn(v):
        out = kernel(v, s)  # empty groups give constants (-inf for logsumexp): zero them
        return torch.where(torch.isfinite(out.detach()), out, 0.0)

    assert torch.autograd.gradcheck(fn, (values,), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(fn, (values,))
    batch = torch.randn(3, 9, 2, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(fn)(batch), torch.stack([fn(b) for b in batch]))
    hess = torch.func.hessian(lambda v: (fn(v) ** 2).sum())(values.detach())
    assert hess.shape == (9, 2, 9, 2) and torch.isfinite(hess).all()


def test_amax_ties_split_gradient(path):
    values = torch.tensor([1.0, 3.0, 3.0, 2.0], requires_grad=True)
    s = Segments(torch.tensor([0, 0, 0, 0]), 1, torch.tensor([4]), torch.tensor([0, 4]))
    (grad,) = torch.autograd.grad(_segment.segment_amax(values, s, 0.0).sum(), values)
    assert grad.tolist() == [0.0, 0.5, 0.5, 0.0]


@pytest.mark.parametrize(("name", "kernel"), CASES, ids=[c[0] for c in CASES])
def test_backward_of_an_expanded_gradient(path, name, kernel):
    """``out.sum().backward()`` hands the backward an expanded gradient (stride 0)."""
    values = torch.randn(9, 2, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    s = Segments(ids, 3, torch.tensor([3, 2, 4]), torch.tensor([0, 3, 5, 9]))
    out = kernel(values, s)
    ones = torch.ones_like(out)
    (want,) = torch.autograd.grad(out, values, ones, retain_graph=True)
    (got,) = torch.autograd.grad(out, values, ones[:1, :1].expand_as(out), retain_graph=True)
    torch.testing.assert_close(got, want)
    out.sum().backward()
    torch.testing.assert_close(values.grad, want)


def test_small_inputs_take_the_native_kernels_where_they_pay():
    """The dispatch below the size thresholds (measured by tools/small_inputs.py)."""
    if _native.library() is None:
        pytest.skip("no C compiler here: the native kernels cannot be built")
    for kind in _segment._NATIVE_MIN_NUMEL:  # use_fast_path's early exit relies on it
        assert _segment._DIRECT_MIN_ROWS[kind] <= _segment._NATIVE_MIN_ROWS[kind]
    fast = _segment.use_fast_path
    tiny, tiny_offsets = torch.randn(17, 8), torch.tensor([0, 3, 11, 12, 17])
    assert fast(tiny, "rows", tiny_offsets)  # softmax, log-softmax, logsumexp: every size
    assert fast(tiny, "scan")  # a scan, with a gradient too
    assert fast(tiny.requires_grad_(), "scan")
    assert not fast(tiny, "rows", tiny_offsets)  # with a gradient: from 2^12 elements
    assert not fast(tiny.detach(), "rows")  # groups that are not contiguous runs
    assert not fast(tiny.detach(), "reduce", tiny_offsets)  # few rows: the composite sum wins
    assert not fast(tiny.detach().to(torch.int64), "scan")  # no native kernel for integers
    rows = torch.randn(1024, 8)
    assert fast(rows, "reduce", torch.arange(0, 1025, 8))  # from 1024 rows, called directly
    assert not fast(rows.requires_grad_(), "reduce", torch.arange(0, 1025, 8))
    assert fast(torch.randn(4096, 2, requires_grad=True), "reduce", torch.arange(0, 4097, 8))
    seen = []
    torch.func.vmap(lambda v: seen.append(fast(v, "scan")) or v)(torch.randn(2, 17, 8))
    assert seen == [False]  # a functorch wrapper: the composite
