"""Behaviour of concat, stack and split beyond the op table: batch-axis concat against Python
lists, static metadata (totals, maximum lengths, partition identity), views, names, dtypes."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given

import ragged
from ragged import Partition, RowPartition
from ragged.testing import check_compile
from tests.strategies import ragged_arrays


def _lists(x: ragged.RaggedArray) -> list:
    return x.to_list()


@given(arrays=st.lists(ragged_arrays(inner=(2,)), min_size=1, max_size=4))
def test_concat_batch_matches_lists(arrays: list[ragged.RaggedArray]) -> None:
    out = ragged.concat(arrays, axis=0)
    expected = [segment for a in arrays for segment in _lists(a)]
    assert out.to_list() == expected
    assert out.num_segments == sum(a.num_segments for a in arrays)
    assert torch.equal(out.segment_ids, torch.repeat_interleave(out.lengths))
    longest = max((len(s) for s in expected), default=0)
    assert out.partition.levels[0].max_length in (None, longest)


@given(
    lengths=st.lists(st.lists(st.integers(0, 4), min_size=3, max_size=3), min_size=1, max_size=4)
)
def test_concat_ragged_matches_lists(lengths: list[list[int]]) -> None:
    arrays = [ragged.from_lengths(torch.randn(sum(n), 2), n) for n in lengths]
    out = ragged.concat(arrays, axis=1)
    expected = [[row for a in arrays for row in _lists(a)[b]] for b in range(3)]
    assert out.to_list() == expected
    assert torch.equal(out.lengths, torch.tensor(lengths).sum(0))


def test_concat_batch_max_length_known_only_when_all_known() -> None:
    a = ragged.array([[1.0, 2.0], [3.0]])
    b = ragged.array([[4.0, 5.0, 6.0]])
    assert ragged.concat([a, b]).partition.levels[0].max_length == 3
    unknown = ragged.from_lengths(b.values, torch.tensor([3]), validate=False)
    assert unknown.partition.levels[0].max_length is None
    assert ragged.concat([a, unknown]).partition.levels[0].max_length is None


def test_concat_ragged_max_length() -> None:
    x = ragged.array([[1.0, 2.0], [], [3.0]])
    same = ragged.concat([x, x * 2, x], axis=1)
    assert same.partition.levels[0].max_length == 6
    assert same.to_list() == [[1.0, 2.0, 2.0, 4.0, 1.0, 2.0], [], [3.0, 6.0, 3.0]]
    other = ragged.concat([x, ragged.array([[1.0], [2.0], []])], axis=1)
    assert other.partition.levels[0].max_length is None  # not known without reading
    one = ragged.concat([ragged.array([[1.0]]), ragged.array([[2.0, 3.0]])], axis=1)
    assert one.partition.levels[0].max_length == 3 and one.to_list() == [[1.0, 2.0, 3.0]]


def test_concat_single_array_is_returned_unchanged() -> None:
    x = ragged.array([[[1.0]], [[2.0], [3.0]]])
    for axis in (0, 1, 2):
        out = ragged.concat([x], axis=axis)
        assert out.values is x.values and out.partition is x.partition


def test_concat_inner_keeps_partition_object() -> None:
    x = ragged.from_lengths(torch.zeros(3, 2), [2, 1])
    out = ragged.concat([x, x.with_values(torch.ones(3, 1))], axis=-1)
    assert out.partition is x.partition
    assert out.inner_shape == (3,)


def test_concat_promotes_dtypes_like_torch_cat() -> None:
    ints = ragged.array([[1, 2], [3]])
    floats = ragged.array([[0.5], [1.5, 2.5]], dtype=torch.float64)
    for axis in (0, 1):
        out = ragged.concat([ints, floats], axis=axis)
        assert out.dtype == torch.float64
    assert ragged.concat([ints, floats], axis=1).to_list() == [[1.0, 2.0, 0.5], [3.0, 1.5, 2.5]]


def test_concat_names_unify() -> None:
    x = ragged.array([[1.0], [2.0]], axes=("batch", "seq"))
    y = ragged.array([[3.0], []])
    assert ragged.concat([y, x]).axes == ("batch", "seq")
    assert ragged.concat([x, y], axis="seq").axes == ("batch", "seq")
    assert ragged.concat([y, x], axis="seq").to_list() == [[3.0, 1.0], [2.0]]
    assert ragged.concat([y, y]).axes is None


def test_concat_zero_segments_and_empty_values() -> None:
    none = ragged.from_lengths(torch.zeros(0, 2), [])
    empty = ragged.from_lengths(torch.zeros(0, 2), [0, 0])
    x = ragged.from_lengths(torch.ones(3, 2), [1, 2])
    assert ragged.concat([none, x, none]).to_list() == x.to_list()
    assert ragged.concat([empty, x], axis=1).to_list() == x.to_list()
    assert ragged.concat([empty, empty], axis=1).to_list() == [[], []]


def test_concat_batch_multi_level() -> None:
    """Two ragged axes: every level's offsets and ids shift (built by hand: no factory yet)."""

    def two_level(outer: list[int], inner: list[int]) -> ragged.RaggedArray:
        total = sum(inner)
        level0 = RowPartition.from_lengths(torch.tensor(outer), len(inner), max(outer))
        level1 = RowPartition.from_lengths(torch.tensor(inner), total, max(inner))
        values = torch.arange(float(total))
        return ragged.RaggedArray(values, Partition((level0, level1)))

    a = two_level([2, 0], [1, 3])
    b = two_level([1, 2], [2, 0, 1])
    out = ragged.concat([a, b])
    assert out.to_list() == a.to_list() + b.to_list()
    assert out.partition.levels[1].max_length == 3
    c = two_level([1, 1], [2, 0])
    joined = ragged.concat([a, c], axis=1)  # sentences of each document joined
    assert joined.to_list() == [[[0.0], [1.0, 2.0, 3.0], [0.0, 1.0]], [[]]]
    tokens = ragged.concat([a, a], axis=2)  # tokens of each sentence joined
    assert tokens.to_list() == [[[0.0, 0.0], [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]], []]


