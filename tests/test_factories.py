"""Factories round-trip against per-segment data, and reject bad input with clear errors."""

import re

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

import ragged
from tests.strategies import lengths, random_tensor


def segments_of(values, lens):
    out, start = [], 0
    for n in lens:
        out.append(values[start : start + n])
        start += n
    return out


def check(x, segments, inner):
    assert x.num_segments == len(segments)
    assert x.lengths.tolist() == [len(s) for s in segments]
    assert x.offsets.dtype == torch.int64
    assert tuple(x.inner_shape) == tuple(inner)
    assert x.to_list() == [s.tolist() for s in segments]
    for got, want in zip(x.unbind(), segments, strict=True):
        torch.testing.assert_close(got, want)
    assert x.segment_ids.tolist() == [b for b, s in enumerate(segments) for _ in range(len(s))]


inner_shapes = st.sampled_from([(), (3,), (2, 2)])
layouts = st.sampled_from(["contiguous", "strided", "transposed"])


@given(lengths(), inner_shapes, layouts, st.integers(0, 2**16))
def test_from_lengths_round_trip(lens, inner, layout, seed):
    values = random_tensor((sum(lens), *inner), torch.float64, seed, layout)
    check(ragged.from_lengths(values, lens), segments_of(values, lens), inner)
    check(
        ragged.from_lengths(values, torch.tensor(lens, dtype=torch.int64)),
        segments_of(values, lens),
        inner,
    )


@given(lengths(), inner_shapes, st.integers(0, 2**16))
def test_from_offsets_round_trip(lens, inner, seed):
    values = random_tensor((sum(lens), *inner), torch.float64, seed)
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    check(ragged.from_offsets(values, offsets), segments_of(values, lens), inner)
    check(
        ragged.from_offsets(values, torch.tensor(offsets, dtype=torch.int64)),
        segments_of(values, lens),
        inner,
    )


@given(lengths(), inner_shapes, st.integers(0, 2**16))
def test_from_segment_ids_round_trip(lens, inner, seed):
    values = random_tensor((sum(lens), *inner), torch.float64, seed)
    ids = torch.tensor([b for b, n in enumerate(lens) for _ in range(n)], dtype=torch.int64)
    check(ragged.from_segment_ids(values, ids, len(lens)), segments_of(values, lens), inner)


@given(lengths(), inner_shapes, st.integers(0, 2**16))
def test_array_round_trip(lens, inner, seed):
    values = random_tensor((sum(lens), *inner), torch.float64, seed)
    segments = segments_of(values, lens)
    if lens:  # zero segments carry no inner shape
        check(ragged.array(segments), segments, inner)
    x = ragged.array([s.tolist() for s in segments], dtype=torch.float64)
    if sum(lens):  # an all-empty list has no inner shape to infer
        check(x, segments, inner)


@given(lengths(), inner_shapes, st.integers(0, 2**16), st.integers(0, 2))
def test_from_padded_round_trip(lens, inner, seed, extra):
    width = max(lens, default=0) + extra
    padded = random_tensor((len(lens), width, *inner), torch.float64, seed)
    segments = [padded[b, :n] for b, n in enumerate(lens)]
    check(ragged.from_padded(padded, lens), segments, inner)
    mask = torch.arange(width)[None, :] < torch.tensor(lens, dtype=torch.int64)[:, None]
    check(ragged.from_padded(padded, mask=mask), segments, inner)
    x = ragged.from_padded(padded, torch.tensor(lens, dtype=torch.int64))
    check(x, segments, inner)
    torch.testing.assert_close(
        x.to_padded(length=width), padded * mask.view(*mask.shape, *[1] * len(inner))
    )


@given(lengths(min_segments=1), st.integers(0, 2**16))
def test_nested_round_trip(lens, seed):
    values = random_tensor((sum(lens), 3), torch.float64, seed)
    x = ragged.from_lengths(values, lens)
    nt = x.to_nested()
    assert nt.values().data_ptr() == x.values.data_ptr()
    check(ragged.from_nested(nt), segments_of(values, lens), (3,))


def test_from_nested_with_holes_compacts():
    values = torch.arange(6.0)
    nt = torch.nested.nested_tensor_from_jagged(
        values, offsets=torch.tensor([0, 3, 6]), lengths=torch.tensor([2, 1])
    )
    assert ragged.from_nested(nt).to_list() == [[0.0, 1.0], [3.0]]


def test_from_padded_full_rows_and_grad():
    padded = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    x = ragged.from_padded(padded)
    assert x.lengths.tolist() == [3, 3]
    x2 = ragged.from_padded(padded, [1, 2])
    (grad,) = torch.autograd.grad(x2.values.sum(), padded)
    assert grad[:, :, 0].tolist() == [[1, 0, 0], [1, 1, 0]]


