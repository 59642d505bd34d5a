"""The native segment kernels: building and caching the library, falling back without a
compiler, special values, layouts and bad offsets. Agreement with the torch paths under every
autograd transform is tested with the other kernel paths (``tests/paths.py``)."""

import math
import os

import pytest
import torch

import ragged
from ragged.kernels import _native, _native_build

needs_native = pytest.mark.skipif(
    _native.library() is None, reason="no C compiler here: the native kernels cannot be built"
)


def _fresh(monkeypatch, tmp_path, **env):
    monkeypatch.setitem(_native_build._state, "lib", None)
    monkeypatch.delitem(_native_build._state, "lib")
    monkeypatch.setenv("RAGGED_CACHE_DIR", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)


@needs_native
def test_builds_once_into_the_cache(monkeypatch, tmp_path):
    _fresh(monkeypatch, tmp_path)
    assert _native.library() is not None
    (built,) = tmp_path.iterdir()
    stamp = built.stat().st_mtime_ns
    monkeypatch.delitem(_native_build._state, "lib")
    assert _native.library() is not None  # loaded from the cache, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [built.name]
    assert built.stat().st_mtime_ns == stamp


def test_no_compiler_falls_back(monkeypatch, tmp_path):
    _fresh(monkeypatch, tmp_path, CC="/nonexistent/cc", PATH="")
    assert _native.library() is None
    assert not _native.usable(torch.zeros(3, 2))
    x = ragged.from_lengths(torch.arange(6.0).reshape(3, 2), [2, 1])
    assert ragged.sum(x, axis=1).tolist() == [[2.0, 4.0], [4.0, 5.0]]


def test_disabled_by_the_environment(monkeypatch, tmp_path):
    _fresh(monkeypatch, tmp_path, RAGGED_NATIVE="0")
    assert _native.library() is None
    assert not os.listdir(tmp_path)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_values(dtype):
    inf, nan = math.inf, math.nan
    values = torch.tensor(
        [[1.0, -inf], [nan, -inf], [2.0, 3.0], [inf, 0.0], [-inf, -inf], [5.0, -inf]], dtype=dtype
    )
    offsets = torch.tensor([0, 2, 2, 4, 6])
    parts = [values[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]
    close = lambda a, b: torch.testing.assert_close(a, b, equal_nan=True)
    close(_native.segment_sum(values, offsets), torch.stack([p.sum(0) for p in parts]))
    best = torch.stack(
        [p.amax(0) if len(p) else torch.full((2,), -9.0, dtype=dtype) for p in parts]
    )
    close(_native.segment_extreme(values, offsets, -9.0, True), best)
    lse = torch.stack([p.logsumexp(0) for p in parts])
    close(_native.segment_logsumexp(values, offsets), lse)
    # softmax: the finite maximum shifts; a segment of -inf only (or with +inf) gives NaN.
    shift = torch.where(torch.isfinite(best), best, 0.0)
    expected = []
    for b, p in enumerate(parts):
        e = (p - shift[b]).exp()
        expected.append(e / e.sum(0))
    close(_native.segment_softmax(values, offsets, False), torch.cat(expected))
    for op, fn in (("max", torch.cummax), ("min", torch.cummin)):
        close(
            _native.segment_scan(values, offsets, op, False, False),
            torch.cat([fn(p, 0).values for p in parts if len(p)]),
        )
    close(
        _native.segment_scan(values, offsets, "logsumexp", False, False),
        torch.cat([torch.logcumsumexp(p, 0) for p in parts if len(p)]),
    )


@needs_native
def test_strided_and_broadcast_layouts():
    base = torch.randn(20, 3, 4, dtype=torch.float64)
    offsets = torch.tensor([0, 3, 3, 10])
    for values in (base[::2], base.transpose(1, 2)[:10], base[:10, :, :1].expand(10, 3, 5)):
        parts = values.split([3, 0, 7])
        got = _native.segment_sum(values, offsets)
        torch.testing.assert_close(got, torch.stack([p.sum(0) for p in parts]))
        out = _native.segment_softmax(values, offsets, True)
        torch.testing.assert_close(out, torch.cat([p.log_softmax(0) for p in parts]))
    grad = torch.ones(1, 1, 1, dtype=torch.float64).expand(3, 3, 4)  # stride 0 everywhere
    values = base[:10]
    best = _native.segment_extreme(values, offsets, 0.0, True)
    got = _native.segment_extreme_backward(values, offsets, best, grad)
    leaf = values.clone().requires_grad_()
    torch.stack([p.amax(0) for p in leaf.split([3, 7])]).sum().backward()
    torch.testing.assert_close(got, leaf.grad)


@needs_native
def test_zero_segments_and_empty_inner():
    none = torch.zeros(1, dtype=torch.int64)
    assert _native.segment_sum(torch.zeros(0, 2), none).shape == (0, 2)
    assert _native.segment_scan(torch.zeros(0, 2), none, "sum", False, False).shape == (0, 2)
    offsets = torch.tensor([0, 2, 3])
    assert _native.segment_sum(torch.zeros(3, 0), offsets).shape == (2, 0)
    assert _native.segment_softmax(torch.zeros(3, 2, 0), offsets, False).shape == (3, 2, 0)


@needs_native
@pytest.mark.parametrize("offsets", [[0, 3, 2, 5], [0, 2, 7], [-1, 2, 5]])
def test_bad_offsets_raise(offsets):
    # A partition built with validate=False can disagree with its values: never read past them.
    with pytest.raises(ValueError, match="offsets are not non-decreasing within the rows"):
        _native.segment_sum(torch.zeros(5, 2), torch.tensor(offsets))


@needs_native
def test_threads_split_segments_with_identical_results(monkeypatch):
    # With torch.get_num_threads() > 1 the segments are split into ranges run on threads (the
    # kernels release the GIL); every segment is still reduced by one thread, in row order.
    monkeypatch.setattr(_native, "_PARALLEL_MIN_NUMEL", 0)
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 0, 17, 1, 40, 3, 0, 9]
    values = torch.randn(sum(lengths), 3, generator=gen)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    grad = torch.randn(values.shape, generator=gen)

    def run():
        running = _native.segment_scan(values, offsets, "max", True, False)
        return [
            _native.segment_sum(values, offsets),
            _native.segment_softmax(values, offsets, True),
            _native.segment_scan(values, offsets, "logsumexp", False, True),
            _native.segment_scan_backward(values, offsets, running, grad, "max", True, False),
        ]

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(3)
        assert len(_native._ranges(offsets, values.numel())) > 1
        for a, b in zip(run(), one, strict=True):
            assert torch.equal(a, b)
    finally:
        torch.set_num_threads(before)
