"""Behaviour of the indexing ops beyond the op table: structure sharing, names, max lengths,
syncs, transforms and compilation."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

import ragged
import ragged.testing
from ragged import Partition, RaggedArray, RowPartition
from tests.strategies import ragged_arrays

NAMES = ("b", "l", "d")


def _positions(length: int, index: slice) -> list[int]:
    return list(range(length))[index]


# --- per-segment slicing ----------------------------------------------------------------------

bounds = st.one_of(st.none(), st.integers(-8, 8))


@given(ragged_arrays(inner=(2,)), bounds, bounds, st.sampled_from([None, 1, 2, 3, -1, -2, -3]))
def test_ragged_slice_is_python_slicing_per_segment(x, start, stop, step):
    y = x[:, start:stop:step]
    expected = [s[_positions(len(s), slice(start, stop, step))] for s in x.unbind()]
    assert y.lengths.tolist() == [len(e) for e in expected]
    for got, e in zip(y.unbind(), expected, strict=True):
        torch.testing.assert_close(got, e)
    assert y.partition.levels[0].max_length == max((len(e) for e in expected), default=0)


def test_slices_that_keep_the_structure_share_it():
    x = ragged.array([[1, 2, 3], [], [4]])  # max_length 3, known from host data
    assert x[:, :3] is x and x[:, :10] is x and x[:, -3:] is x and x[:, 0:] is x
    assert ragged.truncate(x, 3) is x
    assert x[:, :2] is not x
    reversed_ = x[:, ::-1]
    assert reversed_.partition is x.partition
    assert reversed_.to_list() == [[3, 2, 1], [], [4]]
    unknown = RaggedArray(x.values, Partition((RowPartition.from_lengths(x.lengths, 4),)))
    assert unknown[:, :3] is not unknown  # max length unknown: the slice must read the total
    assert unknown[:, :3].to_list() == x.to_list()


def test_combined_batch_and_ragged_slices():
    x = ragged.array([[1, 2, 3], [], [4, 5], [6]])
    assert x[1:3, :1].to_list() == [[], [4]]
    assert x[[3, 0], -2:].to_list() == [[6], [2, 3]]
    assert x[2, ::-1].tolist() == [5, 4]


# --- inner axes -------------------------------------------------------------------------------


def test_inner_indexing_keeps_the_partition_and_names():
    x = ragged.from_lengths(torch.arange(24.0).reshape(4, 3, 2), [3, 1], axes=("b", "l", "i", "j"))
    cases = [
        ((slice(None), slice(None), 0), ("b", "l", "j"), lambda s: s[:, 0]),
        ((Ellipsis, slice(0, 1)), ("b", "l", "i", "j"), lambda s: s[..., 0:1]),
        ((Ellipsis, [1, 1, 0], slice(None)), ("b", "l", "i", "j"), lambda s: s[:, [1, 1, 0]]),
        ((Ellipsis, 1, -1), ("b", "l"), lambda s: s[:, 1, -1]),
        ((Ellipsis, slice(None, None, -1), 0), ("b", "l", "i"), lambda s: s.flip(1)[..., 0]),
    ]
    for index, names, reference in cases:
        y = x[index]
        assert y.partition is x.partition, index
        assert y.axes == names, index
        for got, segment in zip(y.unbind(), x.unbind(), strict=True):
            torch.testing.assert_close(got, reference(segment))
    assert x.rename(None)[..., None].shape.to_list() == [2, [3, 1], 3, 2, 1]


def test_new_axes_on_named_arrays_raise():
    x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0]]], axes=NAMES)
    for index in [(Ellipsis, None), (Ellipsis, torch.tensor([[0, 1]]))]:
        with pytest.raises(ValueError, match="would add unnamed axes"):
            x[index]
    assert x[..., torch.tensor(1)].axes == ("b", "l")
    assert x[..., torch.tensor([False, True])].axes == NAMES
    two = ragged.from_lengths(torch.zeros(2, 1, 2), [1, 1], axes=("b", "l", "i", "j"))
    with pytest.raises(ValueError, match="would add unnamed axes"):
        two[..., torch.tensor([[True, False]])]  # one axis in place of two
    assert two.rename(None)[..., torch.tensor([[True, False]])].inner_shape == (1,)
    with pytest.raises(IndexError, match="cannot span the batch or ragged axes"):
        x[..., torch.tensor([[True, False]])]


def test_non_adjacent_inner_tensor_indices_raise():
    x = ragged.from_lengths(torch.zeros(3, 2, 3, 4), [1, 2])
    with pytest.raises(IndexError, match="must be adjacent"):
        x[:, :, torch.tensor([0]), :, torch.tensor([0])]
    assert x[:, :, torch.tensor([0, 1]), torch.tensor([2, 2])].inner_shape == (2, 4)


def test_multi_level_arrays_index_every_axis():
    p = Partition(
        (
            RowPartition.from_lengths(torch.tensor([2, 1]), 3, 2),
            RowPartition.from_lengths(torch.tensor([1, 2, 1]), 4, 2),
        )
    )
    y = RaggedArray(torch.arange(8.0).reshape(4, 2), p)
    assert y[..., 0].partition is p
    assert y[..., 0].to_list() == [[[0.0], [2.0, 4.0]], [[6.0]]]
    assert y[1:, ..., ::-1].to_list() == [[[[7.0, 6.0]]]]
    # y: [[[[0, 1]], [[2, 3], [4, 5]]], [[[6, 7]]]]
    assert y[:, 0].to_list() == [[[0.0, 1.0]], [[6.0, 7.0]]]  # the first row of each segment
    assert y[:, :, -1].to_list() == [[[0.0, 1.0], [4.0, 5.0]], [[6.0, 7.0]]]
    assert ragged.take(y, torch.zeros(2, 1, dtype=torch.int64)).to_list() == [
        [[[0.0, 1.0]]],
        [[[6.0, 7.0]]],
    ]
    assert ragged.first(y).to_list() == y[:, 0].to_list()
    assert ragged.pad(y, 1).to_list() == [
        [[], [[0.0, 1.0]], [[2.0, 3.0], [4.0, 5.0]], []],
        [[], [[6.0, 7.0]], []],
    ]
    assert ragged.truncate(y, 1, axis=2).to_list() == [[[[0.0, 1.0]], [[2.0, 3.0]]], [[[6.0, 7.0]]]]
    assert y[:, 1:2].to_list() == [[[[2.0, 3.0], [4.0, 5.0]]], []]


# --- rows and take ----------------------------------------------------------------------------


def test_row_indexing_matches_first_last_and_take():
    x = ragged.array([[1.0, 2.0, 3.0], [], [4.0]])
    torch.testing.assert_close(x[:, 0], ragged.first(x), equal_nan=True)
    torch.testing.assert_close(x[:, -1], ragged.last(x), equal_nan=True)
    torch.testing.assert_close(x[:, torch.tensor(1)], torch.tensor([2.0, torch.nan, torch.nan]),
                               equal_nan=True)  # fmt: skip
    torch.testing.assert_close(
        x[:, [0, -1]], ragged.take(x, torch.tensor([[0, -1]] * 3)), equal_nan=True
    )


def test_fill_defaults_per_dtype():
    ints = ragged.array([[1, 2], []])
    assert ragged.first(ints).tolist() == [1, 0]
    assert ints[:, 5].tolist() == [0, 0]
    flags = ragged.array([[True], []])
    assert ragged.last(flags).tolist() == [True, False]
    assert ragged.take(ints, ragged.array([[3], [0]]), fill_value=-1).to_list() == [[-1], [-1]]


def test_take_keeps_the_indices_partition_and_the_names():
    x = ragged.array([[[1.0], [2.0]], [[3.0]]], axes=NAMES)
    idx = ragged.array([[1, 1, 0], []])
    y = ragged.take(x, idx)
    assert y.partition is idx.partition and y.axes == NAMES
    assert x[idx].to_list() == [[[2.0], [2.0], [1.0]], []]
    assert ragged.take(x, torch.tensor([0]), axis="d").axes == NAMES


def test_take_modes_on_an_empty_segment_fill():
    x = ragged.array([[1.0, 2.0], []])
    idx = torch.tensor([[3, -3], [0, 1]])
    assert ragged.take(x, idx, mode="clip", fill_value=9.0).tolist() == [[2.0, 1.0], [9.0, 9.0]]
    assert ragged.take(x, idx, mode="wrap", fill_value=9.0).tolist() == [[2.0, 2.0], [9.0, 9.0]]
    with pytest.raises(IndexError, match="out of range"):
        ragged.take(x, idx, mode="raise")


def test_no_values_at_all():
    x = ragged.from_lengths(torch.zeros(0, 2, requires_grad=True), [0, 0])
    out = ragged.first(x)
    assert out.shape == (2, 2) and out.isnan().all()
    out.nan_to_num().sum().backward()  # still connected to the input
    assert ragged.take(x, torch.zeros(2, 3, dtype=torch.int64), mode="clip").shape == (2, 3, 2)
    assert ragged.pad(x, (1, 1)).to_list() == [[[0.0, 0.0], [0.0, 0.0]]] * 2
    empty = ragged.from_lengths(torch.zeros(0, 2), [])
    assert ragged.first(empty).shape == (0, 2)
    assert empty[:, 1:].num_segments == 0


def test_gradients_do_not_leak_from_fills():
    values = torch.tensor([[1.0], [2.0], [3.0]], requires_grad=True)
    x = ragged.from_lengths(values, [2, 0, 1])
    out = ragged.take(x, ragged.array([[1, 5], [0], [-1, -1]]))
    torch.where(out.values.isnan(), 0.0, out.values).sum().backward()
    assert values.grad.tolist() == [[0.0], [1.0], [2.0]]


# --- filter, pad, truncate --------------------------------------------------------------------


def test_filter_records_max_length_and_shares_structure_when_all_kept():
    x = ragged.array([[1.0, 2.0, 3.0], [], [4.0, 5.0]], axes=("b", "l"))
    y = ragged.filter(x, x > 1.5)
    assert y.to_list() == [[2.0, 3.0], [], [4.0, 5.0]]
    assert y.partition.levels[0].max_length == 2 and y.axes == ("b", "l")
    assert ragged.filter(x, x > 0).partition is x.partition
    assert x[x > 4].to_list() == [[], [], [5.0]]
    assert ragged.filter(x, x > 9).lengths.tolist() == [0, 0, 0]


def test_pad_sizes_are_static():
    x = ragged.array([[1, 2], [], [3]])
    y = ragged.pad(x, (2, 1), value=-1)
    assert y.partition.levels[0].max_length == 5
    assert y.to_list() == [[-1, -1, 1, 2, -1], [-1, -1, -1], [-1, -1, 3, -1]]
    assert ragged.pad(x, 0) is x
    unknown = RaggedArray(x.values, Partition((RowPartition.from_lengths(x.lengths, 3),)))
    assert ragged.pad(unknown, 1).partition.levels[0].max_length is None
    assert ragged.pad(x, 1, value=torch.tensor(7)).to_list()[1] == [7, 7]


@given(ragged_arrays(inner=(2,)), st.integers(0, 6))
def test_truncate_is_a_prefix_slice(x, k):
    y = ragged.truncate(x, k)
    assert y.to_list() == x[:, :k].to_list() == [s[:k].tolist() for s in x.unbind()]
    assert y.partition.levels[0].max_length == min(k, max(x.lengths.tolist(), default=0))


# --- transforms and compilation ---------------------------------------------------------------


def test_vmap_over_values():
    x = ragged.from_lengths(torch.randn(6, 3, dtype=torch.float64), [3, 0, 2, 1])
    idx = ragged.array([[0, 2, 9], [1], [], [-1]])
    keep = x[..., 0].with_values(torch.tensor([True, False, True, True, False, True]))
    dense_idx = torch.tensor([[0, 1], [0, 0], [-1, 5], [0, 0]])
    ops = [
        lambda y: ragged.take(y, idx).values,
        lambda y: ragged.take(y, dense_idx, mode="wrap"),
        lambda y: ragged.take(y, torch.tensor([2, 0]), axis=2).values,
        lambda y: ragged.filter(y, keep).values,
        lambda y: ragged.pad(y, (1, 2), value=0.5).values,
        lambda y: ragged.truncate(y, 2).values,
        lambda y: ragged.first(y),
        lambda y: ragged.last(y),
        lambda y: y[:, 1:, ::-1].values,
        lambda y: y[:, -1, 0],
        lambda y: y[..., None, 1].values,
    ]
    ensemble = torch.randn(4, *x.values.shape, dtype=torch.float64)
    for op in ops:
        batched = torch.func.vmap(lambda v, op=op: op(x.with_values(v)))(ensemble)
        expected = torch.stack([op(x.with_values(v)) for v in ensemble])
        torch.testing.assert_close(batched, expected, equal_nan=True)


def _batch(rng: random.Random) -> tuple[RaggedArray, RaggedArray, torch.Tensor]:
    lengths = [rng.randint(0, 7) for _ in range(rng.randint(3, 9))]
    lengths[0] = max(lengths[0], 2)  # keep totals away from the 0/1 specialisation
    x = ragged.from_lengths(torch.randn(sum(lengths), 3, 4, requires_grad=True), lengths)
    counts = [rng.randint(0, 4) for _ in lengths]
    counts[0] = 2
    idx = ragged.from_lengths(torch.randint(-8, 8, (sum(counts),)), counts)
    return x, idx, torch.randint(-8, 8, (len(lengths), 3))


def test_sync_free_ops_compile_to_one_graph():
    def fn(x: RaggedArray, idx: RaggedArray, dense: torch.Tensor) -> tuple[object, ...]:
        y = x[:, :, 0, 1:3]
        return (
            ragged.take(y, idx),
            ragged.take(y, dense, mode="clip"),
            ragged.pad(y, (1, 2), value=0.5),
            ragged.first(y),
            ragged.last(y),
            x[:, -1],
            x[..., None],
            y[:, ::-1],
        )

    rng = random.Random(0)
    batches = [_batch(rng) for _ in range(4)]
    report = ragged.testing.check_compile(
        fn, batches, backend="aot_eager", grad=True, equal_nan=True
    )
    assert report.graphs == 1
