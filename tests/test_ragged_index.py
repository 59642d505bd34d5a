"""``torch.arange`` of a ragged size (``ragged.RaggedIndex``) and the slices of known size that a
model's mask code needs: against per-segment references, their errors, and one compiled graph.
"""

from __future__ import annotations

import operator
import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import ragged
import ragged.testing
from ragged import RaggedArray, RaggedIndex
from tests.strategies import lengths, ragged_arrays


def _positions(lens: list[int]) -> RaggedArray:
    return ragged.from_lengths(
        torch.cat([torch.arange(n) for n in lens] or [torch.zeros(0)]).long(), lens
    )


@given(lengths())
def test_arange_is_every_segments_positions(lens):
    x = ragged.from_lengths(torch.zeros(sum(lens), 2), lens)
    i = torch.arange(x.shape[1])
    assert isinstance(i, RaggedIndex) and i.shape == (x.shape[1],)
    assert i.values.tolist() == [p for n in lens for p in range(n)]
    assert torch.arange(0, x.shape[1], dtype=torch.int32).values.dtype == torch.int32
    assert (i + 2).values.tolist() == [p + 2 for n in lens for p in range(n)]
    assert (3 - i).values.tolist() == [3 - p for n in lens for p in range(n)]


PAIR_OPS = [operator.le, operator.lt, operator.ge, operator.eq, operator.sub]


@given(lengths(), st.sampled_from(PAIR_OPS))
def test_two_layouts_broadcast_into_the_pair_map(lens, op):
    """``op(i[None, :, None], j[None, None, :])`` is ``op(q, k)`` for every pair of one segment
    (``(B, L*, L*)``); in four axes the pair map is ``(B, 1, L*, L*)``; swapped operands swap."""
    x = ragged.from_lengths(torch.zeros(sum(lens), 2), lens)
    i = torch.arange(x.shape[1])
    pairs = op(i[None, :, None], i[None, None, :])
    swapped = op(i[None, None, :], i[None, :, None])
    four = op(i[None, None, :, None], i[None, None, None, :] + 1)  # (B, 1, L*, L*)
    shifted = op(i[None, :, None], i[None, None, :] + 1)
    assert four.shape[:2] == (len(lens), 1) and four.order == (3, 1, 2)
    torch.testing.assert_close(four.values[:, 0], shifted.values)
    for b, n in enumerate(lens):
        q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
        assert pairs.to_list()[b] == op(q, k).tolist()
        assert swapped.to_list()[b] == op(k, q).tolist()
        assert shifted.to_list()[b] == op(q, k + 1).tolist()


@given(lengths(), st.sampled_from([operator.and_, operator.lt, operator.sub]))
def test_an_index_against_a_pair_map_broadcasts(lens, op):
    """``(1, 1, T, 1)`` or ``(1, 1, 1, T)`` against the pair map ``(B, 1, L*, L*)`` of the same
    positions (HF's bidirectional mask on packed positions, transformers >= 5.25), and a 0-d
    tensor on the left (HF's ``and_masks`` seed)."""
    x = ragged.from_lengths(torch.zeros(sum(lens), 2), lens)
    i = torch.arange(x.shape[1])
    q, k = i[None, None, :, None], i[None, None, None, :]
    pairs = (q + 1) * 10 + k  # (B, 1, L*, L*): 10 (q + 1) + k
    for index, along in ((q, 0), (k, 1)):
        got = op(index, pairs)
        flipped = op(pairs, index)
        assert got.shape == pairs.shape and got.order == (3, 1, 2)
        offset = 0
        for n in lens:
            grid = (torch.arange(n)[:, None] + 1) * 10 + torch.arange(n)[None, :]
            idx = (
                torch.arange(n)[:, None].expand(n, n)
                if along == 0
                else torch.arange(n)[None, :].expand(n, n)
            )
            torch.testing.assert_close(
                got.values[offset : offset + n * n, 0], op(idx, grid).reshape(-1)
            )
            torch.testing.assert_close(
                flipped.values[offset : offset + n * n, 0], op(grid, idx).reshape(-1)
            )
            offset += n * n
    seed = torch.ones((), dtype=torch.bool) & (q >= 0)
    assert isinstance(seed, RaggedIndex) and seed.values.all()
    other = torch.arange(ragged.array([[1.0], [2.0, 3.0]]).shape[1])
    with pytest.raises(ValueError, match="built from indexes of the same ragged size"):
        _ = other[None, None, :, None] & pairs
    with pytest.raises(TypeError, match=r"torch.where: got a RaggedIndex"):
        torch.where(q >= 0, 1, 0)


@given(ragged_arrays(inner=(), dtype=torch.int64), st.booleans())
def test_rows_read_at_the_positions(x, batch_index):
    """``x[b, i]``: HF's ``position_ids[batch_idx, q_idx]`` (``b = arange(B)[:, None, None,
    None]`` or ``:``); the result keeps the index's layout."""
    i = torch.arange(x.shape[1])[None, None, :, None]
    b = torch.arange(x.shape[0])[:, None, None, None] if batch_index else slice(None)
    got = x[b, i]
    assert isinstance(got, RaggedIndex) and (got.ndim, got.axis) == (4, 2)
    torch.testing.assert_close(got.values, x.values)


