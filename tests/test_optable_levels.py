"""The op table on two- and three-level arrays, against nested per-row loops.

Every op's one-level samples run lifted onto multi-level partitions (its segments become the
rows of the innermost ragged axis; ``tests/optable/levels.py``), and every op with samples along
outer ragged axes (``OpInfo.levels``) runs against the nested reference they carry. The
transforms of the one-level table (gradcheck, gradgradcheck and forward AD, vmap over values,
one compiled graph) run on both kinds, with few examples: the one-level table covers the edge
cases of the kernels, these cover the multi-level machinery.
"""

from __future__ import annotations

import random
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import ragged
import ragged.testing
from tests.optable import (
    OpInfo,
    Sample,
    all_ops,
    check_gradients,
    check_one_graph,
    check_vmap_over_values,
)
from tests.optable.levels import broadcasts, check_lifted, lifted
from tests.optable.nested import assert_trees_close, to_tree
from tests.strategies import nested_lengths
from tests.test_optable import _check_names, _named

OPS = {op.id: op for op in all_ops()}
LIFTED = [k for k, op in OPS.items() if op.lift]
LEVELS = [k for k, op in OPS.items() if op.levels is not None]
LAYOUTS = ["contiguous", "strided", "transposed"]


def level_samples(info: OpInfo, structure: list[list[int]], seed: int, layout: str) -> list[Any]:
    gen = torch.Generator().manual_seed(seed)
    assert info.levels is not None
    return info.levels(structure, gen, torch.float64, layout)


@pytest.mark.parametrize("op_id", LIFTED)
@settings(max_examples=5, deadline=None)
@given(structure=nested_lengths(), seed=st.integers(0, 2**31 - 1), layout=st.sampled_from(LAYOUTS))
def test_lifted_rows_match_the_reference(
    op_id: str, structure: list[list[int]], seed: int, layout: str
) -> None:
    info = OPS[op_id]
    gen = torch.Generator().manual_seed(seed)
    ran = [
        check_lifted(info, s, structure)
        for s in info.samples(structure[-1], gen, torch.float64, layout)
    ]
    assert any(ran), f"{op_id}: no sample lifts"


@pytest.mark.parametrize("op_id", LEVELS)
@settings(max_examples=8, deadline=None)
@given(structure=nested_lengths(), seed=st.integers(0, 2**31 - 1), layout=st.sampled_from(LAYOUTS))
def test_outer_axes_match_the_nested_reference(
    op_id: str, structure: list[list[int]], seed: int, layout: str
) -> None:
    info = OPS[op_id]
    for sample in level_samples(info, structure, seed, layout):
        before = [a.values.clone() for a in sample.args if isinstance(a, ragged.RaggedArray)]
        out = info.op(*sample.call_args(), **sample.kwargs)
        assert sample.expected is not None
        try:
            assert_trees_close(to_tree(out), sample.expected(), atol=info.atol, rtol=info.rtol)
        except AssertionError as error:
            raise AssertionError(f"{op_id}/{sample.name} on {structure}: {error}") from None
        after = [a.values for a in sample.args if isinstance(a, ragged.RaggedArray)]
        for a, b in zip(before, after, strict=True):
            torch.testing.assert_close(a, b, equal_nan=True)


def test_every_op_runs_on_multi_level_arrays() -> None:
    """Every op is lifted or has samples of its own; those not lifted say why."""
    for info in OPS.values():
        assert info.lift or info.levels is not None, f"{info.id}: no multi-level samples"
        assert info.lift or info.levels_reason, f"{info.id}: not lifted without a reason"


# --- transforms -------------------------------------------------------------------------------

SMALL3 = [[2, 1, 0], [1, 2, 0], [2, 0, 1]]  # (B, A*, S*, T*): empty rows at every level


