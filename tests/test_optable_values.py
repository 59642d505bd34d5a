"""The op table's value policy (``tests/optable/values.py``): every reduction, normalisation
and binary op on NaN, infinities, signed zeros and large magnitudes against its per-segment
reference, its declared ``nan_policy`` and a reduction's ``identity``."""

from __future__ import annotations

import pytest
import torch

import ragged.ops._reductions._statistics as statistics
from tests.optable import all_ops
from tests.optable.values import check_extreme_values, check_identity, check_nan_policy

OPS = {info.id: info for info in all_ops() if info.nan_policy is not None}
IDENTITIES = [op_id for op_id, info in OPS.items() if info.identity is not None]
FAMILIES = ("reductions", "normalization", "elementwise")


def test_every_reduction_normalisation_and_binary_op_declares_a_policy() -> None:
    """A new op of these families must state what NaN does to it."""
    missing = []
    for info in all_ops():
        spec = info.spec
        floats = info.name not in {
            *("logical_and", "logical_or", "logical_xor", "bitwise_not", "logical_not"),
            *("bitwise_and", "bitwise_or", "bitwise_xor", "count", "where", "apply"),
        }
        if spec.family in FAMILIES and floats and info.nan_policy is None:
            missing.append(info.id)
    assert not missing


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("op_id", list(OPS))
def test_extreme_values_match_the_reference(op_id: str, seed: int) -> None:
    check_extreme_values(OPS[op_id], seed)


@pytest.mark.parametrize("op_id", list(OPS))
def test_the_declared_nan_policy_holds(op_id: str) -> None:
    check_nan_policy(OPS[op_id], 0)


@pytest.mark.parametrize("op_id", IDENTITIES)
def test_an_empty_segment_gives_the_identity(op_id: str) -> None:
    check_identity(OPS[op_id])


@pytest.mark.parametrize("op_id", ["nansum", "nanmean"])
def test_a_nan_ignoring_reduction_done_as_the_plain_one_fails_the_table(
    op_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutant of the issue: ``nansum``/``nanmean`` computed as ``sum``/``mean`` (NaN kept)
    passes every test without NaN in its samples; the value policy must catch it."""
    info = OPS[op_id]
    check_nan_policy(info, 0)  # the real op passes
    monkeypatch.setattr(statistics, "omit_nan", lambda v: (v, torch.ones_like(v)))
    with pytest.raises(AssertionError, match="NaN must be omitted"):
        check_nan_policy(info, 0)
    with pytest.raises(AssertionError):
        check_extreme_values(info, 0)
