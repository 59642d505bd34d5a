"""Every op of the op table on a permuted layout (``x.transpose(1, 2)``: the ragged axis after an
inner one): either it answers as on the storage order, permuted the same way, or it refuses
with the permuted-layout error (docs/semantics.md, "Layouts and shapes"). No op may silently
read a permuted array in storage order."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import ragged
from tests.optable import OpInfo, all_ops

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


def _same_axis(kwargs: dict[str, Any], args: tuple[Any, ...]) -> dict[str, Any]:
    """``kwargs`` with an int ``axis`` naming the same axis of the permuted arrays (logical axes
    1 and 2 swap places); a name travels with its axis."""
    axis = kwargs.get("axis")
    if not isinstance(axis, int) or isinstance(axis, bool):
        return kwargs
    ndim = next(a.ndim for a in args if isinstance(a, ragged.RaggedArray))
    moved = {1: 2, 2: 1}.get(axis % ndim, axis % ndim)
    return {**kwargs, "axis": moved}


def _back(result: Any) -> Any:
    """A result of the permuted call in storage order (what the op gave on the permuted axes,
    transposed back), or the result itself where it is not a permuted array."""
    if isinstance(result, ragged.RaggedArray) and result.order is not None:
        return result.transpose(1, 2)
    if isinstance(result, tuple):
        return tuple(_back(r) for r in result)
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
        args, moved = _permuted(sample.args)
        if not moved:
            continue
        tried += 1
        try:
            got = info.op(*args, **_same_axis(sample.kwargs, args))
        except (TypeError, ValueError) as error:
            # Refused: the permuted-layout error, or the op's own check of the axes it got.
            if REFUSAL.search(str(error)):
                continue
            raise
        # Answered: it must be the storage-order answer, permuted alike.
        want = info.op(*sample.args, **sample.kwargs)
        _same(_back(got), want)
    if tried == 0:
        pytest.skip("no sample has a one-level array with an inner axis to permute")