def transform_samples(info: OpInfo, structure: list[list[int]]) -> list[Sample]:
    """Samples for the transform checks: the outer-axis ones, and the first lifted one."""
    gen = torch.Generator().manual_seed(0)
    out = info.levels(structure, gen, torch.float64, "contiguous") if info.levels else []
    if info.lift:
        for sample in info.samples(structure[-1], gen, torch.float64, "contiguous"):
            up = lifted(sample, structure, info.spec.obj, broadcast=broadcasts(info))
            if up is not None:
                out.append(up)
                break
    return out


@pytest.mark.parametrize("op_id", [k for k, op in OPS.items() if op.grad])
def test_gradients_on_multi_level_arrays(op_id: str) -> None:
    """Three levels: the outer-axis samples along axes 1 and 2, and a lifted one."""
    info = OPS[op_id]
    for sample in transform_samples(info, SMALL3)[:3]:
        check_gradients(info, sample)


@pytest.mark.parametrize("op_id", [k for k, op in OPS.items() if op.vmap])
def test_vmap_over_values_of_multi_level_arrays(op_id: str) -> None:
    info = OPS[op_id]
    samples = transform_samples(info, SMALL3)
    if not samples:
        pytest.skip("no multi-level sample")
    check_vmap_over_values(info, samples[0])


def _structures() -> list[list[list[int]]]:
    """Nested batches of different sizes (one segment, empty rows and segments included)."""
    rng = random.Random(0)
    out = [[[2, 0, 1], [3, 1, 2]], [[1], [2]], [[3, 2], [0, 4, 1, 2, 2]]]
    top = [rng.randint(0, 3) for _ in range(rng.randint(1, 4))]
    out.append([top, [rng.randint(0, 4) for _ in range(sum(top))]])
    return out


def _compiles(info: OpInfo) -> bool:
    """Ops with their own multi-level code path: samples along outer axes, or lifted ops that
    run on views of the innermost level (attention, pair maps). Other lifted ops run their
    one-level code on the values unchanged (checked by the one-level compile test)."""
    if info.levels is None and info.spec.family not in ("attention", "pairs"):
        return False
    if info.levels_compile is not None:
        return info.levels_compile
    return info.compile and not info.data_dependent


@pytest.mark.parametrize("op_id", [k for k, op in OPS.items() if _compiles(op)])
def test_multi_level_compiles_once(op_id: str) -> None:
    """One graph across nested batches, for the first multi-level sample of every op whose
    one-level samples compile once (and whose multi-level path has static sizes)."""
    info = OPS[op_id]
    batches = []
    for i, structure in enumerate(_structures()):
        gen = torch.Generator().manual_seed(i)
        if info.levels is not None:
            sample = info.levels(structure, gen, torch.float32, "contiguous")[0]
        else:
            one = info.samples(structure[-1], gen, torch.float32, "contiguous")
            sample = next(
                s
                for s in (
                    lifted(o, structure, info.spec.obj, broadcast=broadcasts(info)) for o in one
                )
                if s is not None
            )
        batches.append(sample)
    kwargs = batches[0].kwargs
    fn = lambda *args: info.op(*args, **kwargs)
    check_one_graph(fn, [s.call_args() for s in batches], backend="aot_eager")


@pytest.mark.parametrize("op_id", LEVELS)
def test_axis_names_follow_the_rule_on_outer_axes(op_id: str) -> None:
    """The declared axis rule names the results of the outer-axis samples too."""
    info = OPS[op_id]
    checked = 0
    for sample in level_samples(info, SMALL3, 0, "contiguous"):
        named = Sample(sample.name, tuple(_named(a) for a in sample.args), sample.kwargs)
        try:
            out = info.op(*named.call_args(), **named.kwargs)
        except (TypeError, ValueError, IndexError):
            continue  # names that do not line up (e.g. a new axis without `name=`)
        _check_names(info, named, out)
        checked += 1
    assert checked or op_id in ("unflatten", "split-concat_roundtrip"), op_id
