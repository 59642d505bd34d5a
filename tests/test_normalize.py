"""Normalisations beyond the op table: one-row and empty segments, gradients that stay finite,
the partition object kept, and the fast segment kernels."""

import pytest
import torch

import ragged
from tests.paths import PATHS, use_path


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    return use_path(request.param, monkeypatch)


def test_normalize_one_row_and_empty_segments(path):
    values = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, -1.0], [7.0, 7.0], [8.0, 9.0]])
    leaf = values.clone().requires_grad_()
    x = ragged.from_lengths(leaf, [2, 0, 1, 2])
    out = ragged.normalize(x)
    assert out.partition is x.partition
    assert out.values[2].tolist() == [0.0, 0.0]  # a one-row segment has variance 0
    out.values.sum().backward()
    assert torch.isfinite(leaf.grad).all()

    leaf.grad = None
    sample = ragged.normalize(x, correction=1)  # no degrees of freedom in a one-row segment
    assert torch.isnan(sample.values[2]).all()
    assert torch.isfinite(sample.values[[0, 1, 3, 4]]).all()
    torch.nan_to_num(sample.values).sum().backward()
    assert torch.isfinite(leaf.grad).all()  # NaN rows do not poison any gradient


def test_normalize_standardises_each_segment(path):
    torch.manual_seed(0)
    x = ragged.from_lengths(torch.randn(30, 3, dtype=torch.float64) * 5 + 1e4, [10, 20])
    out = ragged.normalize(x, eps=0.0)
    for segment in out.unbind():
        torch.testing.assert_close(segment.mean(0), torch.zeros(3, dtype=torch.float64))
        torch.testing.assert_close(segment.var(0, correction=0), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("log", [False, True])
def test_softmax_gradient_over_the_ragged_axis(path, log):
    # torch.nested (2.13) gets this gradient wrong; here it matches the per-segment softmax.
    torch.manual_seed(0)
    values = torch.randn(9, 2, dtype=torch.float64)
    lengths = [4, 0, 5]
    weights = torch.randn(9, 2, dtype=torch.float64)
    op = ragged.log_softmax if log else ragged.softmax
    leaf = values.clone().requires_grad_()
    (op(ragged.from_lengths(leaf, lengths), axis=1).values * weights).sum().backward()
    fn = torch.log_softmax if log else torch.softmax
    expected = []
    for v, w in zip(values.split(lengths), weights.split(lengths), strict=True):
        seg = v.clone().requires_grad_()
        (fn(seg, 0) * w).sum().backward()
        expected.append(seg.grad)
    torch.testing.assert_close(leaf.grad, torch.cat(expected))


def test_norms_keep_partition_and_names():
    x = ragged.from_lengths(torch.randn(5, 2, 4), [2, 3]).rename("b", "t", "h", "d")
    for out in (
        ragged.layer_norm(x, (2, 4)),
        ragged.rms_norm(x, 4, torch.ones(4)),
        ragged.softmax(x, "d"),
        ragged.normalize(x, "t"),
    ):
        assert out.partition is x.partition
        assert out.axes == x.axes


def test_compile_one_graph():
    import ragged.testing

    def f(x):
        return (
            ragged.normalize(x).values.sum()
            + ragged.softmax(x, axis=1).values.square().sum()
            + ragged.log_softmax(x, axis=-1).values.sum()
            + ragged.layer_norm(x, 7).values.square().sum()
        )

    g = torch.Generator().manual_seed(0)
    batches = []
    for lengths in ([3, 0, 40, 7], [5, 1, 2, 9, 100], [64, 3, 17]):
        v = torch.randn(sum(lengths), 7, generator=g, dtype=torch.float64).requires_grad_()
        batches.append((ragged.from_lengths(v, lengths),))
    # Dynamo (torch 2.13, specialize_float=False) passes Python floats such as `eps` as 0-d CPU
    # tensors and reads them with `.item()` (flagged as a host sync by check_compile, although
    # no device is involved), and F.layer_norm's float `eps` restarts the analysis (counted as a
    # second graph). Specialising floats removes both; the shapes stay dynamic.
    with torch._dynamo.config.patch(specialize_float=True):
        report = ragged.testing.check_compile(f, batches, backend="aot_eager", grad=True)
    assert report.graphs == 1
