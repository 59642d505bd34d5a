"""Interop round trips (PackedSequence, HuggingFace, PyG, DanLing, torch.nested) with empty
segments and zero segments, agreement with the other library's own converters, gradients, and
clear errors."""

import importlib.util
import re

import pytest
import torch
from hypothesis import given
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

import ragged
from ragged.testing import assert_close
from tests.strategies import ragged_arrays

HAS_DANLING = importlib.util.find_spec("danling") is not None


# --- PackedSequence ---------------------------------------------------------------------------


@given(ragged_arrays(inner=(2,), min_segments=1, allow_empty=False))
def test_packed_sequence_round_trip_and_agreement_with_torch(x):
    ps = ragged.to_packed_sequence(x)
    assert ps.batch_sizes.device.type == "cpu"
    assert_close(ragged.from_packed_sequence(ps), x)
    # torch's own reader agrees: pad_packed_sequence restores the original order.
    padded, lengths = pad_packed_sequence(ps, batch_first=True)
    torch.testing.assert_close(padded, x.to_padded())
    assert lengths.tolist() == x.lengths.tolist()
    # ...and so does torch's packer (up to its unstable ordering of equal lengths).
    ours = ragged.from_packed_sequence(pack_sequence(list(x.unbind()), enforce_sorted=False))
    assert_close(ours, x)


def test_packed_sequence_feeds_an_lstm():
    torch.manual_seed(0)
    x = ragged.array([torch.randn(n, 3) for n in [2, 5, 1, 5]])
    lstm = torch.nn.LSTM(3, 4)
    out, (h, _) = lstm(ragged.to_packed_sequence(x))
    out = ragged.from_packed_sequence(out)
    for b, segment in enumerate(x.unbind()):
        expected, (h_b, _) = lstm(segment[:, None])
        torch.testing.assert_close(out[b], expected[:, 0])
        torch.testing.assert_close(h[0, b], h_b[0, 0])


def test_packed_sequence_from_enforce_sorted_and_gradients():
    x = ragged.array([[3.0, 2.0, 1.0], [5.0, 4.0], [6.0]])
    ps = ragged.to_packed_sequence(x, enforce_sorted=True)
    assert ps.sorted_indices is None
    assert_close(ragged.from_packed_sequence(ps), x)
    values = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)

    def round_trip(v):
        y = ragged.from_lengths(v, [1, 3, 2])
        return ragged.from_packed_sequence(ragged.to_packed_sequence(y)).values * 2

    assert torch.autograd.gradcheck(round_trip, (values,))


