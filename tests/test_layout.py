"""Layouts (the ragged axis anywhere after the batch axis) and shapes (RaggedShape, RaggedSize).

Every result is compared with the same torch call on each segment (``x.unbind()``: the dense
segments, in the logical order of the axes).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ragged
import ragged.testing
from ragged._shape import RaggedSize

LENGTHS = [5, 1, 0, 3]


def make(*inner: int, lengths: list[int] = LENGTHS, seed: int = 0) -> ragged.RaggedArray:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(sum(lengths), *inner, generator=gen, dtype=torch.float64)
    return ragged.from_lengths(values, lengths)


def per_segment(out: ragged.RaggedArray, x: ragged.RaggedArray, fn: Any) -> None:
    """``out`` is ``fn`` applied to each segment of ``x`` (``fn`` sees a segment's axes, the
    batch axis removed, and ``d + 1`` in ``x``'s dims is ``d`` in the segment's)."""
    got = out.unbind()
    want = [fn(s) for s in x.unbind()]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("call", "segment_call"),
    [
        (lambda x: x.transpose(1, 2), lambda s: s.transpose(0, 1)),
        (lambda x: x.transpose(-1, 1), lambda s: s.transpose(-1, 0)),
        (lambda x: torch.transpose(x, 2, 1), lambda s: s.transpose(1, 0)),
        (lambda x: x.swapaxes(1, 3), lambda s: s.swapaxes(0, 2)),
        (lambda x: x.permute(0, 2, 3, 1), lambda s: s.permute(1, 2, 0)),
        (lambda x: torch.permute(x, (0, 3, 1, 2)), lambda s: s.permute(2, 0, 1)),
        (lambda x: x.movedim(1, -1), lambda s: s.movedim(0, -1)),
        (lambda x: torch.moveaxis(x, (1, 2), (3, 1)), lambda s: s.movedim((0, 1), (2, 0))),
    ],
)
def test_permutes_share_storage_and_match_segments(call: Any, segment_call: Any) -> None:
    x = make(2, 3)
    y = call(x)
    assert y.values.data_ptr() == x.values.data_ptr()  # no copy
    assert y.partition is x.partition
    per_segment(y, x, segment_call)
    # back to the storage order: the same array
    moved = list(segment_call(torch.empty(7, 2, 3)).shape)  # where each axis went
    back = y.permute(0, *[1 + moved.index(size) for size in (7, 2, 3)])
    assert back.order is None
    per_segment(back, x, lambda s: s)


def test_head_first_layout_is_metadata() -> None:
    x = make(8)
    B, T, C = x.shape
    q = x.view(B, T, 2, 4).transpose(1, 2)  # (B, H, L*, Dh)
    assert q.shape[1] == 2 and q.shape[2] is not T and q.shape[2] == T and q.shape[3] == 4
    assert q.values.data_ptr() == x.values.data_ptr() and q.values.is_contiguous()
    per_segment(q, x, lambda s: s.view(-1, 2, 4).transpose(0, 1))
    y = q.transpose(1, 2).contiguous().view(B, T, C)
    assert y.order is None
    torch.testing.assert_close(y.values, x.values)


def test_permuted_arrays_refuse_storage_order_ops() -> None:
    """Ops with axis arguments and elementwise ops take permuted arrays
    (tests/test_optable_layouts.py); the others refuse them."""
    q = make(2, 3).transpose(1, 2)
    with pytest.raises(TypeError, match=r"^ragged\.attention: `q` has its ragged axis moved"):
        ragged.attention(q, q, q)
    with pytest.raises(TypeError, match=r"^ragged\.pair_dot: `x` has its ragged axis moved"):
        ragged.pair_dot(q, q)
    # the ragged axis and an inner one at once: a dense (B, D) result, inner axes in order
    torch.testing.assert_close(ragged.sum(q, axis=(1, 2)), ragged.sum(q.transpose(1, 2), (1, 2)))
    # softmax and cumsum map the logical axis to the storage one
    for logical, storage in ((2, 1), (-1, 3), (1, 2)):
        for op in (ragged.softmax, ragged.cumsum):
            ragged.testing.assert_close(op(q, logical).transpose(1, 2), op(make(2, 3), storage))
    with pytest.raises(TypeError, match=r"^RaggedArray\.transpose: `dims` \(1, 0, 2, 3\) moves"):
        q.transpose(0, 1)  # the sequence-first view is of arrays in the storage order only


def test_two_level_layouts() -> None:
    x = ragged.array([[[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]], [[[7.0, 8.0]]]])  # (B, S*, T*, 2)
    y = x.transpose(2, 3)  # (B, S*, 2, T*)
    assert y.values.data_ptr() == x.values.data_ptr() and y.order == (1, 3, 2)
    assert isinstance(y.shape[1], RaggedSize) and y.shape[2] == 2
    with pytest.raises(TypeError, match="reorders the ragged axes"):
        x.permute(0, 3, 2, 1)
    z = y.transpose(2, 3)
    ragged.testing.assert_close(z, x)


def test_shape_is_a_tuple() -> None:
    x = make(4, 6)
    shape = x.shape
    B, T, H, D = shape
    assert isinstance(shape, tuple) and len(shape) == 4
    assert (B, H, D) == (4, 4, 6) and shape[-1] == 6 and shape[-3] is T
    assert shape[:-1] + (5,) == (4, T, 4, 5)  # noqa: RUF005  (the idiom under test)
    assert x.size() == shape and x.size(-2) == 4 and x.size(1) == T
    assert isinstance(shape[:2], tuple) and not isinstance(shape[:2], ragged.RaggedShape)
    assert x.transpose(1, 3).shape == (4, 6, 4, T)


def test_ragged_size_compares_as_nested_int() -> None:
    x = make(3)
    T = x.shape[1]
    assert T > 1 and T >= 2 and T != 1 and T != 0 and not T < 2 and not T <= 1 and not T == 1  # noqa: SIM201
    assert T == x.shape[1] and T == (x * 2).shape[1] and T != make(3).shape[1]  # noqa: SIM300
    assert hash(T) == hash(x.shape[1])
    for use in (lambda: int(T), lambda: range(T), lambda: [0][T], lambda: float(T)):
        with pytest.raises(TypeError, match=r"^RaggedSize: .* one length per segment"):
            use()
    with pytest.raises(TypeError, match="depends on the lengths"):
        _ = T > 2
    assert not T > T and T >= T  # itself: as any size (HF's kv_length > q_length)
    with pytest.raises(TypeError, match="with ints and with itself only"):
        _ = T > make(3).shape[1]  # noqa: SIM300
    torch.testing.assert_close(T.lengths, x.lengths)


def test_pointwise_ops_take_permuted_arrays() -> None:
    x = make(2, 3)
    y = x.transpose(1, 3)  # (B, 3, 2, L*)
    for out, fn in [
        (torch.exp(y) * 2 - y, lambda s: torch.exp(s) * 2 - s),
        (y.float() > 0, lambda s: s.float() > 0),
        (torch.where(y > 0, y, -y), lambda s: torch.where(s > 0, s, -s)),
        (-abs(y) + 1.0, lambda s: -abs(s) + 1.0),
    ]:
        assert out.order == y.order
        per_segment(out, y, fn)
    with pytest.raises(TypeError, match="has its ragged axis moved"):
        _ = y + torch.ones(5)  # a dense operand would line up with the storage axes
    with pytest.raises(TypeError, match="has its ragged axis moved"):
        _ = y + x.transpose(1, 2)  # another layout


def test_new_tensors_take_ragged_sizes() -> None:
    x = make(2, 3)
    q = x.transpose(1, 2)  # (B, 2, L*, 3)
    for out, fill, logical in [
        (x.new_zeros(x.shape[:-1] + (4,)), 0.0, (2, 4)),  # noqa: RUF005  (the idiom under test)
        (x.new_ones(q.shape), 1.0, (2, 3)),
        (x.new_full(q.shape, 2.5), 2.5, (2, 3)),
        (x.new_full(x.shape, fill_value=-1.0), -1.0, (2, 3)),
        (x.new_empty(x.shape), 0.0, (2, 3)),
    ]:
        assert out.partition is x.partition and out.dtype == x.dtype
        assert [s for s in out.shape if not isinstance(s, RaggedSize)] == [4, *logical]
        for segment, length in zip(out.unbind(), LENGTHS, strict=True):
            sizes = [length if isinstance(s, RaggedSize) else s for s in out.shape[1:]]
            torch.testing.assert_close(segment, torch.full(sizes, fill, dtype=x.dtype))
    assert x.new_zeros(3, 4).shape == (3, 4) and x.new_full((2,), 1.0).shape == (2,)
    other = make(1).shape[1]  # a size names its partition: the result is an array of it
    assert x.new_zeros(4, other).partition is not x.partition
    with pytest.raises(ValueError, match="ragged size of another array"):
        x.new_zeros(4, x.shape[1], other)


def test_permuted_arrays_pickle_with_their_layout() -> None:
    import pickle

    q = make(2, 3).transpose(1, 3)
    back = pickle.loads(pickle.dumps(q))
    assert back.order == q.order and repr(back.shape) == repr(q.shape)
    per_segment(back, q, lambda s: s)
    assert pickle.loads(pickle.dumps(make(2))).order is None
    fields = {"values": q.values, "partition": q.partition, "axes": None, "order": (1, 2, 3, 4)}
    with pytest.raises(ValueError, match="`order` must be a layout"):
        ragged._serialization.import_ragged_before_torch_load("RaggedArray", fields)


# --- the flat view: view(-1, C) merges the batch and ragged axes into rows (a FlatArray) -------


@pytest.mark.parametrize(
    "merge",
    [
        lambda x: x.view(-1, x.size(-1)),
        lambda x: x.reshape(-1, 4),
        lambda x: x.flatten(0, 1),
        lambda x: x.view(x.values.shape[0], -1),
        lambda x: torch.reshape(x, (-1, 2, 2)).reshape(-1, 4),
    ],
)
def test_view_minus_one_gives_the_rows_and_views_back(merge: Any) -> None:
    x = make(4)
    flat = merge(x)
    assert isinstance(flat, ragged.FlatArray) and flat.partition is x.partition
    assert flat.shape == (9, 4) and flat.size(0) == 9 and flat.dim() == 2 and len(flat) == 9
    assert flat.values.data_ptr() == x.values.data_ptr()  # no copy
    size_out = x.size()[:-1] + (3,)  # noqa: RUF005  (GPT-2's spelling)
    w, b = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    for out in (
        torch.addmm(b, flat, w).view(size_out),
        (flat @ w + b).reshape(size_out),
        torch.nn.functional.linear(flat, w.T, b).view(size_out),
    ):
        assert isinstance(out, ragged.RaggedArray) and out.partition is x.partition
        per_segment(out, x, lambda s: torch.addmm(b, s, w))


def test_flat_rows_take_pointwise_and_row_wise_ops() -> None:
    x = make(4, seed=1)
    flat = x.view(-1, 4)
    dense = torch.randn(4, dtype=torch.float64)
    cases = [
        (torch.tanh(flat) * 2 - dense, lambda s: torch.tanh(s) * 2 - dense),
        (1 / (flat.abs() + 1), lambda s: 1 / (s.abs() + 1)),
        (torch.nn.functional.gelu(flat) + flat, lambda s: torch.nn.functional.gelu(s) + s),
        (torch.softmax(flat, -1), lambda s: torch.softmax(s, -1)),
        (
            torch.nn.functional.layer_norm(flat, (4,)),
            lambda s: torch.nn.functional.layer_norm(s, (4,)),
        ),
        (dense + flat, lambda s: dense + s),
    ]
    for got, fn in cases:
        assert isinstance(got, ragged.FlatArray) and got.partition is x.partition
        per_segment(got.view(x.shape), x, fn)
    # the inner axes reshape among themselves; the rows stay
    assert flat.view(-1, 2, 2).view(x.shape).values.data_ptr() == x.values.data_ptr()
    assert flat.to_ragged().partition is x.partition


def test_flat_rows_gradients() -> None:
    x = make(4, seed=2)
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    values = x.values.clone().requires_grad_()

    def conv1d(values: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x.with_values(values)
        out = torch.addmm(w[0], y.view(-1, y.size(-1)), w).view(y.size()[:-1] + (3,))  # noqa: RUF005
        return (torch.tanh(out).values ** 2).sum()

    torch.autograd.gradcheck(conv1d, (values, w))


def test_flat_rows_refuse_what_mixes_rows() -> None:
    x = make(4)
    flat = x.view(-1, 4)
    with pytest.raises(
        TypeError, match=r"^torch\.sum is not supported on a FlatArray: .*flat\.values"
    ):
        torch.sum(flat)
    with pytest.raises(TypeError, match="must be the left operand"):
        torch.randn(2, 9, dtype=torch.float64) @ flat
    with pytest.raises(TypeError, match="dense 1-D or 2-D tensor"):
        flat @ flat
    with pytest.raises(TypeError, match="`dim` 0 is the rows"):
        torch.softmax(flat, 0)
    with pytest.raises(ValueError, match="rows of different arrays"):
        flat + make(4, lengths=[4, 2, 1, 2]).view(-1, 4)  # nine rows too
    with pytest.raises(ValueError, match="more axes than the FlatArray"):
        flat + torch.zeros(2, 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^FlatArray\.view: `shape` \(4, -1\) must start with -1"):
        flat.view(4, -1)
    with pytest.raises(ValueError, match="must keep the 4 entries of each row"):
        x.view(-1, 2)  # merging an inner axis into the rows as well
    with pytest.raises(TypeError, match="merges the batch and ragged axes of a permuted array"):
        make(2, 3).transpose(1, 2).view(-1, 3)
    with pytest.raises(ValueError, match="must keep the 1 ragged"):
        x.view(4, -1)  # the batch size first: a shape without the ragged axis


def test_flat_rows_of_two_level_arrays() -> None:
    x = ragged.from_nested_lengths(torch.randn(6, 2, dtype=torch.float64), [[2, 1], [3, 0, 3]])
    flat = x.view(-1, 2)
    assert flat.shape == (6, 2)
    out = (flat * 3).view(x.shape)
    assert out.partition is x.partition
    torch.testing.assert_close(out.values, x.values * 3)
    torch.testing.assert_close(x.flatten(0, 2).values, x.values)
    with pytest.raises(TypeError, match="is the batch or a ragged axis"):
        x.flatten(0, 1)  # a partial merge: not the rows


def test_flat_rows_compile_to_one_graph() -> None:
    """GPT-2's Conv1D (view(-1, C) -> addmm -> view(size_out)): one graph across batches."""
    w = torch.randn(4, 3)

    def conv1d(x: ragged.RaggedArray) -> ragged.RaggedArray:
        size_out = x.size()[:-1] + (3,)  # noqa: RUF005
        return torch.addmm(w[0], x.view(-1, x.size(-1)), w).view(size_out)

    batches = [
        (make(4, lengths=n, seed=i).float(),) for i, n in enumerate([[3, 1], [2, 5, 4], [6]])
    ]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(conv1d, batches, backend="aot_eager", max_graphs=1)
    assert report.graphs == 1