def test_array_zero_segments_and_dtypes():
    x = ragged.array([])
    assert x.num_segments == 0 and x.values.shape == (0,)
    assert ragged.array([[1, 2], [3]]).dtype == torch.int64
    assert ragged.array([[True], []]).dtype == torch.bool
    assert ragged.array([[1, 2]], dtype=torch.float16).dtype == torch.float16
    y = ragged.array([torch.ones(2, dtype=torch.int32), torch.ones(1)], dtype=torch.float64)
    assert y.dtype == torch.float64


def test_factories_record_max_length_from_host():
    assert ragged.array([[1], [2, 3, 4], []]).partition.levels[0].max_length == 3
    assert ragged.from_lengths(torch.zeros(3), [1, 2]).partition.levels[0].max_length == 2
    x = ragged.from_lengths(torch.zeros(3), torch.tensor([1, 2]), validate=False)
    assert x.partition.levels[0].max_length is None
    assert x.to_padded().shape == (2, 2)  # reads the maximum once


def test_axes_names():
    x = ragged.array([[[1.0]], [[2.0]]], axes=["batch", "seq", "feat"])
    assert x.axes == ("batch", "seq", "feat")


# --- bad input: one test per case, matching the message ---------------------------------------

V = torch.arange(6.0)

BAD = [
    # (callable, exception, message regex)
    (
        lambda: ragged.from_offsets(V, [1, 6]),
        ValueError,
        "ragged.from_offsets: `offsets` must start at 0, got offsets[0] = 1.",
    ),
    (
        lambda: ragged.from_offsets(V, torch.tensor([0, 4, 2, 6])),
        ValueError,
        "ragged.from_offsets: `offsets` must be non-decreasing, got offsets[2] = 2 < offsets[1] = 4.",
    ),
    (
        lambda: ragged.from_offsets(V, [0, 4, 2, 6]),
        ValueError,
        "ragged.from_offsets: `offsets` must be non-decreasing, got offsets[2] = 2 < offsets[1] = 4.",
    ),
    (
        lambda: ragged.from_offsets(V, torch.tensor([0, 2, 5])),
        ValueError,
        "ragged.from_offsets: `offsets` must end at values.shape[0] = 6, got offsets[-1] = 5.",
    ),
    (
        lambda: ragged.from_offsets(V, torch.tensor([0.0, 6.0])),
        TypeError,
        "ragged.from_offsets: `offsets` must have an integer dtype, got torch.float32.",
    ),
    (
        lambda: ragged.from_offsets(V, torch.tensor([], dtype=torch.int64)),
        ValueError,
        "ragged.from_offsets: `offsets` must have at least one entry (B + 1 for B segments), got [].",
    ),
    (
        lambda: ragged.from_lengths(V, torch.tensor([3.0, 3.0])),
        TypeError,
        "ragged.from_lengths: `lengths` must have an integer dtype, got torch.float32.",
    ),
    (
        lambda: ragged.from_lengths(V, [7, -1]),
        ValueError,
        "ragged.from_lengths: `lengths` must be non-negative, got lengths[1] = -1.",
    ),
    (
        lambda: ragged.from_lengths(V, torch.tensor([7, -1])),
        ValueError,
        "ragged.from_lengths: `lengths` must be non-negative, got lengths[1] = -1.",
    ),
    (
        lambda: ragged.from_lengths(V, [2, 3]),
        ValueError,
        "ragged.from_lengths: `lengths` must sum to values.shape[0] = 6, got sum 5.",
    ),
    (
        lambda: ragged.from_lengths(V, torch.tensor([2, 3])),
        ValueError,
        "ragged.from_lengths: `lengths` must sum to values.shape[0] = 6, got sum 5.",
    ),
    (
        lambda: ragged.from_lengths(V, [[3, 3]]),
        TypeError,
        "ragged.from_lengths: `lengths` must contain only ints, got [3, 3].",
    ),
    (
        lambda: ragged.from_lengths(V, torch.tensor([[3, 3]])),
        ValueError,
        "ragged.from_lengths: `lengths` must be 1-D, got shape (1, 2).",
    ),
    (
        lambda: ragged.from_lengths(torch.tensor(5.0), [1]),
        ValueError,
        "ragged.from_lengths: `values` must have at least 1 dim (one row per value), got a 0-dim tensor.",
    ),
    (
        lambda: ragged.from_lengths([1.0, 2.0], [2]),
        TypeError,
        "ragged.from_lengths: `values` must be a Tensor, got list.",
    ),
    (
        lambda: ragged.from_lengths(V, torch.tensor([6], device="meta")),
        ValueError,
        "ragged.from_lengths: `lengths` must be on the values' device cpu, got meta.",
    ),
    (
        lambda: ragged.array([torch.ones(2), torch.ones(2, device="meta")]),
        ValueError,
        "ragged.array: `data` must hold tensors on one device, got ['cpu', 'meta'].",
    ),
    (
        lambda: ragged.array([torch.ones(2), torch.ones(2, dtype=torch.float64)]),
        TypeError,
        "ragged.array: `data` must hold tensors of one dtype (or pass dtype=), got ['torch.float32', 'torch.float64'].",
    ),
    (
        lambda: ragged.array([torch.ones(2, 3), torch.ones(2, 4)]),
        ValueError,
        "ragged.array: `data` must hold segments with one inner shape, got inner shapes [(3,), (4,)].",
    ),
    (
        lambda: ragged.array([[1, 2], [[3]]]),
        ValueError,
        "ragged.array: `data` must be nested lists of one consistent depth, got depths [2, 3].",
    ),
    (
        lambda: ragged.array([[1, 2], 3]),
        ValueError,
        "ragged.array: `data` must hold one sequence of rows per segment, got data[1] = 3.",
    ),
    (
        lambda: ragged.array(torch.ones(2, 3)),
        TypeError,
        "ragged.array: `data` must be a list of segments (for a dense tensor use ragged.from_padded), got Tensor(shape=(2, 3), dtype=torch.float32).",
    ),
    (
        lambda: ragged.array([[[1, 2]], [[3]]], ragged_ndim=1),
        ValueError,
        "ragged.array: `data` must have rows of one shape below ragged axis 1 (pass a larger ragged_ndim), got row shapes [(1,), (2,)].",
    ),
    (
        lambda: ragged.array([[[1, 2]], [[3]]], ragged_ndim=3),
        ValueError,
        "ragged.array: `ragged_ndim` must be in [1, 2] for this data, got 3.",
    ),
    (
        lambda: ragged.array([[1.0], [2.0]], axes=("a", "a")),
        ValueError,
        "ragged.array: `axes` must be unique names, got ['a', 'a'].",
    ),
    (
        lambda: ragged.array([[1.0], [2.0]], axes=("a", "b", "c")),
        ValueError,
        "ragged.array: `axes` must name all 2 axes, got 3 names ['a', 'b', 'c'].",
    ),
    (
        lambda: ragged.array([[1.0], [2.0]], axes="ab"),
        TypeError,
        "ragged.array: `axes` must be a sequence of 2 str or None, got 'ab'.",
    ),
    (
        lambda: ragged.array([[1.0], [2.0]], axes=("a", 1)),
        TypeError,
        "ragged.array: `axes` must contain only str, got ['a', 1].",
    ),
    (
        lambda: ragged.from_segment_ids(V, [0, 0, 1, 0, 1, 1], 2),
        ValueError,
        "ragged.from_segment_ids: `segment_ids` must be sorted (non-decreasing), got segment_ids[3] = 0 < segment_ids[2] = 1.",
    ),
    (
        lambda: ragged.from_segment_ids(V, [0, 0, 1, 1, 1, 3], 3),
        ValueError,
        "ragged.from_segment_ids: `segment_ids` must be in [0, 3), got id 3.",
    ),
    (
        lambda: ragged.from_segment_ids(V, [0, 0], 3),
        ValueError,
        "ragged.from_segment_ids: `segment_ids` must have one id per row of values (6), got 2 ids.",
    ),
    (
        lambda: ragged.from_segment_ids(V, [0] * 6, -1),
        ValueError,
        "ragged.from_segment_ids: `num_segments` must be non-negative, got -1.",
    ),
    (
        lambda: ragged.from_padded(torch.ones(2, 3), [1, 4]),
        ValueError,
        "ragged.from_padded: `lengths` must be in [0, 3], got min 1, max 4.",
    ),
    (
        lambda: ragged.from_padded(torch.ones(2, 3), mask=torch.ones(2, 3)),
        TypeError,
        "ragged.from_padded: `mask` must be a bool Tensor, got Tensor(shape=(2, 3), dtype=torch.float32).",
    ),
    (
        lambda: ragged.from_padded(
            torch.ones(2, 3), mask=torch.tensor([[1, 1, 0], [0, 1, 0]]).bool()
        ),
        ValueError,
        "ragged.from_padded: `mask` must be left-aligned (True on a prefix of each row), got row 1 = [False, True, False].",
    ),
    (
        lambda: ragged.from_padded(torch.ones(2, 3), [1, 1], mask=torch.ones(2, 3).bool()),
        TypeError,
        "ragged.from_padded: pass `lengths` or `mask`, not both.",
    ),
    (
        lambda: ragged.from_padded(torch.ones(3), [1]),
        ValueError,
        "ragged.from_padded: `padded` must have at least 2 dims (B, L, ...), got (3,).",
    ),
    (
        lambda: ragged.from_nested(torch.ones(2)),
        TypeError,
        "ragged.from_nested: `nt` must be a torch.nested tensor with layout=torch.jagged, got Tensor(shape=(2,), dtype=torch.float32).",
    ),
]


@pytest.mark.parametrize(("make", "error", "message"), BAD, ids=[m for _, _, m in BAD])
def test_bad_input(make, error, message):
    with pytest.raises(error, match=re.escape(message) + "$"):
        make()
