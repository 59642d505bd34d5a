"""Op table entries: scans (``ragged.ops._scans``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, Sample, axis_errors, ragged_randn
from .nested import column_levels
from .reductions import NAMES, segment_dims


def _cummax(t: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cummax(t, dim).values


def _cummin(t: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cummin(t, dim).values


def scan_reference(fn: Callable[[torch.Tensor, int], torch.Tensor], identity: Any) -> Any:
    """One segment: the torch scan along the segment's dim, flipped for ``reverse`` and
    shifted by one (the identity first) for ``exclusive``."""

    def reference(
        segment: torch.Tensor, axis: Any = 1, *, reverse: bool = False, exclusive: bool = False
    ) -> torch.Tensor:
        (dim,) = segment_dims(axis)
        t = segment.flip(dim) if reverse else segment
        out = fn(t, dim)
        if exclusive and out.shape[dim]:
            fill = identity(out.dtype) if callable(identity) else identity
            first = torch.full_like(out.narrow(dim, 0, 1), fill)
            out = torch.cat([first, out.narrow(dim, 0, out.shape[dim] - 1)], dim)
        return out.flip(dim) if reverse else out

    return reference


def _lowest(dtype: torch.dtype) -> Any:
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def _highest(dtype: torch.dtype) -> Any:
    return math.inf if dtype.is_floating_point else torch.iinfo(dtype).max


def scan_samples(*, zeros: bool = False, ints: bool = True) -> Any:
    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = ragged_randn(lengths, (3,), gen, dtype, layout)
        if zeros:  # exact zeros occur (cumprod's gradient must stay exact)
            x = x.with_values((x.values * 1.5).round() + 0.25 * (x.values > 1))
        named = x.rename(*NAMES)
        out = [
            Sample("ragged", (x,)),
            Sample("reverse", (x,), {"reverse": True}),
            Sample("exclusive", (x,), {"exclusive": True}),
            Sample("reverse_exclusive", (x,), {"axis": 1, "reverse": True, "exclusive": True}),
            Sample("inner", (x,), {"axis": -1}),
            Sample(
                "inner_reverse_exclusive", (x,), {"axis": 2, "reverse": True, "exclusive": True}
            ),
            Sample("named", (named,), {"axis": "seq", "exclusive": True}),
        ]
        if ints:
            i = ragged_randn(lengths, (2,), gen, torch.int64, layout)
            out.append(Sample("int64", (i,), {"reverse": True}))
            out.append(Sample("int64_exclusive", (i,), {"exclusive": True}))
        return out

    return samples


def errors(op: Any, name: str) -> list[ErrorCase]:
    x = ragged.array([[1.0, 2.0], [3.0]])
    func = f"ragged.{name}"
    return [
        *axis_errors(op, name),
        ErrorCase(
            lambda: op(x, axis=(1,)),
            TypeError,
            f"{func}: `axis` must be an int or an axis name, got tuple.",
        ),
        ErrorCase(
            lambda: op(x, reverse=1), TypeError, f"{func}: `reverse` must be a bool, got int."
        ),
        ErrorCase(
            lambda: op(x, exclusive=None),
            TypeError,
            f"{func}: `exclusive` must be a bool, got NoneType.",
        ),
    ]


def entry(name: str, fn: Any, identity: Any, **kw: Any) -> OpInfo:
    op = getattr(ragged, name)
    errs = errors(op, name) + kw.pop("extra_errors", [])
    reference = scan_reference(fn, identity)
    variants = [{}, {"reverse": True, "exclusive": True}]
    return OpInfo(
        name,
        op,
        reference,
        kw.pop("samples", scan_samples()),
        errors=errs,
        levels=column_levels(reference, variants),
        **kw,
    )


OPS = [
    entry("cumsum", torch.cumsum, 0, long_segment=True),
    entry("cumprod", torch.cumprod, 1, samples=scan_samples(zeros=True)),
    entry("cummax", _cummax, _lowest),
    entry("cummin", _cummin, _highest),
    entry(
        "logcumsumexp",
        torch.logcumsumexp,
        -math.inf,
        samples=scan_samples(ints=False),
        long_segment=True,
        extra_errors=[
            ErrorCase(
                lambda: ragged.logcumsumexp(ragged.array([[1, 2]])),
                TypeError,
                "ragged.logcumsumexp: `x` must have a floating-point dtype, got torch.int64.",
            )
        ],
    ),
]