def test_mT_swaps_two_inner_axes_as_metadata() -> None:
    """``x.mT`` of ``(B, L*, H, D)`` (and of a permuted ``(B, H, L*, D, E)``) is the view with
    its last two axes swapped; with the ragged axis among the last two it stays the pair-map
    operand of ``x @ y.mT``."""
    x = make(2, 3)
    t = x.mT
    assert isinstance(t, ragged.RaggedArray) and t.partition is x.partition
    assert t.values.data_ptr() == x.values.data_ptr()  # no copy
    per_segment(t, x, lambda s: s.mT)
    per_segment(x.transpose(-2, -1), x, lambda s: s.transpose(-2, -1))
    y = make(2, 3, 4).transpose(1, 2)  # (B, 2, L*, 3, 4)
    per_segment(y.mT, y, lambda s: s.mT)
    assert y.mT.mT.order == y.order and y.mT.values.data_ptr() == y.values.data_ptr()
    for pair in (make(3), make(2, 3).transpose(1, 2)):  # (B, L*, C), (B, H, L*, D)
        assert not isinstance(pair.mT, ragged.RaggedArray)


def test_flat_rows_and_permuted_axis_ops_read_no_device_memory() -> None:
    """On the meta device (no data: any host read fails): GPT-2's Conv1D chain, and ops with
    axis arguments and elementwise ops on the head-first layout, forward and backward."""
    x = make(4).to("meta").requires_grad_()
    w = torch.randn(4, 3, device="meta", dtype=torch.float64)
    y = torch.addmm(w[0], x.view(-1, x.size(-1)), w).view(x.size()[:-1] + (3,))  # noqa: RUF005
    assert y.partition is x.partition and y.values.device.type == "meta"
    y.values.sum().backward()
    p = make(2, 4).to("meta").transpose(1, 2)
    out = ragged.softmax(p, axis=-1) + ragged.add(p, 1.0)
    assert out.order == p.order and ragged.sum(p, axis=2).shape == (4, 2, 4)