def test_rows_of_another_segment_and_positions_past_a_row():
    x = ragged.array([[10, 11, 12], [20], [30, 31]])
    i = torch.arange(x.shape[1])[None, :]
    got = x[torch.tensor([0, 0, 0])[:, None], i]  # every segment reads row 0 at its positions
    assert got.values.tolist() == [10, 11, 12, 10, 10, 11]
    with pytest.raises(ValueError, match="positions inside the rows they read"):
        x[torch.tensor([1, 0, 0])[:, None], i]  # segment 0 reads three rows of a row of one


@given(lengths())
def test_unsqueeze_0_gives_the_positions_array(lens):
    """``torch.arange(T).unsqueeze(0)`` (HF Llama's default ``position_ids``) is the ``(B, L*)``
    array of every segment's positions, on the partition of ``T``."""
    x = ragged.from_lengths(torch.zeros(sum(lens), 2), lens)
    p = torch.arange(x.shape[1]).unsqueeze(0)
    assert isinstance(p, RaggedArray) and p.partition is x.partition
    assert p.to_list() == [list(range(n)) for n in lens]
    with pytest.raises(ValueError, match=r"RaggedIndex.unsqueeze: `dim` must be 0"):
        torch.arange(x.shape[1]).unsqueeze(1)


def test_hf_causal_and_packed_mask_in_one_graph():
    """HF ``sdpa_mask`` on packed positions, as ``LlamaModel`` runs it under compile: the packed
    check (``position_ids[:, :1]``, ``torch.diff``, ``cumsum``), positions read at the aranges,
    the causal pair map, SDPA with it as ``attn_mask``: equal to causal SDPA, one graph."""

    def attend(q: RaggedArray) -> RaggedArray:  # q: (B, L*, H, D) -> heads first
        heads = q.transpose(1, 2)
        position_ids = q.new_ones(q.shape[:2], dtype=torch.long).cumsum(1) - 1
        first = position_ids[:, :1] - 1
        packed = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
        B, T = q.shape[0], q.shape[1]
        b = torch.arange(B)[:, None, None, None]
        qi, ki = torch.arange(T)[None, None, :, None], torch.arange(T)[None, None, None, :]
        mask = qi.new_ones((), dtype=torch.bool)  # HF's and_masks starts so
        mask = mask & (position_ids[b, ki] <= position_ids[b, qi])
        mask = mask & (packed[b, qi] == packed[b, ki])
        mask = mask.expand(B, -1, T, T)
        out = F.scaled_dot_product_attention(heads, heads, heads, attn_mask=mask)
        return out.transpose(1, 2)

    batches = [
        (ragged.array([torch.randn(n, 2, 4) for n in lens]),)
        for lens in ([3, 1, 4], [2, 5], [1, 2, 6, 3, 2])
    ]
    for (q,) in batches:
        heads = q.transpose(1, 2)
        causal = F.scaled_dot_product_attention(heads, heads, heads, is_causal=True)
        torch.testing.assert_close(attend(q).values, causal.transpose(1, 2).values)
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(attend, batches, backend="aot_eager")
    assert report.graphs == 1


def test_sdpa_takes_a_heads_first_pair_mask():
    q = ragged.array([torch.randn(n, 2, 4, dtype=torch.float64) for n in (3, 1, 4)]).transpose(1, 2)
    i = torch.arange(q.shape[2])
    causal = i[None, None, :, None] >= i[None, None, None, :]  # (B, 1, L*, L*)
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=causal.expand(3, 1, *q.shape[2:3] * 2))
    expected = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out.values, expected.values)
    additive = torch.zeros((), dtype=torch.float64) + (
        i[None, None, :, None] - i[None, None, None, :]
    )
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=additive * 0.1)
    for b, s in enumerate(q.transpose(1, 2).unbind()):
        h = s.transpose(0, 1)  # (H, L, D)
        n = h.shape[1]
        bias = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).double() * 0.1
        ref = F.scaled_dot_product_attention(h, h, h, attn_mask=bias)
        torch.testing.assert_close(out.transpose(1, 2).unbind()[b], ref.transpose(0, 1))


def test_new_axes_on_the_heads_first_layout():
    """HF's ``repeat_kv``: ``k[:, :, None, :, :].expand(...).reshape(...)`` on ``(B, H, L*, D)``."""
    k = ragged.array([torch.randn(n, 2, 3) for n in (2, 0, 3)]).transpose(1, 2)
    B, H, T, D = k.shape
    got = k[:, :, None, :, :].expand(B, H, 2, T, D).reshape(B, H * 2, T, D)
    for s, g in zip(k.unbind(), got.unbind(), strict=True):
        torch.testing.assert_close(
            g, s[:, None].expand(H, 2, *s.shape[1:]).reshape(H * 2, *s.shape[1:])
        )
    assert k[..., None].shape == (B, H, T, D, 1)


