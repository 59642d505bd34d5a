"""Every op of the op table on a permuted layout (``x.transpose(1, 2)``: the ragged axis after an
inner one): either it answers as on the storage order, permuted the same way, or it refuses
with the permuted-layout error (docs/semantics.md, "Layouts and shapes"). No op may silently
read a permuted array in storage order. Axis arguments are given in the permuted array's own
(logical) axes: the sample's storage axes 1 and 2 swap places."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import torch

import ragged
from ragged import _registry
from tests.optable import OpInfo, all_ops, check_one_graph

OPS = [info for info in all_ops() if info.lift]
REFUSAL = re.compile(r"has its ragged axis moved")


def _permutable(value: Any) -> bool:
    return (
        isinstance(value, ragged.RaggedArray)
        and value.ragged_ndim == 1
        and value.ndim >= 3
        and value.order is None
    )


def _permuted(sample_args: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """The sample's one-level arrays with an inner axis as ``(B, L*, D, ...)`` moved in front of
    the ragged axis (``transpose(1, 2)``); whether any was."""
    moved = False
    args = []
    for a in sample_args:
        if _permutable(a):
            args.append(a.transpose(1, 2))
            moved = True
        else:
            args.append(a)
    return tuple(args), moved


def _logical_axes(info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any], n: int) -> Any:
    """The sample's axis arguments (in storage axes, defaults included) as axes of the permuted
    array (``n`` axes): axes 1 and 2 swap; names travel with their axes."""
    ops = {spec.qualname: spec for spec in _registry.ops()}
    spec = _registry.lookup(info.op) or ops.get(f"ragged.{info.name}")  # or a lambda's op
    if spec is None:  # not an op with declared arguments (x[...]): no axis arguments
        return args, kwargs
    kinds = {arg.name: arg.kind for arg in spec.args}

    def swap(axis: Any) -> Any:
        if isinstance(axis, bool) or not isinstance(axis, int) or not -n <= axis < n:
            return axis
        return {1: 2, 2: 1}.get(axis % n, axis % n)

    def move(arguments: dict[str, Any]) -> None:
        for name, value in arguments.items():
            if isinstance(value, dict):  # a lambda's **kwargs, passed on to the op
                move(value)
            elif kinds.get(name) in ("axis", "axes") and value is not None:
                moved = map(swap, value) if isinstance(value, (tuple, list)) else None
                arguments[name] = swap(value) if moved is None else type(value)(moved)

    bound = inspect.signature(info.op).bind(*args, **kwargs)
    bound.apply_defaults()  # a default axis is a logical axis of the permuted array too
    move(bound.arguments)
    return bound.args, bound.kwargs


def _back(result: Any, n: int) -> Any:
    """A result of the permuted call in storage order (what the op gave on the permuted axes,
    transposed back; a dense result with all ``n`` axes kept too), or the result itself."""
    if isinstance(result, ragged.RaggedArray) and result.order is not None:
        return result.transpose(1, 2)
    if isinstance(result, torch.Tensor) and result.dim() == n:
        return result.transpose(1, 2)
    if isinstance(result, tuple):
        return tuple(_back(r, n) for r in result)
    return result


def _same(got: Any, want: Any) -> None:
    if isinstance(want, ragged.RaggedArray):
        assert isinstance(got, ragged.RaggedArray)
        ragged.testing.assert_close(got.with_values(got.values.contiguous()), want, equal_nan=True)
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("info", OPS, ids=[f"{i.name}{i.variant}" for i in OPS])
def test_op_on_a_permuted_layout_answers_or_refuses(info: OpInfo) -> None:
    gen = torch.Generator().manual_seed(0)
    samples = info.samples([2, 0, 3], gen, torch.float64, "contiguous")
    tried = 0
    for sample in samples:
        args, moved = _permuted(sample.call_args())
        if not moved:
            continue
        tried += 1
        n = next(a.ndim for a in args if isinstance(a, ragged.RaggedArray) and a.order)
        args, kwargs = _logical_axes(info, args, sample.kwargs, n)
        try:
            got = info.op(*args, **kwargs)
        except (TypeError, ValueError) as error:
            # Refused: the permuted-layout error, or the op's own check of the axes it got.
            if REFUSAL.search(str(error)):
                continue
            raise
        # Answered: it must be the storage-order answer, permuted alike.
        want = info.op(*sample.call_args(), **sample.kwargs)
        _same(_back(got, n), want)
    if tried == 0:
        pytest.skip("no sample has a one-level array with an inner axis to permute")


# Ops with axis arguments answer on permuted arrays (ragged._storage_order): at least these.
AXIS_OPS = {"sum", "mean", "amax", "softmax", "log_softmax", "cumsum", "sort", "topk", "std"}


def test_axis_ops_answer_on_a_permuted_layout() -> None:
    answered = set()
    for info in OPS:
        if info.name not in AXIS_OPS:
            continue
        gen = torch.Generator().manual_seed(0)
        for sample in info.samples([2, 0, 3], gen, torch.float64, "contiguous"):
            args, moved = _permuted(sample.call_args())
            if moved:
                n = next(a.ndim for a in args if isinstance(a, ragged.RaggedArray) and a.order)
                args, kwargs = _logical_axes(info, args, sample.kwargs, n)
                info.op(*args, **kwargs)  # no refusal
                answered.add(info.name)
    assert answered == AXIS_OPS


@pytest.mark.parametrize(
    ("op", "segment_op"),
    [
        (lambda p: ragged.softmax(p, axis=2), lambda s: torch.softmax(s, 1)),
        (lambda p: ragged.cumsum(p, axis=-1), lambda s: torch.cumsum(s, -1)),
        (lambda p: ragged.sum(p, axis=1), lambda s: s.sum(0)),
        (lambda p: torch.softmax(p, dim=-1), lambda s: torch.softmax(s, -1)),
        (lambda p: p.mean(3, keepdim=True), lambda s: s.mean(2, keepdim=True)),
        (lambda p: ragged.sum(p, axis=2), lambda s: s.sum(1)),
    ],
)
def test_axis_ops_on_the_head_first_layout_match_segments_with_gradients(
    op: Any, segment_op: Any
) -> None:
    """``(B, H, L*, D)`` from ``view(...).transpose(1, 2)``: each op against the same torch call
    on every segment ``(H, L, D)``, and gradcheck through the permuted call."""
    lengths = [2, 0, 3]
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(sum(lengths), 2, 3, generator=gen, dtype=torch.float64)
    x = ragged.from_lengths(values, lengths)
    p = x.transpose(1, 2)
    got = op(p)
    for b, segment in enumerate(p.unbind()):
        want = segment_op(segment)
        part = got[b] if isinstance(got, torch.Tensor) else got.unbind()[b]
        torch.testing.assert_close(part, want)

    def through(v: torch.Tensor) -> torch.Tensor:
        out = op(ragged.from_lengths(v, lengths).transpose(1, 2))
        return out if isinstance(out, torch.Tensor) else out.values

    torch.autograd.gradcheck(through, (values.clone().requires_grad_(),))


def test_axis_ops_on_the_head_first_layout_compile_to_one_graph() -> None:
    """softmax and a keepdim mean over the head-first layout ``(B, H, L*, D)``, then back: one
    graph for three batches of other sizes and lengths."""

    def heads(x: ragged.RaggedArray) -> ragged.RaggedArray:
        q = x.view(*x.shape[:-1], 2, 3).transpose(1, 2)
        out = torch.softmax(q, dim=-1) * q.mean(-1, keepdim=True) + ragged.cumsum(q, axis=1)
        return out.transpose(1, 2).reshape(*x.shape[:-1], -1)

    batches = []
    for seed, lengths in enumerate([[3, 1, 4], [2, 5], [1, 2, 6, 3, 2]]):
        gen = torch.Generator().manual_seed(seed)
        batches.append((ragged.from_lengths(torch.randn(sum(lengths), 6, generator=gen), lengths),))
    check_one_graph(heads, batches, backend="aot_eager")


def test_axis_ops_on_a_permuted_layout_under_vmap() -> None:
    """vmap over an ensemble of scales of a lifted op on ``(B, H, L*, D)`` equals a loop."""
    gen = torch.Generator().manual_seed(2)
    x = ragged.from_lengths(torch.randn(5, 6, generator=gen, dtype=torch.float64), [2, 0, 3])
    q = x.view(*x.shape[:-1], 2, 3).transpose(1, 2)

    def scaled(w: torch.Tensor) -> torch.Tensor:
        return ragged.sum(ragged.softmax(q * w, axis=-1) * q, axis=2)  # (B, H, D), dense

    ws = torch.tensor([0.5, 2.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(scaled)(ws), torch.stack([scaled(w) for w in ws]))
