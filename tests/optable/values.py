"""The op table's value policy: NaN, infinities, signed zeros and large magnitudes.

Every entry that declares ``nan_policy`` (``tests/optable/__init__.py``) runs its own samples
with the values of its floating-point RaggedArray arguments replaced by :func:`extreme_values`
and compares the op with its per-segment reference (torch's own behaviour on each segment).
The declared policy is then checked on samples whose NaNs sit where a NaN-ignoring op still has
a number in every reduced column (:func:`sprinkle_nan`): "propagate" gives a NaN in every
segment that holds one, "omit" none in any non-empty segment. A reduction's ``identity`` is
checked on an empty segment, in the op and in the reference.
"""

from __future__ import annotations

import dataclasses
import math

import torch

import ragged

from . import OpInfo, Sample, compare_to_reference, num_segments, segment_args

# Large magnitudes of one sign: opposite signs would cancel in an order-dependent way (the
# op's and torch's summation orders differ), and cubes of them still fit in a float64.
POOL = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e60, 3e59, 1e-300)
LENGTHS = ([3, 0, 5, 2], [1], [4, 1])


def extreme_values(values: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``values`` with about half its entries replaced by NaN, ``inf``, ``-inf``, ``0.0``,
    ``-0.0``, large and tiny magnitudes (the rest stay as drawn)."""
    pool = torch.tensor(POOL, dtype=values.dtype)
    pick = pool[torch.randint(len(POOL), values.shape, generator=gen)]
    keep = torch.rand(values.shape, generator=gen) < 0.5
    return torch.where(keep, values, pick)


def sprinkle_nan(values: torch.Tensor, offsets: list[int], gen: torch.Generator) -> torch.Tensor:
    """NaN in the first inner entry of about half the rows that are not a segment's first row:
    every segment keeps a number in each column (its first row) and every row in each inner
    column but the first."""
    flat = values.reshape(values.shape[0], -1).clone()
    not_first = torch.ones(values.shape[0], dtype=torch.bool)
    not_first[[o for o in offsets[:-1] if o < values.shape[0]]] = False
    hit = not_first & (torch.rand(values.shape[0], generator=gen) < 0.5)
    flat[hit, 0] = math.nan
    return flat.reshape(values.shape)


def _poisoned(sample: Sample, gen: torch.Generator, nan_only: bool) -> Sample:
    args = []
    for a in sample.args:
        if isinstance(a, ragged.RaggedArray) and a.values.is_floating_point():
            if nan_only:
                a = a.with_values(sprinkle_nan(a.values, a.offsets.tolist(), gen))
            else:
                a = a.with_values(extreme_values(a.values, gen))
        args.append(a)
    return dataclasses.replace(sample, args=tuple(args), name=f"{sample.name}-values")


def value_samples(info: OpInfo, seed: int, *, nan_only: bool = False) -> list[Sample]:
    """The op's own float64 samples on :data:`LENGTHS`, with extreme values (or, with
    ``nan_only``, sprinkled NaNs) in their floating-point RaggedArray arguments."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for lengths in LENGTHS:
        for sample in info.samples(list(lengths), gen, torch.float64, "contiguous"):
            out.append(_poisoned(sample, gen, nan_only))
    return out


def _outputs(out: object, count: int) -> list[list[torch.Tensor]]:
    """Segment ``b``'s results (one tensor per output) of an op's result."""
    outs = out if isinstance(out, tuple) else (out,)
    per = [[] for _ in range(count)]  # type: list[list[torch.Tensor]]
    for o in outs:
        parts = o.unbind() if isinstance(o, ragged.RaggedArray) else list(o)
        for b in range(count):
            per[b].append(parts[b])
    return per


def _has_nan(tensors: list[torch.Tensor]) -> bool:
    return any(t.is_floating_point() and bool(torch.isnan(t).any()) for t in tensors)


def check_extreme_values(info: OpInfo, seed: int) -> None:
    """The op against its per-segment reference on samples with extreme values."""
    if info.extreme_reference is not None:
        info = dataclasses.replace(info, reference=info.extreme_reference)
    for sample in value_samples(info, seed):
        compare_to_reference(info, sample, info.op(*sample.call_args(), **sample.kwargs))


def check_nan_policy(info: OpInfo, seed: int) -> None:
    """The declared ``nan_policy`` holds, in the op and in its reference."""
    assert info.nan_policy in ("propagate", "omit", "value"), info.nan_policy
    for sample in value_samples(info, seed, nan_only=True):
        count = num_segments(sample)
        got = _outputs(info.op(*sample.call_args(), **sample.kwargs), count)
        for b in range(count):
            inputs = [a for a in segment_args(sample, b) if isinstance(a, torch.Tensor)]
            ref = info.reference(*segment_args(sample, b), **sample.kwargs)
            expected = list(ref) if isinstance(ref, tuple) else [ref]
            where = f"{info.id} {sample.name} segment {b}"
            if info.nan_policy == "propagate" and _has_nan(inputs):
                assert _has_nan(got[b]), f"{where}: a NaN in the segment must reach its result"
                assert _has_nan(expected), f"{where}: the reference does not propagate NaN"
            if info.nan_policy == "omit" and inputs and inputs[0].shape[0]:
                assert not _has_nan(got[b]), f"{where}: NaN must be omitted, got {got[b]}"
                assert not _has_nan(expected), f"{where}: the reference does not omit NaN"
        compare_to_reference(info, sample, info.op(*sample.call_args(), **sample.kwargs))


def check_identity(info: OpInfo) -> None:
    """An empty segment gives ``identity`` along the ragged axis, in the op and the reference."""
    x = ragged.from_lengths(torch.arange(9.0, dtype=torch.float64).reshape(3, 3), [2, 0, 1])
    out = info.op(x, axis=1)
    expected = torch.full((3,), info.identity, dtype=out.dtype)
    torch.testing.assert_close(out[1], expected, rtol=0, atol=0, equal_nan=True)
    ref = info.reference(x.unbind()[1], axis=1)
    torch.testing.assert_close(ref, expected, rtol=0, atol=0, equal_nan=True, check_dtype=False)
