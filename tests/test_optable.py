"""Generic tests over the op table: every op against its per-segment reference."""

from __future__ import annotations

import inspect
import re
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
from ragged._axes import DENSE
from tests.optable import (
    OpInfo,
    Sample,
    all_ops,
    check_gradients,
    compare_to_reference,
    num_segments,
    segment_args,
)
from tests.strategies import lengths as lengths_strategy

OPS = all_ops()
BY_ID = {op.id: op for op in OPS}
assert len(BY_ID) == len(OPS), "op table ids must be unique"
GRAD_OPS = [op.id for op in OPS if op.grad]
ERROR_CASES = [(op, case) for op in OPS for case in op.errors]
LAYOUTS = ["contiguous", "strided", "transposed"]


def check_against_reference(info: OpInfo, sample: Sample) -> None:
    compare_to_reference(info, sample, info.op(*sample.call_args(), **sample.kwargs))


def snapshot(sample: Sample) -> list[torch.Tensor]:
    return [a.values.clone() for a in sample.args if isinstance(a, ragged.RaggedArray)]


@pytest.mark.parametrize("op_id", list(BY_ID))
@given(lengths=lengths_strategy(), seed=st.integers(0, 2**31 - 1), layout=st.sampled_from(LAYOUTS))
def test_matches_reference(op_id: str, lengths: list[int], seed: int, layout: str) -> None:
    info = BY_ID[op_id]
    gen = torch.Generator().manual_seed(seed)
    for sample in info.samples(lengths, gen, torch.float64, layout):
        before = snapshot(sample)
        check_against_reference(info, sample)
        after = snapshot(sample)
        for a, b in zip(before, after, strict=True):  # no op mutates its inputs
            torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("op_id", GRAD_OPS)
@settings(max_examples=4)
@given(lengths=lengths_strategy(max_segments=4, max_length=3), seed=st.integers(0, 2**31 - 1))
def test_gradcheck(op_id: str, lengths: list[int], seed: int) -> None:
    info = BY_ID[op_id]
    gen = torch.Generator().manual_seed(seed)
    for k, sample in enumerate(info.samples(lengths, gen, torch.float64, "contiguous")):
        check_gradients(info, sample, fast=info.fast_gradcheck and k > 0)


@pytest.mark.parametrize(
    ("info", "case"), ERROR_CASES, ids=[f"{op.id}-{i}" for i, (op, _) in enumerate(ERROR_CASES)]
)
def test_error_inputs(info: OpInfo, case: Any) -> None:
    with pytest.raises(case.error, match="^" + re.escape(case.message) + "$"):
        case.make()


LONG_SEGMENT = [op.id for op in OPS if op.long_segment]
LONG_LENGTHS = [3, 0, 200_000, 1, 7]
ROUNDING = 2.0**-24  # half an ulp of float32: torch can be that exact by luck


def _per_segment(info: OpInfo, sample: Sample) -> torch.Tensor:
    """The reference's results for every segment, flattened into one vector."""
    parts = []
    for b in range(num_segments(sample)):
        ref = info.reference(*segment_args(sample, b), **sample.kwargs)
        parts += [r.reshape(-1) for r in (ref if isinstance(ref, tuple) else (ref,))]
    return torch.cat(parts)


def _flat(out: Any) -> torch.Tensor:
    outs = out if isinstance(out, tuple) else (out,)
    return torch.cat(
        [(o.values if isinstance(o, ragged.RaggedArray) else o).reshape(-1) for o in outs]
    )


def _as_float64(sample: Sample) -> Sample:
    args = tuple(
        a.with_values(a.values.double()) if isinstance(a, ragged.RaggedArray) else a
        for a in sample.args
    )
    return Sample(sample.name, args, sample.kwargs)


