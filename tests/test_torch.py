"""torch functions, Tensor-style methods and ``nn`` modules on RaggedArrays (``docs/torch.md``).

Every row of the table is tested: op spellings against the op table's per-segment references
(hypothesis partitions) and with gradcheck; pointwise functions against the same function on
every segment; the other handlers by the explicit cases below; refusals by their messages;
compilation by a few grouped functions that call every row that claims it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch import nn

import ragged
import ragged.testing
from ragged import _array, _registry
from ragged.ops import _methods, _pointwise, _torch
from tests import torchtable
from tests.optable import as_function, check_one_graph, ragged_randn
from tests.strategies import lengths as lengths_strategy
from tests.test_optable import check_against_reference

OP_ROWS = torchtable.op_rows()
OP_IDS = [f"{info.id}-{label}" for info, label, _ in OP_ROWS]
POINTWISE = torchtable.pointwise_entries()
POINTWISE_IDS = [torchtable.name_of(e) for e in POINTWISE]


def lengths_ragged(lengths: list[int], seed: int = 0, dtype: torch.dtype = torch.float64) -> Any:
    return ragged_randn(lengths, (3,), torch.Generator().manual_seed(seed), dtype)


# --- op spellings: the op table's samples through torch's spelling ------------------------------


@pytest.mark.parametrize(("info", "label", "spelling"), OP_ROWS, ids=OP_IDS)
@settings(max_examples=15, deadline=None)
@given(lengths=lengths_strategy(), seed=st.integers(0, 2**31 - 1))
def test_op_spellings_match_the_reference(info, label, spelling, lengths, seed) -> None:
    spelled = dataclasses.replace(info, op=torchtable.spelled_op(info, spelling))
    gen = torch.Generator().manual_seed(seed)
    for sample in info.samples(lengths, gen, torch.float64, "contiguous"):
        try:
            check_against_reference(spelled, sample)
        except torchtable.Inexpressible:
            continue


def _expressible_samples(info: Any, caller: Any, lengths: list[int]) -> list[Any]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for sample in info.samples(lengths, gen, torch.float64, "contiguous"):
        try:
            caller(*sample.call_args(), **sample.kwargs)
        except torchtable.Inexpressible:
            continue
        out.append(sample)
    return out


@pytest.mark.parametrize(("info", "label", "spelling"), OP_ROWS, ids=OP_IDS)
def test_op_spellings_express_a_sample_and_differentiate(info, label, spelling) -> None:
    caller = torchtable.spelled_op(info, spelling)
    samples = _expressible_samples(info, caller, [2, 0, 3])
    assert samples, f"{label}: no op-table sample is expressible in torch's spelling"
    if not info.grad:
        return
    spelled = dataclasses.replace(info, op=caller)
    fn, inputs = as_function(spelled, samples[0])
    if inputs and sum(v.numel() for v in inputs):
        assert torch.autograd.gradcheck(fn, inputs, check_forward_ad=info.forward_ad)


BINARY_OPS = [
    (spec, fn) for spec in _registry.ops() for fn in spec.torch if torchtable.is_descriptor(fn)
]


@pytest.mark.parametrize(
    ("spec", "fn"), BINARY_OPS, ids=[f"{s.name}-{f.__name__}" for s, f in BINARY_OPS]
)
def test_a_dense_self_meets_a_ragged_operand(spec, fn) -> None:
    x = lengths_ragged([2, 0, 3])
    if fn is torch.Tensor.where:
        dense = torch.randn(3, dtype=torch.float64)
        got = fn(dense, x > 0, x)  # dense.where(cond, x): torch.where(cond, dense, x)
        expected = ragged.where(x > 0, dense, x)
    else:
        dense = torch.rand(3, dtype=torch.float64) + 0.5
        if spec.name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            x, dense = x.long(), torch.tensor([1, 2, 3])
        elif spec.name.startswith("logical"):
            x, dense = x > 0, torch.tensor([True, False, True])
        elif spec.name == "matmul":
            dense = torch.randn(4, 2, dtype=torch.float64)
            x = x.with_values(torch.randn(5, 2, 3, dtype=torch.float64))
        got = fn(dense, x)
        expected = spec.obj(dense, x)
    ragged.testing.assert_close(got, expected)


def test_dense_tensors_on_the_left_of_operators() -> None:
    x = lengths_ragged([2, 0, 3])
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    for result, expected in [
        (t + x, x + t),
        (t - x, -(x - t)),
        (t * x, x * t),
        (t / x, ragged.divide(t, x)),
        (t ** x.abs(), ragged.power(t, x.abs())),
        (t < x, x > t),
        (t == x, x == t),
    ]:
        ragged.testing.assert_close(result, expected)
    m = torch.randn(2, 3, dtype=torch.float64)
    y = x.with_values(torch.randn(5, 3, 2, dtype=torch.float64))
    ragged.testing.assert_close(m @ y, ragged.matmul(m, y))


# --- the pointwise table -----------------------------------------------------------------------


def _pointwise_call(entry: Any, lengths: list[int], seed: int) -> tuple[Any, tuple, dict]:
    """(fn, args, kwargs) of one deterministic call of a pointwise row."""
    name = torchtable.name_of(entry)
    fn = entry.fns[0]
    gen = torch.Generator().manual_seed(seed)
    x = ragged_randn(lengths, (3,), gen, torch.float64)
    x = x.with_values(torchtable.domain(name, x.values))
    extra_args, extra_kwargs = torchtable.EXTRA.get(name, ((), {}))
    if name in ("clamp", "clip"):
        low = torch.full((3,), -0.5, dtype=torch.float64)  # dense, and a RaggedArray
        return fn, (x,), {"min": low, "max": x.with_values(torch.rand_like(x.values))}
    if name in torchtable.BINARY_NAMES:
        first, second = torchtable.BINARY_KINDS.get(name, ("float", "float"))
        a = torchtable.operand(first, lengths, gen, torch.float64)
        b = a.with_values(torchtable.operand(second, lengths, gen, torch.float64).values)
        if name == "masked_fill":
            return fn, (a, b > 0, 0.25), {}
        return fn, (a, b), {}
    if name in _pointwise.TERNARY:
        b = x.with_values(torch.rand_like(x.values) + 0.5)
        c = x.with_values(torch.rand_like(x.values) + 0.5)
        if name == "lerp":
            return fn, (x, b, 0.3), {}
        return fn, (x, b, c), {"value": 0.5}
    return fn, (x, *extra_args), extra_kwargs


def _segments(value: Any, b: int) -> Any:
    return value.unbind()[b] if isinstance(value, ragged.RaggedArray) else value


@pytest.mark.parametrize("entry", POINTWISE, ids=POINTWISE_IDS)
@settings(max_examples=10, deadline=None)
@given(lengths=lengths_strategy(), seed=st.integers(0, 2**31 - 1))
def test_pointwise_rows_match_every_segment(entry, lengths, seed) -> None:
    fn, args, kwargs = _pointwise_call(entry, lengths, seed)
    calls = [fn, *entry.fns[1:]]
    for spelling in calls:
        if torchtable.is_descriptor(spelling):
            continue
        out = spelling(*args, **kwargs)
        assert isinstance(out, ragged.RaggedArray)
        assert out.partition is args[0].partition
        for b in range(len(lengths)):
            seg_args = [_segments(a, b) for a in args]
            seg_kwargs = {k: _segments(v, b) for k, v in kwargs.items()}
            torch.testing.assert_close(out.unbind()[b], fn(*seg_args, **seg_kwargs))
    for method in entry.methods:
        out = getattr(args[0], method)(*args[1:], **kwargs)
        ragged.testing.assert_close(out, fn(*args, **kwargs), equal_nan=True)


@pytest.mark.parametrize("entry", [e for e in POINTWISE if e.grad], ids=lambda e: e.fns[0].__name__)
def test_pointwise_rows_differentiate(entry) -> None:
    fn, args, kwargs = _pointwise_call(entry, [2, 0, 3], 1)
    leaves = [i for i, a in enumerate(args) if isinstance(a, ragged.RaggedArray)]
    leaves = [i for i in leaves if args[i].values.is_floating_point()]

    def f(*values: torch.Tensor) -> torch.Tensor:
        call = list(args)
        for i, v in zip(leaves, values, strict=True):
            call[i] = args[i].with_values(v)
        return fn(*call, **kwargs).values

    inputs = tuple(args[i].values.detach().clone().requires_grad_() for i in leaves)
    assert torch.autograd.gradcheck(f, inputs)


def test_dropout_draws_per_entry_as_on_the_values() -> None:
    x = lengths_ragged([40, 0, 60]).float()
    for drop in (F.dropout, torch.dropout, F.alpha_dropout, F.rrelu):
        training = {"training": True} if drop is not torch.dropout else {"train": True}
        kwargs = {**training, "p": 0.5} if drop is not F.rrelu else training
        with torch.random.fork_rng():
            torch.manual_seed(7)
            got = drop(x, **kwargs)
            torch.manual_seed(7)
            expected = drop(x.values, **kwargs)
        assert got.partition is x.partition
        torch.testing.assert_close(got.values, expected)
    kept = nn.Dropout(0.5)(x)
    zeros = (kept.values == 0).float().mean()
    assert 0.3 < float(zeros) < 0.7
    torch.testing.assert_close(kept.values[kept.values != 0], 2 * x.values[kept.values != 0])


def test_inplace_is_computed_out_of_place() -> None:
    x = lengths_ragged([2, 0, 3])
    before = x.values.clone()
    for module in (nn.ReLU(inplace=True), nn.SiLU(inplace=True), nn.Dropout(0.5, inplace=True)):
        out = module(x)
        assert isinstance(out, ragged.RaggedArray)
        torch.testing.assert_close(x.values, before)


def test_casts_keep_the_partition() -> None:
    x = lengths_ragged([2, 0, 3])
    for name, dtype in _pointwise.DTYPES.items():
        out = getattr(x, name)()
        assert out.dtype == dtype and out.partition is x.partition
        torch.testing.assert_close(out.values, x.values.to(dtype))


def test_embedding_and_one_hot_add_an_axis() -> None:
    idx = ragged.from_lengths(torch.tensor([1, 4, 0, 2, 2]), [2, 0, 3])
    weight = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    out = F.embedding(idx, weight)
    assert out.partition is idx.partition and out.shape.inner == (3,)
    for b, segment in enumerate(idx.unbind()):
        torch.testing.assert_close(out.unbind()[b], F.embedding(segment, weight))
    assert torch.autograd.gradcheck(lambda w: F.embedding(idx, w).values, (weight,))
    emb = nn.Embedding(5, 3)
    torch.testing.assert_close(emb(idx).values, emb(idx.values))
    hot = F.one_hot(idx, num_classes=5)
    assert hot.shape.inner == (5,) and hot.values.sum() == 5
    named = idx.rename("batch", "seq")
    assert F.embedding(named, weight).axes is None  # a new axis: names are not invented


# --- handlers without an op of their own ---------------------------------------------------------


@pytest.mark.parametrize("largest", [True, False])
def test_max_and_min_in_their_three_forms(largest: bool) -> None:
    fn, ours, arg = (
        (torch.max, ragged.amax, ragged.argmax)
        if largest
        else (
            torch.min,
            ragged.amin,
            ragged.argmin,
        )
    )
    method = "max" if largest else "min"
    x = lengths_ragged([3, 0, 2])
    torch.testing.assert_close(fn(x), ours(x))
    out = fn(x, 1)
    assert type(out).__name__ == method
    for b, segment in enumerate(x.unbind()):
        if segment.shape[0]:
            expected = fn(segment, 0)
            torch.testing.assert_close(out.values[b], expected.values)
            torch.testing.assert_close(out.indices[b], expected.indices)
    torch.testing.assert_close(out.indices, arg(x, 1))
    assert (out.indices[1] == -1).all()
    inner = getattr(x, method)(dim=2, keepdim=True)
    assert isinstance(inner.values, ragged.RaggedArray) and inner.values.shape.inner == (1,)
    y = x.with_values(torch.randn_like(x.values))
    ragged.testing.assert_close(fn(x, y), (ragged.maximum if largest else ragged.minimum)(x, y))
    dense = torch.zeros(3, dtype=torch.float64)
    ragged.testing.assert_close(getattr(dense, method)(x), fn(x, dense))
    with pytest.raises(ValueError, match=rf"^torch\.{method}: `dim` cannot reduce the batch axis"):
        fn(x, 0)


def test_sort_and_topk_return_values_and_indices() -> None:
    x = lengths_ragged([4, 0, 3])
    for out, dim in ((torch.sort(x, dim=1, descending=True), 1), (x.sort(), -1)):
        for b, segment in enumerate(x.unbind()):
            expected = torch.sort(segment, dim=dim - 1 if dim > 0 else dim, descending=dim == 1)
            torch.testing.assert_close(out.values.unbind()[b], expected.values)
            torch.testing.assert_close(out.indices.unbind()[b], expected.indices)
    top = torch.topk(x, 2, dim=1)
    for b, segment in enumerate(x.unbind()):
        expected = torch.topk(segment, min(2, segment.shape[0]), dim=0)
        torch.testing.assert_close(top.values.unbind()[b], expected.values)
        torch.testing.assert_close(top.indices.unbind()[b], expected.indices)
    assert top.values.lengths.tolist() == [2, 0, 2]
    assert torch.autograd.gradcheck(
        lambda v: torch.sort(x.with_values(v), 1).values.values,
        (x.values.clone().requires_grad_(),),
    )


def test_norm_spellings() -> None:
    x = lengths_ragged([3, 0, 2])
    for p in ("fro", 1, 2, math.inf):
        out = torch.norm(x, p=p, dim=1)
        for b, segment in enumerate(x.unbind()):
            expected = torch.norm(segment, p=p, dim=0) if segment.shape[0] else torch.zeros(3)
            torch.testing.assert_close(out[b], expected.to(out.dtype))
    torch.testing.assert_close(x.norm(), torch.norm(x.values))
    ragged.testing.assert_close(x.norm(dim=2), ragged.norm(x, 2, 2))
    with pytest.raises(ValueError, match=r"^torch\.norm: `p='nuc'`"):
        torch.norm(x, p="nuc", dim=1)


def test_allclose_and_equal_compare_partitions_by_value() -> None:
    x = lengths_ragged([2, 0, 3])
    twin = ragged.from_lengths(x.values.clone(), [2, 0, 3])  # equal values, distinct partition
    assert torch.allclose(x, twin) and torch.equal(x, twin) and x.allclose(twin)
    assert not torch.allclose(x, x + 1e-3) and torch.allclose(x, x + 1e-9)
    assert not torch.equal(x, x + 1e-9) and not torch.equal(x, x.values)
    other = ragged.from_lengths(x.values, [3, 0, 2])
    assert not torch.equal(x, other)
    with pytest.raises(ValueError, match=r"^torch\.isclose: the operands have different ragged"):
        torch.allclose(x, other)


def test_assert_close_names_the_segment_and_row() -> None:
    x = lengths_ragged([2, 0, 3])
    torch.testing.assert_close(x, ragged.from_lengths(x.values.clone(), [2, 0, 3]))
    changed = x.values.clone()
    changed[3, 1] += 1.0  # segment 2, row 1, column 1
    message = (
        r"Tensor-likes are not close!(.|\n)*at index \(1, 1\)(.|\n)*"
        r"The failure occurred for item \[2\]"
    )
    with pytest.raises(AssertionError, match=message):
        torch.testing.assert_close(x, ragged.from_lengths(changed, [2, 0, 3]))
    with pytest.raises(AssertionError, match=r"The values for attribute 'shape' do not match"):
        torch.testing.assert_close(x, ragged.from_lengths(x.values, [3, 0, 2]))
    with pytest.raises(AssertionError, match=r"The length of the sequences mismatch: 3 != 2"):
        torch.testing.assert_close(x, ragged.from_lengths(x.values, [2, 3]))
    torch.testing.assert_close(x, list(x.unbind()))  # a list of segments compares too


def test_normalize_along_rows_or_segments() -> None:
    x = lengths_ragged([3, 0, 2])
    rows = F.normalize(x, dim=-1)
    segments = F.normalize(x)  # dim=1: each segment along its rows
    for b, segment in enumerate(x.unbind()):
        torch.testing.assert_close(rows.unbind()[b], F.normalize(segment, dim=-1))
        torch.testing.assert_close(segments.unbind()[b], F.normalize(segment, dim=0))
    assert torch.autograd.gradcheck(
        lambda v: F.normalize(x.with_values(v)).values, (x.values.clone().requires_grad_(),)
    )


def test_stack_along_every_axis() -> None:
    x = lengths_ragged([2, 0, 3])
    y = x * 2.0
    ragged.testing.assert_close(torch.stack([x, y], dim=2), ragged.stack([x, y], 2))
    ragged.testing.assert_close(torch.stack([x, y], dim=-1), ragged.stack([x, y], -1))
    outer = torch.stack([x, y[:2]])  # dim=0: the arrays become segments of a new batch axis
    assert outer.shape.to_list() == [2, [3, 2], [[2, 0, 3], [2, 0]], 3]
    torch.testing.assert_close(outer.values, torch.cat([x.values, y[:2].values]))
    rows = torch.stack([x, y], dim=1)  # each segment: (2, L_b*, 3)
    assert rows.shape.to_list() == [3, [2, 2, 2], [[2, 2], [0, 0], [3, 3]], 3]
    for b in range(3):
        torch.testing.assert_close(
            rows.values[rows.partition.levels[1].offsets[2 * b] :][: 2 * x.lengths[b]],
            torch.cat([x.unbind()[b], y.unbind()[b]]),
        )
    with pytest.raises(ValueError, match=r"^torch\.stack: `tensors` must have equal numbers"):
        torch.stack([x, y[:2]], dim=1)


def test_scaled_dot_product_attention_in_torch_layout() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (ragged_randn([3, 0, 4], (8,), gen, torch.float64) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    assert out.partition is q.partition
    for b in range(3):
        s = [t.unbind()[b][None] for t in (q, k, v)]
        if s[0].shape[1]:
            expected = F.scaled_dot_product_attention(*s, is_causal=True, scale=0.3)[0]
            torch.testing.assert_close(out.unbind()[b], expected)
    heads = ragged_randn([3, 0, 4], (2, 8), gen, torch.float64)
    with pytest.raises(TypeError, match=r"^torch\.nn\.functional\.scaled_dot_product_attention: "):
        F.scaled_dot_product_attention(heads, heads, heads)
    message = "for heads use ragged.attention(q, k, v) with the layout (B, L*, H, Dh)"
    with pytest.raises(TypeError, match=re.escape(message)):
        F.scaled_dot_product_attention(heads, heads, heads)


def test_inner_axis_reshapes() -> None:
    x = ragged_randn([2, 0, 3], (3, 4), torch.Generator().manual_seed(0), torch.float64)
    for out, per_segment in [
        (x.transpose(2, 3), lambda s: s.transpose(1, 2)),
        (torch.swapaxes(x, -1, -2), lambda s: s.transpose(1, 2)),
        (x.unsqueeze(-1), lambda s: s.unsqueeze(-1)),
        (torch.unsqueeze(x, 2), lambda s: s.unsqueeze(1)),
        (x[..., :1].squeeze(), lambda s: s[..., :1].squeeze(-1)),
        (x.flatten(2), lambda s: s.flatten(1)),
        (torch.unflatten(x, -1, (2, 2)), lambda s: s.unflatten(-1, (2, 2))),
        (x.unflatten(2, (1, 3)), lambda s: s.unflatten(1, (1, 3))),
    ]:
        assert out.partition is x.partition
        for b, segment in enumerate(x.unbind()):
            torch.testing.assert_close(out.unbind()[b], per_segment(segment))
    torch.testing.assert_close(torch.flatten(x), x.values.reshape(-1))
    pair = ragged.outer(x[..., 0, 0], x[..., 0, 0])
    ragged.testing.assert_close(pair.transpose(1, 2), ragged.transpose(pair))
    with pytest.raises(
        TypeError, match=r"^RaggedArray\.transpose: `dims` \(2, 1, 0, 3\) moves the batch"
    ):
        x.transpose(2, 0)
    with pytest.raises(
        TypeError,
        match=r"^torch\.flatten: `start_dim`..`end_dim` \(1..-1\) is the batch or a ragged axis",
    ):
        torch.flatten(x, 1)


def test_tensor_style_properties() -> None:
    x = lengths_ragged([2, 0, 3])
    assert x.size() == x.shape and x.size(0) == 3 and x.size(-1) == 3
    assert x.size(1).lengths.tolist() == [2, 0, 3] and x.size(1) is not x.size(1) == x.size(1)
    assert x.dim() == x.ndimension() == 3
    assert x.numel() == x.nelement() == torch.numel(x) == 15
    assert x.is_floating_point() and torch.is_floating_point(x) and not x.long().is_floating_point()
    assert x.cpu().partition is x.partition
    assert x.float().type_as(torch.zeros(1, dtype=torch.float16)).dtype == torch.float16
    assert x.type_as(x.long()).dtype == torch.int64
    assert torch.unbind(x)[2].shape == (3, 3)
    assert not x.is_nested


def test_requires_grad_sets_the_flag_of_the_values() -> None:
    x = lengths_ragged([2, 0, 3])
    same = x.requires_grad_()
    assert same is x and x.values.requires_grad and x.requires_grad
    (x.sum(1) ** 2).sum().backward()
    assert x.values.grad is not None
    assert not x.detach().requires_grad_(False).requires_grad


@pytest.mark.cuda
def test_cuda_moves_values_and_offsets(cuda) -> None:
    x = lengths_ragged([2, 0, 3])
    y = x.cuda()
    assert y.device.type == "cuda" and y.offsets.device.type == "cuda"
    assert y.cpu().device.type == "cpu"
    ragged.testing.assert_close(y.cpu(), x)


@pytest.mark.parametrize("name", torchtable.LOSSES)
def test_elementwise_losses(name: str) -> None:
    fn = getattr(F, name)
    x = lengths_ragged([2, 0, 3])
    if "binary" in name:
        x = x.with_values(torch.sigmoid(x.values)) if name == "binary_cross_entropy" else x
        y = x.with_values(torch.rand_like(x.values))
    else:
        y = x.with_values(torch.randn_like(x.values))
    torch.testing.assert_close(fn(x, y), fn(x.values, y.values))
    torch.testing.assert_close(fn(x, y, reduction="sum"), fn(x.values, y.values, reduction="sum"))
    per_entry = fn(x, y, reduction="none")
    assert per_entry.partition is x.partition
    for b, (a, c) in enumerate(zip(x.unbind(), y.unbind(), strict=True)):
        torch.testing.assert_close(per_entry.unbind()[b], fn(a, c, reduction="none"))
    assert torch.autograd.gradcheck(
        lambda v: fn(x.with_values(v), y), (x.values.clone().requires_grad_(),)
    )


# --- refusals and unknown functions ------------------------------------------------------------

REFUSED = [(fn, e.hint) for e in _registry.torch_functions() if e.handler is None for fn in e.fns]


@pytest.mark.parametrize(("fn", "hint"), REFUSED, ids=[f.__name__ for f, _ in REFUSED])
def test_refused_functions_say_what_to_use(fn, hint) -> None:
    x = lengths_ragged([2, 0, 3])
    name = _torch.display_name(fn)
    message = "^" + re.escape(f"{name} is not supported on RaggedArrays: {hint}.") + "$"
    call = _attend if fn is F.multi_head_attention_forward else _call_somehow
    with pytest.raises(TypeError, match=message):
        call(fn, x)


def _attend(fn: Any, x: Any) -> Any:
    return nn.MultiheadAttention(3, 1)(x, x, x)


def _call_somehow(fn: Any, x: Any) -> Any:
    """Call ``fn`` with ``x`` first and whatever else torch's signature needs to dispatch."""
    for extra in ((), (1,), (1, 1), (x,), (x, x), (1, x)):
        try:
            return fn(x, *extra)
        except TypeError as error:
            if "is not supported on RaggedArrays" in str(error):
                raise
    raise AssertionError(f"{fn}: no call dispatched to RaggedArray")


