"""Op table entries: normalisations (``ragged.ops._normalize``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F

import ragged

from . import ErrorCase, OpInfo, Sample, axis_errors, ragged_randn, randn
from .nested import column_levels
from .reductions import NAMES, segment_dims


def _softmax_reference(log: bool) -> Any:
    def reference(segment: torch.Tensor, axis: Any) -> torch.Tensor:
        (dim,) = segment_dims(axis)
        return (torch.log_softmax if log else torch.softmax)(segment, dim)

    return reference


def _softmax_extremes(log: bool) -> Any:
    """torch's softmax, except along the ragged axis where a column holds ``+inf`` and no NaN:
    the infinite entries take all the mass (``inf / inf``: NaN) and the others get 0 (log:
    ``-inf``), where torch gives NaN to the whole column (``docs/semantics.md``)."""
    torch_reference = _softmax_reference(log)

    def reference(segment: torch.Tensor, axis: Any) -> torch.Tensor:
        out = torch_reference(segment, axis)
        if segment_dims(axis) != (0,):
            return out
        infinite = segment == math.inf
        takes = infinite.any(0, keepdim=True) & ~torch.isnan(segment).any(0, keepdim=True)
        mass = torch.where(infinite, math.nan, -math.inf if log else 0.0)
        return torch.where(takes, mass.to(out.dtype), out)

    return reference


def _softmax_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("ragged", (x,), {"axis": 1}),
        Sample("inner", (x,), {"axis": -1}),
        Sample("named", (x.rename(*NAMES),), {"axis": "seq"}),
    ]


def _normalize_reference(
    segment: torch.Tensor, axis: Any = 1, *, correction: float = 0, eps: float = 1e-5
) -> torch.Tensor:
    (dim,) = segment_dims(axis)
    centred = segment - segment.mean(dim, keepdim=True)
    dof = segment.shape[dim] - correction
    squares = centred.square().sum(dim, keepdim=True)
    var = squares / dof if dof > 0 else torch.full_like(squares, torch.nan)
    return centred / torch.sqrt(var + eps)


def _normalize_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    shifted = x.with_values(x.values * 3 + 100)  # a large offset: the two-pass variance
    return [
        Sample("ragged", (x,)),
        Sample("offset", (shifted,), {"eps": 1e-3}),
        Sample("correction1", (x,), {"axis": 1, "correction": 1}),
        Sample("inner", (x,), {"axis": -1}),
        Sample("named", (x.rename(*NAMES),), {"axis": "seq"}),
    ]


def _norm_samples(rms: bool) -> Any:
    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = ragged_randn(lengths, (2, 3), gen, dtype, layout)
        weight = randn((3,), gen, dtype)
        weight2 = randn((2, 3), gen, dtype)
        out = [
            Sample("last", (x, 3)),
            Sample("last_two", (x, (2, 3)), {"eps": 1e-3}),
            Sample("weight", (x, [3], weight)),
            Sample("weight_two", (x, (2, 3)), {"weight": weight2}),
        ]
        if not rms:
            out.append(Sample("weight_bias", (x, (3,), weight, randn((3,), gen, dtype))))
        return out

    return samples


def _axis_errors(op: Any, name: str) -> list[ErrorCase]:
    return [
        *axis_errors(op, name, out_of_range=3),
        ErrorCase(
            lambda: op(ragged.array([[1, 2]]), axis=1),
            TypeError,
            f"ragged.{name}: `x` must have a floating-point dtype, got torch.int64.",
        ),
    ]


def _norm_errors(op: Any, name: str) -> list[ErrorCase]:
    x = ragged.from_lengths(torch.zeros(3, 2, 4), [1, 2])
    func = f"ragged.{name}"
    return [
        ErrorCase(
            lambda: op(x, 3),
            ValueError,
            f"{func}: `normalized_shape` must be a non-empty suffix of the inner shape (2, 4), got (3,).",
        ),
        ErrorCase(
            lambda: op(x, (3, 2, 4)),
            ValueError,
            f"{func}: `normalized_shape` must be a non-empty suffix of the inner shape (2, 4), got (3, 2, 4).",
        ),
        ErrorCase(
            lambda: op(x, ()),
            ValueError,
            f"{func}: `normalized_shape` must be a non-empty suffix of the inner shape (2, 4), got ().",
        ),
        ErrorCase(
            lambda: op(x, 4.0),
            TypeError,
            f"{func}: `normalized_shape` must be an int or a sequence of ints, got 4.0.",
        ),
        ErrorCase(
            lambda: op(x, 4, torch.ones(2, 4)),
            ValueError,
            f"{func}: `weight` must have shape (4,) (normalized_shape), got (2, 4).",
        ),
        ErrorCase(
            lambda: op(ragged.array([[1, 2]]), 1),
            TypeError,
            f"{func}: `x` must have a floating-point dtype, got torch.int64.",
        ),
    ]


def _layer_norm_reference(
    segment: torch.Tensor,
    shape: Any,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    return F.layer_norm(segment, dims, weight, bias, eps)


def _rms_norm_reference(
    segment: torch.Tensor, shape: Any, weight: torch.Tensor | None = None, eps: Any = None
) -> torch.Tensor:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    return F.rms_norm(segment, dims, weight, eps)


OPS = [
    OpInfo(
        "softmax",
        ragged.softmax,
        _softmax_reference(log=False),
        _softmax_samples,
        errors=_axis_errors(ragged.softmax, "softmax"),
        long_segment=True,
        levels=column_levels(_softmax_reference(log=False), [{}]),
        extreme_reference=_softmax_extremes(log=False),
    ),
    OpInfo(
        "log_softmax",
        ragged.log_softmax,
        _softmax_reference(log=True),
        _softmax_samples,
        errors=_axis_errors(ragged.log_softmax, "log_softmax"),
        long_segment=True,
        levels=column_levels(_softmax_reference(log=True), [{}]),
        extreme_reference=_softmax_extremes(log=True),
    ),
    OpInfo(
        "layer_norm",
        ragged.layer_norm,
        _layer_norm_reference,
        _norm_samples(rms=False),
        errors=[
            *_norm_errors(ragged.layer_norm, "layer_norm"),
            ErrorCase(
                lambda: ragged.layer_norm(ragged.array([[1.0]]), (), bias=torch.ones(1)),
                ValueError,
                "ragged.layer_norm: `normalized_shape` must be a non-empty suffix of the inner shape (), got ().",
            ),
        ],
    ),
    OpInfo(
        "rms_norm",
        ragged.rms_norm,
        _rms_norm_reference,
        _norm_samples(rms=True),
        errors=_norm_errors(ragged.rms_norm, "rms_norm"),
    ),
    OpInfo(
        "normalize",
        ragged.normalize,
        _normalize_reference,
        _normalize_samples,
        levels=column_levels(_normalize_reference, [{}, {"correction": 1}]),
        errors=[
            *_axis_errors(ragged.normalize, "normalize"),
            ErrorCase(
                lambda: ragged.normalize(ragged.array([[1.0]]), correction="1"),
                TypeError,
                "ragged.normalize: `correction` must be a number, got str.",
            ),
        ],
        long_segment=True,
    ),
]
# Every normalisation propagates NaN: a NaN in a segment (a column of it, along the ragged
# axis) makes its normaliser NaN.
OPS = [dataclasses.replace(info, nan_policy="propagate") for info in OPS]