@pytest.mark.parametrize(
    ("x", "kwargs", "message"),
    [
        (
            ragged.array([[1.0], [], [2.0]]),
            {},
            "ragged.to_packed_sequence: `x` must have no empty segment (PackedSequence cannot "
            "hold one), got lengths[1] = 0.",
        ),
        (
            ragged.from_lengths(torch.zeros(0), []),
            {},
            "ragged.to_packed_sequence: `x` must have at least one segment for a PackedSequence, "
            "got 0 segments.",
        ),
        (
            ragged.array([[1.0], [2.0, 3.0]]),
            {"enforce_sorted": True},
            "ragged.to_packed_sequence: `x` must have lengths in decreasing order with "
            "enforce_sorted=True, got lengths [1, 2].",
        ),
    ],
)
def test_packed_sequence_errors(x, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ragged.to_packed_sequence(x, **kwargs)


# --- HuggingFace ------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
@given(x=ragged_arrays(inner=()))
def test_hf_round_trip(side, x):
    padded, mask = ragged.to_hf(x, pad_id=-1, padding_side=side)
    assert mask.dtype == torch.int64
    for b, segment in enumerate(x.unbind()):
        n, width = segment.shape[0], padded.shape[1]
        real = slice(0, n) if side == "right" else slice(width - n, width)
        torch.testing.assert_close(padded[b, real], segment)
        assert mask[b].sum() == n and bool(mask[b, real].all())
        assert bool((padded[b][mask[b] == 0] == -1).all())
    back = ragged.from_hf(padded, mask, padding_side=side)
    assert_close(back, x)
    assert back.partition.levels[0].max_length == x.partition.max_length()
    assert_close(ragged.from_hf(padded, mask.bool(), padding_side=side), x)


def test_hf_embeddings_and_truncation():
    x = ragged.from_lengths(torch.arange(12.0).reshape(6, 2), [1, 4, 1])
    padded, mask = ragged.to_hf(x, length=2)
    assert padded.shape == (3, 2, 2)
    assert padded[1].tolist() == [[2.0, 3.0], [4.0, 5.0]]  # right: keeps the first tokens
    left, left_mask = ragged.to_hf(x, length=2, padding_side="left")
    assert left[1].tolist() == [[6.0, 7.0], [8.0, 9.0]]  # left: keeps the last tokens
    assert left_mask.tolist() == [[0, 1], [1, 1], [0, 1]]
    assert mask.tolist() == [[1, 0], [1, 1], [1, 0]]


def test_hf_gradients():
    values = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def round_trip(v):
        padded, mask = ragged.to_hf(ragged.from_lengths(v, [2, 0, 3]), padding_side="left")
        return ragged.from_hf(padded * 3, mask, padding_side="left").values

    assert torch.autograd.gradcheck(round_trip, (values,))


@pytest.mark.parametrize(
    ("mask", "side", "message"),
    [
        (
            [[1, 1, 0], [0, 1, 1]],
            "right",
            "ragged.from_hf: `attention_mask` must be right-padded (ones on a prefix of each row; "
            'pass padding_side="left" for left padding), got row 1 = [0, 1, 1].',
        ),
        (
            [[1, 1, 0], [0, 1, 1]],
            "left",
            "ragged.from_hf: `attention_mask` must be left-padded (ones on a suffix of each row; "
            'pass padding_side="right" for right padding), got row 0 = [1, 1, 0].',
        ),
        (
            [[1, 2, 0], [1, 0, 0]],
            "right",
            "ragged.from_hf: `attention_mask` must hold only 0 and 1, got other values.",
        ),
    ],
)
def test_hf_errors(mask, side, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ragged.from_hf(torch.zeros(2, 3), torch.tensor(mask), padding_side=side)


def test_hf_bad_side():
    with pytest.raises(ValueError, match=re.escape('`padding_side` must be "right" or "left"')):
        ragged.to_hf(ragged.array([[1]]), padding_side="top")


# --- PyG --------------------------------------------------------------------------------------


@given(x=ragged_arrays(inner=(2,)))
def test_pyg_round_trip(x):
    values, batch = ragged.to_pyg(x)
    assert values is x.values
    assert_close(ragged.from_pyg(values, batch, x.num_segments), x)
    inferred = ragged.from_pyg(values, batch)  # reads batch[-1] + 1: trailing empties are lost
    last = max((b for b, n in enumerate(x.lengths.tolist()) if n), default=-1)
    assert inferred.num_segments == last + 1
    assert inferred.lengths.tolist() == x.lengths.tolist()[: last + 1]


def test_pyg_errors():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "ragged.from_pyg: `batch` must be sorted (non-decreasing), got batch[1] = 0 < "
            "batch[0] = 1."
        ),
    ):
        ragged.from_pyg(torch.zeros(2), torch.tensor([1, 0]))
    with pytest.raises(
        ValueError, match=re.escape("ragged.from_pyg: `batch` must be in [0, 2), got id 3.")
    ):
        ragged.from_pyg(torch.zeros(2), torch.tensor([0, 3]), num_graphs=2)


# --- torch.nested -----------------------------------------------------------------------------


@given(x=ragged_arrays(inner=(2,)))
def test_nested_round_trip(x):
    assert_close(ragged.from_nested(x.to_nested()), x)


# --- DanLing ----------------------------------------------------------------------------------

danling_only = pytest.mark.skipif(
    not HAS_DANLING, reason="danling is not installed (pip install torch-ragged[danling])"
)


@danling_only
@given(x=ragged_arrays(inner=(2,)))
def test_danling_round_trip(x):
    from danling import NestedTensor

    nt = ragged.to_danling(x)
    assert isinstance(nt, NestedTensor)
    if x.num_segments:
        torch.testing.assert_close(nt.tensor, x.to_padded())
    back = ragged.from_danling(nt)
    assert_close(back, x)
    assert back.partition.levels[0].max_length == x.partition.max_length()


@danling_only
def test_danling_from_its_own_constructor_and_gradients():
    from danling import NestedTensor

    nt = NestedTensor(torch.ones(2, 3), torch.zeros(0, 3), torch.arange(12.0).reshape(4, 3))
    x = ragged.from_danling(nt)
    assert x.lengths.tolist() == [2, 0, 4]
    assert x.to_list()[2] == torch.arange(12.0).reshape(4, 3).tolist()
    values = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    nt = ragged.to_danling(ragged.from_lengths(values, [3, 2]))
    ragged.from_danling(nt).values.sum().backward()
    torch.testing.assert_close(values.grad, torch.ones_like(values))


@danling_only
def test_danling_errors():
    from danling import NestedTensor

    with pytest.raises(
        ValueError,
        match=re.escape("ragged.from_danling: `nt` must be ragged in its first element dim only"),
    ):
        ragged.from_danling(NestedTensor(torch.ones(2, 3), torch.ones(1, 2)))
    with pytest.raises(TypeError, match=re.escape("ragged.from_danling: `nt` must be a danling")):
        ragged.from_danling(torch.ones(2))


@pytest.mark.parametrize(
    "convert", [ragged.to_packed_sequence, ragged.to_hf, ragged.to_pyg], ids=lambda f: f.__name__
)
def test_converters_reject_non_ragged(convert):
    with pytest.raises(TypeError, match="`x` must be a RaggedArray"):
        convert(torch.ones(2, 2))


def test_interop_names_are_exported_at_the_top_level():
    from ragged import interop

    for name in interop.__all__:
        assert name in ragged.__all__
        assert getattr(ragged, name) is getattr(interop, name)