def test_unknown_functions_name_the_nearest_ragged_functions() -> None:
    x = lengths_ragged([2, 0, 3])
    message = (
        "torch.argwhere is not supported on RaggedArrays; the nearest ragged functions: "
        "ragged.where; ragged.map(fn, x) applies a function to the rows, ragged.vmap(fn)(x) to "
        "each segment, and x.with_values(...) rebuilds an array from its values (docs/torch.md "
        "lists the supported functions)."
    )
    with pytest.raises(TypeError, match="^" + re.escape(message) + "$"):
        torch.argwhere(x)
    with pytest.raises(
        TypeError, match=r"^torch\.kron is not supported on RaggedArrays; ragged\.map"
    ):
        torch.kron(x, x)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda x: torch.softmax(x, dim=0),
            ValueError,
            "torch.softmax: `dim` cannot be the batch axis (segments differ in length), got 0.",
        ),
        (
            lambda x: F.softmax(x, dim=5),
            ValueError,
            "torch.nn.functional.softmax: `dim` must be in [-3, 3), got 5.",
        ),
        (
            lambda x: x.softmax(0),
            ValueError,
            "RaggedArray.softmax: `dim` cannot be the batch axis (segments differ in length), got 0.",
        ),
        (
            lambda x: torch.sum(x.values, 1, x),
            TypeError,
            "torch.sum: `input` must be a RaggedArray, got Tensor.",
        ),
        (
            lambda x: x.sum(1, foo=2),
            TypeError,
            "RaggedArray.sum: unexpected argument `foo` (it takes `input`, `dim`, `keepdim`, `dtype`, `fill_value`).",
        ),
        (
            lambda x: torch.add(x, x, alpha=2),
            TypeError,
            "torch.add: `alpha` is supported on RaggedArrays at its default 1 only, got 2.",
        ),
        (
            lambda x: x.sum(1, out=torch.zeros(3)),
            TypeError,
            "RaggedArray.sum: `out=` is not supported: RaggedArrays are immutable (use the result).",
        ),
        (lambda x: x.cumsum(), TypeError, "RaggedArray.cumsum: missing the argument `dim`."),
        (
            lambda x: x.sort(1, out=(x, x)),
            TypeError,
            "RaggedArray.sort: `out=` is not supported: RaggedArrays are immutable (use the result).",
        ),
        (
            lambda x: torch.softmax(x.transpose(0, 1), dim=0),
            TypeError,
            "torch.softmax: `input` is a sequence-first view (L*, B, ...) (from x.transpose(0, 1)), which this op does not take; transpose it back to (B, L*, ...) first (the sequence-first view takes sizes, the pointwise ops, F.linear, F.layer_norm and F.multi_head_attention_forward; docs/semantics.md, The logical order).",
        ),
        (
            lambda x: nn.MultiheadAttention(3, 1)(x, x, x),
            TypeError,
            "torch.nn.functional.multi_head_attention_forward: `query` must be a sequence-first RaggedArray (L*, B, E), as F.multi_head_attention_forward takes it (nn.MultiheadAttention(batch_first=True) makes that view of a (B, L*, E) array with x.transpose(1, 0); with batch_first=False pass x.transpose(0, 1)), got a batch-first RaggedArray of 3 axes.",
        ),
        (
            lambda x: x.transpose(0, 1).transpose(1, 2),
            TypeError,
            "RaggedArray.transpose: `dims` (0, 2, 1): a sequence-first array (L*, B, ...) only transposes back to (B, L*, ...) (x.transpose(0, 1)); other permutes take the batch-first array.",
        ),
        (
            lambda x: nn.TransformerEncoderLayer(3, 1, 8).eval()(x),
            TypeError,
            "torch.nn.functional.multi_head_attention_forward: `query` must be a sequence-first RaggedArray (L*, B, E), as F.multi_head_attention_forward takes it (nn.MultiheadAttention(batch_first=True) makes that view of a (B, L*, E) array with x.transpose(1, 0); with batch_first=False pass x.transpose(0, 1)), got a batch-first RaggedArray of 3 axes.",
        ),
    ],
)
def test_errors_speak_torch(call, error, message) -> None:
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        call(lengths_ragged([2, 0, 3]))


