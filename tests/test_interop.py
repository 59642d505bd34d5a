"""Interop round trips (PackedSequence, HuggingFace, PyG, DanLing, torch.nested) with empty
segments and zero segments, agreement with the other library's own converters, gradients, and
clear errors."""

import importlib.util
import re

import hypothesis.strategies as st
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


# --- HuggingFace padding-free batches --------------------------------------------------------

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_PYG = importlib.util.find_spec("torch_geometric") is not None


@given(x=ragged_arrays(inner=(), dtype=torch.int64))
def test_hf_packed_round_trip(x):
    batch = ragged.to_hf_packed(x, return_seq_idx=True)
    total = x.values.shape[0]
    assert batch["input_ids"].shape == (1, total) and batch["input_ids"].dtype == torch.int64
    assert batch["position_ids"].tolist() == [x.partition.levels[0].positions().tolist()]
    assert batch["seq_idx"].dtype == torch.int32
    assert batch["seq_idx"][0].tolist() == x.segment_ids.tolist()
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["cu_seq_lens_q"].tolist() == x.offsets.tolist()
    assert batch["max_length_k"] == max(x.lengths.tolist(), default=0)
    assert_close(ragged.from_hf_packed(batch), x)  # empty sequences kept by cu_seq_lens
    by_positions = ragged.from_hf_packed({k: batch[k] for k in ("input_ids", "position_ids")})
    nonempty = [s for s in x.to_list() if s]
    assert by_positions.to_list() == nonempty  # empty sequences leave no trace in positions
    labels = ragged.from_hf_packed(batch, "labels").to_list()
    assert labels == [[-100, *s[1:]] if s else [] for s in x.to_list()]


def test_hf_packed_embeddings_labels_and_gradients():
    values = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    x = ragged.from_lengths(values, [2, 3])
    labels = x.with_values(torch.tensor([7, 8, 9, 10, 11]))
    batch = ragged.to_hf_packed(x, labels=labels, separator_id=-1, position_ids_start=2)
    assert "input_ids" not in batch and batch["inputs_embeds"].shape == (1, 5, 4)
    assert batch["labels"].tolist() == [[-1, 8, -1, 10, 11]]
    assert batch["position_ids"].tolist() == [[2, 3, 2, 3, 4]]
    assert_close(ragged.from_hf_packed(batch, "inputs_embeds"), x)
    batch["inputs_embeds"].sum().backward()
    torch.testing.assert_close(values.grad, torch.ones_like(values))
    assert "labels" not in ragged.to_hf_packed(x)


def test_hf_packed_errors():
    ids = ragged.array([[1, 2], [3]])
    with pytest.raises(ValueError, match=re.escape("`labels` must have the partition of `x`")):
        ragged.to_hf_packed(ids, labels=ragged.array([[1], [2, 3]]))
    with pytest.raises(ValueError, match=re.escape("`batch` must hold `input_ids` of shape")):
        ragged.from_hf_packed({"input_ids": torch.ones(3, dtype=torch.int64)})
    with pytest.raises(ValueError, match="must hold `cu_seq_lens_q` or `position_ids`"):
        ragged.from_hf_packed({"input_ids": torch.ones(1, 3, dtype=torch.int64)})


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.parametrize("with_labels", [False, True])
def test_hf_packed_equals_data_collator_with_flattening(with_labels):
    from transformers import DataCollatorWithFlattening

    gen = torch.Generator().manual_seed(0)
    features = []
    for n in (5, 1, 7, 3):
        row = {"input_ids": torch.randint(0, 1000, (n,), generator=gen).tolist()}
        if with_labels:
            row["labels"] = torch.randint(0, 1000, (n,), generator=gen).tolist()
        features.append(row)
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    expected = collator(features)
    batch = ragged.data.collate(features, ragged_keys=list(features[0]))  # lists of ints
    got = ragged.to_hf_packed(batch["input_ids"], labels=batch.get("labels"), return_seq_idx=True)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype, key
            torch.testing.assert_close(got[key], value, msg=key)
        else:
            assert got[key] == value, key
    assert ragged.from_hf_packed(expected).to_list() == [f["input_ids"] for f in features]


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


