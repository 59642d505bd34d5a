"""Behaviour of sort, argsort, topk and unique_consecutive beyond the op table: every dtype's
path (combined key or two sorts) against a per-segment stable ``torch.sort``, NaN and signed
zeros, partition identity and static metadata, gradients, vmap and compile."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given

import ragged
from ragged.kernels import _sort
from ragged.testing import check_compile
from tests.strategies import ragged_arrays

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def _tied(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Few distinct values (many ties); floats also get NaN, -0.0, 0.0 and infinities."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    low = 0 if dtype == torch.uint8 else -3
    v = torch.randint(low, 4, shape, generator=gen).to(dtype)
    if dtype.is_floating_point:
        pick = torch.randint(0, 10, shape, generator=gen)
        specials = torch.tensor([torch.nan, -0.0, 0.0, torch.inf, -torch.inf, -torch.nan])
        v = torch.where(pick < 6, specials[pick.clamp(max=5)].to(dtype), v)
    return v


def _assert_sorts_like_torch(x: ragged.RaggedArray, descending: bool) -> None:
    values = ragged.sort(x, descending=descending)
    positions = ragged.argsort(x, descending=descending)
    for segment, got, order in zip(x.unbind(), values.unbind(), positions.unbind(), strict=True):
        expected = torch.sort(segment, dim=0, descending=descending, stable=True)
        assert torch.equal(order, expected.indices)
        # bitwise: a sorted -0.0 stays -0.0 (values are gathered, never rebuilt from keys)
        assert torch.equal(
            got.reshape(-1).view(torch.uint8), expected.values.reshape(-1).view(torch.uint8)
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inner", [(), (3,), (2, 2)], ids=str)
@pytest.mark.parametrize("descending", [False, True])
def test_stable_order_matches_torch_sort(
    dtype: torch.dtype, inner: tuple[int, ...], descending: bool
) -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 0, 13, 1, 30, 0, 2]
    x = ragged.from_lengths(_tied(dtype, (sum(lengths), *inner), gen), lengths)
    _assert_sorts_like_torch(x, descending)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
@pytest.mark.parametrize("descending", [False, True])
def test_large_batches_sort_range_by_range(
    dtype: torch.dtype, descending: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches of more than _SORT_CHUNK rows sort in ranges of whole segments (through warm
    # buffers, into a row-major permutation); a small chunk takes that path on a small batch.
    monkeypatch.setattr(_sort, "_SORT_CHUNK", 8)
    gen = torch.Generator().manual_seed(1)
    lengths = [5, 0, 13, 1, 30, 0, 2, 7, 9, 0]
    x = ragged.from_lengths(_tied(dtype, (sum(lengths), 2, 3), gen), lengths)
    level = x.partition.levels[0]
    ranges = _sort._row_ranges(x.values, level.row_ids)
    assert len(ranges) > 3 and ranges[0][0] == 0 and ranges[-1][1] == sum(lengths)
    for (_, stop), (start, _) in itertools.pairwise(ranges):
        assert stop == start and level.row_ids[start - 1] != level.row_ids[start]  # no cut segment
    _assert_sorts_like_torch(x, descending)
    _assert_sorts_like_torch(x.with_values(x.values.transpose(1, 2)), descending)  # strided
    if dtype.is_floating_point:  # vmap (its wrappers sort in one range)
        batch = torch.stack([x.values, x.values.flip(0)])
        got = torch.func.vmap(lambda v: ragged.sort(x.with_values(v), descending=descending).values)
        for v, out in zip(batch, got(batch), strict=True):
            want = ragged.sort(x.with_values(v), descending=descending).values
            torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


def test_range_by_range_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sort, "_SORT_CHUNK", 4)
    lengths = [3, 0, 6, 1, 5]
    values = torch.randn(sum(lengths), 2, dtype=torch.float64, requires_grad=True)

    def fn(v: torch.Tensor) -> torch.Tensor:
        return ragged.sort(ragged.from_lengths(v, lengths), descending=True).values

    assert torch.autograd.gradcheck(fn, (values,))


def test_nan_and_signed_zero_order() -> None:
    nan, inf = torch.nan, torch.inf
    x = ragged.array([[1.0, nan, -0.0, 0.0, -nan, -inf, -0.0], [], [nan]], dtype=torch.float32)
    assert ragged.argsort(x).to_list() == [[5, 2, 3, 6, 0, 1, 4], [], [0]]
    assert ragged.argsort(x, descending=True).to_list() == [[1, 4, 0, 2, 3, 6, 5], [], [0]]


@given(x=ragged_arrays(inner=(2,), dtype=torch.float32))
def test_key_path_and_two_sort_path_agree(x: ragged.RaggedArray) -> None:
    x = x.with_values((x.values * 2).round())  # ties
    level = x.partition.levels[0]
    for descending in (False, True):
        key = _sort.segment_order(x.values, level.row_ids, level.num_rows, descending)
        two = _sort.segment_order(x.values.double(), level.row_ids, level.num_rows, descending)
        assert torch.equal(key, two)


def test_sort_keeps_partition_object_and_names() -> None:
    x = ragged.array([[3.0, 1.0], [2.0]], axes=("batch", "seq"))
    for out in (ragged.sort(x), ragged.argsort(x)):
        assert out.partition is x.partition and out.axes == x.axes


def test_sort_gradient_follows_the_permutation() -> None:
    values = torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0], requires_grad=True)
    x = ragged.from_lengths(values, [3, 2])
    out = ragged.sort(x)
    (out.values * torch.tensor([1.0, 10.0, 100.0, 1000.0, 10000.0])).sum().backward()
    # sorted rows: [1, 2, 3 | 4, 5] come from rows [1, 2, 0 | 4, 3]
    assert values.grad.tolist() == [100.0, 1.0, 10.0, 10000.0, 1000.0]


def test_sort_under_vmap() -> None:
    x = ragged.from_lengths(torch.zeros(9, 2), [4, 0, 5])
    batch = torch.randn(3, 9, 2)

    def fn(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.with_values(v)
        top, _ = ragged.topk(y, 2)
        return ragged.sort(y, descending=True).values, top.values

    sorted_, top = torch.func.vmap(fn)(batch)
    for i in range(3):
        expected = fn(batch[i])
        assert torch.equal(sorted_[i], expected[0]) and torch.equal(top[i], expected[1])


def test_topk_static_cases_keep_partition() -> None:
    x = ragged.array([[1.0, 5.0, 3.0], [], [2.0]])  # max_length 3 is known
    values, indices = ragged.topk(x, 3)
    assert values.partition is x.partition and indices.partition is x.partition
    assert values.to_list() == [[5.0, 3.0, 1.0], [], [2.0]]
    values, indices = ragged.topk(x, 0)
    assert values.to_list() == [[], [], []] and indices.dtype == torch.int64
    assert values.partition.levels[0].max_length == 0


def test_topk_partition_knows_its_max_length() -> None:
    x = ragged.array([[1.0, 5.0, 3.0], [], [2.0], [4.0, 4.0]])
    values, indices = ragged.topk(x, 2, largest=False)
    assert values.partition is indices.partition
    assert values.partition.levels[0].max_length == 2
    assert values.to_list() == [[1.0, 3.0], [], [2.0], [4.0, 4.0]]
    assert indices.to_list() == [[0, 2], [], [0], [0, 1]]  # ties in input order


def test_topk_inner_axis_clamps_k() -> None:
    x = ragged.array([[[1.0, 3.0, 2.0]], [[0.0, -1.0, 5.0]]])
    values, indices = ragged.topk(x, 5, axis=2)
    assert values.partition is x.partition
    assert values.to_list() == [[[3.0, 2.0, 1.0]], [[5.0, 0.0, -1.0]]]
    assert indices.to_list() == [[[1, 2, 0]], [[2, 0, 1]]]


def test_topk_gradient() -> None:
    values = torch.tensor([1.0, 5.0, 3.0, 2.0], requires_grad=True)
    top, _ = ragged.topk(ragged.from_lengths(values, [3, 1]), 1)
    top.values.sum().backward()
    assert values.grad.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_unique_consecutive_counts_inverse_and_gradient() -> None:
    values = torch.tensor([1.0, 1.0, 2.0, 1.0, 3.0, 3.0], requires_grad=True)
    x = ragged.from_lengths(values, [4, 0, 2])
    out, inverse, counts = ragged.unique_consecutive(x, return_inverse=True, return_counts=True)
    assert out.to_list() == [[1.0, 2.0, 1.0], [], [3.0]]
    assert inverse.partition is x.partition
    assert inverse.to_list() == [[0, 0, 1, 2], [], [0, 0]]
    assert counts.to_list() == [[2, 1, 1], [], [2]]
    assert counts.partition is out.partition and out.partition.levels[0].max_length == 3
    out.values.sum().backward()
    assert values.grad.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]  # the first row of each run


def test_unique_consecutive_does_not_merge_runs_across_segments() -> None:
    x = ragged.array([[7, 7], [7], [], [7, 8]])
    assert ragged.unique_consecutive(x).to_list() == [[7], [7], [], [7, 8]]
    empty = ragged.from_lengths(torch.zeros(0, dtype=torch.int64), [0, 0])
    assert ragged.unique_consecutive(empty).to_list() == [[], []]


def test_multi_level_arrays_sort_along_either_ragged_axis() -> None:
    level0 = ragged.RowPartition.from_lengths(torch.tensor([2]), 2, 2)
    level1 = ragged.RowPartition.from_lengths(torch.tensor([1, 2]), 3, 2)
    x = ragged.RaggedArray(torch.tensor([3.0, 2.0, 1.0]), ragged.Partition((level0, level1)))
    assert ragged.sort(x, axis=2).to_list() == [[[3.0], [1.0, 2.0]]]
    assert ragged.sort(x, axis=1).to_list() == [[[2.0], [3.0, 1.0]]]  # column by column
    assert ragged.argsort(x, axis=1).to_list() == [[[1], [0, 1]]]


def test_sort_compiles_without_syncs() -> None:
    def fn(x: ragged.RaggedArray) -> tuple[ragged.RaggedArray, ...]:
        return (
            ragged.sort(x, descending=True),
            ragged.argsort(x),
            ragged.sort(x.to(torch.float64)),
        )

    batches = [
        (ragged.from_lengths(torch.randn(3 * n, 2, requires_grad=True), [n, 0, 2 * n]),)
        for n in (2, 3, 5)
    ]
    check_compile(fn, batches, grad=True)