@pytest.mark.parametrize("op_id", LONG_SEGMENT)
def test_long_float32_segment_as_accurate_as_torch(op_id: str) -> None:
    # One segment of 200k rows among short ones, in float32: the error against float64 is
    # within 10x of torch's own on the same segment (or of float32's rounding).
    info = BY_ID[op_id]
    gen = torch.Generator().manual_seed(0)
    for sample in info.samples(LONG_LENGTHS, gen, torch.float32, "contiguous"):
        got = _flat(info.op(*sample.call_args(), **sample.kwargs)).double()
        want = _per_segment(info, _as_float64(sample))
        by_torch = _per_segment(info, sample).double()
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)), sample.name
        bar = 10 * max(_relative_error(by_torch, want, finite), ROUNDING)
        assert _relative_error(got, want, finite) <= bar, sample.name


def _relative_error(t: torch.Tensor, want: torch.Tensor, where: torch.Tensor) -> float:
    return float((t[where] - want[where]).norm() / want[where].norm())


# --- axis names: every op's result follows its declared rule ------------------------------------


def _arrays(values: Any) -> list[ragged.RaggedArray]:
    out = []
    for v in values:
        items = v if isinstance(v, (list, tuple)) else (v,)
        out.extend(a for a in items if isinstance(a, ragged.RaggedArray))
    return out


def _generic_names(x: ragged.RaggedArray) -> tuple[str, ...]:
    """Names that line up like positions: ragged axes from the front, inner from the back."""
    inner = x.values.dim() - 1
    ragged_names = [f"r{k}" for k in range(1, x.ragged_ndim + 1)]
    return ("batch", *ragged_names, *[f"i{k - inner}" for k in range(inner)])


def _named(value: Any) -> Any:
    if isinstance(value, ragged.RaggedArray):
        return value if value.axes is not None else value.rename(*_generic_names(value))
    if isinstance(value, (list, tuple)) and any(isinstance(v, ragged.RaggedArray) for v in value):
        return type(value)(_named(v) for v in value)
    return value


def _call(info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults included."""
    for fn in (info.spec.obj, info.op):
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
        except TypeError:
            continue
        bound.apply_defaults()
        call = dict(bound.arguments)
        for name, param in inspect.signature(fn).parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                call.update(call.pop(name, {}))
        return call
    raise AssertionError(f"{info.id}: the sample does not bind to the op's signature")


def _check_names(info: OpInfo, sample: Sample, out: Any) -> None:
    args = sample.call_args()
    expected = info.spec.rule.expected(_arrays(args), _call(info, args, sample.kwargs))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    # The rule names the primary result; the others (indices, counts) follow it when they have
    # as many axes.
    for k, got in enumerate(outs):
        if expected is DENSE:
            assert not isinstance(got, ragged.RaggedArray), f"{info.id}/{sample.name}: not dense"
        elif isinstance(got, ragged.RaggedArray) and (k == 0 or got.ndim == outs[0].ndim):
            assert got.axes == expected, f"{info.id}/{sample.name}: {got.axes} != {expected}"


@pytest.mark.parametrize("op_id", list(BY_ID))
def test_axis_names_follow_the_rule(op_id: str) -> None:
    info = BY_ID[op_id]
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for sample in info.samples([2, 0, 3], gen, torch.float64, "contiguous"):
        args = tuple(_named(a) for a in sample.args)
        named = Sample(sample.name, args, sample.kwargs)
        try:
            out = info.op(*named.call_args(), **named.kwargs)
        except (TypeError, ValueError, IndexError, NotImplementedError):
            info.op(*sample.call_args(), **sample.kwargs)  # valid unnamed: names do not line up
            continue
        _check_names(info, named, out)
        checked += 1
    assert checked, f"{op_id}: no sample could be checked on named inputs"


# --- immutability: every op refuses an array whose tensors were edited in place ---------------


@pytest.mark.parametrize("op_id", list(BY_ID))
def test_in_place_edits_are_caught(op_id: str) -> None:
    info = BY_ID[op_id]
    gen = torch.Generator().manual_seed(0)
    sample = info.samples([2, 0, 3], gen, torch.float64, "contiguous")[0]
    info.op(*sample.call_args(), **sample.kwargs)  # fine before the edit
    target = _arrays(sample.args)[0]
    target.values.copy_(target.values.clone())  # an in-place write: bumps the version counter
    with pytest.raises(ValueError, match="was modified in place after it was built"):
        info.op(*sample.call_args(), **sample.kwargs)