def test_every_row_is_covered() -> None:
    """Every function of the dispatch table and every method has a test above."""
    covered_fns = {fn for _, _, fn in OP_ROWS if not isinstance(fn, str)}
    covered_fns |= {fn for spec, fn in BINARY_OPS}
    covered_methods = {m for _, _, m in OP_ROWS if isinstance(m, str)}
    for entry in POINTWISE:
        covered_fns |= set(entry.fns)
        covered_methods |= set(entry.methods)
    covered_fns |= {fn for fn, _ in REFUSED}
    covered_fns |= set(EXPLICIT_FNS)
    covered_methods |= set(EXPLICIT_METHODS) | set(_pointwise.DTYPES)
    table = set(_torch.dispatch_table()) - {None}
    assert table - covered_fns == set()
    generated = set(_torch.method_table())
    assert generated - covered_methods == set()


# Functions and methods of the explicit cases above.
EXPLICIT_FNS = [
    torch.max,
    torch.Tensor.max,
    torch.min,
    torch.Tensor.min,
    torch.sort,
    torch.topk,
    torch.norm,
    torch.allclose,
    torch.Tensor.allclose,
    torch.equal,
    torch.Tensor.equal,
    F.normalize,
    torch.stack,
    torch.gru,
    torch.lstm,
    torch.rnn_tanh,
    torch.rnn_relu,
    torch.diff,
    torch.addmm,
    torch.gather,
    F.scaled_dot_product_attention,
    F.multi_head_attention_forward,  # tests/test_models_torchnn.py
    torch.transpose,
    torch.swapaxes,
    torch.unsqueeze,
    torch.squeeze,
    torch.flatten,
    torch.swapdims,
    torch.permute,
    torch.movedim,
    torch.moveaxis,
    torch.reshape,
    torch.unflatten,
    torch.split,
    torch.chunk,
    torch.numel,
    torch.is_floating_point,
    torch.unbind,
    F.embedding,
    F.one_hot,
    torch.autograd.grad,  # tests/test_immutability.py
    *[torch.bmm, torch.baddbmm, torch.tril, torch.triu],  # tests/test_manual_attention.py
    *[torch.ones_like, torch.zeros_like],  # tests/test_manual_attention.py
    *[getattr(F, n) for n in torchtable.LOSSES],
]
EXPLICIT_METHODS = [
    "max",
    "min",
    "sort",
    "topk",
    "norm",
    "allclose",
    "equal",
    "transpose",
    "swapaxes",
    "unsqueeze",
    "squeeze",
    "flatten",
    "swapdims",
    "permute",
    "movedim",
    "moveaxis",
    "view",
    "reshape",
    "view_as",
    "reshape_as",
    "unflatten",
    "split",
    "chunk",
    "expand",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
    "size",
    "dim",
    "ndimension",
    "numel",
    "nelement",
    "is_floating_point",
    "requires_grad_",
    "cpu",
    "cuda",
    "type_as",
    "diff",
    *["bmm", "baddbmm", "tril", "triu"],  # tests/test_manual_attention.py
]


