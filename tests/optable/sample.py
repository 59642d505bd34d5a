"""Op table entries: sampling (``ragged.ops._sample``).

Sampling is random, so the table holds only its deterministic cases: a quota of 0 (nothing
chosen) and quotas at least the segment's length (everything chosen, in order). The
distribution (uniformity, counts, no duplicates, seeding) is tested in ``tests/test_sample.py``.
"""

from __future__ import annotations

from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, PerSegment, Sample, ragged_randn
from .nested import along, nested_randn, ragged_axes, tree

BIG = 1000  # larger than any sampled segment: every row is chosen


def _quotas(lengths: list[int], x: ragged.RaggedArray, scale: int = 1) -> list[Sample]:
    """Quotas 0, BIG, and per segment ``scale * length`` (+ 2): all saturating."""
    extra: dict[str, Any] = {}
    per_segment = scale * torch.tensor(lengths, dtype=torch.int64)
    seeded = {"generator": torch.Generator().manual_seed(0), **extra}
    return [
        Sample("k0", (x, 0), extra),
        Sample("k_big", (x, BIG), seeded),
        Sample("k_lengths", (x, PerSegment(per_segment)), extra),
        Sample("k_lengths_plus", (x, PerSegment(per_segment + 2)), seeded),
    ]


def row_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [*_quotas(lengths, x), Sample("named", (x.rename("b", "l", "d"), BIG))]


def label_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    ints = ragged_randn(lengths, (), gen, torch.int64, layout)
    ints = ints.with_values(ints.values.clamp(-1, 1))
    bools = ints.with_values(ints.values > 0)
    return [
        # balanced quotas saturate at twice the length (half of k goes to positives)
        *_quotas(lengths, ints, scale=2),
        *[
            Sample(f"bool_{s.name}", (bools, *s.args[1:]), s.kwargs)
            for s in _quotas(lengths, bools, scale=2)
        ],
        Sample("positives_only", (ints, BIG), {"positive_fraction": 1.0}),
        Sample("negatives_only", (ints, BIG), {"positive_fraction": 0.0}),
    ]


def _all_or_none(n: int, k: Any) -> bool:
    k = int(k)
    assert k == 0 or k >= n, "the table holds only deterministic quotas"
    return k >= n


def mask_reference(segment: torch.Tensor, k: Any, **kwargs: Any) -> torch.Tensor:
    return torch.full((segment.shape[0],), _all_or_none(segment.shape[0], k), dtype=torch.bool)


def sample_reference(segment: torch.Tensor, k: Any, **kwargs: Any) -> torch.Tensor:
    return segment if _all_or_none(segment.shape[0], k) else segment[:0]


def balanced_reference(
    labels: torch.Tensor, k: Any, positive_fraction: float = 0.5, **kwargs: Any
) -> torch.Tensor:
    """Torchvision's rule with saturated quotas: each class is taken whole or not at all."""
    k = int(k)
    positive = labels if labels.dtype == torch.bool else labels >= 1
    negative = ~labels if labels.dtype == torch.bool else labels == 0
    p, n = int(positive.sum()), int(negative.sum())
    num_pos = min(p, round(k * positive_fraction))
    num_neg = min(n, k - num_pos)
    assert num_pos in (0, p) and num_neg in (0, n), "the table holds only deterministic quotas"
    return (positive & (num_pos == p)) | (negative & (num_neg == n))


