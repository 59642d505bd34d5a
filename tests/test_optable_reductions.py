"""One driver for every reduction: the common case (the ragged axis of a one-level array) and
the general path agree, the arguments are checked once and alike for every reduction."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ragged
import ragged.ops._reductions._logical as logical
import ragged.ops._reductions._reduce as driver
from ragged._errors import name_of
from tests.optable import OpInfo
from tests.optable.reductions import NAMES
from tests.optable.reductions import OPS as TABLE

# Every reduction with an axis (``count`` takes none), one entry per op and variant.
REDUCTIONS = {info.id: info for info in TABLE if info.name != "count"}
ARG_REDUCTIONS = {"argmax", "argmin"}  # one axis: no tuple


def sample(info: OpInfo) -> ragged.RaggedArray:
    values = torch.randn(10, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    if info.name in ("any", "all", "count_nonzero"):
        values = values.round().clamp(-1, 1)
    return ragged.from_lengths(values, [3, 0, 5, 2])


@pytest.mark.parametrize("op_id", list(REDUCTIONS))
def test_every_spelling_of_the_ragged_axis_gives_the_same_result(op_id: str) -> None:
    """``axis=1`` and the axis name take the driver's short path for the common case; ``-2``
    and ``(1,)`` the general one: all four agree bit for bit."""
    info = REDUCTIONS[op_id]
    x = sample(info)
    spellings: list[tuple[ragged.RaggedArray, Any]] = [
        (x, 1),
        (x.rename(*NAMES), "seq"),
        (x, -2),
    ]
    if info.name not in ARG_REDUCTIONS:
        spellings.append((x, (1,)))
    results = [info.op(arr, axis=axis) for arr, axis in spellings]
    for (_, axis), got in zip(spellings[1:], results[1:], strict=True):
        torch.testing.assert_close(got, results[0], rtol=0, atol=0, equal_nan=True, msg=str(axis))


@pytest.mark.parametrize("keepdims", [0, 1, None, "yes"])
@pytest.mark.parametrize("op_id", list(REDUCTIONS))
def test_keepdims_must_be_a_bool_for_every_reduction(op_id: str, keepdims: Any) -> None:
    """As torch's ``keepdim``: ``keepdims=0`` is refused, not read as False (``ragged.sum``
    once accepted it on its own fast path while ``ragged.mean`` refused it)."""
    info = REDUCTIONS[op_id]
    x = sample(info)
    message = f"ragged.{info.name}: `keepdims` must be a bool, got {type(keepdims).__name__}."
    for axis in (1, -1, None):
        with pytest.raises(TypeError) as caught:
            info.op(x, axis=axis, keepdims=keepdims)
        assert str(caught.value) == message


@pytest.mark.parametrize("op_id", list(REDUCTIONS))
def test_the_arguments_are_checked_once(op_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reduction checks its arguments through the driver's one function, once per call,
    on every path."""
    info = REDUCTIONS[op_id]
    x = sample(info)
    calls: list[str] = []
    check = driver.check_arguments

    def counting(func: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(name_of(func))
        check(func, *args, **kwargs)

    monkeypatch.setattr(driver, "check_arguments", counting)
    monkeypatch.setattr(logical, "check_arguments", counting)
    for kwargs in ({"axis": 1}, {"axis": -1}, {"axis": 1, "keepdims": True}, {"axis": None}):
        calls.clear()
        info.op(x, **kwargs)
        assert calls == [f"ragged.{info.name}"], kwargs