# --- torch.compile: every row that claims it, in a few grouped graphs ---------------------------

COMPILE_BATCHES = [[3, 0, 5, 2], [1], [0, 2, 6, 1, 3]]


def _recurrent_calls(x: ragged.RaggedArray) -> list[Any]:
    """``torch.gru`` / ``lstm`` / ``rnn_tanh`` / ``rnn_relu`` as their modules call them."""
    h = torch.full((1, x.shape[0], 2), 0.5)
    calls = []
    for fn, gates in ((torch.gru, 3), (torch.lstm, 4), (torch.rnn_tanh, 1), (torch.rnn_relu, 1)):
        w = [torch.full((2 * gates, 3), 0.1), torch.full((2 * gates, 2), -0.2)]
        w += [torch.full((2 * gates,), 0.3), torch.zeros(2 * gates)]
        state = (h, h * 2) if fn is torch.lstm else h
        calls += fn(x, state, w, True, 1, 0.0, False, False, True)
    return calls


def _custom_calls(x: ragged.RaggedArray, y: ragged.RaggedArray) -> list[Any]:
    """One call of every explicit row that claims compile, on ``x`` and ``y`` ``(B, L*, 3)``."""
    q = x[..., None].flatten(2)  # (B, L*, 3), another view of the values
    idx = (x.abs() * 3).long().clamp(max=4)
    target = x.with_values(torch.sigmoid(y.values))
    return [
        torch.max(x),
        torch.max(x, 1),
        x.max(2),
        torch.max(x, y),
        torch.min(x, dim=1),
        x.min(),
        torch.min(x, y),
        torch.sort(x, 1),
        x.sort(),
        torch.topk(x, 2, dim=2),
        torch.norm(x, dim=1),
        x.norm(p=1, dim=2),
        F.normalize(x),
        F.normalize(x, dim=-1),
        torch.stack([x, y], 2),
        torch.stack([x, y]),
        torch.stack([x, y], 1),
        F.scaled_dot_product_attention(x, y, y, is_causal=True),
        F.multi_head_attention_forward(
            *[x.transpose(0, 1)] * 3,
            3,
            1,
            torch.ones(9, 3),
            None,
            None,
            None,
            False,
            0.0,
            torch.ones(3, 3),
            None,
            is_causal=True,
        ),
        torch.addmm(torch.ones(2), x, torch.ones(3, 2), beta=0.5),
        *_recurrent_calls(x),
        torch.gather(x.values.new_ones(x.shape[0], 5), 1, idx[..., 0]),
        torch.transpose(x[..., None], 2, 3),
        torch.swapaxes(x[..., None], -1, -2),
        x[..., None].transpose(2, 3),
        x[..., None].swapaxes(2, 3),
        x.topk(1, dim=2),
        torch.unsqueeze(x, 2).squeeze(2),
        x.unsqueeze(-1).squeeze(),
        torch.squeeze(x[..., :1]),
        torch.flatten(x),
        q.flatten(2),
        torch.flatten(x[..., None], 2),
        x.size(1).lengths,
        torch.swapdims(x[..., None], 2, 3),
        x[..., None].swapdims(2, 3),
        torch.permute(x[..., None], (0, 2, 1, 3)),
        x.permute(0, 2, 1),
        torch.movedim(x, 1, 2),
        torch.moveaxis(x, 2, 1),
        x.movedim(2, 1),
        x.moveaxis(1, 2),
        torch.reshape(x, (x.size(0), x.size(1), 3, 1)),
        x.view(*x.shape[:-1], 1, 3),
        x.reshape(*x.shape[:-1], -1, 1),
        x.view_as(y),
        x.reshape_as(y),
        torch.unflatten(x, 2, (3, 1)),
        x.unflatten(-1, (1, 3)),
        torch.split(x, 1, dim=2),
        x.split([1, 2], dim=2),
        torch.chunk(x, 3, 2),
        x.chunk(3, dim=-1),
        x[..., :1].expand(-1, -1, 3),
        x.new_zeros(x.shape[:-1] + (2,)),  # noqa: RUF005  (the idiom)
        x.new_ones(x.shape) + x.new_empty(x.shape) + x.new_full(x.shape, 2.0),
        x.size()[0] + x.dim() + x.ndimension() + x.numel() + torch.numel(x),
        x.nelement() + int(x.is_floating_point()) + int(torch.is_floating_point(x)),
        x.cpu(),
        x.type_as(idx),
        F.embedding(idx, torch.ones(5, 2)),
        F.one_hot(idx, 5),
        *[
            getattr(F, name)(target, x.with_values(torch.sigmoid(x.values)))
            for name in torchtable.LOSSES
        ],
        F.mse_loss(x, y, reduction="none"),
        *[getattr(x, name)() for name in _pointwise.DTYPES],
        *_pair_calls(x, y),
    ]


