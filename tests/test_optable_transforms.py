"""Generic transform tests over the op table: torch.func (vjp, jvp, hessian, vmap) against finite
differences and loops, and torch.compile (one graph over ten batches, no syncs)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

import ragged
import ragged.testing
from tests.optable import OpInfo, Sample, all_ops, check_one_graph, check_vmap_over_values

OPS = {op.id: op for op in all_ops()}
GRAD = [k for k, op in OPS.items() if op.grad]
GRADGRAD = [k for k, op in OPS.items() if op.grad and op.gradgrad]
VMAP = [k for k, op in OPS.items() if op.vmap]
COMPILE = [k for k, op in OPS.items() if op.compile]
LENGTHS = [3, 0, 5, 1, 2]


def first_sample(
    info: OpInfo, lengths: list[int] = LENGTHS, seed: int = 0, dtype: torch.dtype = torch.float64
) -> Sample:
    gen = torch.Generator().manual_seed(seed)
    return info.samples(lengths, gen, dtype, "contiguous")[0]


def ragged_position(sample: Sample) -> int:
    return next(
        i
        for i, a in enumerate(sample.args)
        if isinstance(a, ragged.RaggedArray) and a.values.is_floating_point()
    )


def as_function(info: OpInfo, sample: Sample):
    """The op as a function of one RaggedArray argument, returning a finite float tensor."""
    pos = ragged_position(sample)
    args = list(sample.call_args())

    def fn(x: ragged.RaggedArray) -> torch.Tensor:
        call = list(args)
        call[pos] = x
        out = info.op(*call, **sample.kwargs)
        out = out[0] if isinstance(out, tuple) else out
        t = out.values if isinstance(out, ragged.RaggedArray) else out
        return torch.where(torch.isfinite(t.detach()), t, 0.0)

    return fn, args[pos]


def central_difference(
    fn: Any, x: ragged.RaggedArray, tangent: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    plus = fn(x.with_values(x.values + eps * tangent))
    minus = fn(x.with_values(x.values - eps * tangent))
    return (plus - minus) / (2 * eps)


@pytest.mark.parametrize("op_id", GRAD)
def test_vjp_and_jvp_against_finite_differences(op_id: str) -> None:
    info = OPS[op_id]
    fn, x = as_function(info, first_sample(info))
    gen = torch.Generator().manual_seed(1)
    tangent = torch.randn(x.values.shape, generator=gen, dtype=x.dtype)
    expected = central_difference(fn, x, tangent)
    if info.forward_ad:
        _, jvp_out = torch.func.jvp(fn, (x,), (x.with_values(tangent),))
        torch.testing.assert_close(jvp_out, expected, atol=1e-5, rtol=1e-5)
    out, pullback = torch.func.vjp(fn, x)
    cotangent = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    (grad,) = pullback(cotangent)
    assert isinstance(grad, ragged.RaggedArray)
    assert grad.partition is x.partition
    # <J^T c, t> == <c, J t>
    torch.testing.assert_close(
        (grad.values * tangent).sum(), (cotangent * expected).sum(), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("op_id", GRADGRAD)
def test_hessian_against_finite_differences(op_id: str) -> None:
    info = OPS[op_id]
    fn, x = as_function(info, first_sample(info, lengths=[2, 0, 3]))
    loss = lambda x: (fn(x) ** 2).sum() + fn(x).sum()
    hessian = torch.func.hessian(loss)(x)  # a RaggedArray whose values are RaggedArrays
    assert isinstance(hessian, ragged.RaggedArray)
    assert hessian.partition is x.partition
    inner = hessian.values
    assert isinstance(inner, ragged.RaggedArray)
    flat = inner.values.reshape(x.values.numel(), x.values.numel())
    gen = torch.Generator().manual_seed(2)
    tangent = torch.randn(x.values.shape, generator=gen, dtype=x.dtype)
    grad = lambda v: torch.func.grad(loss)(x.with_values(v)).values
    eps = 1e-6
    expected = (grad(x.values + eps * tangent) - grad(x.values - eps * tangent)) / (2 * eps)
    torch.testing.assert_close(
        (flat @ tangent.reshape(-1)).reshape(x.values.shape), expected, atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize("op_id", VMAP)
def test_vmap_over_a_leading_batch_of_values(op_id: str) -> None:
    info = OPS[op_id]
    check_vmap_over_values(info, first_sample(info))


def compile_batches(info: OpInfo) -> list[tuple[Any, ...]]:
    """Ten batches of different B, total and max length, including B=1, a one-row segment and
    empty segments (the 0/1 cases that specialise by default)."""
    rng = random.Random(0)
    shapes = [[3, 0, 5, 2], [1], [4, 4], [0, 2, 7, 1, 3, 6], [2, 9]]
    shapes += [[rng.randint(0, 8) for _ in range(rng.randint(1, 9))] for _ in range(5)]
    out = []
    for i, lengths in enumerate(shapes):
        sample = first_sample(info, lengths=lengths, seed=i, dtype=torch.float32)
        out.append((sample, sample.call_args()))
    return out


@pytest.mark.parametrize("op_id", COMPILE)
def test_compiles_once_without_syncs(op_id: str) -> None:
    info = OPS[op_id]
    batches = compile_batches(info)
    kwargs = batches[0][0].kwargs
    fn = lambda *args: info.op(*args, **kwargs)
    # aot_eager trips a torch 2.13 assertion on some data-dependent sizes ("possible memo
    # disaster" in rebind_unbacked): data-dependent ops are checked at the Dynamo level.
    backend = "eager" if info.data_dependent else "aot_eager"
    check_one_graph(
        fn,
        [args for _, args in batches],
        backend=backend,
        allow_unbacked=info.data_dependent,
    )
