"""RaggedArray properties, functional updates, indexing along the batch axis and repr."""

import re

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

import ragged
from tests.strategies import ragged_arrays


def test_properties():
    x = ragged.from_lengths(torch.arange(10.0).reshape(5, 2), [2, 0, 3], axes=("b", "l", "d"))
    assert x.num_segments == len(x) == 3
    assert x.lengths.tolist() == [2, 0, 3]
    assert x.offsets.tolist() == [0, 2, 2, 5]
    assert x.ndim == 3 and x.ragged_ndim == 1
    assert x.dtype == torch.float32 and x.device.type == "cpu"
    assert x.axes == ("b", "l", "d")
    assert x.shape[0] == 3 and x.shape[2] == 2 and x.shape[1].lengths.tolist() == [2, 0, 3]
    assert x.shape == ragged.array([[[0, 0]] * 2, [], [[0, 0]] * 3]).shape
    assert repr(x.shape) == "RaggedShape(3, [2, 0, 3], 2)"
    assert x.shape.to_list() == [3, [2, 0, 3], 2]
    assert next(iter(x.shape)) == 3


def test_bool_is_ambiguous():
    with pytest.raises(TypeError, match="truth value"):
        bool(ragged.array([[1]]))


def test_with_values_keeps_partition_and_checks():
    x = ragged.array([[1.0, 2.0], [3.0]], axes=("b", "l"))
    y = x.with_values(x.values * 2)
    assert y.partition is x.partition and y.axes == x.axes
    z = x.with_values(x.values[:, None].expand(3, 4), axes=("b", "l", "d"))
    assert z.shape.to_list() == [2, [2, 1], 4]
    with pytest.raises(ValueError, match=re.escape("`values` must have shape [3, ...]")):
        x.with_values(torch.zeros(4))
    with pytest.raises(TypeError, match="must be given when the number of axes changes"):
        x.with_values(torch.zeros(3, 2))


def test_functional_conversions_do_not_mutate():
    values = torch.arange(3.0)
    x = ragged.from_lengths(values, [2, 1])
    assert x.to(torch.float64).dtype == torch.float64
    assert x.to(torch.float64).partition is x.partition
    c = x.clone()
    assert c.values.data_ptr() != x.values.data_ptr() and c.partition is x.partition
    g = x.with_values(values.clone().requires_grad_()).detach()
    assert not g.requires_grad
    nc = ragged.from_lengths(torch.arange(6.0).reshape(3, 2)[:, 0], [2, 1])
    assert not nc.values.is_contiguous() and nc.contiguous().values.is_contiguous()
    assert values.tolist() == [0.0, 1.0, 2.0]
    meta = x.to("meta")
    assert meta.device.type == "meta" and meta.offsets.device.type == "meta"


def test_rename():
    x = ragged.array([[[1.0]]], axes=("b", "l", "d"))
    assert x.rename(l="i").axes == ("b", "i", "d")
    assert x.rename("x", "y", "z").axes == ("x", "y", "z")
    assert x.rename(None).axes is None
    with pytest.raises(ValueError, match=re.escape("`mapping` must rename axes among")):
        x.rename(q="i")
    with pytest.raises(ValueError, match="must be unique names"):
        x.rename(l="b")


@given(ragged_arrays(min_segments=1), st.data())
def test_getitem_matches_segments(x, data):
    segments = x.unbind()
    b = data.draw(st.integers(-x.num_segments, x.num_segments - 1))
    torch.testing.assert_close(x[b], segments[b])
    i = data.draw(st.integers(-x.num_segments - 1, x.num_segments + 1))
    j = data.draw(st.integers(-x.num_segments - 1, x.num_segments + 1))
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    picked = x[i:j:step]
    assert picked.to_list() == [s.tolist() for s in segments[i:j:step]]
    idx = data.draw(st.lists(st.integers(-x.num_segments, x.num_segments - 1), max_size=5))
    picked = x[torch.tensor(idx, dtype=torch.int64)]
    assert picked.to_list() == [segments[k].tolist() for k in idx]
    assert x[idx].to_list() == picked.to_list()
    mask = data.draw(st.lists(st.booleans(), min_size=x.num_segments, max_size=x.num_segments))
    picked = x[torch.tensor(mask, dtype=torch.bool)]
    assert picked.to_list() == [s.tolist() for s, keep in zip(segments, mask, strict=True) if keep]
    assert picked.partition.levels[0].max_length == max(
        (len(s) for s, keep in zip(segments, mask, strict=True) if keep), default=0
    )


def test_getitem_errors():
    x = ragged.array([[1.0], [2.0]])
    with pytest.raises(IndexError, match="index 2 is out of range for 2 segments"):
        x[2]
    with pytest.raises(IndexError, match="index out of range for 2 segments"):
        x[torch.tensor([0, 5])]
    with pytest.raises(TypeError, match="must be an integer or boolean tensor"):
        x[torch.tensor([0.0])]
    with pytest.raises(ValueError, match=re.escape("must have shape (2,) as a boolean mask")):
        x[torch.tensor([True])]
    with pytest.raises(TypeError, match="must be an int, slice, int/bool tensor or tuple"):
        x["a"]


def test_getitem_slice_is_a_view():
    x = ragged.array([[1.0, 2.0], [3.0], [4.0, 5.0]])
    y = x[1:]
    assert y.values.data_ptr() == x.values[2:].data_ptr()
    assert y.segment_ids.tolist() == [0, 1, 1]


def test_iteration():
    x = ragged.array([[1, 2], [], [3]])
    assert [t.tolist() for t in x] == [[1, 2], [], [3]]


def test_repr():
    x = ragged.array([[1.0, 2.0], [], [3.0]])
    assert repr(x) == (
        "RaggedArray([[1., 2.],\n             [],\n             [3.]], shape=(3, [2, 0, 1]))"
    )
    y = ragged.array([[1.0]], dtype=torch.float64, axes=("b", "l"))
    assert repr(y) == "RaggedArray([[1.]], shape=(1, [1]), dtype=torch.float64, axes=('b', 'l'))"
    z = ragged.from_lengths(torch.zeros(2, requires_grad=True), [2])
    assert repr(z).endswith("requires_grad=True)")
    long = ragged.from_lengths(torch.arange(20), [2] * 10)
    assert repr(long).count("\n") == 6 and "..." in repr(long)
    assert repr(ragged.array([[1.0]]).to("meta")) == "RaggedArray(shape=(1, L*), device='meta')"


def test_pin_memory_maps_every_tensor(monkeypatch):
    # Pinning needs an accelerator; check the plumbing with a stand-in that records calls.
    seen = []

    def fake_pin(self):
        seen.append(self.shape)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    x = ragged.array([[1.0, 2.0], [3.0]])
    z = ragged.outer(x, x)
    pinned = torch.utils.data._utils.pin_memory.pin_memory({"z": z})["z"]
    assert isinstance(pinned, ragged.RaggedArray)
    assert pinned.to_list() == z.to_list()
    assert pinned.partition.levels[1].columns is pinned.partition.levels[0]
    assert len(seen) == 7  # values + 3 tensors for each of the two levels