def _pair_calls(x: ragged.RaggedArray, y: ragged.RaggedArray) -> list[Any]:
    """The explicit rows of tests/test_manual_attention.py (pair maps from (B, L*, 3))."""
    pairs = torch.bmm(x, y.transpose(1, 2))
    return [
        pairs,
        x.bmm(y.transpose(1, 2)),
        torch.bmm(pairs, y),
        torch.baddbmm(pairs, x, y.transpose(1, 2), alpha=0.5),
        pairs.baddbmm(x, x.transpose(1, 2)),
        torch.tril(pairs),
        pairs.triu(1) + torch.triu(pairs, -1),
        torch.ones_like(pairs).tril() == 0,
        torch.zeros_like(x),
    ]


def _group_calls(family_filter: Any) -> tuple[Any, Any]:
    """(function of all arguments, builder of the arguments for given lengths) for the op rows
    whose family passes ``family_filter``, plus the pointwise rows and explicit rows."""
    infos = torchtable.op_infos()
    rows = [
        (info, spelling)
        for info, _, spelling in OP_ROWS
        if info is infos[info.spec.qualname]
        and torchtable.compiles(info)
        and family_filter(info.spec.family)
    ]
    callers = [torchtable.spelled_op(info, spelling) for info, spelling in rows]
    keywords: list[
        tuple[int, dict[str, Any]]
    ] = []  # constants of the compiled function, not inputs

    def build(lengths: list[int], seed: int) -> Any:
        gen = torch.Generator().manual_seed(seed)
        per_row = []
        for k, ((info, _), caller) in enumerate(zip(rows, callers, strict=True)):
            samples = info.samples(lengths, gen, torch.float32, "contiguous")
            if len(keywords) <= k:  # the first sample torch's spelling expresses
                index = next(i for i, s in enumerate(samples) if _expressible(caller, s))
                keywords.append((index, samples[index].kwargs))
            per_row.append(samples[keywords[k][0]].call_args())
        return per_row

    def run(per_row: Any) -> Any:
        return tuple(
            caller(*args, **kw[1])
            for caller, args, kw in zip(callers, per_row, keywords, strict=True)
        )

    return run, build