def _level_quotas(mask: bool) -> Any:
    """Deterministic quotas along every outer ragged axis: 0, more than any row, and each
    row's own length (a tensor with one entry per row of the axis above)."""

    def samples(
        structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = nested_randn(structure, (3,), gen, dtype, layout)
        out = []
        for axis in ragged_axes(structure):
            lengths = x.partition.levels[axis - 1].lengths
            for name, k in (("k0", 0), ("k_big", BIG), ("k_lengths", lengths)):
                chosen = not (isinstance(k, int) and k == 0)
                if mask:
                    fn = lambda items, c=chosen: [torch.tensor(c)] * len(items)
                else:
                    fn = lambda items, c=chosen: items if c else []
                expected = lambda a=axis, f=fn: along(x, a, f)
                if not mask and chosen:
                    expected = lambda: tree(x)
                out.append(Sample(f"axis{axis}_{name}", (x, k), {"axis": axis}, expected))
        return out

    return samples


X = ragged.array([[1.0, 2.0], [3.0]])
NO_GRAD = {"grad": False, "gradgrad": False, "forward_ad": False}


def _k_errors(op: Any, name: str, x: ragged.RaggedArray) -> list[ErrorCase]:
    func = f"ragged.{name}"
    return [
        ErrorCase(lambda: op(x, -1), ValueError, f"{func}: `k` must be non-negative, got -1."),
        ErrorCase(
            lambda: op(x, 1.5),
            TypeError,
            f"{func}: `k` must be an int or an integer Tensor of shape (B,), got float.",
        ),
        ErrorCase(
            lambda: op(x, torch.ones(3, dtype=torch.int64)),
            ValueError,
            f"{func}: `k` must be an int or have shape (2,), got (3,).",
        ),
        ErrorCase(
            lambda: op(x, torch.ones(2)),
            TypeError,
            f"{func}: `k` must have an integer dtype, got torch.float32.",
        ),
    ]


LABELS = ragged.array([[1, 0], [-1]])

OPS = [
    OpInfo(
        "sample_mask",
        ragged.sample_mask,
        mask_reference,
        row_samples,
        # The draw does not depend on the values, and torch.func.vmap refuses random ops in its
        # default randomness="error" mode: vmap over values needs randomness="same".
        vmap=False,
        levels=_level_quotas(mask=True),
        errors=[
            *_k_errors(ragged.sample_mask, "sample_mask", X),
            ErrorCase(
                lambda: ragged.sample_mask(X.values, 1),
                TypeError,
                "ragged.sample_mask: `x` must be a RaggedArray, got Tensor(shape=(3,), dtype=torch.float32).",
            ),
        ],
        **NO_GRAD,
    ),
    OpInfo(
        "sample",
        ragged.sample,
        sample_reference,
        row_samples,
        vmap=False,  # as above
        # torch.func.hessian vmaps the draw, which vmap's default randomness="error" refuses;
        # the selection is piecewise constant, so its second derivative is zero anyway.
        gradgrad=False,
        data_dependent=True,
        levels=_level_quotas(mask=False),
        errors=[
            *_k_errors(ragged.sample, "sample", X),
            ErrorCase(
                lambda: ragged.sample(X, 1, replace=1),
                TypeError,
                "ragged.sample: `replace` must be a bool, got int.",
            ),
        ],
    ),
    OpInfo(
        "sample_balanced",
        ragged.sample_balanced,
        balanced_reference,
        label_samples,
        # The draw does not depend on the values, and torch.func.vmap refuses random ops in its
        # default randomness="error" mode: vmap over values needs randomness="same".
        vmap=False,
        errors=[
            *_k_errors(ragged.sample_balanced, "sample_balanced", LABELS),
            ErrorCase(
                lambda: ragged.sample_balanced(X, 1),
                TypeError,
                "ragged.sample_balanced: `labels` must have an integer or bool dtype, got torch.float32.",
            ),
            ErrorCase(
                lambda: ragged.sample_balanced(ragged.array([[[1, 0]], [[0, 1]]]), 1),
                ValueError,
                "ragged.sample_balanced: `labels` must have shape (B, L*) (one label per row), got inner shape (2,).",
            ),
            ErrorCase(
                lambda: ragged.sample_balanced(LABELS, 1, positive_fraction=1.5),
                ValueError,
                "ragged.sample_balanced: `positive_fraction` must be in [0, 1], got 1.5.",
            ),
        ],
        **NO_GRAD,
    ),
]