def test_flat_rows_under_torch_func() -> None:
    """vmap over an ensemble of weights returns a FlatArray (the pytree: values stacked first),
    and grad through view(-1, C) -> addmm -> view(size_out) agrees with autograd."""
    x = make(4, seed=3)
    ws = torch.randn(3, 4, 2, dtype=torch.float64)

    def rows(w: torch.Tensor) -> ragged.FlatArray:
        return torch.addmm(w[0], x.view(-1, 4), w)

    out = torch.func.vmap(rows)(ws)
    assert isinstance(out, ragged.FlatArray) and out.partition is x.partition
    torch.testing.assert_close(out.values, torch.stack([rows(w).values for w in ws]))

    def loss(w: torch.Tensor) -> torch.Tensor:
        return (rows(w).view(x.size()[:-1] + (2,)).values ** 2).sum()  # noqa: RUF005

    w = ws[0].clone().requires_grad_()
    (want,) = torch.autograd.grad(loss(w), w)
    torch.testing.assert_close(torch.func.grad(loss)(ws[0]), want)


def test_a_permuted_input_compiles() -> None:
    """A head-first array passed *into* a compiled function (its order ints are symbolic under
    ``dynamic=True``) answers as in eager mode, in one graph across batches."""
    batches = []
    for i, lengths in enumerate([[3, 1, 4], [2, 5]]):
        x = ragged.array(
            [torch.randn(n, 4, generator=torch.Generator().manual_seed(i)) for n in lengths]
        )
        B, T, _ = x.size()
        batches.append((x.view(B, T, 2, 2).transpose(1, 2),))
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            lambda q: (q * 2).transpose(1, 2).permute(0, 1, 3, 2), batches, backend="eager"
        )
    assert report.graphs == 1


