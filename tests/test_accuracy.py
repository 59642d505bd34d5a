"""Accuracy of long float32 segments: one segment of 10^6 rows, every reduction and the
statistics built on them, on every kernel path, against float64, within 10x of torch's own
error on the same data (``docs/semantics.md``, "Accuracy")."""

import pytest
import torch

import ragged
from tests.paths import PATHS, use_path

ROWS = 10**6
# A correctly rounded float32 result is off by up to half an ulp (2**-24 relative): torch can be
# that exact by luck, so the bar is 10x the larger of torch's error and that rounding.
ROUNDING = 2.0**-24


def _normalize(t: torch.Tensor) -> torch.Tensor:
    return (t - t.mean(0)) / (t.var(0, correction=0) + 1e-5).sqrt()


CASES = {
    "sum": (lambda x: ragged.sum(x, axis=1)[0], lambda t: t.sum(0)),
    "mean": (lambda x: ragged.mean(x, axis=1)[0], lambda t: t.mean(0)),
    "var": (lambda x: ragged.var(x, axis=1)[0], lambda t: t.var(0)),
    "std": (lambda x: ragged.std(x, axis=1)[0], lambda t: t.std(0)),
    "norm": (lambda x: ragged.norm(x, 2, axis=1)[0], lambda t: torch.linalg.vector_norm(t, 2, 0)),
    "logsumexp": (lambda x: ragged.logsumexp(x, axis=1)[0], lambda t: t.logsumexp(0)),
    "normalize": (lambda x: ragged.normalize(x).values, _normalize),
    "softmax": (lambda x: ragged.softmax(x, axis=1).values, lambda t: t.softmax(0)),
}


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(0)
    positive = torch.rand(ROWS, 4, generator=gen)  # sums grow: sequential adds drift most
    offset = torch.randn(ROWS, 4, generator=gen) + 100  # large mean: one-pass variance fails
    return {"positive": positive, "offset": offset}


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    return use_path(request.param, monkeypatch)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", ["positive", "offset"])
def test_one_long_float32_segment_is_as_accurate_as_torch(path, data, name, kind):
    op, torch_op = CASES[name]
    values = data[kind]
    want = torch_op(values.double())
    got = op(ragged.from_lengths(values, [ROWS]))
    assert got.dtype == torch.float32
    torch_error = _relative_error(torch_op(values), want)
    assert _relative_error(got, want) <= 10 * max(torch_error, ROUNDING)


def test_long_segments_among_short_ones(path):
    # The accumulation is per segment: a long segment next to short ones keeps its accuracy.
    gen = torch.Generator().manual_seed(1)
    lengths = [3, 0, 200_000, 1, 5]
    values = torch.rand(sum(lengths), 2, generator=gen)
    got = ragged.sum(ragged.from_lengths(values, lengths), axis=1)
    want = torch.stack([s.sum(0) for s in values.double().split(lengths)])
    assert _relative_error(got, want) <= 10 * ROUNDING