@pytest.mark.skipif(not HAS_PYG, reason="torch_geometric is not installed")
def test_pyg_batch_is_accepted_directly():
    from torch_geometric.data import Batch, Data

    no_edges = torch.zeros(2, 0, dtype=torch.int64)
    graphs = [
        Data(x=torch.randn(3, 2), pos=torch.randn(3, 3), edge_index=torch.tensor([[0, 1], [1, 2]])),
        Data(x=torch.randn(0, 2), pos=torch.randn(0, 3), edge_index=no_edges),
        Data(x=torch.randn(2, 2), pos=torch.randn(2, 3), edge_index=no_edges),
        Data(x=torch.randn(0, 2), pos=torch.randn(0, 3), edge_index=no_edges),  # trailing empty
    ]
    batch = Batch.from_data_list(graphs)
    x = ragged.from_pyg(batch)
    assert x.lengths.tolist() == [3, 0, 2, 0]
    assert x.to_list() == [g.x.tolist() for g in graphs]
    assert_close(x, ragged.from_pyg(batch.x, batch.batch, batch.num_graphs))
    assert ragged.from_pyg(batch, key="pos").to_list() == [g.pos.tolist() for g in graphs]
    with pytest.raises(ValueError, match="`key` must name a node attribute"):
        ragged.from_pyg(batch, key="edge_index")
    with pytest.raises(TypeError, match="pass a PyG Batch alone"):
        ragged.from_pyg(batch, batch.batch)


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


# --- awkward ----------------------------------------------------------------------------------

HAS_AWKWARD = importlib.util.find_spec("awkward") is not None
needs_awkward = pytest.mark.skipif(not HAS_AWKWARD, reason="awkward is not installed")


def _nested_lists(sizes, depth, inner, rng):
    """A batch of segments with ``depth`` var-length levels, then regular ``inner`` dims."""

    def leaf():
        out = rng.random()
        for size in reversed(inner):
            out = [out if isinstance(out, float) else list(out) for _ in range(size)]
        return out

    def level(d):
        return [level(d - 1) if d > 1 else leaf() for _ in range(rng.choice(sizes))]

    return [level(depth) for _ in range(rng.choice(sizes))]


@needs_awkward
@given(
    depth=st.integers(1, 3),
    inner=st.sampled_from([(), (2,), (2, 3)]),
    seed=st.integers(0, 2**31 - 1),
)
def test_awkward_round_trip_any_depth(depth, inner, seed):
    import random

    import awkward as ak

    lists = _nested_lists([0, 1, 2, 4], depth, inner, random.Random(seed))
    array = ak.Array(lists)
    if ak.count(array) and inner:  # regular inner dims, as awkward types (not all-empty lists)
        for dim in range(depth + 1, depth + 1 + len(inner)):
            array = ak.to_regular(array, axis=dim)
    x = ragged.from_awkward(array)
    assert x.ragged_ndim == max(1, str(array.type).count("var"))  # all-empty lists: less known
    assert x.ragged_ndim == depth or not ak.count(array)
    assert x.to_list() == array.tolist()
    assert ragged.array(array).to_list() == array.tolist()
    back = ragged.to_awkward(x)
    assert back.tolist() == array.tolist()
    assert str(back.type).count("var") == x.ragged_ndim
    assert_close(ragged.from_awkward(back), x)


@needs_awkward
def test_awkward_shares_memory_where_the_layout_allows():
    import awkward as ak
    import numpy as np

    array = ak.Array([[1.0, 2.0], [], [3.0, 4.0, 5.0]])
    x = ragged.from_awkward(array)
    layout = array.layout
    assert np.shares_memory(x.values.numpy(), layout.content.data)
    # The offsets are the array's own (as every factory's): awkward's buffer cannot change them.
    assert not np.shares_memory(x.partition.offsets.numpy(), layout.offsets.data)
    assert x.partition.levels[0].max_length == 3  # known statically: no read later
    # A slice: offsets not starting at 0 are shifted; the values are a view.
    tail = ragged.from_awkward(array[1:])
    assert tail.to_list() == [[], [3.0, 4.0, 5.0]]
    assert np.shares_memory(tail.values.numpy(), layout.content.data)
    # to_awkward shares the values of a CPU array and copies its offsets.
    y = ragged.from_lengths(torch.arange(6.0).view(3, 2), [2, 0, 1])
    back = ragged.to_awkward(y)
    assert np.shares_memory(back.layout.content.data, y.values.numpy())
    assert not np.shares_memory(back.layout.offsets.data, y.partition.offsets.numpy())
    assert str(back.type) == "3 * var * 2 * float32"