def test_conversions_follow_the_logical_order() -> None:
    """to_padded / to_list / unbind of a permuted array (and of the sequence-first view) give
    the logical axes, as the same calls on the per-segment tensors do."""
    segments = [torch.randn(n, 6, dtype=torch.float64) for n in (3, 0, 2)]
    x = ragged.array(segments)
    B, T, _ = x.size()
    q = x.view(B, T, 2, 3).transpose(1, 2)  # (B, 2, L*, 3)
    padded = x.to_padded().view(3, 3, 2, 3).transpose(1, 2)
    torch.testing.assert_close(q.to_padded(), padded)
    torch.testing.assert_close(ragged.to_padded(q), padded)
    expected = [s.view(-1, 2, 3).transpose(0, 1) for s in segments]
    assert q.to_list() == [e.tolist() for e in expected]
    for got, e in zip(ragged.unbind(q), expected, strict=True):
        torch.testing.assert_close(got, e)
    torch.testing.assert_close(x.transpose(0, 1).to_padded(), x.to_padded().transpose(0, 1))
    with pytest.raises(TypeError, match=r"ragged\.to_nested: `x` has its ragged axis moved"):
        q.to_nested()


def test_the_operator_with_a_dense_right_operand_compiles() -> None:
    """``x @ w`` and ``x.view(-1, C) @ w`` under ``fullgraph=True``: torch 2.13's Dynamo hands
    them over as ``w @ x`` (its reflected-operator table skips matmul) unless ragged's fix is in."""
    w = torch.randn(4, 4, dtype=torch.float64)  # square: a swap would not fail on shapes
    batches = [(ragged.array(batch),) for batch in ([torch.randn(4, 4, dtype=torch.float64)],)]
    batches += [(ragged.array([torch.randn(n, 4, dtype=torch.float64) for n in (2, 5)]),)]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            lambda x: (x @ w, (x.view(-1, 4) @ w).view(x.size())), batches, backend="eager"
        )
    assert report.graphs <= 2