def _expressible(caller: Any, sample: Any) -> bool:
    try:
        caller(*sample.call_args(), **sample.kwargs)
    except torchtable.Inexpressible:
        return False
    return True


def _record_calls(fn: Any, *args: Any) -> tuple[set[Any], set[str]]:
    """The dispatch-table functions and generated methods ``fn(*args)`` reaches, eagerly."""
    seen_fns: set[Any] = set()
    seen_methods: set[str] = set()
    table = dict(_array.TORCH_FUNCTIONS)
    methods = _torch.method_table()

    def wrap_fn(key: Any, handler: Any) -> Any:
        def recorded(*a: Any, **k: Any) -> Any:
            seen_fns.add(key)
            return handler(*a, **k)

        return recorded

    def wrap_method(name: str, method: Any) -> Any:
        def recorded(*a: Any, **k: Any) -> Any:
            seen_methods.add(name)
            return method(*a, **k)

        return recorded

    try:
        _array.TORCH_FUNCTIONS.update({k: wrap_fn(k, h) for k, h in table.items() if k is not None})
        for name in methods:
            setattr(ragged.RaggedArray, name, wrap_method(name, getattr(ragged.RaggedArray, name)))
        fn(*args)
    finally:
        _array.TORCH_FUNCTIONS.update(table)
        for name, method in _methods.methods().items():
            setattr(ragged.RaggedArray, name, method)
    return seen_fns, seen_methods