def test_concat_is_differentiable_in_every_input() -> None:
    x = ragged.array([[1.0, 2.0], [3.0]]).values.requires_grad_()
    y = ragged.array([[4.0], [5.0, 6.0]]).values.requires_grad_()
    xa = ragged.from_lengths(x, [2, 1])
    ya = ragged.from_lengths(y, [1, 2])
    out = ragged.concat([xa, ya], axis=1)
    weights = torch.arange(1.0, 7.0)  # rows of out: [1, 2, 4 | 3, 5, 6]
    (out.values * weights).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0, 4.0]
    assert y.grad.tolist() == [3.0, 5.0, 6.0]


def test_stack_keeps_partition_and_accepts_equal_partitions() -> None:
    x = ragged.from_lengths(torch.randn(3, 2), [2, 1])
    twin = ragged.from_lengths(torch.randn(3, 2), [2, 1])
    out = ragged.stack([x, twin], axis=2)
    assert out.partition is x.partition
    assert out.inner_shape == (2, 2)
    torch.testing.assert_close(out.values[:, 1], twin.values)


def test_stack_names_the_new_axis() -> None:
    x = ragged.array([[1.0, 2.0], [3.0]], axes=("batch", "seq"))
    assert ragged.stack([x, x], name="pair").axes == ("batch", "seq", "pair")


@given(x=ragged_arrays(inner=(2,)), chunk=st.integers(1, 7))
def test_split_chunks_roundtrip(x: ragged.RaggedArray, chunk: int) -> None:
    pieces = ragged.split(x, chunk)
    expected = [len(p) for p in torch.arange(x.num_segments).split(chunk)] or [0]
    assert [p.num_segments for p in pieces] == expected
    assert [s for p in pieces for s in p.to_list()] == x.to_list()
    for p in pieces:  # each piece knows its exact maximum length
        assert p.partition.levels[0].max_length == max((len(s) for s in p.to_list()), default=0)
        assert torch.equal(p.segment_ids, torch.repeat_interleave(p.lengths))


def test_split_values_are_views() -> None:
    x = ragged.from_lengths(torch.arange(10.0), [3, 0, 2, 5])
    _, second, third = ragged.split(x, [1, 0, 3])
    assert second.num_segments == 0 and second.values.numel() == 0
    assert third.values.data_ptr() == x.values.data_ptr() + 3 * x.values.element_size()
    assert third.values._base is x.values
    assert third.to_list() == [[], [3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0]]


def test_split_one_piece_is_the_input() -> None:
    x = ragged.array([[1.0], [2.0]])
    (only,) = ragged.split(x, [2])
    assert only is x
    (only,) = ragged.split(ragged.from_lengths(torch.zeros(0), []), 3)
    assert only.num_segments == 0


def test_split_gradient() -> None:
    values = torch.arange(6.0, requires_grad=True)
    x = ragged.from_lengths(values, [2, 1, 3])
    a, b = ragged.split(x, [2, 1])
    (a.values.sum() * 2 + b.values.sum()).backward()
    assert values.grad.tolist() == [2.0, 2.0, 2.0, 1.0, 1.0, 1.0]


def test_combine_compiles_without_syncs() -> None:
    def fn(x: ragged.RaggedArray, y: ragged.RaggedArray) -> ragged.RaggedArray:
        joined = ragged.concat([x, y * 2], axis=1)
        both = ragged.concat([joined, joined], axis=0)
        return ragged.stack([both, both + 1], axis=-1)

    def batch(n: int) -> tuple[ragged.RaggedArray, ragged.RaggedArray]:
        lengths = [n, 0, 2 * n]
        x = ragged.from_lengths(torch.randn(3 * n, 2, requires_grad=True), lengths)
        y = ragged.from_lengths(torch.randn(4 * n, 2), [2 * n, n, n])
        return x, y

    check_compile(fn, [batch(n) for n in (2, 3, 5)], grad=True)