@given(lengths(allow_empty=False, min_segments=1), st.sampled_from([":1", "-1:", "1:", ":-1"]))
def test_slices_of_known_size_read_nothing(lens, spelling):
    """With no empty segment the four slices know their size: the partition records it."""
    x = _positions(lens)
    start, stop = (int(v) if v else None for v in spelling.split(":"))
    assert x.partition.levels[0].nonempty
    y = x[:, start:stop]
    assert y.to_list() == [list(range(n))[start:stop] for n in lens]
    assert y.partition.levels[0].max_length == max(len(list(range(n))[start:stop]) for n in lens)
    if spelling in (":1", "-1:"):  # one row each: a unit level (or x itself, rows of one)
        assert y.partition.levels[0].unit or y is x


def test_an_empty_segment_compiles_a_second_graph():
    """The flag is static: compiled code that reads it guards on it. Batches with and without an
    empty segment take two graphs, and both give the per-segment results."""
    batches = [(_positions(lens),) for lens in ([3, 1, 4], [2, 0, 5], [1, 2, 6])]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            lambda p: p[:, 1:] * 2, batches, backend="eager", max_graphs=2, allow_unbacked=True
        )
    assert report.graphs == 2


def test_slices_of_known_size_on_the_innermost_axis_of_two_levels():
    m = ragged.array([[[1, 2], [3]], [[4, 5, 6]]])
    assert m.partition.levels[1].nonempty
    assert m[:, :, 1:].to_list() == [[[2], []], [[5, 6]]]
    assert m[:, :, -1:].to_list() == [[[2], [3]], [[6]]]
    with pytest.raises(ValueError, match="ragged structure"):
        m - m[:, :, :1]  # one entry of every row is no size-1 axis: no broadcasting


def test_concat_with_a_unit_level_keeps_exact_sizes():
    for lens in ([], [0], [2, 0, 3]):
        x = _positions(lens)
        c = ragged.concat([x[:, None], x[:, None]], axis=1)
        assert pickle.loads(pickle.dumps(c)).to_list() == c.to_list()
        assert c.partition.levels[0].max_length == (2 if lens else 0)
    x = _positions([2, 1, 3])
    d = ragged.concat([x[:, :1] - 1, x], axis=1)
    assert d.partition.levels[0].nonempty and d.partition.levels[0].max_length == 4
    assert pickle.loads(pickle.dumps(d)).to_list() == d.to_list()


def test_the_nonempty_flag():
    assert ragged.array([[1], [2, 3]]).partition.levels[0].nonempty
    assert not ragged.array([[1], []]).partition.levels[0].nonempty
    assert ragged.from_lengths(torch.zeros(3), [1, 2]).partition.levels[0].nonempty
    assert (
        not ragged.from_lengths(torch.zeros(3), torch.tensor([1, 2])).partition.levels[0].nonempty
    )
    x = ragged.array([[1], [2, 3]])
    assert pickle.loads(pickle.dumps(x)).partition.levels[0].nonempty
    empty_row = ragged.array([[1], []])
    forged = empty_row.partition.levels[0]
    object.__setattr__(forged, "nonempty", True)  # a file that claims no row is empty
    with pytest.raises(ValueError, match="nonempty"):
        pickle.loads(pickle.dumps(empty_row))


def test_errors_name_the_call():
    x = ragged.array([[1.0, 2.0], [3.0]])
    B, T = x.shape
    with pytest.raises(TypeError, match=r"torch.arange: `end` must be a ragged size"):
        torch.arange(1, T)
    with pytest.raises(TypeError, match=r"zeros: got a ragged size"):
        torch.zeros(B, T)
    i = torch.arange(T)
    with pytest.raises(TypeError, match=r"RaggedIndex.__getitem__: `index`"):
        i[1:]
    with pytest.raises(ValueError, match="next to this one's"):
        _ = i[:, None, None] <= i[None, None, :]
    with pytest.raises(ValueError, match="same ragged axis"):
        _ = i <= torch.arange(ragged.array([[1.0]]).shape[1])
    with pytest.raises(TypeError, match="a number, a 0-d tensor"):
        i + torch.ones(2)
    with pytest.raises(ValueError, match=r"new_ones: `size` must be \(\)"):
        i.new_ones((2,))
    with pytest.raises(TypeError, match=r"`requires_grad` is not taken"):
        torch.arange(T, requires_grad=True)
    with pytest.raises(TypeError, match=r"torch.Tensor.view: got a ragged size"):
        torch.zeros(2, 2).view(B, T)
    y = ragged.array([[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match=r"one-level array of 3 segments"):
        y[:, i[None, :]]  # the positions of a batch of 2
    with pytest.raises(ValueError, match=r"batch index of shape \(2, 1\)"):
        x[torch.arange(2)[:, None].expand(2, 2), i[None, :]]
