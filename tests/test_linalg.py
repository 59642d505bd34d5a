"""Linear algebra beyond the op table: dense-operand gradients, vmap, einsum's chunked path,
contractions over all rows, names, operators and compilation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

import ragged
import ragged.testing
from ragged.ops._linalg import _einsum
from tests.strategies import ragged_arrays


def _per_segment(x, fn):
    return [fn(s) for s in x.unbind()]


def _assert_segments(out, expected):
    assert isinstance(out, ragged.RaggedArray)
    for got, e in zip(out.unbind(), expected, strict=True):
        torch.testing.assert_close(got, e)


def test_operators_keep_partition():
    x = ragged.from_lengths(torch.randn(5, 2, 3), [2, 0, 3])
    w = torch.randn(3, 4)
    y = x @ w
    assert y.partition is x.partition
    _assert_segments(y, _per_segment(x, lambda s: s @ w))
    v = torch.randn(4, 2)
    z = v @ x
    assert z.partition is x.partition
    _assert_segments(z, _per_segment(x, lambda s: v @ s))


def test_matmul_names():
    x = ragged.from_lengths(torch.randn(5, 2, 3), [2, 0, 3], axes=("b", "s", "m", "d"))
    assert (x @ torch.randn(3, 4)).axes == ("b", "s", "m", "d")
    assert (x @ torch.randn(3)).axes == ("b", "s", "m")
    assert (torch.randn(2) @ x).axes == ("b", "s", "d")
    assert ragged.linear(x, torch.randn(3)).axes == ("b", "s", "m")


def test_matmul_of_two_ragged_needs_mT():
    x = ragged.array([[[1.0]], [[2.0]]])
    with pytest.raises(NotImplementedError, match=r"not a pair-map product.*x @ y\.mT"):
        x @ x
    assert (x @ x.mT).to_list() == [[[1.0]], [[4.0]]]
    assert (x @ x.transpose(1, 2)).to_list() == [[[1.0]], [[4.0]]]


@settings(max_examples=10)
@given(x=ragged_arrays(inner=(3,), max_segments=4, max_length=3))
def test_gradients_of_dense_operands(x):
    w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, dtype=torch.float64, requires_grad=True)
    per_segment = torch.randn(x.num_segments, 3, 2, dtype=torch.float64, requires_grad=True)
    values = x.values.detach().clone().requires_grad_()

    def fn(v, w, bias, per_segment):
        y = x.with_values(v)
        return (
            ragged.matmul(y, w).values,
            ragged.linear(y, w.T, bias).values,
            ragged.einsum("bld,bde->ble", y, per_segment).values,
            ragged.einsum("bld,bde->be", y, per_segment),
        )

    inputs = (values, w, bias, per_segment)
    assert torch.autograd.gradcheck(fn, inputs, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize(
    "equation",
    ["bld,de->ble", "bld,bde->ble", "bld,ble->bde", "bld,ble->de", "bld,bd->b"],
)
def test_vmap_over_values(equation):
    x = ragged.from_lengths(torch.randn(6, 3, dtype=torch.float64), [2, 0, 4])
    second = {
        "bld,de->ble": torch.randn(3, 4, dtype=torch.float64),
        "bld,bde->ble": torch.randn(3, 3, 4, dtype=torch.float64),
        "bld,ble->bde": x.with_values(torch.randn(6, 4, dtype=torch.float64)),
        "bld,ble->de": x.with_values(torch.randn(6, 4, dtype=torch.float64)),
        "bld,bd->b": torch.randn(3, 3, dtype=torch.float64),
    }[equation]
    stacked = torch.randn(5, 6, 3, dtype=torch.float64)

    def fn(values):
        out = ragged.einsum(equation, x.with_values(values), second)
        return out.values if isinstance(out, ragged.RaggedArray) else out

    batched = torch.func.vmap(fn)(stacked)
    looped = torch.stack([fn(v) for v in stacked])
    torch.testing.assert_close(batched, looped)


def test_vmap_matmul_and_linear():
    x = ragged.from_lengths(torch.randn(6, 3, dtype=torch.float64), [2, 0, 4])
    w = torch.randn(3, 4, dtype=torch.float64)
    stacked = torch.randn(5, 6, 3, dtype=torch.float64)

    def fn(values):
        y = x.with_values(values)
        return (y @ w).values + ragged.linear(y, w.T).values

    torch.testing.assert_close(torch.func.vmap(fn)(stacked), torch.stack([fn(v) for v in stacked]))


@pytest.mark.parametrize("tile", [1, 2, 8, "padded"])
@pytest.mark.parametrize(
    "equation",
    [
        "bld,bde->ble",  # per-segment weight, ragged result
        "bld,ble->bde",  # per-row outer products summed per segment
        "bld,bde->de",  # per-segment weight, contraction over all rows
        "bld,ble->dbe",  # batch axis not first in the output
        "bl...d,bde->bl...e",
        "bld,bde,ble->bl",  # two ragged operands and a per-segment one
    ],
)
@settings(max_examples=15)
@given(x=ragged_arrays(inner=(3,), max_segments=5, max_length=6))
def test_tiled_einsum_matches_per_row(monkeypatch, tile, equation, x):
    if tile == "padded":
        tiles = lambda level: _einsum._Tiles(level, level.max_length, padded=True)
    else:
        tiles = lambda level: _einsum._Tiles(level, tile, padded=False)
    monkeypatch.setattr(_einsum, "_tiles", tiles)
    gen = torch.Generator().manual_seed(0)
    y = x.with_values(torch.randn(x.values.shape[0], 2, generator=gen, dtype=torch.float64))
    w = torch.randn(x.num_segments, 3, 2, generator=gen, dtype=torch.float64)
    operands = {
        "bld,ble->bde": (x, y),
        "bld,ble->dbe": (x, y),
        "bld,bde,ble->bl": (x, w, y),
    }.get(equation, (x, w))
    plan = _einsum._plan("test", equation, operands)
    assert plan.tiles_equation is not None
    got = plan.run(operands)
    plan.tiles_equation = None  # the per-row evaluation
    ragged.testing.assert_close(got, plan.run(operands))


@settings(max_examples=10)
@given(x=ragged_arrays(inner=(3,), max_segments=5, max_length=6))
def test_contraction_over_all_rows(x):
    y = x.with_values(torch.randn(x.values.shape[0], 2, dtype=torch.float64))
    torch.testing.assert_close(ragged.einsum("bld,ble->de", x, y), x.values.T @ y.values)
    w = torch.randn(x.num_segments, 3, dtype=torch.float64)
    expected = sum((s @ w[i]).sum() for i, s in enumerate(x.unbind())) + torch.zeros(
        (), dtype=torch.float64
    )
    torch.testing.assert_close(ragged.einsum("bld,bd->", x, w), expected)


def test_batch_axis_anywhere_in_a_dense_result():
    x = ragged.from_lengths(torch.randn(6, 3), [2, 0, 4])
    y = x.with_values(torch.randn(6, 2))
    out = ragged.einsum("bld,ble->dbe", x, y)
    expected = torch.stack([a.T @ b for a, b in zip(x.unbind(), y.unbind(), strict=True)], 1)
    torch.testing.assert_close(out, expected)
    x4 = ragged.from_lengths(torch.randn(6, 2, 3), [2, 0, 4])
    out = ragged.einsum("bl...d->...bd", x4)
    torch.testing.assert_close(out, torch.stack([s.sum(0) for s in x4.unbind()], 1))


def test_size_one_batch_axis_broadcasts():
    x = ragged.from_lengths(torch.randn(6, 3), [2, 0, 4])
    w = torch.randn(1, 3)
    torch.testing.assert_close(ragged.einsum("bld,bd->bl", x, w).values, x.values @ w[0])


def test_einsum_names_follow_subscripts():
    x = ragged.from_lengths(torch.randn(6, 3), [2, 0, 4], axes=("batch", "seq", "feat"))
    y = ragged.from_lengths(torch.randn(6, 2), [2, 0, 4], axes=("batch", "seq", "out"))
    assert ragged.einsum("bld,ble->bled", x, y).axes == ("batch", "seq", "out", "feat")
    assert ragged.einsum("bld,de->ble", x, torch.randn(3, 2)).axes is None
    assert ragged.einsum("bld->bl", x).axes == ("batch", "seq")


def test_einsum_operands_as_a_list_and_empty_batches():
    x = ragged.from_lengths(torch.randn(0, 3), [])
    assert ragged.einsum("bld,ble->bde", [x, x]).shape == (0, 3, 3)
    e = ragged.from_lengths(torch.randn(0, 3), [0, 0])
    torch.testing.assert_close(ragged.einsum("bld,ble->bde", e, e), torch.zeros(2, 3, 3))
    assert ragged.einsum("bld,de->ble", e, torch.randn(3, 2)).values.shape == (0, 2)


def test_einsum_compiles_once():
    w = torch.randn(8, 9, 7)  # sizes unlike those of the first batch (no duck sizing)

    def fn(x):
        return ragged.einsum("bld,bde->be", x, w[: x.num_segments]), ragged.einsum(
            "bld,ble->bde", x, x
        )

    batches = [
        (ragged.from_lengths(torch.randn(sum(n), 9), n),)
        for n in ([2, 3], [4, 0, 1], [1, 5, 2, 3], [3, 3, 0])
    ]
    report = ragged.testing.check_compile(fn, batches)
    assert report.graphs == 1