def _pointwise_compile_calls(lengths: list[int], seed: int) -> list[Any]:
    """One call of every spelling of every pointwise row that claims compile."""
    calls = []
    for entry in POINTWISE:
        if entry.compile:
            _, args, kwargs = _pointwise_call(entry, lengths, seed)
            calls += [(f, args, kwargs) for f in entry.fns if not torchtable.is_descriptor(f)]
            calls += [(_method(m), args, kwargs) for m in entry.methods]
    return calls


def _method(name: str) -> Any:
    return lambda x, *args, **kwargs: getattr(x, name)(*args, **kwargs)


def _is_input(value: Any) -> bool:
    return isinstance(value, (ragged.RaggedArray, torch.Tensor))


def _split_calls(calls: list[Any]) -> tuple[list[Any], list[Any]]:
    """The tensors and RaggedArrays of ``calls`` (the compiled function's inputs), and the calls
    with ``None`` in their place (constants: numbers stay numbers, not graph inputs)."""
    inputs, template = [], []
    for fn, args, kwargs in calls:
        inputs.append([a for a in (*args, *kwargs.values()) if _is_input(a)])
        template.append(
            (
                fn,
                tuple(None if _is_input(a) else a for a in args),
                {k: None if _is_input(v) else v for k, v in kwargs.items()},
            )
        )
    return inputs, template