@needs_awkward
def test_awkward_layouts_list_array_int32_offsets_regular_options_and_indexed():
    import awkward as ak
    import numpy as np

    content = ak.contents.NumpyArray(np.arange(6.0))
    # ListArray with lists out of order: awkward gathers them.
    listed = ak.contents.ListArray(
        ak.index.Index64(np.array([4, 0, 2])), ak.index.Index64(np.array([6, 2, 2])), content
    )
    assert ragged.from_awkward(ak.Array(listed)).to_list() == [[4.0, 5.0], [0.0, 1.0], []]
    # ListArray back to back: offsets from starts and stops, values shared.
    contiguous = ak.contents.ListArray(
        ak.index.Index64(np.array([1, 3])), ak.index.Index64(np.array([3, 6])), content
    )
    x = ragged.from_awkward(ak.Array(contiguous))
    assert x.to_list() == [[1.0, 2.0], [3.0, 4.0, 5.0]]
    assert np.shares_memory(x.values.numpy(), content.data)
    # int32 and uint32 offsets.
    for index, kind in ((ak.index.Index32, np.int32), (ak.index.IndexU32, np.uint32)):
        layout = ak.contents.ListOffsetArray(index(np.array([0, 1, 1, 6], dtype=kind)), content)
        y = ragged.from_awkward(ak.Array(layout))
        assert y.lengths.tolist() == [1, 0, 5] and y.partition.offsets.dtype == torch.int64
    # A regular dimension above a var-length one becomes a ragged axis of equal lengths.
    regular = ak.contents.RegularArray(
        ak.contents.ListOffsetArray(ak.index.Index64(np.array([0, 2, 2, 3, 6])), content), 2
    )
    z = ragged.from_awkward(ak.Array(regular))
    assert z.lengths.tolist() == [2, 2] and z.partition.levels[1].lengths.tolist() == [2, 0, 1, 3]
    assert z.to_list() == ak.Array(regular).tolist()
    # An option type without missing values, an indexed array, a dense numpy array.
    options = ak.Array([[1.0, None], [2.0, 3.0]])  # missing values outside the slice only
    assert ragged.from_awkward(options[1:]).to_list() == [[2.0, 3.0]]
    assert ragged.from_awkward(ak.Array([[[1.0], None], [[2.0]]])[1:]).to_list() == [[[2.0]]]
    indexed = ak.Array(ak.contents.IndexedArray(ak.index.Index64(np.array([2, 0])), listed))
    assert ragged.from_awkward(indexed).to_list() == [[], [4.0, 5.0]]
    dense = ragged.from_awkward(ak.Array(np.arange(12.0).reshape(2, 3, 2)))
    assert dense.lengths.tolist() == [3, 3] and dense.values.shape == (6, 2)
    assert ragged.from_awkward(ak.Array(np.zeros((2, 3, 2))), ragged_ndim=2).ragged_ndim == 2
    # Empty: no segments, and segments that are all empty.
    assert ragged.from_awkward(ak.Array([])).num_segments == 0
    assert ragged.from_awkward(ak.Array([[], []])).lengths.tolist() == [0, 0]


@needs_awkward
def test_awkward_dtype_device_axes_and_gradient_detached():
    import awkward as ak

    x = ragged.array(ak.Array([[1, 2], [3]]), dtype=torch.float32, axes=("batch", "seq"))
    assert x.dtype == torch.float32 and x.axes == ("batch", "seq")
    w = ragged.from_lengths(torch.ones(3, requires_grad=True), [1, 2])
    assert ragged.to_awkward(w * 2).tolist() == [[2.0], [2.0, 2.0]]


@needs_awkward
@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda ak: ak.Array([[1.0, None]]), ValueError, "must have no missing values (None)"),
        (lambda ak: ak.Array([{"a": 1}]), TypeError, "must be var-length or regular lists"),
        (lambda ak: ak.Array(["ab", "c"]), TypeError, "must hold numbers, not strings"),
        (lambda ak: ak.Array([1.0, 2.0]), ValueError, "must have at least one list dimension"),
        (lambda ak: ak.Array([[[1.0]]]), ValueError, "must be at least the var-length depth"),
        (lambda ak: [[1.0]], TypeError, "must be an awkward Array, got list."),
    ],
)
def test_awkward_errors(make, error, message):
    import awkward as ak

    kwargs = {"ragged_ndim": 1} if "depth" in message else {}
    with pytest.raises(
        error,
        match=re.escape(f"ragged.from_awkward: `{'ragged_ndim' if kwargs else 'array'}` {message}"),
    ):
        ragged.from_awkward(make(ak), **kwargs)
    bf16 = ragged.from_lengths(torch.ones(2, dtype=torch.bfloat16), [2])
    with pytest.raises(
        TypeError, match=re.escape("ragged.to_awkward: `x` must have a dtype numpy has")
    ):
        ragged.to_awkward(bf16)