def _run_pointwise(inputs: list[Any], template: list[Any]) -> Any:
    out = []
    for values, (fn, args, kwargs) in zip(inputs, template, strict=True):
        feed = iter(values)
        call_args = [next(feed) if a is None else a for a in args]
        call_kwargs = {k: next(feed) if v is None else v for k, v in kwargs.items()}
        out.append(fn(*call_args, **call_kwargs))
    return tuple(out)


GROUPS = {
    "elementwise": lambda family: family == "elementwise",
    "reductions_and_more": lambda family: family in ("reductions", "normalization", "scans"),
    "the_rest": lambda family: (
        family not in ("elementwise", "reductions", "normalization", "scans")
    ),
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_op_rows_compile_to_one_graph(group: str) -> None:
    run, build = _group_calls(GROUPS[group])
    batches = [(build(lengths, seed),) for seed, lengths in enumerate(COMPILE_BATCHES)]
    check_one_graph(run, batches, backend="eager")


def test_pointwise_rows_compile_to_one_graph() -> None:
    template = _split_calls(_pointwise_compile_calls(COMPILE_BATCHES[0], 0))[1]
    batches = [
        (_split_calls(_pointwise_compile_calls(lengths, seed))[0],)
        for seed, lengths in enumerate(COMPILE_BATCHES)
    ]
    # The calls' numbers (threshold's 0.1, lerp's 0.3) sit in a list here, not in the code:
    # Dynamo would lift them as graph inputs (dynamic floats); in user code they are literals.
    with torch._dynamo.config.patch(specialize_float=True):
        check_one_graph(lambda inputs: _run_pointwise(inputs, template), batches, backend="eager")


def test_explicit_rows_compile_to_one_graph() -> None:
    batches = []
    for seed, lengths in enumerate(COMPILE_BATCHES):
        x = lengths_ragged(lengths, seed, torch.float32)
        batches.append((x, x.with_values(torch.randn_like(x.values))))
    check_one_graph(lambda x, y: tuple(_custom_calls(x, y)), batches, backend="eager")


def test_every_row_that_claims_compile_is_compiled() -> None:
    infos = torchtable.op_infos()
    claimed_fns: set[Any] = set()
    claimed_methods: set[str] = set()
    for info, _, spelling in OP_ROWS:
        if info is infos[info.spec.qualname] and torchtable.compiles(info):
            (claimed_methods if isinstance(spelling, str) else claimed_fns).add(spelling)
    for entry in _registry.torch_functions():
        if entry.handler is not None and entry.compile:
            claimed_fns |= {f for f in entry.fns if not torchtable.is_descriptor(f)}
            claimed_methods |= set(entry.methods)
    seen_fns: set[Any] = set()
    seen_methods: set[str] = set()
    for group in GROUPS.values():
        run, build = _group_calls(group)
        fns, methods = _record_calls(run, build([3, 0, 2], 0))
        seen_fns |= fns
        seen_methods |= methods
    x = lengths_ragged([3, 0, 2], 0, torch.float32)
    inputs, template = _split_calls(_pointwise_compile_calls([3, 0, 2], 0))
    fns, methods = _record_calls(
        lambda: (_run_pointwise(inputs, template), _custom_calls(x, x * 2))
    )
    seen_fns |= fns
    seen_methods |= methods
    missing = [_torch.display_name(f) for f in claimed_fns - seen_fns]
    assert not missing, f"rows that claim compile but no compiled group calls: {missing}"
    assert claimed_methods - seen_methods == set()


def test_translated_spellings_compile_with_fullgraph() -> None:
    """A keyword call goes through ``translate`` (not the direct call): it traces in one graph
    (it once held TorchParam dataclasses, which Dynamo cannot wrap as constants)."""
    x = lengths_ragged([2, 0, 3])
    torch._dynamo.reset()
    try:
        compiled = torch.compile(
            lambda x: x.pow(2).mean(-1, keepdim=True),
            backend="aot_eager",
            dynamic=True,
            fullgraph=True,
        )
        ragged.testing.assert_close(compiled(x), x.pow(2).mean(-1, keepdim=True))
    finally:
        torch._dynamo.reset()


def test_cat_of_a_tuple_under_compile() -> None:
    """Dynamo (torch 2.13) looks for RaggedArrays in lists only; ragged.ops._torch._dynamo_tuples
    makes it look into tuples too (docs/torch.md; tests/test_trust.py checks one graph)."""
    x = lengths_ragged([2, 0, 3])
    torch._dynamo.reset()
    try:
        compiled = torch.compile(
            lambda x: torch.cat((x, x), dim=1), backend="eager", fullgraph=True
        )
        ragged.testing.assert_close(compiled(x), torch.cat([x, x], dim=1))
    finally:
        torch._dynamo.reset()


# --- every pointwise torch function is declared on purpose ------------------------------------


def _pointwise_aten_names() -> set[str]:
    """The public aten ops that torch tags ``pointwise`` (any overload)."""
    names = set()
    for full in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = full.partition("::")
        base, _, overload = rest.partition(".")
        if namespace != "aten" or base.startswith("_") or base.endswith("_"):
            continue
        packet = getattr(torch.ops.aten, base, None)
        try:
            tags = getattr(packet, overload or "default").tags
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.pointwise in tags:
            names.add(base)
    return names


def test_every_pointwise_torch_function_is_declared_or_refused() -> None:
    """A torch function whose aten op torch tags pointwise is supported or refused on purpose
    (``ragged/ops/_pointwise.py`` and the refusals beside it), never left to the generic error."""
    claims = _registry.claims()
    names = _pointwise_aten_names()
    assert {"exp", "add", "gelu", "where"} <= names  # the tag query itself works
    missing = []
    for name in sorted(names):
        fns = [getattr(m, name, None) for m in (torch, F, torch.special)]
        fns = [f for f in fns if callable(f)]
        if fns and not any(f in claims for f in fns):
            missing.append(name)
    assert missing == []
